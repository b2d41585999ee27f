//! `tollgate serve`: logging set-up, the runtime, and the service until SIGTERM/SIGINT.

use std::collections::BTreeMap;
use std::process::ExitCode;
use tollgate_server::envoy::EnvoyConfig;
use tollgate_server::serve::{listening_message, serve, shutdown_signal, ServeConfig};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Another rate limiter whose settings `serve --profile` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// envoyproxy/ratelimit: its environment variables and behaviour.
    Envoy,
}

/// Install the global `tracing` subscriber. `RUST_LOG` (e.g. `info,tollgate_server=debug`)
/// overrides the default level `info` (but for the decision log, on or off by its own flag).
pub fn init_logging(format: LogFormat) {
    init_logging_at(format, LevelFilter::INFO);
}

/// [`init_logging`] with another default level.
fn init_logging_at(format: LogFormat, level: LevelFilter) {
    // The decision log (off unless asked for) is written whatever the level of the rest.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(level))
        .with_target(tollgate_server::decision_log::TARGET, LevelFilter::INFO);
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(false),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// `serve --profile`: `base` (the flags) with the profile's environment variables applied over
/// it, logged at the profile's level; each variable set but not honoured is one WARN.
/// `explicit` names the flags given, which win over the profile's defaults.
pub fn run_profile(
    profile: Profile,
    base: ServeConfig,
    explicit: tollgate_server::envoy::profile::Explicit,
) -> anyhow::Result<ExitCode> {
    let Profile::Envoy = profile;
    let vars: BTreeMap<String, String> = std::env::vars().collect();
    let t = tollgate_server::envoy::profile::translate_with(&vars, base, explicit)
        .map_err(|e| anyhow::anyhow!("--profile envoy: {e}"))?;
    let format = if t.log_json {
        LogFormat::Json
    } else {
        LogFormat::Text
    };
    init_logging_at(format, t.log_level);
    for w in &t.warnings {
        tracing::warn!("--profile envoy: {w}");
    }
    serve_until_signal(t.config, t.envoy)
}

/// Run the service until SIGTERM or SIGINT; exit 0 after a graceful shutdown.
pub fn run(
    config: ServeConfig,
    envoy: EnvoyConfig,
    log_format: LogFormat,
) -> anyhow::Result<ExitCode> {
    init_logging(log_format);
    serve_until_signal(config, envoy)
}

fn serve_until_signal(config: ServeConfig, envoy: EnvoyConfig) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tollgate")
        .build()?;
    runtime.block_on(async {
        // Inside the runtime: the signal handlers are installed before anything is bound.
        let shutdown = shutdown_signal();
        serve(config, envoy, shutdown, |bound| {
            let msg = listening_message(&bound);
            let off = || "off".to_string();
            tracing::info!(
                http = %bound.http.map_or_else(off, |a| a.to_string()),
                grpc = %bound.grpc.map_or_else(off, |a| a.to_string()),
                "listening"
            );
            println!("{msg}");
        })
        .await
    })?;
    Ok(ExitCode::SUCCESS)
}
