//! `tollgate completions SHELL` and `tollgate man`: shell completion scripts and manual pages
//! generated from the command line's own definition (the `clap::Command` of `cli::Cli`, passed
//! in), so they never fall behind a flag.

use anyhow::Context as _;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Print the completion script of `cmd` for `shell`.
pub fn completions(
    shell: clap_complete::Shell,
    mut cmd: clap::Command,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, "tollgate", &mut out);
    out.flush().context("writing the completion script")?;
    Ok(ExitCode::SUCCESS)
}

/// Print tollgate(1) from `cmd`, or write a page per (visible) command into `dir`.
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> anyhow::Result<ExitCode> {
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
