//! The [`Store`] trait: where counters live and how one request's counters are checked together.
//!
//! A store applies algorithm steps atomically per key and **all-or-nothing per request**: when any
//! non-shadow item is denied, no item consumes anything, and the other items report what they
//! have left without consuming (a cost-0 query). Shadow-mode items are evaluated and counted when
//! they pass, but never block the request.
//!
//! [`Algorithm::EnvoyFixedWindow`] items count as envoyproxy/ratelimit counts, which is not
//! all-or-nothing: a denied item always keeps its (incremented) count, and an allowed one
//! consumes when no item of the request is denied (shadow items included, as envoy's
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` compares every key) or when it is marked
//! [`CheckItem::count_denied`] (envoy's default). See [`consumes`].

use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};
use crate::rules::TierLevel;

/// The tier of an item of a tiered limit ([`crate::rules::Tiers`]): the limit's levels and the
/// request's level among them. The store decides the parent counter and the tier together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier<'a> {
    /// The levels, highest priority first.
    pub levels: &'a [TierLevel],
    /// The request's level (0 = highest priority).
    pub index: u8,
}

/// One counter to check as part of a request.
#[derive(Debug, Clone, Copy)]
pub struct CheckItem<'a> {
    /// Identity of the limit (rule) this counter belongs to; counters of one count-min-sketch
    /// limit share that limit's sketch.
    pub rule: &'a str,
    /// The counter key (`domain|k=v|...`, escaped).
    pub key: &'a str,
    /// The quota.
    pub quota: &'a Quota,
    /// Cost of this request against this counter (0 = query).
    pub cost: u64,
    /// Counted, never blocks the other items (shadow mode, and quota mode, whose limits block
    /// only all together: decided by the caller from the decisions).
    pub shadow: bool,
    /// [`Algorithm::EnvoyFixedWindow`] only: this item consumes even when another item of the
    /// request is denied (envoyproxy/ratelimit's default counting). Off, it consumes only when
    /// no item is denied (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`). Ignored by the other
    /// algorithms, which are all-or-nothing.
    pub count_denied: bool,
    /// A tiered limit: the request's tier. `key` is then the parent counter, shared by every
    /// tier. `None` for limits without tiers.
    pub tier: Option<Tier<'a>>,
}

impl<'a> CheckItem<'a> {
    /// One hit (cost 1, not shadowed) on `key` under `rule`'s `quota`; other costs and shadow
    /// mode by struct update: `CheckItem { cost: 5, ..CheckItem::hit(rule, key, quota) }`.
    pub fn hit(rule: &'a str, key: &'a str, quota: &'a Quota) -> Self {
        CheckItem {
            rule,
            key,
            quota,
            cost: 1,
            shadow: false,
            count_denied: false,
            tier: None,
        }
    }
}

/// A store could not decide (only remote stores fail; the memory store never does).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend did not answer in time.
    #[error("store timed out after {0} ms")]
    Timeout(u64),
    /// The backend is unreachable or answered with an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The request cannot be served by this store (e.g. an algorithm it does not support).
    #[error("unsupported by this store: {0}")]
    Unsupported(String),
    /// The backend failed in a way it told us about (refused, lost, authentication, out of
    /// memory, a value of the wrong type, ...): `message` is for humans, `kind` for code.
    #[error("{message}")]
    Failed {
        /// What went wrong.
        kind: FaultKind,
        /// A sentence for logs and `/readyz` (no secrets).
        message: String,
    },
}

/// What kind of failure a store error is: for metrics, logs and for telling an outage (the
/// store cannot serve anyone) from a fault of one request (one key, one script call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// No answer within the per-call timeout.
    Timeout,
    /// Nothing accepts connections at the address.
    ConnectionRefused,
    /// The connection broke (reset, closed, DNS, TLS, ...).
    ConnectionLost,
    /// The server rejected the credentials (or requires some).
    AuthFailed,
    /// The database number in the URL does not exist on the server.
    NoSuchDb,
    /// The user lacks an ACL permission the calls need.
    NoPermission,
    /// The server is a read-only replica.
    ReadOnly,
    /// The server is loading its data set or busy running a script.
    Busy,
    /// The server is out of memory and refuses writes (`maxmemory` with `noeviction`).
    OutOfMemory,
    /// A key holds a value of another type (`WRONGTYPE`).
    WrongType,
    /// The script failed inside the server.
    Script,
    /// Any other failure.
    Other,
}

impl FaultKind {
    /// Every kind, in metric order.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::Timeout,
        FaultKind::ConnectionRefused,
        FaultKind::ConnectionLost,
        FaultKind::AuthFailed,
        FaultKind::NoSuchDb,
        FaultKind::NoPermission,
        FaultKind::ReadOnly,
        FaultKind::Busy,
        FaultKind::OutOfMemory,
        FaultKind::WrongType,
        FaultKind::Script,
        FaultKind::Other,
    ];

    /// Stable name (metric label, `/readyz`).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Timeout => "timeout",
            FaultKind::ConnectionRefused => "connection_refused",
            FaultKind::ConnectionLost => "connection_lost",
            FaultKind::AuthFailed => "auth_failed",
            FaultKind::NoSuchDb => "no_such_db",
            FaultKind::NoPermission => "no_permission",
            FaultKind::ReadOnly => "read_only",
            FaultKind::Busy => "busy",
            FaultKind::OutOfMemory => "out_of_memory",
            FaultKind::WrongType => "wrongtype",
            FaultKind::Script => "script",
            FaultKind::Other => "other",
        }
    }

    /// Whether this failure means the store serves nobody (so a circuit breaker may open), as
    /// opposed to a fault of one request's keys or script call, or of writes only.
    pub fn is_outage(self) -> bool {
        matches!(
            self,
            FaultKind::Timeout
                | FaultKind::ConnectionRefused
                | FaultKind::ConnectionLost
                | FaultKind::AuthFailed
                | FaultKind::NoSuchDb
                | FaultKind::NoPermission
                | FaultKind::ReadOnly
                | FaultKind::Busy
        )
    }
}

impl StoreError {
    /// The kind of failure (`Unavailable` is a lost connection, `Unsupported` is `Other`).
    pub fn kind(&self) -> FaultKind {
        match self {
            StoreError::Timeout(_) => FaultKind::Timeout,
            StoreError::Unavailable(_) => FaultKind::ConnectionLost,
            StoreError::Unsupported(_) => FaultKind::Other,
            StoreError::Failed { kind, .. } => *kind,
        }
    }
}

/// A place counters live.
pub trait Store: Send + Sync {
    /// Check and (all-or-nothing) consume `items` at `now`. Returns one decision per item, in order.
    fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Vec<Decision>, StoreError>;

    /// Check one counter: the common case, which stores may serve without allocating.
    fn check_one(&self, now: Micros, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        self.check(now, std::slice::from_ref(item))?
            .pop()
            .ok_or_else(|| StoreError::Unavailable("store returned no decision".into()))
    }
}

/// Whether a set of decisions blocks the request: any denied non-shadow item.
pub fn blocks(items: &[CheckItem<'_>], decisions: &[Decision]) -> bool {
    items
        .iter()
        .zip(decisions)
        .any(|(i, d)| !i.shadow && !d.allowed)
}

/// Whether `item`, decided `d`, keeps its new state in a request where `any_denied` (any item,
/// shadow or not, was denied) and `blocked` ([`blocks`]). All-or-nothing for every algorithm
/// but [`Algorithm::EnvoyFixedWindow`] (see the module docs).
pub fn consumes(item: &CheckItem<'_>, d: &Decision, any_denied: bool, blocked: bool) -> bool {
    if item.quota.algorithm() == Algorithm::EnvoyFixedWindow {
        !d.allowed || item.count_denied || !any_denied
    } else {
        d.allowed && !blocked
    }
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Vec<Decision>, StoreError> {
        (**self).check(now, items)
    }
    fn check_one(&self, now: Micros, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        (**self).check_one(now, item)
    }
}
