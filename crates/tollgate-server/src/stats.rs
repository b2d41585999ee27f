//! Live statistics of what the limits do, behind `GET /v1/stats` and the `/dashboard` page.
//!
//! An operator asks "which limit is denying, whom, and how close are the others?" while it
//! happens; Prometheus counters answer the first part with a scrape interval of delay and never
//! name a client (a key per series would be unbounded). So, per loaded rule:
//!
//! - a ring of [`RING_SECS`] per-second buckets (decisions allowed, denied, denied by a
//!   shadow-mode rule, near the limit, and the highest used/limit fraction a counter of the rule
//!   reached in that second), written with relaxed atomic adds: the allowed path pays a few
//!   atomic operations and no allocation, no lock;
//! - the **most-limited clients**: a space-saving heavy-hitters sketch ([`SpaceSaving`]) of the
//!   keys it denied, and a second one of the keys a shadow-mode rule *would* have denied. Fed on
//!   denials only (where the key is formatted anyway), in epochs of [`EPOCH_SECS`]: the top
//!   list covers the current and the previous epoch.
//!
//! Plus two small rings: the last reloads (ok or failed, with the error) and the last registry
//! changes. The time is always passed in (the state's clock): this module reads no clock.
//!
//! Memory is bounded whatever the traffic: per rule a fixed ring; a sketch holds at most
//! [`SKETCH_CAPACITY`] keys of at most [`MAX_KEY_BYTES`] bytes, two epochs each, and sketches
//! exist for at most [`MAX_SKETCHED_RULES`] rules at once (the first to deny; the denials of the
//! others are counted, not attributed); the event rings keep [`MAX_EVENTS`] entries.

use crate::backend::Backend;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use tollgate_core::clock::Micros;
use tollgate_core::rules::{Limit, RuleSet};

/// Seconds of per-second buckets kept per rule (a power of two; [`WINDOW_SECS`] are reported).
pub(crate) const RING_SECS: usize = 64;
/// Seconds reported: the totals and the per-second series cover the last this many seconds.
pub(crate) const WINDOW_SECS: u64 = 60;
/// The busiest-counter fraction "now" is the highest of the last this many seconds.
const RECENT_SECS: u64 = 5;
/// Keys one sketch holds. A count is over-estimated by at most `denials / SKETCH_CAPACITY`.
pub(crate) const SKETCH_CAPACITY: usize = 64;
/// Length of one sketch epoch: the top list covers the current and the previous one.
pub(crate) const EPOCH_SECS: u64 = 60;
/// Longest key kept (longer keys are cut at a character boundary and end with `…`).
pub(crate) const MAX_KEY_BYTES: usize = 128;
/// Most rules with sketches at once.
pub(crate) const MAX_SKETCHED_RULES: usize = 256;
/// Entries of each event ring (reloads, registry changes).
pub(crate) const MAX_EVENTS: usize = 20;
/// Longest reload error kept (five per reload).
const MAX_ERROR_BYTES: usize = 512;
/// Most rules listed by [`Stats::report`] (the busiest first).
pub(crate) const MAX_LISTED_RULES: usize = 200;
/// Clients listed per rule.
pub(crate) const TOP_N: usize = 10;

/// One second of one rule.
#[derive(Debug, Default)]
struct Second {
    /// The second (since the epoch) plus one; 0: never used.
    stamp: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
    near: AtomicU64,
    /// The highest used/limit fraction seen, in thousandths (1000 and more: at or over).
    peak: AtomicU32,
}

impl Second {
    fn get(&self, sec: u64) -> Option<[u64; 5]> {
        (self.stamp.load(Relaxed) == sec + 1).then(|| {
            [
                self.allowed.load(Relaxed),
                self.denied.load(Relaxed),
                self.shadow_denied.load(Relaxed),
                self.near.load(Relaxed),
                u64::from(self.peak.load(Relaxed)),
            ]
        })
    }
}

/// How a decision of a rule went, for [`Stats::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    Allowed,
    Denied,
    /// Over a shadow-mode rule: answered OK, would have been denied.
    ShadowDenied,
}

/// The live statistics of one rule (kept across reloads while the rule exists).
#[derive(Debug)]
pub(crate) struct RuleStats {
    ring: [Second; RING_SECS],
    denied: Mutex<Option<Hitters>>,
    shadow: Mutex<Option<Hitters>>,
    /// Denials not attributed to a key (no sketch could be allocated).
    untracked: AtomicU64,
}

impl Default for RuleStats {
    fn default() -> Self {
        Self {
            ring: std::array::from_fn(|_| Second::default()),
            denied: Mutex::new(None),
            shadow: Mutex::new(None),
            untracked: AtomicU64::new(0),
        }
    }
}

impl RuleStats {
    /// The bucket of `sec`, reset if it still holds an older second. Two threads starting the
    /// same second race on the reset: one may lose the other's first add (a dashboard figure,
    /// not a limit).
    fn bucket(&self, sec: u64) -> &Second {
        let b = &self.ring[(sec as usize) & (RING_SECS - 1)];
        let stamp = sec + 1;
        let seen = b.stamp.load(Relaxed);
        if seen < stamp
            && b.stamp
                .compare_exchange(seen, stamp, Relaxed, Relaxed)
                .is_ok()
        {
            b.allowed.store(0, Relaxed);
            b.denied.store(0, Relaxed);
            b.shadow_denied.store(0, Relaxed);
            b.near.store(0, Relaxed);
            b.peak.store(0, Relaxed);
        }
        b
    }
}

/// One rule statistics record per limit of a loaded rule set, by the limit's position, each filled on
/// the rule's first decision from [`Stats`]' map (so the figures survive reloads). The
/// `Default` (no slots) is valid: nothing is then recorded.
#[derive(Debug, Default)]
pub(crate) struct StatSlots(Box<[OnceLock<Arc<RuleStats>>]>);

impl StatSlots {
    /// One empty slot per limit of `set`.
    pub(crate) fn new(set: &RuleSet) -> Self {
        Self(set.limits().map(|_| OnceLock::new()).collect())
    }
}

/// A recent reload of the rule files.
#[derive(Debug, Clone)]
struct ReloadEvent {
    at: Micros,
    ok: bool,
    generation: u64,
    errors: Vec<String>,
    /// What made the generation: `files` (a load of the rule files) or `registry` (the
    /// registry's domains applied).
    source: &'static str,
}

/// A recent registry change.
#[derive(Debug, Clone)]
struct RegistryEvent {
    at: Micros,
    action: &'static str,
    domain: String,
    version: u64,
}

/// The live statistics of one service instance (`AppState::stats`).
#[derive(Debug)]
pub(crate) struct Stats {
    enabled: AtomicBool,
    /// By rule id (unique in a rule set: it starts with the domain).
    rules: Mutex<HashMap<String, Arc<RuleStats>>>,
    /// Sketches allocated (each gives its unit back when dropped).
    sketches: Arc<AtomicUsize>,
    reloads: Mutex<VecDeque<ReloadEvent>>,
    changes: Mutex<VecDeque<RegistryEvent>>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            enabled: AtomicBool::new(true),
            rules: Mutex::default(),
            sketches: Arc::default(),
            reloads: Mutex::default(),
            changes: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn push_bounded<T>(ring: &Mutex<VecDeque<T>>, item: T) {
    let mut r = lock(ring);
    if r.len() == MAX_EVENTS {
        r.pop_front();
    }
    r.push_back(item);
}

/// `text` cut to `max` bytes at a character boundary, ending with `…` when cut.
fn cut(mut text: String, max: usize) -> String {
    cut_in_place(&mut text, max);
    text
}

fn cut_in_place(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

/// Write a descriptor's entries as a client key into `key` (emptied first): `key=value` pairs
/// joined by `, `, cut at [`MAX_KEY_BYTES`].
pub(crate) fn write_key(key: &mut String, entries: &[(String, String)]) {
    key.clear();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            key.push_str(", ");
        }
        key.push_str(k);
        key.push('=');
        key.push_str(v);
        if key.len() > MAX_KEY_BYTES {
            break;
        }
    }
    cut_in_place(key, MAX_KEY_BYTES);
}

thread_local! {
    /// The key of a denial is written here: a key the sketch already holds (a client that keeps
    /// being denied) costs no allocation.
    static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

impl Stats {
    /// Whether decisions are recorded (`--live-stats`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Record decisions or not.
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    fn rule(&self, limit: &Limit) -> Arc<RuleStats> {
        lock(&self.rules)
            .entry(limit.id.clone())
            .or_default()
            .clone()
    }

    /// Record one decision of `limit` (a rule of `set`, whose slots are `slots`) at `now`: how
    /// it went, the counter's used/limit fraction in thousandths, whether it was near the limit.
    /// `key` (which writes the client key into the buffer it is given) is called on denials
    /// only. A limit given with the request (no slot) is not
    /// recorded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        slots: &StatSlots,
        set: &RuleSet,
        limit: &Limit,
        now: Micros,
        seen: Seen,
        permille: u32,
        near: bool,
        key: impl FnOnce(&mut String),
    ) {
        let Some(slot) = set.index_of(limit).and_then(|i| slots.0.get(i)) else {
            return;
        };
        let rule = slot.get_or_init(|| self.rule(limit));
        let sec = now / 1_000_000;
        let b = rule.bucket(sec);
        let counter = match seen {
            Seen::Allowed => &b.allowed,
            Seen::Denied => &b.denied,
            Seen::ShadowDenied => &b.shadow_denied,
        };
        counter.fetch_add(1, Relaxed);
        if near {
            b.near.fetch_add(1, Relaxed);
        }
        if permille > b.peak.load(Relaxed) {
            b.peak.fetch_max(permille, Relaxed);
        }
        if seen == Seen::Allowed {
            return;
        }
        let sketch = if seen == Seen::Denied {
            &rule.denied
        } else {
            &rule.shadow
        };
        let mut hitters = lock(sketch);
        if hitters.is_none() {
            if self.sketches.fetch_add(1, Relaxed) >= MAX_SKETCHED_RULES {
                self.sketches.fetch_sub(1, Relaxed);
                rule.untracked.fetch_add(1, Relaxed);
                return;
            }
            *hitters = Some(Hitters::new(self.sketches.clone()));
        }
        if let Some(h) = hitters.as_mut() {
            KEY.with_borrow_mut(|buf| {
                key(buf);
                h.offer(sec, buf, 1);
            });
        }
    }

    /// New rules are active: forget the figures of rules that are gone.
    pub(crate) fn rules_loaded(&self, set: &RuleSet) {
        let mut rules = lock(&self.rules);
        if rules.is_empty() {
            return;
        }
        let live: std::collections::HashSet<&str> = set.limits().map(|l| l.id.as_str()).collect();
        rules.retain(|id, _| live.contains(id.as_str()));
    }

    /// A reload of the rule files ended (`errors` empty: it succeeded).
    pub(crate) fn reloaded(&self, at: Micros, generation: u64, errors: &[String]) {
        push_bounded(
            &self.reloads,
            ReloadEvent {
                at,
                ok: errors.is_empty(),
                generation,
                errors: errors
                    .iter()
                    .take(5)
                    .map(|e| cut(e.clone(), MAX_ERROR_BYTES))
                    .collect(),
                source: "files",
            },
        );
    }

    /// The registry's domains were applied beside the files' rules, making `generation`.
    pub(crate) fn registry_applied(&self, at: Micros, generation: u64) {
        push_bounded(
            &self.reloads,
            ReloadEvent {
                at,
                ok: true,
                generation,
                errors: Vec::new(),
                source: "registry",
            },
        );
    }

    /// A registry change was made (`version`: the domain's new version, or the registry
    /// revision of a deletion).
    pub(crate) fn registry_changed(
        &self,
        at: Micros,
        action: &'static str,
        domain: &str,
        version: u64,
    ) {
        push_bounded(
            &self.changes,
            RegistryEvent {
                at,
                action,
                domain: domain.to_string(),
                version,
            },
        );
    }

    /// The report of `GET /v1/stats` at `now`, for the rules `set` (of `generation`) and the
    /// store `backend`.
    pub(crate) fn report(
        &self,
        set: &RuleSet,
        generation: u64,
        backend: &Backend,
        now: Micros,
    ) -> Value {
        let sec = now / 1_000_000;
        let known = lock(&self.rules);
        let mut order: Vec<(u64, &Limit, Option<Arc<RuleStats>>)> = set
            .limits()
            .map(|l| {
                let stats = known.get(l.id.as_str()).cloned();
                (activity(stats.as_deref(), sec), l, stats)
            })
            .collect();
        drop(known);
        let total = order.len();
        // The busiest first (denials weigh most), then in file order (the sort is stable).
        order.sort_by_key(|(a, _, _)| std::cmp::Reverse(*a));
        order.truncate(MAX_LISTED_RULES);
        let listed: Vec<Value> = order
            .iter()
            .map(|(_, limit, stats)| rule_report(limit, stats.as_deref(), sec))
            .collect();
        let ms = |at: Micros| at / 1000;
        let reloads: Vec<Value> = lock(&self.reloads)
            .iter()
            .rev()
            .map(|e| {
                json!({"at_ms": ms(e.at), "ok": e.ok, "generation": e.generation, "errors": e.errors, "source": e.source})
            })
            .collect();
        let changes: Vec<Value> = lock(&self.changes)
            .iter()
            .rev()
            .map(|e| {
                json!({"at_ms": ms(e.at), "action": e.action, "domain": e.domain, "version": e.version})
            })
            .collect();
        json!({
            "enabled": self.enabled(),
            "now_ms": ms(now),
            "window_secs": WINDOW_SECS,
            "epoch_secs": EPOCH_SECS,
            "sketch_capacity": SKETCH_CAPACITY,
            "rules_generation": generation,
            "rules_total": total,
            "rules_listed": listed.len(),
            "rules": listed,
            "store": store_report(backend),
            "reloads": reloads,
            "registry_changes": changes,
        })
    }
}

/// Store and breaker state, as `/readyz` reports them, and a Redis Cluster's masters.
fn store_report(backend: &Backend) -> Value {
    let Some(g) = backend.redis() else {
        return json!({"kind": "memory", "state": "healthy"});
    };
    let one = |g: &crate::backend::Guarded| {
        let r = crate::backend::report(g);
        json!({
            "state": g.state().as_str(),
            "condition": r["store_condition"],
            "error": r["store_error"],
            "nodes": nodes_report(g),
        })
    };
    let mut v = one(g);
    v["kind"] = json!("redis");
    v["on_store_error"] = json!(g.settings().policy.as_str());
    if let Some(p) = backend.per_second() {
        v["per_second"] = one(p);
    }
    v
}

/// A Redis Cluster's masters (empty for a single server or Sentinel), as the
/// `tollgate_store_node_*` metrics count them: each one's breaker, the decisions the failure
/// policy made for its keys, and what was folded back into it after an outage. Addresses are
/// the cluster's own (`CLUSTER SLOTS`), for the admin only, as the whole report is.
fn nodes_report(g: &crate::backend::Guarded) -> Value {
    use crate::backend::BreakerState;
    Value::Array(
        g.node_stats()
            .into_iter()
            .map(|n| {
                let transitions: serde_json::Map<String, Value> = BreakerState::ALL
                    .iter()
                    .map(|s| (s.as_str().to_owned(), json!(n.transitions[*s as usize])))
                    .collect();
                json!({
                    "node": n.node,
                    "serves_slots": n.serves_slots,
                    "state": n.state.as_str(),
                    "transitions": transitions,
                    "degraded_decisions": n.degraded,
                    "folded_keys": n.folded_keys,
                    "folded_cost": n.folded_cost,
                })
            })
            .collect(),
    )
}

/// How busy a rule was over the window ending at `sec`, for the order of the report: denials
/// weigh most.
fn activity(stats: Option<&RuleStats>, sec: u64) -> u64 {
    let Some(r) = stats else {
        return 0;
    };
    let (mut denied, mut allowed) = (0u64, 0u64);
    for s in (sec + 1 - WINDOW_SECS.min(sec + 1))..=sec {
        if let Some(g) = r.ring[(s as usize) & (RING_SECS - 1)].get(s) {
            denied = denied.saturating_add(g[1]).saturating_add(g[2]);
            allowed = allowed.saturating_add(g[0]);
        }
    }
    denied
        .saturating_mul(1 << 20)
        .saturating_add(allowed.min((1 << 20) - 1))
}

/// One rule's report.
fn rule_report(limit: &Limit, stats: Option<&RuleStats>, sec: u64) -> Value {
    let mut series = [const { Vec::new() }; 3];
    let mut totals = [0u64; 4];
    let (mut peak_recent, mut peak_window) = (0u64, 0u64);
    for s in (sec + 1 - WINDOW_SECS.min(sec + 1))..=sec {
        let got = stats
            .and_then(|r| r.ring[(s as usize) & (RING_SECS - 1)].get(s))
            .unwrap_or_default();
        for (i, v) in series.iter_mut().enumerate() {
            v.push(got[i]);
        }
        for (t, g) in totals.iter_mut().zip(got) {
            *t += g;
        }
        peak_window = peak_window.max(got[4]);
        if s + RECENT_SECS > sec {
            peak_recent = peak_recent.max(got[4]);
        }
    }
    let top = |m: Option<&Mutex<Option<Hitters>>>| -> Value {
        let list = m
            .and_then(|m| lock(m).as_ref().map(|h| h.top(sec, TOP_N)))
            .unwrap_or_default();
        Value::Array(
            list.into_iter()
                .map(|(key, count, error)| json!({"key": key, "count": count, "error": error}))
                .collect(),
        )
    };
    json!({
        "domain": limit.domain,
        "rule": limit.id,
        "name": limit.name,
        "limit": limit.quota.map(|q| json!({
            "requests_per_unit": q.limit(),
            "unit": q.period().unit.as_str(),
            "unit_multiplier": q.period().multiplier,
        })),
        "algorithm": limit.quota.map(|q| q.algorithm().as_str()),
        "shadow_mode": limit.shadow_mode,
        "last_60s": {
            "allowed": totals[0],
            "denied": totals[1],
            "shadow_denied": totals[2],
            "near_limit": totals[3],
        },
        "per_second": {
            "allowed": series[0],
            "denied": series[1],
            "shadow_denied": series[2],
        },
        "busiest": {
            "recent": peak_recent as f64 / 1000.0,
            "last_60s": peak_window as f64 / 1000.0,
        },
        "most_limited": top(stats.map(|s| &s.denied)),
        "would_be_denied": top(stats.map(|s| &s.shadow)),
        "untracked_denials": stats.map_or(0, |s| s.untracked.load(Relaxed)),
    })
}

/// The heavy hitters of the current and the previous epoch (of [`EPOCH_SECS`]).
#[derive(Debug)]
struct Hitters {
    epoch: u64,
    current: SpaceSaving,
    previous: Option<SpaceSaving>,
    /// Counts this sketch in [`Stats`]' budget; given back on drop.
    budget: Arc<AtomicUsize>,
}

impl Drop for Hitters {
    fn drop(&mut self) {
        self.budget.fetch_sub(1, Relaxed);
    }
}

impl Hitters {
    fn new(budget: Arc<AtomicUsize>) -> Self {
        Self {
            epoch: 0,
            current: SpaceSaving::new(SKETCH_CAPACITY),
            previous: None,
            budget,
        }
    }

    fn offer(&mut self, sec: u64, key: &str, n: u64) {
        let epoch = sec / EPOCH_SECS;
        if epoch != self.epoch {
            let old = std::mem::replace(&mut self.current, SpaceSaving::new(SKETCH_CAPACITY));
            self.previous = (epoch == self.epoch + 1).then_some(old);
            self.epoch = epoch;
        }
        self.current.offer(key, n);
    }

    /// The `n` keys with the highest estimated counts over the current and the previous epoch
    /// (as of `sec`): `(key, count, error)`, `count - error` a lower bound of the true count.
    fn top(&self, sec: u64, n: usize) -> Vec<(String, u64, u64)> {
        let epoch = sec / EPOCH_SECS;
        let parts: Vec<&SpaceSaving> = if epoch == self.epoch {
            std::iter::once(&self.current)
                .chain(self.previous.as_ref())
                .collect()
        } else if epoch == self.epoch + 1 {
            vec![&self.current]
        } else {
            Vec::new()
        };
        let mut merged: HashMap<&str, (u64, u64)> = HashMap::new();
        for p in parts {
            for (key, count, error) in p.entries() {
                let e = merged.entry(key).or_default();
                e.0 += count;
                e.1 += error;
            }
        }
        let mut list: Vec<_> = merged
            .into_iter()
            .map(|(k, (c, e))| (k.to_string(), c, e))
            .collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        list.truncate(n);
        list
    }
}

/// The space-saving heavy-hitters sketch (Metwally, Agrawal, El Abbadi, 2005) over at most
/// `capacity` keys. A key already held gets its count raised; a new key takes the slot of the
/// key with the lowest count, inheriting that count as its error. With `total` the sum of what
/// was offered:
///
/// - every estimate is at least the key's true count and over-estimates it by at most its
///   `error`, which is at most `total / capacity`;
/// - every key whose true count is more than `total / capacity` is held.
///
/// The slots form a binary min-heap on their counts (an index from key to slot, and from slot
/// to heap position), so an offer costs a hash lookup and O(log capacity) swaps.
#[derive(Debug)]
pub(crate) struct SpaceSaving {
    capacity: usize,
    slots: Vec<Slot>,
    index: HashMap<Arc<str>, usize>,
    /// Slot numbers, a min-heap on their counts.
    heap: Vec<usize>,
    /// Each slot's position in `heap`.
    pos: Vec<usize>,
    total: u64,
}

#[derive(Debug)]
struct Slot {
    key: Arc<str>,
    count: u64,
    error: u64,
}

impl SpaceSaving {
    /// An empty sketch of `capacity` keys (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            slots: Vec::new(),
            index: HashMap::new(),
            heap: Vec::new(),
            pos: Vec::new(),
            total: 0,
        }
    }

    /// The sum of every count offered.
    #[cfg(test)]
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Keys held (at most the capacity).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Count `n` more for `key`.
    pub(crate) fn offer(&mut self, key: impl Into<Arc<str>> + AsRef<str>, n: u64) {
        self.total = self.total.saturating_add(n);
        if let Some(&slot) = self.index.get(key.as_ref()) {
            self.slots[slot].count = self.slots[slot].count.saturating_add(n);
            self.sift_down(self.pos[slot]);
            return;
        }
        let key: Arc<str> = key.into();
        if self.slots.len() < self.capacity {
            let slot = self.slots.len();
            self.slots.push(Slot {
                key: key.clone(),
                count: n,
                error: 0,
            });
            self.index.insert(key, slot);
            self.heap.push(slot);
            self.pos.push(self.heap.len() - 1);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        let slot = self.heap[0];
        let s = &mut self.slots[slot];
        self.index.remove(&s.key);
        s.key = key.clone();
        s.error = s.count;
        s.count = s.count.saturating_add(n);
        self.index.insert(key, slot);
        self.sift_down(0);
    }

    /// Every key held: `(key, estimated count, error)`.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.slots.iter().map(|s| (&*s.key, s.count, s.error))
    }

    /// The `n` keys with the highest estimates, highest first.
    #[cfg(test)]
    pub(crate) fn top(&self, n: usize) -> Vec<(&str, u64, u64)> {
        let mut all: Vec<_> = self.entries().collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        all.truncate(n);
        all
    }

    fn count_at(&self, heap_pos: usize) -> u64 {
        self.slots[self.heap[heap_pos]].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a]] = a;
        self.pos[self.heap[b]] = b;
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.count_at(i) >= self.count_at(parent) {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let len = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < len && self.count_at(l) < self.count_at(least) {
                least = l;
            }
            if r < len && self.count_at(r) < self.count_at(least) {
                least = r;
            }
            if least == i {
                break;
            }
            self.swap(i, least);
            i = least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_while_under_capacity() {
        let mut s = SpaceSaving::new(4);
        for (k, n) in [("a", 3), ("b", 1), ("a", 2), ("c", 7)] {
            s.offer(k, n);
        }
        assert_eq!(s.top(10), vec![("c", 7, 0), ("a", 5, 0), ("b", 1, 0)]);
        assert_eq!(s.total(), 13);
    }

    #[test]
    fn a_new_key_takes_the_lowest_slot_and_its_count_as_error() {
        let mut s = SpaceSaving::new(2);
        s.offer("a", 5);
        s.offer("b", 2);
        s.offer("c", 1);
        assert_eq!(s.top(10), vec![("a", 5, 0), ("c", 3, 2)]);
        assert_eq!(s.len(), 2);
    }

    /// The heavy-hitter guarantee on a long tail: 1M distinct keys seen once each and 10 keys
    /// seen 5,000 times each, interleaved. Every heavy key is held and in the top 20, every
    /// estimate is within `total / capacity` above the true count, and the sketch never holds
    /// more than its capacity.
    #[test]
    fn heavy_hitters_survive_a_million_distinct_keys() {
        const CAPACITY: usize = 1000;
        const HEAVY: u64 = 5_000;
        let mut s = SpaceSaving::new(CAPACITY);
        let heavy: Vec<String> = (0..10).map(|i| format!("heavy-{i}")).collect();
        let mut tail = 0u64;
        for round in 0..HEAVY {
            for h in &heavy {
                s.offer(h.as_str(), 1);
            }
            for _ in 0..200 {
                s.offer(format!("k{tail}"), 1);
                tail += 1;
            }
            if round % 1000 == 0 {
                assert!(s.len() <= CAPACITY);
            }
        }
        assert_eq!(tail, 1_000_000);
        let total = s.total();
        assert_eq!(total, 1_000_000 + 10 * HEAVY);
        let bound = total / CAPACITY as u64;
        assert!(bound < HEAVY, "the test must plant keys above the bound");
        let top = s.top(20);
        for h in &heavy {
            let (_, count, error) = top
                .iter()
                .find(|(k, _, _)| k == h)
                .unwrap_or_else(|| panic!("{h} is not in the top 20: {top:?}"));
            assert!(*count >= HEAVY && *count - HEAVY <= bound, "{h}: {count}");
            assert!(*error <= bound);
        }
        for (k, count, error) in s.entries() {
            assert!(error <= bound, "{k}: error {error} > {bound}");
            let truth = if k.starts_with("heavy-") { HEAVY } else { 1 };
            assert!(count >= truth && count - truth <= bound, "{k}: {count}");
        }
        assert_eq!(s.len(), CAPACITY);
    }

    #[test]
    fn hitters_cover_two_epochs_then_forget() {
        let budget = Arc::new(AtomicUsize::new(1));
        let mut h = Hitters::new(budget.clone());
        let t0 = 10 * EPOCH_SECS;
        h.offer(t0, "old", 3);
        h.offer(t0 + EPOCH_SECS, "new", 1);
        h.offer(t0 + EPOCH_SECS, "old", 1);
        assert_eq!(
            h.top(t0 + EPOCH_SECS, 5),
            vec![("old".to_string(), 4, 0), ("new".to_string(), 1, 0)]
        );
        // One epoch later the current epoch's keys remain as the previous one's.
        assert_eq!(h.top(t0 + 2 * EPOCH_SECS, 5).len(), 2);
        assert!(h.top(t0 + 3 * EPOCH_SECS, 5).is_empty());
        drop(h);
        assert_eq!(budget.load(Relaxed), 0);
    }

    fn key_of(entries: &[(String, String)]) -> String {
        let mut key = String::from("left over");
        write_key(&mut key, entries);
        key
    }

    #[test]
    fn keys_are_bounded() {
        let long = "é".repeat(200);
        let k = key_of(&[("user".into(), long)]);
        assert!(k.len() <= MAX_KEY_BYTES && k.ends_with('…'));
        assert_eq!(
            key_of(&[("a".into(), "1".into()), ("b".into(), "2".into())]),
            "a=1, b=2"
        );
    }

    #[test]
    fn buckets_roll_over_each_second() {
        let r = RuleStats::default();
        r.bucket(5).allowed.fetch_add(2, Relaxed);
        assert_eq!(r.ring[5].get(5).map(|g| g[0]), Some(2));
        r.bucket(5 + RING_SECS as u64).allowed.fetch_add(1, Relaxed);
        assert_eq!(r.ring[5].get(5), None);
        assert_eq!(r.ring[5].get(5 + RING_SECS as u64).map(|g| g[0]), Some(1));
    }
}
