//! `tollgate completions SHELL` and `tollgate man`: shell completion scripts and manual pages
//! generated from the command line's own definition ([`Cli`]), so they never fall behind a flag.

use crate::cli::Cli;
use anyhow::Context as _;
use clap::CommandFactory;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Print the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut out);
    out.flush().context("writing the completion script")?;
    Ok(ExitCode::SUCCESS)
}

/// Print tollgate(1), or write a page per (visible) command into `dir`.
pub fn man(dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    let cmd = Cli::command();
    match dir {
        Some(dir) => clap_mangen::generate_to(cmd, dir)
            .with_context(|| format!("writing manual pages into {}", dir.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd)
                .render(&mut out)
                .and_then(|()| out.flush())
                .context("writing the manual page")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
