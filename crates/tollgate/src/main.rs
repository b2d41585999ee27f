//! The `tollgate` binary: parse arguments, run one subcommand, turn its result into an exit code.

mod advise;
mod bench;
mod check;
mod cli;
mod client;
mod durations;
mod human;
mod manual;
mod otel;
mod registry;
mod serve;
mod simulate;
mod stats_args;
mod trace;
mod validate;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
