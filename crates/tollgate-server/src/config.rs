//! The settings of a running service ([`ServeConfig`]), grouped by what they configure: the
//! listeners, their connections, where the rules come from, the store. Each field is a
//! `tollgate serve` flag and `TOLLGATE_*` variable. The Envoy compatibility profile translates
//! envoyproxy/ratelimit's variables into the same struct; what only it has stays in its own
//! module.

use crate::backend::RedisSettings;
use crate::listener::ConnLimits;
use crate::state::RequestLimits;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tollgate_core::Algorithm;
use tollgate_redis::KeyLayout;

/// Everything `serve` needs. Start from [`ServeConfig::default`] and change what differs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    /// Where the service listens.
    pub listeners: Listeners,
    /// The limits of every listener's connections.
    pub connections: Connections,
    /// `--grpc-*`: HTTP/2 and connection limits of the gRPC listener.
    pub grpc_limits: crate::grpc::GrpcLimits,
    /// Where the rules come from and how they are read.
    pub rules: RulesConfig,
    /// Where counters live.
    pub store: StoreConfig,
    /// Request limits (`--max-body-bytes`, ...).
    pub limits: RequestLimits,
    /// `--response-headers` (gRPC `response_headers_to_add`).
    pub response_headers: bool,
    /// `--trusted-proxies`: peers whose `X-Forwarded-For` / `X-Real-IP` are believed.
    pub trusted_proxies: Vec<tollgate_core::request::Cidr>,
    /// `--near-limit-ratio`: admitted hits past `floor(limit * ratio)` count as near the limit.
    pub near_limit_ratio: f32,
    /// `--admin-token-file`, `--registry-*`: the rule registry ([`crate::registry`]); off by
    /// default.
    pub registry: crate::registry::RegistryConfig,
    /// `--decision-log`, `--decision-log-max-per-second` ([`crate::decision_log`]).
    pub decision_log: crate::decision_log::DecisionLogConfig,
    /// `--live-stats`: record the per-rule live statistics of `/v1/stats` and `/dashboard`
    /// (`crate::stats`); on by default.
    pub live_stats: bool,
    /// `--queue-max-waiting`: most requests waiting at once in the queues of rules with a
    /// `queue` option.
    pub queue_max_waiting: usize,
    /// `--otlp-endpoint` and the rest: the traces of decisions ([`crate::otel`]); `None`
    /// (the default) makes none.
    pub tracing: Option<std::sync::Arc<crate::otel::Tracing>>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listeners: Listeners::default(),
            connections: Connections::default(),
            grpc_limits: crate::grpc::GrpcLimits::default(),
            rules: RulesConfig::default(),
            store: StoreConfig::default(),
            limits: RequestLimits::default(),
            response_headers: false,
            trusted_proxies: Vec::new(),
            near_limit_ratio: 0.8,
            registry: crate::registry::RegistryConfig::default(),
            decision_log: crate::decision_log::DecisionLogConfig::default(),
            live_stats: true,
            queue_max_waiting: tollgate_core::queue::DEFAULT_MAX_WAITING,
            tracing: None,
        }
    }
}

/// Where the service listens. At least one of HTTP and gRPC is on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Listeners {
    /// HTTP listen address (`--http-addr`, default `0.0.0.0:8080`); `None`: no HTTP listener.
    pub http_addr: Option<SocketAddr>,
    /// gRPC listen address (`--grpc-addr`, default `0.0.0.0:8081`); `None`: no gRPC listener.
    pub grpc_addr: Option<SocketAddr>,
    /// gRPC on this unix socket instead of `grpc_addr` (`--grpc-unix-socket`; envoy's `GRPC_UDS`).
    pub grpc_uds: Option<PathBuf>,
    /// TLS on the gRPC listener (`--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-tls-client-ca`);
    /// `None`: plaintext.
    pub grpc_tls: Option<crate::grpc::GrpcTls>,
    /// The debug port (`--debug-addr`: envoy's `/rlconfig` and `/stats`); `None`: none. As in
    /// envoyproxy/ratelimit, failing to bind it is logged, not fatal.
    pub debug_addr: Option<SocketAddr>,
}

impl Default for Listeners {
    fn default() -> Self {
        Self {
            http_addr: Some(SocketAddr::from(([0, 0, 0, 0], 8080))),
            grpc_addr: Some(SocketAddr::from(([0, 0, 0, 0], 8081))),
            grpc_uds: None,
            grpc_tls: None,
            debug_addr: None,
        }
    }
}

/// The limits of every listener's connections.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Connections {
    /// `--header-read-timeout`: an HTTP client must send a complete request head within it.
    pub header_read_timeout: Duration,
    /// `--body-read-timeout`: an HTTP request body must arrive within it (else 408).
    pub body_read_timeout: Duration,
    /// `--idle-timeout`: a connection with no request in flight is closed after it.
    pub idle_timeout: Duration,
    /// `--max-connections`: most connections open at once, per listener.
    pub max_connections: usize,
    /// Whether `max_connections` was chosen (`--max-connections`): a chosen cap the open-files
    /// limit cannot hold is warned about; the default one is lowered to fit instead.
    pub max_connections_chosen: bool,
    /// `--shutdown-timeout`: how long shutdown waits for open connections before dropping them.
    pub shutdown_timeout: Duration,
}

impl Default for Connections {
    /// The listener's own defaults (`ConnLimits::default`), with the cap not chosen.
    fn default() -> Self {
        let ConnLimits {
            header_read_timeout,
            body_read_timeout,
            idle_timeout,
            max_connections,
            shutdown_timeout,
        } = ConnLimits::default();
        Self {
            header_read_timeout,
            body_read_timeout,
            idle_timeout,
            max_connections,
            max_connections_chosen: false,
            shutdown_timeout,
        }
    }
}

/// Where the rules come from and how they are read.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RulesConfig {
    /// Rules file or directory (`--rules`).
    pub path: PathBuf,
    /// How `path` was made when no `--rules` gave it (the envoy profile's `RUNTIME_*`
    /// variables), said when the path is missing; `None`: from `--rules`/`TOLLGATE_RULES`.
    pub origin: Option<String>,
    /// Which files of a rules directory are read (tollgate's `*.yaml`, or envoy's runtime
    /// folder under `--profile envoy`).
    pub listing: tollgate_core::rules::LoadOptions,
    /// How often the files are looked at for changes.
    pub reload_interval: Duration,
    /// `--default-algorithm`: the algorithm of rules that name none (and of per-request limit
    /// overrides); `None`: sliding_window_counter. Applied at start and on every reload.
    pub default_algorithm: Option<Algorithm>,
    /// `--count-denied-hits`: envoy_fixed_window limits count the hits of requests that another
    /// limit denies (envoyproxy/ratelimit's default counting).
    pub count_denied_hits: bool,
    /// `--sync-default`: how a shared store keeps the counters of rules that name no `sync`.
    pub sync_default: tollgate_core::SyncMode,
    /// `--rules-from xds://..`: rules come from an xDS management server instead of `path`.
    pub xds: Option<crate::xds::XdsConfig>,
}

impl Default for RulesConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("examples/rules"),
            origin: None,
            listing: tollgate_core::rules::LoadOptions::default(),
            reload_interval: Duration::from_millis(500),
            default_algorithm: None,
            count_denied_hits: false,
            sync_default: tollgate_core::SyncMode::Exact,
            xds: None,
        }
    }
}

/// Where counters live: the memory store, or Redis with its settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// `--store`: `memory`, `redis://..`, `rediss://..`, `redis+cluster://h1:p1,h2:p2` or
    /// `redis+sentinel://s1:p1,s2:p2/master`.
    pub url: String,
    /// `--redis-timeout-ms`: bound on each Redis call.
    pub timeout: Duration,
    /// `--redis-prefix`: first part of every Redis key.
    pub prefix: String,
    /// `--on-store-error`, `--expected-instances`, `--local-deny-cache`.
    pub redis: RedisSettings,
    /// `--redis-per-second-url`: a second Redis (any form `--store` takes) for the counters of
    /// limits whose unit is second, with its own breaker (envoy's `REDIS_PERSECOND_URL`).
    /// `None`: every counter on `--store`.
    pub per_second_url: Option<String>,
    /// `--redis-per-second-timeout-ms`: bound on each call to the per-second Redis; `None`:
    /// `--redis-timeout-ms`.
    pub per_second_timeout: Option<Duration>,
    /// `--max-keys` of the memory store (and of Redis' `local` fallback).
    pub max_keys: usize,
    /// `--redis-key-layout`: where envoy_fixed_window counters live on Redis (`envoy`: shared
    /// with envoyproxy/ratelimit; `--redis-prefix` is then its `CACHE_KEY_PREFIX`, used as is).
    pub key_layout: KeyLayout,
    /// `--redis-expiration-jitter`: envoy key layout, up to this much extra on each `EXPIRE`.
    pub expiration_jitter: Duration,
    /// How often expired memory-store counters are dropped.
    pub sweep_interval: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "memory".into(),
            timeout: Duration::from_millis(50),
            prefix: "tollgate".into(),
            redis: RedisSettings::default(),
            per_second_url: None,
            per_second_timeout: None,
            max_keys: tollgate_core::memory::DEFAULT_MAX_KEYS,
            key_layout: KeyLayout::Tollgate,
            expiration_jitter: Duration::ZERO,
            sweep_interval: Duration::from_secs(10),
        }
    }
}
