//! `tollgate serve`: build the state (memory or Redis backend), bind the listeners, run the HTTP
//! API (and the gRPC service, wired in alongside), the rules watcher and the memory-store sweeper
//! until shutdown.
//!
//! A Redis store is connected lazily: the service starts even when Redis is down (degraded, the
//! failure policy decides) and returns to Redis by itself when it answers.
//!
//! Shutdown is graceful and bounded: listeners stop accepting, in-flight requests finish, idle
//! connections close at once, background tasks stop, then [`serve`] returns `Ok(())`; whatever
//! is still open after `--shutdown-timeout` is dropped.
//!
//! The HTTP listener is our own accept loop ([`crate::listener`]): connection cap, header-read
//! and idle timeouts. At start the open-files limit is raised to its hard limit (see
//! [`raise_open_files_limit`]).

use crate::backend::{redis_unsupported, Guarded, RedisSettings};
use crate::listener::{self, ConnLimits};
use crate::reload::{self, WatchOptions};
use crate::state::{AppState, LoadedRules, RequestLimits};
use anyhow::{bail, Context};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_core::MemoryStore;
use tollgate_redis::store::redact;
use tollgate_redis::{RedisOptions, RedisStore};

/// Everything `serve` needs (each field is a `tollgate serve` flag and `TOLLGATE_*` variable).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// HTTP listen address (`--http-addr`, default `0.0.0.0:8080`).
    pub http_addr: SocketAddr,
    /// gRPC listen address (`--grpc-addr`, default `0.0.0.0:8081`).
    pub grpc_addr: SocketAddr,
    /// Rules file or directory (`--rules`).
    pub rules: PathBuf,
    /// `--store`: `memory`, `redis://..`, `rediss://..` or `redis+cluster://h1:p1,h2:p2`.
    pub store: String,
    /// `--redis-timeout-ms`: bound on each Redis call.
    pub redis_timeout: Duration,
    /// `--redis-prefix`: first part of every Redis key.
    pub redis_prefix: String,
    /// `--on-store-error`, `--expected-instances`, `--local-deny-cache`.
    pub redis: RedisSettings,
    /// `--max-keys` of the memory store.
    pub max_keys: usize,
    /// `--response-headers` (gRPC `response_headers_to_add`).
    pub response_headers: bool,
    /// Request limits (`--max-body-bytes`, ...).
    pub limits: RequestLimits,
    /// Rules polling interval.
    pub reload_interval: Duration,
    /// Memory store sweep interval.
    pub sweep_interval: Duration,
    /// `--header-read-timeout`: an HTTP client must send a complete request head within it.
    pub header_read_timeout: Duration,
    /// `--body-read-timeout`: an HTTP request body must arrive within it (else 408).
    pub body_read_timeout: Duration,
    /// `--idle-timeout`: a connection with no request in flight is closed after it.
    pub idle_timeout: Duration,
    /// `--max-connections`: most connections open at once, per listener.
    pub max_connections: usize,
    /// `--shutdown-timeout`: how long shutdown waits for open connections before dropping them.
    pub shutdown_timeout: Duration,
    /// `--grpc-*`: HTTP/2 and connection limits of the gRPC listener.
    pub grpc_limits: crate::grpc::GrpcLimits,
    /// gRPC on this unix socket instead of `grpc_addr` (envoy profile's `GRPC_UDS`).
    pub grpc_uds: Option<PathBuf>,
    /// TLS on the gRPC listener (envoy profile's `GRPC_SERVER_USE_TLS`); `None`: plaintext.
    pub grpc_tls: Option<crate::grpc::GrpcTls>,
    /// Which files of a rules directory are read (tollgate's `*.yaml`, or envoy's runtime
    /// folder under `--profile envoy`).
    pub rule_listing: tollgate_core::rules::LoadOptions,
    /// `--profile envoy`: envoyproxy/ratelimit's behaviour ([`crate::profile`]); `None` otherwise.
    pub envoy: Option<crate::profile::EnvoyMode>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            http_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 8081)),
            rules: PathBuf::from("examples/rules"),
            store: "memory".into(),
            redis_timeout: Duration::from_millis(50),
            redis_prefix: "tollgate".into(),
            redis: RedisSettings::default(),
            max_keys: tollgate_core::memory::DEFAULT_MAX_KEYS,
            response_headers: false,
            limits: RequestLimits::default(),
            reload_interval: Duration::from_millis(500),
            sweep_interval: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            shutdown_timeout: Duration::from_secs(10),
            grpc_limits: crate::grpc::GrpcLimits::default(),
            grpc_uds: None,
            grpc_tls: None,
            rule_listing: tollgate_core::rules::LoadOptions::default(),
            envoy: None,
        }
    }
}

/// Load the rules and build the state for `config`. Fails on invalid rules (at startup there
/// are no running rules to keep), on rules the store cannot serve (count-min sketch on Redis) and
/// on an unsupported store. Redis need not be up (single server): the service starts degraded.
pub async fn build_state(config: &ServeConfig) -> anyhow::Result<AppState> {
    if config.max_keys == 0 {
        bail!("--max-keys must be at least 1");
    }
    let force_start = config.envoy.as_ref().is_some_and(|m| m.force_start);
    let rules = match reload::load_with(&config.rules, config.rule_listing, 1) {
        Ok(rules) => rules,
        Err(e) if force_start => {
            // FORCE_START_WITHOUT_INITIAL_CONFIG: start with no rules; the watcher loads them
            // once they are valid (the fingerprint below never matches real files).
            tracing::warn!(
                rules = %config.rules.display(),
                error = %e,
                "no valid rules at start-up; starting without (FORCE_START_WITHOUT_INITIAL_CONFIG)"
            );
            LoadedRules {
                hash: "none".into(),
                ..LoadedRules::inline(tollgate_core::rules::RuleSet::empty())
            }
        }
        Err(e) => bail!("invalid rules in {}:\n{e}", config.rules.display()),
    };
    let builder = AppState::builder(rules)
        .rule_listing(config.rule_listing)
        .envoy(config.envoy.clone())
        .limits(config.limits)
        .rules_path(config.rules.clone())
        .response_headers(config.response_headers);
    let builder = if config.store == "memory" {
        builder.memory_store(Arc::new(MemoryStore::new(config.max_keys)))
    } else if config.store.starts_with("redis") {
        let problems = redis_unsupported(&builder.rules().set);
        if !problems.is_empty() {
            bail!(
                "rules in {} cannot run on a Redis store:\n{}",
                config.rules.display(),
                problems.join("\n")
            );
        }
        if config.redis_timeout.is_zero() {
            bail!("--redis-timeout-ms must be at least 1");
        }
        let opts = RedisOptions {
            timeout: config.redis_timeout,
            prefix: config.redis_prefix.clone(),
            ..RedisOptions::default()
        };
        let store = RedisStore::connect_lazy(&config.store, opts)
            .await
            .with_context(|| format!("cannot use --store {}", redact(&config.store)))?;
        let settings = RedisSettings {
            max_keys: config.max_keys,
            ..config.redis.clone()
        };
        builder.redis(Guarded::start(store, settings).await)
    } else {
        bail!(
            "unsupported --store '{}': expected 'memory', redis://, rediss://, redis+cluster:// or rediss+cluster://",
            redact(&config.store)
        );
    };
    Ok(builder.build())
}

/// Reject connection limits that would make the service unusable (zero timeouts or cap).
pub fn check_connection_limits(config: &ServeConfig) -> anyhow::Result<()> {
    for (flag, value) in [
        ("--header-read-timeout", config.header_read_timeout),
        ("--body-read-timeout", config.body_read_timeout),
        ("--idle-timeout", config.idle_timeout),
        ("--shutdown-timeout", config.shutdown_timeout),
    ] {
        if value.is_zero() {
            bail!("{flag} must be greater than zero (e.g. 10s)");
        }
    }
    if config.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    Ok(())
}

/// The HTTP listener's limits in `config`.
pub fn connection_limits(config: &ServeConfig) -> ConnLimits {
    ConnLimits {
        header_read_timeout: config.header_read_timeout,
        body_read_timeout: config.body_read_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
        shutdown_timeout: config.shutdown_timeout,
    }
}

/// Descriptors the process may need besides client connections (Redis connections, rule
/// files, logs, the listeners themselves).
const FD_HEADROOM: u64 = 256;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (the default soft limit, often 1024, would
/// run out long before `--max-connections`) and WARN when both listeners at their cap plus some
/// headroom could still exceed it. Returns the limit in force.
pub fn raise_open_files_limit(max_connections: usize) -> Option<u64> {
    let needed = (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(FD_HEADROOM);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            if needed > limit {
                tracing::warn!(
                    open_files_limit = limit,
                    max_connections,
                    needed,
                    "--max-connections (per listener, two listeners) exceeds the open-files limit: \
                     raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower --max-connections"
                );
            } else {
                tracing::debug!(open_files_limit = limit, "open-files limit");
            }
            Some(limit)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-files limit");
            None
        }
    }
}

/// Where the server listens (after binding: port 0 is resolved).
#[derive(Debug, Clone)]
pub struct Bound {
    /// HTTP.
    pub http: SocketAddr,
    /// gRPC on TCP (`None` when it listens on a unix socket).
    pub grpc: Option<SocketAddr>,
    /// gRPC on a unix socket (envoy profile's `GRPC_UDS`).
    pub grpc_uds: Option<PathBuf>,
    /// The store (`memory` or the Redis URL, password redacted).
    pub store: String,
}

/// A `watch` channel that turns `true` once, at shutdown. Clone the receiver for each task.
pub fn shutdown_channel() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

/// Resolves when `rx` turns `true` (or its sender is gone).
pub async fn wait_for_shutdown(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Run the service until `shutdown` resolves, then shut down gracefully.
/// `on_bound` is called once the listeners are bound (tests and the start-up message use it).
pub async fn serve(
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound) + Send,
) -> anyhow::Result<()> {
    check_connection_limits(&config)?;
    raise_open_files_limit(config.max_connections);
    let state = build_state(&config).await?;
    let http = TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", config.http_addr))?;
    let http_addr = http.local_addr()?;
    let (tx, rx) = shutdown_channel();

    let (grpc, grpc_addr) = match &config.grpc_uds {
        None => {
            let grpc = TcpListener::bind(config.grpc_addr)
                .await
                .with_context(|| format!("cannot listen for gRPC on {}", config.grpc_addr))?;
            let addr = grpc.local_addr()?;
            match &config.grpc_tls {
                None => (crate::grpc::GrpcListener::Tcp(grpc), Some(addr)),
                Some(tls) => {
                    let acceptor = tls
                        .acceptor()
                        .map_err(|e| anyhow::anyhow!("cannot use the gRPC TLS files: {e}"))?;
                    (crate::grpc::GrpcListener::Tls(grpc, acceptor), Some(addr))
                }
            }
        }
        #[cfg(unix)]
        Some(path) => (crate::grpc::GrpcListener::Unix(bind_unix(path)?), None),
        #[cfg(not(unix))]
        Some(path) => bail!("unix sockets are not supported here: {}", path.display()),
    };
    let mut grpc = tokio::spawn(crate::grpc::serve_on(
        state.clone(),
        grpc,
        config.grpc_limits,
        config.max_connections,
        config.shutdown_timeout,
        wait_for_shutdown(rx.clone()),
    ));

    let rules = state.rules();
    tracing::info!(
        rules = %config.rules.display(),
        version = %rules.hash,
        domains = rules.set.domains().count(),
        limits = rules.set.limits().count(),
        store = %state.store_label(),
        "rules loaded"
    );
    if rules.set.is_empty() {
        // A typo in --rules (an empty or wrong directory) must not pass for "no limits" unseen.
        tracing::warn!(
            rules = %config.rules.display(),
            "no rate-limit domains in {}: no request will be limited",
            config.rules.display()
        );
    }
    drop(rules);

    let watcher = tokio::spawn(reload::watch(
        state.clone(),
        config.rules.clone(),
        WatchOptions {
            interval: config.reload_interval,
            ..WatchOptions::default()
        },
        rx.clone(),
    ));
    let sweeper = tokio::spawn(sweep(state.clone(), config.sweep_interval, rx.clone()));
    let stopping = state.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.begin_shutdown();
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(true);
    });

    on_bound(Bound {
        http: http_addr,
        grpc: grpc_addr,
        grpc_uds: config.grpc_uds.clone(),
        store: state.store_label(),
    });

    // The API service itself, not `http::router`'s `Router` around it (which would route every
    // request twice), unless the trace layer is wanted: that one comes with the `Router`.
    let limits = connection_limits(&config);
    let counters = state.metrics().http_connections.clone();
    let mut http_task = if crate::http::trace_wanted() {
        let service = crate::http::router(state.clone());
        tokio::spawn(listener::serve(http, service, limits, counters, rx.clone()))
    } else {
        let service = crate::http::service(state.clone());
        tokio::spawn(listener::serve(http, service, limits, counters, rx.clone()))
    };
    // The listener only ends once shutdown is requested (it may see that first).
    let early = tokio::select! {
        biased;
        _ = wait_for_shutdown(rx.clone()) => None,
        ended = &mut http_task => Some(ended),
    };
    // One deadline for the whole shutdown. The HTTP listener drops its connections at its own
    // (same) deadline; the second of slack lets it do so before being aborted itself.
    let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
    match early {
        Some(ended) => {
            ended.context("HTTP server task failed")?;
            if !*rx.borrow() {
                bail!("HTTP server stopped before shutdown");
            }
        }
        None => {
            match tokio::time::timeout_at(deadline + Duration::from_secs(1), &mut http_task).await {
                Ok(ended) => ended.context("HTTP server task failed")?,
                Err(_) => {
                    tracing::warn!("shutdown timeout: HTTP server aborted");
                    http_task.abort();
                }
            }
        }
    }
    match tokio::time::timeout_at(deadline, &mut grpc).await {
        Ok(ended) => ended
            .context("gRPC server task failed")?
            .context("gRPC server failed")?,
        Err(_) => {
            tracing::warn!("shutdown timeout: gRPC server aborted with connections still open");
            grpc.abort();
        }
    }
    let _ = watcher.await;
    let _ = sweeper.await;
    tracing::info!("stopped");
    Ok(())
}

/// Listen on the unix socket `path`. A socket file left there by a previous process is
/// replaced (a restart must not fail on it); any other file is an error, never deleted.
#[cfg(unix)]
fn bind_unix(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot replace the socket {}", path.display()))?;
        } else {
            bail!(
                "cannot listen for gRPC on {}: the file exists and is not a socket",
                path.display()
            );
        }
    }
    tokio::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen for gRPC on unix socket {}", path.display()))
}

/// The start-up line: where to send a request.
pub fn listening_message(bound: &Bound) -> String {
    let port = bound.http.port();
    let grpc = match (&bound.grpc, &bound.grpc_uds) {
        (Some(g), _) => format!(", gRPC {g}"),
        (None, Some(path)) => format!(", gRPC unix:{}", path.display()),
        (None, None) => String::new(),
    };
    format!(
        "listening: HTTP http://{} (try: curl -s localhost:{port}/v1/check -H 'content-type: application/json' -d '{{\"domain\":\"api\",\"descriptors\":[{{\"entries\":[{{\"key\":\"user\",\"value\":\"alice\"}}]}}]}}'){grpc}, store {}",
        bound.http, bound.store
    )
}

/// Drop expired memory-store entries every `every` until shutdown.
async fn sweep(state: AppState, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let Some(store) = state.memory_store().cloned() else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let now = state.now();
        let s = store.clone();
        if let Ok(n) = tokio::task::spawn_blocking(move || s.sweep(now)).await {
            if n > 0 {
                tracing::debug!(dropped = n, "swept expired counters");
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called (call
/// it inside the runtime), so a signal arriving before the future is polled is not lost.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        async move {
            match handlers {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM received"),
                        _ = int.recv() => tracing::info!("SIGINT received"),
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
