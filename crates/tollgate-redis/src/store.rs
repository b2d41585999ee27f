//! [`RedisStore`]: connection handling, per-call timeouts, cluster slot groups and refunds.
//!
//! - **Connections.** One multiplexed connection per store (to a single server, replaced when a
//!   request goes unanswered past its bound, see `single.rs`; a cluster connection, which
//!   follows `MOVED`/`ASK` and topology changes; or a connection to the master Redis Sentinel
//!   names, which follows failovers, see `sentinel.rs`), shared by every concurrent caller:
//!   no connection per request, no pool to size. Every socket has TCP keepalive and a user
//!   timeout. A script call that finds its connection closed (a server restarted while idle)
//!   is sent once more on the reconnected one before it counts as a failure.
//! - **Cheap clones.** The store is an `Arc`; clone it into every handler.
//! - **Timeouts.** Every call is bounded by [`RedisOptions::timeout`] (default 50 ms), and a
//!   timeout is reported as [`StoreError::Timeout`], distinct from [`StoreError::Unavailable`], so
//!   a failure policy upstream can tell a slow Redis from an absent one.
//! - **Errors.** Every failure is classified ([`tollgate_core::FaultKind`]: refused, lost,
//!   authentication, no such database, out of memory, `WRONGTYPE`, script, ...) with a message
//!   for humans, so an operator reads "Redis rejected the credentials", not a timeout; a failure
//!   of one key or script call is told apart from an outage ([`tollgate_core::FaultKind::is_outage`]).
//! - **Health.** [`RedisStore::is_healthy`] reports whether the last call reached a working
//!   Redis, [`RedisStore::last_error`] the last failure: cheap signals for readiness and circuit
//!   breakers. [`RedisStore::ping`] asks Redis; [`RedisStore::probe`] does what requests need
//!   (a write with a TTL), so a server that answers `PING` but refuses writes is not "back".
//! - **One function call per request.** The check runs as a Redis Function (`FCALL`, loaded by
//!   the first call that finds it missing: after a start, a restart, `FUNCTION FLUSH` or a
//!   failover to a node without it), or, where the server has no functions (before Redis 7) or
//!   the ACL refuses them, as the same code by `EVALSHA` (`EVAL` after `NOSCRIPT`).
//! - **Coalescing.** One-item checks of the counting algorithms (most requests) that arrive
//!   while calls are in flight go to Redis together, as one call of the batched function
//!   (`coalesce.rs`, `scripts/fast.lua`): an idle store adds no wait, a busy one pays a call's
//!   fixed cost in Redis once per batch. On a cluster there is one waiting line per master
//!   (from the store's slot map, `CLUSTER SLOTS`), and a batch carries keys of several slots
//!   of that master (the batched function's flag `allow-cross-slot-keys`); a request whose key
//!   the node turns out not to serve (a slot moved, or moving) read and wrote nothing there and
//!   goes again on its own, by the general path, which follows `MOVED` and `ASK`.
//! - **Secrets.** The URL's password is redacted in `Debug` and `Display`.
//! - **Cluster.** Items are grouped by hash slot and each group is one script call, all groups
//!   concurrently. If any group blocks the request, every other group that consumed is refunded
//!   by the same script in refund mode (exact per algorithm, see `scripts/check.lua`), which
//!   also answers the cost-0 queries a blocked request reports.
//! - **Split requests.** A caller that sends one request's items to two stores (per-second
//!   limits on their own Redis) gets a [`Receipt`] with each check
//!   ([`RedisStore::check_refundable`]) and gives back what one store admitted when the other
//!   blocked the request ([`RedisStore::refund`]), with the same refund mode.

use crate::coalesce::{self, Coalescer, Job, Outcome};
use crate::keys::{self, KeyLayout};
use crate::script::{self, Call, FastItem, Mode, Reply};
use crate::sentinel::{self, SentinelConn};
use crate::single::{self, SingleConn};
use futures_util::future::join_all;
use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tollgate_core::store::consumes;
use tollgate_core::{CheckItem, Decision, FaultKind, Micros, StoreError};

/// Settings of a [`RedisStore`] (the address and credentials are in the URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Bound on each call (a check, a ping). Default 50 ms.
    pub timeout: Duration,
    /// Bound on establishing a connection. Default 1 s.
    pub connect_timeout: Duration,
    /// First part of every key (`<prefix>:{...}:...`). Default `tollgate`. No braces.
    pub prefix: String,
    /// How long [`RedisStore::check_within`] callers may let a call go on past `timeout` (the
    /// connection's own response timeout is `timeout + patience`). Default 1 s.
    pub patience: Duration,
    /// Added to every key's TTL. Default 0: a key lives exactly until its counter is full again
    /// (rounded up to a millisecond). Replays with an explicit `now` unrelated to the real clock
    /// (tests, `simulate`) set a grace so keys outlive the replay.
    pub ttl_grace: Duration,
    /// Where envoy_fixed_window counters live (see [`KeyLayout`]). Default tollgate's.
    pub key_layout: KeyLayout,
    /// [`KeyLayout::Envoy`]: a random extra of up to this (exclusive, whole seconds) on each
    /// counter's `EXPIRE`, as envoy's `EXPIRATION_JITTER_MAX_SECONDS`. Default 0.
    pub expiration_jitter: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            prefix: "tollgate".to_owned(),
            patience: Duration::from_secs(1),
            ttl_grace: Duration::ZERO,
            key_layout: KeyLayout::Tollgate,
            expiration_jitter: Duration::ZERO,
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(Arc<SingleConn>),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConn>),
}

/// What a [`RedisStore::check_refundable`] call did, for [`RedisStore::refund`]: its request id
/// (tags sliding-log entries) and the instant each item was checked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    reqid: String,
    now: Vec<Micros>,
}

impl Receipt {
    /// A receipt for units counted at Redis time `at` with no request id (a lease's: its
    /// windows' counters keep no request ids).
    pub(crate) fn at(at: Micros) -> Self {
        Self::at_each(vec![at])
    }

    /// A receipt with no request id for items counted at these Redis times.
    fn at_each(now: Vec<Micros>) -> Self {
        Receipt {
            reqid: String::new(),
            now,
        }
    }

    /// Redis' time of each item's check.
    pub(crate) fn times(&self) -> &[Micros] {
        &self.now
    }
}

struct Inner {
    conn: Conn,
    opts: RedisOptions,
    url: String,
    script: Script,
    /// The Redis Function's name (see `script::function_name`).
    function: String,
    /// Its batched one-item check's name (`script::fast_function`), made once.
    fast_function: String,
    /// Whether to try the function (cleared for good when the server cannot run functions).
    functions: AtomicBool,
    healthy: AtomicBool,
    last_error: Mutex<Option<LastError>>,
    seed: u64,
    counter: AtomicU64,
    /// One-item checks waiting for their batch (see `coalesce.rs`); on a cluster, see `slots`.
    coalescer: Arc<Coalescer>,
    /// A cluster's slot map: which master serves each slot, and that master's waiting line
    /// (`None` until first learned).
    slots: std::sync::RwLock<Option<Arc<SlotMap>>>,
    /// Whether a refresh of `slots` is under way.
    refreshing: AtomicBool,
    /// Batched calls sent, and the requests they carried.
    fast_calls: AtomicU64,
    fast_requests: AtomicU64,
    /// Requests of cluster batches sent again on their own (see [`Coalescing::resent`]).
    fast_resent: AtomicU64,
}

/// What a request that waited for its batch learned (the sender dropped: its task ended).
fn waited(r: Result<Outcome, tokio::sync::oneshot::error::RecvError>) -> Outcome {
    r.unwrap_or_else(|_| {
        Outcome::Failed(StoreError::Unavailable(
            "the batch carrying this check was dropped".into(),
        ))
    })
}

/// A request sent by itself ([`Coalescer::try_alone`]) holds one of its line's sending slots
/// until it is done or dropped: then the slot goes to a sender if requests wait meanwhile.
struct Slot<'a>(&'a RedisStore, &'a Arc<Coalescer>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.1.release() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(self.0.clone().drive(self.1.clone()));
                }
                // No runtime (shutting down): give the slot back; the next request starts a
                // sender for those waiting.
                Err(_) => self.1.give_back(),
            }
        }
    }
}

/// Hash slots of a Redis Cluster.
const CLUSTER_SLOTS: u16 = 16_384;
/// Slot-map entry of a slot no master serves (as far as the store knows).
const NO_OWNER: u16 = u16::MAX;

/// Which master of a cluster serves each slot, and each master's waiting line: a batch holds
/// requests of one master only.
struct SlotMap {
    /// Per slot, its master's place in `lines`, or [`NO_OWNER`].
    owner: Vec<u16>,
    /// Per master, its address (`host:port`) and waiting line.
    lines: Vec<(String, Arc<Coalescer>)>,
}

impl SlotMap {
    /// The map of `owners` (as [`RedisStore::slot_owners`] lists them), keeping the waiting
    /// lines of `old` for the masters still there.
    fn new(owners: &[(u16, u16, String)], old: Option<&SlotMap>) -> SlotMap {
        let mut owner = vec![NO_OWNER; usize::from(CLUSTER_SLOTS)];
        let mut lines: Vec<(String, Arc<Coalescer>)> = Vec::new();
        for (first, last, addr) in owners {
            let at = match lines.iter().position(|(a, _)| a == addr) {
                Some(at) => at,
                None => {
                    let line = old
                        .and_then(|m| m.lines.iter().find(|(a, _)| a == addr))
                        .map_or_else(Arc::default, |(_, l)| l.clone());
                    lines.push((addr.clone(), line));
                    lines.len() - 1
                }
            };
            for s in *first..=(*last).min(CLUSTER_SLOTS - 1) {
                owner[usize::from(s)] = at as u16;
            }
        }
        SlotMap { owner, lines }
    }

    /// The waiting line of the master serving `slot`.
    fn line(&self, slot: u16) -> Option<&Arc<Coalescer>> {
        let at = *self.owner.get(usize::from(slot))?;
        self.lines.get(usize::from(at)).map(|(_, l)| l)
    }
}

/// Whether Redis' error for one request of a cluster batch says the node does not serve its key
/// (the slot is another node's, or migrating and the key gone): the script refused the key
/// before reading it, so the request may go again elsewhere.
fn not_this_nodes(message: &str) -> bool {
    message.contains("non local key") || message.starts_with("MOVED") || message.starts_with("ASK")
}

/// Whether a whole cluster call was redirected or refused before it ran (`MOVED`, `ASK`,
/// `TRYAGAIN`, `CROSSSLOT`): none of its requests was counted.
fn not_run(e: &RedisError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(S::Moved | S::Ask | S::TryAgain | S::CrossSlot)
    )
}

/// How one-item checks were coalesced so far ([`RedisStore::coalescing`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Coalescing {
    /// Calls of the batched one-item function.
    pub calls: u64,
    /// Requests those calls carried.
    pub requests: u64,
    /// Requests of a cluster's batches that the node did not serve (its slot moved, or was
    /// moving, since the store learned the slot map): they read and wrote nothing there, and
    /// went again on their own.
    pub resent: u64,
}

/// The last failure of a store (see [`RedisStore::last_error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    /// Its kind.
    pub kind: FaultKind,
    /// Its message (no secrets).
    pub message: String,
    /// When it happened, in milliseconds since the Unix epoch.
    pub at_ms: u64,
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

/// `url` with the password of its user info (or of its `pass=` query parameter, the form of a
/// `redis+unix://` URL) replaced by `***`.
pub fn redact(url: &str) -> String {
    // Sentinel URLs: the sentinels' password is a query parameter, the master's in user info.
    if url.contains("+sentinel://") {
        let (main, fragment) = match url.split_once('#') {
            Some((m, f)) => (m, format!("#{f}")),
            None => (url, String::new()),
        };
        if let Some((head, query)) = main.split_once('?') {
            let query: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k @ ("sentinel_pass" | "sentinel_password"), _)) => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            return format!("{}?{}{fragment}", redact(head), query.join("&"));
        }
    }
    // Only a unix URL: elsewhere a raw `?` may sit inside a password.
    if let Some((head, query)) = url
        .strip_prefix("redis+unix://")
        .and_then(|_| url.split_once('?'))
    {
        let query: Vec<String> = query
            .split('&')
            .map(|p| match p.strip_prefix("pass=") {
                Some(_) => "pass=***".to_string(),
                None => p.to_string(),
            })
            .collect();
        return format!("{head}?{}", query.join("&"));
    }
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

/// `e` as a typed [`StoreError`] with a message for humans. `url` is the redacted store URL.
pub(crate) fn classify(e: &RedisError, url: &str) -> StoreError {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let detail = e.detail().unwrap_or("").trim();
    let code = e.code().unwrap_or("");
    let failed = |kind: FaultKind, message: String| StoreError::Failed { kind, message };
    if e.is_timeout() {
        return StoreError::Timeout(0);
    }
    if matches!(
        e.kind(),
        K::MasterNameNotFoundBySentinel | K::EmptySentinelList
    ) {
        return failed(
            FaultKind::ConnectionLost,
            format!(
                "no Redis Sentinel of {url} names a reachable master of that name (a failover under way, or a wrong master name): {}",
                first_line(&e.to_string())
            ),
        );
    }
    if e.is_connection_refusal() {
        return failed(
            FaultKind::ConnectionRefused,
            format!("cannot connect to Redis at {url}: connection refused (is it running?)"),
        );
    }
    let text = e.to_string();
    if e.kind() == K::AuthenticationFailed
        || matches!(code, "NOAUTH" | "WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("WRONGPASS")
    {
        return failed(
            FaultKind::AuthFailed,
            format!("Redis at {url} rejected the credentials (authentication failed): check the user and password in the store URL"),
        );
    }
    if text.contains("DB index is out of range") || text.contains("invalid DB index") {
        let db = url.rsplit_once('/').map_or("", |(_, db)| db);
        return failed(
            FaultKind::NoSuchDb,
            format!("Redis at {url} has no database {db} (SELECT failed: DB index is out of range): check the database number in the store URL"),
        );
    }
    match (e.kind(), code) {
        (K::Server(S::NoPerm), _) | (_, "NOPERM") => failed(
            FaultKind::NoPermission,
            format!("the Redis user lacks a permission the rate-limit script needs: {detail}"),
        ),
        // Through a cluster or Sentinel, READONLY is a failover under way (a replica answers
        // for a master that is gone), not a wrong URL.
        (K::Server(S::ReadOnly), _) if url.contains("+cluster://") => failed(
            FaultKind::ReadOnly,
            format!("a node of the Redis Cluster at {url} answered READONLY: a master is down or being replaced (failover under way); the cluster connection follows the new master when it is promoted"),
        ),
        (K::Server(S::ReadOnly), _) if url.contains("+sentinel://") => failed(
            FaultKind::ReadOnly,
            format!("the master Redis Sentinel named for {url} is a replica now (failover under way): asking the sentinels for the new master"),
        ),
        (K::Server(S::ReadOnly), _) => failed(
            FaultKind::ReadOnly,
            format!("Redis at {url} is a read-only replica: point the store URL at the primary"),
        ),
        (K::Server(S::BusyLoading), _) => failed(
            FaultKind::Busy,
            format!("Redis at {url} is loading its data set and cannot serve yet"),
        ),
        (K::Server(S::ClusterDown | S::MasterDown), _) => failed(
            FaultKind::ConnectionLost,
            format!("the Redis Cluster at {url} cannot serve: {}", first_line(&text)),
        ),
        // The cluster client's retries ran out on redirects: the node the slot's owner is said
        // to be cannot be reached (killed, not failed over yet), or the slot map is in flux.
        // An outage of that master, not a fault of the request.
        (K::Server(S::Moved | S::Ask), _) => failed(
            FaultKind::ConnectionLost,
            format!(
                "the Redis Cluster at {url} keeps redirecting to a node it cannot reach (a master down, its slots not failed over yet): {}",
                first_line(&text)
            ),
        ),
        (K::Server(S::TryAgain), _) | (_, "BUSY") => failed(
            FaultKind::Busy,
            format!(
                "Redis at {url} is busy (a long-running script, or a cluster slot moving): {}",
                first_line(&text)
            ),
        ),
        (_, "OOM") => failed(
            FaultKind::OutOfMemory,
            format!("Redis at {url} is out of memory and refuses writes (maxmemory reached with a noeviction policy): counters cannot be updated"),
        ),
        (_, "WRONGTYPE") => failed(
            FaultKind::WrongType,
            "a counter key in Redis holds a value of another type (WRONGTYPE): something else writes under the key prefix; delete the key or use another --redis-prefix".to_string(),
        ),
        (K::Io | K::ClusterConnectionNotFound, _) => failed(
            FaultKind::ConnectionLost,
            format!("lost the connection to Redis at {url}: {}", io_reason(e)),
        ),
        _ if text.contains("user_script") || text.contains("Error running script") => failed(
            FaultKind::Script,
            format!("the rate-limit script failed in Redis: {}", first_line(&text)),
        ),
        _ if e.is_connection_dropped() => failed(
            FaultKind::ConnectionLost,
            format!("lost the connection to Redis at {url}: {}", io_reason(e)),
        ),
        _ => failed(
            FaultKind::Other,
            format!("Redis at {url} answered with an error: {}", first_line(&text)),
        ),
    }
}

/// The reason of an I/O failure in words (not the client library's debug form).
fn io_reason(e: &RedisError) -> String {
    match e.detail() {
        Some(d) if !d.is_empty() => d.to_string(),
        _ => first_line(&e.to_string())
            .trim_end_matches("- Io")
            .trim_end_matches(" -")
            .to_string(),
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("").trim()
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
    /// Connect to `redis://[user:pass@]host:port[/db]`, `rediss://...` (TLS),
    /// `redis+cluster://[user:pass@]h1:p1,h2:p2` (`rediss+cluster://` for TLS) or
    /// `redis+sentinel://[user:pass@]s1:p1,s2:p2/master[/db]` (`rediss+sentinel://`; the user
    /// info is the master's, the `sentinel_user` and `sentinel_pass` query parameters the
    /// sentinels'). Fails when the server cannot be reached within
    /// [`RedisOptions::connect_timeout`]; after that, lost connections are re-established
    /// automatically (and a Sentinel master followed through failovers).
    pub async fn connect(url: &str, opts: RedisOptions) -> Result<RedisStore, StoreError> {
        Self::open(url, opts, false).await
    }

    /// Like [`RedisStore::connect`], but a single server (`redis://`, `rediss://`) or the
    /// sentinels and master of a `redis+sentinel://` URL need not be up yet: the connection is
    /// made by the first call (which fails as unavailable until Redis answers), so a service can
    /// start, and fall back, while Redis is down. A cluster still needs one reachable node to
    /// learn the topology.
    pub async fn connect_lazy(url: &str, opts: RedisOptions) -> Result<RedisStore, StoreError> {
        Self::open(url, opts, true).await
    }

    async fn open(url: &str, opts: RedisOptions, lazy: bool) -> Result<RedisStore, StoreError> {
        let envoy = opts.key_layout == KeyLayout::Envoy;
        // envoy's CACHE_KEY_PREFIX may be empty; tollgate's keys need a prefix before the tag.
        let usable = if envoy {
            !opts.prefix.contains(['{', '}'])
        } else {
            keys::valid_prefix(&opts.prefix)
        };
        if !usable {
            return Err(StoreError::Unsupported(format!(
                "key prefix {:?} must contain no braces (and, with tollgate's key layout, not be empty)",
                opts.prefix
            )));
        }
        if envoy && url.contains("+cluster://") {
            return Err(StoreError::Unsupported(
                "the envoy key layout needs a standalone Redis: envoyproxy/ratelimit's keys \
                 have no hash tag, so one request's counters span cluster slots"
                    .into(),
            ));
        }
        let connecting = async {
            if url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://") {
                let unsupported = |why: String| {
                    StoreError::Unsupported(format!("store URL {}: {why}", redact(url)))
                };
                let parsed = sentinel::parse(url).map_err(unsupported)?;
                let conn = SentinelConn::new(&parsed, manager_config(&opts), opts.connect_timeout)
                    .map_err(|e| unsupported(first_line(&e.to_string()).to_string()))?;
                let conn = Arc::new(conn);
                if !lazy {
                    conn.master()
                        .await
                        .map_err(|e| classify(&e, &redact(url)))?;
                }
                Ok(Conn::Sentinel(conn))
            } else if let Some(rest) = url.strip_prefix("redis+cluster://") {
                Self::connect_cluster("redis", rest, &opts).await
            } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
                Self::connect_cluster("rediss", rest, &opts).await
            } else if url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("redis+unix://")
            {
                let client = single::client(url).map_err(|e| {
                    StoreError::Unsupported(format!(
                        "store URL {}: {}",
                        redact(url),
                        first_line(&e.to_string())
                    ))
                })?;
                let cfg = manager_config(&opts);
                let cm = if lazy {
                    client.get_connection_manager_lazy(cfg.clone())
                } else {
                    client.get_connection_manager_with_config(cfg.clone()).await
                };
                let cm = cm.map_err(|e| classify(&e, &redact(url)))?;
                Ok(Conn::Single(Arc::new(SingleConn::new(client, cfg, cm))))
            } else {
                Err(StoreError::Unsupported(format!(
                    "store URL {} (expected redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel://, rediss+sentinel:// or redis+unix://)",
                    redact(url)
                )))
            }
        };
        // Bounded: a server that accepts but never answers must not hang startup.
        let connect_ms = opts.connect_timeout.as_millis() as u64;
        let conn = tokio::time::timeout(opts.connect_timeout * 2, connecting)
            .await
            .map_err(|_| StoreError::Timeout(connect_ms * 2))?
            .map_err(|e| match e {
                StoreError::Timeout(_) => StoreError::Timeout(connect_ms),
                e => e,
            })?;
        let rs = std::collections::hash_map::RandomState::new();
        let function = script::library_name();
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                url: redact(url),
                opts,
                fast_function: script::fast_function(&function),
                function,
                functions: AtomicBool::new(true),
                script: script::script(),
                healthy: AtomicBool::new(!lazy),
                last_error: Mutex::new(None),
                seed: rs.hash_one(0x746f6c6cu32),
                counter: AtomicU64::new(0),
                coalescer: Arc::default(),
                slots: std::sync::RwLock::new(None),
                refreshing: AtomicBool::new(false),
                fast_calls: AtomicU64::new(0),
                fast_requests: AtomicU64::new(0),
                fast_resent: AtomicU64::new(0),
            }),
        };
        if lazy {
            store.check_credentials().await?;
        }
        Ok(store)
    }

    /// One round trip at start, for a lazily connected store: a configuration the server
    /// rejects (wrong password, no such database) fails now, with a clear error, instead of
    /// running degraded forever; a server that is merely down (or slow) is fine (it may come up).
    async fn check_credentials(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("PING");
        cmd.arg("tollgate");
        let t = self.inner.opts.connect_timeout;
        let r = match tokio::time::timeout(t, self.exec::<String>(&cmd)).await {
            Err(_) => return Ok(()),
            Ok(r) => r,
        };
        match r {
            Err(e) => match classify(&e, &self.inner.url) {
                e @ StoreError::Failed {
                    kind: FaultKind::AuthFailed | FaultKind::NoSuchDb,
                    ..
                } => Err(e),
                // Down or slow: start anyway (the caller decides what "degraded" means).
                StoreError::Timeout(_) => Ok(()),
                e => self.record::<()>(Err(e)).or(Ok(())),
            },
            Ok(_) => {
                self.inner.healthy.store(true, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    async fn connect_cluster(
        scheme: &str,
        rest: &str,
        opts: &RedisOptions,
    ) -> Result<Conn, StoreError> {
        let nodes = cluster_nodes(scheme, rest)?;
        let url = redact(&format!("{scheme}+cluster://{rest}"));
        // Short waits between the cluster client's retries (on TRYAGAIN, CLUSTERDOWN, a
        // reconnect): its default waits at least 1.28 s, longer than a call may take, so a slot
        // migration or a failover elsewhere would time out every call in flight. These grow
        // from 2 ms to at most CLUSTER_RETRY_MAX_WAIT_MS; the call's own bound still ends them.
        let client = ClusterClient::builder(nodes)
            .tcp_settings(single::tcp_settings())
            .connection_timeout(opts.connect_timeout)
            .response_timeout(opts.timeout + opts.patience)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(CLUSTER_RETRY_MIN_WAIT_MS)
            .max_retry_wait(CLUSTER_RETRY_MAX_WAIT_MS)
            .retry_wait_formula(2, 2)
            .build()
            .map_err(|e| classify(&e, &url))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| classify(&e, &url))?;
        Ok(Conn::Cluster(conn))
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// Whether the last call to Redis reached a working server (no I/O: for readiness and
    /// circuit breakers). A failure of one key or script call (`WRONGTYPE`, out of memory on a
    /// write) does not make the store unhealthy.
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    /// The last failure, if any call has failed (it stays after a recovery: compare its time
    /// with the health).
    pub fn last_error(&self) -> Option<LastError> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    /// The name of the check's Redis Function (what `FCALL` names; `FUNCTION LIST LIBRARYNAME`
    /// finds its library under the same name).
    pub fn function_name(&self) -> &str {
        &self.inner.function
    }

    /// Whether the store calls the Redis Function (`false` once the server turned out not to
    /// support functions, or not to allow them: the store then uses `EVALSHA`).
    pub fn uses_function(&self) -> bool {
        self.inner.functions.load(Ordering::Relaxed)
    }

    /// Round trip to Redis (every master of a cluster is reached by normal traffic; this pings
    /// one node).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("PING");
        cmd.arg("tollgate");
        let r = self.query::<String>(&cmd).await.map(|_| ());
        self.record(r)
    }

    /// What a request needs, without touching a counter: a write with a TTL
    /// (`SET <prefix>:probe 1 PX 10000`). Fails, unlike [`RedisStore::ping`], while Redis
    /// refuses writes (out of memory, read-only replica).
    ///
    /// Bounded by the connect timeout plus the per-call timeout, not the per-call one alone: a
    /// probe is not on a request's path, and while Redis is down it must wait for the
    /// connection to say why (connection refused, authentication, ...) rather than report a
    /// timeout of its own; a timeout it reports names that bound.
    ///
    /// On a single server the probe dials a connection of its own: a shared connection that went
    /// silent would keep every probe from seeing the server come back. When that probe succeeds
    /// after a failure, the shared connection is replaced too.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("{}:probe", self.inner.opts.prefix))
            .arg(1)
            .arg("PX")
            .arg(10_000);
        let opts = &self.inner.opts;
        let bound = opts.connect_timeout + opts.timeout;
        let r = match &self.inner.conn {
            Conn::Single(s) => {
                let was_healthy = self.is_healthy();
                let r = self
                    .bounded(bound, async {
                        let mut c = s.fresh(opts.connect_timeout, bound).await?;
                        cmd.query_async::<String>(&mut c).await
                    })
                    .await;
                if r.is_ok() && !was_healthy {
                    s.replace(
                        "the probe reached Redis on a new connection after a failure",
                        &self.inner.url,
                        true,
                    );
                }
                r
            }
            _ => self.bounded(bound, self.exec::<String>(&cmd)).await,
        };
        self.record(r.map(|_| ()))
    }

    /// A Redis Cluster's masters and the slot ranges each serves (`CLUSTER SLOTS`, asked of any
    /// node): `(first slot, last slot, "host:port")`. Empty for a single server or Sentinel.
    pub async fn slot_owners(&self) -> Result<Vec<(u16, u16, String)>, StoreError> {
        if !self.is_cluster() {
            return Ok(Vec::new());
        }
        let v: redis::Value = self
            .query(&redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await?;
        let int = |v: &redis::Value| match v {
            redis::Value::Int(i) => u16::try_from(*i).ok(),
            _ => None,
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let mut owners = Vec::new();
        if let redis::Value::Array(ranges) = v {
            for r in ranges {
                let redis::Value::Array(r) = r else { continue };
                let (Some(first), Some(last), Some(redis::Value::Array(master))) =
                    (r.first().and_then(int), r.get(1).and_then(int), r.get(2))
                else {
                    continue;
                };
                let (Some(host), Some(redis::Value::Int(port))) =
                    (master.first().and_then(text), master.get(1))
                else {
                    continue;
                };
                owners.push((first, last, format!("{host}:{port}")));
            }
        }
        owners.sort();
        // What batches are grouped by from now on.
        let mut slots = self.inner.slots.write().unwrap_or_else(|e| e.into_inner());
        let map = SlotMap::new(&owners, slots.as_deref());
        *slots = Some(Arc::new(map));
        Ok(owners)
    }

    /// The waiting line for a one-item check of counter `key`: the store's, or on a cluster
    /// that of the master serving its slot (`None` while the store has no slot map yet: it is
    /// being learned, and the request goes on its own).
    fn line_for(&self, key: &str) -> Option<Arc<Coalescer>> {
        if !self.is_cluster() {
            return Some(self.inner.coalescer.clone());
        }
        let slots = self.inner.slots.read().unwrap_or_else(|e| e.into_inner());
        match slots.as_deref() {
            Some(map) => map.line(keys::slot(key)).cloned(),
            None => {
                drop(slots);
                self.refresh_slots();
                None
            }
        }
    }

    /// Learn the cluster's slot map anew, in the background (once at a time): the first
    /// batch needs it, and a request that reached a node not serving its key says it is stale.
    fn refresh_slots(&self) {
        if self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.inner.refreshing.store(false, Ordering::Release);
            return;
        };
        let store = self.clone();
        rt.spawn(async move {
            // A failure leaves the old map (or none): the next misrouted request tries again.
            let _ = store.slot_owners().await;
            store.inner.refreshing.store(false, Ordering::Release);
        });
    }

    /// The cluster slot of `item`'s counter.
    pub fn slot_of(&self, item: &CheckItem<'_>) -> u16 {
        let opts = &self.inner.opts;
        let (main, _) = keys::counter_keys_in(opts.key_layout, &opts.prefix, item.key, item.quota);
        keys::slot(&main)
    }

    /// [`RedisStore::probe`] of the cluster node that serves `ranges` (inclusive slot ranges):
    /// the same write, on a key whose slot is in them.
    pub(crate) async fn probe_slots(&self, ranges: &[(u16, u16)]) -> Result<(), StoreError> {
        let key = probe_key(&self.inner.opts.prefix, ranges)?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(1).arg("PX").arg(10_000);
        let opts = &self.inner.opts;
        self.bounded(
            opts.connect_timeout + opts.timeout,
            self.exec::<String>(&cmd),
        )
        .await
        .map(|_| ())
    }

    /// [`RedisStore::probe`] of the cluster master at `addr` (`host:port`, as
    /// [`RedisStore::slot_owners`] names it), sent to that node whatever the cluster client's
    /// own slot map says: the same write, on a key in a slot of `ranges` (the slots the caller
    /// believes that node serves). A redirect (`MOVED`) fails the probe: the caller's slot map
    /// is stale (its next refresh learns where the slots went), or the cluster client could not
    /// reach the node and sent the write elsewhere.
    pub(crate) async fn probe_node(
        &self,
        addr: &str,
        ranges: &[(u16, u16)],
    ) -> Result<(), StoreError> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let Conn::Cluster(mut c) = self.inner.conn.clone() else {
            return self.probe().await;
        };
        let (Some((host, port)), false) = (
            addr.rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?))),
            ranges.is_empty(),
        ) else {
            return self.probe_slots(ranges).await;
        };
        let key = probe_key(&self.inner.opts.prefix, ranges)?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(1).arg("PX").arg(10_000);
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        let opts = &self.inner.opts;
        self.bounded(opts.connect_timeout + opts.timeout, async move {
            c.route_command(cmd, route).await
        })
        .await
        .map(|_| ())
    }

    /// One command on the store's connection, bounded by `bound`, for callers that keep data of
    /// their own under the key prefix (the rule registry). It does not count toward the store's
    /// health: only the counters' calls do.
    pub async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        bound: Duration,
    ) -> Result<T, StoreError> {
        self.bounded(bound, self.exec(cmd)).await
    }

    /// One command, bounded by the timeout.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.bounded(self.inner.opts.timeout, self.exec(cmd)).await
    }

    async fn exec<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, RedisError> {
        match self.inner.conn.clone() {
            Conn::Single(s) => cmd.query_async::<T>(&mut s.conn()).await,
            Conn::Cluster(mut c) => cmd.query_async::<T>(&mut c).await,
            Conn::Sentinel(s) => cmd.query_async::<T>(&mut s.master().await?).await,
        }
    }

    fn record<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        match &r {
            Ok(_) => {
                // A load first: the healthy path writes nothing shared.
                if !self.inner.healthy.load(Ordering::Relaxed) {
                    self.inner.healthy.store(true, Ordering::Relaxed);
                }
                if let Conn::Single(s) = &self.inner.conn {
                    s.answered();
                }
            }
            Err(StoreError::Unsupported(_)) => {}
            Err(e) => {
                let kind = e.kind();
                if kind.is_outage() {
                    self.inner.healthy.store(false, Ordering::Relaxed);
                    match &self.inner.conn {
                        // Refused, lost, read-only, timed out: what a failover looks like.
                        Conn::Sentinel(s) => s.suspect(),
                        // Unanswered past its bound: the connection is dead, whatever the
                        // server is doing (with back-off: a server that is down is not
                        // dialled in a loop).
                        Conn::Single(s) if kind == FaultKind::Timeout => {
                            s.replace(
                                "a request went unanswered past its timeout",
                                &self.inner.url,
                                false,
                            );
                        }
                        _ => {}
                    }
                } else {
                    // The server answered: it is up, whatever this key or write did.
                    self.inner.healthy.store(true, Ordering::Relaxed);
                }
                let at_ms = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                let mut last = self
                    .inner
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                match last.as_mut() {
                    // Same failure again: only the time moves (no allocation per request).
                    Some(l) if l.kind == kind => l.at_ms = at_ms,
                    _ => {
                        *last = Some(LastError {
                            kind,
                            message: e.to_string(),
                            at_ms,
                        })
                    }
                }
            }
        }
        r
    }

    async fn bounded<T>(
        &self,
        t: Duration,
        fut: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(t, fut).await {
            Err(_) => Err(StoreError::Timeout(t.as_millis() as u64)),
            Ok(Err(e)) => match classify(&e, &self.inner.url) {
                StoreError::Timeout(_) => Err(StoreError::Timeout(t.as_millis() as u64)),
                e => Err(e),
            },
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// One call of the check: `FCALL` of the function, loading it when the server says it is
    /// missing; where the server cannot run functions, `EVALSHA`, and after `NOSCRIPT` (a
    /// restart, a failover, `SCRIPT FLUSH`) `EVAL` with the source, which cannot fail that way
    /// and caches the script again. (A load-then-`EVALSHA` retry races with a concurrent flush:
    /// seen under load. The function's load-then-`FCALL` can race the same way with `FUNCTION
    /// FLUSH`: its second miss goes to `EVAL` too.) A one-item check of a counting algorithm
    /// joins the store's next batch instead, where it can (see `coalesce.rs`).
    async fn run(
        &self,
        bound: Duration,
        call: &Call<'_>,
        part: &[script::Entry<'_>],
    ) -> Result<Reply, StoreError> {
        let fast = script::fast_item(call, part);
        if let (Some(item), [(_, it, (key, _))]) = (&fast, part) {
            if let Some(line) = self.uses_function().then(|| self.line_for(key)).flatten() {
                match self.coalesced(&line, bound, call.now, key, *item).await {
                    Outcome::Answer(now, a) => return Ok(a.reply(now, it)),
                    Outcome::Failed(e) => return Err(e),
                    Outcome::Unbatched => {}
                }
            }
        }
        let (keys, packed) = script::arguments(call, part);
        let cmd = |name: &str, target: &str| {
            let mut c = redis::cmd(name);
            c.arg(target)
                .arg(keys.len())
                .arg(&keys)
                .arg(&packed[..])
                .arg(call.reqid);
            c
        };
        // A one-item check of a counting algorithm goes to the batched function (fast.lua) as a
        // batch of one; the script forms, where functions cannot run, answer it with `check`.
        let mut calls = Calls {
            fcall: self.uses_function().then(|| match &fast {
                Some(f) => {
                    let header = script::fast_header(call.now, call.grace_ms);
                    script::fast_command(
                        &self.inner.fast_function,
                        &header,
                        [(&*keys[0], f)],
                        script::FastKeys::Declared,
                    )
                }
                None => cmd("FCALL", &self.inner.function),
            }),
            function: &self.inner.function,
            sha: self.script_sha(),
            build: Some(&cmd),
        };
        let v = self.bounded(bound, self.call(&mut calls)).await?;
        match (&fast, part) {
            (Some(_), [(_, item, _)]) if !is_check_reply(&v) => {
                let (now, mut answers) = script::decode_fast(v, 1)?;
                match answers.pop() {
                    Some(Ok(a)) => Ok(a.reply(now, item)),
                    Some(Err(e)) => Err(item_error(&e, &self.inner.url)),
                    None => Err(StoreError::Unavailable("an empty one-item reply".into())),
                }
            }
            _ => script::decode(&bytes(v)?, part.len()),
        }
    }

    /// `calls` on the store's connection, once more when the connection was found closed.
    async fn call(&self, calls: &mut Calls<'_>) -> Result<redis::Value, RedisError> {
        let mut retried = false;
        loop {
            let r = match self.inner.conn.clone() {
                Conn::Single(s) => calls.run(&mut s.conn()).await,
                Conn::Cluster(mut c) => cluster_call(&mut c, calls).await,
                Conn::Sentinel(s) => calls.run(&mut s.master().await?).await,
            };
            match r {
                Err(Missing::Functions(e)) => {
                    self.functions_unavailable(&e);
                    if calls.build.is_none() {
                        return Err(e);
                    }
                    calls.fcall = None;
                }
                // The connection was found closed (a server restarted while the connection
                // sat idle): the manager has reconnected; once more on the new connection,
                // within the same bound. (The cluster client retries on its own.)
                Err(Missing::Call(e)) if !retried && !self.is_cluster() && closed_under_us(&e) => {
                    retried = true;
                }
                Err(Missing::Call(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// A one-item check in `line`'s next batch (see `coalesce.rs`): `key`'s request `item`
    /// at `now` (`None`: Redis `TIME`), its wait bounded by `bound`.
    async fn coalesced(
        &self,
        line: &Arc<Coalescer>,
        bound: Duration,
        now: Option<tollgate_core::Micros>,
        key: &str,
        item: FastItem,
    ) -> Outcome {
        let grace = self.inner.opts.ttl_grace.as_millis() as u64;
        // Nothing in flight or waiting: send it now, from this task (no hand-over to a sender,
        // which would cost the caller two task wake-ups).
        if line.try_alone() {
            let _slot = Slot(self, line);
            let header = script::fast_header(now, grace);
            return match self.send_batch(bound, &header, [(key, &item)]).await {
                Ok(None) => Outcome::Unbatched,
                Ok(Some((now, mut answers))) => match answers.pop() {
                    Some(a) => self.outcome(now, a),
                    None => Outcome::Failed(StoreError::Unavailable("an empty reply".into())),
                },
                Err(e) => Outcome::Failed(e),
            };
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let deadline = std::time::Instant::now() + bound;
        let job = Job {
            now,
            key: key.to_owned(),
            item,
            deadline,
            tx,
        };
        let sending = match line.push(job) {
            Err(coalesce::Full) => {
                return Outcome::Failed(StoreError::Failed {
                    kind: FaultKind::Busy,
                    message: format!(
                        "{} checks are waiting for Redis at {} already: it is not keeping up",
                        coalesce::MAX_WAITING,
                        self.inner.url
                    ),
                })
            }
            Ok(true) => {
                tokio::spawn(self.clone().drive(line.clone()));
                true
            }
            Ok(false) => false,
        };
        let mut rx = rx;
        if !sending {
            // Waiting for the call in flight to come back and carry it. A near Redis answers
            // well within SECOND_SLOT_AFTER; if this one has not, the second slot opens (a
            // sender for the line, this request in it).
            let first = coalesce::SECOND_SLOT_AFTER.min(bound);
            match tokio::time::timeout(first, &mut rx).await {
                Ok(r) => return waited(r),
                Err(_) => {
                    if line.open_second() {
                        tokio::spawn(self.clone().drive(line.clone()));
                    }
                }
            }
        }
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Err(_) => Outcome::Failed(StoreError::Timeout(bound.as_millis() as u64)),
            Ok(r) => waited(r),
        }
    }

    /// What one request of a batch learned from Redis' answer `a` at `now`. On a cluster, a
    /// request whose key the node does not serve goes again on its own (and the slot map is
    /// learned anew).
    fn outcome(&self, now: Micros, a: Result<script::FastAnswer, String>) -> Outcome {
        match a {
            Ok(a) => Outcome::Answer(now, a),
            Err(e) if self.is_cluster() && not_this_nodes(&e) => {
                self.inner.fast_resent.fetch_add(1, Ordering::Relaxed);
                self.refresh_slots();
                Outcome::Unbatched
            }
            Err(e) => Outcome::Failed(item_error(&e, &self.inner.url)),
        }
    }

    /// One call of the batched function for `requests` (counter key, packed request) sharing
    /// `header`, bounded by `bound`. `None`: the server cannot run the function (the store knows
    /// it now), or it was flushed again between its load and the call, or (on a cluster) the
    /// call was redirected before it ran: each request must go on its own.
    async fn send_batch<'a>(
        &self,
        bound: Duration,
        header: &script::FastHeader,
        requests: impl IntoIterator<Item = (&'a str, &'a FastItem)>,
    ) -> Result<Option<script::FastReply>, StoreError> {
        let requests: Vec<_> = requests.into_iter().collect();
        let n = requests.len();
        // The master of the first key's slot, which the call declares.
        let slot = requests.first().map_or(0, |(k, _)| keys::slot(k));
        let how = if self.is_cluster() {
            script::FastKeys::OnNode
        } else {
            script::FastKeys::Declared
        };
        let mut calls = Calls {
            fcall: Some(script::fast_command(
                &self.inner.fast_function,
                header,
                requests,
                how,
            )),
            function: &self.inner.function,
            sha: self.script_sha(),
            build: None,
        };
        self.inner.fast_calls.fetch_add(1, Ordering::Relaxed);
        self.inner
            .fast_requests
            .fetch_add(n as u64, Ordering::Relaxed);
        let sent = self
            .bounded(bound, async {
                let sent = match &self.inner.conn {
                    Conn::Cluster(c) => {
                        match on_node(&mut c.clone(), slot, &calls, &self.inner.function).await {
                            Ok(v) => Ok(v),
                            Err(Missing::Functions(e)) => {
                                self.functions_unavailable(&e);
                                Err(e)
                            }
                            Err(Missing::Call(e)) => Err(e),
                        }
                    }
                    _ => self.call(&mut calls).await,
                };
                match sent {
                    Err(e) if function_missing(&e) || functions_refused(&e) => Ok(None),
                    Err(e) if self.is_cluster() && not_run(&e) => {
                        self.inner
                            .fast_resent
                            .fetch_add(n as u64, Ordering::Relaxed);
                        self.refresh_slots();
                        Ok(None)
                    }
                    r => r.map(Some),
                }
            })
            .await?;
        sent.map(|v| script::decode_fast(v, n)).transpose()
    }

    /// Send `line`'s batches until it is empty (one of its senders, see `coalesce.rs`).
    async fn drive(self, line: Arc<Coalescer>) {
        let grace = self.inner.opts.ttl_grace.as_millis() as u64;
        loop {
            let batch = line.next_batch();
            let Some(first) = batch.first() else {
                return;
            };
            let header = script::fast_header(first.now, grace);
            // As long as the most patient caller in it waits.
            let deadline = batch
                .iter()
                .map(|j| j.deadline)
                .max()
                .unwrap_or(first.deadline);
            let bound = deadline
                .saturating_duration_since(std::time::Instant::now())
                .max(Duration::from_millis(1));
            let reply = self
                .send_batch(
                    bound,
                    &header,
                    batch.iter().map(|j| (j.key.as_str(), &j.item)),
                )
                .await;
            match reply {
                Ok(Some((now, answers))) => {
                    for (job, a) in batch.into_iter().zip(answers) {
                        let _ = job.tx.send(self.outcome(now, a));
                    }
                }
                Ok(None) => {
                    for job in batch {
                        let _ = job.tx.send(Outcome::Unbatched);
                    }
                }
                Err(e) => {
                    for job in batch {
                        let _ = job.tx.send(Outcome::Failed(e.clone()));
                    }
                }
            }
        }
    }

    /// How one-item checks were coalesced into batched calls so far.
    pub fn coalescing(&self) -> Coalescing {
        Coalescing {
            calls: self.inner.fast_calls.load(Ordering::Relaxed),
            requests: self.inner.fast_requests.load(Ordering::Relaxed),
            resent: self.inner.fast_resent.load(Ordering::Relaxed),
        }
    }

    /// The server cannot run (or load) the function: use `EVALSHA` from now on.
    fn functions_unavailable(&self, why: &RedisError) {
        if self.inner.functions.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                store = %self.inner.url,
                reason = %first_line(&why.to_string()),
                "Redis cannot run tollgate's function: using EVALSHA (Redis 7+ or Valkey runs \
                 the function, which costs the server less per call)"
            );
        }
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
            // A tiered limit's state is under its own key (`keys::item_keys`).
            let tiered = format!("{main}:tiers");
            for k in [main, tiered].into_iter().chain(aux) {
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
        self.check_within(self.inner.opts.timeout, now, items).await
    }

    /// [`RedisStore::check`] bounded by `bound` instead of the store's timeout (at most
    /// `timeout + patience`, the connection's own limit): for a caller that starts deciding
    /// what to do after `timeout` but still wants Redis' answer if it comes (a slow call may have
    /// been counted; see tollgate-server's breaker).
    pub async fn check_within(
        &self,
        bound: Duration,
        now: Option<Micros>,
        items: &[CheckItem<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        self.check_refundable(bound, now, items)
            .await
            .map(|(d, _)| d)
    }

    /// [`RedisStore::check_within`], with a [`Receipt`] for giving back what it admitted
    /// ([`RedisStore::refund`]).
    pub async fn check_refundable(
        &self,
        bound: Duration,
        now: Option<Micros>,
        items: &[CheckItem<'_>],
    ) -> Result<(Vec<Decision>, Receipt), StoreError> {
        self.check_leasing(bound, now, items, &[]).await
    }

    /// [`RedisStore::check_refundable`] that also asks for lease units beyond each item's
    /// cost (`leases`, by index; see `lease.rs`): the units granted come back in each item's
    /// [`Decision::count`].
    pub(crate) async fn check_leasing(
        &self,
        bound: Duration,
        now: Option<Micros>,
        items: &[CheckItem<'_>],
        leases: &[u64],
    ) -> Result<(Vec<Decision>, Receipt), StoreError> {
        if items.is_empty() {
            return Ok((Vec::new(), Receipt::at_each(Vec::new())));
        }
        script::validate(items, now)?;
        let r = self.check_valid(items, (bound, now, leases)).await;
        self.record(r)
    }

    /// Give back the items `which` (indexes into `items`) of the check that gave `receipt`:
    /// `items` are that check's items, in the same order, and each of `which` must have been
    /// admitted and consumed by it. Returns, for each of `which`, a cost-0 query after the
    /// refund (what a blocked request reports).
    pub async fn refund(
        &self,
        bound: Duration,
        receipt: &Receipt,
        items: &[CheckItem<'_>],
        which: &[usize],
    ) -> Result<Vec<Decision>, StoreError> {
        if which.is_empty() {
            return Ok(Vec::new());
        }
        if which
            .iter()
            .any(|&i| i >= items.len() || i >= receipt.now.len())
        {
            return Err(StoreError::Unsupported(
                "refund of an item the receipt does not cover".into(),
            ));
        }
        let opts = &self.inner.opts;
        let keys: Vec<keys::CounterKeys> = which
            .iter()
            .map(|&i| keys::item_keys(opts.key_layout, &opts.prefix, &items[i]))
            .collect();
        // One call per (slot, instant): a cluster's slot groups were checked at their own time.
        let mut groups: Vec<((u16, Micros), Vec<usize>)> = Vec::new();
        for (j, &i) in which.iter().enumerate() {
            let slot = if self.is_cluster() {
                keys::slot(&keys[j].0)
            } else {
                0
            };
            let g = (slot, receipt.now[i]);
            match groups.iter_mut().find(|(k, _)| *k == g) {
                Some((_, v)) => v.push(j),
                None => groups.push((g, vec![j])),
            }
        }
        let mut decisions = vec![Decision::default(); which.len()];
        let mut result = Ok(());
        for ((_, at), js) in &groups {
            let call = Call {
                now: Some(*at),
                reqid: &receipt.reqid,
                mode: Mode::Refund,
                single: false,
                grace_ms: opts.ttl_grace.as_millis() as u64,
                layout: opts.key_layout,
                jitter_max_s: opts.expiration_jitter.as_secs(),
                jitter_seed: self.inner.seed,
                leases: &[],
            };
            let part: Vec<script::Entry<'_>> = js
                .iter()
                .map(|&j| (which[j], &items[which[j]], &keys[j]))
                .collect();
            match self.run(bound, &call, &part).await {
                Ok(r) => {
                    for (&j, d) in js.iter().zip(r.decisions) {
                        decisions[j] = d;
                    }
                }
                Err(e) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        self.record(result.map(|()| decisions))
    }

    /// Apply one instance's batch of `sync: batched` counts (`flush.lua`, see `batch.rs`):
    /// `entries` are (counter key, quota, TTL in ms, windows as (start, next start, previous
    /// start, units), sequence), sent by instance `inst`. One script call per slot (a
    /// standalone server: one call). Returns each entry's stored (start, prev, count) after the
    /// flush.
    pub(crate) async fn flush_batch(
        &self,
        bound: Duration,
        inst: &str,
        entries: &[crate::batch::FlushEntry],
    ) -> Result<Vec<[u64; 3]>, StoreError> {
        static FLUSH: std::sync::LazyLock<Script> =
            std::sync::LazyLock::new(|| Script::new(include_str!("../scripts/flush.lua")));
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let opts = &self.inner.opts;
        let names: Vec<String> = entries
            .iter()
            .map(|e| keys::counter_keys(&opts.prefix, &e.key, &e.quota).0)
            .collect();
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let slot = if self.is_cluster() {
                keys::slot(name)
            } else {
                0
            };
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        let calls = groups.iter().map(|(_, g)| {
            let mut inv = FLUSH.prepare_invoke();
            inv.arg(inst);
            for &i in g {
                let e = &entries[i];
                inv.key(&names[i]);
                inv.arg(script::algorithm_code(e.quota.algorithm()))
                    .arg(e.ttl_ms)
                    .arg(e.seq)
                    .arg(e.windows.len());
                for w in &e.windows {
                    inv.arg(w.0).arg(w.1).arg(w.2).arg(w.3);
                }
            }
            async move {
                let r: Result<Vec<u64>, StoreError> = self
                    .bounded(bound, async {
                        match self.inner.conn.clone() {
                            Conn::Single(s) => inv.invoke_async(&mut s.conn()).await,
                            Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
                            Conn::Sentinel(s) => inv.invoke_async(&mut s.master().await?).await,
                        }
                    })
                    .await;
                r
            }
        });
        let replies = join_all(calls).await;
        let mut out = vec![[0u64; 3]; entries.len()];
        let mut result = Ok(());
        for ((_, g), r) in groups.iter().zip(replies) {
            match r {
                Ok(v) if v.len() == 3 * g.len() => {
                    for (k, &i) in g.iter().enumerate() {
                        out[i] = [v[3 * k], v[3 * k + 1], v[3 * k + 2]];
                    }
                }
                Ok(_) => {
                    result = Err(StoreError::Failed {
                        kind: FaultKind::Script,
                        message: "flush: unexpected reply length".into(),
                    })
                }
                Err(e) => result = Err(e),
            }
        }
        self.record(result.map(|()| out))
    }

    /// The check of `items`, validated: within `bound`, at `now` (`None`: Redis' time), asking
    /// for `leases`.
    async fn check_valid(
        &self,
        items: &[CheckItem<'_>],
        (bound, now, leases): (Duration, Option<Micros>, &[u64]),
    ) -> Result<(Vec<Decision>, Receipt), StoreError> {
        let prefix = &self.inner.opts.prefix;
        let keys: Vec<keys::CounterKeys> = items
            .iter()
            .map(|i| keys::item_keys(self.inner.opts.key_layout, prefix, i))
            .collect();
        let reqid = self.next_reqid();
        let call = Call {
            now,
            reqid: &reqid,
            mode: Mode::Check,
            single: items.len() == 1,
            grace_ms: self.inner.opts.ttl_grace.as_millis() as u64,
            layout: self.inner.opts.key_layout,
            jitter_max_s: self.inner.opts.expiration_jitter.as_secs(),
            jitter_seed: self.inner.seed ^ self.inner.counter.load(Ordering::Relaxed),
            leases,
        };
        // envoyproxy/ratelimit's counters, every one written whatever the outcome: its own
        // command pattern, no script.
        let envoy = self.inner.opts.key_layout == KeyLayout::Envoy
            && leases.is_empty()
            && !self.is_cluster()
            && items.iter().all(|i| {
                i.quota.algorithm() == tollgate_core::Algorithm::EnvoyFixedWindow
                    && (i.count_denied || items.len() == 1)
            });
        if envoy {
            let now = now.unwrap_or_else(wall_micros);
            let decisions = self.envoy_counts(bound, now, &call, items, &keys).await?;
            let receipt = Receipt {
                now: vec![now; items.len()],
                reqid,
            };
            return Ok((decisions, receipt));
        }
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
            let reply = self.run(bound, &call, &all).await?;
            let receipt = Receipt {
                now: vec![reply.now; items.len()],
                reqid,
            };
            return Ok((reply.decisions, receipt));
        }

        // Split over slots: no leases (a group's grant would stand even when another group
        // blocks the request and its cost is refunded).
        let call = Call {
            leases: &[],
            ..call
        };
        let call_ref = &call;
        let calls = groups.iter().map(|(_, g)| {
            let part: Vec<_> = g.iter().map(|&i| all[i]).collect();
            async move { self.run(bound, call_ref, &part).await }
        });
        let replies = join_all(calls).await;
        let mut failed = replies.iter().find_map(|r| r.as_ref().err()).cloned();
        let blocked = failed.is_some() || replies.iter().flatten().any(|r| r.blocked);
        let mut decisions = vec![Decision::default(); items.len()];
        let mut at = vec![0; items.len()];
        for ((_, g), reply) in groups.iter().zip(&replies) {
            let Ok(reply) = reply else { continue };
            for (&i, d) in g.iter().zip(&reply.decisions) {
                decisions[i] = *d;
                at[i] = reply.now;
            }
        }
        let any_denied = blocked || decisions.iter().any(|d| !d.allowed);
        for ((_, g), reply) in groups.iter().zip(&replies) {
            let Ok(reply) = reply else { continue };
            // What this group committed but the whole request must not: give it back and
            // report cost-0 queries, as a blocked request does (see `consumes`).
            let local_denied = reply.decisions.iter().any(|d| !d.allowed);
            let undo: Vec<usize> = g
                .iter()
                .copied()
                .filter(|&i| {
                    let (it, d) = (&items[i], &decisions[i]);
                    d.allowed
                        && it.cost > 0
                        && consumes(it, d, local_denied, reply.blocked)
                        && !consumes(it, d, any_denied, blocked)
                })
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
            match self.run(bound, &refund, &part).await {
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
            None => Ok((decisions, Receipt { reqid, now: at })),
        }
    }
}

/// The wall clock in microseconds since the epoch: the time of envoy-layout counters (windowed
/// on the instance's clock, as envoyproxy/ratelimit's are) and of the guard's lease sweep
/// (requests bring their own time).
pub(crate) fn wall_micros() -> Micros {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

impl RedisStore {
    /// envoy_fixed_window counters in envoy's key layout, each written whatever the outcome
    /// (one item, or every item counting denied hits): envoyproxy/ratelimit's own pattern, one
    /// pipeline of `INCRBY` + `EXPIRE` per counter (`GET` for a cost of 0), decided here from
    /// the counts Redis returns, exactly as the script decides them. Costs Redis a fraction of
    /// a script call, and shares counters with envoyproxy/ratelimit's pods.
    async fn envoy_counts(
        &self,
        bound: Duration,
        now: Micros,
        call: &Call<'_>,
        items: &[CheckItem<'_>],
        keys: &[keys::CounterKeys],
    ) -> Result<Vec<Decision>, StoreError> {
        use tollgate_core::internals::{envoy_window, step, State, Window};
        let mut pipe = redis::pipe();
        for (idx, (item, (base, _))) in items.iter().zip(keys).enumerate() {
            let (start, _) = envoy_window(item.quota.period(), now);
            let key = format!("{base}{}", start / 1_000_000);
            let cost = item.cost.min(keys::MAX_COST);
            if cost == 0 {
                pipe.cmd("GET").arg(&key);
            } else {
                pipe.cmd("INCRBY").arg(&key).arg(cost);
                pipe.cmd("EXPIRE")
                    .arg(&key)
                    .arg(script::envoy_expire(call, idx, item.quota))
                    .ignore();
            }
        }
        let counts: Vec<Option<u64>> = self
            .bounded(bound, async {
                match self.inner.conn.clone() {
                    Conn::Single(s) => pipe.query_async(&mut s.conn()).await,
                    Conn::Sentinel(s) => pipe.query_async(&mut s.master().await?).await,
                    Conn::Cluster(mut c) => pipe.query_async(&mut c).await,
                }
            })
            .await?;
        if counts.len() != items.len() {
            return Err(StoreError::Unavailable(format!(
                "unexpected pipeline reply: {} counts for {} items",
                counts.len(),
                items.len()
            )));
        }
        Ok(items
            .iter()
            .zip(counts)
            .map(|(item, after)| {
                let (start, _) = envoy_window(item.quota.period(), now);
                let cost = item.cost.min(keys::MAX_COST);
                let before = after.unwrap_or(0).saturating_sub(cost);
                let state = State::Window(Window {
                    start,
                    count: before,
                });
                step(Some(state), now, cost, item.quota).0
            })
            .collect())
    }
}

/// Retries of a cluster call by the cluster client (redirects, reconnects, TRYAGAIN,
/// CLUSTERDOWN), within the call's bound.
const CLUSTER_RETRIES: u32 = 16;
/// The cluster client's first wait before a retry, in milliseconds.
const CLUSTER_RETRY_MIN_WAIT_MS: u64 = 2;
/// The cluster client's longest wait before a retry, in milliseconds.
const CLUSTER_RETRY_MAX_WAIT_MS: u64 = 40;

/// A probe key under `prefix` in a slot of `ranges` (inclusive slot ranges).
fn probe_key(prefix: &str, ranges: &[(u16, u16)]) -> Result<String, StoreError> {
    // About one in (16384 / slots served) tags lands in the ranges: a few tries.
    (0u32..1 << 20)
        .map(|n| format!("{prefix}:{{probe-{n}}}"))
        .find(|k| {
            let s = keys::slot(k);
            ranges.iter().any(|&(a, b)| (a..=b).contains(&s))
        })
        .ok_or_else(|| StoreError::Unsupported("no slot to probe".into()))
}

/// The single-server and Sentinel master connection's settings.
fn manager_config(opts: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(Some(opts.timeout + opts.patience))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1))
}

/// The commands of one call of the check, in the order they are tried.
struct Calls<'a> {
    /// `FCALL`, unless the store knows the server cannot run functions.
    fcall: Option<redis::Cmd>,
    /// The function's name (its library has the same).
    function: &'a str,
    /// The script's SHA1 (what `EVALSHA` names).
    sha: &'a str,
    /// The command `name target` with the call's keys and arguments: the script's commands are
    /// built only when the function cannot answer (`EVAL` carries the whole source, tens of KB).
    /// `None` for a batch, which only the function can answer.
    build: Option<&'a BuildScript<'a>>,
}

/// Builds the script form of a call: `EVALSHA sha ...` or `EVAL source ...`.
type BuildScript<'a> = dyn Fn(&str, &str) -> redis::Cmd + Sync + 'a;

/// Why a call did not answer.
enum Missing {
    /// The server cannot run or load functions (no `FUNCTION` before Redis 7, or the ACL
    /// forbids it): the caller switches to `EVALSHA` and calls again.
    Functions(RedisError),
    /// Any other failure of the call.
    Call(RedisError),
}

impl From<RedisError> for Missing {
    fn from(e: RedisError) -> Self {
        Missing::Call(e)
    }
}

/// Whether `v` is `check`'s reply to a one-item request (where the script form answered a
/// request meant for the batched function).
fn is_check_reply(v: &redis::Value) -> bool {
    matches!(v, redis::Value::BulkString(b) if b.len() == 8 * (2 + 7))
}

/// A packed reply's bytes.
fn bytes(v: redis::Value) -> Result<Vec<u8>, StoreError> {
    redis::from_redis_value(v)
        .map_err(|e| StoreError::Unavailable(format!("unexpected script reply: {e}")))
}

/// The error Redis raised for one request of a batch (`message`, as the script saw it), as the
/// store reports it when a call fails with it (see `classify`).
fn item_error(message: &str, url: &str) -> StoreError {
    let line = message.replace(['\r', '\n'], " ");
    // A server error (`WRONGTYPE ...`, `OOM ...`) starts with its code in capitals.
    let code = line.split(' ').next().unwrap_or("");
    if !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()) {
        if let Ok(redis::Value::ServerError(e)) =
            redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
        {
            return classify(&RedisError::from(e), url);
        }
    }
    StoreError::Failed {
        kind: FaultKind::Script,
        message: format!("the rate-limit script failed in Redis: {line}"),
    }
}

/// `ERR Function not found`: loaded nowhere yet on this server, or flushed.
fn function_missing(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.starts_with("Function not found"))
}

/// The server has no functions, or does not let this user call or load them.
fn functions_refused(e: &RedisError) -> bool {
    e.code() == Some("NOPERM")
        || e.detail().is_some_and(|d| {
            d.starts_with("unknown command") || d.starts_with("Error registering functions")
        })
}

impl Calls<'_> {
    /// The call on one connection. (A cluster connection routes `FCALL` by its key and sends
    /// `FUNCTION LOAD` to every master.)
    async fn run(&self, c: &mut impl redis::aio::ConnectionLike) -> Result<redis::Value, Missing> {
        let Some(fcall) = &self.fcall else {
            return Ok(self.eval_or_load(c).await?);
        };
        match fcall.query_async(&mut *c).await {
            Err(e) if function_missing(&e) => {}
            Err(e) if functions_refused(&e) => return Err(Missing::Functions(e)),
            r => return Ok(r?),
        }
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(script::library(self.function));
        match load.query_async::<redis::Value>(&mut *c).await {
            // Loaded meanwhile by another call: as good.
            Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => {}
            Err(e) if functions_refused(&e) => return Err(Missing::Functions(e)),
            Err(e) => return Err(Missing::Call(e)),
            Ok(_) => {}
        }
        match fcall.query_async(&mut *c).await {
            // Flushed again between the load and the call: the script cannot miss that way
            // (a batch, which it cannot answer, reports the miss).
            Err(e) if function_missing(&e) && self.build.is_some() => {
                Ok(self.eval_or_load(c).await?)
            }
            r => Ok(r?),
        }
    }

    /// `evalsha`, or `eval` when the server does not know the script.
    async fn eval_or_load(
        &self,
        c: &mut impl redis::aio::ConnectionLike,
    ) -> Result<redis::Value, RedisError> {
        let Some(build) = self.build else {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "a batch needs the function",
            )));
        };
        match build("EVALSHA", self.sha).query_async(&mut *c).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                build("EVAL", script::SOURCE).query_async(c).await
            }
            r => r,
        }
    }
}

/// Whether `e` says the connection was closed or reset under the call (not refused, not timed
/// out): the manager reconnects on such an error, so one more try is worth it.
fn closed_under_us(e: &RedisError) -> bool {
    !e.is_timeout()
        && !e.is_connection_refusal()
        && (e.is_connection_dropped() || e.kind() == redis::ErrorKind::Io)
}

/// One script call on a cluster. `ASK` is followed by [`follow_ask`]. A `MOVED` that the
/// cluster client could not follow is what its own `ASK` handling ends in when it loses the race
/// described there (the target, still importing, gets the call without `ASKING` and answers
/// `MOVED` back to the source): the call is made once more, from the start, with the slot map
/// the client has refreshed meanwhile; its `ASK` then comes here.
async fn cluster_call(
    c: &mut ClusterConnection,
    calls: &Calls<'_>,
) -> Result<redis::Value, Missing> {
    let redirected = |e: &Missing, kind| matches!(e, Missing::Call(e) if e.kind() == redis::ErrorKind::Server(kind));
    let mut retried = false;
    loop {
        match calls.run(c).await {
            Err(Missing::Call(e))
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) =>
            {
                return Ok(follow_ask(c, &e, calls).await?)
            }
            Err(e) if !retried && redirected(&e, redis::ServerErrorKind::Moved) => retried = true,
            r => return r,
        }
    }
}

/// A cluster batch's call, to the master of `slot` (its declared key's), after a `PING` in the
/// same pipeline: whatever command comes before it on the shared connection, the call never
/// runs with an `ASKING` meant for another (the cluster client sends `ASKING` on its own, see
/// [`follow_ask`], and would send it before this pipeline too when its key is being moved):
/// under `ASKING` a node serves the keys of a slot it is importing, present or not, and a key of
/// the batch still on the source would be counted afresh there. So the batch reads only keys
/// the node serves now; the others fail alone (and go again on their own), as does the whole
/// call if its declared key is not the node's (`MOVED`, `ASK`: nothing ran). A function missing
/// on the node is loaded (on every master) and the call made once more.
async fn on_node(
    c: &mut ClusterConnection,
    slot: u16,
    calls: &Calls<'_>,
    function: &str,
) -> Result<redis::Value, Missing> {
    use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
    let Some(fcall) = &calls.fcall else {
        return Err(Missing::Call(RedisError::from((
            redis::ErrorKind::Client,
            "a batch needs the function",
        ))));
    };
    let mut loaded = false;
    loop {
        let mut p = redis::pipe();
        p.cmd("PING").add_command(fcall.clone());
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        match c.route_pipeline(p, 1, 1, route).await.and_then(only_reply) {
            Err(e) if function_missing(&e) && !loaded => {
                loaded = true;
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg(script::library(function));
                match load.query_async::<redis::Value>(&mut *c).await {
                    Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => {}
                    Err(e) if functions_refused(&e) => return Err(Missing::Functions(e)),
                    Err(e) => return Err(Missing::Call(e)),
                    Ok(_) => {}
                }
            }
            Err(e) if functions_refused(&e) => return Err(Missing::Functions(e)),
            r => return Ok(r?),
        }
    }
}

/// The one reply a pipeline was asked for (`route_pipeline`'s `count` of 1), its error as the
/// call's.
fn only_reply(v: Vec<redis::Value>) -> Result<redis::Value, RedisError> {
    v.into_iter()
        .next()
        .ok_or_else(|| RedisError::from((redis::ErrorKind::Client, "no reply to a routed call")))?
        .extract_error()
}

/// A slot is migrating and the key is already on the node `ASK` names: send `ASKING` and the
/// script call there as one pipeline, so that no other request's command on the shared
/// connection can come between them and consume the `ASKING` (the cluster client sends
/// `ASKING` on its own and waits for its reply first, which loses that race under load and
/// ends in the `ASK` error surfacing). `NOSCRIPT` on that node: the same with `EVAL`. (The
/// script, not the function: a migration is rare and short, and the node may not have loaded the
/// function yet.)
async fn follow_ask(
    c: &mut ClusterConnection,
    ask: &RedisError,
    calls: &Calls<'_>,
) -> Result<redis::Value, RedisError> {
    use redis::cluster_routing::SingleNodeRoutingInfo;
    // (Only a single request's call has a script form; batches are not sent to a cluster.)
    let (Some(build), Some((host, port))) = (
        calls.build,
        ask.redirect_node()
            .and_then(|(addr, _)| addr.rsplit_once(':'))
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?))),
    ) else {
        return Err(ask.clone());
    };
    let route = || SingleNodeRoutingInfo::ByAddress {
        host: host.clone(),
        port,
    };
    let asking = |cmd: redis::Cmd| {
        let mut p = redis::pipe();
        p.cmd("ASKING").add_command(cmd);
        p
    };
    match c
        .route_pipeline(asking(build("EVALSHA", calls.sha)), 1, 1, route())
        .await
        .and_then(only_reply)
    {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => c
            .route_pipeline(asking(build("EVAL", script::SOURCE)), 1, 1, route())
            .await
            .and_then(only_reply),
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
        assert_eq!(
            redact("redis+unix:///run/r.sock?user=u&pass=s3cret&db=1"),
            "redis+unix:///run/r.sock?user=u&pass=***&db=1"
        );
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
