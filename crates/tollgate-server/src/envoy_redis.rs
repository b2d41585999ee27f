//! envoyproxy/ratelimit's `REDIS_*` environment variables translated into tollgate's store
//! settings (a `--store` URL, the deny cache, the call timeout), so an envoy profile can keep a
//! deployment's environment unchanged.
//!
//! The translation is a pure function of a map ([`redis_from_env`]): the caller passes the
//! environment in, logs the returned warnings once, and fails start-up on an error. Variables
//! that tune envoy's connection pool (tollgate multiplexes one connection per node) are accepted
//! with a warning; settings tollgate cannot honour (Sentinel, a second Redis for per-second
//! limits, TLS client certificates) are errors naming the variable, never silently dropped.

use crate::envoy_stats::{env_bool, env_get, parse_go_duration, EnvError};
use std::collections::HashMap;
use std::time::Duration;

/// The store settings read from envoyproxy/ratelimit's `REDIS_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyRedis {
    /// tollgate's `--store` URL: `redis://`, `rediss://`, `redis+cluster://`,
    /// `rediss+cluster://` or `redis+unix:///path`, credentials percent-encoded in it.
    pub store: String,
    /// `REDIS_TIMEOUT` when set (`--redis-timeout-ms`). Unset keeps tollgate's own default
    /// rather than envoy's 10 s: a stuck Redis would otherwise hold every request that long
    /// before the failure policy decides.
    pub timeout: Option<Duration>,
    /// `LOCAL_CACHE_SIZE_IN_BYTES` > 0: `--local-deny-cache` (tollgate's deny cache holds only
    /// keys known to be over their limit, until their window ends, so its size is bounded by
    /// those keys rather than by a byte budget).
    pub deny_cache: bool,
    /// Variables accepted but without effect, as `(variable, why)`: log each once.
    pub warnings: Vec<(String, String)>,
}

impl EnvoyRedis {
    /// Set `config`'s store, Redis timeout (when `REDIS_TIMEOUT` was set) and deny cache
    /// (warnings are the caller's to log).
    pub fn apply_to(&self, config: &mut crate::serve::ServeConfig) {
        config.store = self.store.clone();
        if let Some(t) = self.timeout {
            config.redis_timeout = t;
        }
        config.redis.deny_cache = self.deny_cache;
    }
}

/// Variables of envoy's connection pool that have no counterpart in tollgate.
const POOL_ONLY: [&str; 10] = [
    "REDIS_POOL_SIZE",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "REDIS_SENTINEL_AUTH",
];

/// Per-second Redis variables, read by envoyproxy/ratelimit only with `REDIS_PERSECOND=true`.
const PER_SECOND: [&str; 12] = [
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
];

/// Every variable [`redis_from_env`] reads (so a profile can tell unknown ones apart).
pub fn known_variables() -> impl Iterator<Item = &'static str> {
    [
        "REDIS_SOCKET_TYPE",
        "REDIS_TYPE",
        "REDIS_URL",
        "REDIS_AUTH",
        "REDIS_TLS",
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_TIMEOUT",
        "REDIS_PERSECOND",
        "LOCAL_CACHE_SIZE_IN_BYTES",
    ]
    .into_iter()
    .chain(POOL_ONLY)
    .chain(PER_SECOND)
}

/// Percent-encode everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `host:port` of `REDIS_URL`; envoy dials it as given, so only a shape check here.
fn host_port<'a>(var: &str, url: &str, node: &'a str) -> Result<&'a str, EnvError> {
    let node = node.trim();
    match node.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(node),
        _ => Err(EnvError::new(
            var,
            url,
            format!("'{node}' is not host:port"),
        )),
    }
}

/// envoyproxy/ratelimit's Redis settings in `env`, with its defaults (a unix socket at
/// `/var/run/nutcracker/ratelimit.sock`, SINGLE, no auth, no TLS).
pub fn redis_from_env(env: &HashMap<String, String>) -> Result<EnvoyRedis, EnvError> {
    let mut warnings = Vec::new();
    let socket = env_get(env, "REDIS_SOCKET_TYPE").unwrap_or("unix");
    let kind = env_get(env, "REDIS_TYPE").unwrap_or("SINGLE");
    let url = env_get(env, "REDIS_URL").unwrap_or("/var/run/nutcracker/ratelimit.sock");
    let auth = env_get(env, "REDIS_AUTH");
    let tls = env_bool(env, "REDIS_TLS", false)?;
    let skip_verify = env_bool(env, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?;

    if env_bool(env, "REDIS_PERSECOND", false)? {
        return Err(EnvError::new(
            "REDIS_PERSECOND",
            "true",
            "a second Redis for per-second limits is not supported: unset REDIS_PERSECOND \
             (per-second limits then share REDIS_URL's Redis)",
        ));
    }
    for var in PER_SECOND {
        if env_get(env, var).is_some() {
            warnings.push((var.into(), "ignored: REDIS_PERSECOND is not true".into()));
        }
    }
    for var in POOL_ONLY {
        if env_get(env, var).is_some() {
            warnings.push((
                var.into(),
                "not applicable: tollgate multiplexes one connection per Redis node".into(),
            ));
        }
    }
    if tls {
        for var in ["REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY"] {
            if let Some(v) = env_get(env, var) {
                return Err(EnvError::new(
                    var,
                    v,
                    "TLS client certificates for Redis are not supported",
                ));
            }
        }
        if let Some(v) = env_get(env, "REDIS_TLS_CACERT") {
            return Err(EnvError::new(
                "REDIS_TLS_CACERT",
                v,
                "not read: export SSL_CERT_FILE with this path instead (read at start-up)",
            ));
        }
        if skip_verify {
            warnings.push((
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(),
                "Redis TLS certificates are not verified at all (not only the host name)".into(),
            ));
        }
    }

    // `user:pass` (split at the first colon) or a bare password, as envoy reads REDIS_AUTH.
    let creds = auth.map(|a| match a.split_once(':') {
        Some((u, p)) => (Some(u), p),
        None => (None, a),
    });
    let userinfo = match creds {
        None => String::new(),
        Some((user, pass)) => format!("{}:{}@", encode(user.unwrap_or("")), encode(pass)),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let fragment = if tls && skip_verify { "#insecure" } else { "" };

    let store = match kind.to_ascii_lowercase().as_str() {
        "single" => match socket {
            "unix" => {
                if tls {
                    return Err(EnvError::new(
                        "REDIS_TLS",
                        "true",
                        "TLS over a unix socket is not supported (REDIS_SOCKET_TYPE=unix)",
                    ));
                }
                if !url.starts_with('/') {
                    return Err(EnvError::new(
                        "REDIS_URL",
                        url,
                        "expected an absolute socket path with REDIS_SOCKET_TYPE=unix",
                    ));
                }
                let mut query = Vec::new();
                if let Some((user, pass)) = creds {
                    if let Some(u) = user {
                        query.push(format!("user={}", encode(u)));
                    }
                    query.push(format!("pass={}", encode(pass)));
                }
                let path = encode(url).replace("%2F", "/");
                if query.is_empty() {
                    format!("redis+unix://{path}")
                } else {
                    format!("redis+unix://{path}?{}", query.join("&"))
                }
            }
            "tcp" | "tcp4" | "tcp6" => {
                let node = host_port("REDIS_URL", url, url)?;
                format!("{scheme}://{userinfo}{node}{fragment}")
            }
            other => {
                return Err(EnvError::new(
                    "REDIS_SOCKET_TYPE",
                    other,
                    "expected tcp or unix",
                ))
            }
        },
        "cluster" => {
            let nodes = url
                .split(',')
                .map(|n| host_port("REDIS_URL", url, n))
                .collect::<Result<Vec<_>, _>>()?;
            if !fragment.is_empty() {
                warnings.push((
                    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(),
                    "not applied to a cluster: certificates are verified".into(),
                ));
            }
            format!("{scheme}+cluster://{userinfo}{}", nodes.join(","))
        }
        "sentinel" => {
            return Err(EnvError::new(
                "REDIS_TYPE",
                kind,
                "Redis Sentinel is not supported: point REDIS_URL at the master with \
                 REDIS_TYPE=SINGLE, or use REDIS_TYPE=CLUSTER",
            ))
        }
        _ => {
            return Err(EnvError::new(
                "REDIS_TYPE",
                kind,
                "expected SINGLE, CLUSTER or SENTINEL",
            ))
        }
    };

    let timeout = match env_get(env, "REDIS_TIMEOUT") {
        None => None,
        Some(t) => Some(
            parse_go_duration(t)
                .ok()
                .filter(|d| d.as_millis() >= 1)
                .ok_or_else(|| {
                    EnvError::new("REDIS_TIMEOUT", t, "expected a duration of at least 1ms")
                })?,
        ),
    };
    let cache_text = env_get(env, "LOCAL_CACHE_SIZE_IN_BYTES").unwrap_or("0");
    let cache: i64 = cache_text.parse().map_err(|_| {
        EnvError::new(
            "LOCAL_CACHE_SIZE_IN_BYTES",
            cache_text,
            "expected a number of bytes",
        )
    })?;
    Ok(EnvoyRedis {
        store,
        timeout,
        deny_cache: cache > 0,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy_stats::tests::env;

    #[test]
    fn store_urls_from_envoy_variables() {
        let table: &[(&[(&str, &str)], &str)] = &[
            (&[], "redis+unix:///var/run/nutcracker/ratelimit.sock"),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "localhost:6379"),
                ],
                "redis://localhost:6379",
            ),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "redis.svc:6380"),
                    ("REDIS_AUTH", "p@ss/w:rd"),
                    ("REDIS_TLS", "true"),
                ],
                "rediss://p%40ss%2Fw:rd@redis.svc:6380",
            ),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "r:1"),
                    ("REDIS_AUTH", "secret"),
                ],
                "redis://:secret@r:1",
            ),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "r:1"),
                    ("REDIS_TLS", "1"),
                    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
                ],
                "rediss://r:1#insecure",
            ),
            (
                &[
                    ("REDIS_TYPE", "cluster"),
                    ("REDIS_URL", "a:7000,b:7001, c:7002"),
                    ("REDIS_AUTH", "u:p"),
                ],
                "redis+cluster://u:p@a:7000,b:7001,c:7002",
            ),
            (
                &[("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "u:p w")],
                "redis+unix:///run/redis.sock?user=u&pass=p%20w",
            ),
        ];
        for (vars, want) in table {
            let got = redis_from_env(&env(vars)).unwrap_or_else(|e| panic!("{vars:?}: {e}"));
            assert_eq!(got.store, *want, "{vars:?}");
        }
    }

    #[test]
    fn unsupported_or_invalid_settings_name_their_variable() {
        let table: &[(&[(&str, &str)], &str)] = &[
            (
                &[("REDIS_TYPE", "SENTINEL"), ("REDIS_URL", "m,s1:26379")],
                "REDIS_TYPE",
            ),
            (&[("REDIS_TYPE", "ring")], "REDIS_TYPE"),
            (&[("REDIS_PERSECOND", "true")], "REDIS_PERSECOND"),
            (&[("REDIS_SOCKET_TYPE", "udp")], "REDIS_SOCKET_TYPE"),
            (
                &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "nohostport")],
                "REDIS_URL",
            ),
            (&[("REDIS_URL", "relative.sock")], "REDIS_URL"),
            (&[("REDIS_TLS", "true")], "REDIS_TLS"),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "r:1"),
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
                ],
                "REDIS_TLS_CLIENT_CERT",
            ),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "r:1"),
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_CACERT", "/ca.pem"),
                ],
                "REDIS_TLS_CACERT",
            ),
            (&[("REDIS_TIMEOUT", "soon")], "REDIS_TIMEOUT"),
            (
                &[("LOCAL_CACHE_SIZE_IN_BYTES", "big")],
                "LOCAL_CACHE_SIZE_IN_BYTES",
            ),
        ];
        for (vars, var) in table {
            let e = redis_from_env(&env(vars)).expect_err(var);
            assert_eq!(e.var, *var, "{vars:?}: {e}");
        }
    }

    #[test]
    fn timeout_cache_and_warnings() {
        let r = redis_from_env(&env(&[
            ("REDIS_TIMEOUT", "250ms"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
            ("REDIS_POOL_SIZE", "20"),
            ("REDIS_PIPELINE_WINDOW", "150us"),
            ("REDIS_PERSECOND_URL", "x:1"),
        ]))
        .unwrap();
        assert_eq!(r.timeout, Some(Duration::from_millis(250)));
        assert!(r.deny_cache);
        let vars: Vec<&str> = r.warnings.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(
            vars,
            [
                "REDIS_PERSECOND_URL",
                "REDIS_POOL_SIZE",
                "REDIS_PIPELINE_WINDOW"
            ]
        );
        let r = redis_from_env(&env(&[])).unwrap();
        assert_eq!(
            (r.timeout, r.deny_cache, r.warnings.len()),
            (None, false, 0)
        );
        assert!(known_variables().any(|v| v == "REDIS_PERSECOND_TLS"));
    }
}
