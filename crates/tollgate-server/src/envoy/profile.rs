//! `tollgate serve --profile envoy`: envoyproxy/ratelimit's environment variables as tollgate's
//! settings, so its container can be swapped for tollgate's without touching the deployment.
//!
//! This is only a translation layer: [`translate`] takes the environment as a map (tests pass a
//! table; the binary passes `std::env::vars()`) and a base [`ServeConfig`] (tollgate's own flags,
//! for what envoy has no variable for), and gives back the `ServeConfig` the variables mean, the
//! log settings, and the profile-only behaviour ([`EnvoyMode`], held in the state: global shadow
//! and quota mode, envoy's rate-limit headers, `/healthcheck`, the `ratelimit` health service).
//! Without the profile none of that is on, so tollgate's defaults do not move.
//!
//! Every variable envoyproxy/ratelimit defines is in `VARIABLES` with what tollgate does with
//! it. A variable that is set but unsupported, or that looks like one of envoy's (same prefix) but
//! is not one, gives one warning ([`Translation::warnings`], logged once at start-up): a setting
//! is never silently ignored. A setting that cannot be honoured without changing what clients
//! see (the memcache backend, rules from xDS, TLS without its files) or a value that cannot be
//! read stops the start with a [`ProfileError`] naming the variable.
//!
//! Variables marked `Support::Elsewhere` belong to the store, statistics and fixed-window
//! settings, which [`translate`] hands to [`super::redis`] and [`super::stats`].

use crate::config::ServeConfig;
use crate::model::HeaderNames;
use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use tollgate_core::rules::LoadOptions;
use tracing::level_filters::LevelFilter;

/// Behaviour switched on by the envoy profile, held in the service state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvoyMode {
    /// `SHADOW_MODE`: an OVER_LIMIT overall code becomes OK (descriptor statuses keep their
    /// codes), counted in `tollgate_global_shadow_mode_total`.
    pub(crate) shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is in quota mode (the request is over only when all
    /// quota descriptors are).
    pub(crate) quota_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: the three headers' names, or `None` for no headers.
    pub(crate) headers: Option<HeaderNames>,
    /// `RESPONSE_DYNAMIC_METADATA`.
    pub(crate) dynamic_metadata: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: unhealthy while no domain is loaded.
    pub(crate) healthy_needs_config: bool,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: start with no rules when they cannot be loaded.
    pub(crate) force_start: bool,
}

/// What the environment means for `tollgate serve`.
#[derive(Debug, Clone)]
pub struct Translation {
    /// The service settings.
    pub config: ServeConfig,
    /// The profile's own settings: its behaviour and envoy-named statistics.
    pub envoy: super::EnvoyConfig,
    /// `LOG_LEVEL` (default `WARN`).
    pub log_level: LevelFilter,
    /// `LOG_FORMAT=json`.
    pub log_json: bool,
    /// `TRACING_ENABLED`: the traces' settings (the exporter's endpoint comes from the
    /// standard `OTEL_EXPORTER_OTLP_*` variables, read where the exporter is built).
    pub tracing: Option<EnvoyTracing>,
    /// One line per variable set but not honoured (unsupported, or unknown with an envoy
    /// prefix), to log as WARN once the logger is up.
    pub warnings: Vec<String>,
}

/// envoyproxy/ratelimit's `TRACING_*` settings, with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyTracing {
    /// `TRACING_EXPORTER_PROTOCOL`: `http` (OTLP http/protobuf, the default) or `grpc`.
    pub grpc: bool,
    /// `TRACING_SERVICE_NAME` (default `RateLimit`).
    pub service_name: String,
    /// `TRACING_SERVICE_NAMESPACE` (default none).
    pub service_namespace: Option<String>,
    /// `TRACING_SERVICE_INSTANCE_ID` (default: a random id, made where the exporter is built).
    pub service_instance_id: Option<String>,
    /// `TRACING_SAMPLING_RATE` (default 1): the ratio of traces sampled when the caller has not
    /// decided (a caller's sampled flag is followed).
    pub sampling_rate: f64,
}

/// A variable whose value cannot be honoured.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{name}={value}: {reason}")]
pub struct ProfileError {
    /// The variable.
    pub(crate) name: String,
    /// Its value (never a secret: secret variables are not reported with their value).
    pub(crate) value: String,
    /// Why.
    pub(crate) reason: String,
}

/// What tollgate does with one of envoy's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Support {
    /// Read by [`translate`].
    Applied,
    /// Read elsewhere (store and statistics settings, applied where those are built).
    Elsewhere,
    /// Not supported: a WARN when set.
    Unsupported(&'static str),
}

use Support::{Applied, Elsewhere, Unsupported};

const NO_DOGSTATSD: &str = "DogStatsD is not supported";
const NO_MEMCACHE: &str = "the memcache backend is not supported";
const NO_REDIS_TUNING: &str = "tollgate's Redis client has no such setting";
const FIXED: &str = "fixed in tollgate";

/// Every variable of envoyproxy/ratelimit's settings, and what tollgate does with it.
pub(crate) const VARIABLES: &[(&str, Support)] = &[
    ("HOST", Applied),
    ("PORT", Applied),
    ("DEBUG_HOST", Applied),
    ("DEBUG_PORT", Applied),
    ("GRPC_UDS", Applied),
    ("GRPC_HOST", Applied),
    ("GRPC_PORT", Applied),
    ("GRPC_MAX_CONNECTION_AGE", Applied),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Applied),
    ("GRPC_SERVER_USE_TLS", Applied),
    ("GRPC_SERVER_TLS_CERT", Applied),
    ("GRPC_SERVER_TLS_KEY", Applied),
    ("GRPC_CLIENT_TLS_CACERT", Applied),
    ("GRPC_CLIENT_TLS_SAN", Applied),
    ("LOG_LEVEL", Applied),
    ("LOG_FORMAT", Applied),
    ("CONFIG_TYPE", Applied),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Applied),
    ("CONFIG_GRPC_XDS_NODE_ID", Applied),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Applied),
    ("CONFIG_GRPC_XDS_SERVER_URL", Applied),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Applied),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Applied),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Applied),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Applied),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Applied),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Applied),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Applied),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Applied),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Applied),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Applied),
    ("XDS_CLIENT_BACKOFF_JITTER", Applied),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Applied),
    ("USE_DOG_STATSD", Unsupported(NO_DOGSTATSD)),
    ("USE_DOG_STATSD_MOGRIFIERS", Unsupported(NO_DOGSTATSD)),
    // Statistics variables, read by `envoy_stats::stats_from_env`.
    ("USE_STATSD", Elsewhere),
    ("STATSD_HOST", Elsewhere),
    ("STATSD_PORT", Elsewhere),
    ("EXTRA_TAGS", Elsewhere),
    ("STATS_FLUSH_INTERVAL", Elsewhere),
    ("DISABLE_STATS", Elsewhere),
    ("USE_PROMETHEUS", Elsewhere),
    ("PROMETHEUS_ADDR", Elsewhere),
    ("PROMETHEUS_PATH", Elsewhere),
    ("PROMETHEUS_MAPPER_YAML", Elsewhere),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Elsewhere),
    ("NEAR_LIMIT_RATIO", Elsewhere),
    ("RUNTIME_ROOT", Applied),
    ("RUNTIME_SUBDIRECTORY", Applied),
    ("RUNTIME_APPDIRECTORY", Applied),
    ("RUNTIME_IGNOREDOTFILES", Applied),
    ("RUNTIME_WATCH_ROOT", Applied),
    // The fixed-window counters and envoy's Redis key layout.
    ("EXPIRATION_JITTER_MAX_SECONDS", Elsewhere),
    ("CACHE_KEY_PREFIX", Elsewhere),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Elsewhere),
    ("LOCAL_CACHE_SIZE_IN_BYTES", Elsewhere),
    ("BACKEND_TYPE", Applied),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Applied),
    ("LIMIT_LIMIT_HEADER", Applied),
    ("LIMIT_REMAINING_HEADER", Applied),
    ("LIMIT_RESET_HEADER", Applied),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Applied),
    // The Redis variables, turned into store settings by `envoy_redis::redis_from_env`.
    ("REDIS_SOCKET_TYPE", Elsewhere),
    ("REDIS_TYPE", Elsewhere),
    ("REDIS_URL", Elsewhere),
    ("REDIS_POOL_SIZE", Elsewhere),
    ("REDIS_AUTH", Elsewhere),
    ("REDIS_TLS", Elsewhere),
    ("REDIS_TLS_CLIENT_CERT", Elsewhere),
    ("REDIS_TLS_CLIENT_KEY", Elsewhere),
    ("REDIS_TLS_CACERT", Elsewhere),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Elsewhere),
    ("REDIS_PIPELINE_WINDOW", Unsupported(NO_REDIS_TUNING)),
    ("REDIS_PIPELINE_LIMIT", Unsupported(NO_REDIS_TUNING)),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        Unsupported(NO_REDIS_TUNING),
    ),
    ("REDIS_PERSECOND", Elsewhere),
    ("REDIS_PERSECOND_SOCKET_TYPE", Elsewhere),
    ("REDIS_PERSECOND_TYPE", Elsewhere),
    ("REDIS_PERSECOND_URL", Elsewhere),
    ("REDIS_PERSECOND_POOL_SIZE", Elsewhere),
    ("REDIS_PERSECOND_AUTH", Elsewhere),
    ("REDIS_PERSECOND_TLS", Elsewhere),
    ("REDIS_SENTINEL_AUTH", Elsewhere),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Elsewhere),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        Unsupported(NO_REDIS_TUNING),
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        Unsupported(NO_REDIS_TUNING),
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        Unsupported(NO_REDIS_TUNING),
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        Unsupported(NO_REDIS_TUNING),
    ),
    ("REDIS_TIMEOUT", Elsewhere),
    ("REDIS_PERSECOND_TIMEOUT", Elsewhere),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", Unsupported(NO_REDIS_TUNING)),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        Unsupported(NO_REDIS_TUNING),
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        Unsupported(NO_REDIS_TUNING),
    ),
    ("REDIS_STARTUP_MAX_INTERVAL", Unsupported(NO_REDIS_TUNING)),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        Unsupported(NO_REDIS_TUNING),
    ),
    ("MEMCACHE_HOST_PORT", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_MAX_IDLE_CONNS", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_SRV", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_SRV_REFRESH", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_TLS", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_TLS_CLIENT_CERT", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_TLS_CLIENT_KEY", Unsupported(NO_MEMCACHE)),
    ("MEMCACHE_TLS_CACERT", Unsupported(NO_MEMCACHE)),
    (
        "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        Unsupported(NO_MEMCACHE),
    ),
    ("SHADOW_MODE", Applied),
    ("QUOTA_MODE", Applied),
    ("RESPONSE_DYNAMIC_METADATA", Applied),
    ("MERGE_DOMAIN_CONFIG", Applied),
    ("TRACING_ENABLED", Applied),
    ("TRACING_SERVICE_NAME", Applied),
    ("TRACING_SERVICE_NAMESPACE", Applied),
    ("TRACING_SERVICE_INSTANCE_ID", Applied),
    ("TRACING_EXPORTER_PROTOCOL", Applied),
    ("TRACING_SAMPLING_RATE", Applied),
    ("GOMAXPROCS", Unsupported(FIXED)),
];

/// Prefixes only envoyproxy/ratelimit's variables use: a set variable with one of these that is
/// not in [`VARIABLES`] is most likely a typo or a newer envoy setting, and is warned about.
const PREFIXES: &[&str] = &[
    "RUNTIME_",
    "REDIS_PERSECOND_",
    "REDIS_SENTINEL_",
    "REDIS_TLS_",
    "MEMCACHE_",
    "LIMIT_",
    "STATSD_",
    "PROMETHEUS_",
    "TRACING_",
    "CONFIG_GRPC_XDS_",
    "XDS_CLIENT_",
    "USE_DOG_STATSD",
    "GRPC_SERVER_",
    "GRPC_CLIENT_TLS_",
    "GRPC_MAX_CONNECTION_",
];

/// Prefixes envoy shares with other software on the same machines (the gRPC libraries read
/// `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`, `GRPC_TRACE`, ...; Redis clients `REDIS_HOST`): an unknown
/// variable with one of these is warned about only when it is a near miss of one of envoy's
/// (at most [`NEAR_MISS`] edits away, e.g. `GRPC_PORTT`).
const SHARED_PREFIXES: &[&str] = &["GRPC_", "REDIS_", "DEBUG_"];

/// Most edits between a set variable and one of envoy's for it to be taken for a typo.
const NEAR_MISS: usize = 2;

/// Whether `name` (not one of [`VARIABLES`]) looks like one of envoyproxy/ratelimit's.
fn looks_like_envoys(name: &str) -> bool {
    PREFIXES.iter().any(|p| name.starts_with(p))
        || (SHARED_PREFIXES.iter().any(|p| name.starts_with(p))
            && VARIABLES
                .iter()
                .any(|(known, _)| tollgate_core::rules::edit_distance(name, known) <= NEAR_MISS))
}

/// Variables whose value is a secret: never echoed in an error.
const SECRETS: &[&str] = &[
    "REDIS_AUTH",
    "REDIS_PERSECOND_AUTH",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
];

/// The environment, read with envoy's defaults.
struct Env<'a> {
    vars: &'a BTreeMap<String, String>,
}

impl Env<'_> {
    /// The value of `name`; unset or empty is `None` (then the default applies).
    fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn str_or(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_owned()
    }

    fn error(&self, name: &str, reason: impl Into<String>) -> ProfileError {
        let value = if SECRETS.contains(&name) {
            "<redacted>".to_owned()
        } else {
            self.get(name).unwrap_or_default().to_owned()
        };
        ProfileError {
            name: name.to_owned(),
            value,
            reason: reason.into(),
        }
    }

    /// A boolean as Go's `strconv.ParseBool` reads it.
    fn bool_or(&self, name: &str, default: bool) -> Result<bool, ProfileError> {
        match self.get(name) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(_) => Err(self.error(name, "expected a boolean (true, false, 1, 0, t, f)")),
        }
    }

    fn port_or(&self, name: &str, default: u16) -> Result<u16, ProfileError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| self.error(name, "expected a port number (0 to 65535)")),
        }
    }

    fn duration_or(&self, name: &str, default: Duration) -> Result<Duration, ProfileError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => go_duration(v).ok_or_else(|| {
                self.error(
                    name,
                    "expected a Go duration such as 24h, 90m, 1h30m or 500ms",
                )
            }),
        }
    }

    /// `host:port` (a name is resolved now, as envoy's listener does when it binds).
    fn addr(&self, host: &str, port: &str, default_port: u16) -> Result<SocketAddr, ProfileError> {
        let h = self.str_or(host, "0.0.0.0");
        let p = self.port_or(port, default_port)?;
        let h = h.trim_start_matches('[').trim_end_matches(']');
        (h, p)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| self.error(host, "not an IP address or a resolvable host name"))
    }
}

/// A Go `time.Duration` string: `0`, or a sequence of decimal numbers with units `ns`, `us`
/// (`µs`), `ms`, `s`, `m`, `h` (`1h30m`, `1.5h`, `300ms`). Negative durations are refused.
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * nanos;
        rest = tail;
    }
    (total.is_finite() && total < u64::MAX as f64).then(|| Duration::from_nanos(total as u64))
}

/// The level of a logrus level name (`LOG_LEVEL`, case-insensitive): `panic` and `fatal` log
/// errors only, as tollgate has no level above ERROR.
fn log_level(env: &Env<'_>) -> Result<LevelFilter, ProfileError> {
    let v = env.str_or("LOG_LEVEL", "WARN").to_ascii_lowercase();
    Ok(match v.as_str() {
        "panic" | "fatal" | "error" => LevelFilter::ERROR,
        "warn" | "warning" => LevelFilter::WARN,
        "info" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        _ => {
            return Err(env.error(
                "LOG_LEVEL",
                "expected panic, fatal, error, warn, info, debug or trace",
            ))
        }
    })
}

/// The rules directory of envoy's runtime layout: `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
/// RUNTIME_APPDIRECTORY`. Every file in it and its subdirectories is a rule file whatever its
/// extension, dot files too unless `RUNTIME_IGNOREDOTFILES`.
/// `CONFIG_TYPE=GRPC_XDS_SOTW`: the xDS subscription, with envoyproxy/ratelimit's defaults.
fn xds(env: &Env<'_>) -> Result<crate::xds::XdsConfig, ProfileError> {
    let mut x = crate::xds::XdsConfig::new(
        env.str_or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
        env.str_or("CONFIG_GRPC_XDS_NODE_ID", "default"),
    );
    // `k1=v1,k2=v2`; an entry without `=` is skipped, as envoy does.
    x.node_metadata = env
        .str_or("CONFIG_GRPC_XDS_NODE_METADATA", "")
        .split(',')
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    // `k1:v1,k2:v2` (a Go map setting).
    let headers = env.str_or("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "");
    for entry in headers.split(',').filter(|e| !e.trim().is_empty()) {
        let Some((k, v)) = entry.split_once(':') else {
            return Err(env.error(
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                format!("{entry:?}: expected key:value pairs separated by commas"),
            ));
        };
        x.headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    x.connect_retry = env.duration_or(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        Duration::from_secs(3),
    )?;
    x.backoff = crate::xds::Backoff {
        initial: env.duration_or(
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            Duration::from_secs(10),
        )?,
        max: env.duration_or("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Duration::from_secs(60))?,
        factor: match env.get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
            None => 0.5,
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .ok_or_else(|| {
                    env.error("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "expected a number >= 0")
                })?,
        },
        jitter: env.bool_or("XDS_CLIENT_BACKOFF_JITTER", true)?,
    };
    x.max_message_size = match env.get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
        None => None,
        Some(v) => match v.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => {
                return Err(env.error(
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                    "expected a whole number of bytes",
                ))
            }
        },
    };
    x.force_start = env.bool_or("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?;
    if env.bool_or("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        x.tls = Some(crate::xds::XdsTls {
            ca: env
                .get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
                .map(PathBuf::from),
            cert: env
                .get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")
                .map(PathBuf::from),
            key: env.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY").map(PathBuf::from),
            server_name: env.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN").map(str::to_owned),
        });
    }
    Ok(x)
}

fn runtime(env: &Env<'_>) -> Result<(PathBuf, LoadOptions), ProfileError> {
    let root = env.str_or("RUNTIME_ROOT", "/srv/runtime_data/current");
    let sub = env.str_or("RUNTIME_SUBDIRECTORY", "");
    let app = env.str_or("RUNTIME_APPDIRECTORY", "config");
    // RUNTIME_WATCH_ROOT only chooses what envoy's loader watches (the root, for its symlink
    // swap, or the app directory): tollgate's reload polls the contents through the path, which
    // sees both, so either value behaves the same. Read for its validity only.
    env.bool_or("RUNTIME_WATCH_ROOT", true)?;
    let dotfiles = !env.bool_or("RUNTIME_IGNOREDOTFILES", false)?;
    let mut path = PathBuf::from(root);
    if !sub.is_empty() {
        path.push(sub);
    }
    path.push(app);
    Ok((
        path,
        LoadOptions {
            any_extension: true,
            dotfiles,
            merge_domains: false,
            recursive: true,
        },
    ))
}

/// Which of tollgate's own settings were given explicitly (a flag on the command line), so
/// that the profile does not replace them with envoy's defaults: a given setting wins over the
/// profile's default, and when envoy's variable for it is set too and says something else, the
/// start fails naming both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Explicit {
    /// `--rules` (envoy: `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY`).
    pub rules: bool,
    /// `--http-addr` (envoy: `HOST`, `PORT`).
    pub http_addr: bool,
    /// `--response-headers` (envoy: `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub response_headers: bool,
    /// `--redis-prefix` (envoy: `CACHE_KEY_PREFIX`).
    pub redis_prefix: bool,
}

/// How the rules path was made from the `RUNTIME_*` variables, for the error when it is missing.
fn runtime_origin(env: &Env<'_>) -> String {
    let part = |name: &str, default: Option<&str>| match (env.get(name), default) {
        (Some(v), _) => format!("{name}={v}"),
        (None, Some(d)) => format!("{name} unset (default {d})"),
        (None, None) => format!("{name} unset"),
    };
    format!(
        "--profile envoy made it from {}, {} and {}: set those variables to where the rules \
         are (or give --rules PATH)",
        part("RUNTIME_ROOT", Some("/srv/runtime_data/current")),
        part("RUNTIME_SUBDIRECTORY", None),
        part("RUNTIME_APPDIRECTORY", Some("config")),
    )
}

/// Translate envoyproxy/ratelimit's environment into tollgate's settings, on top of `base`
/// (tollgate's own flags, for what envoy has no variable for).
pub fn translate(
    vars: &BTreeMap<String, String>,
    base: ServeConfig,
) -> Result<Translation, ProfileError> {
    translate_with(vars, base, Explicit::default())
}

/// [`translate`], where the settings `explicit` names keep `base`'s value unless envoy's
/// variable for them is set to something else (then an error names the two).
pub fn translate_with(
    vars: &BTreeMap<String, String>,
    base: ServeConfig,
    explicit: Explicit,
) -> Result<Translation, ProfileError> {
    let mut t = Translator {
        env: Env { vars },
        config: base.clone(),
        base,
        explicit,
        warnings: Vec::new(),
    };
    t.unknown_variables();
    t.listeners()?;
    let (log_level, log_json) = t.logs()?;
    t.rules()?;
    t.store()?;
    t.counting()?;
    let stats = t.statistics()?;
    let mode = t.behaviour()?;
    let tracing = t.tracing()?;
    Ok(Translation {
        tracing,
        config: t.config,
        envoy: super::EnvoyConfig {
            mode: Some(mode),
            stats,
        },
        log_level,
        log_json,
        warnings: t.warnings,
    })
}

/// One translation under way: the environment, tollgate's own settings (`base`, with the flags
/// given explicitly), the settings being made, and the warnings so far. Each step below
/// translates one group of envoyproxy/ratelimit's variables.
struct Translator<'a> {
    env: Env<'a>,
    base: ServeConfig,
    explicit: Explicit,
    config: ServeConfig,
    warnings: Vec<String>,
}

impl Translator<'_> {
    /// An error when a flag was `given` explicitly, one of envoy's `names` is set, and the two
    /// `differ`: the operator said two different things.
    fn clash(
        &self,
        given: bool,
        differ: bool,
        names: &[&str],
        flag: &str,
    ) -> Result<(), ProfileError> {
        match names.iter().find(|n| self.env.get(n).is_some()) {
            Some(name) if given && differ => Err(self.env.error(
                name,
                format!(
                    "conflicts with {flag}: the flag and envoyproxy/ratelimit's variable say \
                     different things; keep one"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `TRACING_*`, read only when `TRACING_ENABLED` is true (as envoy does).
    fn tracing(&self) -> Result<Option<EnvoyTracing>, ProfileError> {
        let env = &self.env;
        if !env.bool_or("TRACING_ENABLED", false)? {
            return Ok(None);
        }
        let grpc = match env.str_or("TRACING_EXPORTER_PROTOCOL", "http").as_str() {
            "http" => false,
            "grpc" => true,
            _ => {
                return Err(env.error(
                    "TRACING_EXPORTER_PROTOCOL",
                    "expected http (OTLP over HTTP) or grpc",
                ))
            }
        };
        let sampling_rate = match env.get("TRACING_SAMPLING_RATE") {
            None => 1.0,
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|r| r.is_finite())
                .ok_or_else(|| {
                    env.error(
                        "TRACING_SAMPLING_RATE",
                        "expected a number (0 samples none, 1 or more all)",
                    )
                })?
                .clamp(0.0, 1.0),
        };
        Ok(Some(EnvoyTracing {
            grpc,
            service_name: env.str_or("TRACING_SERVICE_NAME", "RateLimit"),
            service_namespace: env.get("TRACING_SERVICE_NAMESPACE").map(str::to_owned),
            service_instance_id: env.get("TRACING_SERVICE_INSTANCE_ID").map(str::to_owned),
            sampling_rate,
        }))
    }

    /// The environment as a `HashMap`, which the statistics and Redis translations take.
    fn map(&self) -> std::collections::HashMap<String, String> {
        self.env
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// A warning for each variable set that is not honoured: unsupported, or unknown with an
    /// envoy-like name.
    fn unknown_variables(&mut self) {
        for (name, value) in self.env.vars {
            if value.trim().is_empty() {
                continue;
            }
            match VARIABLES.iter().find(|(n, _)| n == name) {
                Some((_, Unsupported(why))) => self.warnings.push(format!(
                    "{name} is set but not supported by tollgate's envoy profile ({why}); ignored"
                )),
                Some(_) => {}
                None if looks_like_envoys(name) => self.warnings.push(format!(
                    "{name} is set but is not an envoyproxy/ratelimit setting tollgate knows; ignored"
                )),
                None => {}
            }
        }
    }

    /// HTTP, gRPC (address, socket, connection age, TLS) and the debug port.
    fn listeners(&mut self) -> Result<(), ProfileError> {
        let env = &self.env;
        let http_addr = Some(env.addr("HOST", "PORT", 8080)?);
        self.clash(
            self.explicit.http_addr,
            http_addr != self.base.listeners.http_addr,
            &["HOST", "PORT"],
            "--http-addr (TOLLGATE_HTTP_ADDR)",
        )?;
        let config = &mut self.config;
        if !self.explicit.http_addr {
            config.listeners.http_addr = http_addr;
        }
        config.listeners.grpc_addr = Some(env.addr("GRPC_HOST", "GRPC_PORT", 8081)?);
        // As envoy: a socket path replaces the gRPC host and port.
        config.listeners.grpc_uds = env.get("GRPC_UDS").map(PathBuf::from);
        config.grpc_limits.max_connection_age =
            env.duration_or("GRPC_MAX_CONNECTION_AGE", Duration::from_secs(24 * 3600))?;
        config.grpc_limits.max_connection_age_grace =
            env.duration_or("GRPC_MAX_CONNECTION_AGE_GRACE", Duration::from_secs(3600))?;
        if env.bool_or("GRPC_SERVER_USE_TLS", false)? {
            let (Some(cert), Some(key)) = (
                env.get("GRPC_SERVER_TLS_CERT"),
                env.get("GRPC_SERVER_TLS_KEY"),
            ) else {
                return Err(env.error(
                    "GRPC_SERVER_USE_TLS",
                    "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
                ));
            };
            config.listeners.grpc_tls = Some(crate::grpc::GrpcTls {
                cert: cert.into(),
                key: key.into(),
                client_ca: env.get("GRPC_CLIENT_TLS_CACERT").map(PathBuf::from),
            });
            if env.get("GRPC_CLIENT_TLS_SAN").is_some() {
                self.warnings.push(
                    "GRPC_CLIENT_TLS_SAN is set but not supported: client certificates are \
                     verified against GRPC_CLIENT_TLS_CACERT only, whatever their SAN"
                        .to_owned(),
                );
            }
        } else {
            for name in [
                "GRPC_SERVER_TLS_CERT",
                "GRPC_SERVER_TLS_KEY",
                "GRPC_CLIENT_TLS_CACERT",
                "GRPC_CLIENT_TLS_SAN",
            ] {
                if env.get(name).is_some() {
                    self.warnings.push(format!(
                        "{name} is set but GRPC_SERVER_USE_TLS is not: ignored, as \
                         envoyproxy/ratelimit does"
                    ));
                }
            }
        }
        // envoy's debug port: /rlconfig and /stats (`super::debug`).
        self.config.listeners.debug_addr = Some(env.addr("DEBUG_HOST", "DEBUG_PORT", 6070)?);
        Ok(())
    }

    /// `LOG_LEVEL` and `LOG_FORMAT`.
    fn logs(&self) -> Result<(LevelFilter, bool), ProfileError> {
        let log_json = self
            .env
            .str_or("LOG_FORMAT", "text")
            .eq_ignore_ascii_case("json");
        Ok((log_level(&self.env)?, log_json))
    }

    /// Where the rules come from: `CONFIG_TYPE` and the `RUNTIME_*` directory.
    fn rules(&mut self) -> Result<(), ProfileError> {
        let env = &self.env;
        match env.str_or("CONFIG_TYPE", "FILE").as_str() {
            "FILE" => {}
            "GRPC_XDS_SOTW" => {
                if self.explicit.rules {
                    return Err(env.error(
                        "CONFIG_TYPE",
                        "conflicts with --rules (TOLLGATE_RULES): rules come from the xDS server",
                    ));
                }
                self.config.rules.xds = Some(xds(env)?);
                self.config.rules.listing.merge_domains =
                    env.bool_or("MERGE_DOMAIN_CONFIG", false)?;
                return Ok(());
            }
            _ => return Err(env.error("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
        }
        let (rules, mut listing) = runtime(env)?;
        listing.merge_domains = env.bool_or("MERGE_DOMAIN_CONFIG", false)?;
        self.clash(
            self.explicit.rules,
            rules != self.base.rules.path,
            &[
                "RUNTIME_ROOT",
                "RUNTIME_SUBDIRECTORY",
                "RUNTIME_APPDIRECTORY",
            ],
            "--rules (TOLLGATE_RULES)",
        )?;
        if !self.explicit.rules {
            self.config.rules.path = rules;
            self.config.rules.origin = Some(runtime_origin(env));
        }
        self.config.rules.listing = listing;
        Ok(())
    }

    /// `BACKEND_TYPE` and the `REDIS_*` variables. With none of those set the store stays
    /// tollgate's `--store` (`TOLLGATE_STORE`, default memory), where envoyproxy/ratelimit would
    /// try its default socket /var/run/nutcracker/ratelimit.sock.
    fn store(&mut self) -> Result<(), ProfileError> {
        let env = &self.env;
        match env
            .str_or("BACKEND_TYPE", "redis")
            .to_ascii_lowercase()
            .as_str()
        {
            "redis" if crate::envoy::redis::known_variables().any(|k| env.vars.contains_key(k)) => {
                let redis = crate::envoy::redis::redis_from_env(&self.map())
                    .map_err(|e| env.error(&e.var, e.reason))?;
                redis.apply_to(&mut self.config);
                self.warnings.extend(
                    redis
                        .warnings
                        .iter()
                        .map(|(var, why)| format!("{var}: {why}")),
                );
                Ok(())
            }
            "redis" => Ok(()),
            "memcache" => Err(env.error(
                "BACKEND_TYPE",
                "the memcache backend is not supported; use BACKEND_TYPE=redis",
            )),
            _ => Err(env.error("BACKEND_TYPE", "expected redis")),
        }
    }

    /// Counting as envoyproxy/ratelimit counts: its fixed windows for rules that name no
    /// algorithm, denied hits counted unless `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, and on a
    /// standalone Redis its key layout (`CACHE_KEY_PREFIX`, the expiry jitter), so that its pods
    /// and tollgate's share counters.
    fn counting(&mut self) -> Result<(), ProfileError> {
        let env = &self.env;
        self.config.rules.default_algorithm = Some(tollgate_core::Algorithm::EnvoyFixedWindow);
        self.config.rules.count_denied_hits =
            !env.bool_or("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?;
        let on_cluster = |url: &str| url.contains("+cluster");
        let store = &self.config.store;
        if on_cluster(&store.url) || store.per_second_url.as_deref().is_some_and(on_cluster) {
            // envoy's keys carry no hash tag: a multi-key script cannot run on a cluster.
            if env.vars.contains_key("CACHE_KEY_PREFIX") {
                self.warnings.push(
                    "CACHE_KEY_PREFIX: on a Redis Cluster tollgate keeps its own key layout, so \
                     counters are not shared with envoyproxy/ratelimit pods"
                        .to_owned(),
                );
            }
            return Ok(());
        }
        self.config.store.key_layout = tollgate_redis::KeyLayout::Envoy;
        let prefix = env.str_or("CACHE_KEY_PREFIX", "");
        self.clash(
            self.explicit.redis_prefix,
            prefix != self.base.store.prefix,
            &["CACHE_KEY_PREFIX"],
            "--redis-prefix (TOLLGATE_REDIS_PREFIX)",
        )?;
        if !self.explicit.redis_prefix {
            self.config.store.prefix = prefix;
        }
        let jitter = env.str_or("EXPIRATION_JITTER_MAX_SECONDS", "300");
        self.config.store.expiration_jitter =
            Duration::from_secs(jitter.parse().map_err(|_| {
                env.error(
                    "EXPIRATION_JITTER_MAX_SECONDS",
                    "expected a whole number of seconds",
                )
            })?);
        Ok(())
    }

    /// Statistics: envoy's stat names on statsd (default) or a Prometheus page, and the
    /// near-limit ratio.
    fn statistics(&mut self) -> Result<super::stats::EnvoyStats, ProfileError> {
        let map = self.map();
        let env = &self.env;
        let stats =
            crate::envoy::stats::stats_from_env(&map).map_err(|e| env.error(&e.var, e.reason))?;
        self.config.near_limit_ratio = crate::envoy::stats::near_limit_ratio_from_env(&map)
            .map_err(|e| env.error(&e.var, e.reason))?;
        Ok(stats)
    }

    /// The service's behaviour: response headers, shadow and quota modes, dynamic metadata,
    /// health.
    fn behaviour(&self) -> Result<EnvoyMode, ProfileError> {
        let env = &self.env;
        let headers_on = env.bool_or("LIMIT_RESPONSE_HEADERS_ENABLED", false)?;
        self.clash(
            self.explicit.response_headers,
            !headers_on,
            &["LIMIT_RESPONSE_HEADERS_ENABLED"],
            "--response-headers (TOLLGATE_RESPONSE_HEADERS)",
        )?;
        let headers = (headers_on || self.explicit.response_headers).then(|| HeaderNames {
            limit: env.str_or("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
            remaining: env.str_or("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
            reset: env.str_or("LIMIT_RESET_HEADER", "RateLimit-Reset"),
        });
        Ok(EnvoyMode {
            shadow_mode: env.bool_or("SHADOW_MODE", false)?,
            quota_mode: env.bool_or("QUOTA_MODE", false)?,
            headers,
            dynamic_metadata: env.bool_or("RESPONSE_DYNAMIC_METADATA", false)?,
            healthy_needs_config: env.bool_or("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
            force_start: env.bool_or("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
        })
    }
}

/// Seconds until the end of the current epoch-aligned window of `unit`, as envoyproxy/ratelimit
/// computes its reset header (`divider - now % divider`, months 30 days, years 365).
pub fn reset_secs(unit: tollgate_core::quota::Unit, now_secs: u64) -> u64 {
    use tollgate_core::quota::Unit;
    let divider: u64 = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        Unit::Week => 7 * 86_400,
        Unit::Month => 30 * 86_400,
        Unit::Year => 365 * 86_400,
    };
    divider - now_secs % divider
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn tr(pairs: &[(&str, &str)]) -> Translation {
        translate(&env(pairs), ServeConfig::default()).unwrap()
    }

    fn err(pairs: &[(&str, &str)]) -> ProfileError {
        translate(&env(pairs), ServeConfig::default()).unwrap_err()
    }

    #[test]
    fn defaults_are_envoys() {
        let t = tr(&[]);
        let c = &t.config;
        assert_eq!(c.listeners.http_addr, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(c.listeners.grpc_addr, Some("0.0.0.0:8081".parse().unwrap()));
        assert_eq!(
            c.listeners.debug_addr,
            Some("0.0.0.0:6070".parse().unwrap())
        );
        assert_eq!(
            c.rules.path,
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert_eq!(
            c.rules.listing,
            LoadOptions {
                any_extension: true,
                dotfiles: true,
                merge_domains: false,
                recursive: true,
            }
        );
        assert_eq!(
            c.grpc_limits.max_connection_age,
            Duration::from_secs(86_400)
        );
        assert_eq!(
            c.grpc_limits.max_connection_age_grace,
            Duration::from_secs(3600)
        );
        assert_eq!(t.log_level, LevelFilter::WARN);
        assert!(!t.log_json);
        assert_eq!(t.envoy.mode, Some(EnvoyMode::default()));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    }

    #[test]
    fn variables_to_settings() {
        let t = tr(&[
            ("HOST", "127.0.0.1"),
            ("PORT", "9080"),
            ("GRPC_HOST", "127.0.0.2"),
            ("GRPC_PORT", "9081"),
            ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "90s"),
            ("LOG_LEVEL", "debug"),
            ("LOG_FORMAT", "json"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "rules"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("SHADOW_MODE", "1"),
            ("QUOTA_MODE", "T"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("BACKEND_TYPE", "redis"),
            ("GRPC_UDS", "/run/rl.sock"),
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("DEBUG_HOST", "127.0.0.3"),
            ("DEBUG_PORT", "9070"),
        ]);
        let c = &t.config;
        assert_eq!(
            c.listeners.debug_addr,
            Some("127.0.0.3:9070".parse().unwrap())
        );
        assert_eq!(
            c.listeners.http_addr,
            Some("127.0.0.1:9080".parse().unwrap())
        );
        assert_eq!(
            c.listeners.grpc_addr,
            Some("127.0.0.2:9081".parse().unwrap())
        );
        assert_eq!(c.listeners.grpc_uds, Some(PathBuf::from("/run/rl.sock")));
        assert_eq!(c.grpc_limits.max_connection_age, Duration::from_secs(5400));
        assert_eq!(
            c.grpc_limits.max_connection_age_grace,
            Duration::from_secs(90)
        );
        assert_eq!(t.log_level, LevelFilter::DEBUG);
        assert!(t.log_json);
        assert_eq!(c.rules.path, PathBuf::from("/data/ratelimit/rules"));
        assert!(!c.rules.listing.dotfiles);
        assert!(c.rules.listing.merge_domains);
        assert!(c.rules.listing.any_extension);
        assert_eq!(
            t.envoy.mode,
            Some(EnvoyMode {
                shadow_mode: true,
                quota_mode: true,
                headers: Some(HeaderNames {
                    limit: "RateLimit-Limit".into(),
                    remaining: "X-Left".into(),
                    reset: "RateLimit-Reset".into(),
                }),
                dynamic_metadata: false,
                healthy_needs_config: true,
                force_start: true,
            })
        );
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    }

    #[test]
    fn base_settings_envoy_has_no_variable_for_are_kept() {
        let mut base = ServeConfig::default();
        base.connections.max_connections = 7;
        let t = translate(&env(&[]), base).unwrap();
        assert_eq!(t.config.connections.max_connections, 7);
    }

    #[test]
    fn unsupported_and_unknown_variables_warn_once_each() {
        let t = tr(&[
            ("USE_DOG_STATSD", "true"),
            ("MEMCACHE_SRV", "x"),
            ("REDIS_URLS", "x"),
            ("GRPC_PORTT", "1"),
            ("PATH", "/bin"),
            ("GRPC_CLIENT_TLS_SAN", "rl.example"),
        ]);
        let w = t.warnings.join("\n");
        for name in [
            "USE_DOG_STATSD",
            "MEMCACHE_SRV",
            "REDIS_URLS",
            "GRPC_PORTT",
            "GRPC_CLIENT_TLS_SAN",
        ] {
            assert_eq!(
                t.warnings.iter().filter(|l| l.starts_with(name)).count(),
                1,
                "{name}: {w}"
            );
        }
        assert!(!w.contains("PATH"), "{w}");
    }

    /// Regression: `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH` (read by the gRPC libraries, set on many
    /// machines) warned on every start. Only envoy's own prefixes, and near misses of its
    /// variables under the prefixes it shares, are warned about.
    #[test]
    fn other_softwares_variables_under_shared_prefixes_do_not_warn() {
        let t = tr(&[
            ("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "/etc/ssl/roots.pem"),
            ("GRPC_TRACE", "all"),
            ("GRPC_VERBOSITY", "debug"),
            ("REDIS_HOST", "cache"),
            ("DEBUG_MODE", "1"),
        ]);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        let t = tr(&[("GRPC_SERVER_TLS_CRT", "x"), ("RUNTIME_ROOTS", "/x")]);
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
    }

    fn explicit_base() -> ServeConfig {
        let mut c = ServeConfig::default();
        c.rules.path = PathBuf::from("my/rules");
        c.listeners.http_addr = Some("127.0.0.1:9999".parse().unwrap());
        c.store.prefix = "mine".into();
        c.response_headers = true;
        c
    }

    const ALL_EXPLICIT: Explicit = Explicit {
        rules: true,
        http_addr: true,
        response_headers: true,
        redis_prefix: true,
    };

    /// Regression: `--rules`, `--http-addr`, `--response-headers` and `--redis-prefix` were
    /// silently replaced by the profile's defaults.
    #[test]
    fn explicit_flags_win_over_the_profiles_defaults() {
        let vars = env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:6379"),
        ]);
        let t = translate_with(&vars, explicit_base(), ALL_EXPLICIT).unwrap();
        let c = &t.config;
        assert_eq!(c.rules.path, PathBuf::from("my/rules"));
        assert_eq!(c.rules.origin, None);
        assert_eq!(
            c.listeners.http_addr,
            Some("127.0.0.1:9999".parse().unwrap())
        );
        assert_eq!(c.store.prefix, "mine");
        let headers = t.envoy.mode.as_ref().unwrap().headers.as_ref().unwrap();
        assert_eq!(headers.limit, "RateLimit-Limit");
        // Not given: the profile's defaults.
        let t = translate_with(&vars, explicit_base(), Explicit::default()).unwrap();
        assert_eq!(
            t.config.rules.path,
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert!(t
            .config
            .rules
            .origin
            .as_deref()
            .unwrap()
            .contains("RUNTIME_ROOT"));
        assert_eq!(t.config.store.prefix, "");
        assert_eq!(t.envoy.mode.unwrap().headers, None);
    }

    #[test]
    fn a_flag_and_envoys_variable_that_disagree_stop_the_start_naming_both() {
        for (var, value, flag) in [
            ("RUNTIME_ROOT", "/data", "--rules"),
            ("PORT", "7000", "--http-addr"),
            ("CACHE_KEY_PREFIX", "other", "--redis-prefix"),
            (
                "LIMIT_RESPONSE_HEADERS_ENABLED",
                "false",
                "--response-headers",
            ),
        ] {
            let vars = env(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "127.0.0.1:6379"),
                (var, value),
            ]);
            let e = translate_with(&vars, explicit_base(), ALL_EXPLICIT).unwrap_err();
            assert_eq!(e.name, var);
            assert!(e.to_string().contains(flag), "{e}");
        }
        // Agreeing values are no conflict.
        let vars = env(&[("HOST", "127.0.0.1"), ("PORT", "9999")]);
        translate_with(&vars, explicit_base(), ALL_EXPLICIT).unwrap();
    }

    #[test]
    fn bad_values_are_clear_errors() {
        assert_eq!(err(&[("PORT", "http")]).name, "PORT");
        assert_eq!(err(&[("SHADOW_MODE", "yes")]).name, "SHADOW_MODE");
        assert_eq!(
            err(&[("GRPC_MAX_CONNECTION_AGE", "1d")]).name,
            "GRPC_MAX_CONNECTION_AGE"
        );
        assert_eq!(err(&[("LOG_LEVEL", "loud")]).name, "LOG_LEVEL");
        let e = err(&[("BACKEND_TYPE", "memcache")]);
        assert!(
            e.to_string().contains("memcache backend is not supported"),
            "{e}"
        );
        assert_eq!(err(&[("CONFIG_TYPE", "XDS")]).name, "CONFIG_TYPE");
        assert_eq!(
            err(&[("GRPC_SERVER_USE_TLS", "true")]).name,
            "GRPC_SERVER_USE_TLS"
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("10us"), Some(Duration::from_micros(10)));
        for bad in ["", "10", "1d", "-1s", "h", "1x"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn reset_is_the_end_of_the_epoch_aligned_window() {
        use tollgate_core::quota::Unit;
        assert_eq!(reset_secs(Unit::Second, 1_000), 1);
        assert_eq!(reset_secs(Unit::Minute, 125), 55);
        assert_eq!(reset_secs(Unit::Hour, 3600), 3600);
        assert_eq!(reset_secs(Unit::Month, 30 * 86_400 + 10), 30 * 86_400 - 10);
    }

    #[test]
    fn grpc_xds_sotw_reads_every_xds_variable_with_envoys_defaults() {
        let t = tr(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]);
        let x = t.config.rules.xds.expect("xDS on");
        assert_eq!(x.server, "localhost:18000");
        assert_eq!(x.node_id, "default");
        assert_eq!(x.connect_retry, Duration::from_secs(3));
        assert_eq!(x.backoff, crate::xds::Backoff::default());
        assert_eq!(x.max_message_size, None);
        assert!(!x.force_start);
        assert_eq!(x.tls, None);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);

        let t = tr(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,junk,b=x=y"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-a:1, x-b:2"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "500ms"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "5s"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "eg.local"),
        ]);
        let x = t.config.rules.xds.expect("xDS on");
        assert_eq!(x.server, "envoy-gateway:18001");
        assert_eq!(x.node_id, "envoy-ratelimit");
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
        };
        assert_eq!(x.node_metadata, pairs(&[("a", "1"), ("b", "x=y")]));
        assert_eq!(x.headers, pairs(&[("x-a", "1"), ("x-b", "2")]));
        assert_eq!(x.connect_retry, Duration::from_millis(500));
        assert_eq!(
            x.backoff,
            crate::xds::Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(5),
                factor: 2.0,
                jitter: false,
            }
        );
        assert_eq!(x.max_message_size, Some(1 << 20));
        assert!(x.force_start);
        let tls = x.tls.expect("TLS");
        assert_eq!(tls.cert, Some(PathBuf::from("/certs/tls.crt")));
        assert_eq!(tls.key, Some(PathBuf::from("/certs/tls.key")));
        assert_eq!(tls.ca, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.server_name.as_deref(), Some("eg.local"));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);

        for (name, value) in [
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "-1"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "big"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "soon"),
        ] {
            assert_eq!(
                err(&[("CONFIG_TYPE", "GRPC_XDS_SOTW"), (name, value)]).name,
                name
            );
        }
    }

    #[test]
    fn no_xds_variable_is_unsupported() {
        for (name, support) in VARIABLES {
            if name.starts_with("CONFIG_GRPC_XDS_")
                || name.starts_with("XDS_CLIENT_")
                || *name == "CONFIG_TYPE"
                || *name == "FORCE_START_WITHOUT_INITIAL_CONFIG"
            {
                assert_eq!(*support, Applied, "{name}");
            }
        }
    }

    #[test]
    fn tracing_variables_with_envoys_defaults() {
        assert_eq!(tr(&[("TRACING_SERVICE_NAME", "rl")]).tracing, None);
        let t = tr(&[("TRACING_ENABLED", "true")]).tracing.unwrap();
        assert_eq!(
            t,
            EnvoyTracing {
                grpc: false,
                service_name: "RateLimit".into(),
                service_namespace: None,
                service_instance_id: None,
                sampling_rate: 1.0,
            }
        );
        let t = tr(&[
            ("TRACING_ENABLED", "1"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SERVICE_NAME", "rl"),
            ("TRACING_SERVICE_NAMESPACE", "gw"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ("TRACING_SAMPLING_RATE", "0.25"),
        ]);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        let t = t.tracing.unwrap();
        assert!(t.grpc);
        assert_eq!(t.service_name, "rl");
        assert_eq!(t.service_namespace.as_deref(), Some("gw"));
        assert_eq!(t.service_instance_id.as_deref(), Some("pod-1"));
        assert_eq!(t.sampling_rate, 0.25);
        let e = err(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
        ]);
        assert_eq!(e.name, "TRACING_EXPORTER_PROTOCOL");
        let e = err(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SAMPLING_RATE", "half"),
        ]);
        assert_eq!(e.name, "TRACING_SAMPLING_RATE");
    }
}
