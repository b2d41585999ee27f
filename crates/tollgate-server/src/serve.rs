//! `tollgate serve`: build the state (memory or Redis backend), bind the listeners, run the HTTP
//! API (and the gRPC service, wired in alongside), the rules watcher and the memory-store sweeper
//! until shutdown.
//!
//! A Redis store is connected lazily: the service starts even when Redis is down (degraded, the
//! failure policy decides) and returns to Redis by itself when it answers.
//!
//! Shutdown is graceful: listeners stop accepting, in-flight requests finish, background tasks
//! stop, then [`serve`] returns `Ok(())`.

use crate::backend::{redis_unsupported, Guarded, RedisSettings};
use crate::reload::{self, WatchOptions};
use crate::state::{AppState, RequestLimits};
use anyhow::{bail, Context};
use axum::ServiceExt as _;
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
    /// `--trusted-proxies`: peers whose `X-Forwarded-For` / `X-Real-IP` are believed.
    pub trusted_proxies: Vec<tollgate_core::request::Cidr>,
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
            trusted_proxies: Vec::new(),
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
    let rules = reload::load(&config.rules, 1)
        .map_err(|e| anyhow::anyhow!("invalid rules in {}:\n{e}", config.rules.display()))?;
    let builder = AppState::builder(rules)
        .limits(config.limits)
        .rules_path(config.rules.clone())
        .response_headers(config.response_headers)
        .trusted_proxies(config.trusted_proxies.clone());
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

/// Where the server listens (after binding: port 0 is resolved).
#[derive(Debug, Clone)]
pub struct Bound {
    /// HTTP.
    pub http: SocketAddr,
    /// gRPC, once the gRPC service is wired in.
    pub grpc: Option<SocketAddr>,
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
    let state = build_state(&config).await?;
    let http = TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", config.http_addr))?;
    let http_addr = http.local_addr()?;
    let (tx, rx) = shutdown_channel();

    let grpc = TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", config.grpc_addr))?;
    let grpc_addr = Some(grpc.local_addr()?);
    let grpc = tokio::spawn(crate::grpc::serve(
        state.clone(),
        grpc,
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
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(true);
    });

    on_bound(Bound {
        http: http_addr,
        grpc: grpc_addr,
        store: state.store_label(),
    });

    // The API service itself, not `http::router`'s `Router` around it (which would route every
    // request twice), unless the trace layer is wanted: that one comes with the `Router`.
    let served = if crate::http::trace_wanted() {
        axum::serve(
            http,
            crate::http::router(state.clone()).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(wait_for_shutdown(rx.clone()))
        .await
    } else {
        axum::serve(
            http,
            // The peer address reaches handlers as `ConnectInfo` (forward-auth's client address).
            crate::http::service(state.clone()).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(wait_for_shutdown(rx.clone()))
        .await
    };
    served.context("HTTP server failed")?;
    grpc.await
        .context("gRPC server task failed")?
        .context("gRPC server failed")?;
    let _ = watcher.await;
    let _ = sweeper.await;
    tracing::info!("stopped");
    Ok(())
}

/// The start-up line: where to send a request.
pub fn listening_message(bound: &Bound) -> String {
    let port = bound.http.port();
    let grpc = bound
        .grpc
        .map(|g| format!(", gRPC {g}"))
        .unwrap_or_default();
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
