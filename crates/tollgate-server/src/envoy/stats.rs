//! envoyproxy/ratelimit's statistics, rendered from tollgate's own counters: a statsd stream
//! (what its `gostats` store sends) and a Prometheus page with the names its statsd-exporter
//! mapping produces.
//!
//! Nothing is counted twice: the per-rule counters of `crate::metrics` are read at flush or
//! scrape time and renamed (`ratelimit.service.rate_limit.<stats key>.total_hits`, ...), so the
//! request path pays nothing for these exports. As gostats does, a flush sends each counter's
//! increase since the previous flush (`name:delta|c`), and only counters that moved.
//!
//! `stats_from_env` reads envoyproxy/ratelimit's environment (`USE_STATSD`, `STATSD_HOST`,
//! `STATSD_PORT`, `STATSD_PROTOCOL`, `STATS_FLUSH_INTERVAL`, `EXTRA_TAGS`, `DISABLE_STATS`,
//! `USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`) from a map, so a profile can translate
//! it into [`EnvoyStats`] without touching the process environment.

use crate::exposition::{Exposition, Kind};
use crate::metrics::{Metrics, RuleCounters};
use crate::state::AppState;
use std::collections::HashMap;
use std::fmt::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// Transport of the statsd stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatsdProtocol {
    /// One or more lines per datagram, datagrams of at most 1432 bytes (as gostats).
    #[default]
    Udp,
    /// Newline-separated lines on one connection, reopened after an error (gostats' default).
    Tcp,
}

impl std::str::FromStr for StatsdProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "udp" | "udp4" | "udp6" => Ok(Self::Udp),
            "tcp" | "tcp4" | "tcp6" => Ok(Self::Tcp),
            _ => Err(format!(
                "'{s}' is not a statsd protocol: expected udp or tcp"
            )),
        }
    }
}

/// Where and how to send the statsd stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdSettings {
    /// statsd host (name or address), resolved at each flush.
    pub host: String,
    /// statsd port.
    pub port: u16,
    /// UDP or TCP.
    pub protocol: StatsdProtocol,
    /// How often counters are flushed.
    pub flush_interval: Duration,
    /// Tags appended to every stat name as gostats appends them (`.__key=value`, sorted by key).
    pub tags: Vec<(String, String)>,
}

/// Where to serve envoy-named Prometheus metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// Listen address.
    pub addr: SocketAddr,
    /// Path of the page (other paths answer 404).
    pub path: String,
}

/// The envoy-named exports to run (both off by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyStats {
    /// A statsd stream.
    pub statsd: Option<StatsdSettings>,
    /// A Prometheus page.
    pub prometheus: Option<PrometheusSettings>,
}

/// An environment variable with a value envoyproxy/ratelimit would not accept either.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}='{value}': {reason}")]
pub struct EnvError {
    /// The variable.
    pub(crate) var: String,
    /// Its value.
    pub(crate) value: String,
    /// What is wrong.
    pub(crate) reason: String,
}

impl EnvError {
    /// `var` (whose value is `value`) is invalid because of `reason`.
    pub(crate) fn new(var: &str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            var: var.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// `var` from `env`, `None` when unset or empty (envconfig treats empty as unset).
pub(crate) fn env_get<'e>(env: &'e HashMap<String, String>, var: &str) -> Option<&'e str> {
    env.get(var).map(String::as_str).filter(|v| !v.is_empty())
}

/// A boolean as Go's `strconv.ParseBool` reads it (`1`, `t`, `true`, `TRUE`, ...; `0`, `f`, ...).
pub(crate) fn env_bool(
    env: &HashMap<String, String>,
    var: &str,
    default: bool,
) -> Result<bool, EnvError> {
    match env_get(env, var) {
        None => Ok(default),
        Some(v) => match v {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            _ => Err(EnvError::new(var, v, "expected true or false")),
        },
    }
}

/// A duration in Go's `time.ParseDuration` syntax (`10s`, `1m30s`, `250ms`, `1.5h`; units ns,
/// us, µs, ms, s, m, h). Negative durations are rejected.
pub(crate) fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("'{text}' is not a duration (e.g. 10s, 500ms, 1m30s)");
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// `EXTRA_TAGS` (`k1:v1,k2:v2`, as envconfig reads a map): the pairs, sorted by key, values
/// cleaned as gostats cleans them (`.`, `:` and `|` become `_`), empty keys or values dropped.
pub fn parse_extra_tags(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut tags = Vec::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once(':')
            .ok_or_else(|| format!("'{pair}' is not key:value"))?;
        if k.is_empty() || v.is_empty() {
            continue;
        }
        tags.push((k.to_string(), v.replace(['.', ':', '|'], "_")));
    }
    tags.sort();
    tags.dedup_by(|a, b| a.0 == b.0);
    Ok(tags)
}

/// A listen address as Go writes it: `host:port` or `:port` (every interface).
pub(crate) fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_string()
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("'{text}' is not a listen address (host:port or :port)"))
}

/// envoyproxy/ratelimit's stats settings in `env`, with its defaults: statsd on (TCP to
/// `localhost:8125`, flushed every 10 s) unless `USE_STATSD=false` or `DISABLE_STATS=true`;
/// Prometheus only with `USE_PROMETHEUS=true` (on `:9090/metrics`). Like envoyproxy/ratelimit,
/// asking for both statsd and Prometheus is an error (set `USE_STATSD=false`).
pub(crate) fn stats_from_env(env: &HashMap<String, String>) -> Result<EnvoyStats, EnvError> {
    if env_bool(env, "DISABLE_STATS", false)? {
        return Ok(EnvoyStats::default());
    }
    let use_statsd = env_bool(env, "USE_STATSD", true)?;
    let use_prometheus = env_bool(env, "USE_PROMETHEUS", false)?;
    if use_statsd && use_prometheus {
        return Err(EnvError::new(
            "USE_PROMETHEUS",
            "true",
            "only one stats sink at a time: set USE_STATSD=false to use Prometheus",
        ));
    }
    let tags_text = env_get(env, "EXTRA_TAGS").unwrap_or("");
    let tags =
        parse_extra_tags(tags_text).map_err(|r| EnvError::new("EXTRA_TAGS", tags_text, r))?;
    let mut out = EnvoyStats::default();
    if use_statsd {
        let port_text = env_get(env, "STATSD_PORT").unwrap_or("8125");
        let port = port_text
            .parse()
            .map_err(|_| EnvError::new("STATSD_PORT", port_text, "expected a port number"))?;
        let protocol_text = env_get(env, "STATSD_PROTOCOL").unwrap_or("tcp");
        let protocol = protocol_text
            .parse()
            .map_err(|r| EnvError::new("STATSD_PROTOCOL", protocol_text, r))?;
        let interval_text = env_get(env, "STATS_FLUSH_INTERVAL").unwrap_or("10s");
        let flush_interval = parse_go_duration(interval_text)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                EnvError::new(
                    "STATS_FLUSH_INTERVAL",
                    interval_text,
                    "expected a positive duration",
                )
            })?;
        out.statsd = Some(StatsdSettings {
            host: env_get(env, "STATSD_HOST")
                .unwrap_or("localhost")
                .to_string(),
            port,
            protocol,
            flush_interval,
            tags,
        });
    }
    if use_prometheus {
        let addr_text = env_get(env, "PROMETHEUS_ADDR").unwrap_or(":9090");
        let addr = parse_listen_addr(addr_text)
            .map_err(|r| EnvError::new("PROMETHEUS_ADDR", addr_text, r))?;
        let path = env_get(env, "PROMETHEUS_PATH").unwrap_or("/metrics");
        if !path.starts_with('/') {
            return Err(EnvError::new(
                "PROMETHEUS_PATH",
                path,
                "expected a path starting with /",
            ));
        }
        out.prometheus = Some(PrometheusSettings {
            addr,
            path: path.to_string(),
        });
    }
    Ok(out)
}

/// `NEAR_LIMIT_RATIO` (default 0.8), for `ServeConfig::near_limit_ratio`: in (0, 1].
pub(crate) fn near_limit_ratio_from_env(env: &HashMap<String, String>) -> Result<f32, EnvError> {
    match env_get(env, "NEAR_LIMIT_RATIO") {
        None => Ok(0.8),
        Some(v) => v
            .parse::<f32>()
            .ok()
            .filter(|r| *r > 0.0 && *r <= 1.0)
            .ok_or_else(|| EnvError::new("NEAR_LIMIT_RATIO", v, "expected a number in (0, 1]")),
    }
}

/// A stats key as envoyproxy/ratelimit puts it in a stat name: `:` and `|` become `_`, and so do
/// the dots inside anything shaped like an IPv4 address (`10.0.0.1` -> `10_0_0_1`).
pub(crate) fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key.replace([':', '|'], "_").into_bytes();
    let mut i = 0;
    while i < out.len() {
        if let Some(end) = ipv4_at(&out, i) {
            for b in &mut out[i..end] {
                if *b == b'.' {
                    *b = b'_';
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// End of a `\d{1,3}(\.\d{1,3}){3}` match starting at `i` (leftmost, greedy digits, as Go's
/// regexp finds it), if any.
fn ipv4_at(s: &[u8], i: usize) -> Option<usize> {
    let mut p = i;
    for part in 0..4 {
        if part > 0 {
            if s.get(p) != Some(&b'.') {
                return None;
            }
            p += 1;
        }
        let start = p;
        while p < s.len() && p - start < 3 && s[p].is_ascii_digit() {
            p += 1;
        }
        if p == start {
            return None;
        }
    }
    Some(p)
}

/// Reads one counter.
type Read = fn(&RuleCounters) -> u64;

/// The per-rule stats, envoy's suffix and tollgate's counter.
const RULE_STATS: [(&str, Read); 6] = [
    ("total_hits", |c| c.total_hits.load(Relaxed)),
    ("over_limit", |c| c.over_limit.load(Relaxed)),
    ("near_limit", |c| c.near_limit.load(Relaxed)),
    ("within_limit", |c| c.within_limit.load(Relaxed)),
    ("shadow_mode", |c| c.shadow_mode.load(Relaxed)),
    ("over_limit_with_local_cache", |c| {
        c.over_limit_with_local_cache.load(Relaxed)
    }),
];

/// The stats of [`RULE_STATS`] envoyproxy/ratelimit's default Prometheus mapping names (it has
/// no rule for `over_limit_with_local_cache`).
const PROM_STATS: usize = 5;

/// Every envoy-named counter tollgate can produce, with its current (cumulative) value: per rule
/// `ratelimit.service.rate_limit.<key>.<stat>`, and `ratelimit.service.config_load_success`,
/// `.config_load_error`, `ratelimit.service.call.should_rate_limit.redis_error`,
/// `ratelimit_server.ShouldRateLimit.total_requests`. Names carry no tags.
pub fn envoy_counters(m: &Metrics) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    m.for_each_rule(|_, rule, c| {
        let key = sanitize(rule);
        for (stat, value) in RULE_STATS {
            out.push((
                format!("ratelimit.service.rate_limit.{key}.{stat}"),
                value(c),
            ));
        }
    });
    let t = m.service_totals();
    out.push((
        "ratelimit.service.config_load_success".into(),
        t.rule_sets_loaded,
    ));
    out.push((
        "ratelimit.service.config_load_error".into(),
        t.reloads_failed,
    ));
    out.push((
        "ratelimit.service.call.should_rate_limit.redis_error".into(),
        t.store_errors,
    ));
    out.push((
        "ratelimit_server.ShouldRateLimit.total_requests".into(),
        t.requests,
    ));
    out
}

/// Turns cumulative counters into statsd lines of increases, as a gostats store flushes.
#[derive(Debug, Default)]
pub(crate) struct StatsdRenderer {
    last: HashMap<String, u64>,
    suffix: String,
}

impl StatsdRenderer {
    /// A renderer appending `tags` to every name (`name.__k1=v1.__k2=v2`).
    pub(crate) fn new(tags: &[(String, String)]) -> Self {
        let mut suffix = String::new();
        for (k, v) in tags {
            let _ = write!(suffix, ".__{k}={v}");
        }
        Self {
            last: HashMap::new(),
            suffix,
        }
    }

    /// The lines (`name:delta|c`, no newline) of every counter of `m` that moved since the
    /// previous call.
    pub(crate) fn lines(&mut self, m: &Metrics) -> Vec<String> {
        let mut out = Vec::new();
        for (name, value) in envoy_counters(m) {
            let last = self.last.entry(name.clone()).or_insert(0);
            let delta = value.saturating_sub(*last);
            *last = value;
            if delta > 0 {
                out.push(format!("{name}{}:{delta}|c", self.suffix));
            }
        }
        out
    }
}

/// Largest UDP payload gostats sends (keeps datagrams unfragmented).
const UDP_PAYLOAD: usize = 1432;

/// Lines packed newline-separated into payloads of at most [`UDP_PAYLOAD`] bytes (a longer line
/// goes alone).
fn pack(lines: &[String]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::new();
    for l in lines {
        if !cur.is_empty() && cur.len() + l.len() + 1 > UDP_PAYLOAD {
            out.push(std::mem::take(&mut cur));
        }
        cur.extend_from_slice(l.as_bytes());
        cur.push(b'\n');
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Send envoy-named counters of `state` to statsd every `settings.flush_interval`, and once more
/// at shutdown. Send failures are logged at debug level (statsd is best effort, as in gostats):
/// the increases of a failed flush are lost, never resent twice.
pub(crate) async fn run_statsd(
    state: AppState,
    settings: StatsdSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut renderer = StatsdRenderer::new(&settings.tags);
    let mut tcp: Option<tokio::net::TcpStream> = None;
    let mut tick = tokio::time::interval(settings.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let last = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => true,
            _ = tick.tick() => false,
        };
        let lines = renderer.lines(state.metrics());
        if !lines.is_empty() {
            if let Err(e) = send(&settings, &lines, &mut tcp).await {
                tcp = None;
                tracing::debug!(error = %e, host = %settings.host, port = settings.port, "statsd flush failed");
            }
        }
        if last {
            return;
        }
    }
}

async fn send(
    settings: &StatsdSettings,
    lines: &[String],
    tcp: &mut Option<tokio::net::TcpStream>,
) -> std::io::Result<()> {
    let target = tokio::net::lookup_host((settings.host.as_str(), settings.port))
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other("statsd host has no address"))?;
    match settings.protocol {
        StatsdProtocol::Udp => {
            let local: SocketAddr = if target.is_ipv4() {
                ([0, 0, 0, 0], 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = tokio::net::UdpSocket::bind(local).await?;
            for payload in pack(lines) {
                socket.send_to(&payload, target).await?;
            }
        }
        StatsdProtocol::Tcp => {
            if tcp.is_none() {
                *tcp = Some(
                    tokio::time::timeout(
                        Duration::from_secs(5),
                        tokio::net::TcpStream::connect(target),
                    )
                    .await
                    .map_err(|_| std::io::Error::other("statsd connect timed out"))??,
                );
            }
            if let Some(stream) = tcp {
                let mut buf = lines.join("\n");
                buf.push('\n');
                stream.write_all(buf.as_bytes()).await?;
            }
        }
    }
    Ok(())
}

/// The label sets envoyproxy/ratelimit's default statsd-exporter mapping gives a per-rule stat:
/// `domain` and `key1` for a two-part key (`domain.key1`), plus `key2` for a longer one (parts
/// past the third are dropped by that mapping, so distinct keys may share a series; their values
/// are summed here).
fn prom_labels(key: &str) -> Option<Vec<String>> {
    let parts: Vec<&str> = key.split('.').collect();
    match parts.as_slice() {
        [_, _] => Some(parts.iter().map(|p| (*p).to_owned()).collect()),
        [domain, key1, key2, ..] => Some(vec![
            (*domain).to_owned(),
            (*key1).to_owned(),
            (*key2).to_owned(),
        ]),
        _ => None,
    }
}

/// envoyproxy/ratelimit's metrics as its Prometheus sink exposes them (its default mapping):
/// `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}`
/// with `domain`, `key1` (and `key2`) labels, `ratelimit_service_should_rate_limit_error`
/// `{err_type="redis_error"}`, `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`,
/// `ratelimit_service_config_load_success` and `_error`.
pub fn render_prometheus(m: &Metrics) -> String {
    const HELP: &str = "Metric autogenerated by statsd_exporter.";
    const LABELS: [&str; 3] = ["domain", "key1", "key2"];
    let mut series: std::collections::BTreeMap<(&str, Vec<String>), u64> = Default::default();
    m.for_each_rule(|_, rule, c| {
        if let Some(labels) = prom_labels(&sanitize(rule)) {
            for (stat, value) in &RULE_STATS[..PROM_STATS] {
                *series.entry((stat, labels.clone())).or_default() += value(c);
            }
        }
    });
    let mut out = Exposition::with_capacity(1024);
    for (stat, _) in &RULE_STATS[..PROM_STATS] {
        let name = format!("ratelimit_service_rate_limit_{stat}");
        let mut f = out.family(&name, Kind::Counter, HELP);
        for ((s, values), v) in &series {
            if s == stat {
                let labels: Vec<(&str, &str)> = LABELS
                    .iter()
                    .copied()
                    .zip(values.iter().map(String::as_str))
                    .collect();
                f.sample(&labels, v);
            }
        }
    }
    let t = m.service_totals();
    for (name, labels, v) in [
        (
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")][..],
            t.store_errors,
        ),
        (
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")],
            t.requests,
        ),
        (
            "ratelimit_service_config_load_success",
            &[],
            t.rule_sets_loaded,
        ),
        ("ratelimit_service_config_load_error", &[], t.reloads_failed),
    ] {
        out.family(name, Kind::Counter, HELP).sample(labels, v);
    }
    out.into_string()
}

/// Serve [`render_prometheus`] of `state` on `listener` at `path` until shutdown, on the HTTP
/// listener the API has ([`crate::listener::serve`]: the connection cap, the header, body and
/// idle timeouts of `limits`, the drain at shutdown), with the API's body limit
/// (`--max-body-bytes`): a request announcing a larger body is answered 413 (no handler reads a
/// body here; one sent without a length is not read, and the connection is closed after the
/// answer).
pub(crate) async fn run_prometheus(
    state: AppState,
    listener: tokio::net::TcpListener,
    path: String,
    limits: crate::listener::ConnLimits,
    shutdown: watch::Receiver<bool>,
) {
    let max_body = state.limits().max_body_bytes;
    let page = state.clone();
    let app = axum::Router::new()
        .route(
            &path,
            axum::routing::get(move || {
                let state = page.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        render_prometheus(state.metrics()),
                    )
                }
            }),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                let announced = req
                    .headers()
                    .get(axum::http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                if announced.is_some_and(|n| n > max_body as u64) {
                    use axum::response::IntoResponse as _;
                    return crate::error::ApiError::PayloadTooLarge { limit: max_body }
                        .into_response();
                }
                next.run(req).await
            },
        ));
    // Counted apart from the API's listener (its numbers are not on any page, as the debug
    // port's).
    let metrics = std::sync::Arc::new(crate::metrics::ConnectionMetrics::default());
    crate::listener::serve(
        "envoy metrics",
        listener,
        crate::listener::with_connect_info(app),
        limits,
        metrics,
        shutdown,
    )
    .await;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An environment map from literal pairs (shared with the other Envoy env tests).
    pub(crate) fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn settings_from_env_follow_envoy_defaults() {
        let s = stats_from_env(&env(&[])).unwrap();
        let statsd = s.statsd.unwrap();
        assert_eq!(
            (statsd.host.as_str(), statsd.port, statsd.protocol),
            ("localhost", 8125, StatsdProtocol::Tcp)
        );
        assert_eq!(statsd.flush_interval, Duration::from_secs(10));
        assert!(s.prometheus.is_none());

        let s = stats_from_env(&env(&[
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", "9125"),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "250ms"),
            ("EXTRA_TAGS", "version:1.2,az:a|b"),
        ]))
        .unwrap();
        let statsd = s.statsd.unwrap();
        assert_eq!(statsd.protocol, StatsdProtocol::Udp);
        assert_eq!(statsd.flush_interval, Duration::from_millis(250));
        assert_eq!(
            statsd.tags,
            vec![
                ("az".into(), "a_b".into()),
                ("version".into(), "1_2".into())
            ]
        );

        let s =
            stats_from_env(&env(&[("USE_STATSD", "false"), ("USE_PROMETHEUS", "true")])).unwrap();
        assert!(s.statsd.is_none());
        let p = s.prometheus.unwrap();
        assert_eq!(p.addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(p.path, "/metrics");

        assert_eq!(
            stats_from_env(&env(&[
                ("DISABLE_STATS", "true"),
                ("USE_PROMETHEUS", "true")
            ]))
            .unwrap(),
            EnvoyStats::default()
        );
        for bad in [
            vec![("USE_PROMETHEUS", "true")],
            vec![("USE_STATSD", "yes")],
            vec![("STATSD_PORT", "x")],
            vec![("STATS_FLUSH_INTERVAL", "0")],
            vec![("EXTRA_TAGS", "novalue")],
            vec![
                ("USE_STATSD", "0"),
                ("USE_PROMETHEUS", "1"),
                ("PROMETHEUS_PATH", "m"),
            ],
        ] {
            let e = stats_from_env(&env(&bad)).unwrap_err();
            assert!(bad.iter().any(|(k, _)| *k == e.var), "{bad:?}: {e}");
        }
    }

    #[test]
    fn near_limit_ratio() {
        assert_eq!(near_limit_ratio_from_env(&env(&[])).unwrap(), 0.8);
        let r = near_limit_ratio_from_env(&env(&[("NEAR_LIMIT_RATIO", "0.9")]));
        assert_eq!(r.unwrap(), 0.9);
        for bad in ["0", "1.5", "x"] {
            assert!(near_limit_ratio_from_env(&env(&[("NEAR_LIMIT_RATIO", bad)])).is_err());
        }
    }

    #[test]
    fn go_durations() {
        for (text, ms) in [
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("250ms", 250),
            ("1.5h", 5_400_000),
            ("0", 0),
        ] {
            assert_eq!(
                parse_go_duration(text).unwrap(),
                Duration::from_millis(ms),
                "{text}"
            );
        }
        for bad in ["", "10", "-1s", "1x", "s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stat_names_are_sanitized_as_envoy_does() {
        assert_eq!(sanitize("api.user"), "api.user");
        assert_eq!(
            sanitize("d.remote_address_10.0.0.1"),
            "d.remote_address_10_0_0_1"
        );
        assert_eq!(sanitize("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(sanitize("d.v1.2.3"), "d.v1.2.3");
    }

    #[test]
    fn statsd_lines_are_increases_with_tags() {
        let m = Metrics::new();
        let c = m.rule("d", "d.k", "d.k");
        c.total_hits.fetch_add(3, Relaxed);
        c.over_limit.fetch_add(1, Relaxed);
        let mut r = StatsdRenderer::new(&[("v".into(), "1".into())]);
        let lines = r.lines(&m);
        assert!(lines.contains(&"ratelimit.service.rate_limit.d.k.total_hits.__v=1:3|c".into()));
        assert!(lines.contains(&"ratelimit.service.rate_limit.d.k.over_limit.__v=1:1|c".into()));
        assert!(!lines.iter().any(|l| l.contains("within_limit")));
        c.total_hits.fetch_add(2, Relaxed);
        let lines = r.lines(&m);
        assert!(lines.contains(&"ratelimit.service.rate_limit.d.k.total_hits.__v=1:2|c".into()));
        assert!(!lines.iter().any(|l| l.contains("over_limit")));
        let packed = pack(&vec!["x".repeat(1000); 3]);
        assert_eq!(packed.len(), 3);
    }

    #[test]
    fn prometheus_names_follow_the_default_mapping() {
        let m = Metrics::new();
        m.rule("d", "d.k", "d.k").total_hits.fetch_add(2, Relaxed);
        m.rule("d", "d.k_v.sub", "d.k_v.sub")
            .over_limit
            .fetch_add(1, Relaxed);
        let text = render_prometheus(&m);
        assert!(text.contains("ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"k\"} 2"));
        assert!(text.contains(
            "ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"k_v\",key2=\"sub\"} 1"
        ));
        assert!(text.contains("ratelimit_service_config_load_success 0"));
    }
}
