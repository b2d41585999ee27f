//! `tollgate serve` flags of the envoyproxy/ratelimit-named stats exports (a statsd stream and a
//! Prometheus page with its metric names), kept apart from `cli.rs` so the surface stays small
//! there. See `tollgate_server::envoy::stats`.

use crate::durations::PositiveDuration;
use std::net::SocketAddr;
use tollgate_server::envoy::stats::{
    parse_extra_tags, EnvoyStats, PrometheusSettings, StatsdProtocol, StatsdSettings,
};

/// Parsed `--statsd-tags` (a newtype: clap would read a bare `Vec` as a repeated flag).
#[derive(Debug, Clone)]
struct Tags(Vec<(String, String)>);

impl std::str::FromStr for Tags {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        parse_extra_tags(text).map(Tags)
    }
}

/// Envoy-named stats flags.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Send envoyproxy/ratelimit-named counters (`ratelimit.service.rate_limit.<key>.total_hits`,
    /// ...) to this statsd `host:port`.
    #[arg(long, env = "TOLLGATE_STATSD_ADDR")]
    statsd_addr: Option<String>,
    /// statsd transport: `udp` or `tcp`.
    #[arg(long, env = "TOLLGATE_STATSD_PROTOCOL", default_value = "udp")]
    statsd_protocol: StatsdProtocol,
    /// How often counters are sent to statsd (their increase since the previous flush).
    #[arg(long, env = "TOLLGATE_STATSD_FLUSH_INTERVAL", default_value = "10s")]
    statsd_flush_interval: PositiveDuration,
    /// Tags appended to every statsd name as envoyproxy/ratelimit's `EXTRA_TAGS` (`k1:v1,k2:v2`).
    #[arg(long, env = "TOLLGATE_STATSD_TAGS", default_value = "")]
    statsd_tags: Tags,
    /// Serve envoyproxy/ratelimit's Prometheus metric names (`ratelimit_service_rate_limit_*`)
    /// on this address (a listener of its own, besides tollgate's `/metrics`).
    #[arg(long, env = "TOLLGATE_ENVOY_METRICS_ADDR")]
    envoy_metrics_addr: Option<SocketAddr>,
    /// Path of the envoy-named metrics page.
    #[arg(long, env = "TOLLGATE_ENVOY_METRICS_PATH", default_value = "/metrics")]
    envoy_metrics_path: String,
    /// Admitted hits past `floor(limit * ratio)` count as `near_limit` (envoyproxy/ratelimit's
    /// `NEAR_LIMIT_RATIO`), in (0, 1].
    #[arg(long, env = "TOLLGATE_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f32,
}

impl StatsArgs {
    /// The exports asked for; a malformed `--statsd-addr` is an error.
    pub fn settings(&self) -> Result<EnvoyStats, String> {
        let statsd = match &self.statsd_addr {
            None => None,
            Some(addr) => {
                let (host, port) = addr
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                    .filter(|(h, _)| !h.is_empty())
                    .ok_or_else(|| format!("--statsd-addr '{addr}': expected host:port"))?;
                Some(StatsdSettings {
                    host: host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string(),
                    port,
                    protocol: self.statsd_protocol,
                    flush_interval: self.statsd_flush_interval.0,
                    tags: self.statsd_tags.0.clone(),
                })
            }
        };
        if !self.envoy_metrics_path.starts_with('/') {
            return Err(format!(
                "--envoy-metrics-path '{}': expected a path starting with /",
                self.envoy_metrics_path
            ));
        }
        let prometheus = self.envoy_metrics_addr.map(|addr| PrometheusSettings {
            addr,
            path: self.envoy_metrics_path.clone(),
        });
        Ok(EnvoyStats { statsd, prometheus })
    }
}
