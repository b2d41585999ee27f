//! [`RedisStore`]: connection handling, per-call timeouts, cluster slot groups and refunds.
//!
//! - **Connections.** One multiplexed connection per store (a [`ConnectionManager`], which
//!   reconnects by itself, or a cluster connection, which follows `MOVED`/`ASK` and topology
//!   changes), shared by every concurrent caller: no connection per request, no pool to size.
//! - **Cheap clones.** The store is an `Arc`; clone it into every handler.
//! - **Timeouts.** Every call is bounded by [`RedisOptions::timeout`] (default 50 ms), and a
//!   timeout is reported as [`StoreError::Timeout`], distinct from [`StoreError::Unavailable`], so
//!   a failure policy upstream can tell a slow Redis from an absent one.
//! - **Health.** [`RedisStore::is_healthy`] reports whether the last call succeeded: a cheap
//!   signal for readiness probes and circuit breakers; [`RedisStore::ping`] asks Redis.
//! - **Secrets.** The URL's password is redacted in `Debug` and `Display`.
//! - **Cluster.** Items are grouped by hash slot and each group is one script call, all groups
//!   concurrently. If any group blocks the request, every other group that consumed is refunded
//!   by the same script in refund mode (exact per algorithm, see `scripts/check.lua`), which
//!   also answers the cost-0 queries a blocked request reports.

use crate::keys;
use crate::script::{self, Call, Mode, Reply};
use futures_util::future::join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{CheckItem, Decision, Micros, StoreError};

/// Settings of a [`RedisStore`] (the address and credentials are in the URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Bound on each call (a check, a ping). Default 50 ms.
    pub timeout: Duration,
    /// Bound on establishing a connection. Default 1 s.
    pub connect_timeout: Duration,
    /// First part of every key (`<prefix>:{...}:...`). Default `tollgate`. No braces.
    pub prefix: String,
    /// Added to every key's TTL. Default 0: a key lives exactly until its counter is full again
    /// (rounded up to a millisecond). Replays with an explicit `now` unrelated to the real clock
    /// (tests, `simulate`) set a grace so keys outlive the replay.
    pub ttl_grace: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            prefix: "tollgate".to_owned(),
            ttl_grace: Duration::ZERO,
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

struct Inner {
    conn: Conn,
    opts: RedisOptions,
    url: String,
    script: Script,
    healthy: AtomicBool,
    seed: u64,
    counter: AtomicU64,
}

/// The Redis / Redis Cluster store. Cheap to clone (shared connection).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.url)
            .field("cluster", &self.is_cluster())
            .field("options", &self.inner.opts)
            .field("healthy", &self.is_healthy())
            .finish()
    }
}

impl fmt::Display for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redis store {} (prefix {})",
            self.inner.url, self.inner.opts.prefix
        )
    }
}

/// `url` with the password of its user info replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    // The last `@` anywhere, not only before the first `/`: a password with a raw `/` (not
    // percent-encoded) would otherwise end the authority early and be printed whole. A Redis
    // URL's path is only a database number, so an `@` in it is never anything but userinfo.
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => userinfo.to_owned(),
    };
    format!("{}{}{}", &url[..scheme_end + 3], user, &rest[at..])
}

fn unavailable(e: RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Node URLs of a `redis+cluster://[user:pass@]h1:p1,h2:p2` URL.
fn cluster_nodes(scheme: &str, rest: &str) -> Result<Vec<String>, StoreError> {
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{userinfo}{h}"))
        .collect();
    if nodes.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "no cluster nodes in {}",
            redact(&format!("{scheme}+cluster://{rest}"))
        )));
    }
    Ok(nodes)
}

impl RedisStore {
    /// Connect to `redis://[user:pass@]host:port[/db]`, `rediss://...` (TLS) or
    /// `redis+cluster://[user:pass@]h1:p1,h2:p2` (`rediss+cluster://` for TLS). Fails when the
    /// server cannot be reached within [`RedisOptions::connect_timeout`]; after that, lost
    /// connections are re-established automatically.
    pub async fn connect(url: &str, opts: RedisOptions) -> Result<RedisStore, StoreError> {
        Self::open(url, opts, false).await
    }

    /// Like [`RedisStore::connect`], but a single server (`redis://`, `rediss://`) need not be up
    /// yet: the connection is made by the first call (which fails as unavailable until Redis
    /// answers), so a service can start, and fall back, while Redis is down. A cluster still
    /// needs one reachable node to learn the topology.
    pub async fn connect_lazy(url: &str, opts: RedisOptions) -> Result<RedisStore, StoreError> {
        Self::open(url, opts, true).await
    }

    async fn open(url: &str, opts: RedisOptions, lazy: bool) -> Result<RedisStore, StoreError> {
        if !keys::valid_prefix(&opts.prefix) {
            return Err(StoreError::Unsupported(format!(
                "key prefix {:?} must be non-empty and contain no braces",
                opts.prefix
            )));
        }
        let connecting = async {
            if let Some(rest) = url.strip_prefix("redis+cluster://") {
                Self::connect_cluster("redis", rest, &opts).await
            } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
                Self::connect_cluster("rediss", rest, &opts).await
            } else if url.starts_with("redis://") || url.starts_with("rediss://") {
                let client = redis::Client::open(url).map_err(unavailable)?;
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(opts.connect_timeout))
                    .set_response_timeout(Some(opts.timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(1));
                let cm = if lazy {
                    client.get_connection_manager_lazy(cfg)
                } else {
                    client.get_connection_manager_with_config(cfg).await
                };
                Ok(Conn::Single(cm.map_err(unavailable)?))
            } else {
                Err(StoreError::Unsupported(format!(
                    "store URL {} (expected redis://, rediss://, redis+cluster:// or rediss+cluster://)",
                    redact(url)
                )))
            }
        };
        // Bounded: a server that accepts but never answers must not hang startup.
        let conn = tokio::time::timeout(opts.connect_timeout * 2, connecting)
            .await
            .map_err(|_| StoreError::Timeout(opts.connect_timeout.as_millis() as u64 * 2))??;
        let rs = std::collections::hash_map::RandomState::new();
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                url: redact(url),
                opts,
                script: script::script(),
                healthy: AtomicBool::new(!lazy),
                seed: rs.hash_one(0x746f6c6cu32),
                counter: AtomicU64::new(0),
            }),
        })
    }

    async fn connect_cluster(
        scheme: &str,
        rest: &str,
        opts: &RedisOptions,
    ) -> Result<Conn, StoreError> {
        let nodes = cluster_nodes(scheme, rest)?;
        let client = ClusterClient::builder(nodes)
            .connection_timeout(opts.connect_timeout)
            .response_timeout(opts.timeout)
            .build()
            .map_err(unavailable)?;
        let conn = client.get_async_connection().await.map_err(unavailable)?;
        Ok(Conn::Cluster(conn))
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// Whether the last call to Redis succeeded (no I/O: for readiness and circuit breakers).
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    /// The store URL with its password redacted.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The options the store was created with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.opts
    }

    /// The SHA1 of the check script (what `EVALSHA` names).
    pub fn script_sha(&self) -> &str {
        self.inner.script.get_hash()
    }

    /// Round trip to Redis (every master of a cluster is reached by normal traffic; this pings
    /// one node).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("PING");
        cmd.arg("tollgate");
        let r = self.query::<String>(&cmd).await.map(|_| ());
        self.record(r)
    }

    /// One command, bounded by the timeout.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.bounded(async {
            match self.inner.conn.clone() {
                Conn::Single(mut c) => cmd.query_async::<T>(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async::<T>(&mut c).await,
            }
        })
        .await
    }

    fn record<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        let ok = !matches!(r, Err(StoreError::Timeout(_) | StoreError::Unavailable(_)));
        self.inner.healthy.store(ok, Ordering::Relaxed);
        r
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        let t = self.inner.opts.timeout;
        match tokio::time::timeout(t, fut).await {
            Err(_) => Err(StoreError::Timeout(t.as_millis() as u64)),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout(t.as_millis() as u64)),
            Ok(r) => r.map_err(unavailable),
        }
    }

    /// One script call: `EVALSHA`, and after `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`)
    /// `EVAL` with the source, which cannot fail that way and caches the script again. (A
    /// load-then-`EVALSHA` retry races with a concurrent flush: seen under load.)
    async fn run(&self, call: &Call<'_>, part: &[script::Entry<'_>]) -> Result<Reply, StoreError> {
        let (keys, args) = script::arguments(call, part);
        let cmd = |name: &str, script: &str| {
            let mut c = redis::cmd(name);
            c.arg(script).arg(keys.len()).arg(&keys).arg(&args);
            c
        };
        let evalsha = cmd("EVALSHA", self.script_sha());
        // Built only after NOSCRIPT: it carries the whole script source (tens of KB).
        let eval = || cmd("EVAL", script::SOURCE);
        let v: Vec<i64> = self
            .bounded(async {
                match self.inner.conn.clone() {
                    Conn::Single(mut c) => eval_or_load(&mut c, &evalsha, eval).await,
                    Conn::Cluster(mut c) => eval_or_load(&mut c, &evalsha, eval).await,
                }
            })
            .await?;
        script::decode(&v, part.len())
    }

    fn next_reqid(&self) -> String {
        let n = self.inner.counter.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:x}", self.inner.seed)
    }

    /// Delete the Redis keys of the given counters (`(counter key, quota)` as in
    /// [`CheckItem`]) and return how many existed: cleanup after a replay under a throwaway
    /// prefix (`simulate`). One `DEL` per key, so it routes on a cluster.
    pub async fn delete_counters<'a>(
        &self,
        counters: impl IntoIterator<Item = (&'a str, &'a tollgate_core::Quota)>,
    ) -> Result<u64, StoreError> {
        let mut n = 0;
        for (key, quota) in counters {
            let (main, aux) = keys::counter_keys(&self.inner.opts.prefix, key, quota);
            for k in std::iter::once(main).chain(aux) {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(k);
                n += self.query::<u64>(&cmd).await?;
            }
        }
        Ok(n)
    }

    /// Check and (all-or-nothing) consume `items`, at `now` or, when `None`, at the Redis
    /// server's time. One decision per item, in order, identical to what
    /// [`tollgate_core::MemoryStore`] decides for the same history.
    pub async fn check(
        &self,
        now: Option<Micros>,
        items: &[CheckItem<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        script::validate(items, now)?;
        let r = self.check_valid(now, items).await;
        self.record(r)
    }

    async fn check_valid(
        &self,
        now: Option<Micros>,
        items: &[CheckItem<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        let prefix = &self.inner.opts.prefix;
        let keys: Vec<keys::CounterKeys> = items
            .iter()
            .map(|i| keys::counter_keys(prefix, i.key, i.quota))
            .collect();
        let reqid = self.next_reqid();
        let call = Call {
            now,
            reqid: &reqid,
            mode: Mode::Check,
            single: items.len() == 1,
            grace_ms: self.inner.opts.ttl_grace.as_millis() as u64,
        };
        let all: Vec<script::Entry<'_>> = items
            .iter()
            .zip(&keys)
            .enumerate()
            .map(|(i, (it, k))| (i, it, k))
            .collect();

        // Group by slot (cluster only); a standalone server takes everything in one call.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        if self.is_cluster() {
            for (i, (main, _)) in keys.iter().enumerate() {
                let s = keys::slot(main);
                match groups.iter_mut().find(|(gs, _)| *gs == s) {
                    Some((_, g)) => g.push(i),
                    None => groups.push((s, vec![i])),
                }
            }
        }
        if groups.len() <= 1 {
            return Ok(self.run(&call, &all).await?.decisions);
        }

        let call_ref = &call;
        let calls = groups.iter().map(|(_, g)| {
            let part: Vec<_> = g.iter().map(|&i| all[i]).collect();
            async move { self.run(call_ref, &part).await }
        });
        let replies = join_all(calls).await;
        let mut failed = replies
            .iter()
            .find_map(|r| r.as_ref().err())
            .map(|e| match e {
                StoreError::Timeout(ms) => StoreError::Timeout(*ms),
                StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
                StoreError::Unsupported(m) => StoreError::Unsupported(m.clone()),
            });
        let blocked = failed.is_some() || replies.iter().flatten().any(|r| r.blocked);
        let mut decisions = vec![Decision::default(); items.len()];
        for ((_, g), reply) in groups.iter().zip(&replies) {
            let Ok(reply) = reply else { continue };
            for (&i, d) in g.iter().zip(&reply.decisions) {
                decisions[i] = *d;
            }
            if !blocked || reply.blocked {
                continue;
            }
            // This group committed but the request is blocked (or failed) elsewhere: give back
            // what it consumed and report cost-0 queries, as a blocked request does.
            let undo: Vec<usize> = g
                .iter()
                .copied()
                .filter(|&i| decisions[i].allowed && items[i].cost > 0)
                .collect();
            if undo.is_empty() {
                continue;
            }
            let part: Vec<_> = undo.iter().map(|&i| all[i]).collect();
            let refund = Call {
                now: Some(reply.now),
                mode: Mode::Refund,
                single: false,
                ..call
            };
            // Keep refunding the other groups even if this one fails; report the first error.
            match self.run(&refund, &part).await {
                Ok(r) => {
                    for (&i, d) in undo.iter().zip(&r.decisions) {
                        decisions[i] = *d;
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(decisions),
        }
    }
}

/// `evalsha`, or `eval` when the server does not know the script.
async fn eval_or_load(
    c: &mut impl redis::aio::ConnectionLike,
    evalsha: &redis::Cmd,
    eval: impl FnOnce() -> redis::Cmd,
) -> Result<Vec<i64>, RedisError> {
    match evalsha.query_async(c).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            eval().query_async(c).await
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://user:s3cret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis+cluster://u:p@a:1,b:2"),
            "redis+cluster://u:***@a:1,b:2"
        );
        // Regression: a raw `/` in the password ended the authority early and the URL was
        // printed whole.
        assert_eq!(
            redact("redis://u:pa/ss@host:6379/0"),
            "redis://u:***@host:6379/0"
        );
        assert_eq!(redact("redis://:a@b/c@h:1"), "redis://:***@h:1");
        let o = RedisOptions::default();
        assert!(!format!("{o:?}").contains("s3cret"));
    }

    #[test]
    fn cluster_urls_keep_credentials_per_node() {
        assert_eq!(
            cluster_nodes("redis", "u:p@a:1,b:2").unwrap(),
            ["redis://u:p@a:1", "redis://u:p@b:2"]
        );
        assert_eq!(cluster_nodes("rediss", "a:1").unwrap(), ["rediss://a:1"]);
        assert!(cluster_nodes("redis", "").is_err());
    }
}
