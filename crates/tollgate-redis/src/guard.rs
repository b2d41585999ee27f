//! Redis guarded by a failure policy and a circuit breaker ([`Guarded`]): what every user of a
//! shared Redis store needs when Redis is slow or down, so the service (`tollgate serve`) and the
//! in-process middleware (`tollgate-tower`) decide alike. It lives here, next to the store, so an
//! embedder gets it without the service crate.
//!
//! Slow is not down: a call slower than the per-call timeout (50 ms by default) counts toward
//! opening the breaker, but the request keeps waiting for Redis' answer (it may have been
//! counted) until the answer comes, the breaker opens, or `timeout + patience` (1 s) passes; so
//! a loaded Redis stays exact, and only an outage hands decisions to the policy.
//!
//! Why a breaker and not just a timeout: during an outage every call would wait for the per-call
//! timeout. The breaker opens on an outage, not on one bad key nor on queueing:
//! after [`FAILURES_TO_OPEN`] consecutive connection-level failures (refused, reset,
//! authentication, ...), or consecutive timeouts that persist for [`TIMEOUTS_OPEN_AFTER`] with no
//! success in between (isolated timeouts of a loaded Redis interleaved with answers never open
//! it). A failure of one key or script call (`WRONGTYPE`, a script error, out of memory on a
//! write) is decided by the policy and counted, and leaves the breaker alone. Open, decisions use
//! the policy without touching Redis (microseconds). A background probe writes a key with a TTL
//! (what requests need: a Redis that answers `PING` but refuses writes is not back) every
//! [`PROBE_INTERVAL`]; a successful probe half-opens the breaker (traffic goes back to Redis; one
//! failure re-opens it, one success or the next probe closes it), so decisions return to Redis
//! by itself. A failed call is never an error for the caller: that request is decided by the
//! policy too, and every degraded decision and store error (by kind) is counted; the store's own
//! error is logged once per change ([`Guarded::condition`]).
//!
//! A timed-out call may have been counted by Redis. The `local` policy therefore remembers the
//! last `remaining` Redis reported per key (a bounded ledger) and never lets its fallback grant
//! more than that share (divided by [`RedisSettings::expected_instances`]), charging a timed-out
//! call's cost as possibly consumed: a slow Redis cannot turn into a fresh local budget per
//! instance. A `sync: batched` counter decides without Redis, so its report is the fleet's count
//! each flush learns, and the units this instance admitted since and has not sent come off its
//! share too.
//!
//! On a Redis Cluster there is one breaker per master (found by the slot of a request's
//! counters, from `CLUSTER SLOTS`, refreshed every second), each with its own probe (a write
//! in a slot that master serves): a master that is down sends only its own keys to the
//! policy, and keys on the healthy masters stay on Redis.
//!
//! What the `local` policy admitted during an outage is not lost when Redis comes back: the
//! guard remembers, per key (bounded), what it admitted locally, and the probe that finds Redis
//! answering again folds it into the shared counters before traffic goes back to Redis (at most
//! two script calls per key touched during the outage: the cost owed, or, when that no longer
//! fits, what is left), so a window admits little more than its limit across an outage instead
//! of its limit again on top of the local shares (see docs/operations.md for the bound). When
//! Redis then counts less than the key had when this instance last heard (it restarted empty),
//! the fold also restores that count, so a lost Redis does not hand out a fresh window.
//!
//! The optional deny cache ([`RedisSettings::deny_cache`]) answers keys Redis reported as denied
//! until the time Redis said they could pass again; see docs/operations.md for where that is
//! exact.

use crate::batch::Batches;
use crate::lease::{Leases, Returns};
use crate::limits::LimitStats;
use crate::{Receipt, RedisStore};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tollgate_core::internals::window;
use tollgate_core::quota::Algorithm;
use tollgate_core::rules::{RuleSet, TierLevel};
use tollgate_core::store::{blocks, Tier};
use tollgate_core::{
    CheckItem, Decision, FaultKind, MemoryStore, Micros, Quota, Store, StoreError,
};

/// Consecutive connection-level store failures that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 3;
/// Timeouts open the breaker only when they go on this long with no success in between
/// (and at least [`FAILURES_TO_OPEN`] of them): an outage, not queueing.
pub const TIMEOUTS_OPEN_AFTER: Duration = Duration::from_secs(1);
/// How often an open (or half-open) breaker probes Redis.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// With the `local` policy over several instances, an open breaker half-opens at this many
/// successful probes in a row (two probe intervals after the first): every instance that saw
/// Redis come back has folded its local admissions by then.
pub(crate) const SETTLE_PROBES: u8 = 3;
/// A failing store is reported as answering again only after this long without a failure (so
/// isolated failures between successes log once, not once per request).
const QUIET: Micros = 1_000_000;
/// Bound on the ledger's entries (beyond it, new keys are not remembered until others expire).
const LEDGER_MAX: usize = 100_000;
/// Bound on the keys whose local admissions are remembered for folding into Redis (beyond it,
/// the admissions of new keys are not folded).
const OWED_MAX: usize = 100_000;
/// `retry_after` of a denial made by the `deny` policy: the store may be back by then.
const DENY_RETRY: Micros = 1_000_000;
/// Bound on the deny cache's entries (beyond it, new denials are not cached until expiry).
const DENY_CACHE_MAX: usize = 100_000;

/// What to do when the store cannot decide (`--on-store-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Admit every request.
    Allow,
    /// Deny every limited request (429 / OVER_LIMIT).
    Deny,
    /// Decide with an in-memory limiter over the same rules (limits divided by
    /// `--expected-instances`).
    #[default]
    Local,
}

impl Policy {
    /// All policies, in metric order.
    pub const ALL: [Policy; 3] = [Policy::Allow, Policy::Deny, Policy::Local];

    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Allow => "allow",
            Policy::Deny => "deny",
            Policy::Local => "local",
        }
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("'{s}' is not a failure policy (allow, deny or local)"))
    }
}

/// The decisions for one request and how they were made.
#[derive(Debug)]
pub struct Outcome {
    /// One decision per item.
    pub decisions: Vec<Decision>,
    /// Set when the store was not (successfully) asked and the policy decided.
    pub degraded: Option<Policy>,
    /// The store was asked and failed (counted in `tollgate_store_errors_total`).
    pub store_failed: bool,
    /// Answered by the local deny cache, without asking Redis (envoyproxy/ratelimit's
    /// `over_limit_with_local_cache`).
    pub from_deny_cache: bool,
    /// Redis decided: what to give back if another store blocks the same request
    /// ([`Guarded::refund`]).
    pub receipt: Option<Receipt>,
}

impl Outcome {
    /// Decisions the store made (not degraded, not from the deny cache).
    pub fn store(decisions: Vec<Decision>) -> Self {
        Self {
            decisions,
            degraded: None,
            store_failed: false,
            from_deny_cache: false,
            receipt: None,
        }
    }
}

/// Limits the Redis store cannot serve, found when rules load (start, reload, `simulate`) rather
/// than on every request: the same check the store makes per call ([`crate::keys::check_quota`]). The
/// count-min sketch is memory-only (a shared sketch would need every key of a request's limit in
/// one slot, and its point is bounded local memory); the Lua ports' exact integer range bounds
/// periods and bucket spans a little below what rule files allow.
pub fn unsupported(set: &RuleSet) -> Vec<String> {
    set.limits()
        .filter_map(|l| {
            let q = l.quota.as_ref()?;
            let why = if q.algorithm() == Algorithm::CountMinSketch {
                "uses algorithm count_min_sketch, which is memory-only: not available with a Redis store (choose sliding_window_counter, or the memory store)".to_string()
            } else {
                let Err(StoreError::Unsupported(why)) = crate::keys::check_quota(q) else {
                    return None;
                };
                format!("is not available with a Redis store: {why}")
            };
            Some(format!("{}:{}: limit `{}` {why}", l.file, l.line, l.id))
        })
        .chain(set.unleasable())
        .collect()
}

/// Settings of the guard (the `tollgate serve` flags of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `--on-store-error`.
    pub policy: Policy,
    /// `--expected-instances` (at least 1): the `local` policy divides limits by it.
    pub expected_instances: u64,
    /// `--local-deny-cache`.
    pub deny_cache: bool,
    /// Keys the `local` policy's memory store may hold (`--max-keys`).
    pub max_keys: usize,
    /// Decide at the caller's time (the `now` passed to [`Guarded::check`]) instead of Redis
    /// `TIME`. Off in the service, so that app servers with skewed clocks share one time; on
    /// when a test clock must decide on Redis as it does on the memory store.
    pub caller_clock: bool,
    /// `--sync-flush-interval`: how often `sync: batched` counts are sent to Redis.
    pub flush_interval: Duration,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            policy: Policy::Local,
            expected_instances: 1,
            deny_cache: false,
            max_keys: tollgate_core::memory::DEFAULT_MAX_KEYS,
            caller_clock: false,
            flush_interval: crate::batch::DEFAULT_FLUSH_INTERVAL,
        }
    }
}

/// Breaker states (`tollgate_store_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Redis answers; every decision goes to Redis.
    Healthy,
    /// A probe succeeded after an outage: traffic goes to Redis, one failure re-opens.
    HalfOpen,
    /// Redis failed [`FAILURES_TO_OPEN`] times in a row: the policy decides, Redis is not called.
    Open,
}

impl BreakerState {
    /// Every state, in metric order.
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Healthy,
        BreakerState::HalfOpen,
        BreakerState::Open,
    ];

    /// As reported by `/readyz` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Healthy => "healthy",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

#[derive(Debug, Default)]
struct Breaker {
    state: AtomicU8,
    failures: AtomicU32,
    /// When the current run of failures began (0: none).
    since: AtomicU64,
    transitions: [AtomicU64; 3],
    /// Wakes the calls waiting on a slow Redis when the breaker opens.
    opened: tokio::sync::Notify,
    /// An open breaker's successful probes in a row (each folded the local admissions): with
    /// the `local` policy over several instances, the [`SETTLE_PROBES`]th half-opens it.
    streak: AtomicU8,
    /// Decisions the failure policy made for this breaker's keys.
    degraded: AtomicU64,
    /// Keys and cost of local admissions folded into Redis through this breaker's master.
    folded_keys: AtomicU64,
    folded_cost: AtomicU64,
}

impl Breaker {
    fn state(&self) -> BreakerState {
        BreakerState::ALL[self.state.load(Relaxed) as usize]
    }

    /// Move from `from` to `to`; only one caller wins (and counts) a transition.
    fn transition(&self, from: BreakerState, to: BreakerState) {
        if self
            .state
            .compare_exchange(from as u8, to as u8, Relaxed, Relaxed)
            .is_ok()
        {
            self.transitions[to as usize].fetch_add(1, Relaxed);
            if to == BreakerState::Open {
                self.opened.notify_waiters();
            }
            match to {
                BreakerState::Open => tracing::warn!(
                    from = from.as_str(),
                    "store breaker open: deciding with the failure policy"
                ),
                _ => tracing::info!(
                    from = from.as_str(),
                    to = to.as_str(),
                    "store breaker: Redis answers again"
                ),
            }
        }
    }

    fn success(&self) {
        // Loads first: the healthy path writes nothing shared.
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
            self.since.store(0, Relaxed);
        }
        if self.state() == BreakerState::HalfOpen {
            self.transition(BreakerState::HalfOpen, BreakerState::Healthy);
        }
    }

    /// An outage-kind failure at `now`: a timeout counts only once timeouts have lasted
    /// [`TIMEOUTS_OPEN_AFTER`] with no success in between.
    fn failure(&self, kind: FaultKind, now: Micros) {
        let n = self.failures.fetch_add(1, Relaxed) + 1;
        let _ = self.since.compare_exchange(0, now.max(1), Relaxed, Relaxed);
        let lasted = now.saturating_sub(self.since.load(Relaxed));
        let enough = n >= FAILURES_TO_OPEN
            && (kind != FaultKind::Timeout || lasted >= TIMEOUTS_OPEN_AFTER.as_micros() as Micros);
        match self.state() {
            BreakerState::HalfOpen => self.transition(BreakerState::HalfOpen, BreakerState::Open),
            BreakerState::Healthy if enough => {
                self.transition(BreakerState::Healthy, BreakerState::Open)
            }
            _ => {}
        }
    }

    /// A cluster master's breaker whose master serves no slot any more (a failover promoted its
    /// replica, or its slots moved away): nothing would probe it, so it closes here rather than
    /// stay open for good.
    fn retire(&self, addr: &str) {
        self.failures.store(0, Relaxed);
        self.since.store(0, Relaxed);
        self.streak.store(0, Relaxed);
        let from = self.state();
        if from != BreakerState::Healthy {
            tracing::info!(
                node = %addr,
                "store breaker of a former cluster master closed: it serves no slot now"
            );
            self.transition(from, BreakerState::Healthy);
        }
    }

    fn probe_ok(&self) {
        self.failures.store(0, Relaxed);
        self.since.store(0, Relaxed);
        match self.state() {
            BreakerState::Open => self.transition(BreakerState::Open, BreakerState::HalfOpen),
            BreakerState::HalfOpen => {
                self.transition(BreakerState::HalfOpen, BreakerState::Healthy)
            }
            BreakerState::Healthy => {}
        }
    }
}

/// Redis with its failure policy, breaker, fallback limiter and deny cache.
pub struct Guarded {
    store: RedisStore,
    settings: RedisSettings,
    /// The whole store's breaker (a single server, Sentinel, or a cluster whose slots are not
    /// known yet).
    breaker: Arc<Breaker>,
    /// A cluster's per-master breakers.
    nodes: Option<Nodes>,
    local: Arc<MemoryStore>,
    ledger: Option<Ledger>,
    deny_cache: Option<DenyCache>,
    degraded: [AtomicU64; 3],
    /// Store errors by kind ([`FaultKind::ALL`] order).
    errors: [AtomicU64; FaultKind::ALL.len()],
    /// Calls slower than the per-call timeout (answered or not).
    slow: AtomicU64,
    condition: Condition,
    /// What the `local` policy admitted, to fold into Redis when it answers again.
    owed: Owed,
    /// `sync: lease` limits' units in hand.
    leases: Leases,
    /// Lease refills in flight (one per leased counter).
    refills: crate::refill::Refills,
    /// `sync: batched` limits' local counts.
    batches: Batches,
    /// What each non-exact limit's mode did.
    limits: LimitStats,
    /// With [`RedisSettings::caller_clock`]: the time of the last check, the probe's clock for
    /// giving idle lease units back (the wall clock may be days away from the caller's).
    caller_now: AtomicU64,
}

/// The store's current failure, logged once per change: set by a failure of another kind than
/// the current one, cleared by a success [`QUIET`] after the last failure or by a probe that
/// reached Redis.
#[derive(Default)]
struct Condition {
    failing: std::sync::atomic::AtomicBool,
    /// The kind being reported and the time of its last occurrence.
    current: Mutex<Option<(FaultKind, Micros)>>,
}

impl Condition {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(FaultKind, Micros)>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A failure at `now` (0: the probe, which has no clock; the quiet period then starts at
    /// the next answer).
    fn failed(&self, e: &StoreError, now: Micros, url: &str) {
        let kind = e.kind();
        let mut cur = self.lock();
        if cur.map(|(k, _)| k) != Some(kind) {
            tracing::warn!(kind = kind.as_str(), store = %url, "Redis store error: {e}");
        }
        let at = match *cur {
            Some((_, at)) if now == 0 => at,
            _ => now,
        };
        *cur = Some((kind, at.max(now)));
        self.failing.store(true, Relaxed);
    }

    /// An answer at `now`: reported (once) when no failure came for [`QUIET`]. Returns whether
    /// it was reported.
    fn answered(&self, now: Micros) -> bool {
        if !self.failing.load(Relaxed) {
            return false;
        }
        let mut cur = self.lock();
        match *cur {
            // The last failure's time is unknown (the probe's): the quiet period starts now.
            Some((kind, 0)) => *cur = Some((kind, now)),
            Some((kind, at)) if now.saturating_sub(at) >= QUIET => {
                tracing::info!(was = kind.as_str(), "Redis store answers again");
                *cur = None;
                self.failing.store(false, Relaxed);
                return true;
            }
            _ => {}
        }
        false
    }

    /// The probe's write went through on every breaker it tried: the failure is over, whether
    /// or not a request came since (the probe has no clock to time a quiet period with).
    fn cleared(&self) {
        if !self.failing.load(Relaxed) {
            return;
        }
        let mut cur = self.lock();
        if let Some((kind, _)) = cur.take() {
            tracing::info!(was = kind.as_str(), "Redis store answers again");
        }
        self.failing.store(false, Relaxed);
    }

    fn get(&self) -> Option<FaultKind> {
        if !self.failing.load(Relaxed) {
            return None;
        }
        self.lock().map(|(k, _)| k)
    }
}

impl std::fmt::Debug for Guarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("store", &self.store)
            .field("settings", &self.settings)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Guarded {
    /// Guard `store`: ping it once (a failure starts the service degraded, breaker open) and
    /// start the probe task, which ends when the returned `Arc` is dropped. Call inside a Tokio
    /// runtime.
    pub async fn start(store: RedisStore, settings: RedisSettings) -> Arc<Guarded> {
        let local = Arc::new(MemoryStore::new(settings.max_keys.max(1)));
        Self::start_with_local(store, settings, local).await
    }

    /// [`Guarded::start`] with a given memory store for the `local` policy (two Redis of one
    /// service share one: their keys are disjoint, and one store is swept).
    pub async fn start_with_local(
        store: RedisStore,
        settings: RedisSettings,
        local: Arc<MemoryStore>,
    ) -> Arc<Guarded> {
        let g = Arc::new(Guarded {
            local,
            ledger: (settings.policy == Policy::Local).then(Ledger::default),
            deny_cache: settings.deny_cache.then(DenyCache::default),
            nodes: store.is_cluster().then(Nodes::default),
            store,
            settings: settings.clone(),
            breaker: Arc::default(),
            degraded: Default::default(),
            errors: Default::default(),
            slow: AtomicU64::new(0),
            condition: Condition::default(),
            owed: Owed::default(),
            leases: Leases::default(),
            refills: Default::default(),
            batches: Batches::new(settings.flush_interval),
            limits: LimitStats::default(),
            caller_now: AtomicU64::new(0),
        });
        if let Err(e) = g.store.probe().await {
            g.count_error(&e, 0);
            if e.kind().is_outage() {
                // Logged as the store's error (count_error); the breaker starts open (it was
                // never healthy, so this is no transition).
                g.breaker.state.store(BreakerState::Open as u8, Relaxed);
                tracing::warn!(
                    policy = g.settings.policy.as_str(),
                    "Redis unavailable at start: deciding with the failure policy until it answers"
                );
            }
        }
        g.refresh_slots().await;
        tokio::spawn(probe(Arc::downgrade(&g)));
        tokio::spawn(flusher(Arc::downgrade(&g)));
        g
    }

    /// Learn which master serves which slots (a cluster only; kept as it was on a failure).
    ///
    /// Slots that move away from a master whose breaker is not healthy keep going through the
    /// recovery every outage ends with (probes, then the local admissions folded back): a
    /// master that served no slot before (a promoted replica) starts with its breaker open, so
    /// its probe folds and settles as after any outage; a master that already served slots (a
    /// migration's target, healthy) keeps its breaker, and the moved keys' admissions are
    /// folded at once (the return value: true then). The breaker of a master that serves no
    /// slot now is closed, since nothing would probe it.
    async fn refresh_slots(&self) -> bool {
        let Some(nodes) = &self.nodes else {
            return false;
        };
        let Ok(owners) = self.store.slot_owners().await else {
            return false;
        };
        if owners.is_empty() {
            return false;
        }
        let mut by_addr = nodes.by_addr.lock().unwrap_or_else(|e| e.into_inner());
        let slots: Vec<NodeSlots> = owners
            .into_iter()
            .map(|(a, b, addr)| {
                let breaker = by_addr.entry(addr.clone()).or_default().clone();
                (a, b, Arc::from(addr), breaker)
            })
            .collect();
        let mut old = nodes.slots.write().unwrap_or_else(|e| e.into_inner());
        let mut fold = false;
        for (first, last, _, now) in &slots {
            let inherits = old.iter().any(|(a, b, _, was)| {
                *a <= *last
                    && *first <= *b
                    && !Arc::ptr_eq(was, now)
                    && was.state() != BreakerState::Healthy
            });
            if !inherits {
                continue;
            }
            let served = old.iter().any(|(_, _, _, was)| Arc::ptr_eq(was, now));
            if !served && now.state() == BreakerState::Healthy {
                now.streak.store(0, Relaxed);
                now.transition(BreakerState::Healthy, BreakerState::Open);
            } else {
                fold = true;
            }
        }
        for (addr, b) in by_addr.iter() {
            if !slots.iter().any(|(_, _, _, s)| Arc::ptr_eq(s, b)) {
                b.retire(addr);
            }
        }
        *old = slots;
        fold
    }

    /// The breaker that decides for `items`: on a cluster, the breaker of the master serving
    /// their counters (the first that is not healthy, when they span masters); else the whole
    /// store's.
    fn breaker_for(&self, items: &[CheckItem<'_>]) -> Arc<Breaker> {
        let Some(nodes) = &self.nodes else {
            return self.breaker.clone();
        };
        if self.breaker.state() != BreakerState::Healthy {
            return self.breaker.clone();
        }
        let slots = nodes.slots.read().unwrap_or_else(|e| e.into_inner());
        let mut pick: Option<&Arc<Breaker>> = None;
        for item in items {
            let slot = self.store.slot_of(item);
            let i = slots.partition_point(|(_, last, _, _)| *last < slot);
            let Some((_, _, _, b)) = slots.get(i).filter(|(first, _, _, _)| *first <= slot) else {
                continue;
            };
            if b.state() != BreakerState::Healthy {
                return b.clone();
            }
            pick.get_or_insert(b);
        }
        pick.unwrap_or(&self.breaker).clone()
    }

    /// The breakers to probe now (not healthy), each with its master's address and slot
    /// ranges (`None`: the whole store).
    fn to_probe(&self) -> Vec<(Arc<Breaker>, Option<ProbeTarget>)> {
        let mut due = Vec::new();
        if self.breaker.state() != BreakerState::Healthy {
            due.push((self.breaker.clone(), None));
        }
        let Some(nodes) = &self.nodes else { return due };
        let slots = nodes.slots.read().unwrap_or_else(|e| e.into_inner());
        for (first, last, addr, b) in slots.iter() {
            if b.state() == BreakerState::Healthy {
                continue;
            }
            match due.iter_mut().find(|(d, _)| Arc::ptr_eq(d, b)) {
                Some((_, Some((_, ranges)))) => ranges.push((*first, *last)),
                _ => due.push((b.clone(), Some((addr.clone(), vec![(*first, *last)])))),
            }
        }
        due
    }

    /// Whether any breaker (the whole store's, a cluster master's) is not healthy.
    fn any_unhealthy(&self) -> bool {
        self.breakers()
            .iter()
            .any(|b| b.state() != BreakerState::Healthy)
    }

    /// Per cluster master (by address, sorted; empty for a single server or Sentinel): its
    /// breaker's state and transitions, the decisions the failure policy made for its keys,
    /// and the local admissions folded back into it. Bounded by [`NODES_MAX`] entries (masters
    /// seen over the process's life, former ones included).
    pub fn node_stats(&self) -> Vec<NodeStats> {
        let Some(nodes) = &self.nodes else {
            return Vec::new();
        };
        let serving: Vec<Arc<str>> = nodes
            .slots
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, _, a, _)| a.clone())
            .collect();
        let by_addr = nodes.by_addr.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<NodeStats> = by_addr
            .iter()
            .map(|(addr, b)| NodeStats {
                node: addr.clone(),
                serves_slots: serving.iter().any(|a| **a == **addr),
                state: b.state(),
                transitions: BreakerState::ALL.map(|s| b.transitions[s as usize].load(Relaxed)),
                degraded: b.degraded.load(Relaxed),
                folded_keys: b.folded_keys.load(Relaxed),
                folded_cost: b.folded_cost.load(Relaxed),
            })
            .collect();
        out.sort_by(|a, b| a.node.cmp(&b.node));
        out.truncate(NODES_MAX);
        out
    }

    /// Every breaker: the whole store's, then a cluster's masters' (also former masters', whose
    /// transitions stay counted).
    fn breakers(&self) -> Vec<Arc<Breaker>> {
        let mut all = vec![self.breaker.clone()];
        if let Some(nodes) = &self.nodes {
            let by_addr = nodes.by_addr.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(by_addr.values().cloned());
        }
        all
    }

    /// Count and (once per change) log a store error.
    fn count_error(&self, e: &StoreError, now: Micros) {
        let kind = e.kind();
        if let Some(i) = FaultKind::ALL.iter().position(|k| *k == kind) {
            self.errors[i].fetch_add(1, Relaxed);
        }
        self.condition.failed(e, now, self.store.url());
    }

    /// The kind of failure going on (logged once per change), `None` while the store answers.
    pub fn condition(&self) -> Option<FaultKind> {
        self.condition.get()
    }

    /// Breaker transitions into `to` so far.
    pub fn transitions(&self, to: BreakerState) -> u64 {
        self.breakers()
            .iter()
            .map(|b| b.transitions[to as usize].load(Relaxed))
            .sum()
    }

    /// Calls slower than the per-call timeout so far (answered or not).
    pub fn slow_calls(&self) -> u64 {
        self.slow.load(Relaxed)
    }

    /// With the deny cache on: requests it answered so far and the keys it holds.
    pub fn deny_cache_stats(&self) -> Option<(u64, usize)> {
        self.deny_cache
            .as_ref()
            .map(|c| (c.hits.load(Relaxed), c.len()))
    }

    /// Store errors of `kind` so far.
    pub fn errors(&self, kind: FaultKind) -> u64 {
        FaultKind::ALL
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.errors[i].load(Relaxed))
    }

    /// The Redis store.
    pub fn store(&self) -> &RedisStore {
        &self.store
    }

    /// The settings.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// The breaker state: the worst of a cluster's masters' (one master down: open).
    pub fn state(&self) -> BreakerState {
        if self.nodes.is_none() {
            return self.breaker.state();
        }
        let mut states = vec![self.breaker.state()];
        if let Some(nodes) = &self.nodes {
            let slots = nodes.slots.read().unwrap_or_else(|e| e.into_inner());
            states.extend(slots.iter().map(|(_, _, _, b)| b.state()));
        }
        [BreakerState::Open, BreakerState::HalfOpen]
            .into_iter()
            .find(|s| states.contains(s))
            .unwrap_or(BreakerState::Healthy)
    }

    /// The `local` policy's memory store (swept by `serve` like the memory backend).
    pub fn local_store(&self) -> &Arc<MemoryStore> {
        &self.local
    }

    /// Local admissions folded into Redis after outages so far: (keys, cost).
    pub fn folded(&self) -> (u64, u64) {
        (self.owed.keys.load(Relaxed), self.owed.cost.load(Relaxed))
    }

    /// Units folds restored to counters Redis had lost (restarted empty) so far.
    pub fn restored(&self) -> u64 {
        self.owed.restored.load(Relaxed)
    }

    /// Fold what the `local` policy admitted into Redis' counters (see the module docs): for
    /// each key, consume the cost owed, or, when it no longer fits, what is left of the limit.
    /// Entries whose window has ended are dropped. Returns false when Redis failed (what was
    /// not folded stays owed).
    async fn fold(&self, probed: &Arc<Breaker>) -> bool {
        let owed = self.owed.take();
        if owed.is_empty() {
            return true;
        }
        let mut ok = true;
        let opts = self.store.options();
        let bound = opts.timeout + opts.patience;
        let last = self.owed.last_now.load(Relaxed);
        let at = self.settings.caller_clock.then_some(last);
        for (key, o) in owed {
            if o.until <= last {
                continue;
            }
            let item = CheckItem {
                cost: o.cost,
                tier: o.tier.as_ref().map(|(levels, index)| Tier {
                    levels,
                    index: *index,
                }),
                ..CheckItem::hit(&o.rule, &o.key, &o.quota)
            };
            // Keys on another master that is still down wait for its own probe.
            let b = self.breaker_for(&[item]);
            if b.state() == BreakerState::Open && !Arc::ptr_eq(&b, probed) {
                self.owed.put_back(key, o);
                continue;
            }
            // The count this instance last knew the key had, before what it admitted locally.
            let known = self.ledger.as_ref().and_then(|l| {
                l.lock()
                    .get(&key)
                    .filter(|s| s.until > last && s.quota == o.quota && o.tier.is_none())
                    .map(|s| s.count)
            });
            let r = match self.store.check_within(bound, at, &[item]).await {
                Ok(d) if !d[0].allowed && d[0].remaining > 0 => {
                    let rest = CheckItem {
                        cost: d[0].remaining,
                        ..item
                    };
                    self.store
                        .check_within(bound, at, &[rest])
                        .await
                        .map(|_| ())
                }
                // Redis counts less than this instance knew it had plus what it just folded:
                // it lost its counts (restarted empty). Restore what was known, at most what is
                // left (on a Redis that kept its counts, only a refilled bucket or a weighted
                // window that slid meets this: the safe side).
                Ok(d) if d[0].allowed => {
                    let count = o.quota.limit().saturating_sub(d[0].remaining);
                    let missing = known
                        .map_or(0, |k| k.saturating_add(o.cost).saturating_sub(count))
                        .min(d[0].remaining);
                    if missing == 0 {
                        Ok(())
                    } else {
                        let restore = CheckItem {
                            cost: missing,
                            ..item
                        };
                        let r = self.store.check_within(bound, at, &[restore]).await;
                        if r.is_ok() {
                            self.owed.restored.fetch_add(missing, Relaxed);
                        }
                        r.map(|_| ())
                    }
                }
                r => r.map(|_| ()),
            };
            match r {
                // Redis answered, but not for this key (a script or type error): it cannot be
                // folded, and keeping it owed would keep the breaker open for good. Any other
                // error (out of memory, busy, read-only) passes: the key stays owed.
                Err(e) if matches!(e.kind(), FaultKind::WrongType | FaultKind::Script) => {
                    self.count_error(&e, 0);
                    continue;
                }
                Err(_) => {
                    // Owed again.
                    self.owed.put_back(key, o);
                    ok = false;
                    continue;
                }
                Ok(()) => {}
            }
            self.owed.keys.fetch_add(1, Relaxed);
            self.owed.cost.fetch_add(o.cost, Relaxed);
            b.folded_keys.fetch_add(1, Relaxed);
            b.folded_cost.fetch_add(o.cost, Relaxed);
        }
        ok
    }

    /// Decisions made by the policy so far, by policy.
    pub fn degraded_decisions(&self, policy: Policy) -> u64 {
        self.degraded[policy as usize].load(Relaxed)
    }

    /// Check and consume `items` at `now` in Redis, or, when it cannot answer (breaker open,
    /// call failed), with the failure policy: an outage is never an error here, only a request
    /// this store cannot serve ([`StoreError::Unsupported`]).
    pub async fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Outcome, StoreError> {
        if self.settings.caller_clock {
            self.caller_now.store(now, Relaxed);
        }
        if let Some(decisions) = self.leases.decide(now, items) {
            self.limits.decided(items, false);
            return Ok(Outcome::store(decisions));
        }
        if let (Some(cache), [one]) = (&self.deny_cache, items) {
            if let Some(d) = cache.get(one, now) {
                return Ok(Outcome {
                    from_deny_cache: true,
                    ..Outcome::store(vec![d])
                });
            }
        }
        let breaker = self.breaker_for(items);
        if breaker.state() == BreakerState::Open {
            self.limits.decided(items, false);
            breaker.degraded.fetch_add(1, Relaxed);
            return Ok(self.fallback(now, items, false, false));
        }
        if let Some(decisions) = self.batches.decide(now, items) {
            self.limits.decided(items, false);
            return Ok(Outcome::store(decisions));
        }
        // One refill per leased counter in flight: a one-item request that finds another
        // request refilling its lease waits for that call once, then takes its units from hand
        // or asks Redis itself (refill.rs).
        let mut _refill = None;
        if let [one] = items {
            if one.cost > 0 && crate::counter::kept(one, tollgate_core::SyncMode::Lease) {
                let key = crate::counter::map_key(one);
                match self.refills.begin(key.clone()) {
                    crate::refill::Begin::Lead(lead) => _refill = Some(lead),
                    crate::refill::Begin::Wait(refill) => {
                        self.refills.waited.fetch_add(1, Relaxed);
                        let done = self.await_refill(&key, &refill, &breaker, now).await;
                        if !done || breaker.state() == BreakerState::Open {
                            self.limits.decided(items, false);
                            breaker.degraded.fetch_add(1, Relaxed);
                            return Ok(self.fallback(now, items, true, false));
                        }
                        if let Some(decisions) = self.leases.decide(now, items) {
                            self.limits.decided(items, false);
                            return Ok(Outcome::store(decisions));
                        }
                    }
                }
            }
        }
        let wants = self.leases.wants(now, items);
        self.limits.decided(items, true);
        let mut started = std::time::Instant::now();
        let mut r = self.call(now, items, &breaker, wants.as_deref()).await;
        if let Ok((decisions, _)) = &r {
            // Redis counts the units in hand as used: a request it denied on a leased counter
            // might pass without them (one costing more than is in hand). Give them back and ask
            // once more, as the count without leases would decide, when the first answer
            // consumed nothing.
            let consumed = !blocks(items, decisions)
                && items
                    .iter()
                    .zip(decisions)
                    .any(|(i, d)| d.allowed && i.cost > 0);
            if !consumed && decisions.iter().any(|d| !d.allowed) {
                // Only the denied counters' units: a request blocked by another limit (a
                // per-client one beside a leased global one) keeps the lease.
                let denied: Vec<CheckItem<'_>> = items
                    .iter()
                    .zip(decisions)
                    .filter(|(_, d)| !d.allowed)
                    .map(|(i, _)| *i)
                    .collect();
                let held = self.leases.take_held(now, &denied, &self.limits);
                if !held.is_empty() {
                    self.give_back(now, held).await;
                    started = std::time::Instant::now();
                    r = self.call(now, items, &breaker, wants.as_deref()).await;
                }
            }
        }
        match r {
            Err(None) => {
                breaker.degraded.fetch_add(1, Relaxed);
                Ok(self.fallback(now, items, true, true))
            }
            Ok((mut decisions, receipt)) => {
                if let Some(wants) = &wants {
                    let answered = now.saturating_add(started.elapsed().as_micros() as Micros);
                    let times = (now, answered);
                    self.leases.learn(
                        times,
                        receipt.times(),
                        items,
                        wants,
                        &mut decisions,
                        &self.limits,
                    );
                    // Another call's grant may have come in while this one was denied: Redis
                    // counted those units already, so the request may be admitted from them.
                    if blocks(items, &decisions) {
                        if let Some(local) = self.leases.admit_from_hand(now, items) {
                            decisions = local;
                        }
                    }
                } else {
                    self.leases.forget_denials(items);
                }
                self.batches.learn(now, items, &decisions);
                breaker.success();
                self.condition.answered(now);
                if let Some(cache) = &self.deny_cache {
                    cache.learn(now, items, &decisions);
                }
                if let Some(ledger) = &self.ledger {
                    ledger.learn(now, items, &decisions, self.settings.expected_instances);
                }
                Ok(Outcome {
                    receipt: Some(receipt),
                    ..Outcome::store(decisions)
                })
            }
            // Not a failure: a request this store cannot serve.
            Err(Some(e @ StoreError::Unsupported(_))) => Err(e),
            Err(Some(e)) => {
                let kind = e.kind();
                // A timeout is known only at the end of its bound: that is when it failed (the
                // quiet period before "answers again" counts from there).
                let opts = self.store.options();
                let late = match kind {
                    FaultKind::Timeout => (opts.timeout + opts.patience).as_micros() as Micros,
                    _ => 0,
                };
                self.count_error(&e, now.saturating_add(late));
                if kind.is_outage() {
                    breaker.failure(kind, now.saturating_add(late));
                } else {
                    // Redis answered: a fault of this request's keys or writes, not an outage.
                    breaker.success();
                }
                let possibly_consumed = kind == FaultKind::Timeout;
                breaker.degraded.fetch_add(1, Relaxed);
                Ok(self.fallback(now, items, true, possibly_consumed))
            }
        }
    }

    /// Ask Redis. A call slower than the per-call timeout is a sign of an outage (it counts
    /// toward opening the breaker) but also of mere queueing, and it may have been counted: so
    /// the request keeps waiting for Redis' answer (at most `timeout + patience`) unless the
    /// breaker opens meanwhile (`Err(None)`: decide by the policy, the cost possibly consumed).
    async fn call(
        &self,
        now: Micros,
        items: &[CheckItem<'_>],
        breaker: &Breaker,
        leases: Option<&[u64]>,
    ) -> Result<(Vec<Decision>, Receipt), Option<StoreError>> {
        let opts = self.store.options();
        let at = self.settings.caller_clock.then_some(now);
        let call = self.store.check_leasing(
            opts.timeout + opts.patience,
            at,
            items,
            leases.unwrap_or_default(),
        );
        tokio::pin!(call);
        if let Ok(r) = tokio::time::timeout(opts.timeout, &mut call).await {
            return r.map_err(Some);
        }
        self.slow.fetch_add(1, Relaxed);
        let opened = breaker.opened.notified();
        tokio::pin!(opened);
        opened.as_mut().enable();
        let late = now.saturating_add(opts.timeout.as_micros() as Micros);
        breaker.failure(FaultKind::Timeout, late);
        if breaker.state() == BreakerState::Open {
            return Err(None);
        }
        tokio::select! {
            r = &mut call => r.map_err(Some),
            () = &mut opened => Err(None),
        }
    }

    /// Wait for the refill `refill` of lease `key` (another request's call) as long as this
    /// request's own call would have taken: `false` when the breaker opened or the patience
    /// ran out first. A wait past the per-call timeout counts toward opening the breaker, as a
    /// slow call does (see `call`), so a stalled Redis opens it as fast with one call in flight
    /// per counter as with one per request.
    async fn await_refill(
        &self,
        key: &str,
        refill: &Arc<tokio::sync::Notify>,
        breaker: &Breaker,
        now: Micros,
    ) -> bool {
        let opts = self.store.options();
        let done = self.refills.finished(key, refill);
        tokio::pin!(done);
        if tokio::time::timeout(opts.timeout, &mut done).await.is_ok() {
            return true;
        }
        self.slow.fetch_add(1, Relaxed);
        let opened = breaker.opened.notified();
        tokio::pin!(opened);
        opened.as_mut().enable();
        breaker.failure(
            FaultKind::Timeout,
            now.saturating_add(opts.timeout.as_micros() as Micros),
        );
        if breaker.state() == BreakerState::Open {
            return false;
        }
        tokio::select! {
            () = &mut done => true,
            () = &mut opened => false,
            () = tokio::time::sleep(opts.patience) => false,
        }
    }

    /// Requests that waited for another request's lease refill instead of calling Redis.
    pub fn refill_waits(&self) -> u64 {
        self.refills.waited.load(Relaxed)
    }

    /// What `sync: lease` limits' leases did, and the units held now.
    pub fn lease_stats(&self) -> (&crate::lease::LeaseStats, u64) {
        (&self.leases.stats, self.leases.held())
    }

    /// Flush every batched counter at local time `now` (at shutdown; tests call it to drive the
    /// protocol step by step): one script call (one per hash slot on a Cluster), the counts
    /// learned back. Returns the number of counters flushed, or the store's error (the units
    /// are sent again, under the same sequence, by the next flush). The background flusher
    /// sends only the counters whose own interval is due.
    pub async fn flush(&self, now: Micros) -> Result<usize, StoreError> {
        self.flush_some(now, true).await
    }

    async fn flush_some(&self, now: Micros, all: bool) -> Result<usize, StoreError> {
        let b = &self.batches;
        let _one = b.flushing.lock().await;
        let opts = self.store().options();
        let sent = b.take(now, opts.ttl_grace.as_millis() as u64, all);
        if sent.is_empty() {
            return Ok(0);
        }
        let entries: Vec<crate::batch::FlushEntry> = sent.iter().map(|(_, e)| e.clone()).collect();
        let bound = opts.timeout + opts.patience;
        let states = match self.store().flush_batch(bound, &b.instance, &entries).await {
            Ok(s) => s,
            Err(e) => {
                b.stats.flush_failures.fetch_add(1, Relaxed);
                self.flush_failed(&e, now);
                return Err(e);
            }
        };
        b.stats.flushes.fetch_add(1, Relaxed);
        b.merge(now, &sent, &states, &self.limits);
        if let Some(ledger) = &self.ledger {
            // What the fleet has counted, for the fallback should Redis fail before the next
            // flush: its share starts from there, not from a fresh limit.
            for ((_, e), st) in sent.iter().zip(&states) {
                let until = window(e.quota.period(), st[0]).1;
                let n = self.settings.expected_instances;
                ledger.learn_count(now, &e.key, &e.quota, st[2], until, n);
            }
        }
        Ok(sent.len())
    }

    /// What `sync: batched` limits' batches did: the counters, the counters tracked and the
    /// units not confirmed by Redis yet.
    pub fn batch_stats(&self) -> (&crate::batch::BatchStats, usize, u64) {
        (
            &self.batches.stats,
            self.batches.tracked(),
            self.batches.unconfirmed(),
        )
    }

    /// What each `lease` or `batched` limit did (per configured limit).
    pub fn limit_stats(&self) -> &LimitStats {
        &self.limits
    }

    /// A flush failed at `now`: a store error like a check's (an outage counts toward opening
    /// the breaker, which then sends batched limits to the failure policy).
    pub(crate) fn flush_failed(&self, e: &StoreError, now: Micros) {
        self.count_error(e, now);
        if e.kind().is_outage() {
            self.breaker.failure(e.kind(), now);
        }
    }

    /// Give every lease's units in hand back to Redis (at shutdown: what this instance will
    /// not spend, other instances can).
    pub async fn return_leases(&self, now: Micros) {
        let returns = self.leases.take_returns(now, true, &self.limits);
        self.give_back(now, returns).await;
    }

    /// Give `returns` back to Redis (refunds in the window they were granted in; a failure
    /// leaves them counted, the safe side).
    async fn give_back(&self, now: Micros, returns: Returns) {
        for (rule, key, quota, at, units, tier) in returns {
            let item = crate::lease::refund_item(&key, &quota, units, tier.as_ref());
            if self
                .refund(now, &Receipt::at(at), &[item], &[0])
                .await
                .is_some()
            {
                self.leases.stats.units_returned.fetch_add(units, Relaxed);
                let per = self.limits.get(&rule);
                per.lease_units_returned.fetch_add(units, Relaxed);
                per.redis_calls.fetch_add(1, Relaxed);
            }
        }
    }

    /// Give back the items `which` of `items`, checked by the call that gave `receipt` (see
    /// [`RedisStore::refund`]); their cost-0 queries after the refund, or `None` when the refund
    /// failed (counted as a store error; the counts stay, the safe side).
    pub async fn refund(
        &self,
        now: Micros,
        receipt: &Receipt,
        items: &[CheckItem<'_>],
        which: &[usize],
    ) -> Option<Vec<Decision>> {
        let opts = self.store.options();
        match self
            .store
            .refund(opts.timeout + opts.patience, receipt, items, which)
            .await
        {
            Ok(d) => Some(d),
            Err(e) => {
                self.count_error(&e, now);
                None
            }
        }
    }

    /// Decide by the policy. `possibly_consumed`: the store call timed out, so Redis may have
    /// counted the items' costs (the ledger charges them whatever the local decision).
    fn fallback(
        &self,
        now: Micros,
        items: &[CheckItem<'_>],
        store_failed: bool,
        possibly_consumed: bool,
    ) -> Outcome {
        let policy = self.settings.policy;
        self.degraded[policy as usize].fetch_add(1, Relaxed);
        let decisions = match policy {
            Policy::Allow => items
                .iter()
                .map(|i| Decision {
                    allowed: true,
                    limit: i.quota.limit(),
                    remaining: i.quota.limit(),
                    ..Decision::default()
                })
                .collect(),
            Policy::Deny => items
                .iter()
                .map(|i| Decision {
                    allowed: false,
                    limit: i.quota.limit(),
                    retry_after: Some(DENY_RETRY),
                    reset_after: DENY_RETRY,
                    ..Decision::default()
                })
                .collect(),
            Policy::Local => self.local_decide(now, items, possibly_consumed),
        };
        Outcome {
            decisions,
            degraded: Some(policy),
            store_failed,
            from_deny_cache: false,
            receipt: None,
        }
    }

    /// The `local` policy: the in-memory limiter over the limits divided by
    /// `--expected-instances`, never granting more of a key than the ledger's share of what
    /// Redis last reported remaining.
    fn local_decide(
        &self,
        now: Micros,
        items: &[CheckItem<'_>],
        possibly_consumed: bool,
    ) -> Vec<Decision> {
        let n = self.settings.expected_instances.max(1);
        let quotas: Vec<Quota> = items.iter().map(|i| divide(i.quota, n)).collect();
        let levels: Vec<Option<Vec<TierLevel>>> = items
            .iter()
            .map(|i| i.tier.map(|t| divide_levels(t.levels, n)))
            .collect();
        let local: Vec<CheckItem<'_>> = items
            .iter()
            .zip(&quotas)
            .zip(&levels)
            .map(|((i, quota), levels)| CheckItem {
                quota,
                tier: i.tier.zip(levels.as_deref()).map(|(t, levels)| Tier {
                    levels,
                    index: t.index,
                }),
                ..*i
            })
            .collect();
        let Some(ledger) = &self.ledger else {
            // The memory store never fails.
            return self.local.check(now, &local).unwrap_or_default();
        };
        let mut map = ledger.lock();
        // The ledger's share of each item (None: Redis told us nothing current about it).
        // A batched counter's units admitted since its last flush came out of what the fleet had
        // left too.
        let shares: Vec<Option<(u64, Micros)>> = items
            .iter()
            .map(|i| {
                map.get(&*ledger_key(i))
                    .filter(|s| s.until > now && s.quota == *i.quota)
                    .map(|s| {
                        let unsent = self.batches.unsent(now, i);
                        (s.share.saturating_sub(unsent), s.until)
                    })
            })
            .collect();
        let short = |i: &CheckItem<'_>, s: &Option<(u64, Micros)>| {
            !i.shadow && i.cost > 0 && s.is_some_and(|(share, _)| share < i.cost)
        };
        let decisions = if items.iter().zip(&shares).any(|(i, s)| short(i, s)) {
            // Denied by the ledger: report the others as a blocked request does (cost 0).
            let queries: Vec<CheckItem<'_>> =
                local.iter().map(|i| CheckItem { cost: 0, ..*i }).collect();
            let mut ds = self.local.check(now, &queries).unwrap_or_default();
            for ((i, s), d) in items.iter().zip(&shares).zip(ds.iter_mut()) {
                if let (true, Some((share, until))) = (short(i, s), s) {
                    d.allowed = false;
                    d.remaining = *share;
                    d.retry_after = Some(until - now);
                    d.reset_after = d.reset_after.max(until - now);
                }
            }
            ds
        } else {
            self.local.check(now, &local).unwrap_or_default()
        };
        let admitted = !blocks(items, &decisions);
        if admitted {
            self.owed.add(now, items, &decisions);
        }
        let mut decisions = decisions;
        if admitted || possibly_consumed {
            for (i, d) in items.iter().zip(decisions.iter_mut()) {
                if let Some(s) = map.get_mut(&*ledger_key(i)).filter(|s| s.until > now) {
                    s.share = s.share.saturating_sub(i.cost);
                    let unsent = self.batches.unsent(now, i);
                    d.remaining = d.remaining.min(s.share.saturating_sub(unsent));
                }
            }
        }
        decisions
    }
}

/// `quota` with its limit (and burst) divided by `n`, at least 1: the local share of a limit
/// enforced by `n` instances at once.
fn divide(quota: &Quota, n: u64) -> Quota {
    let share = |v: u64| if v == 0 { 0 } else { (v / n).max(1) };
    quota
        .with_limit(share(quota.limit()))
        .with_burst(quota.burst().map(share))
}

/// A tiered limit's levels for its [`divide`]d quota: guarantees and reserves divided by `n`
/// (rounded down, so that they still add up to at most the divided limit), ceilings as the
/// limit is.
fn divide_levels(levels: &[TierLevel], n: u64) -> Vec<TierLevel> {
    let share = |v: u64| if v == 0 { 0 } else { (v / n).max(1) };
    levels
        .iter()
        .map(|l| {
            TierLevel::new(
                l.value.clone(),
                l.guaranteed / n,
                share(l.ceiling),
                l.reserve / n,
            )
        })
        .collect()
}

/// Probe (a write with a TTL) while the breaker is not healthy; stop when the backend is
/// dropped.
async fn probe(g: Weak<Guarded>) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    loop {
        tick.tick().await;
        let Some(g) = g.upgrade() else { return };
        ticks += 1;
        // A cluster's masters change with failovers and migrations: once a second, and at
        // every probe while a breaker is not healthy (its master may be gone, or its slots
        // elsewhere: the probe goes where the fresh map says).
        if (ticks % 4 == 0 || g.any_unhealthy()) && g.refresh_slots().await {
            // Slots moved away from a master whose breaker was not healthy: their keys go to
            // another master's breaker now, through the same recovery (folded first).
            g.fold(&g.breaker).await;
        }
        let due = g.to_probe();
        let mut all_answered = !due.is_empty();
        for (b, target) in &due {
            let r = match target {
                None => g.store.probe().await,
                Some((addr, ranges)) => g.store.probe_node(addr, ranges).await,
            };
            match r {
                // Redis answers: what was admitted locally meanwhile is folded into its
                // counters before traffic goes back to it.
                Ok(()) => {
                    // With other instances sharing the key's limit, traffic goes back to Redis
                    // two probe intervals after the first success: every instance that saw Redis
                    // come back has folded its local admissions by then, so none is granted
                    // again what another admitted locally.
                    let settle = g.settings.policy == Policy::Local
                        && g.settings.expected_instances > 1
                        && b.state() == BreakerState::Open;
                    let streak = b.streak.fetch_add(1, Relaxed).saturating_add(1);
                    if g.fold(b).await && (!settle || streak >= SETTLE_PROBES) {
                        b.streak.store(0, Relaxed);
                        b.probe_ok();
                    }
                }
                // Logged when its kind changes (e.g. Redis is back but out of memory); the probe
                // has no clock, so a success clears it at once.
                Err(e) => {
                    all_answered = false;
                    b.streak.store(0, Relaxed);
                    g.condition.failed(&e, 0, g.store.url());
                }
            }
        }
        if all_answered {
            // The probe writes: Redis is back for writes too, so `/readyz` stops naming the
            // failure now rather than at the next request.
            g.condition.cleared();
        }
        if due.is_empty() && g.owed.pending.load(Relaxed) {
            // Admitted locally while half-open, or left over by a failed fold.
            g.fold(&g.breaker).await;
        }
        // Lease units this instance stopped spending go back for the others.
        if g.state() != BreakerState::Open {
            let now = match g.settings.caller_clock {
                true => g.caller_now.load(Relaxed),
                false => crate::store::wall_micros(),
            };
            let returns = g.leases.take_returns(now, false, &g.limits);
            if !returns.is_empty() {
                g.give_back(now, returns).await;
            }
        }
    }
}

/// Flush the `sync: batched` counts when a counter's own interval is due (every due counter in
/// one flush) while the breaker is not open (an open breaker's probe finds Redis back first);
/// stop when the backend is dropped. A final flush is [`Guarded::flush`] at shutdown.
async fn flusher(g: Weak<Guarded>) {
    let (default, wake) = match g.upgrade() {
        Some(g) => (g.batches.interval(), g.batches.wake.clone()),
        None => return,
    };
    loop {
        let Some(strong) = g.upgrade() else { return };
        let now = crate::store::wall_micros();
        // Until the next counter is due, or sooner when a counter due earlier appears; at most
        // a default interval (a clock that stepped back wakes the flusher all the same).
        let open = strong.breaker.state() == BreakerState::Open;
        let most = now.saturating_add(default.as_micros() as Micros);
        let until = match strong.batches.next_due() {
            Some(due) if !open => due.min(most),
            _ => most,
        };
        strong.batches.planned.store(until, Relaxed);
        drop(strong);
        let wait = Duration::from_micros(until.saturating_sub(now)).max(Duration::from_millis(1));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => continue,
        }
        let Some(g) = g.upgrade() else { return };
        if g.breaker.state() == BreakerState::Open || g.batches.tracked() == 0 {
            continue;
        }
        // Failures are counted and logged by the flush; its units go again when next due.
        let _ = g.flush_some(crate::store::wall_micros(), false).await;
    }
}

/// One slot range of a cluster: first slot, last slot, the address of the master serving
/// them and its breaker.
type NodeSlots = (u16, u16, Arc<str>, Arc<Breaker>);

/// A master to probe: its address and the slot ranges it serves.
type ProbeTarget = (Arc<str>, Vec<(u16, u16)>);

/// Bound on the cluster masters [`Guarded::node_stats`] reports (addresses seen over the
/// process's life, former masters included).
pub const NODES_MAX: usize = 64;

/// One cluster master's breaker and what the failure policy did for its keys
/// ([`Guarded::node_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStats {
    /// `host:port`, as `CLUSTER SLOTS` names it.
    pub node: String,
    /// Whether the master serves slots now (a former master's breaker is closed).
    pub serves_slots: bool,
    /// Its breaker's state.
    pub state: BreakerState,
    /// Transitions into each state ([`BreakerState::ALL`] order).
    pub transitions: [u64; 3],
    /// Decisions the failure policy made for its keys.
    pub degraded: u64,
    /// Keys whose local admissions were folded into it after an outage.
    pub folded_keys: u64,
    /// Cost of those admissions.
    pub folded_cost: u64,
}

/// A Redis Cluster's per-master breakers.
#[derive(Default)]
struct Nodes {
    /// The slot ranges, sorted.
    slots: std::sync::RwLock<Vec<NodeSlots>>,
    /// Every master seen, by address.
    by_addr: Mutex<HashMap<String, Arc<Breaker>>>,
}

/// A key's local admissions not yet folded into Redis.
struct OwedKey {
    rule: String,
    /// The counter key (the map's key is [`ledger_key`]'s, which names a tier too).
    key: String,
    /// A tiered limit's levels and tier: folded into the tiered state.
    tier: Option<(Vec<TierLevel>, u8)>,
    quota: Quota,
    cost: u64,
    /// Local time the key's window ends (nothing to fold after it).
    until: Micros,
}

/// What the `local` policy admitted per key, for [`Guarded::fold`].
#[derive(Default)]
struct Owed {
    map: Mutex<HashMap<String, OwedKey>>,
    /// The map may hold entries (the healthy path reads only this).
    pending: std::sync::atomic::AtomicBool,
    /// The time of the last local decision (the fold's clock: the probe has none).
    last_now: AtomicU64,
    keys: AtomicU64,
    cost: AtomicU64,
    /// Units a fold restored to a counter Redis had lost.
    restored: AtomicU64,
}

impl Owed {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, OwedKey>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, now: Micros, items: &[CheckItem<'_>], decisions: &[Decision]) {
        self.last_now.fetch_max(now, Relaxed);
        let mut map = self.lock();
        for (i, d) in items.iter().zip(decisions) {
            if i.shadow || i.cost == 0 {
                continue;
            }
            let until = now.saturating_add(d.reset_after.max(1));
            let key = ledger_key(i);
            if let Some(o) = map.get_mut(&*key).filter(|o| o.quota == *i.quota) {
                o.cost = o.cost.saturating_add(i.cost);
                o.until = o.until.max(until);
                continue;
            }
            if map.len() >= OWED_MAX && !map.contains_key(&*key) {
                continue;
            }
            map.insert(
                key.into_owned(),
                OwedKey {
                    rule: i.rule.to_owned(),
                    key: i.key.to_owned(),
                    tier: i.tier.map(|t| (t.levels.to_vec(), t.index)),
                    quota: *i.quota,
                    cost: i.cost,
                    until,
                },
            );
        }
        self.pending.store(true, Relaxed);
    }

    /// A fold that failed: owed again, added to what was admitted locally since it was taken
    /// (a local admission during the fold made a new entry for the key).
    fn put_back(&self, key: String, o: OwedKey) {
        let mut map = self.lock();
        match map.get_mut(&key) {
            Some(e) if e.quota == o.quota => {
                e.cost = e.cost.saturating_add(o.cost);
                e.until = e.until.max(o.until);
            }
            // The rule changed meanwhile: the newer entry is what counts now (as in `add`).
            Some(_) => {}
            None => {
                map.insert(key, o);
            }
        }
        drop(map);
        self.pending.store(true, Relaxed);
    }

    fn take(&self) -> HashMap<String, OwedKey> {
        self.pending.store(false, Relaxed);
        std::mem::take(&mut *self.lock())
    }
}

/// What Redis last reported for a key, for the `local` policy's fallback.
struct Seen {
    quota: Quota,
    /// The key's count in the window as Redis last reported it (the limit less `remaining`; for
    /// a `sync: batched` counter, the fleet's count its last flush learned): what a fold restores
    /// when Redis comes back without it (restarted empty).
    count: u64,
    /// This instance's share of the key's remaining (remaining / `--expected-instances`),
    /// less what the fallback granted or timed-out calls may have consumed since.
    share: u64,
    /// Local time after which the report says nothing (Redis' `reset_after`: by then the key
    /// is full again).
    until: Micros,
}

/// The last `remaining` Redis reported per key (bounded), so the fallback starts from what the
/// store already granted in the current window instead of a fresh budget.
#[derive(Default)]
struct Ledger {
    map: Mutex<HashMap<String, Seen>>,
}

/// An item's entry in the ledger: its counter key, and for a tiered limit its tier too (the
/// remaining Redis reports is the tier's).
fn ledger_key<'a>(i: &CheckItem<'a>) -> std::borrow::Cow<'a, str> {
    match i.tier {
        Some(t) => format!("{}\u{0}tier{}", i.key, t.index).into(),
        None => i.key.into(),
    }
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fleet's count of a `sync: batched` counter, learned by a flush at `now`: the share is
    /// `n`th of what the window has left (this instance's units admitted since are taken off it
    /// when the fallback decides, see [`Batches::unsent`]).
    fn learn_count(
        &self,
        now: Micros,
        key: &str,
        quota: &Quota,
        count: u64,
        until: Micros,
        n: u64,
    ) {
        if until <= now {
            return;
        }
        let seen = Seen {
            quota: *quota,
            count,
            share: quota.limit().saturating_sub(count) / n.max(1),
            until,
        };
        let mut map = self.lock();
        if let Some(s) = map.get_mut(key) {
            *s = seen;
            return;
        }
        if map.len() >= LEDGER_MAX {
            map.retain(|_, s| s.until > now);
            if map.len() >= LEDGER_MAX {
                return;
            }
        }
        map.insert(key.to_owned(), seen);
    }

    fn learn(&self, now: Micros, items: &[CheckItem<'_>], decisions: &[Decision], n: u64) {
        let n = n.max(1);
        let mut map = self.lock();
        for (i, d) in items.iter().zip(decisions) {
            let key = ledger_key(i);
            if d.reset_after == 0 {
                map.remove(&*key);
                continue;
            }
            let seen = Seen {
                quota: *i.quota,
                count: i.quota.limit().saturating_sub(d.remaining),
                share: d.remaining / n,
                until: now.saturating_add(d.reset_after),
            };
            if let Some(s) = map.get_mut(&*key) {
                *s = seen;
                continue;
            }
            if map.len() >= LEDGER_MAX {
                map.retain(|_, s| s.until > now);
                if map.len() >= LEDGER_MAX {
                    continue;
                }
            }
            map.insert(key.into_owned(), seen);
        }
    }
}

/// Algorithms whose denial with `retry_after = r` means: the same or a larger cost is denied for
/// at least `r`, whatever other instances do (they can only consume more; a denied request
/// consumes nothing). The sliding window counter's `retry_after` is an estimate over a weighted
/// previous window, so it is not cached; the count-min sketch never runs on Redis.
fn exact_denial(a: Algorithm) -> bool {
    !matches!(
        a,
        Algorithm::SlidingWindowCounter | Algorithm::CountMinSketch
    )
}

struct Denied {
    /// The rule that denied (with the quota: a rules reload that changes either drops the entry).
    rule: String,
    quota: Quota,
    cost: u64,
    /// Local time until which the key is denied (`Micros::MAX`: never passes).
    until: Micros,
    reset_at: Micros,
}

/// Keys Redis denied, answered locally until they can pass again (`--local-deny-cache`).
///
/// Only single-counter requests are answered from the cache (a multi-descriptor request must
/// report the other counters' state, which needs Redis); only non-shadow items with a positive
/// cost at least the cached denied cost are answered (cost-0 queries always go to Redis). An
/// entry is tied to the quota it was learned under, so a rules reload invalidates it.
#[derive(Default)]
struct DenyCache {
    /// By counter key (looked up by `&str`: no allocation per request).
    map: Mutex<HashMap<String, Denied>>,
    hits: AtomicU64,
}

impl DenyCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Denied>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn get(&self, item: &CheckItem<'_>, now: Micros) -> Option<Decision> {
        // A tiered limit's counter key is every tier's: a denial of one tier says nothing of
        // another's, so tiered items are never cached.
        if item.cost == 0 || item.shadow || item.tier.is_some() {
            return None;
        }
        let mut map = self.lock();
        if map.is_empty() {
            return None;
        }
        let e = map.get(item.key)?;
        if e.until <= now || e.quota != *item.quota || e.rule != item.rule {
            map.remove(item.key);
            return None;
        }
        if item.cost < e.cost {
            return None;
        }
        self.hits.fetch_add(1, Relaxed);
        Some(Decision {
            allowed: false,
            limit: e.quota.limit(),
            remaining: 0,
            reset_after: e.reset_at.saturating_sub(now),
            retry_after: (e.until != Micros::MAX).then(|| e.until - now),
            delay: 0,
            count: None,
        })
    }

    fn learn(&self, now: Micros, items: &[CheckItem<'_>], decisions: &[Decision]) {
        let mut map = self.lock();
        for (i, d) in items.iter().zip(decisions) {
            if d.allowed
                || i.shadow
                || i.cost == 0
                || i.tier.is_some()
                || !exact_denial(i.quota.algorithm())
            {
                continue;
            }
            let until = d.retry_after.map_or(Micros::MAX, |r| now.saturating_add(r));
            if map.len() >= DENY_CACHE_MAX {
                map.retain(|_, e| e.until > now);
                if map.len() >= DENY_CACHE_MAX {
                    return;
                }
            }
            map.insert(
                i.key.to_owned(),
                Denied {
                    rule: i.rule.to_owned(),
                    quota: *i.quota,
                    cost: i.cost,
                    until,
                    reset_at: now.saturating_add(d.reset_after),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Unit;

    /// A fold that failed for a key while the policy admitted more on it (a new entry) used to
    /// be put back only if the key had no entry: its cost was lost, never folded into Redis.
    #[test]
    fn a_failed_fold_keeps_what_was_admitted_during_it() {
        let owed = Owed::default();
        let q = Quota::new(100, Unit::Minute);
        let hit = |cost| CheckItem {
            cost,
            ..CheckItem::hit("r", "k", &q)
        };
        let d = Decision {
            allowed: true,
            reset_after: 60_000_000,
            ..Decision::default()
        };
        owed.add(1_000, &[hit(3)], &[d]);
        let taken = owed.take();
        owed.add(2_000, &[hit(2)], &[d]);
        for (key, o) in taken {
            owed.put_back(key, o);
        }
        let map = owed.take();
        assert_eq!(map.values().map(|o| o.cost).sum::<u64>(), 5);
    }

    #[test]
    fn divided_tiers_keep_what_the_rules_require() {
        let levels = [
            TierLevel::new("paid", 61, 100, 0),
            TierLevel::new("free", 39, 80, 21),
        ];
        for n in 1..12 {
            let q = divide(&Quota::new(100, Unit::Second), n);
            let d = divide_levels(&levels, n);
            assert!(
                d.iter().map(|l| l.guaranteed).sum::<u64>() <= q.limit(),
                "{n}"
            );
            for l in &d {
                assert!(
                    l.guaranteed <= l.ceiling && l.ceiling <= q.limit(),
                    "{n}: {l:?}"
                );
                assert!(l.reserve <= q.limit(), "{n}: {l:?}");
            }
            assert_eq!(d[0].reserve, 0);
        }
    }

    #[test]
    fn breaker_opens_after_three_failures_and_closes_through_half_open() {
        let refused = FaultKind::ConnectionRefused;
        let b = Breaker::default();
        b.failure(refused, 10);
        b.failure(refused, 20);
        assert_eq!(b.state(), BreakerState::Healthy);
        b.success();
        b.failure(refused, 30);
        b.failure(refused, 40);
        assert_eq!(
            b.state(),
            BreakerState::Healthy,
            "successes reset the count"
        );
        b.failure(refused, 50);
        assert_eq!(b.state(), BreakerState::Open);
        b.probe_ok();
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.failure(refused, 60);
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "half-open: one failure re-opens"
        );
        b.probe_ok();
        b.success();
        assert_eq!(b.state(), BreakerState::Healthy);
        let t = |s: BreakerState| b.transitions[s as usize].load(Relaxed);
        assert_eq!(
            (
                t(BreakerState::Open),
                t(BreakerState::HalfOpen),
                t(BreakerState::Healthy)
            ),
            (2, 2, 1)
        );
    }

    #[test]
    fn timeouts_open_the_breaker_only_when_they_persist() {
        let b = Breaker::default();
        let second = TIMEOUTS_OPEN_AFTER.as_micros() as Micros;
        // Queueing: bursts of timeouts, each ended by a success.
        for burst in 0..10 {
            let t0 = 1 + burst * 2 * second;
            for k in 0..50 {
                b.failure(FaultKind::Timeout, t0 + k * 1_000);
            }
            b.success();
        }
        assert_eq!(b.state(), BreakerState::Healthy);
        // An outage: timeouts only, for longer than the window.
        let t0 = 100 * second;
        for k in 0..=10 {
            b.failure(FaultKind::Timeout, t0 + k * second / 10);
        }
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn answers_again_only_after_a_quiet_second() {
        let store = "redis://127.0.0.1:1";
        let c = Condition::default();
        let lost = StoreError::Failed {
            kind: FaultKind::ConnectionLost,
            message: "lost".into(),
        };
        // A probe failure (no clock), then answers: the quiet second starts at the first one.
        c.failed(&lost, 0, store);
        assert!(!c.answered(5_000_000));
        assert!(!c.answered(5_002_000), "2 ms after: not yet");
        assert!(c.answered(6_000_000));
        assert_eq!(c.get(), None);
        // A request's failure at t: nothing before t + 1 s, once after.
        c.failed(&lost, 7_000_000, store);
        assert!(!c.answered(7_500_000));
        assert!(c.answered(8_000_000));
        assert!(!c.answered(8_000_001));
    }

    #[test]
    fn local_share_divides_limit_and_burst_at_least_one() {
        let q = Quota::new(10, Unit::Second).with_burst(3);
        let d = divide(&q, 4);
        assert_eq!((d.limit(), d.burst()), (2, Some(1)));
        assert_eq!(divide(&Quota::new(0, Unit::Second), 4).limit(), 0);
        assert_eq!(divide(&q, 1), q);
    }

    #[test]
    fn policies_parse() {
        assert_eq!("deny".parse::<Policy>(), Ok(Policy::Deny));
        assert!("maybe"
            .parse::<Policy>()
            .unwrap_err()
            .contains("allow, deny or local"));
    }

    #[test]
    fn deny_cache_answers_same_or_larger_cost_until_retry() {
        let c = DenyCache::default();
        let q = Quota::new(5, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
        let item = |cost| CheckItem {
            cost,
            ..CheckItem::hit("d|k", "d|k=v", &q)
        };
        let denied = Decision {
            allowed: false,
            limit: 5,
            retry_after: Some(1_000),
            reset_after: 1_000,
            ..Decision::default()
        };
        c.learn(100, &[item(2)], &[denied]);
        assert!(c.get(&item(1), 200).is_none(), "a smaller cost may pass");
        assert!(c.get(&item(0), 200).is_none(), "queries go to Redis");
        let d = c.get(&item(3), 600).unwrap();
        assert_eq!((d.allowed, d.retry_after), (false, Some(500)));
        assert!(c.get(&item(2), 1_100).is_none(), "expired at T");
        assert_eq!(c.len(), 0);
        // Never passes: cached until the quota changes.
        c.learn(
            0,
            &[item(9)],
            &[Decision {
                retry_after: None,
                ..denied
            }],
        );
        assert!(c.get(&item(9), u64::MAX / 2).unwrap().never_passes());
        let other = Quota::new(50, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
        let reloaded = CheckItem {
            quota: &other,
            ..item(9)
        };
        assert!(c.get(&reloaded, 1).is_none());
        // Sliding counters are estimates: never cached.
        let sc = Quota::new(5, Unit::Minute).with_algorithm(Algorithm::SlidingWindowCounter);
        c.learn(
            0,
            &[CheckItem {
                quota: &sc,
                ..item(2)
            }],
            &[denied],
        );
        assert_eq!(c.len(), 0);
    }
}
