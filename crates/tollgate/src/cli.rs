//! Command-line surface: raw arguments here, validated and dispatched to
//! one module per subcommand.

use clap::{CommandFactory as _, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tollgate_server::backend::{Policy, RedisSettings};
use tollgate_server::envoy::EnvoyConfig;
use tollgate_server::grpc::GrpcLimits;
use tollgate_server::serve::ServeConfig;
use tollgate_server::RequestLimits;

use crate::durations::{AnyDuration, PositiveDuration};

/// tollgate: a rate limiter (library, HTTP JSON + Envoy RLS gRPC service, and this CLI).
#[derive(Debug, Parser)]
#[command(name = "tollgate", version = env!("TOLLGATE_VERSION"), about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check rule files; print each error as file:line:column and exit 1 if any.
    #[command(mut_arg("store", |a| a.help(
        "The store the rules are meant for (as `serve --store`): with a Redis URL the limits a \
         Redis store cannot serve (e.g. `count_min_sketch`) are errors. Nothing is connected"
    )))]
    Validate {
        /// A rules file or a directory of them.
        path: PathBuf,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Replay a trace on a manual clock and print one decision per line (CSV).
    ///
    /// Input lines: `t_ms,domain,descriptor,hits` where descriptor is `k=v` or `k=v;k2=v2`;
    /// `#` starts a comment. Output header:
    /// `t_ms,domain,descriptor,hits,allowed,remaining,retry_after_ms,reset_after_ms,delay_ms`.
    #[command(mut_arg("store", |a| a.help(
        "Where counters live: `memory`, or `redis://...` (also `rediss://`, `redis+cluster://`): \
         the trace is replayed on Redis with the trace's clock, under a throwaway key prefix \
         deleted afterwards"
    )))]
    Simulate {
        /// Rules file or directory.
        #[arg(long, env = "TOLLGATE_RULES", default_value = crate::simulate::DEFAULT_RULES)]
        rules: PathBuf,
        #[command(flatten)]
        store: StoreArg,
        /// Trace file; standard input when absent or `-`.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Instead of the decisions, replay the trace once per algorithm (--algorithms) on the
        /// memory store, print what each admitted, and draw admitted requests over time into
        /// this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// With --plot: the algorithms to compare, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            requires = "plot",
            default_value = "fixed_window,sliding_window_log,sliding_window_counter,token_bucket,gcra,leaky_bucket"
        )]
        algorithms: Vec<tollgate_core::Algorithm>,
    },
    /// Suggest limits from real traffic: per-client rates in access logs (combined, JSON lines,
    /// Envoy, or a simulate trace), and with --rules what those rules would deny.
    ///
    /// Reads each file (or standard input) once; a malformed line is counted and shown with
    /// its file and line number, never fatal. See docs/advise.md.
    Advise(Box<crate::advise::AdviseArgs>),
    /// Write a synthetic combined access log (an abuser and a bursty client planted) to
    /// standard output, for trying `advise`.
    #[command(hide = true)]
    GenerateLog(crate::advise::GenerateArgs),
    /// Run the service: HTTP JSON API and Envoy RLS gRPC, rules hot-reloaded.
    ///
    /// Stops gracefully on SIGTERM or SIGINT (in-flight requests finish, exit 0); SIGHUP forces a
    /// rules reload.
    Serve(Box<ServeArgs>),
    /// Ask a running service for a decision: exit 0 allowed, 1 limited, 2 error, 3 no rule
    /// matched (with --strict).
    ///
    /// An unknown domain or a descriptor no rule matches is answered OK with no limit (as Envoy
    /// expects); `check` then says which of the two it was.
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
        /// Exit 3 when the answer is OK only because no rule matched (unknown domain, or no
        /// rule for these entries).
        #[arg(long)]
        strict: bool,
    },
    /// Load-test a tollgate (or any Envoy RLS) server: throughput, allowed/denied, errors and
    /// latency percentiles.
    Bench(Box<crate::bench::BenchArgs>),
    /// Manage the rule registry of a running service: apply, get, list, delete domains
    /// (exit 0 done, 1 refused, 2 error).
    Rules(crate::registry::RulesArgs),
    /// Run a bare axum or tonic server with no rate limiting (the ceiling `bench` compares with).
    #[command(hide = true)]
    BenchCeiling(crate::bench::ceiling::CeilingArgs),
    /// Print a shell completion script for SHELL to standard output.
    ///
    /// bash: `tollgate completions bash > ~/.local/share/bash-completion/completions/tollgate`;
    /// zsh: `tollgate completions zsh > _tollgate` in a directory of `$fpath`;
    /// fish: `tollgate completions fish > ~/.config/fish/completions/tollgate.fish`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page tollgate(1) (roff) to standard output, or write one page per
    /// command into a directory.
    ///
    /// Read it with `tollgate man | man -l -`; install the pages with
    /// `tollgate man --dir /usr/local/share/man/man1`.
    Man {
        /// Write `tollgate.1`, `tollgate-serve.1`, ... into this directory instead.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// `tollgate serve` flags; each also reads a `TOLLGATE_*` environment variable.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// HTTP listen address: `host:port` (a host name is resolved at start), `:port` or `port`
    /// (all interfaces), or `off`. Default: 0.0.0.0:8080 (under --profile envoy: HOST:PORT).
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", value_parser = listen_addr)]
    http_addr: Option<ListenAddr>,
    /// gRPC (Envoy RLS v3) listen address: as --http-addr (`off`: no gRPC listener).
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "0.0.0.0:8081",
          value_parser = listen_addr)]
    grpc_addr: ListenAddr,
    /// Rules file or directory (watched and hot-reloaded). Default: examples/rules (under
    /// --profile envoy: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY).
    #[arg(long, env = "TOLLGATE_RULES")]
    rules: Option<PathBuf>,
    /// Take the rules from an xDS management server instead of files: `xds://HOST:PORT`, or
    /// `xdss://HOST:PORT` over TLS (envoyproxy/ratelimit's RateLimitConfig resources over ADS).
    /// Not ready until the first rules arrive; the rule registry cannot run beside it, and
    /// --rules cannot be given with it (TOLLGATE_RULES, which the image sets, is not read). See
    /// docs/rules.md.
    #[arg(long, env = "TOLLGATE_RULES_FROM", value_parser = rules_from,
          conflicts_with = "admin_token_file")]
    rules_from: Option<RulesFrom>,
    /// The node id sent to the xDS server of --rules-from (the server keys its snapshots by it).
    #[arg(long, env = "TOLLGATE_XDS_NODE_ID", default_value = "tollgate")]
    xds_node_id: String,
    /// xdss://: the CA bundle (PEM) the server's certificate must chain to (default: the
    /// system's, /etc/ssl/certs/ca-certificates.crt).
    #[arg(long, env = "TOLLGATE_XDS_TLS_CA")]
    xds_tls_ca: Option<PathBuf>,
    /// xdss://: a client certificate chain (PEM) to present (with --xds-tls-key).
    #[arg(long, env = "TOLLGATE_XDS_TLS_CERT", requires = "xds_tls_key")]
    xds_tls_cert: Option<PathBuf>,
    /// xdss://: the client certificate's private key (PEM).
    #[arg(long, env = "TOLLGATE_XDS_TLS_KEY", requires = "xds_tls_cert")]
    xds_tls_key: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArg,
    /// Redis: a call slower than this (milliseconds) counts toward opening the breaker; the
    /// request waits for the answer up to 1 s more unless the breaker opens.
    #[arg(long, env = "TOLLGATE_REDIS_TIMEOUT_MS", default_value_t = 50)]
    redis_timeout_ms: u64,
    /// Redis: a second Redis (any form --store takes) for the counters of limits whose unit is
    /// second, with its own breaker and failure policy (envoyproxy/ratelimit's REDIS_PERSECOND).
    #[arg(long, env = "TOLLGATE_REDIS_PER_SECOND_URL", hide_env_values = true)]
    redis_per_second_url: Option<String>,
    /// Redis: --redis-timeout-ms for the per-second Redis (default: --redis-timeout-ms).
    #[arg(long, env = "TOLLGATE_REDIS_PER_SECOND_TIMEOUT_MS",
          value_parser = clap::value_parser!(u64).range(1..))]
    redis_per_second_timeout_ms: Option<u64>,
    /// Redis: first part of every key (`<prefix>:{...}:...`); no braces. Default: tollgate
    /// (under --profile envoy on a standalone Redis: CACHE_KEY_PREFIX).
    #[arg(long, env = "TOLLGATE_REDIS_PREFIX")]
    redis_prefix: Option<String>,
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
    /// Log decisions at INFO: `off`, `denied` (descriptors over their limit) or `all`, each
    /// line naming domain, rule and key. Keys are request values (user ids, addresses): the log
    /// may hold personal data.
    #[arg(long, env = "TOLLGATE_DECISION_LOG", default_value = "off")]
    decision_log: tollgate_server::decision_log::DecisionLogMode,
    /// Most decision-log lines per second; the lines beyond are counted and reported in one
    /// line in a later second.
    #[arg(long, env = "TOLLGATE_DECISION_LOG_MAX_PER_SECOND", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    decision_log_max_per_second: u32,
    /// Record per-rule live statistics (rates, busiest counters, most-limited clients) for
    /// `GET /v1/stats` and `/dashboard`, both served to the admin token only: `on` or `off`.
    #[arg(long, env = "TOLLGATE_LIVE_STATS", default_value = "on")]
    live_stats: OnOff,
    /// Most requests waiting at once in the queues of rules with a `queue` option (forward-auth
    /// and /v1/check), all queues together; past it such a rule's denials are answered at once.
    #[arg(long, env = "TOLLGATE_QUEUE_MAX_WAITING", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    queue_max_waiting: u32,
    /// gRPC: add rate-limit headers to `response_headers_to_add`.
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS")]
    response_headers: bool,
    /// Largest accepted HTTP request body, in bytes.
    #[arg(long, env = "TOLLGATE_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    max_body_bytes: usize,
    /// How often the rules path is checked for changes, in milliseconds.
    #[arg(long, env = "TOLLGATE_RELOAD_INTERVAL_MS", default_value_t = 500)]
    reload_interval_ms: u64,
    /// HTTP: a client must send a complete request head within this (from connecting, or from
    /// the first byte of the next request on a kept-alive connection), else it is dropped.
    #[arg(long, env = "TOLLGATE_HEADER_READ_TIMEOUT", default_value = "10s")]
    header_read_timeout: PositiveDuration,
    /// HTTP: a request body must arrive within this once the head is in, else 408 and the
    /// connection is closed.
    #[arg(long, env = "TOLLGATE_BODY_READ_TIMEOUT", default_value = "10s")]
    body_read_timeout: PositiveDuration,
    /// HTTP: a connection with no request in flight for this long is closed.
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT", default_value = "60s")]
    idle_timeout: PositiveDuration,
    /// envoy's debug port (`/rlconfig`, `/stats`): as --http-addr. Default: off (under
    /// --profile envoy: DEBUG_HOST:DEBUG_PORT, 0.0.0.0:6070 unless set).
    #[arg(long, env = "TOLLGATE_DEBUG_ADDR", value_parser = listen_addr)]
    debug_addr: Option<ListenAddr>,
    /// Most client connections open at once, per listener; beyond it new connections wait in
    /// the kernel's backlog until one closes. Default: 10000, lowered at start when the
    /// open-files limit cannot hold that many on every listener.
    #[arg(long, env = "TOLLGATE_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,
    /// On SIGTERM/SIGINT: how long in-flight requests may take to finish before the remaining
    /// connections are dropped and the process exits.
    #[arg(long, env = "TOLLGATE_SHUTDOWN_TIMEOUT", default_value = "10s")]
    shutdown_timeout: PositiveDuration,
    /// Proxies (comma-separated addresses or CIDR blocks, e.g. `127.0.0.1/32,10.0.0.0/8`) whose
    /// `X-Forwarded-For` / `X-Real-IP` give the client address; empty trusts none. A forward-auth
    /// gateway must be listed.
    #[arg(long, env = "TOLLGATE_TRUSTED_PROXIES", value_delimiter = ',')]
    trusted_proxies: Vec<TrustedProxy>,
    #[command(flatten)]
    grpc: GrpcArgs,
    #[command(flatten)]
    counting: CountingArgs,
    #[command(flatten)]
    stats: crate::stats_args::StatsArgs,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    tracing: crate::otel::TraceArgs,
    /// Read another rate limiter's settings: `envoy` reads envoyproxy/ratelimit's environment
    /// variables (`PORT`, `GRPC_PORT`, `RUNTIME_ROOT`, `SHADOW_MODE`, ...) and behaves as it does;
    /// the flags above fill in what it has no variable for.
    #[arg(long, env = "TOLLGATE_PROFILE", value_enum)]
    profile: Option<crate::serve::Profile>,
}

/// `--store` of `serve`, `simulate` and `validate` (the last two with help of their own).
#[derive(Debug, clap::Args)]
struct StoreArg {
    /// Where counters live: `memory`, `redis://[user:pass@]host:port[/db]`, `rediss://...` (TLS),
    /// `redis+cluster://h1:p1,h2:p2` (`rediss+cluster://` for TLS),
    /// `redis+sentinel://[user:pass@]s1:p1,s2:p2/MASTER[/db][?sentinel_user=u&sentinel_pass=p]`
    /// (`rediss+sentinel://` for TLS) or `redis+unix:///path/to.sock[?user=u&pass=p]`.
    #[arg(
        long,
        env = "TOLLGATE_STORE",
        hide_env_values = true,
        default_value = "memory"
    )]
    store: String,
}

/// `tollgate serve` flags of what rules mean and how counters are kept (envoyproxy/ratelimit
/// compatibility among them).
#[derive(Debug, clap::Args)]
struct CountingArgs {
    /// The algorithm of rules that name none (and of per-request limit overrides), e.g.
    /// `envoy_fixed_window` for envoyproxy/ratelimit's fixed windows. Default:
    /// sliding_window_counter.
    #[arg(long, env = "TOLLGATE_DEFAULT_ALGORITHM")]
    default_algorithm: Option<tollgate_core::Algorithm>,
    /// envoy_fixed_window limits also count the hits of requests that another limit denies
    /// (envoyproxy/ratelimit's default; off is its STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
    #[arg(long, env = "TOLLGATE_COUNT_DENIED_HITS")]
    count_denied_hits: bool,
    /// Redis: how instances keep the counters of rules that name no `sync` in step: `exact`
    /// (every decision in Redis), `lease` (shares of a window's count spent locally; exact) or
    /// `batched` (counts kept locally and flushed every --sync-flush-interval; approximate,
    /// bounded); fixed_window and sliding_window_counter rules, the others stay exact. See
    /// docs/distributed.md.
    #[arg(long, env = "TOLLGATE_SYNC_DEFAULT", default_value = "exact")]
    sync_default: tollgate_core::SyncMode,
    /// Redis: how often `sync: batched` limits that name no `flush_interval` send the counts
    /// admitted locally to Redis (and learn the fleet's back): the over-admission bound grows
    /// with it. From 1ms to 60s. See docs/distributed.md.
    #[arg(long, env = "TOLLGATE_SYNC_FLUSH_INTERVAL", default_value = "100ms",
          value_parser = flush_interval)]
    sync_flush_interval: Duration,
    /// Redis: where envoy_fixed_window counters live: `tollgate` (hash-tagged keys) or `envoy`
    /// (envoyproxy/ratelimit's keys and increments, shared with its pods; standalone Redis only;
    /// --redis-prefix is then used as is, like its CACHE_KEY_PREFIX).
    #[arg(long, env = "TOLLGATE_REDIS_KEY_LAYOUT", default_value = "tollgate")]
    redis_key_layout: tollgate_redis::KeyLayout,
    /// Redis, envoy key layout: a random extra of up to this on each counter's expiry (like
    /// EXPIRATION_JITTER_MAX_SECONDS), e.g. `300s`.
    #[arg(long, env = "TOLLGATE_REDIS_EXPIRATION_JITTER", default_value = "0s")]
    redis_expiration_jitter: AnyDuration,
}

/// `tollgate serve` flags of the rule registry (`/v1/domains`; see docs/registry.md).
#[derive(Debug, clap::Args)]
struct RegistryArgs {
    /// File holding the admin token that registry requests (/v1/domains/.., reads and writes)
    /// and the full GET /v1/rules listing must carry as `Authorization: Bearer <token>`; without
    /// it the registry answers no one and /v1/rules is a summary. Turns the registry on.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// The registry directory (memory store: where registered domains are kept; Redis store:
    /// the local snapshot used when Redis is down at start). Turns the registry on.
    #[arg(long, env = "TOLLGATE_REGISTRY_DIR")]
    registry_dir: Option<PathBuf>,
    /// Most domains the registry holds.
    #[arg(long, env = "TOLLGATE_REGISTRY_MAX_DOMAINS", default_value_t = 1000)]
    registry_max_domains: usize,
    /// Most descriptors (at every depth) of one registered domain.
    #[arg(
        long,
        env = "TOLLGATE_REGISTRY_MAX_DESCRIPTORS",
        default_value_t = 1000
    )]
    registry_max_descriptors: usize,
    /// Largest registry request body, in bytes.
    #[arg(long, env = "TOLLGATE_REGISTRY_MAX_BODY_BYTES", default_value_t = 256 * 1024)]
    registry_max_body_bytes: usize,
    /// Versions kept per registered domain (for history and rollback).
    #[arg(long, env = "TOLLGATE_REGISTRY_HISTORY", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..1000))]
    registry_history: u64,
}

impl RegistryArgs {
    fn config(&self) -> tollgate_server::registry::RegistryConfig {
        tollgate_server::registry::RegistryConfig {
            token_file: self.admin_token_file.clone(),
            dir: self.registry_dir.clone(),
            max_domains: self.registry_max_domains,
            max_descriptors: self.registry_max_descriptors,
            max_body_bytes: self.registry_max_body_bytes,
            history: self.registry_history as usize,
            ..Default::default()
        }
    }
}

/// `tollgate serve` flags of the gRPC listener's HTTP/2 limits (see `GrpcLimits`).
#[derive(Debug, clap::Args)]
struct GrpcArgs {
    /// gRPC: most concurrent streams (calls) per connection; more are refused (REFUSED_STREAM).
    #[arg(long, env = "TOLLGATE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    grpc_max_concurrent_streams: u32,
    /// gRPC: largest request header list, in bytes.
    #[arg(long, env = "TOLLGATE_GRPC_MAX_HEADER_LIST_BYTES", default_value_t = 16 * 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    grpc_max_header_list_bytes: u32,
    /// gRPC: interval of HTTP/2 keepalive PINGs (`0s`: none).
    #[arg(long, env = "TOLLGATE_GRPC_KEEPALIVE_INTERVAL", default_value = "60s")]
    grpc_keepalive_interval: AnyDuration,
    /// gRPC: a keepalive PING not answered within this closes the connection.
    #[arg(long, env = "TOLLGATE_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s")]
    grpc_keepalive_timeout: PositiveDuration,
    /// gRPC: a connection older than this gets GOAWAY, so clients reconnect and rebalance
    /// (`0s`: never).
    #[arg(long, env = "TOLLGATE_GRPC_MAX_CONNECTION_AGE", default_value = "24h")]
    grpc_max_connection_age: AnyDuration,
    /// gRPC: how long calls may still run past the connection's age before it is closed.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_MAX_CONNECTION_AGE_GRACE",
        default_value = "1h"
    )]
    grpc_max_connection_age_grace: AnyDuration,
    /// gRPC: a call not answered within this (request body included) gets DEADLINE_EXCEEDED.
    #[arg(long, env = "TOLLGATE_GRPC_REQUEST_TIMEOUT", default_value = "10s")]
    grpc_request_timeout: PositiveDuration,
    /// gRPC: a connection that has not sent the HTTP/2 preface within this is closed.
    #[arg(long, env = "TOLLGATE_GRPC_HANDSHAKE_TIMEOUT", default_value = "10s")]
    grpc_handshake_timeout: PositiveDuration,
    /// gRPC: how `ShouldRateLimit` is served: `inline` (answered inside the connection's poll,
    /// writes coalesced; the fast path) or `plain` (tonic's ordinary path, a task per call).
    #[arg(long, env = "TOLLGATE_GRPC_ENGINE", default_value = "inline")]
    grpc_engine: tollgate_server::grpc::GrpcEngine,
    /// gRPC: serve TLS (ALPN h2) with this certificate chain (PEM file); needs --grpc-tls-key.
    /// Read at start. (envoy: GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT.)
    #[arg(long, env = "TOLLGATE_GRPC_TLS_CERT", value_name = "PATH")]
    grpc_tls_cert: Option<PathBuf>,
    /// gRPC: the private key (PEM file) of --grpc-tls-cert. (envoy: GRPC_SERVER_TLS_KEY.)
    #[arg(long, env = "TOLLGATE_GRPC_TLS_KEY", value_name = "PATH")]
    grpc_tls_key: Option<PathBuf>,
    /// gRPC, with TLS: require a client certificate signed by one of these CAs (PEM file); a
    /// client without one is refused. (envoy: GRPC_CLIENT_TLS_CACERT.)
    #[arg(long, env = "TOLLGATE_GRPC_TLS_CLIENT_CA", value_name = "PATH")]
    grpc_tls_client_ca: Option<PathBuf>,
    /// gRPC on this unix socket instead of --grpc-addr (a socket file left there by a previous
    /// process is replaced; any other file is an error). (envoy: GRPC_UDS.)
    #[arg(long, env = "TOLLGATE_GRPC_UNIX_SOCKET", value_name = "PATH")]
    grpc_unix_socket: Option<PathBuf>,
}

impl GrpcArgs {
    /// TLS on the gRPC listener, from the `--grpc-tls-*` flags; an error names the flags
    /// missing or at odds.
    fn tls(&self) -> anyhow::Result<Option<tollgate_server::grpc::GrpcTls>> {
        let tls = match (&self.grpc_tls_cert, &self.grpc_tls_key) {
            (Some(cert), Some(key)) => Some(tollgate_server::grpc::GrpcTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.grpc_tls_client_ca.clone(),
            }),
            (Some(_), None) => anyhow::bail!(
                "--grpc-tls-cert needs --grpc-tls-key (TOLLGATE_GRPC_TLS_KEY): give both, the \
                 certificate chain and its private key"
            ),
            (None, Some(_)) => anyhow::bail!(
                "--grpc-tls-key needs --grpc-tls-cert (TOLLGATE_GRPC_TLS_CERT): give both, the \
                 certificate chain and its private key"
            ),
            (None, None) if self.grpc_tls_client_ca.is_some() => anyhow::bail!(
                "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key: client \
                 certificates are asked for on a TLS listener only"
            ),
            (None, None) => None,
        };
        if tls.is_some() && self.grpc_unix_socket.is_some() {
            anyhow::bail!(
                "--grpc-unix-socket and --grpc-tls-cert cannot go together: TLS is served on \
                 the TCP listener (--grpc-addr) only"
            );
        }
        Ok(tls)
    }

    fn limits(&self) -> GrpcLimits {
        GrpcLimits {
            max_concurrent_streams: self.grpc_max_concurrent_streams,
            max_header_list_bytes: self.grpc_max_header_list_bytes,
            keepalive_interval: self.grpc_keepalive_interval.0,
            keepalive_timeout: self.grpc_keepalive_timeout.0,
            max_connection_age: self.grpc_max_connection_age.0,
            max_connection_age_grace: self.grpc_max_connection_age_grace.0,
            request_timeout: self.grpc_request_timeout.0,
            handshake_timeout: self.grpc_handshake_timeout.0,
            engine: self.grpc_engine,
            ..GrpcLimits::default()
        }
    }
}

/// A switch flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// A listen address, or none (`off`).
#[derive(Debug, Clone, Copy)]
struct ListenAddr(Option<SocketAddr>);

/// `host:port`, `ip:port`, `[v6]:port`, `:port`, `port` (both: every interface, `0.0.0.0`) or
/// `off`. A host name is resolved here, at start (IPv4 first, as `localhost` usually means).
fn listen_addr(text: &str) -> Result<ListenAddr, String> {
    use std::net::{Ipv4Addr, ToSocketAddrs};
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(ListenAddr(None));
    }
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(ListenAddr(Some(SocketAddr::from((
            Ipv4Addr::UNSPECIFIED,
            port,
        )))));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(ListenAddr(Some(addr)));
    }
    let resolved: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("'{text}': {e} (expected host:port, ip:port, :port, port or off)"))?
        .collect();
    resolved
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| resolved.first())
        .map(|a| ListenAddr(Some(*a)))
        .ok_or_else(|| format!("'{text}' resolves to no address"))
}

/// `--sync-flush-interval`: a duration from 1 ms to 60 s.
fn flush_interval(text: &str) -> Result<Duration, String> {
    let AnyDuration(d) = text.parse()?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(60) {
        return Err(format!(
            "'{text}' is out of range: the flush interval is from 1ms to 60s"
        ));
    }
    Ok(d)
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
    /// The settings given on the command line, which a profile must not silently override.
    /// Their `TOLLGATE_*` variables do not count: the container image sets `TOLLGATE_RULES`
    /// for plain `serve`, and under the profile envoy's variables (and defaults) replace it.
    fn explicit(&self) -> tollgate_server::envoy::profile::Explicit {
        // A value that is not the variable's came from the flag.
        fn flag<T: PartialEq>(
            value: Option<&T>,
            var: &str,
            parse: impl Fn(&str) -> Option<T>,
        ) -> bool {
            match (value, std::env::var(var).ok()) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(v), Some(text)) => parse(&text).as_ref() != Some(v),
            }
        }
        let addr = |a: &ListenAddr| a.0;
        tollgate_server::envoy::profile::Explicit {
            rules: flag(self.rules.as_ref(), "TOLLGATE_RULES", |t| {
                Some(PathBuf::from(t))
            }),
            http_addr: flag(
                self.http_addr.as_ref().map(addr).as_ref(),
                "TOLLGATE_HTTP_ADDR",
                |t| listen_addr(t).ok().map(|a| a.0),
            ),
            response_headers: self.response_headers
                && std::env::var_os("TOLLGATE_RESPONSE_HEADERS").is_none(),
            redis_prefix: flag(self.redis_prefix.as_ref(), "TOLLGATE_REDIS_PREFIX", |t| {
                Some(t.to_owned())
            }),
        }
    }

    fn config(&self) -> ServeConfig {
        let mut c = ServeConfig::default();
        c.listeners.http_addr = self.http_addr.map_or(c.listeners.http_addr, |a| a.0);
        c.listeners.grpc_addr = self.grpc_addr.0;
        c.rules.path = self
            .rules
            .clone()
            .unwrap_or_else(|| crate::simulate::DEFAULT_RULES.into());
        c.rules.reload_interval = Duration::from_millis(self.reload_interval_ms.max(10));
        c.rules.xds = self.rules_from.as_ref().map(|from| {
            let mut x = tollgate_server::xds::XdsConfig::new(&from.server, &self.xds_node_id);
            x.backoff = tollgate_server::xds::Backoff::native();
            x.connect_retry = Duration::from_secs(1);
            if from.tls {
                x.tls = Some(tollgate_server::xds::XdsTls {
                    ca: self.xds_tls_ca.clone(),
                    cert: self.xds_tls_cert.clone(),
                    key: self.xds_tls_key.clone(),
                    server_name: None,
                });
            }
            x
        });
        c.rules.default_algorithm = self.counting.default_algorithm;
        c.rules.count_denied_hits = self.counting.count_denied_hits;
        c.rules.sync_default = self.counting.sync_default;
        c.store.url = self.store.store.clone();
        c.store.timeout = Duration::from_millis(self.redis_timeout_ms);
        if let Some(prefix) = &self.redis_prefix {
            c.store.prefix = prefix.clone();
        }
        c.store.redis = RedisSettings {
            policy: self.on_store_error,
            expected_instances: self.expected_instances,
            deny_cache: self.local_deny_cache,
            flush_interval: self.counting.sync_flush_interval,
            // `serve` fills in the key bound from `max_keys` below.
            ..RedisSettings::default()
        };
        c.store.per_second_url = self.redis_per_second_url.clone();
        c.store.per_second_timeout = self.redis_per_second_timeout_ms.map(Duration::from_millis);
        c.store.max_keys = self.max_keys;
        c.store.key_layout = self.counting.redis_key_layout;
        c.store.expiration_jitter = self.counting.redis_expiration_jitter.0;
        c.connections.header_read_timeout = self.header_read_timeout.0;
        c.connections.body_read_timeout = self.body_read_timeout.0;
        c.connections.idle_timeout = self.idle_timeout.0;
        if let Some(n) = self.max_connections {
            c.connections.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
            c.connections.max_connections_chosen = true;
        }
        c.connections.shutdown_timeout = self.shutdown_timeout.0;
        c.response_headers = self.response_headers;
        c.limits = RequestLimits {
            max_body_bytes: self.max_body_bytes,
            ..RequestLimits::default()
        };
        c.grpc_limits = self.grpc.limits();
        c.trusted_proxies = self.trusted_proxies.iter().filter_map(|t| t.0).collect();
        c.registry = self.registry.config();
        c.decision_log = tollgate_server::decision_log::DecisionLogConfig {
            mode: self.decision_log,
            max_per_second: self.decision_log_max_per_second,
        };
        c.live_stats = self.live_stats == OnOff::On;
        c.queue_max_waiting = self.queue_max_waiting as usize;
        c
    }
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { path, store } => Ok(crate::validate::run(&path, &store.store)),
        Command::Simulate {
            rules,
            store,
            input,
            plot,
            algorithms,
        } => {
            let plot = plot.as_deref().map(|path| crate::simulate::PlotOptions {
                path,
                algorithms: &algorithms,
            });
            crate::simulate::run(&rules, &store.store, input.as_deref(), plot)
        }
        Command::Advise(args) => crate::advise::run(&args),
        Command::GenerateLog(args) => crate::advise::generate::run(&args),
        Command::Serve(args) => {
            let native = crate::serve::NativeListeners {
                grpc_tls: args.grpc.tls()?,
                grpc_uds: args.grpc.grpc_unix_socket.clone(),
                debug_addr: args.debug_addr.map(|a| a.0),
            };
            if args.rules_from.is_some() && args.explicit().rules {
                anyhow::bail!(
                    "--rules and --rules-from both say where the rules come from: give one"
                );
            }
            let mut config = args.config();
            let stats = args.stats.settings().map_err(anyhow::Error::msg)?;
            config.near_limit_ratio = args.stats.near_limit_ratio;
            native.apply_to(&mut config);
            match args.profile {
                None => crate::serve::run(
                    config,
                    EnvoyConfig::with_stats(stats),
                    args.log_format,
                    &args.tracing,
                ),
                Some(profile) => crate::serve::run_profile(
                    profile,
                    config,
                    args.explicit(),
                    native,
                    &args.tracing,
                ),
            }
        }
        Command::Check {
            url,
            domain,
            descriptors,
            hits,
            json,
            strict,
        } => crate::check::run(&url, &domain, &descriptors, hits, json, strict),
        Command::Bench(args) => crate::bench::run(&args),
        Command::Rules(args) => crate::registry::run(args),
        Command::BenchCeiling(args) => crate::bench::ceiling::run(&args),
        Command::Completions { shell } => crate::manual::completions(shell, Cli::command()),
        Command::Man { dir } => crate::manual::man(Cli::command(), dir.as_deref()),
    }
}

/// `--rules-from`: the xDS server to dial, and whether over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RulesFrom {
    server: String,
    tls: bool,
}

/// `--rules-from`: `xds://HOST:PORT` or `xdss://HOST:PORT`.
fn rules_from(s: &str) -> Result<RulesFrom, String> {
    let (scheme, rest) = s.split_once("://").unwrap_or(("", s));
    let tls = match scheme {
        "xds" => false,
        "xdss" => true,
        _ => return Err("expected xds://HOST:PORT or xdss://HOST:PORT".into()),
    };
    if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
        return Err("expected xds://HOST:PORT or xdss://HOST:PORT".into());
    }
    Ok(RulesFrom {
        server: rest.to_owned(),
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::{rules_from, Cli};
    use clap::CommandFactory;

    /// Every `serve` setting can be given by environment (containers, systemd environment files,
    /// Kubernetes manifests set no flags): each flag has a variable named `TOLLGATE_` + the flag
    /// in upper snake case, and docs/configuration.md's table lists the pair.
    #[test]
    fn every_serve_flag_has_its_tollgate_variable_documented() {
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve subcommand");
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md"),
        )
        .unwrap();
        let mut count = 0;
        for arg in serve.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            let expected = format!("TOLLGATE_{}", long.replace('-', "_").to_uppercase());
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env.as_deref(), Some(expected.as_str()), "--{long}");
            let row = format!("| `--{long}` | `{expected}`");
            assert!(
                doc.lines().any(|l| l.starts_with(&row)),
                "docs/configuration.md has no table row starting with {row:?}"
            );
            count += 1;
        }
        assert!(count >= 40, "only {count} serve flags seen");
    }

    #[test]
    fn rules_from_takes_xds_urls_only() {
        let from = rules_from("xds://cp:18000").unwrap();
        assert_eq!((from.server.as_str(), from.tls), ("cp:18000", false));
        assert!(rules_from("xdss://cp:18000").unwrap().tls);
        assert!(rules_from("xds://cp").is_err());
        assert!(rules_from("http://cp:18000").is_err());
        assert!(rules_from("xds://").is_err());
        assert!(rules_from("xds://cp:1/path").is_err());
    }
}
