//! The in-memory store: sharded hash maps of compact per-key state.
//!
//! - **Keys are 128-bit keyed hashes** (SipHash-1-3 with a per-store random key) of the counter
//!   key, with the algorithm and period XORed in, not the key text: an entry is 40 bytes whatever
//!   the key length, lookups never allocate, and the odds that two of a billion live keys collide
//!   are below 10^-20 (keys are attacker-controlled, so the hash stays a keyed PRF: an attacker
//!   cannot aim for a collision without the random key; a cheaper unkeyed or 64-bit hash would
//!   make shared counters a matter of luck or effort). Including the algorithm and period means
//!   a rule whose limit changes keeps its counters across a reload, while one whose algorithm or
//!   period changes starts fresh.
//! - **Fast path**: a single-item check hashes once, locks one shard, and steps the one-word
//!   states (GCRA, leaky bucket) in place; nothing allocates.
//! - **Shards** (a mutex each) keep threads on different keys out of each other's way; a request
//!   touching several keys locks their shards in index order, so it cannot deadlock.
//! - **Expiry**: a step that leaves a key full removes it; every entry knows when it will be full
//!   again, and [`MemoryStore::sweep`] drops those past it.
//! - **Bounded**: at most `max_keys` entries. When a shard is full, a new key first evicts every
//!   expired entry (free: they hold nothing), then, if still above 90 %, the entries that will
//!   be full soonest (they hold the least usage, so forgetting them admits the least extra). An
//!   evicted key starts again from a full allowance: that is the accuracy cost of a flood of
//!   distinct keys, and it falls on the keys that used the least. Count-min-sketch limits are
//!   not affected: their memory is fixed.

use crate::algorithm::{self, gcra, leaky_bucket, Bucket, Counter, Log, Sketch, State, Window};
use crate::clock::{Micros, SECOND};
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};
use crate::store::{blocks, CheckItem, Store, StoreError};
use siphasher::sip128::SipHasher13;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Default bound on tracked keys.
pub const DEFAULT_MAX_KEYS: usize = 1 << 22;
const SHARDS: usize = 64;

/// Per-key state as stored: counts as `u32` (limits are at most `u32::MAX`, as in Envoy's API)
/// and expiry in whole seconds, so that every entry is 24 bytes.
#[derive(Debug)]
enum Slot {
    Gcra(Micros),
    Leaky(Micros),
    Bucket {
        tokens: u32,
        expires: u32,
        last: Micros,
    },
    Window {
        count: u32,
        expires: u32,
        start: Micros,
    },
    Counter {
        prev: u32,
        cur: u32,
        expires: u32,
        start: Micros,
    },
    Log(Box<(Log, Micros)>),
}

fn narrow(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn secs_up(t: Micros) -> u32 {
    narrow(t.div_ceil(SECOND))
}

impl Slot {
    fn new(state: State, expires_at: Micros) -> Slot {
        match state {
            State::Gcra(t) => Slot::Gcra(t),
            State::Leaky(t) => Slot::Leaky(t),
            State::Bucket(b) => Slot::Bucket {
                tokens: narrow(b.tokens),
                expires: secs_up(expires_at),
                last: b.last,
            },
            State::Window(w) => Slot::Window {
                count: narrow(w.count),
                expires: secs_up(expires_at),
                start: w.start,
            },
            State::Counter(c) => Slot::Counter {
                prev: narrow(c.prev),
                cur: narrow(c.cur),
                expires: secs_up(expires_at),
                start: c.start,
            },
            State::Log(l) => Slot::Log(Box::new((l, expires_at))),
        }
    }

    fn state(&self) -> State {
        match self {
            Slot::Gcra(t) => State::Gcra(*t),
            Slot::Leaky(t) => State::Leaky(*t),
            Slot::Bucket { tokens, last, .. } => State::Bucket(Bucket {
                tokens: u64::from(*tokens),
                last: *last,
            }),
            Slot::Window { count, start, .. } => State::Window(Window {
                count: u64::from(*count),
                start: *start,
            }),
            Slot::Counter {
                prev, cur, start, ..
            } => State::Counter(Counter {
                prev: u64::from(*prev),
                cur: u64::from(*cur),
                start: *start,
            }),
            Slot::Log(b) => State::Log(b.0.clone()),
        }
    }

    /// Take the state out, leaving a placeholder (avoids cloning a log on the single-key path).
    fn take(&mut self) -> State {
        match self {
            Slot::Log(b) => State::Log(std::mem::take(&mut b.0)),
            other => other.state(),
        }
    }

    /// Step this key's state in place; `false` when it is back to full (the caller drops it).
    /// The one-word states (GCRA, leaky bucket) are stepped directly on their timestamp, skipping
    /// the [`State`] round trip (same step functions, so the same decisions and states).
    fn step(&mut self, quota: &Quota, now: Micros, cost: u64) -> (Decision, bool) {
        let one_word = match (&mut *self, quota.algorithm) {
            (Slot::Gcra(t), Algorithm::Gcra) => Some((gcra::step(Some(*t), now, cost, quota), t)),
            (Slot::Leaky(t), Algorithm::LeakyBucket) => {
                Some((leaky_bucket::step(Some(*t), now, cost, quota), t))
            }
            _ => None,
        };
        if let Some(((d, next), t)) = one_word {
            return match next {
                Some(n) => {
                    *t = n;
                    (d, true)
                }
                None => (d, false),
            };
        }
        let (d, next) = algorithm::step(quota, Some(self.take()), now, cost);
        match next {
            Some(s) => {
                *self = Slot::new(s, now + d.reset_after);
                (d, true)
            }
            None => (d, false),
        }
    }

    fn expires_at(&self) -> Micros {
        match self {
            Slot::Gcra(t) | Slot::Leaky(t) => *t,
            Slot::Bucket { expires, .. }
            | Slot::Window { expires, .. }
            | Slot::Counter { expires, .. } => u64::from(*expires) * SECOND,
            Slot::Log(b) => b.1,
        }
    }
}

/// A counter's identity: its 128-bit keyed hash as two words. Not a `u128`: that is 16-byte
/// aligned on x86-64 and would pad every map entry from 40 to 48 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key([u64; 2]);

impl Key {
    fn wide(self) -> u128 {
        u128::from(self.0[0]) | (u128::from(self.0[1]) << 64)
    }
}

impl From<u128> for Key {
    fn from(h: u128) -> Self {
        Key([h as u64, (h >> 64) as u64])
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already uniformly random: the high word is the table hash (the low word picks the shard).
        state.write_u64(self.0[1]);
    }
}

/// Hasher for [`Key`], which hashes itself with one `write_u64`.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Map = HashMap<Key, Slot, BuildHasherDefault<Prehashed>>;

#[derive(Default)]
struct Shard {
    map: Map,
}

impl Shard {
    /// Make room for one more entry under `cap`.
    fn make_room(&mut self, cap: usize, now: Micros) {
        if self.map.len() < cap {
            return;
        }
        self.map.retain(|_, s| s.expires_at() > now);
        let target = cap - cap / 10;
        if self.map.len() <= target {
            return;
        }
        let mut expiries: Vec<Micros> = self.map.values().map(Slot::expires_at).collect();
        let excess = self.map.len() - target;
        let (_, &mut threshold, _) = expiries.select_nth_unstable(excess - 1);
        self.map.retain(|_, s| s.expires_at() > threshold);
    }
}

/// The in-memory [`Store`].
pub struct MemoryStore {
    k0: u64,
    k1: u64,
    shards: Box<[Mutex<Shard>]>,
    shard_cap: usize,
    sketches: RwLock<HashMap<u128, Arc<Mutex<Sketch>>>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("max_keys", &(self.shard_cap * SHARDS))
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_KEYS)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard cannot leave a slot half-written (steps are pure and
    // writes are single assignments), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    /// A store tracking at most `max_keys` keys, with a random hash key.
    pub fn new(max_keys: usize) -> Self {
        let rs = std::collections::hash_map::RandomState::new();
        Self::with_seed(max_keys, rs.hash_one(1u8), rs.hash_one(2u8))
    }

    /// A store with a fixed hash key: identical runs give identical results even where hashes
    /// matter (count-min-sketch collisions, eviction order). For `simulate` and tests.
    pub fn with_seed(max_keys: usize, k0: u64, k1: u64) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Self {
            k0,
            k1,
            shards,
            shard_cap: max_keys.div_ceil(SHARDS).max(1),
            sketches: RwLock::new(HashMap::new()),
        }
    }

    /// SipHash-1-3 (128 bit) of `bytes`, through siphasher's one-shot path (8-byte loads, no
    /// tail buffering).
    fn hash(&self, bytes: &[u8]) -> u128 {
        SipHasher13::new_with_keys(self.k0, self.k1)
            .hash(bytes)
            .as_u128()
    }

    /// The key's hash with the limit's shape (algorithm, period) XORed into the low word instead
    /// of hashed with it: one SipHash block less per check, and just as collision-free. Equal
    /// keys of different shapes differ in the low word (the shape encoding is injective); for
    /// different keys the hashes are independent pseudo-random values, so `H(a) ^ H(b)` equals a
    /// given non-zero shape difference with the same 2^-128 odds as it equals zero, and an
    /// attacker without the random key can aim at neither.
    fn key_hash(&self, item: &CheckItem<'_>) -> Key {
        let q = item.quota;
        let shape = (q.algorithm as u64) << 40
            | (q.period.unit as u64) << 32
            | u64::from(q.period.multiplier);
        let mut k = Key::from(self.hash(item.key.as_bytes()));
        k.0[0] ^= shape;
        k
    }

    fn sketch(&self, item: &CheckItem<'_>) -> Arc<Mutex<Sketch>> {
        let q = item.quota;
        let period = (q.period.unit as u128) << 32 | u128::from(q.period.multiplier);
        let size = u128::from(q.sketch.width) << 32 | u128::from(q.sketch.depth);
        // As in `key_hash`: the shape is XORed in (injectively, high and low words).
        let id = self.hash(item.rule.as_bytes()) ^ (size << 64 | period);
        let found = self
            .sketches
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        if let Some(s) = found {
            return s;
        }
        self.sketches
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_insert_with(|| Arc::new(Mutex::new(Sketch::new(q.sketch))))
            .clone()
    }

    fn shard_of(&self, h: Key) -> usize {
        (h.0[0] as usize) % SHARDS
    }

    /// Number of tracked keys (count-min-sketch keys are not tracked individually).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every entry that is back to full at `now`. Returns how many were dropped.
    pub fn sweep(&self, now: Micros) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let mut s = lock(s);
                let before = s.map.len();
                s.map.retain(|_, slot| slot.expires_at() > now);
                before - s.map.len()
            })
            .sum()
    }

    /// Bytes held by count-min sketches.
    pub fn sketch_memory(&self) -> usize {
        self.sketches
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|s| lock(s).memory())
            .sum()
    }

    fn step_one(&self, now: Micros, item: &CheckItem<'_>) -> Decision {
        if item.quota.algorithm == Algorithm::CountMinSketch {
            let h = self.key_hash(item);
            return lock(&self.sketch(item)).check(h.wide(), now, item.cost, item.quota);
        }
        let h = self.key_hash(item);
        let mut shard = lock(&self.shards[self.shard_of(h)]);
        match shard.map.get_mut(&h) {
            Some(slot) => {
                let (d, keep) = slot.step(item.quota, now, item.cost);
                if !keep {
                    shard.map.remove(&h);
                }
                d
            }
            None => {
                let (d, next) = algorithm::step(item.quota, None, now, item.cost);
                if let Some(s) = next {
                    shard.make_room(self.shard_cap, now);
                    shard.map.insert(h, Slot::new(s, now + d.reset_after));
                }
                d
            }
        }
    }

    fn check_many(&self, now: Micros, items: &[CheckItem<'_>]) -> Vec<Decision> {
        let hashes: Vec<Key> = items.iter().map(|i| self.key_hash(i)).collect();
        let sketches: Vec<Option<Arc<Mutex<Sketch>>>> = items
            .iter()
            .map(|i| (i.quota.algorithm == Algorithm::CountMinSketch).then(|| self.sketch(i)))
            .collect();
        // Lock order: shards by index, then sketches by address. Every multi-key check uses the
        // same order, and a single-key check holds one lock, so no cycle can form.
        let mut shard_ids: Vec<usize> = hashes
            .iter()
            .zip(&sketches)
            .filter(|(_, s)| s.is_none())
            .map(|(h, _)| self.shard_of(*h))
            .collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = shard_ids
            .iter()
            .map(|&i| (i, lock(&self.shards[i])))
            .collect();
        let mut sketch_refs: Vec<&Arc<Mutex<Sketch>>> = sketches.iter().flatten().collect();
        sketch_refs.sort_by_key(|a| Arc::as_ptr(a) as usize);
        sketch_refs.dedup_by(|a, b| Arc::ptr_eq(a, b));
        let mut sketch_guards: Vec<(*const Mutex<Sketch>, MutexGuard<'_, Sketch>)> = sketch_refs
            .iter()
            .map(|a| (Arc::as_ptr(a), lock(a)))
            .collect();

        // Evaluate in order; a key appearing twice sees the earlier item's tentative state.
        let mut pending: Vec<(Key, Option<State>)> = Vec::new();
        let mut decisions: Vec<Decision> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let h = hashes[i];
            let d = if let Some(sk) = &sketches[i] {
                let g = locked(&mut sketch_guards, Arc::as_ptr(sk));
                // Earlier admitted items of the same key in this request count too.
                let earlier: u64 = items[..i]
                    .iter()
                    .zip(&decisions)
                    .zip(&hashes)
                    .filter(|((e, d), eh)| **eh == h && d.allowed && e.rule == item.rule)
                    .map(|((e, _), _)| e.cost)
                    .sum();
                let mut d = g.evaluate(h.wide(), now, earlier + item.cost, item.quota);
                d.remaining = d.remaining.min(item.quota.limit);
                d
            } else {
                let shard = locked(&mut guards, self.shard_of(h));
                let current = match pending.iter().rev().find(|(ph, _)| *ph == h) {
                    Some((_, s)) => s.clone(),
                    None => shard.map.get(&h).map(Slot::state),
                };
                let (d, next) = algorithm::step(item.quota, current, now, item.cost);
                pending.push((h, next));
                d
            };
            decisions.push(d);
        }

        if blocks(items, &decisions) {
            // Nothing consumes: report what each allowed item has left, unconsumed.
            for (i, item) in items.iter().enumerate() {
                if decisions[i].allowed && item.cost > 0 {
                    let h = hashes[i];
                    decisions[i] = if let Some(sk) = &sketches[i] {
                        let g = locked(&mut sketch_guards, Arc::as_ptr(sk));
                        g.evaluate(h.wide(), now, 0, item.quota)
                    } else {
                        let shard = locked(&mut guards, self.shard_of(h));
                        let state = shard.map.get(&h).map(Slot::state);
                        algorithm::step(item.quota, state, now, 0).0
                    };
                }
            }
            return decisions;
        }

        // Commit: per-key states in order (the last write of a repeated key is its final state).
        let mut p = 0;
        for (i, item) in items.iter().enumerate() {
            let h = hashes[i];
            if let Some(sk) = &sketches[i] {
                if decisions[i].allowed {
                    let g = locked(&mut sketch_guards, Arc::as_ptr(sk));
                    g.record(h.wide(), item.cost);
                }
                continue;
            }
            let next = pending[p].1.take();
            p += 1;
            if !decisions[i].allowed {
                continue; // a denied shadow item consumes nothing
            }
            let shard = locked(&mut guards, self.shard_of(h));
            match next {
                Some(s) => {
                    if !shard.map.contains_key(&h) {
                        shard.make_room(self.shard_cap, now);
                    }
                    shard
                        .map
                        .insert(h, Slot::new(s, now + decisions[i].reset_after));
                }
                None => {
                    shard.map.remove(&h);
                }
            }
        }
        decisions
    }
}

/// The guard locked for `id` among `guards` (which hold every lock a multi-key check needs,
/// taken up front in lock order).
fn locked<'a, 'g, I: PartialEq, T>(guards: &'a mut [(I, MutexGuard<'g, T>)], id: I) -> &'a mut T {
    let (_, guard) = guards
        .iter_mut()
        .find(|(i, _)| *i == id)
        .expect("every lock a check needs is taken before it evaluates");
    guard
}

impl Store for MemoryStore {
    fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Vec<Decision>, StoreError> {
        Ok(match items {
            [] => Vec::new(),
            [one] => vec![self.step_one(now, one)],
            many => self.check_many(now, many),
        })
    }

    fn check_one(&self, now: Micros, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        Ok(self.step_one(now, item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Period, Unit};

    fn item<'a>(key: &'a str, quota: &'a Quota, cost: u64) -> CheckItem<'a> {
        CheckItem {
            rule: "r",
            key,
            quota,
            cost,
            shadow: false,
        }
    }

    #[test]
    fn slot_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn all_or_nothing_across_keys() {
        let s = MemoryStore::with_seed(1000, 1, 2);
        let wide = Quota::new(10, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
        let narrow_q = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
        let now = 1_000 * SECOND;
        let both = [item("a", &wide, 1), item("b", &narrow_q, 1)];
        let d = s.check(now, &both).unwrap();
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!(d[0].remaining, 9);
        let d = s.check(now, &both).unwrap();
        assert!(d[0].allowed && !d[1].allowed);
        // "a" was not consumed by the denied request.
        assert_eq!(d[0].remaining, 9);
        let d = s.check(now, &[item("a", &wide, 0)]).unwrap();
        assert_eq!(d[0].remaining, 9);
    }

    #[test]
    fn shadow_item_never_blocks_and_denied_shadow_consumes_nothing() {
        let s = MemoryStore::with_seed(1000, 1, 2);
        let q = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
        let now = 1_000 * SECOND;
        let mut shadow = item("s", &q, 1);
        shadow.shadow = true;
        let five = Quota::new(5, Unit::Minute);
        let real = item("r", &five, 1);
        for round in 0..3 {
            let d = s.check(now, &[shadow, real]).unwrap();
            assert_eq!(d[0].allowed, round == 0);
            assert!(d[1].allowed);
        }
    }

    #[test]
    fn repeated_key_in_one_request_counts_twice() {
        let s = MemoryStore::with_seed(1000, 1, 2);
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::CountMinSketch,
            Algorithm::Gcra,
        ] {
            let q = Quota::new(3, Unit::Minute).with_algorithm(alg);
            let key = format!("k-{alg}");
            let d = s
                .check(SECOND, &[item(&key, &q, 2), item(&key, &q, 2)])
                .unwrap();
            assert!(d[0].allowed && !d[1].allowed, "{alg}: {d:?}");
            // Blocked: nothing consumed.
            let d = s.check(SECOND, &[item(&key, &q, 3)]).unwrap();
            assert!(d[0].allowed, "{alg}");
        }
    }

    #[test]
    fn limit_change_keeps_counters_but_algorithm_or_period_change_starts_fresh() {
        let s = MemoryStore::with_seed(1000, 1, 2);
        let now = 1_000 * SECOND;
        let q = Quota::new(2, Unit::Minute).with_algorithm(Algorithm::Gcra);
        assert!(s.check_one(now, &item("k", &q, 2)).unwrap().allowed);
        // Same algorithm and period, another limit: the same counter (still exhausted for 2/min).
        let wider = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::Gcra);
        assert_eq!(
            s.check_one(now, &item("k", &wider, 0)).unwrap().remaining,
            0
        );
        // Another period or algorithm (even one with the same one-word state): a fresh counter.
        let per_hour = Quota::new(2, Unit::Hour).with_algorithm(Algorithm::Gcra);
        let leaky = Quota::new(2, Unit::Minute).with_algorithm(Algorithm::LeakyBucket);
        let two_min = Quota::new(2, Period::new(Unit::Minute, 2)).with_algorithm(Algorithm::Gcra);
        for other in [per_hour, leaky, two_min] {
            let d = s.check_one(now, &item("k", &other, 0)).unwrap();
            assert_eq!(d.remaining, 2, "{other:?}");
        }
    }

    #[test]
    fn in_place_one_word_step_matches_the_generic_step() {
        // The fast path for GCRA and leaky-bucket slots must give exactly `algorithm::step`.
        for alg in [Algorithm::Gcra, Algorithm::LeakyBucket] {
            let s = MemoryStore::with_seed(1000, 1, 2);
            let q = Quota::new(5, Unit::Second)
                .with_algorithm(alg)
                .with_burst(3);
            let mut state = None;
            for i in 0..200u64 {
                let now = SECOND + i * 37_000;
                let cost = i % 3;
                let d = s.check_one(now, &item("k", &q, cost)).unwrap();
                let (want, next) = algorithm::step(&q, state.take(), now, cost);
                state = next;
                assert_eq!(d, want, "{alg} step {i}");
            }
        }
    }

    #[test]
    fn full_state_is_dropped_and_sweep_expires() {
        let s = MemoryStore::with_seed(1000, 1, 2);
        let q = Quota::new(10, Unit::Second).with_algorithm(Algorithm::Gcra);
        s.check(SECOND, &[item("k", &q, 0)]).unwrap();
        assert_eq!(s.len(), 0, "a query on an untracked key stores nothing");
        s.check(SECOND, &[item("k", &q, 1)]).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s.sweep(SECOND + 50_000), 0);
        assert_eq!(s.sweep(SECOND + 100_000), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn eviction_takes_expired_and_soonest_full_entries_before_long_lived_ones() {
        // 10 entries per shard. 128 keys limited for an hour (full again in an hour), then a
        // flood of 5,000 keys whose state is full again 100 ms later.
        let s = MemoryStore::with_seed(SHARDS * 10, 1, 2);
        let hour = Quota::new(1, Unit::Hour).with_algorithm(Algorithm::Gcra);
        let brief = Quota::new(10, Unit::Second).with_algorithm(Algorithm::Gcra);
        let long: Vec<String> = (0..128).map(|i| format!("user={i}")).collect();
        let flood: Vec<String> = (0..5_000).map(|i| format!("ip={i}")).collect();
        let limited = |s: &MemoryStore, now| {
            long.iter()
                .filter(|k| s.check_one(now, &item(k, &hour, 0)).unwrap().remaining == 0)
                .count()
        };
        for k in &long {
            s.check_one(SECOND, &item(k, &hour, 1)).unwrap();
        }
        assert_eq!(limited(&s, SECOND), 128, "no shard is full yet");
        // At one instant nothing has expired: the flood evicts its own (soonest full) entries.
        for k in &flood {
            s.check_one(SECOND, &item(k, &brief, 1)).unwrap();
        }
        assert!(s.len() <= SHARDS * 10, "{}", s.len());
        assert_eq!(limited(&s, SECOND), 128, "soonest full evicted first");
        // A second later the flood's entries have expired: a new flood evicts those first.
        for k in &flood {
            s.check_one(2 * SECOND, &item(&format!("{k}b"), &brief, 1))
                .unwrap();
        }
        assert!(s.len() <= SHARDS * 10, "{}", s.len());
        assert_eq!(limited(&s, 2 * SECOND), 128, "expired evicted first");
    }

    #[test]
    fn count_min_sketch_memory_is_fixed_whatever_the_keys() {
        let s = MemoryStore::with_seed(1000, 1, 2);
        let q = Quota::new(5, Unit::Second).with_algorithm(Algorithm::CountMinSketch);
        s.check_one(SECOND, &item("ip=0", &q, 1)).unwrap();
        let one_key = s.sketch_memory();
        assert!(one_key > 0);
        for i in 0..100_000 {
            s.check_one(SECOND + i, &item(&format!("ip={i}"), &q, 1))
                .unwrap();
        }
        assert_eq!(s.sketch_memory(), one_key, "fixed memory");
        assert_eq!(s.len(), 0, "no per-key entries");
    }

    #[test]
    fn bounded_keys_evict_expired_then_soonest_full() {
        let s = MemoryStore::with_seed(SHARDS * 10, 1, 2);
        let q = Quota::new(1, Unit::Hour).with_algorithm(Algorithm::Gcra);
        let keys: Vec<String> = (0..5_000).map(|i| format!("ip={i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            s.check(SECOND + i as u64, &[item(k, &q, 1)]).unwrap();
        }
        assert!(s.len() <= SHARDS * 10, "{}", s.len());
        // The most recent keys (full latest) are still limited.
        let d = s
            .check(SECOND + 5_000, &[item(&keys[4_999], &q, 1)])
            .unwrap();
        assert!(!d[0].allowed);
    }
}
