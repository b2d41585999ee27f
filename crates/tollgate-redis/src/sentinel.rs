//! Redis Sentinel: the store URL `redis+sentinel://[user:pass@]s1:26379,s2:26379/master[/db]`
//! and a connection that follows the master through failovers.
//!
//! The master's address is asked of the sentinels (the `redis` crate's sentinel client: the
//! first sentinel that answers names the master, which must then confirm its role), and one
//! multiplexed, self-reconnecting connection ([`ConnectionManager`]) is kept to it. After a
//! failover the old master refuses connections or turns into a replica (writes fail with
//! `READONLY`); the store reports such outage-kind failures here ([`SentinelConn::suspect`]),
//! which asks the sentinels again in the background (one discovery at a time, at most one per
//! [`REDISCOVER_GAP`]) and swaps in a connection to the new master when the answer changed.
//! Until then the failures go to the caller (tollgate-server's breaker and failure policy), so
//! a failover costs a few degraded decisions, not a restart. No background polling: a
//! healthy master is never second-guessed.
//!
//! Credentials: the URL's user info is for the master (as `REDIS_AUTH`), the `sentinel_user`
//! and `sentinel_pass` query parameters for the sentinels (as `REDIS_SENTINEL_AUTH`).
//! `rediss+sentinel://` uses TLS to the sentinels and the master alike (`#insecure`: no
//! certificate verification), as envoyproxy/ratelimit's `REDIS_TLS` does.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{ErrorKind, IntoConnectionInfo, RedisError, RedisResult, TlsMode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Least time between two discoveries started by failures (a failover in progress keeps
/// naming the old master for a while; no need to ask on every failed request).
pub(crate) const REDISCOVER_GAP: Duration = Duration::from_millis(100);

/// The parts of a `redis+sentinel://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// The master's name, as the sentinels know it.
    pub master: String,
    /// The sentinels' node URLs (`redis://` or `rediss://`, with the sentinels' credentials).
    pub sentinels: Vec<String>,
    /// A URL carrying the master's credentials and database (its host is a placeholder).
    pub master_settings: String,
    /// TLS to the master: `None`, or whether certificates go unverified.
    pub tls: Option<bool>,
}

/// Parse `redis+sentinel://` / `rediss+sentinel://` (the `+sentinel` already told apart by
/// the caller). Percent-encoded credentials stay encoded: the `redis` crate decodes them.
pub(crate) fn parse(url: &str) -> Result<SentinelUrl, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("rediss+sentinel://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("redis+sentinel://") {
        (false, r)
    } else {
        return Err("expected redis+sentinel:// or rediss+sentinel://".into());
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    let insecure = match fragment {
        None => false,
        Some("insecure") if tls => true,
        Some(f) => {
            return Err(format!(
                "unknown fragment #{f} (only #insecure, with rediss+sentinel://)"
            ))
        }
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, q),
        None => (rest, ""),
    };
    // The user info ends at the last `@` before the path (a password may hold a raw `@`).
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, p),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let mut path = path.split('/');
    let master = path.next().unwrap_or("");
    if master.is_empty() {
        return Err("no master name: expected redis+sentinel://host:port,.../MASTER_NAME".into());
    }
    let db = match path.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<i64>()
            .map_err(|_| format!("database '{d}' is not a number"))?,
    };
    if path.next().is_some() {
        return Err("expected /MASTER_NAME or /MASTER_NAME/DB after the sentinels".into());
    }
    let (mut s_user, mut s_pass) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sentinel_user", v)) => s_user = Some(v),
            Some(("sentinel_pass" | "sentinel_password", v)) => s_pass = Some(v),
            _ => {
                return Err(format!(
                    "unknown query parameter '{}' (sentinel_user, sentinel_pass)",
                    pair.split('=').next().unwrap_or(pair)
                ))
            }
        }
    }
    let s_userinfo = match (s_user, s_pass) {
        (None, None) => String::new(),
        (u, p) => format!("{}:{}@", u.unwrap_or(""), p.unwrap_or("")),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let frag = if insecure { "#insecure" } else { "" };
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| match h.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(format!("{scheme}://{s_userinfo}{h}{frag}"))
            }
            _ => Err(format!("sentinel '{h}' is not host:port")),
        })
        .collect::<Result<_, _>>()?;
    if sentinels.is_empty() {
        return Err(
            "no sentinels: expected redis+sentinel://host:port,host:port/MASTER_NAME".into(),
        );
    }
    Ok(SentinelUrl {
        master: master.to_owned(),
        sentinels,
        master_settings: format!("redis://{userinfo}sentinel-master/{db}"),
        tls: tls.then_some(insecure),
    })
}

/// The current master and the connection to it.
struct Master {
    addr: String,
    conn: ConnectionManager,
}

/// A connection to whichever server the sentinels name master (see the module docs).
pub(crate) struct SentinelConn {
    name: String,
    node: SentinelNodeConnectionInfo,
    sentinel: tokio::sync::Mutex<Sentinel>,
    current: RwLock<Option<Arc<Master>>>,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
    /// A background discovery is running.
    discovering: AtomicBool,
    /// When the last background discovery started (ms since `epoch`).
    last_start_ms: AtomicU64,
    epoch: Instant,
}

impl SentinelConn {
    /// Set up from a parsed URL; nothing is dialled yet.
    pub(crate) fn new(
        url: &SentinelUrl,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> RedisResult<SentinelConn> {
        let sentinel = Sentinel::build(url.sentinels.clone())?;
        let settings = url
            .master_settings
            .as_str()
            .into_connection_info()?
            .redis_settings()
            .clone();
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(settings)
            .set_tcp_settings(crate::single::tcp_settings());
        if let Some(insecure) = url.tls {
            node = node.set_tls_mode(if insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        Ok(SentinelConn {
            name: url.master.clone(),
            node,
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: RwLock::new(None),
            config,
            connect_timeout,
            discovering: AtomicBool::new(false),
            last_start_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn current(&self) -> Option<Arc<Master>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A connection to the master: the current one, or (none yet) one discovered now.
    pub(crate) async fn master(&self) -> RedisResult<ConnectionManager> {
        if let Some(m) = self.current() {
            return Ok(m.conn.clone());
        }
        // Boxed: the sentinel client's future is deep, and this path is rare (start-up, or no
        // sentinel answered yet); the request path's futures stay small.
        Box::pin(self.discover()).await.map(|m| m.conn.clone())
    }

    /// Ask the sentinels for the master and connect to it when it is not the current one.
    async fn discover(&self) -> RedisResult<Arc<Master>> {
        let mut sentinel = self.sentinel.lock().await;
        let client = tokio::time::timeout(
            self.connect_timeout * 2,
            sentinel.async_master_for(&self.name, Some(&self.node)),
        )
        .await
        .map_err(|_| {
            RedisError::from((
                ErrorKind::Io,
                "timed out asking the Redis Sentinels for the master",
            ))
        })??;
        drop(sentinel);
        let addr = client.get_connection_info().addr().to_string();
        if let Some(m) = self.current().filter(|m| m.addr == addr) {
            return Ok(m);
        }
        let conn = client
            .get_connection_manager_with_config(self.config.clone())
            .await?;
        let master = Arc::new(Master { addr, conn });
        let previous = self
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(master.clone());
        match previous {
            Some(p) => tracing::warn!(
                master = %self.name,
                from = %p.addr,
                to = %master.addr,
                "Redis Sentinel: the master moved (failover)"
            ),
            None => {
                tracing::info!(master = %self.name, at = %master.addr, "Redis Sentinel: master found")
            }
        }
        Ok(master)
    }

    /// A call to the master failed in a way a failover explains (refused, lost, timed out,
    /// read-only): ask the sentinels again in the background, unless a discovery is running or
    /// one started less than [`REDISCOVER_GAP`] ago. Needs a Tokio runtime.
    pub(crate) fn suspect(self: &Arc<Self>) {
        let now_ms = self.epoch.elapsed().as_millis() as u64;
        let last = self.last_start_ms.load(Ordering::Relaxed);
        if last != 0 && now_ms.saturating_sub(last) < REDISCOVER_GAP.as_millis() as u64 {
            return;
        }
        if self
            .discovering
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        self.last_start_ms.store(now_ms.max(1), Ordering::Relaxed);
        let me = self.clone();
        tokio::spawn(async move {
            // A failure leaves the current master in place: the next failure asks again.
            let _ = me.discover().await;
            me.discovering.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse("redis+sentinel://u:p%40ss@a:26379,b:26380/mymaster/2").unwrap();
        assert_eq!(u.master, "mymaster");
        assert_eq!(u.sentinels, ["redis://a:26379", "redis://b:26380"]);
        assert_eq!(u.master_settings, "redis://u:p%40ss@sentinel-master/2");
        assert_eq!(u.tls, None);
        let u =
            parse("rediss+sentinel://s:1/m?sentinel_user=su&sentinel_pass=sp#insecure").unwrap();
        assert_eq!(u.sentinels, ["rediss://su:sp@s:1#insecure"]);
        assert_eq!(u.tls, Some(true));
        assert_eq!(u.master_settings, "redis://sentinel-master/0");
        let u = parse("redis+sentinel://s:1/m?sentinel_pass=x").unwrap();
        assert_eq!(u.sentinels, ["redis://:x@s:1"]);
        for bad in [
            "redis+sentinel://s:1",
            "redis+sentinel://s:1/",
            "redis+sentinel:///m",
            "redis+sentinel://s/m",
            "redis+sentinel://s:1/m/x",
            "redis+sentinel://s:1/m/0/1",
            "redis+sentinel://s:1/m?db=1",
            "redis+sentinel://s:1/m#insecure",
            "redis://s:1/m",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
