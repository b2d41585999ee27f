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
                    .with_ansi(false)
                    .fmt_fields(escaped_fields()),
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

/// The text format's fields as the default formatter writes them (the message bare, then
/// `name=value` separated by spaces; strings quoted), with every control character (line
/// breaks, ESC, C1 codes) and bidirectional override escaped: a value that came from a client
/// (a descriptor value, a domain, a header, a path, an error quoting one) can neither start a
/// log line of its own nor reach the operator's terminal as an escape sequence. The JSON
/// format escapes as JSON does.
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use std::fmt::Write as _;
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let mut out = crate::human::Escaping(w);
        match field.name() {
            "message" => write!(out, "{value:?}"),
            name => {
                let name = name.strip_prefix("r#").unwrap_or(name);
                write!(out, "{name}={value:?}")
            }
        }
    })
    .delimited(" ")
}

/// `serve --profile`: `base` (the flags) with the profile's environment variables applied over
/// it, logged at the profile's level; each variable set but not honoured is one WARN.
/// `explicit` names the flags given, which win over the profile's defaults.
pub fn run_profile(
    profile: Profile,
    base: ServeConfig,
    explicit: tollgate_server::envoy::profile::Explicit,
    native: NativeListeners,
    trace: &crate::otel::TraceArgs,
) -> anyhow::Result<ExitCode> {
    let Profile::Envoy = profile;
    let vars: BTreeMap<String, String> = std::env::vars().collect();
    let mut t = tollgate_server::envoy::profile::translate_with(&vars, base, explicit)
        .map_err(|e| anyhow::anyhow!("--profile envoy: {e}"))?;
    native
        .over_profile(&vars, &mut t.config)
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
    let traces = crate::otel::plan(trace, t.tracing.as_ref(), &|k| std::env::var(k).ok())
        .map_err(|e| anyhow::anyhow!("--profile envoy: {e}"))?;
    serve_until_signal(t.config, t.envoy, traces)
}

/// The listener settings of `serve`'s own flags that envoy's variables also set (gRPC TLS, the
/// gRPC unix socket, the debug port); `None`: the flag is not given.
#[derive(Debug, Clone, Default)]
pub struct NativeListeners {
    /// `--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-tls-client-ca`.
    pub grpc_tls: Option<tollgate_server::grpc::GrpcTls>,
    /// `--grpc-unix-socket`.
    pub grpc_uds: Option<std::path::PathBuf>,
    /// `--debug-addr` (`Some(None)`: `off`).
    pub debug_addr: Option<Option<std::net::SocketAddr>>,
}

impl NativeListeners {
    /// Set in `config` what the flags give.
    pub fn apply_to(&self, config: &mut ServeConfig) {
        if let Some(tls) = &self.grpc_tls {
            config.listeners.grpc_tls = Some(tls.clone());
        }
        if let Some(path) = &self.grpc_uds {
            config.listeners.grpc_uds = Some(path.clone());
        }
        if let Some(addr) = self.debug_addr {
            config.listeners.debug_addr = addr;
        }
    }

    /// Under `--profile envoy`, once its translation made `config` from `vars`: a flag given
    /// wins over the profile's default (its debug port 0.0.0.0:6070, no TLS, TCP), and a flag
    /// whose envoy variable says something else is an error naming both, as for `--http-addr`.
    fn over_profile(
        &self,
        vars: &BTreeMap<String, String>,
        config: &mut ServeConfig,
    ) -> anyhow::Result<()> {
        let set = |name: &str| vars.get(name).is_some_and(|v| !v.trim().is_empty());
        let clash = |flag: &str, vars: &str| {
            anyhow::anyhow!(
                "{flag} conflicts with {vars}: the flag and envoyproxy/ratelimit's variable say \
                 different things; keep one"
            )
        };
        if let Some(path) = &self.grpc_uds {
            if set("GRPC_UDS") && config.listeners.grpc_uds.as_ref() != Some(path) {
                return Err(clash("--grpc-unix-socket", "GRPC_UDS"));
            }
        }
        if let Some(tls) = &self.grpc_tls {
            // Without GRPC_SERVER_USE_TLS the translation keeps the flags' TLS.
            if config.listeners.grpc_tls.as_ref().is_some_and(|t| t != tls) {
                return Err(clash(
                    "--grpc-tls-cert / --grpc-tls-key / --grpc-tls-client-ca",
                    "GRPC_SERVER_USE_TLS and GRPC_SERVER_TLS_*",
                ));
            }
        }
        if let Some(addr) = self.debug_addr {
            if (set("DEBUG_HOST") || set("DEBUG_PORT")) && config.listeners.debug_addr != addr {
                return Err(clash("--debug-addr", "DEBUG_HOST / DEBUG_PORT"));
            }
        }
        self.apply_to(config);
        Ok(())
    }
}

/// Whether the service runs on tokio's current-thread runtime rather than the multi-thread one:
/// when the process may use one CPU only (`cpus`, what `available_parallelism` says: the affinity
/// mask, a container's CPU quota), unless `TOKIO_WORKER_THREADS` (tokio's own setting) asks for
/// workers. On one CPU the multi-thread runtime would have one worker anyway, beside the main
/// thread blocked in `block_on`; every task it runs and every time it parks goes through its
/// work-stealing bookkeeping (atomics, the idle and searching states, the LIFO slot). The
/// current-thread runtime runs the same tasks, timers and sockets on the main thread without
/// it, as single-threaded gRPC servers do. Blocking work (the rules watcher's file reads and
/// reloads) still goes to tokio's blocking pool, and nothing in the service blocks a task on
/// another one, so the tasks need no second thread to make progress.
fn one_thread(cpus: usize, workers_set: bool) -> bool {
    cpus <= 1 && !workers_set
}

/// Run the service until SIGTERM or SIGINT; exit 0 after a graceful shutdown.
pub fn run(
    config: ServeConfig,
    envoy: EnvoyConfig,
    log_format: LogFormat,
    trace: &crate::otel::TraceArgs,
) -> anyhow::Result<ExitCode> {
    init_logging(log_format);
    let traces = crate::otel::plan(trace, None, &|k| std::env::var(k).ok())?;
    serve_until_signal(config, envoy, traces)
}

fn serve_until_signal(
    mut config: ServeConfig,
    envoy: EnvoyConfig,
    traces: Option<crate::otel::TracePlan>,
) -> anyhow::Result<ExitCode> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let workers_set = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
    let single = one_thread(cpus, workers_set);
    let runtime = if single {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .thread_name("tollgate")
    .build()?;
    if env!("TOLLGATE_OPT_LEVEL") == "0" {
        tracing::info!(
            "this binary is not optimised (a debug or `--profile quick` build): it decides \
             several times slower than a release build; build with `cargo build --release` \
             for production and for measuring it"
        );
    }
    let workers = runtime.metrics().num_workers();
    tracing::info!(
        runtime = if single {
            "current-thread"
        } else {
            "multi-thread"
        },
        workers,
        "runtime"
    );
    runtime.block_on(async {
        // Inside the runtime: the exporter's connection and export task live there.
        let tracer = match &traces {
            Some(plan) => {
                let tracer = std::sync::Arc::new(plan.build()?);
                tracing::info!(collector = %plan.describe(), "sending traces of decisions");
                Some(tracer)
            }
            None => None,
        };
        config.tracing = tracer.clone();
        // Inside the runtime: the signal handlers are installed before anything is bound.
        let shutdown = shutdown_signal();
        let served = serve(config, envoy, shutdown, |bound| {
            let msg = listening_message(&bound);
            let off = || "off".to_string();
            tracing::info!(
                http = %bound.http.map_or_else(off, |a| a.to_string()),
                grpc = %bound.grpc.map_or_else(off, |a| a.to_string()),
                "listening"
            );
            println!("{msg}");
        })
        .await;
        if let Some(tracer) = tracer {
            // The spans still queued, sent within a bound (a dead collector does not hold up
            // the exit).
            tracer.shutdown(std::time::Duration::from_secs(2)).await;
        }
        served
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::one_thread;

    #[test]
    fn one_cpu_runs_on_the_current_thread_unless_workers_are_asked_for() {
        assert!(one_thread(1, false));
        assert!(
            !one_thread(1, true),
            "TOKIO_WORKER_THREADS keeps the multi-thread runtime"
        );
        assert!(!one_thread(2, false));
        assert!(!one_thread(64, true));
    }
}
