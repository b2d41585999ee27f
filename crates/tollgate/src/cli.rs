//! Command-line surface (DESIGN.md section 7): raw arguments here, validated and dispatched to
//! one module per subcommand.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// tollgate: a rate limiter (library, HTTP JSON + Envoy RLS gRPC service, and this CLI).
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check rule files; print each error as file:line:column and exit 1 if any.
    Validate {
        /// A rules file or a directory of them.
        path: PathBuf,
    },
    /// Replay a trace on a manual clock and print one decision per line (CSV).
    ///
    /// Input lines: `t_ms,domain,descriptor,hits` where descriptor is `k=v` or `k=v;k2=v2`;
    /// `#` starts a comment. Output header:
    /// `t_ms,domain,descriptor,hits,allowed,remaining,retry_after_ms,reset_after_ms,delay_ms`.
    Simulate {
        /// Rules file or directory.
        #[arg(long, env = "TOLLGATE_RULES", default_value = crate::simulate::DEFAULT_RULES)]
        rules: PathBuf,
        /// Where counters live: `memory`.
        #[arg(long, env = "TOLLGATE_STORE", default_value = "memory")]
        store: String,
        /// Trace file; standard input when absent or `-`.
        #[arg(long)]
        input: Option<PathBuf>,
    },
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { path } => Ok(crate::validate::run(&path)),
        Command::Simulate {
            rules,
            store,
            input,
        } => crate::simulate::run(&rules, &store, input.as_deref()),
    }
}
