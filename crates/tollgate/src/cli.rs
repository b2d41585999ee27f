//! Command-line surface (DESIGN.md section 7): raw arguments here, validated and dispatched to
//! one module per subcommand.

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tollgate_server::backend::{Policy, RedisSettings};
use tollgate_server::serve::ServeConfig;
use tollgate_server::RequestLimits;

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
        /// Where counters live: `memory`, or `redis://...` (also `rediss://`,
        /// `redis+cluster://`): the trace is replayed on Redis with the trace's clock, under a
        /// throwaway key prefix deleted afterwards.
        #[arg(
            long,
            env = "TOLLGATE_STORE",
            hide_env_values = true,
            default_value = "memory"
        )]
        store: String,
        /// Trace file; standard input when absent or `-`.
        #[arg(long)]
        input: Option<PathBuf>,
    },
    /// Run the service: HTTP JSON API and Envoy RLS gRPC, rules hot-reloaded.
    ///
    /// Stops gracefully on SIGTERM or SIGINT (in-flight requests finish, exit 0); SIGHUP forces a
    /// rules reload.
    Serve(Box<ServeArgs>),
    /// Ask a running service for a decision: exit 0 allowed, 1 limited, 2 error.
    Check {
        /// Base URL of the service's HTTP API.
        #[arg(long, env = "TOLLGATE_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The rules domain.
        #[arg(long)]
        domain: String,
        /// A descriptor `key=value` or `key=value;key2=value2`; repeat for several descriptors.
        #[arg(long = "descriptor", required = true)]
        descriptors: Vec<String>,
        /// Cost of the request (default 1; 0 only queries).
        #[arg(long)]
        hits: Option<u64>,
        /// Print the raw JSON response instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Load-test a tollgate (or any Envoy RLS) server: throughput, allowed/denied, errors and
    /// latency percentiles.
    Bench(Box<crate::bench::BenchArgs>),
    /// Run a bare axum or tonic server with no rate limiting (the ceiling `bench` compares with).
    #[command(hide = true)]
    BenchCeiling(crate::bench::ceiling::CeilingArgs),
}

/// `tollgate serve` flags; each also reads a `TOLLGATE_*` environment variable.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// HTTP listen address.
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// gRPC (Envoy RLS v3) listen address.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Rules file or directory (watched and hot-reloaded).
    #[arg(long, env = "TOLLGATE_RULES", default_value = crate::simulate::DEFAULT_RULES)]
    rules: PathBuf,
    /// Where counters live: `memory`, `redis://[user:pass@]host:port[/db]`, `rediss://...` (TLS)
    /// or `redis+cluster://h1:p1,h2:p2` (`rediss+cluster://` for TLS).
    #[arg(
        long,
        env = "TOLLGATE_STORE",
        hide_env_values = true,
        default_value = "memory"
    )]
    store: String,
    /// Redis: bound on each call, in milliseconds.
    #[arg(long, env = "TOLLGATE_REDIS_TIMEOUT_MS", default_value_t = 50)]
    redis_timeout_ms: u64,
    /// Redis: first part of every key (`<prefix>:{...}:...`); no braces.
    #[arg(long, env = "TOLLGATE_REDIS_PREFIX", default_value = "tollgate")]
    redis_prefix: String,
    /// Redis: what decides while Redis is unavailable: `allow` admits, `deny` denies, `local`
    /// limits with an in-memory limiter (limits divided by --expected-instances).
    #[arg(long, env = "TOLLGATE_ON_STORE_ERROR", default_value = "local")]
    on_store_error: Policy,
    /// Redis: how many instances share the limits; the `local` policy divides limits by it.
    #[arg(long, env = "TOLLGATE_EXPECTED_INSTANCES", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    expected_instances: u64,
    /// Redis: answer keys Redis denied locally until they can pass again (no round trip).
    #[arg(long, env = "TOLLGATE_LOCAL_DENY_CACHE")]
    local_deny_cache: bool,
    /// Most keys the memory store tracks (the oldest-expiring are evicted beyond it).
    #[arg(long, env = "TOLLGATE_MAX_KEYS", default_value_t = tollgate_core::memory::DEFAULT_MAX_KEYS)]
    max_keys: usize,
    /// Log format.
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: crate::serve::LogFormat,
    /// gRPC: add rate-limit headers to `response_headers_to_add`.
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS")]
    response_headers: bool,
    /// Largest accepted HTTP request body, in bytes.
    #[arg(long, env = "TOLLGATE_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    max_body_bytes: usize,
    /// How often the rules path is checked for changes, in milliseconds.
    #[arg(long, env = "TOLLGATE_RELOAD_INTERVAL_MS", default_value_t = 500)]
    reload_interval_ms: u64,
    /// Proxies (comma-separated addresses or CIDR blocks, e.g. `127.0.0.1/32,10.0.0.0/8`) whose
    /// `X-Forwarded-For` / `X-Real-IP` give the client address; empty trusts none. A forward-auth
    /// gateway must be listed.
    #[arg(long, env = "TOLLGATE_TRUSTED_PROXIES", value_delimiter = ',')]
    trusted_proxies: Vec<TrustedProxy>,
}

/// One `--trusted-proxies` item: an address block, or nothing for an empty item (so that
/// `TOLLGATE_TRUSTED_PROXIES=` means "trust none", like leaving it unset).
#[derive(Debug, Clone, Copy)]
struct TrustedProxy(Option<tollgate_core::request::Cidr>);

impl std::str::FromStr for TrustedProxy {
    type Err = tollgate_core::request::CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Ok(TrustedProxy(None));
        }
        s.parse().map(|c| TrustedProxy(Some(c)))
    }
}

impl ServeArgs {
    fn config(&self) -> ServeConfig {
        ServeConfig {
            http_addr: self.http_addr,
            grpc_addr: self.grpc_addr,
            rules: self.rules.clone(),
            store: self.store.clone(),
            redis_timeout: Duration::from_millis(self.redis_timeout_ms),
            redis_prefix: self.redis_prefix.clone(),
            redis: RedisSettings {
                policy: self.on_store_error,
                expected_instances: self.expected_instances,
                deny_cache: self.local_deny_cache,
                // `serve` fills in the key bound from `max_keys` below.
                ..RedisSettings::default()
            },
            max_keys: self.max_keys,
            response_headers: self.response_headers,
            limits: RequestLimits {
                max_body_bytes: self.max_body_bytes,
                ..RequestLimits::default()
            },
            reload_interval: Duration::from_millis(self.reload_interval_ms.max(10)),
            trusted_proxies: self.trusted_proxies.iter().filter_map(|t| t.0).collect(),
            ..ServeConfig::default()
        }
    }
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
        Command::Serve(args) => crate::serve::run(args.config(), args.log_format),
        Command::Check {
            url,
            domain,
            descriptors,
            hits,
            json,
        } => crate::check::run(&url, &domain, &descriptors, hits, json),
        Command::Bench(args) => crate::bench::run(&args),
        Command::BenchCeiling(args) => crate::bench::ceiling::run(&args),
    }
}
