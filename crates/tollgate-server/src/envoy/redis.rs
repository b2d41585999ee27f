//! envoyproxy/ratelimit's `REDIS_*` environment variables translated into tollgate's store
//! settings (a `--store` URL, the per-second Redis, the deny cache, the call timeouts), so an
//! envoy profile can keep a deployment's environment unchanged.
//!
//! The translation is a pure function of a map ([`redis_from_env`]): the caller passes the
//! environment in, logs the returned warnings once, and fails start-up on an error. Each of
//! envoy's two Redis (`REDIS_*`, and `REDIS_PERSECOND_*` with `REDIS_PERSECOND=true`) becomes a
//! store URL of the same forms: SINGLE over tcp or a unix socket, CLUSTER, and SENTINEL
//! (`REDIS_URL=master,host:port,...` becomes `redis+sentinel://host:port,.../master`, with
//! `REDIS_SENTINEL_AUTH` as the sentinels' credentials). Variables that tune envoy's connection
//! pool (tollgate multiplexes one connection per node) are accepted with a warning; settings
//! tollgate cannot honour (TLS client certificates) are errors naming the variable, never
//! silently dropped.

use crate::envoy::stats::{env_bool, env_get, parse_go_duration, EnvError};
use std::collections::HashMap;
use std::time::Duration;

/// The store settings read from envoyproxy/ratelimit's `REDIS_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyRedis {
    /// tollgate's `--store` URL: `redis://`, `rediss://`, `redis+cluster://`,
    /// `rediss+cluster://`, `redis+sentinel://`, `rediss+sentinel://` or
    /// `redis+unix:///path`, credentials percent-encoded in it.
    pub store: String,
    /// `REDIS_TIMEOUT` when set (`--redis-timeout-ms`). Unset keeps tollgate's own default
    /// rather than envoy's 10 s: a stuck Redis would otherwise hold every request that long
    /// before the failure policy decides.
    pub(crate) timeout: Option<Duration>,
    /// `REDIS_PERSECOND=true`: the per-second Redis' URL (`--redis-per-second-url`).
    pub(crate) per_second: Option<String>,
    /// `REDIS_PERSECOND_TIMEOUT` when set (`--redis-per-second-timeout-ms`).
    pub(crate) per_second_timeout: Option<Duration>,
    /// `LOCAL_CACHE_SIZE_IN_BYTES` > 0: `--local-deny-cache` (tollgate's deny cache holds only
    /// keys known to be over their limit, until their window ends, so its size is bounded by
    /// those keys rather than by a byte budget).
    pub(crate) deny_cache: bool,
    /// Variables accepted but without effect, as `(variable, why)`: log each once.
    pub(crate) warnings: Vec<(String, String)>,
}

impl EnvoyRedis {
    /// Set `config`'s store, per-second store, Redis timeouts (when set) and deny cache
    /// (warnings are the caller's to log).
    pub(crate) fn apply_to(&self, config: &mut crate::config::ServeConfig) {
        config.store.url = self.store.clone();
        if let Some(t) = self.timeout {
            config.store.timeout = t;
        }
        config.store.per_second_url = self.per_second.clone();
        config.store.per_second_timeout = self.per_second_timeout;
        config.store.redis.deny_cache = self.deny_cache;
    }
}

/// The variables of one of envoy's two Redis.
struct Pool {
    socket: &'static str,
    kind: &'static str,
    url: &'static str,
    auth: &'static str,
    tls: &'static str,
    sentinel_auth: &'static str,
    timeout: &'static str,
    /// envoy's default `*_URL`.
    default_url: &'static str,
    /// Variables of envoy's connection pool, without counterpart in tollgate.
    pool_only: &'static [&'static str],
}

const MAIN: Pool = Pool {
    socket: "REDIS_SOCKET_TYPE",
    kind: "REDIS_TYPE",
    url: "REDIS_URL",
    auth: "REDIS_AUTH",
    tls: "REDIS_TLS",
    sentinel_auth: "REDIS_SENTINEL_AUTH",
    timeout: "REDIS_TIMEOUT",
    default_url: "/var/run/nutcracker/ratelimit.sock",
    pool_only: &[
        "REDIS_POOL_SIZE",
        "REDIS_PIPELINE_WINDOW",
        "REDIS_PIPELINE_LIMIT",
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
    ],
};

const PER_SECOND: Pool = Pool {
    socket: "REDIS_PERSECOND_SOCKET_TYPE",
    kind: "REDIS_PERSECOND_TYPE",
    url: "REDIS_PERSECOND_URL",
    auth: "REDIS_PERSECOND_AUTH",
    tls: "REDIS_PERSECOND_TLS",
    sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
    timeout: "REDIS_PERSECOND_TIMEOUT",
    default_url: "/var/run/nutcracker/ratelimitpersecond.sock",
    pool_only: &[
        "REDIS_PERSECOND_POOL_SIZE",
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    ],
};

impl Pool {
    fn variables(&self) -> impl Iterator<Item = &'static str> + '_ {
        [
            self.socket,
            self.kind,
            self.url,
            self.auth,
            self.tls,
            self.sentinel_auth,
            self.timeout,
        ]
        .into_iter()
        .chain(self.pool_only.iter().copied())
    }
}

/// Every variable [`redis_from_env`] reads (so a profile can tell unknown ones apart).
pub(crate) fn known_variables() -> impl Iterator<Item = &'static str> {
    [
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_PERSECOND",
        "LOCAL_CACHE_SIZE_IN_BYTES",
    ]
    .into_iter()
    .chain(MAIN.variables())
    .chain(PER_SECOND.variables())
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

/// A `host:port` of a URL variable; envoy dials it as given, so only a shape check here.
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

/// `user:pass` (split at the first colon) or a bare password, as envoy reads its AUTH
/// variables.
fn credentials(auth: &str) -> (Option<&str>, &str) {
    match auth.split_once(':') {
        Some((u, p)) => (Some(u), p),
        None => (None, auth),
    }
}

/// A duration variable (at least 1 ms), when set.
fn timeout(env: &HashMap<String, String>, var: &str) -> Result<Option<Duration>, EnvError> {
    match env_get(env, var) {
        None => Ok(None),
        Some(t) => parse_go_duration(t)
            .ok()
            .filter(|d| d.as_millis() >= 1)
            .map(Some)
            .ok_or_else(|| EnvError::new(var, t, "expected a duration of at least 1ms")),
    }
}

/// The store URL of one of envoy's Redis. `skip_verify`: `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`
/// (shared by both, as envoy's one TLS configuration is).
fn pool_url(
    env: &HashMap<String, String>,
    pool: &Pool,
    skip_verify: bool,
    warnings: &mut Vec<(String, String)>,
) -> Result<String, EnvError> {
    let socket = env_get(env, pool.socket).unwrap_or("unix");
    let kind = env_get(env, pool.kind).unwrap_or("SINGLE");
    let url = env_get(env, pool.url).unwrap_or(pool.default_url);
    let creds = env_get(env, pool.auth).map(credentials);
    let tls = env_bool(env, pool.tls, false)?;

    for var in pool.pool_only {
        if env_get(env, var).is_some() {
            warnings.push((
                (*var).into(),
                "not applicable: tollgate multiplexes one connection per Redis node".into(),
            ));
        }
    }
    let sentinel = kind.eq_ignore_ascii_case("sentinel");
    if !sentinel && env_get(env, pool.sentinel_auth).is_some() {
        warnings.push((
            pool.sentinel_auth.into(),
            format!("ignored: {} is not SENTINEL", pool.kind),
        ));
    }

    let userinfo = match creds {
        None => String::new(),
        Some((user, pass)) => format!("{}:{}@", encode(user.unwrap_or("")), encode(pass)),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let fragment = if tls && skip_verify { "#insecure" } else { "" };

    Ok(match kind.to_ascii_lowercase().as_str() {
        "single" => match socket {
            "unix" => {
                if tls {
                    return Err(EnvError::new(
                        pool.tls,
                        "true",
                        format!(
                            "TLS over a unix socket is not supported ({}=unix)",
                            pool.socket
                        ),
                    ));
                }
                if !url.starts_with('/') {
                    return Err(EnvError::new(
                        pool.url,
                        url,
                        format!("expected an absolute socket path with {}=unix", pool.socket),
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
                let node = host_port(pool.url, url, url)?;
                format!("{scheme}://{userinfo}{node}{fragment}")
            }
            other => return Err(EnvError::new(pool.socket, other, "expected tcp or unix")),
        },
        "cluster" => {
            let nodes = url
                .split(',')
                .map(|n| host_port(pool.url, url, n))
                .collect::<Result<Vec<_>, _>>()?;
            if !fragment.is_empty() {
                warnings.push((
                    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(),
                    "not applied to a cluster: certificates are verified".into(),
                ));
            }
            format!("{scheme}+cluster://{userinfo}{}", nodes.join(","))
        }
        // `master,sentinel1:port,...`; the sentinels are dialled over TCP whatever the socket
        // type, with the same TLS setting as the master, as envoy does.
        "sentinel" => {
            let mut parts = url.split(',');
            let master = parts.next().unwrap_or("").trim();
            let nodes = parts
                .map(|n| host_port(pool.url, url, n))
                .collect::<Result<Vec<_>, _>>()?;
            if master.is_empty() || nodes.is_empty() {
                return Err(EnvError::new(
                    pool.url,
                    url,
                    "expected the master name and the sentinels: MASTER,host:port,host:port",
                ));
            }
            let query = match env_get(env, pool.sentinel_auth).map(credentials) {
                None => String::new(),
                Some((None, pass)) => format!("?sentinel_pass={}", encode(pass)),
                Some((Some(user), pass)) => format!(
                    "?sentinel_user={}&sentinel_pass={}",
                    encode(user),
                    encode(pass)
                ),
            };
            format!(
                "{scheme}+sentinel://{userinfo}{}/{}{query}{fragment}",
                nodes.join(","),
                encode(master)
            )
        }
        _ => {
            return Err(EnvError::new(
                pool.kind,
                kind,
                "expected SINGLE, CLUSTER or SENTINEL",
            ))
        }
    })
}

/// envoyproxy/ratelimit's Redis settings in `env`, with its defaults (a unix socket at
/// `/var/run/nutcracker/ratelimit.sock`, SINGLE, no auth, no TLS, no per-second Redis).
pub fn redis_from_env(env: &HashMap<String, String>) -> Result<EnvoyRedis, EnvError> {
    let mut warnings = Vec::new();
    let skip_verify = env_bool(env, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?;
    let per_second = env_bool(env, "REDIS_PERSECOND", false)?;
    let any_tls =
        env_bool(env, MAIN.tls, false)? || (per_second && env_bool(env, PER_SECOND.tls, false)?);

    if any_tls {
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

    let store = pool_url(env, &MAIN, skip_verify, &mut warnings)?;
    let (per_second, per_second_timeout) = if per_second {
        let url = pool_url(env, &PER_SECOND, skip_verify, &mut warnings)?;
        (Some(url), timeout(env, PER_SECOND.timeout)?)
    } else {
        for var in PER_SECOND.variables() {
            if env_get(env, var).is_some() {
                warnings.push((var.into(), "ignored: REDIS_PERSECOND is not true".into()));
            }
        }
        (None, None)
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
        timeout: timeout(env, MAIN.timeout)?,
        per_second,
        per_second_timeout,
        deny_cache: cache > 0,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::stats::tests::env;

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
            // Sentinel: any socket type (envoy dials sentinels over TCP).
            (
                &[
                    ("REDIS_TYPE", "SENTINEL"),
                    ("REDIS_URL", "mymaster,s1:26379, s2:26380"),
                ],
                "redis+sentinel://s1:26379,s2:26380/mymaster",
            ),
            (
                &[
                    ("REDIS_TYPE", "sentinel"),
                    ("REDIS_URL", "m,s1:26379"),
                    ("REDIS_AUTH", "app:p@ss"),
                    ("REDIS_SENTINEL_AUTH", "sent:s/cret"),
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
                ],
                "rediss+sentinel://app:p%40ss@s1:26379/m?sentinel_user=sent&sentinel_pass=s%2Fcret#insecure",
            ),
            (
                &[
                    ("REDIS_TYPE", "SENTINEL"),
                    ("REDIS_URL", "m,s1:1"),
                    ("REDIS_SENTINEL_AUTH", "only-pass"),
                ],
                "redis+sentinel://s1:1/m?sentinel_pass=only-pass",
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
                &[("REDIS_TYPE", "SENTINEL"), ("REDIS_URL", "m")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_TYPE", "SENTINEL"), ("REDIS_URL", ",s1:26379")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_TYPE", "SENTINEL"), ("REDIS_URL", "m,s1")],
                "REDIS_URL",
            ),
            (&[("REDIS_TYPE", "ring")], "REDIS_TYPE"),
            // The per-second Redis' own variables name themselves.
            (
                &[
                    ("REDIS_PERSECOND", "true"),
                    ("REDIS_PERSECOND_URL", "rel.sock"),
                ],
                "REDIS_PERSECOND_URL",
            ),
            (
                &[
                    ("REDIS_PERSECOND", "true"),
                    ("REDIS_PERSECOND_TYPE", "ring"),
                ],
                "REDIS_PERSECOND_TYPE",
            ),
            (
                &[
                    ("REDIS_PERSECOND", "true"),
                    ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
                    ("REDIS_PERSECOND_URL", "r:1"),
                    ("REDIS_PERSECOND_TIMEOUT", "soon"),
                ],
                "REDIS_PERSECOND_TIMEOUT",
            ),
            (
                &[
                    ("REDIS_PERSECOND", "true"),
                    ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
                    ("REDIS_PERSECOND_URL", "r:1"),
                    ("REDIS_PERSECOND_TLS", "true"),
                    ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
                ],
                "REDIS_TLS_CLIENT_CERT",
            ),
            (&[("REDIS_PERSECOND", "maybe")], "REDIS_PERSECOND"),
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
                "REDIS_POOL_SIZE",
                "REDIS_PIPELINE_WINDOW",
                "REDIS_PERSECOND_URL",
            ]
        );
        let r = redis_from_env(&env(&[])).unwrap();
        assert_eq!(
            (r.timeout, r.deny_cache, r.warnings.len(), r.per_second),
            (None, false, 0, None)
        );
        assert!(known_variables().any(|v| v == "REDIS_PERSECOND_TLS"));
        let r = redis_from_env(&env(&[("REDIS_SENTINEL_AUTH", "x")])).unwrap();
        assert_eq!(r.warnings[0].0, "REDIS_SENTINEL_AUTH");
    }

    #[test]
    fn a_second_redis_for_per_second_limits() {
        let r = redis_from_env(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "fast:6380"),
            ("REDIS_PERSECOND_AUTH", "s3cret"),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_PERSECOND_TIMEOUT", "20ms"),
            ("REDIS_PERSECOND_POOL_SIZE", "5"),
            ("REDIS_TIMEOUT", "1s"),
        ]))
        .unwrap();
        assert_eq!(r.store, "redis://main:6379");
        assert_eq!(r.per_second.as_deref(), Some("rediss://:s3cret@fast:6380"));
        assert_eq!(r.per_second_timeout, Some(Duration::from_millis(20)));
        assert_eq!(r.timeout, Some(Duration::from_secs(1)));
        let vars: Vec<&str> = r.warnings.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(vars, ["REDIS_PERSECOND_POOL_SIZE"]);
        // envoy's defaults: a unix socket of its own; Sentinel and Cluster as for REDIS_*.
        let r = redis_from_env(&env(&[("REDIS_PERSECOND", "1")])).unwrap();
        assert_eq!(
            r.per_second.as_deref(),
            Some("redis+unix:///var/run/nutcracker/ratelimitpersecond.sock")
        );
        let r = redis_from_env(&env(&[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "SENTINEL"),
            ("REDIS_PERSECOND_URL", "fast,s:26379"),
            ("REDIS_PERSECOND_SENTINEL_AUTH", "sp"),
        ]))
        .unwrap();
        assert_eq!(
            r.per_second.as_deref(),
            Some("redis+sentinel://s:26379/fast?sentinel_pass=sp")
        );
        let mut config = crate::config::ServeConfig::default();
        r.apply_to(&mut config);
        assert_eq!(config.store.per_second_url, r.per_second);
    }

    #[test]
    fn the_profile_keeps_envoys_key_layout_unless_a_redis_is_a_cluster() {
        use crate::envoy::profile::translate;
        use std::collections::BTreeMap;
        let tr = |pairs: &[(&str, &str)]| {
            let vars: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            translate(&vars, crate::config::ServeConfig::default()).unwrap()
        };
        let t = tr(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "m,s:26379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "fast:6379"),
        ]);
        assert_eq!(t.config.store.url, "redis+sentinel://s:26379/m");
        assert_eq!(
            t.config.store.per_second_url.as_deref(),
            Some("redis://fast:6379")
        );
        assert_eq!(t.config.store.key_layout, tollgate_redis::KeyLayout::Envoy);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        let t = tr(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "CLUSTER"),
            ("REDIS_PERSECOND_URL", "a:7000,b:7001"),
        ]);
        assert_eq!(
            t.config.store.key_layout,
            tollgate_redis::KeyLayout::Tollgate
        );
    }
}
