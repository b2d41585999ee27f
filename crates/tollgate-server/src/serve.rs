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
//! The HTTP listener is our own accept loop (`crate::listener`): connection cap, header-read
//! and idle timeouts. At start the open-files limit is raised to its hard limit (see
//! `raise_open_files_limit`).

use crate::backend::{redis_unsupported, Guarded, RedisSettings};
pub use crate::config::ServeConfig;
use crate::envoy::EnvoyConfig;
use crate::http::HttpApi;
use crate::listener::{self, ConnLimits};
use crate::reload::{self, WatchOptions};
use crate::state::{AppState, LoadedRules};
use anyhow::{bail, Context};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_core::clock::Clock;
use tollgate_core::rules::RuleDefaults;
use tollgate_core::MemoryStore;
use tollgate_redis::store::redact;
use tollgate_redis::{RedisOptions, RedisStore};

/// Load the rules and build the state for `config`. Fails on invalid rules (at startup there
/// are no running rules to keep), on rules the store cannot serve (count-min sketch on Redis) and
/// on an unsupported store. Redis need not be up (single server): the service starts degraded.
///
/// Decisions are made on the wall clock (stepped monotonically), and on Redis at the Redis
/// server's `TIME`; [`build_state_with_clock`] takes the time as a parameter.
pub async fn build_state(config: &ServeConfig, envoy: &EnvoyConfig) -> anyhow::Result<AppState> {
    build_state_at(config, envoy, None).await
}

/// [`build_state`] with `clock` as the time of every decision, on every store: the memory
/// store steps at it, and Redis scripts are given it instead of reading Redis `TIME`
/// ([`RedisSettings::caller_clock`]). Tests pass a `ManualClock` to cross window boundaries.
pub async fn build_state_with_clock(
    config: &ServeConfig,
    envoy: &EnvoyConfig,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<AppState> {
    build_state_at(config, envoy, Some(clock)).await
}

async fn build_state_at(
    config: &ServeConfig,
    envoy: &EnvoyConfig,
    clock: Option<Arc<dyn Clock>>,
) -> anyhow::Result<AppState> {
    if config.store.max_keys == 0 {
        bail!("--max-keys must be at least 1");
    }
    let force_start = envoy.mode.as_ref().is_some_and(|m| m.force_start);
    let from_xds = config.rules.xds.is_some();
    if !force_start && !from_xds && !config.rules.path.exists() {
        let cwd = std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "?".into());
        let origin = config
            .rules
            .origin
            .as_deref()
            .unwrap_or("set it with --rules PATH or TOLLGATE_RULES");
        bail!(
            "rules path {} not found (relative to the working directory {cwd}): {origin}",
            config.rules.path.display()
        );
    }
    let defaults = RuleDefaults {
        algorithm: config.rules.default_algorithm,
        count_denied_hits: config.rules.count_denied_hits,
        sync: config.rules.sync_default,
    };
    let loaded = if from_xds {
        // The xDS subscription brings the rules; until then there are none (and `/readyz`
        // says so).
        Ok(crate::xds::initial_rules(defaults))
    } else {
        reload::load_with(&config.rules.path, config.rules.listing, 1, defaults)
    };
    let rules = match loaded {
        Ok(rules) => rules,
        Err(e) if force_start => {
            // FORCE_START_WITHOUT_INITIAL_CONFIG: start with no rules; the watcher loads them
            // once they are valid (the fingerprint below never matches real files).
            tracing::warn!(
                rules = %config.rules.path.display(),
                error = %e,
                "no valid rules at start-up; starting without (FORCE_START_WITHOUT_INITIAL_CONFIG)"
            );
            LoadedRules {
                hash: "none".into(),
                ..LoadedRules::inline(
                    tollgate_core::rules::RuleSet::empty().with_defaults(defaults),
                )
            }
        }
        Err(e) => bail!("invalid rules in {}:\n{e}", config.rules.path.display()),
    };
    let mut builder = AppState::builder(rules)
        .rule_listing(config.rules.listing)
        .limits(config.limits)
        .live_stats(config.live_stats)
        .queue_max_waiting(config.queue_max_waiting)
        .tracing(config.tracing.clone())
        .rules_path(config.rules.path.clone());
    if let Some(policy) = envoy.policy() {
        builder = builder.policy(policy);
    }
    let caller_clock = clock.is_some();
    let builder = match clock {
        Some(clock) => builder.clock(clock),
        None => builder,
    };
    let builder = if config.store.url == "memory" {
        if config.store.per_second_url.is_some() {
            bail!("--redis-per-second-url needs a Redis --store (per-second limits move from one Redis to another)");
        }
        builder.memory_store(Arc::new(MemoryStore::new(config.store.max_keys)))
    } else if config.store.url.starts_with("redis") {
        let problems = store_rule_problems(&config.store.url, &builder.rules().set);
        if !problems.is_empty() {
            bail!(
                "rules in {} cannot run on a Redis store:\n{}",
                config.rules.path.display(),
                problems.join("\n")
            );
        }
        if config.store.timeout.is_zero() {
            bail!("--redis-timeout-ms must be at least 1");
        }
        let opts = RedisOptions {
            timeout: config.store.timeout,
            prefix: config.store.prefix.clone(),
            key_layout: config.store.key_layout,
            expiration_jitter: config.store.expiration_jitter,
            ..RedisOptions::default()
        };
        let store = RedisStore::connect_lazy(&config.store.url, opts.clone())
            .await
            .with_context(|| format!("cannot use --store {}", redact(&config.store.url)))?;
        let settings = RedisSettings {
            max_keys: config.store.max_keys,
            caller_clock: caller_clock || config.store.redis.caller_clock,
            ..config.store.redis.clone()
        };
        match &config.store.per_second_url {
            None => builder.redis(Guarded::start(store, settings).await),
            Some(url) => {
                if !url.starts_with("redis") {
                    bail!(
                        "unsupported --redis-per-second-url '{}': expected a Redis URL, as --store takes",
                        redact(url)
                    );
                }
                let timeout = config
                    .store
                    .per_second_timeout
                    .unwrap_or(config.store.timeout);
                if timeout.is_zero() {
                    bail!("--redis-per-second-timeout-ms must be at least 1");
                }
                let ps_opts = RedisOptions { timeout, ..opts };
                let ps = RedisStore::connect_lazy(url, ps_opts)
                    .await
                    .with_context(|| {
                        format!("cannot use --redis-per-second-url {}", redact(url))
                    })?;
                // One fallback store for both: their keys are disjoint.
                let local = Arc::new(MemoryStore::new(settings.max_keys.max(1)));
                let main = Guarded::start_with_local(store, settings.clone(), local.clone()).await;
                let per_second = Guarded::start_with_local(ps, settings, local).await;
                builder.redis_split(main, per_second)
            }
        }
    } else {
        bail!(
            "unsupported --store '{}': expected 'memory', redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel://, rediss+sentinel:// or redis+unix://",
            redact(&config.store.url)
        );
    };
    if !(config.near_limit_ratio > 0.0 && config.near_limit_ratio <= 1.0) {
        bail!(
            "--near-limit-ratio must be in (0, 1], got {}",
            config.near_limit_ratio
        );
    }
    let state = builder.build();
    if let Some(xds) = &config.rules.xds {
        // Before any listener serves: `/readyz` must never see "no xDS" for a moment.
        state.set_xds(Arc::new(crate::xds_status::XdsStatus::new(
            xds.server.clone(),
            xds.force_start,
        )));
    }
    state
        .metrics()
        .set_near_limit_ratio(config.near_limit_ratio);
    Ok(state)
}

/// Limits of `set` that the store named by `--store` cannot serve (count-min sketch and
/// out-of-range periods on Redis; none on memory): the check `serve` makes at start and
/// `validate --store` makes.
pub fn store_rule_problems(store: &str, set: &tollgate_core::rules::RuleSet) -> Vec<String> {
    if store.starts_with("redis") {
        redis_unsupported(set)
    } else {
        Vec::new()
    }
}

/// Whether `--store` names a store `serve` supports (`memory` or a Redis URL scheme).
pub fn store_supported(store: &str) -> bool {
    store == "memory" || store.starts_with("redis")
}

/// Reject connection limits that would make the service unusable (zero timeouts or cap).
pub(crate) fn check_connection_limits(config: &ServeConfig) -> anyhow::Result<()> {
    for (flag, value) in [
        (
            "--header-read-timeout",
            config.connections.header_read_timeout,
        ),
        ("--body-read-timeout", config.connections.body_read_timeout),
        ("--idle-timeout", config.connections.idle_timeout),
        ("--shutdown-timeout", config.connections.shutdown_timeout),
    ] {
        if value.is_zero() {
            bail!("{flag} must be greater than zero (e.g. 10s)");
        }
    }
    if config.connections.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    Ok(())
}

/// The HTTP listener's limits in `config`.
pub(crate) fn connection_limits(config: &ServeConfig) -> ConnLimits {
    ConnLimits {
        header_read_timeout: config.connections.header_read_timeout,
        body_read_timeout: config.connections.body_read_timeout,
        idle_timeout: config.connections.idle_timeout,
        max_connections: config.connections.max_connections,
        shutdown_timeout: config.connections.shutdown_timeout,
    }
}

/// Descriptors the process may need besides client connections (Redis connections, rule
/// files, logs, the listeners themselves).
const FD_HEADROOM: u64 = 256;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (the default soft limit, often 1024, would
/// run out long before `--max-connections`) and return the per-listener connection cap to use
/// on `listeners` listeners: a default cap (not `chosen`) that the limit cannot hold is lowered
/// to fit, silently; a chosen one is kept and warned about.
pub(crate) fn raise_open_files_limit(
    max_connections: usize,
    listeners: usize,
    chosen: bool,
) -> usize {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            tracing::debug!(open_files_limit = limit, "open-files limit");
            let (cap, warning) = fit_connections(max_connections, listeners, limit, chosen);
            if let Some(w) = warning {
                tracing::warn!(open_files_limit = limit, max_connections, listeners, "{w}");
            } else if cap != max_connections {
                tracing::info!(
                    open_files_limit = limit,
                    max_connections = cap,
                    "connections per listener capped to fit the open-files limit (raise its hard \
                     limit, e.g. LimitNOFILE=, for more)"
                );
            }
            cap
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-files limit");
            max_connections
        }
    }
}

/// The connection cap per listener when `listeners` listeners each hold up to
/// `max_connections` under the open-files `limit` (plus [`FD_HEADROOM`] for everything else).
/// A default cap (not `chosen`) that does not fit is lowered to what does, silently: the
/// defaults must fit each other. A chosen one is kept and the returned text says what to do.
pub(crate) fn fit_connections(
    max_connections: usize,
    listeners: usize,
    limit: u64,
    chosen: bool,
) -> (usize, Option<String>) {
    let listeners = listeners.max(1) as u64;
    let needed = (max_connections as u64)
        .saturating_mul(listeners)
        .saturating_add(FD_HEADROOM);
    if needed <= limit {
        return (max_connections, None);
    }
    if chosen {
        let plural = if listeners == 1 { "" } else { "s" };
        return (
            max_connections,
            Some(format!(
                "--max-connections {max_connections} (per listener, {listeners} listener{plural}) \
                 exceeds the open-files limit {limit}: raise the hard limit (ulimit -Hn, \
                 LimitNOFILE=) or lower --max-connections"
            )),
        );
    }
    let fits = limit.saturating_sub(FD_HEADROOM) / listeners;
    (usize::try_from(fits).unwrap_or(usize::MAX).max(1), None)
}

/// Where the server listens (after binding: port 0 is resolved).
#[derive(Debug, Clone)]
pub struct Bound {
    /// HTTP, unless turned off.
    pub http: Option<SocketAddr>,
    /// gRPC on TCP (`None` when turned off or on a unix socket).
    pub grpc: Option<SocketAddr>,
    /// gRPC on a unix socket (envoy profile's `GRPC_UDS`).
    pub grpc_uds: Option<PathBuf>,
    /// The store (`memory` or the Redis URL, password redacted).
    pub store: String,
    /// envoy's debug port, when on and bound.
    pub debug: Option<SocketAddr>,
    /// A `/v1/check` body that a loaded rule limits ([`example_check`]), for the hint.
    pub example: Option<String>,
}

/// A `watch` channel that turns `true` once, at shutdown. Clone the receiver for each task.
pub(crate) fn shutdown_channel() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

/// Resolves when `rx` turns `true` (or its sender is gone).
pub(crate) async fn wait_for_shutdown(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The HTTP API as [`serve`] composes it for `state`: the API and Envoy's `/json`, and under
/// the profile (`envoy`) its `/healthcheck`. Chain [`HttpApi::registry`] and
/// [`HttpApi::trusted_proxies`] for the rest of `serve`'s settings.
pub fn http_api(state: &AppState, envoy: Option<&crate::envoy::EnvoyMode>) -> HttpApi {
    let health = envoy.map(|m| crate::envoy::Health::new(state.clone(), m));
    http_api_with(state, envoy, health)
}

/// [`http_api`] with the Envoy health `serve` shares with the gRPC health service.
fn http_api_with(
    state: &AppState,
    envoy: Option<&crate::envoy::EnvoyMode>,
    health: Option<Arc<crate::envoy::Health>>,
) -> HttpApi {
    HttpApi::new(state.clone()).routes(crate::envoy::http_routes(envoy, health))
}

/// Run the service until `shutdown` resolves, then shut down gracefully.
/// `on_bound` is called once the listeners are bound (tests and the start-up message use it).
///
/// The steps: settle the connection limits, build the state, bind every listener (nothing is
/// started until all are bound), start gRPC, say which rules are loaded, start the background
/// tasks, tell `on_bound` where the server listens, start HTTP, then wait for shutdown and stop
/// everything within one deadline.
pub async fn serve(
    config: ServeConfig,
    envoy: EnvoyConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound) + Send,
) -> anyhow::Result<()> {
    let mut config = config;
    settle_limits(&mut config, &envoy)?;
    let state = build_state(&config, &envoy).await?;
    let (tx, rx) = shutdown_channel();
    let mut listeners = Listeners::bind(&config, &envoy, &state, &rx).await?;
    let grpc_addr = listeners.grpc.as_ref().and_then(|(_, addr)| *addr);
    // Envoy compatibility: its health, shared by `/healthcheck` and the gRPC health service.
    let health = envoy
        .mode
        .as_ref()
        .map(|m| crate::envoy::Health::new(state.clone(), m));
    let grpc = spawn_grpc(
        &state,
        &config,
        &envoy,
        health.clone(),
        listeners.grpc.take(),
        &rx,
    );
    log_rules(&state, &config);
    let background = Background::spawn(&state, &config, &envoy, &mut listeners, &rx);
    forward_shutdown(&state, shutdown, tx);
    on_bound(Bound {
        http: listeners.http_addr,
        grpc: grpc_addr,
        grpc_uds: config.listeners.grpc_uds.clone(),
        store: state.store_label(),
        debug: background.debug_addr,
        example: example_check(&state.rules().set),
    });
    let api = http_api_with(&state, envoy.mode.as_ref(), health)
        .registry(listeners.registry)
        .trusted_proxies(config.trusted_proxies.clone());
    let http = spawn_http(&state, api, listeners.http, connection_limits(&config), &rx);
    stop(&state, &config, http, grpc, background, &rx).await
}

/// Check the connection settings, install the decision log, raise the open-files limit for
/// the connections of the listeners that are on, and refuse a server with no listener.
fn settle_limits(config: &mut ServeConfig, envoy: &EnvoyConfig) -> anyhow::Result<()> {
    check_connection_limits(config)?;
    crate::decision_log::install(config.decision_log);
    let listeners = [
        config.listeners.http_addr.is_some(),
        config.listeners.grpc_addr.is_some() || config.listeners.grpc_uds.is_some(),
        config.listeners.debug_addr.is_some(),
        envoy.stats.prometheus.is_some(),
    ]
    .into_iter()
    .filter(|on| *on)
    .count();
    config.connections.max_connections = raise_open_files_limit(
        config.connections.max_connections,
        listeners,
        config.connections.max_connections_chosen,
    );
    if config.listeners.http_addr.is_none()
        && config.listeners.grpc_addr.is_none()
        && config.listeners.grpc_uds.is_none()
    {
        bail!("--http-addr and --grpc-addr are both off: turn at least one listener on");
    }
    Ok(())
}

/// Every listener of [`serve`], bound, and the rule registry, started.
struct Listeners {
    http: Option<TcpListener>,
    http_addr: Option<SocketAddr>,
    grpc: Option<(crate::grpc::GrpcListener, Option<SocketAddr>)>,
    prometheus: Option<(TcpListener, String)>,
    debug: Option<TcpListener>,
    registry: Option<Arc<crate::registry::Registry>>,
    registry_task: Option<tokio::task::JoinHandle<()>>,
}

impl Listeners {
    /// Every listener is bound, and every step that can fail is taken, before anything is
    /// started: a start that fails (a port taken, unreadable TLS files, a registry that cannot
    /// be read) returns its error with no listener served and no task left running, and the
    /// sockets bound so far close as they are dropped.
    async fn bind(
        config: &ServeConfig,
        envoy: &EnvoyConfig,
        state: &AppState,
        rx: &watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        let http = match config.listeners.http_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen for HTTP on {addr}"))?,
            ),
            None => None,
        };
        let http_addr = http.as_ref().map(TcpListener::local_addr).transpose()?;
        let grpc = bind_grpc(config).await?;
        let prometheus = bind_envoy_metrics(&envoy.stats).await?;
        let debug = bind_debug(config).await;
        // Last of the fallible steps: it starts the registry's tasks only once nothing can fail.
        let registry =
            crate::registry::start(state, &config.registry, &config.store.url, rx.clone())
                .await
                .context("cannot start the rule registry")?;
        let (registry, registry_task) = match registry {
            Some(r) => (Some(r.registry), r.follower),
            None => (None, None),
        };
        Ok(Self {
            http,
            http_addr,
            grpc,
            prometheus,
            debug,
            registry,
            registry_task,
        })
    }
}

/// The gRPC service on `listener` (a task that ends at once when there is none).
fn spawn_grpc(
    state: &AppState,
    config: &ServeConfig,
    envoy: &EnvoyConfig,
    health: Option<Arc<crate::envoy::Health>>,
    listener: Option<(crate::grpc::GrpcListener, Option<SocketAddr>)>,
    rx: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let Some((listener, _)) = listener else {
        // No gRPC listener: nothing to wait for at shutdown.
        return tokio::spawn(async { Ok::<(), std::io::Error>(()) });
    };
    if config.grpc_limits.engine == crate::grpc::GrpcEngine::Plain {
        tracing::info!(
            "gRPC engine {}: ShouldRateLimit through tonic's ordinary path, a task per call",
            config.grpc_limits.engine
        );
    }
    // Envoy compatibility: its gRPC answers.
    let answers =
        crate::envoy::grpc_answers(state, envoy.mode.as_ref(), health, config.response_headers);
    tokio::spawn(crate::grpc::serve_on(
        state.clone(),
        answers,
        listener,
        config.grpc_limits,
        config.connections.max_connections,
        config.connections.shutdown_timeout,
        wait_for_shutdown(rx.clone()),
    ))
}

/// Say where the rules come from and what they hold; warn when a rules path holds none.
fn log_rules(state: &AppState, config: &ServeConfig) {
    let rules = state.rules();
    if let Some(xds) = &config.rules.xds {
        tracing::info!(
            server = %xds.server,
            node = %xds.node_id.escape_debug(),
            store = %state.store_label(),
            "rules from an xDS server: none until it sends them"
        );
    } else {
        tracing::info!(
            rules = %config.rules.path.display(),
            version = %rules.hash,
            domains = rules.set.domains().count(),
            limits = rules.set.limits().count(),
            store = %state.store_label(),
            "rules loaded"
        );
    }
    if rules.set.is_empty() && config.rules.xds.is_none() {
        // A typo in --rules (an empty or wrong directory) must not pass for "no limits" unseen.
        tracing::warn!(
            rules = %config.rules.path.display(),
            "no rate-limit domains in {}: no request will be limited",
            config.rules.path.display()
        );
    }
}

/// The tasks beside the listeners of the API: the rules watcher (file or xDS), the
/// memory-store sweeper, Envoy's stats sinks, the debug listener and the registry's follower.
struct Background {
    watcher: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    envoy_stats: Vec<tokio::task::JoinHandle<()>>,
    debug: Option<tokio::task::JoinHandle<()>>,
    debug_addr: Option<SocketAddr>,
    registry: Option<tokio::task::JoinHandle<()>>,
}

impl Background {
    /// Start them, with what of `listeners` they serve (taken from it).
    fn spawn(
        state: &AppState,
        config: &ServeConfig,
        envoy: &EnvoyConfig,
        listeners: &mut Listeners,
        rx: &watch::Receiver<bool>,
    ) -> Self {
        let watcher = match &config.rules.xds {
            Some(xds) => tokio::spawn(crate::xds::start(state, xds.clone(), rx.clone())),
            None => tokio::spawn(reload::watch(
                state.clone(),
                config.rules.path.clone(),
                WatchOptions {
                    interval: config.rules.reload_interval,
                    registry: listeners.registry.clone(),
                    ..WatchOptions::default()
                },
                rx.clone(),
            )),
        };
        let sweeper = tokio::spawn(sweep(
            state.clone(),
            config.store.sweep_interval,
            rx.clone(),
        ));
        let limits = connection_limits(config);
        let prometheus = listeners.prometheus.take();
        let envoy_stats = spawn_envoy_stats(state, &envoy.stats, prometheus, limits, rx);
        let debug_listener = listeners.debug.take();
        let debug_addr = debug_listener.as_ref().and_then(|l| l.local_addr().ok());
        let debug = debug_listener.map(|listener| {
            tokio::spawn(listener::serve(
                "debug",
                listener,
                listener::with_connect_info(crate::envoy::debug::router(state.clone())),
                limits,
                Arc::new(crate::metrics::ConnectionMetrics::default()),
                rx.clone(),
            ))
        });
        Self {
            watcher,
            sweeper,
            envoy_stats,
            debug,
            debug_addr,
            registry: listeners.registry_task.take(),
        }
    }
}

/// Once `shutdown` resolves: the state told (readiness turns false), and every task.
fn forward_shutdown(
    state: &AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    tx: watch::Sender<bool>,
) {
    let stopping = state.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.begin_shutdown();
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(true);
    });
}

/// The HTTP API on `listener` (a task that ends at shutdown when there is none).
///
/// The API service itself, not `HttpApi::router`'s `Router` around it (which would route every
/// request twice), unless the trace layer is wanted: that one comes with the `Router`.
fn spawn_http(
    state: &AppState,
    api: HttpApi,
    listener: Option<TcpListener>,
    limits: ConnLimits,
    rx: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let counters = state.metrics().http_connections.clone();
    match listener {
        // No HTTP listener: a task that ends at shutdown stands in for it.
        None => tokio::spawn(wait_for_shutdown(rx.clone())),
        // The two services are of two types: a call each.
        Some(http) if crate::http::trace_wanted() => tokio::spawn(listener::serve(
            "HTTP",
            http,
            listener::with_connect_info(api.router()),
            limits,
            counters,
            rx.clone(),
        )),
        Some(http) => {
            let api = api.service();
            tokio::spawn(listener::serve(
                "HTTP",
                http,
                move |peer| api.with_peer(peer),
                limits,
                counters,
                rx.clone(),
            ))
        }
    }
}

/// Wait for shutdown (or an HTTP listener that ends before it: an error), then stop the
/// listeners within one deadline, the background tasks, and give Redis back what this
/// instance holds.
async fn stop(
    state: &AppState,
    config: &ServeConfig,
    mut http: tokio::task::JoinHandle<()>,
    grpc: tokio::task::JoinHandle<std::io::Result<()>>,
    background: Background,
    rx: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // The listener only ends once shutdown is requested (it may see that first).
    let early = tokio::select! {
        biased;
        _ = wait_for_shutdown(rx.clone()) => None,
        ended = &mut http => Some(ended),
    };
    // One deadline for the whole shutdown. Each listener drops its connections at its own
    // (same) deadline; the second of slack lets it do so (and say so) before being aborted.
    let deadline = tokio::time::Instant::now() + config.connections.shutdown_timeout;
    let abort_at = deadline + Duration::from_secs(1);
    match early {
        Some(ended) => {
            ended.context("HTTP server task failed")?;
            if !*rx.borrow() {
                bail!("HTTP server stopped before shutdown");
            }
        }
        None => stop_http(http, abort_at).await?,
    }
    stop_grpc(grpc, abort_at).await?;
    background.stop(abort_at).await;
    give_back(state).await;
    tracing::info!("stopped");
    Ok(())
}

/// The HTTP listener's end, aborted at `abort_at`.
async fn stop_http(
    mut http: tokio::task::JoinHandle<()>,
    abort_at: tokio::time::Instant,
) -> anyhow::Result<()> {
    match tokio::time::timeout_at(abort_at, &mut http).await {
        Ok(ended) => ended.context("HTTP server task failed")?,
        Err(_) => {
            tracing::warn!("shutdown timeout: HTTP server aborted");
            http.abort();
        }
    }
    Ok(())
}

/// The gRPC listener's end, aborted at `abort_at`.
async fn stop_grpc(
    mut grpc: tokio::task::JoinHandle<std::io::Result<()>>,
    abort_at: tokio::time::Instant,
) -> anyhow::Result<()> {
    match tokio::time::timeout_at(abort_at, &mut grpc).await {
        Ok(ended) => ended
            .context("gRPC server task failed")?
            .context("gRPC server failed")?,
        Err(_) => {
            tracing::warn!("shutdown timeout: gRPC server aborted with connections still open");
            grpc.abort();
        }
    }
    Ok(())
}

impl Background {
    /// Wait for the tasks to end (they end at shutdown); the debug listener is given up at
    /// `abort_at`, each stats sink after five seconds.
    async fn stop(self, abort_at: tokio::time::Instant) {
        if let Some(task) = self.debug {
            if tokio::time::timeout_at(abort_at, task).await.is_err() {
                tracing::warn!("shutdown timeout: debug listener aborted");
            }
        }
        let _ = self.watcher.await;
        let _ = self.sweeper.await;
        if let Some(task) = self.registry {
            let _ = task.await;
        }
        for task in self.envoy_stats {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

/// Lease units this instance holds go back to Redis for the instances that stay, and the
/// counts of batched limits admitted since the last flush are sent.
async fn give_back(state: &AppState) {
    let backend = state.backend();
    for g in backend.redis().into_iter().chain(backend.per_second()) {
        let _ = tokio::time::timeout(Duration::from_secs(2), g.return_leases(state.now())).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), g.flush(state.now())).await;
    }
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

/// The value the hint sends where a rule takes any value.
const EXAMPLE_VALUE: &str = "alice";

/// A `/v1/check` body (JSON) that one of `rules`' limits decides, for the start line's hint:
/// the first rule with a limit (one not in shadow mode when there is one), with the values it
/// names (a pattern's `*` matching nothing) and `alice` where it takes any value.
/// `None` when no rule limits anything.
pub fn example_check(rules: &tollgate_core::rules::RuleSet) -> Option<String> {
    let limited = || rules.limits().filter(|l| l.quota.is_some());
    let limit = limited()
        .find(|l| !l.shadow_mode)
        .or_else(|| limited().next())?;
    // The id is the domain, then `key` or `key=value` per level, joined by `|`; `\` escapes
    // `\`, `|` and `=` in each part.
    let mut parts: Vec<(String, Option<String>)> = Vec::new();
    let mut chars = limit.id.chars();
    let mut part = (String::new(), None::<String>);
    let mut first = true;
    let mut end = |part: &mut (String, Option<String>), first: &mut bool| {
        let done = std::mem::take(part);
        if !std::mem::replace(first, false) {
            parts.push(done);
        }
    };
    while let Some(c) = chars.next() {
        let c = match c {
            '\\' => chars.next().unwrap_or('\\'),
            '|' => {
                end(&mut part, &mut first);
                continue;
            }
            '=' if part.1.is_none() => {
                part.1 = Some(String::new());
                continue;
            }
            c => c,
        };
        match &mut part.1 {
            Some(v) => v.push(c),
            None => part.0.push(c),
        }
    }
    end(&mut part, &mut first);
    let entries: Vec<serde_json::Value> = parts
        .into_iter()
        .map(|(key, value)| {
            let value = value.map_or_else(|| EXAMPLE_VALUE.to_owned(), |v| v.replace('*', ""));
            serde_json::json!({"key": key, "value": value})
        })
        .collect();
    (!entries.is_empty()).then(|| {
        serde_json::json!({"domain": limit.domain, "descriptors": [{"entries": entries}]})
            .to_string()
    })
}

/// The start-up line: where to send a request (with a request a loaded rule limits, when one
/// does).
pub fn listening_message(bound: &Bound) -> String {
    let mut parts = Vec::new();
    if let Some(http) = bound.http {
        let port = http.port();
        parts.push(match &bound.example {
            // Shell-quoted: inside '...' only `'` needs care. JSON already escapes control
            // characters, so the line carries none.
            Some(body) => format!(
                "HTTP http://{http} (try: curl -s localhost:{port}/v1/check -H 'content-type: application/json' -d '{}')",
                body.replace('\'', "'\\''")
            ),
            None => format!("HTTP http://{http}"),
        });
    }
    match (&bound.grpc, &bound.grpc_uds) {
        (Some(grpc), _) => parts.push(format!("gRPC {grpc}")),
        (None, Some(path)) => parts.push(format!("gRPC unix:{}", path.display())),
        (None, None) => {}
    }
    if let Some(debug) = bound.debug {
        parts.push(format!("debug http://{debug}"));
    }
    format!("listening: {}, store {}", parts.join(", "), bound.store)
}

/// The gRPC listener `config` asks for (a unix socket, TLS over TCP or TCP) and, on TCP, its
/// address; `None` when gRPC is off.
async fn bind_grpc(
    config: &ServeConfig,
) -> anyhow::Result<Option<(crate::grpc::GrpcListener, Option<SocketAddr>)>> {
    Ok(
        match (&config.listeners.grpc_uds, config.listeners.grpc_addr) {
            #[cfg(unix)]
            (Some(path), _) => Some((crate::grpc::GrpcListener::Unix(bind_unix(path)?), None)),
            #[cfg(not(unix))]
            (Some(path), _) => bail!("unix sockets are not supported here: {}", path.display()),
            (None, None) => None,
            (None, Some(addr)) => {
                // The TLS files first: a bad one is reported before the port is taken.
                let acceptor = match &config.listeners.grpc_tls {
                    None => None,
                    Some(tls) => Some(
                        tls.acceptor()
                            .map_err(|e| anyhow::anyhow!("cannot use the gRPC TLS files: {e}"))?,
                    ),
                };
                let grpc = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen for gRPC on {addr}"))?;
                let local = grpc.local_addr()?;
                match acceptor {
                    None => Some((crate::grpc::GrpcListener::Tcp(grpc), Some(local))),
                    Some(acceptor) => {
                        Some((crate::grpc::GrpcListener::Tls(grpc, acceptor), Some(local)))
                    }
                }
            }
        },
    )
}

/// envoy's debug port ([`crate::envoy::debug`]) when `config` asks for it, served on the
/// hardened listener with the HTTP listener's limits. As envoyproxy/ratelimit does, a port that
/// cannot be bound is logged as an error and the service runs without it.
async fn bind_debug(config: &ServeConfig) -> Option<TcpListener> {
    let addr = config.listeners.debug_addr?;
    match TcpListener::bind(addr).await {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot open the debug listener (--debug-addr, or DEBUG_HOST and DEBUG_PORT); running without it");
            None
        }
    }
}

/// The listener of the envoy-named Prometheus page, when `settings` asks for one, and its path.
async fn bind_envoy_metrics(
    settings: &crate::envoy::stats::EnvoyStats,
) -> anyhow::Result<Option<(TcpListener, String)>> {
    let Some(prom) = &settings.prometheus else {
        return Ok(None);
    };
    let listener = TcpListener::bind(prom.addr)
        .await
        .with_context(|| format!("cannot listen for envoy metrics on {}", prom.addr))?;
    Ok(Some((listener, prom.path.clone())))
}

/// Start the envoy-named stats exports of `settings`: the statsd sender, and the Prometheus
/// page on `prometheus` (bound by [`bind_envoy_metrics`]) with the HTTP listener's `limits`.
fn spawn_envoy_stats(
    state: &AppState,
    settings: &crate::envoy::stats::EnvoyStats,
    prometheus: Option<(TcpListener, String)>,
    limits: ConnLimits,
    rx: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let Some(statsd) = settings.statsd.clone() {
        tracing::info!(host = %statsd.host, port = statsd.port, protocol = ?statsd.protocol,
            interval = ?statsd.flush_interval, "sending envoy-named stats to statsd");
        tasks.push(tokio::spawn(crate::envoy::stats::run_statsd(
            state.clone(),
            statsd,
            rx.clone(),
        )));
    }
    if let Some((listener, path)) = prometheus {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, %path, "serving envoy-named metrics");
        }
        tasks.push(tokio::spawn(crate::envoy::stats::run_prometheus(
            state.clone(),
            listener,
            path,
            limits,
            rx.clone(),
        )));
    }
    tasks
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

#[cfg(test)]
mod tests {
    use super::{example_check, fit_connections};
    use tollgate_core::rules::RuleSet;

    fn example(yaml: &str) -> Option<serde_json::Value> {
        let rules = RuleSet::from_sources(&[("r.yaml".into(), yaml.into())]).unwrap();
        example_check(&rules).map(|b| serde_json::from_str(&b).unwrap())
    }

    #[test]
    fn the_hint_names_a_rule_that_limits() {
        // Unlimited and shadow-mode rules are passed over; nested values are kept, separators
        // in them unescaped, a pattern's `*` matching nothing.
        let yaml = "domain: 'a|b'\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n  \
                    - key: watched\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  \
                    - key: 'p=ath'\n    value: 'x|y=z*'\n    descriptors:\n      - key: ip\n        \
                    rate_limit: {unit: minute, requests_per_unit: 5}\n";
        assert_eq!(
            example(yaml).unwrap(),
            serde_json::json!({"domain": "a|b", "descriptors": [{"entries": [
                {"key": "p=ath", "value": "x|y=z"}, {"key": "ip", "value": "alice"}]}]})
        );
        let shadow_only = "domain: s\ndescriptors:\n  - key: k\n    shadow_mode: true\n    \
                           rate_limit: {unit: second, requests_per_unit: 1}\n";
        assert_eq!(
            example(shadow_only).unwrap()["descriptors"][0]["entries"][0]["key"],
            "k"
        );
        let unlimited = "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n";
        assert_eq!(example(unlimited), None);
    }

    #[test]
    fn the_default_cap_fits_the_open_files_limit_silently() {
        // Two listeners at 10 000 each do not fit 20 000 descriptors: the default is lowered.
        let (cap, warning) = fit_connections(10_000, 2, 20_000, false);
        assert_eq!(warning, None);
        assert!(cap * 2 + 256 <= 20_000, "{cap}");
        // One listener fits: nothing changes.
        assert_eq!(fit_connections(10_000, 1, 20_000, false), (10_000, None));
    }

    #[test]
    fn a_chosen_cap_is_kept_and_warned_about_with_the_real_listener_count() {
        let (cap, warning) = fit_connections(10_000, 1, 5_000, true);
        assert_eq!(cap, 10_000);
        let w = warning.unwrap();
        assert!(w.contains("1 listener)"), "{w}");
        assert!(w.contains("5000"), "{w}");
        assert_eq!(fit_connections(100, 3, 20_000, true), (100, None));
    }
}
