//! The in-memory store: sharded hash maps of compact per-key state.
//!
//! - **Keys are 128-bit keyed hashes** (SipHash-1-3 with a per-store random key) of the counter
//!   key, with the algorithm and period XORed in, not the key text: an entry is 32 bytes whatever
//!   the key length (two per cache line: the state's layout tag rides in the key's low 3 bits, see
//!   `Key`), lookups never allocate, and the odds that two of a billion live keys collide are
//!   below 10^-19 (keys are attacker-controlled, so the hash stays a keyed PRF: an attacker
//!   cannot aim for a collision without the random key; a cheaper unkeyed or 64-bit hash would
//!   make shared counters a matter of luck or effort). Including the algorithm and period means
//!   a rule whose limit changes keeps its counters across a reload, while one whose algorithm or
//!   period changes starts fresh.
//! - **Binary keys** ([`MemoryStore::check_binary`]): a caller that builds its keys in code and
//!   owns the store (the tower layer's own store) may name counters by bytes instead of text,
//!   skipping the formatting and escaping. A binary key of up to 7 bytes (an IPv4 address) is
//!   its own identity: the bytes and their length sit in the low word as they are, so two such
//!   keys never share a counter, by construction; the high word is their keyed SipHash-1-3-64
//!   (std's `HashMap` function against hash flooding) with the shape XORed in, and spreads them
//!   over shards and buckets. Longer ones (an IPv6 address, a header value) are fingerprinted
//!   like text keys, with a constant XORed into the high word (`BINARY_KEY`): equal bytes as
//!   text and as binary always differ there, and different keys of different kinds meet only
//!   with the odds any two text keys have (the keyed PRF above). Shards are picked from the
//!   high word, which is keyed for every kind of key.
//! - **Fast path**: a single-item check hashes once, locks one shard, and steps the key's state
//!   in place (the one-word states, GCRA and leaky bucket, without decoding); nothing allocates.
//! - **Shards** (a mutex each) keep threads on different keys out of each other's way; a request
//!   touching several keys locks their shards in index order, so it cannot deadlock.
//! - **Expiry**: a step that leaves a key full removes it; every entry knows when it will be full
//!   again, and [`MemoryStore::sweep`] drops those past it.
//! - **Bounded**: at most `max_keys` entries (each shard holds its share). A new key in a full
//!   shard evicts in small steps: every expired entry (free: they hold nothing), or else a
//!   batch of 1/64 of the shard (at least one): the entries that will be full again soonest
//!   (they hold the least usage, so forgetting them admits the least extra; for the usual
//!   limits that is also the least recently used). An evicted key starts again from a full
//!   allowance, so an entry that may be **denying** (its last step left nothing for a request
//!   of cost 1, and it is not full again yet) is never evicted while the shard holds any other
//!   candidate: a flood of distinct keys cannot free a client that is being denied. Only a
//!   shard made entirely of such entries evicts them (a batch, soonest full first). That flag
//!   costs no memory: it rides in a spare bit of each state (see `Slot`). Evictions are
//!   counted ([`MemoryStore::evictions`]). Count-min-sketch limits are not affected: their
//!   memory is fixed.

use crate::algorithm::tiers::{self, Tiered};
use crate::algorithm::{
    self, gcra, leaky_bucket, sliding_log, Bucket, Counter, Log, Sketch, State, Window,
};
use crate::clock::{Micros, SECOND};
use crate::decision::Decision;
use crate::doorkeeper::{self, DoorkeeperStats, Gate, Seen};
use crate::fingerprint::{sip13_128, sip13_64, tail};
use crate::quota::{Algorithm, Quota};
use crate::store::{blocks, consumes, CheckItem, Store, StoreError};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

/// Default bound on tracked keys.
pub const DEFAULT_MAX_KEYS: usize = 1 << 22;
const SHARDS: usize = 64;

/// How a slot's two words are laid out. It follows from the algorithm, which is part of a key's
/// identity, so it lives in the key's low 3 bits instead of as an enum tag beside the state: an
/// entry is then 32 bytes (16 of key, 16 of state: two per cache line, never straddling one)
/// where a tagged enum would make it 40.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Gcra = 0,
    Leaky = 1,
    Bucket = 2,
    Window = 3,
    Counter = 4,
}

/// The key-tag value of sliding-window logs, which are not slots (they live in `Shard::logs`).
const LOG_TAG: u64 = 5;

/// The key-tag value of tiered limits' states (`Shard::tiered`): apart from the untiered
/// counter of the same key and shape.
const TIERED_TAG: u64 = 6;

/// The key tag for `alg`'s state.
fn tag_of(alg: Algorithm) -> u64 {
    match alg {
        Algorithm::Gcra => Layout::Gcra as u64,
        Algorithm::LeakyBucket => Layout::Leaky as u64,
        Algorithm::TokenBucket => Layout::Bucket as u64,
        Algorithm::FixedWindow | Algorithm::EnvoyFixedWindow => Layout::Window as u64,
        // The count-min sketch's exact counterpart (it never stores per-key state itself).
        Algorithm::SlidingWindowCounter | Algorithm::CountMinSketch => Layout::Counter as u64,
        Algorithm::SlidingWindowLog => LOG_TAG,
    }
}

fn narrow(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// An `expires` field (see [`Slot`]): the expiry in 2-second units (rounded up) over the flag.
fn expiry_field(t: Micros, denying: bool) -> u64 {
    u64::from(narrow(t.div_ceil(2 * SECOND)).min(u32::MAX >> 1)) << 1 | u64::from(denying)
}

fn field_expiry(f: u64) -> Micros {
    (f >> 1) * 2 * SECOND
}

/// A sliding-window log's expiry with the flag in its lowest bit (the expiry rounded up to even
/// microseconds).
fn log_expiry(t: Micros, denying: bool) -> Micros {
    t.saturating_add(1) & !1 | Micros::from(denying)
}

fn low(w: u64) -> u64 {
    w & 0xffff_ffff
}

fn high(w: u64) -> u64 {
    w >> 32
}

/// A fixed-size per-key state in two words, laid out as its key's [`Layout`] says:
///
/// | layout | word 0 | word 1 |
/// |---|---|---|
/// | GCRA, leaky bucket | `tat` / `free_at` (µs) | `denying` (0 or 1) |
/// | token bucket | `tokens` (low 32), `expires` (high 32) | `last` (µs) |
/// | fixed window | `count` (low 32), `expires` (high 32) | `start` (µs) |
/// | sliding counter | `prev` (low 32), `cur` (high 32) | `start` (s, low 32), `expires` (high 32) |
///
/// Counts are 32-bit (limits are at most `u32::MAX`, as in Envoy's API). An `expires` field is
/// the expiry in 2-second units, rounded up (a key can only be kept longer, never forgotten
/// early), shifted left by one over the `denying` bit: 31 bits of 2 s, good until 2106. A
/// sliding counter's start is a window start, which is always a whole second (32-bit seconds:
/// until 2106 too). `denying` means the last step left nothing for a request of cost 1: the
/// entry is then evicted last (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot([u64; 2]);

impl Slot {
    fn one_word(t: Micros, denying: bool) -> Slot {
        Slot([t, u64::from(denying)])
    }

    fn bucket(b: Bucket, expires_at: Micros, denying: bool) -> Slot {
        Slot([
            u64::from(narrow(b.tokens)) | expiry_field(expires_at, denying) << 32,
            b.last,
        ])
    }

    fn window(w: Window, expires_at: Micros, denying: bool) -> Slot {
        Slot([
            u64::from(narrow(w.count)) | expiry_field(expires_at, denying) << 32,
            w.start,
        ])
    }

    fn counter(c: Counter, expires_at: Micros, denying: bool) -> Slot {
        debug_assert_eq!(c.start % SECOND, 0, "window starts are whole seconds");
        Slot([
            u64::from(narrow(c.prev)) | u64::from(narrow(c.cur)) << 32,
            u64::from(narrow(c.start / SECOND)) | expiry_field(expires_at, denying) << 32,
        ])
    }

    fn as_bucket(self) -> Bucket {
        Bucket {
            tokens: low(self.0[0]),
            last: self.0[1],
        }
    }

    fn as_window(self) -> Window {
        Window {
            count: low(self.0[0]),
            start: self.0[1],
        }
    }

    fn as_counter(self) -> Counter {
        Counter {
            prev: low(self.0[0]),
            cur: high(self.0[0]),
            start: low(self.0[1]) * SECOND,
        }
    }

    /// `state` as a slot, or back the log (logs are not slots).
    fn pack(state: State, expires_at: Micros, denying: bool) -> Result<Slot, Log> {
        Ok(match state {
            State::Gcra(t) | State::Leaky(t) => Slot::one_word(t, denying),
            State::Bucket(b) => Slot::bucket(b, expires_at, denying),
            State::Window(w) => Slot::window(w, expires_at, denying),
            State::Counter(c) => Slot::counter(c, expires_at, denying),
            State::Log(l) => return Err(l),
        })
    }

    fn unpack(self, layout: Layout) -> State {
        match layout {
            Layout::Gcra => State::Gcra(self.0[0]),
            Layout::Leaky => State::Leaky(self.0[0]),
            Layout::Bucket => State::Bucket(self.as_bucket()),
            Layout::Window => State::Window(self.as_window()),
            Layout::Counter => State::Counter(self.as_counter()),
        }
    }

    /// When this state is back to full (so the key can be forgotten).
    fn expires_at(self, layout: Layout) -> Micros {
        match layout {
            Layout::Gcra | Layout::Leaky => self.0[0],
            Layout::Bucket | Layout::Window => field_expiry(high(self.0[0])),
            Layout::Counter => field_expiry(high(self.0[1])),
        }
    }

    /// Whether the last step left nothing for a request of cost 1.
    fn denying(self, layout: Layout) -> bool {
        match layout {
            Layout::Gcra | Layout::Leaky => self.0[1] & 1 == 1,
            Layout::Bucket | Layout::Window => high(self.0[0]) & 1 == 1,
            Layout::Counter => high(self.0[1]) & 1 == 1,
        }
    }

    /// Step this key's state in place with its algorithm's own step (the one `algorithm::step`
    /// dispatches to, so the same decisions and states); `false` when it is back to full (the
    /// caller drops it). GCRA and leaky-bucket slots step their one word directly.
    #[inline]
    fn step(&mut self, layout: Layout, now: Micros, cost: u64, quota: &Quota) -> (Decision, bool) {
        use crate::algorithm::{envoy_fixed_window, fixed_window, sliding_counter, token_bucket};
        let (d, next) = match layout {
            Layout::Gcra => {
                let (d, t) = gcra::step(Some(self.0[0]), now, cost, quota);
                (d, t.map(|t| Slot::one_word(t, d.remaining == 0)))
            }
            Layout::Leaky => {
                let (d, t) = leaky_bucket::step(Some(self.0[0]), now, cost, quota);
                (d, t.map(|t| Slot::one_word(t, d.remaining == 0)))
            }
            Layout::Bucket => {
                let (d, b) = token_bucket::step(Some(self.as_bucket()), now, cost, quota);
                (
                    d,
                    b.map(|b| Slot::bucket(b, now + d.reset_after, d.remaining == 0)),
                )
            }
            Layout::Window => {
                let (d, w) = if quota.algorithm() == Algorithm::EnvoyFixedWindow {
                    envoy_fixed_window::step(Some(self.as_window()), now, cost, quota)
                } else {
                    fixed_window::step(Some(self.as_window()), now, cost, quota)
                };
                (
                    d,
                    w.map(|w| Slot::window(w, now + d.reset_after, d.remaining == 0)),
                )
            }
            Layout::Counter => {
                let (d, c) = sliding_counter::step(Some(self.as_counter()), now, cost, quota);
                (
                    d,
                    c.map(|c| Slot::counter(c, now + d.reset_after, d.remaining == 0)),
                )
            }
        };
        match next {
            Some(s) => {
                *self = s;
                (d, true)
            }
            None => (d, false),
        }
    }
}

/// A counter's identity: its 128-bit keyed hash as two words, with the low 3 bits of the first
/// replaced by its state's tag ([`Layout`] or [`LOG_TAG`]; 125 random bits remain); for a short
/// binary key, its bytes and tag in the first word and a keyed hash in the second
/// ([`MemoryStore::check_binary`]). The second word is keyed-random either way. Not a `u128`:
/// that is 16-byte aligned on x86-64 and would pad every map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key([u64; 2]);

impl Key {
    fn wide(self) -> u128 {
        u128::from(self.0[0]) | (u128::from(self.0[1]) << 64)
    }

    /// The slot layout of this key's state; `None` for a sliding-window log.
    fn layout(self) -> Option<Layout> {
        Some(match self.0[0] & 7 {
            0 => Layout::Gcra,
            1 => Layout::Leaky,
            2 => Layout::Bucket,
            3 => Layout::Window,
            4 => Layout::Counter,
            _ => return None,
        })
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already uniformly random: the high word is the table hash (and picks the shard).
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

type Map<V> = HashMap<Key, V, BuildHasherDefault<Prehashed>>;

/// When a slot expires, by its key's layout (slots always have one; 0, "evict first", if not).
fn slot_expiry(k: &Key, s: &Slot) -> Micros {
    k.layout().map_or(0, |l| s.expires_at(l))
}

/// The eviction rank bit of an entry that may be denying.
const DENYING: u64 = 1 << 63;

/// Eviction order at `now`, lowest first: expired (0), then by expiry, then the entries that may
/// be denying (by expiry).
fn rank(expires_at: Micros, denying: bool, now: Micros) -> u64 {
    if expires_at <= now {
        0
    } else {
        expires_at.min(DENYING - 1) | if denying { DENYING } else { 0 }
    }
}

fn slot_rank(k: &Key, s: &Slot, now: Micros) -> u64 {
    match k.layout() {
        Some(l) => rank(s.expires_at(l), s.denying(l), now),
        None => 0,
    }
}

fn log_rank(e: Micros, now: Micros) -> u64 {
    rank(e & !1, e & 1 == 1, now)
}

/// One shard: fixed-size states, and the sliding-window logs (variable length) beside them.
#[derive(Default)]
struct Shard {
    slots: Map<Slot>,
    /// Each log with when it is empty again, the `denying` flag in the lowest bit
    /// ([`log_expiry`]).
    logs: Map<(Log, Micros)>,
    /// Tiered limits' states (one per parent counter), with their expiry and `denying` flag as
    /// a log's ([`log_expiry`]).
    tiered: Map<(Tiered, Micros)>,
    /// This shard's share of `max_keys`.
    cap: usize,
    /// Live (not expired) entries evicted so far.
    evictions: u64,
}

impl Shard {
    fn len(&self) -> usize {
        self.slots.len() + self.logs.len() + self.tiered.len()
    }

    /// Keep `state` for the tiered key `h` (a new key makes room first), or forget `h` when it
    /// is `None`.
    fn set_tiered(
        &mut self,
        h: Key,
        state: Option<Tiered>,
        expires_at: Micros,
        denying: bool,
        now: Micros,
    ) {
        let Some(state) = state else {
            self.tiered.remove(&h);
            return;
        };
        if !self.tiered.contains_key(&h) {
            self.make_room(now);
        }
        self.tiered
            .insert(h, (state, log_expiry(expires_at, denying)));
    }

    fn contains(&self, h: Key) -> bool {
        match h.layout() {
            Some(_) => self.slots.contains_key(&h),
            None => self.logs.contains_key(&h),
        }
    }

    /// A copy of `h`'s state; `None` when untracked.
    fn get(&self, h: Key) -> Option<State> {
        match h.layout() {
            Some(l) => self.slots.get(&h).map(|s| s.unpack(l)),
            None => self.logs.get(&h).map(|(log, _)| State::Log(log.clone())),
        }
    }

    /// Keep `state` for `h` (new keys make room first), or forget `h` when `state` is `None`.
    /// `denying`: the step that made `state` left nothing for a request of cost 1.
    fn set(
        &mut self,
        h: Key,
        state: Option<State>,
        expires_at: Micros,
        denying: bool,
        now: Micros,
    ) {
        let Some(state) = state else {
            self.slots.remove(&h);
            self.logs.remove(&h);
            return;
        };
        if !self.contains(h) {
            self.make_room(now);
        }
        match Slot::pack(state, expires_at, denying) {
            Ok(slot) => {
                self.slots.insert(h, slot);
            }
            Err(log) => {
                self.logs.insert(h, (log, log_expiry(expires_at, denying)));
            }
        }
    }

    /// One check of one key, its state stepped in place. Inlined into both single checks (text
    /// and binary keys): a call here costs measurably more on the hot path (BENCHMARKS.md).
    #[inline(always)]
    fn step(&mut self, h: Key, now: Micros, cost: u64, quota: &Quota) -> Decision {
        if let Some(d) = self.step_held(h, now, cost, quota) {
            return d;
        }
        let (d, next) = algorithm::step(None, now, cost, quota);
        if next.is_some() {
            self.set(h, next, now + d.reset_after, d.remaining == 0, now);
        }
        d
    }

    /// [`Shard::step`] for a key this shard holds; `None` (nothing done) for one it does not.
    #[inline(always)]
    fn step_held(&mut self, h: Key, now: Micros, cost: u64, quota: &Quota) -> Option<Decision> {
        match h.layout() {
            Some(layout) => {
                if let Some(slot) = self.slots.get_mut(&h) {
                    let (d, keep) = slot.step(layout, now, cost, quota);
                    if !keep {
                        self.slots.remove(&h);
                    }
                    return Some(d);
                }
            }
            None => {
                if let Some((log, expires)) = self.logs.get_mut(&h) {
                    let (d, next) = sliding_log::step(Some(std::mem::take(log)), now, cost, quota);
                    match next {
                        Some(l) => {
                            (*log, *expires) =
                                (l, log_expiry(now + d.reset_after, d.remaining == 0))
                        }
                        None => {
                            self.logs.remove(&h);
                        }
                    }
                    return Some(d);
                }
            }
        }
        None
    }

    /// `h`'s log; `None` when untracked.
    fn log(&self, h: Key) -> Option<&Log> {
        self.logs.get(&h).map(|(log, _)| log)
    }

    /// `h`'s log moved out (an empty one left in its place, so the key keeps its room); `None`
    /// when untracked. Give it back with [`Shard::put_log`].
    fn take_log(&mut self, h: Key) -> Option<Log> {
        self.logs
            .get_mut(&h)
            .map(|(log, _)| std::mem::take(log))
            .filter(|l| !l.is_empty())
    }

    /// Keep `log` for `h` (or forget `h` when it is `None` or empty), its expiry as a cost-0
    /// step under `quota` at `now` finds it.
    fn put_log(&mut self, h: Key, log: Option<Log>, quota: &Quota, now: Micros) {
        let (d, log) = sliding_log::step(log, now, 0, quota);
        let Some(log) = log else {
            self.logs.remove(&h);
            return;
        };
        let expires = log_expiry(now + d.reset_after, d.remaining == 0);
        if let Some(e) = self.logs.get_mut(&h) {
            *e = (log, expires);
        } else {
            self.make_room(now);
            self.logs.insert(h, (log, expires));
        }
    }

    /// Keep `h`'s state clamped as a step at `now` would clamp it, when that changes it (see
    /// [`algorithm::clamp`]): for requests that write nothing else.
    fn keep_clamp(&mut self, h: Key, quota: &Quota, now: Micros) {
        let Some(state) = self.get(h) else { return };
        if let Some(c) = algorithm::clamp(&state, now, quota) {
            let (d, next) = algorithm::step(Some(c), now, 0, quota);
            self.set(h, next, now + d.reset_after, d.remaining == 0, now);
        }
    }

    /// Drop every entry that is back to full at `now`; how many were dropped.
    fn sweep(&mut self, now: Micros) -> usize {
        let before = self.len();
        self.slots.retain(|k, s| slot_expiry(k, s) > now);
        self.logs.retain(|_, (_, e)| *e & !1 > now);
        self.tiered.retain(|_, (_, e)| *e & !1 > now);
        before - self.len()
    }

    /// Make room for one more entry under the shard's cap: drop every expired entry, or at least
    /// a batch (1/64 of the cap, at least one) in eviction order ([`rank`]), taking entries that
    /// may be denying only when nothing else is left. One scan per batch: amortised, a few
    /// dozen entries looked at per new key, and the shard stays within a batch of its cap.
    fn make_room(&mut self, now: Micros) {
        if self.len() < self.cap {
            return;
        }
        let batch = (self.cap / 64).max(1);
        let mut ranks: Vec<u64> = (self.slots.iter().map(|(k, s)| slot_rank(k, s, now)))
            .chain(self.logs.values().map(|(_, e)| log_rank(*e, now)))
            .chain(self.tiered.values().map(|(_, e)| log_rank(*e, now)))
            .collect();
        let expired = ranks.iter().filter(|r| **r == 0).count();
        let others = ranks.iter().filter(|r| **r < DENYING).count();
        let n = if others > 0 {
            expired.max(batch).min(others)
        } else {
            batch.min(ranks.len())
        };
        if n == 0 {
            return;
        }
        let (below, &mut threshold, _) = ranks.select_nth_unstable(n - 1);
        // Entries ranked at the threshold (often many: a window's keys share one expiry) are
        // taken only as far as the batch needs.
        let mut ties = n - below.iter().filter(|r| **r < threshold).count();
        let mut keep = |r: u64| {
            if r < threshold {
                false
            } else if r == threshold && ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        };
        self.slots.retain(|k, s| keep(slot_rank(k, s, now)));
        self.logs.retain(|_, (_, e)| keep(log_rank(*e, now)));
        self.tiered.retain(|_, (_, e)| keep(log_rank(*e, now)));
        self.evictions += n.saturating_sub(expired) as u64;
    }
}

/// XORed into the high word of a binary key's fingerprint ([`MemoryStore::check_binary`]), so
/// that it never equals the fingerprint of the same bytes as a text key (any non-zero constant
/// does; this one spells "binkeys!").
const BINARY_KEY: u64 = u64::from_le_bytes(*b"binkeys!");

/// Binary keys up to this long are their own identity ([`MemoryStore::check_binary`]): 7 bytes
/// and their length fit in a word beside the tag.
const MAX_EXACT: usize = 7;

/// XORed into the hash key of the exact binary keys' spreading hash.
const EXACT_KEY: u64 = u64::from_le_bytes(*b"exactkey");

/// A limit's shape (algorithm, period), injectively, above the low 3 bits.
#[inline(always)]
fn shape_of(q: &Quota) -> u64 {
    ((q.algorithm() as u64) << 40
        | (q.period().unit as u64) << 32
        | u64::from(q.period().multiplier))
        << 3
}

/// A key's fingerprint `h` with its limit's shape (algorithm, period) XORed into the low word
/// instead of hashed with it: one SipHash block less per check, and just as collision-free.
/// Equal keys of different shapes differ in the low word (the shape encoding is injective); for
/// different keys the hashes are independent pseudo-random values, so `H(a) ^ H(b)` equals a
/// given non-zero shape difference with the same 2^-128 odds as it equals zero, and an attacker
/// without the random key can aim at neither. The shape sits above the low 3 bits, which then
/// carry the state's tag (see [`Key`]).
#[inline]
fn shaped(h: u128, q: &Quota) -> Key {
    let low = (h as u64 ^ shape_of(q)) & !7 | tag_of(q.algorithm());
    Key([low, (h >> 64) as u64])
}

/// The in-memory [`Store`].
pub struct MemoryStore {
    k0: u64,
    k1: u64,
    shards: Box<[Mutex<Shard>]>,
    max_keys: usize,
    sketches: RwLock<HashMap<u128, Arc<Mutex<Sketch>>>>,
    /// Doorkeepers by limit, with the limit's rule name (for metrics).
    gates: RwLock<HashMap<u128, NamedGate>>,
}

/// A limit's doorkeeper and the name of its rule.
type NamedGate = (Arc<str>, Arc<Mutex<Gate>>);

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_KEYS)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
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
        // Each shard's share of `max_keys`, the remainder spread over the first ones: they add
        // up to `max_keys` (at least one per shard).
        let shards = (0..SHARDS)
            .map(|i| {
                let cap = max_keys / SHARDS + usize::from(i < max_keys % SHARDS);
                Mutex::new(Shard {
                    cap: cap.max(1),
                    ..Shard::default()
                })
            })
            .collect();
        Self {
            k0,
            k1,
            shards,
            max_keys,
            sketches: RwLock::new(HashMap::new()),
            gates: RwLock::new(HashMap::new()),
        }
    }

    /// SipHash-1-3 (128 bit) of `bytes` under this store's random key.
    #[inline(always)]
    fn hash(&self, bytes: &[u8]) -> u128 {
        sip13_128(self.k0, self.k1, bytes)
    }

    /// A text counter key's identity: its hash with the limit's shape ([`shaped`]); a tiered
    /// limit's key has its own tag.
    fn key_hash(&self, item: &CheckItem<'_>) -> Key {
        let k = shaped(self.hash(item.key.as_bytes()), item.quota);
        match item.tier {
            Some(_) => Key([k.0[0] & !7 | TIERED_TAG, k.0[1]]),
            None => k,
        }
    }

    fn sketch(&self, rule: &str, q: &Quota) -> Arc<Mutex<Sketch>> {
        let period = (q.period().unit as u128) << 32 | u128::from(q.period().multiplier);
        let size = u128::from(q.sketch().width) << 32 | u128::from(q.sketch().depth);
        // As in `key_hash`: the shape is XORed in (injectively, high and low words).
        let id = self.hash(rule.as_bytes()) ^ (size << 64 | period);
        let found = self.sketches.read().get(&id).cloned();
        if let Some(s) = found {
            return s;
        }
        self.sketches
            .write()
            .entry(id)
            .or_insert_with(|| Arc::new(Mutex::new(Sketch::new(q.sketch()))))
            .clone()
    }

    /// The doorkeeper of `rule`'s limit `q` (which has one).
    fn gate(&self, rule: &str, q: &Quota) -> Arc<Mutex<Gate>> {
        let size = q
            .doorkeeper()
            .unwrap_or(crate::quota::Doorkeeper::new(1, 0.5).expect("valid"));
        let period = (q.period().unit as u128) << 32 | u128::from(q.period().multiplier);
        let shape = (q.algorithm() as u128) << 40
            | u128::from(size.expected_keys()) << 64
            | u128::from((size.fp_rate() * 1e9) as u64) << 96;
        // As in `sketch`: the shape XORed in, injectively.
        let id = self.hash(rule.as_bytes()) ^ !(shape | period);
        let found = self.gates.read().get(&id).map(|(_, g)| g.clone());
        if let Some(g) = found {
            return g;
        }
        self.gates
            .write()
            .entry(id)
            .or_insert_with(|| (Arc::from(rule), Arc::new(Mutex::new(Gate::new(size)))))
            .1
            .clone()
    }

    /// Each doorkeeper's rule and figures (limits with a doorkeeper that have seen a request).
    pub fn doorkeepers(&self) -> Vec<(Arc<str>, DoorkeeperStats)> {
        let mut v: Vec<_> = self
            .gates
            .read()
            .values()
            .map(|(r, g)| (r.clone(), lock(g).stats()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// A check of the counter `h` of a limit with a doorkeeper (see the `doorkeeper` module):
    /// a key with a counter is stepped as usual; one without has its state rebuilt from the
    /// filter, and a first request in the window that is admitted is recorded there only.
    #[inline(never)]
    fn step_gated(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        now: Micros,
        h: Key,
        rule: &str,
        quota: &Quota,
        cost: u64,
    ) -> Decision {
        if let Some(d) = shard.step_held(h, now, cost, quota) {
            return d;
        }
        let gate = self.gate(rule, quota);
        let mut gate = lock(&gate);
        let start = gate.rotate(now, quota);
        let seen = gate.seen(h.wide());
        let (d, next) = algorithm::step(doorkeeper::prior(seen, start, quota), now, cost, quota);
        if doorkeeper::holds_back(seen, cost, d.allowed) {
            gate.hold_back(h.wide());
        } else if cost > 0 && next.is_some() {
            shard.set(h, next, now + d.reset_after, d.remaining == 0, now);
        }
        d
    }

    /// A count-min-sketch check with a doorkeeper: the key's first admitted request of cost 1 in
    /// a window goes to the filter, the rest to the sketch; estimates add the filter's bits.
    fn sketch_gated(&self, now: Micros, h: Key, rule: &str, quota: &Quota, cost: u64) -> Decision {
        let sketch = self.sketch(rule, quota);
        let mut sketch = lock(&sketch);
        let gate = self.gate(rule, quota);
        let mut gate = lock(&gate);
        gate.rotate(now, quota);
        let seen = gate.seen(h.wide());
        let d = sketch.evaluate_seen(h.wide(), now, cost, quota, seen.pair());
        if doorkeeper::holds_back(seen, cost, d.allowed) {
            gate.hold_back(h.wide());
        } else if d.allowed {
            sketch.record(h.wide(), cost);
        }
        d
    }

    fn shard_of(&self, h: Key) -> usize {
        // The high word, keyed for every key (an exact binary key's low word is its bytes);
        // bits the table's bucket index (low bits) and control tag (top 7) do not use.
        ((h.0[1] >> 32) as usize) % SHARDS
    }

    /// Number of tracked keys (count-min-sketch keys are not tracked individually).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Live entries evicted to make room for new keys so far (expired ones dropped are not
    /// counted: they held nothing).
    pub fn evictions(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).evictions).sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every entry that is back to full at `now`. Returns how many were dropped.
    pub fn sweep(&self, now: Micros) -> usize {
        self.shards.iter().map(|s| lock(s).sweep(now)).sum()
    }

    /// Bytes held by count-min sketches.
    #[cfg(test)]
    pub(crate) fn sketch_memory(&self) -> usize {
        self.sketches
            .read()
            .values()
            .map(|s| lock(s).memory())
            .sum()
    }

    fn step_one(&self, now: Micros, item: &CheckItem<'_>) -> Decision {
        self.step_hashed(now, self.key_hash(item), item.rule, item.quota, item.cost)
    }

    /// One check of the counter `h` (a key's fingerprint with its limit's shape, [`shaped`]).
    #[inline(always)]
    fn step_hashed(&self, now: Micros, h: Key, rule: &str, quota: &Quota, cost: u64) -> Decision {
        if quota.algorithm() == Algorithm::CountMinSketch {
            if quota.doorkeeper().is_some() {
                return self.sketch_gated(now, h, rule, quota, cost);
            }
            return lock(&self.sketch(rule, quota)).check(h.wide(), now, cost, quota);
        }
        let mut shard = lock(&self.shards[self.shard_of(h)]);
        if quota.doorkeeper().is_some() {
            return self.step_gated(shard, now, h, rule, quota, cost);
        }
        shard.step(h, now, cost, quota)
    }

    /// Check one counter of `rule` (cost `cost`, like a one-item [`Store::check_one`]) named by
    /// the binary key `key` instead of a text counter key: for a caller that builds its keys in
    /// code (an address as its octets, a header's raw bytes) and so need not format and escape
    /// them. The binary key space is disjoint from the text one (see the module docs): a binary
    /// key never shares a counter with a text key, whatever the bytes, so the caller only has to
    /// keep its own encoding injective. A counter is not shared with anyone using text keys for
    /// the same request (rules files, the service, Redis): use it where the store is private.
    #[inline]
    pub fn check_binary(
        &self,
        now: Micros,
        rule: &str,
        key: &[u8],
        quota: &Quota,
        cost: u64,
    ) -> Decision {
        self.step_hashed(now, self.binary_key(key, quota), rule, quota, cost)
    }

    /// A binary key's identity (see the module docs): up to 7 bytes exact, else hashed.
    #[inline(always)]
    fn binary_key(&self, key: &[u8], q: &Quota) -> Key {
        // A count-min sketch picks its cells from the key's bits: they must all be keyed.
        if key.len() > MAX_EXACT || q.algorithm() == Algorithm::CountMinSketch {
            return shaped(self.hash(key) ^ u128::from(BINARY_KEY) << 64, q);
        }
        // The bytes (as the hash reads them: one word, the top byte zero) above the length and
        // the tag: injective.
        let low = tail(key) << 8 | (key.len() as u64) << 3 | tag_of(q.algorithm());
        // Keyed apart from the 128-bit fingerprints (another key), so that the high words of
        // the two kinds are independent.
        let spread = sip13_64(self.k0 ^ EXACT_KEY, self.k1, key);
        Key([low, spread ^ shape_of(q)])
    }

    /// Several counters at once, all-or-nothing: every lock taken up front in one order, each
    /// item evaluated on the states the items before it left, then what consumes written.
    fn check_many(&self, now: Micros, items: &[CheckItem<'_>]) -> Vec<Decision> {
        let keys = ManyKeys::of(self, items);
        let mut locks = ManyLocks::take(self, &keys);
        let seen = locks.seen(now, items, &keys);
        let many = Many {
            store: self,
            now,
            items,
            keys: &keys,
            seen,
        };
        let mut work = Tentative::default();
        let mut decisions: Vec<Decision> = Vec::with_capacity(items.len());
        for i in 0..items.len() {
            let d = many.evaluate(i, &mut locks, &mut work, &decisions);
            decisions.push(d);
        }
        let commit = many.commits(&decisions, &mut work.logs);
        many.report_unconsumed(&mut locks, &mut decisions, &commit);
        many.write_logs(&mut locks, &work.logs);
        many.commit_states(&mut locks, work, &decisions, &commit);
        decisions
    }
}

/// What a multi-key check knows of its items before it locks anything: each item's counter,
/// and its sketch and doorkeeper when it has them.
struct ManyKeys {
    hashes: Vec<Key>,
    sketches: Vec<Option<Arc<Mutex<Sketch>>>>,
    gates: Vec<Option<Arc<Mutex<Gate>>>>,
}

impl ManyKeys {
    #[inline]
    fn of(store: &MemoryStore, items: &[CheckItem<'_>]) -> Self {
        let hashes: Vec<Key> = items.iter().map(|i| store.key_hash(i)).collect();
        let sketches = items
            .iter()
            .map(|i| {
                (i.quota.algorithm() == Algorithm::CountMinSketch && i.tier.is_none())
                    .then(|| store.sketch(i.rule, i.quota))
            })
            .collect();
        // A multi-key check never holds a request back: a key without a counter gets one, its
        // state rebuilt from the filter.
        let gates = items
            .iter()
            .map(|i| {
                (i.quota.doorkeeper().is_some() && i.tier.is_none())
                    .then(|| store.gate(i.rule, i.quota))
            })
            .collect();
        Self {
            hashes,
            sketches,
            gates,
        }
    }
}

/// The locks a multi-key check holds, each found by its shard index or its mutex's address.
struct ManyLocks<'a> {
    shards: Vec<(usize, MutexGuard<'a, Shard>)>,
    sketches: Vec<(*const Mutex<Sketch>, MutexGuard<'a, Sketch>)>,
    gates: Vec<(*const Mutex<Gate>, MutexGuard<'a, Gate>)>,
}

impl<'a> ManyLocks<'a> {
    /// Every lock `keys` needs. Lock order: shards by index, then sketches by address, then
    /// doorkeepers by address. Every multi-key check uses the same order, and a single-key
    /// check holds one lock, so no cycle can form.
    #[inline]
    fn take(store: &'a MemoryStore, keys: &'a ManyKeys) -> Self {
        let mut shard_ids: Vec<usize> = keys
            .hashes
            .iter()
            .zip(&keys.sketches)
            .filter(|(_, s)| s.is_none())
            .map(|(h, _)| store.shard_of(*h))
            .collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let shards = shard_ids
            .iter()
            .map(|&i| (i, lock(&store.shards[i])))
            .collect();
        Self {
            shards,
            sketches: lock_by_address(&keys.sketches),
            gates: lock_by_address(&keys.gates),
        }
    }

    /// What each gated item's filter says of its key, and its window's start.
    #[inline]
    fn seen(
        &mut self,
        now: Micros,
        items: &[CheckItem<'_>],
        keys: &ManyKeys,
    ) -> Vec<(Seen, Micros)> {
        items
            .iter()
            .zip(&keys.gates)
            .zip(&keys.hashes)
            .map(|((item, g), h)| match g {
                Some(g) => {
                    let g = locked(&mut self.gates, Arc::as_ptr(g));
                    let start = g.rotate(now, item.quota);
                    (g.seen(h.wide()), start)
                }
                None => (Seen::default(), 0),
            })
            .collect()
    }

    #[inline]
    fn shard(&mut self, store: &MemoryStore, h: Key) -> &mut Shard {
        locked(&mut self.shards, store.shard_of(h))
    }

    #[inline]
    fn sketch(&mut self, sk: &Arc<Mutex<Sketch>>) -> &mut Sketch {
        locked(&mut self.sketches, Arc::as_ptr(sk))
    }
}

/// The mutexes of `all` (each once), locked in the order of their addresses.
#[inline]
fn lock_by_address<T>(all: &[Option<Arc<Mutex<T>>>]) -> Vec<(*const Mutex<T>, MutexGuard<'_, T>)> {
    let mut refs: Vec<&Arc<Mutex<T>>> = all.iter().flatten().collect();
    refs.sort_by_key(|a| Arc::as_ptr(a) as usize);
    refs.dedup_by(|a, b| Arc::ptr_eq(a, b));
    refs.iter().map(|a| (Arc::as_ptr(a), lock(a))).collect()
}

/// The tentative states of a multi-key check, item by item: a key appearing twice sees the
/// earlier item's. Slot states are small and copied per item. A sliding-window log is neither
/// copied nor changed while its items are decided: each item reads it with what the items
/// before admitted summed ([`sliding_log::peek`]), and it is written once, at commit.
#[derive(Default)]
struct Tentative<'q> {
    /// (key, slot state after the item), for every item but the sketches'.
    pending: Vec<(Key, Option<State>)>,
    logs: Vec<LogWork<'q>>,
    /// Tiered states, as `pending` keeps slot states: (key, state after the item).
    tiered: Vec<(Key, Option<Tiered>)>,
}

/// A multi-key check: its items, their keys, and what their filters say; what every step reads.
struct Many<'a, 'i> {
    store: &'a MemoryStore,
    now: Micros,
    items: &'a [CheckItem<'i>],
    keys: &'a ManyKeys,
    seen: Vec<(Seen, Micros)>,
}

impl<'i> Many<'_, 'i> {
    /// A stored state, or for a gated key without one, what the filter implies.
    #[inline]
    fn stored(&self, shard: &Shard, i: usize, h: Key) -> Option<State> {
        match shard.get(h) {
            None if self.keys.gates[i].is_some() => {
                doorkeeper::prior(self.seen[i].0, self.seen[i].1, self.items[i].quota)
            }
            s => s,
        }
    }

    /// Item `i`'s decision on what the items before it (`decided`) left.
    #[inline(always)]
    fn evaluate(
        &self,
        i: usize,
        locks: &mut ManyLocks<'_>,
        work: &mut Tentative<'i>,
        decided: &[Decision],
    ) -> Decision {
        let (item, h, now) = (&self.items[i], self.keys.hashes[i], self.now);
        if let Some(tier) = item.tier {
            let shard = locks.shard(self.store, h);
            let current = match work.tiered.iter().rev().find(|(th, _)| *th == h) {
                Some((_, s)) => s.clone(),
                None => shard.tiered.get(&h).map(|(s, _)| s.clone()),
            };
            let (d, next) =
                tiers::step(current, now, item.cost, item.quota, tier.levels, tier.index);
            work.tiered.push((h, next));
            work.pending.push((h, None));
            d
        } else if let Some(sk) = &self.keys.sketches[i] {
            self.evaluate_sketch(i, locks.sketch(sk), decided)
        } else if h.layout().is_none() {
            let d = self.evaluate_log(i, locks, &mut work.logs);
            work.pending.push((h, None));
            d
        } else {
            let shard = locks.shard(self.store, h);
            let current = match work.pending.iter().rev().find(|(ph, _)| *ph == h) {
                Some((_, s)) => s.clone(),
                None => self.stored(shard, i, h),
            };
            let (d, next) = algorithm::step(current, now, item.cost, item.quota);
            work.pending.push((h, next));
            d
        }
    }

    /// Item `i` on its count-min sketch `g`: earlier admitted items of the same key in this
    /// request count too.
    #[inline]
    fn evaluate_sketch(&self, i: usize, g: &mut Sketch, decided: &[Decision]) -> Decision {
        let (item, h) = (&self.items[i], self.keys.hashes[i]);
        let earlier: u64 = self.items[..i]
            .iter()
            .zip(decided)
            .zip(&self.keys.hashes)
            .filter(|((e, d), eh)| **eh == h && d.allowed && e.rule == item.rule)
            .map(|((e, _), _)| e.cost)
            .sum();
        let mut d = g.evaluate_seen(
            h.wide(),
            self.now,
            earlier + item.cost,
            item.quota,
            self.seen[i].0.pair(),
        );
        d.remaining = d.remaining.min(item.quota.limit());
        d
    }

    /// Item `i` on its sliding-window log, with what the items before it admitted there.
    #[inline]
    fn evaluate_log(
        &self,
        i: usize,
        locks: &mut ManyLocks<'_>,
        logs: &mut Vec<LogWork<'i>>,
    ) -> Decision {
        let (item, h) = (&self.items[i], self.keys.hashes[i]);
        let w = match logs.iter().position(|w| w.h == h) {
            Some(w) => w,
            None => {
                logs.push(LogWork {
                    h,
                    admitted: 0,
                    quota: item.quota,
                    commit: false,
                });
                logs.len() - 1
            }
        };
        let w = &mut logs[w];
        let shard = locks.shard(self.store, h);
        let d = sliding_log::peek(shard.log(h), w.admitted, self.now, item.cost, item.quota);
        w.quota = item.quota;
        if d.allowed {
            w.admitted += item.cost;
        }
        d
    }

    /// Which items consume. A log is written when one of its items consumes (then all its
    /// admitted ones do: `consumes` is "allowed and nothing blocks"), as the steps of its items
    /// would have left it; otherwise it stays as stored.
    #[inline]
    fn commits(&self, decisions: &[Decision], logs: &mut [LogWork<'_>]) -> Vec<bool> {
        let blocked = blocks(self.items, decisions);
        let any_denied = decisions.iter().any(|d| !d.allowed);
        let commit: Vec<bool> = self
            .items
            .iter()
            .zip(decisions)
            .map(|(item, d)| consumes(item, d, any_denied, blocked))
            .collect();
        for (h, _) in self.keys.hashes.iter().zip(&commit).filter(|(_, c)| **c) {
            if let Some(w) = logs.iter_mut().find(|w| w.h == *h) {
                w.commit = true;
            }
        }
        commit
    }

    /// An allowed item that does not consume reports what it has left, unconsumed (a cost-0
    /// query against the stored state, before anything of this request is written).
    #[inline]
    fn report_unconsumed(
        &self,
        locks: &mut ManyLocks<'_>,
        decisions: &mut [Decision],
        commit: &[bool],
    ) {
        let now = self.now;
        for (i, item) in self.items.iter().enumerate() {
            if !(decisions[i].allowed && item.cost > 0 && !commit[i]) {
                continue;
            }
            let h = self.keys.hashes[i];
            decisions[i] = if let Some(tier) = item.tier {
                let shard = locks.shard(self.store, h);
                let state = shard.tiered.get(&h).map(|(s, _)| s.clone());
                tiers::step(state, now, 0, item.quota, tier.levels, tier.index).0
            } else if let Some(sk) = &self.keys.sketches[i] {
                let g = locks.sketch(sk);
                g.evaluate_seen(h.wide(), now, 0, item.quota, self.seen[i].0.pair())
            } else if h.layout().is_none() {
                let shard = locks.shard(self.store, h);
                sliding_log::peek(shard.log(h), 0, now, 0, item.quota)
            } else {
                let shard = locks.shard(self.store, h);
                let state = self.stored(shard, i, h);
                algorithm::step(state, now, 0, item.quota).0
            };
        }
    }

    /// The logs one of whose items consumes, written back.
    #[inline]
    fn write_logs(&self, locks: &mut ManyLocks<'_>, logs: &[LogWork<'_>]) {
        for w in logs.iter().filter(|w| w.commit) {
            let shard = locks.shard(self.store, w.h);
            let log = shard.take_log(w.h).unwrap_or_default();
            let log = log.commit(self.now, w.admitted, w.quota);
            shard.put_log(w.h, log, w.quota, self.now);
        }
    }

    /// Commit: per-key states in order (the last write of a repeated key is its final state).
    #[inline]
    fn commit_states(
        &self,
        locks: &mut ManyLocks<'_>,
        work: Tentative<'_>,
        decisions: &[Decision],
        commit: &[bool],
    ) {
        let now = self.now;
        let mut pending = work.pending.into_iter();
        let mut tiered = work.tiered.into_iter();
        for (i, item) in self.items.iter().enumerate() {
            let h = self.keys.hashes[i];
            if let Some(tier) = item.tier {
                pending.next();
                let next = tiered.next().and_then(|(_, s)| s);
                let shard = locks.shard(self.store, h);
                if commit[i] {
                    let d = &decisions[i];
                    shard.set_tiered(h, next, now + d.reset_after, d.remaining == 0, now);
                } else if let Some(c) = shard
                    .tiered
                    .get(&h)
                    .and_then(|(s, _)| tiers::clamp(s, now, item.quota))
                {
                    // Nothing consumed, but a clamped state is kept.
                    let (d, next) =
                        tiers::step(Some(c), now, 0, item.quota, tier.levels, tier.index);
                    shard.set_tiered(h, next, now + d.reset_after, d.remaining == 0, now);
                }
                continue;
            }
            if let Some(sk) = &self.keys.sketches[i] {
                if commit[i] {
                    locks.sketch(sk).record(h.wide(), item.cost);
                }
                continue;
            }
            let next = pending.next().and_then(|(_, s)| s);
            if h.layout().is_none() {
                // Written back by `write_logs`.
                continue;
            }
            if !commit[i] {
                // Nothing consumed (but a clamped state is kept).
                locks.shard(self.store, h).keep_clamp(h, item.quota, now);
                continue;
            }
            let expires_at = now + decisions[i].reset_after;
            let denying = decisions[i].remaining == 0;
            locks
                .shard(self.store, h)
                .set(h, next, expires_at, denying, now);
        }
    }
}

/// A sliding-window log during a multi-key check.
struct LogWork<'q> {
    h: Key,
    /// The cost this request's items admitted on it (all to be logged at `now`).
    admitted: u64,
    /// The quota of the last item naming it (its expiry is computed with it).
    quota: &'q Quota,
    /// Whether one of its items consumes: then the log is written.
    commit: bool,
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
            [one] => vec![self.check_one(now, one)?],
            many => self.check_many(now, many),
        })
    }

    fn check_one(&self, now: Micros, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        if let Some(tier) = item.tier {
            // As a single slot is stepped in place: the state is written whatever the outcome.
            let h = self.key_hash(item);
            let mut shard = lock(&self.shards[self.shard_of(h)]);
            let state = shard.tiered.get(&h).map(|(s, _)| s.clone());
            let (d, next) = tiers::step(state, now, item.cost, item.quota, tier.levels, tier.index);
            shard.set_tiered(h, next, now + d.reset_after, d.remaining == 0, now);
            return Ok(d);
        }
        Ok(self.step_one(now, item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Period, Unit};

    fn item<'a>(key: &'a str, quota: &'a Quota, cost: u64) -> CheckItem<'a> {
        CheckItem {
            cost,
            ..CheckItem::hit("r", key, quota)
        }
    }

    #[test]
    fn binary_keys_never_share_a_counter_with_text_keys() {
        let q = Quota::new(1, Unit::Hour).with_algorithm(Algorithm::Gcra);
        let store = MemoryStore::default();
        // The same bytes as a text key and as a binary key: two counters.
        assert!(store.check_binary(0, "r", b"api|ip=1", &q, 1).allowed);
        assert!(
            store
                .check_one(0, &item("api|ip=1", &q, 1))
                .unwrap()
                .allowed
        );
        // Each space keeps its own: the second hit of either is denied.
        assert!(!store.check_binary(0, "r", b"api|ip=1", &q, 1).allowed);
        assert!(
            !store
                .check_one(0, &item("api|ip=1", &q, 1))
                .unwrap()
                .allowed
        );
        // Other bytes, another counter; the empty key is a key like any other.
        assert!(store.check_binary(0, "r", &[10, 0, 0, 1], &q, 1).allowed);
        assert!(store.check_binary(0, "r", &[1, 0, 0, 10], &q, 1).allowed);
        assert!(store.check_binary(0, "r", b"", &q, 1).allowed);
        assert!(!store.check_binary(0, "r", b"", &q, 1).allowed);
        assert_eq!(store.len(), 5);
        // A binary key's counter follows the quota's shape as a text key's does.
        let other = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::Gcra);
        assert!(
            store
                .check_binary(0, "r", &[10, 0, 0, 1], &other, 1)
                .allowed
        );
    }

    #[test]
    fn exact_binary_keys_are_told_apart_by_bytes_and_length() {
        let q = Quota::new(1, Unit::Hour).with_algorithm(Algorithm::Gcra);
        let store = MemoryStore::default();
        // Zero bytes of every length up to past the exact limit (7), then the same again.
        let keys: Vec<Vec<u8>> = (0..=9).map(|n| vec![0; n]).collect();
        for k in &keys {
            assert!(store.check_binary(0, "r", k, &q, 1).allowed, "{k:?}");
        }
        for k in &keys {
            assert!(!store.check_binary(0, "r", k, &q, 1).allowed, "{k:?}");
        }
        // Every byte position counts, in both representations.
        for len in [4, 7, 8, 16] {
            for i in 0..len {
                let mut k = vec![0; len];
                k[i] = 1;
                assert!(store.check_binary(0, "r", &k, &q, 1).allowed, "{k:?}");
            }
        }
        // Exact keys spread over the shards like hashed ones (the shard comes from the keyed
        // word, not from the bytes).
        let spread = MemoryStore::default();
        for i in 0..4096u32 {
            spread.check_binary(0, "r", &i.to_le_bytes(), &q, 1);
        }
        let busiest = spread.shards.iter().map(|s| lock(s).len()).max().unwrap();
        assert!(busiest < 4096 / 64 * 2, "{busiest} keys in one shard");
    }

    #[test]
    fn entry_is_32_bytes() {
        assert_eq!(std::mem::size_of::<(Key, Slot)>(), 32);
    }

    /// envoyproxy/ratelimit's own sequence for `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: keys
    /// at 13 of 15 and 13 of 14, 2 hits each: the one over counts (15), the other does not
    /// (stays at 13, 2 left); with envoy's default counting both count.
    #[test]
    fn envoy_counting_with_and_without_stop() {
        let q15 = Quota::new(15, Unit::Hour).with_algorithm(Algorithm::EnvoyFixedWindow);
        let q14 = Quota::new(14, Unit::Hour).with_algorithm(Algorithm::EnvoyFixedWindow);
        let now = 1_000_000 * SECOND;
        for count_denied in [false, true] {
            let s = MemoryStore::with_seed(1000, 1, 2);
            let pair = |cost| {
                [
                    CheckItem {
                        count_denied,
                        tier: None,
                        ..item("key4", &q15, cost)
                    },
                    CheckItem {
                        count_denied,
                        tier: None,
                        ..item("key5", &q14, cost)
                    },
                ]
            };
            let d = s.check(now, &pair(13)).unwrap();
            assert!(d[0].allowed && d[1].allowed);
            assert_eq!((d[0].remaining, d[1].remaining), (2, 1));
            let d = s.check(now, &pair(2)).unwrap();
            assert!(d[0].allowed && !d[1].allowed);
            assert_eq!(d[1].remaining, 0);
            let left = s.check(now, &[item("key4", &q15, 0)]).unwrap()[0];
            if count_denied {
                assert_eq!((d[0].remaining, left.remaining), (0, 0), "counted");
            } else {
                assert_eq!((d[0].remaining, left.remaining), (2, 2), "not counted");
            }
            // The denied key counted its hits either way: 15 of 14.
            let over = s.check(now, &[item("key5", &q14, 0)]).unwrap()[0];
            assert!(!over.allowed, "{count_denied}");
        }
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
    fn in_place_step_matches_the_generic_step_for_every_layout() {
        // Each layout is decoded, stepped by its algorithm's own step and re-encoded in place:
        // that must give exactly `algorithm::step` on the unpacked `State`, decisions and states.
        let algs = Algorithm::ALL
            .into_iter()
            .filter(|a| *a != Algorithm::CountMinSketch);
        for alg in algs {
            let s = MemoryStore::with_seed(1000, 1, 2);
            let q = Quota::new(5, Unit::Second)
                .with_algorithm(alg)
                .with_burst(3);
            let mut state = None;
            for i in 0..400u64 {
                let now = 1_795_305_600 * SECOND + i * 37_000;
                let cost = i % 3;
                let d = s.check_one(now, &item("k", &q, cost)).unwrap();
                let (want, next) = algorithm::step(state.take(), now, cost, &q);
                state = next;
                assert_eq!(d, want, "{alg} step {i}");
                assert_eq!(s.len(), usize::from(state.is_some()), "{alg} step {i}");
            }
        }
    }

    #[test]
    fn slots_round_trip_and_expire_no_earlier_than_their_state() {
        let t = 1_795_305_600 * SECOND + 123_456;
        let states = [
            (Layout::Gcra, State::Gcra(t)),
            (Layout::Leaky, State::Leaky(t)),
            (
                Layout::Bucket,
                State::Bucket(Bucket {
                    tokens: u64::from(u32::MAX),
                    last: t,
                }),
            ),
            (Layout::Window, State::Window(Window { count: 7, start: t })),
            (
                Layout::Counter,
                State::Counter(Counter {
                    prev: u64::from(u32::MAX),
                    cur: 3,
                    start: 1_795_305_600 * SECOND,
                }),
            ),
        ];
        for (layout, state) in states {
            // One-word states are their own expiry (the store passes `now + reset_after`, which
            // for them is that timestamp); the others keep the one they are given.
            let one_word = matches!(layout, Layout::Gcra | Layout::Leaky);
            let expires = if one_word { t } else { t + 90 * SECOND + 1 };
            for denying in [false, true] {
                let slot = Slot::pack(state.clone(), expires, denying).unwrap();
                assert_eq!(slot.unpack(layout), state);
                assert_eq!(slot.denying(layout), denying, "{layout:?}");
                let at = slot.expires_at(layout);
                assert!(
                    at >= expires && at < expires + 2 * SECOND,
                    "{layout:?}: {at}"
                );
            }
        }
        assert!(
            Slot::pack(State::Log(Log::new()), t, false).is_err(),
            "logs are not slots"
        );
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
    fn a_flood_of_distinct_keys_never_frees_a_denied_client() {
        // The attack: 10,000 keys, a client denied at 3/minute, then 20,000 distinct keys.
        for alg in Algorithm::ALL
            .into_iter()
            .filter(|a| *a != Algorithm::CountMinSketch)
        {
            let s = MemoryStore::with_seed(10_000, 1, 2);
            let q = Quota::new(3, Unit::Minute).with_algorithm(alg);
            let now = 1_795_305_600 * SECOND;
            for _ in 0..3 {
                assert!(s.check_one(now, &item("victim", &q, 1)).unwrap().allowed);
            }
            assert!(!s.check_one(now, &item("victim", &q, 1)).unwrap().allowed);
            for i in 0..20_000u64 {
                s.check_one(now + i, &item(&format!("flood-{i}"), &q, 1))
                    .unwrap();
            }
            let d = s.check_one(now + 20_000, &item("victim", &q, 1)).unwrap();
            assert!(!d.allowed, "{alg}: the denied client got through");
            // Held close to the bound (each shard within one entry of its share), never above.
            assert!((9_936..=10_000).contains(&s.len()), "{alg}: {}", s.len());
            assert!(s.evictions() >= 10_000, "{alg}: {}", s.evictions());
        }
    }

    #[test]
    fn eviction_steps_are_small_and_the_bound_is_exact() {
        for max in [1_000, 64 * 200 + 7] {
            let s = MemoryStore::with_seed(max, 1, 2);
            // One window: every key shares one expiry (the old eviction dropped them all at once).
            let q = Quota::new(5, Unit::Hour).with_algorithm(Algorithm::FixedWindow);
            let mut low = usize::MAX;
            for i in 0..3 * max {
                s.check_one(SECOND, &item(&format!("k{i}"), &q, 1)).unwrap();
                if i > 2 * max {
                    low = low.min(s.len());
                }
                assert!(s.len() <= max, "{max}: {}", s.len());
            }
            // Each shard evicts at most 1/64 of its share at a time.
            assert!(low >= max - max / 64 - SHARDS, "{max}: {low}");
        }
    }

    #[test]
    fn denying_entries_go_last_expired_first() {
        // 4 entries per shard, about 3 of them denying (2/minute, both used).
        let s = MemoryStore::with_seed(SHARDS * 4, 1, 2);
        let q = Quota::new(2, Unit::Minute).with_algorithm(Algorithm::Gcra);
        let denied: Vec<String> = (0..SHARDS * 3).map(|i| format!("d{i}")).collect();
        for k in &denied {
            s.check_one(SECOND, &item(k, &q, 2)).unwrap();
        }
        // A flood of non-denying keys takes the remaining room, evicting among themselves.
        for i in 0..SHARDS * 40 {
            s.check_one(SECOND, &item(&format!("f{i}"), &q, 1)).unwrap();
        }
        let still = denied
            .iter()
            .filter(|k| !s.check_one(SECOND, &item(k, &q, 1)).unwrap().allowed)
            .count();
        // A shard that drew more than 4 denied keys had to evict some; the others keep them all.
        assert!(still >= SHARDS * 3 - SHARDS, "{still}");
        assert!(s.len() <= SHARDS * 4);
    }

    proptest::proptest! {
        /// Whatever the traffic, an eviction never removes a possibly-denying entry while the
        /// shard still held another candidate, nor a live entry while an expired one was left.
        #[test]
        fn eviction_order_holds(
            ops in proptest::collection::vec((0u64..400, 1u64..4, 0u64..3_000_000), 1..600),
        ) {
            let s = MemoryStore::with_seed(SHARDS * 3, 5, 6);
            let q = Quota::new(3, Unit::Second).with_algorithm(Algorithm::FixedWindow);
            let mut now = SECOND;
            for (key, cost, gap) in ops {
                now += gap;
                let h = s.key_hash(&item(&format!("{key}"), &q, cost));
                let idx = s.shard_of(h);
                let (before, had) = {
                    let g = lock(&s.shards[idx]);
                    let ranks: Vec<(Key, u64)> =
                        g.slots.iter().map(|(k, v)| (*k, slot_rank(k, v, now))).collect();
                    (ranks, g.contains(h))
                };
                s.check_one(now, &item(&format!("{key}"), &q, cost)).unwrap();
                let g = lock(&s.shards[idx]);
                let gone: Vec<u64> = before
                    .iter()
                    .filter(|(k, _)| *k != h && !g.slots.contains_key(k))
                    .map(|(_, r)| *r)
                    .collect();
                let kept: Vec<u64> = before
                    .iter()
                    .filter(|(k, _)| g.slots.contains_key(k))
                    .map(|(_, r)| *r)
                    .collect();
                proptest::prop_assert!(g.len() <= g.cap);
                if had || gone.is_empty() {
                    continue;
                }
                let worst_gone = gone.iter().max().copied().unwrap_or(0);
                if worst_gone >= DENYING {
                    proptest::prop_assert!(kept.iter().all(|r| *r >= DENYING), "{gone:?} {kept:?}");
                }
                if worst_gone > 0 {
                    proptest::prop_assert!(kept.iter().all(|r| *r > 0), "{gone:?} {kept:?}");
                }
            }
        }
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

    const GATED: [Algorithm; 3] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::CountMinSketch,
    ];

    fn gated(q: Quota, keys: u64, fp: f64) -> Quota {
        q.with_doorkeeper(crate::quota::Doorkeeper::new(keys, fp).ok())
    }

    #[test]
    fn doorkeeper_limit_of_one_still_denies_the_second_request() {
        for alg in GATED {
            let s = MemoryStore::with_seed(1000, 1, 2);
            let q = gated(Quota::new(1, Unit::Minute).with_algorithm(alg), 1000, 0.01);
            let t = 60 * SECOND * 10;
            let first = s.check_one(t, &item("k", &q, 1)).unwrap();
            assert!(first.allowed, "{alg}");
            assert_eq!(s.len(), 0, "{alg}: the first request costs no counter");
            assert!(
                !s.check_one(t + 1, &item("k", &q, 1)).unwrap().allowed,
                "{alg}"
            );
            assert!(
                !s.check_one(t + 2, &item("k", &q, 1)).unwrap().allowed,
                "{alg}"
            );
            assert_eq!(s.doorkeepers()[0].1.held_back, 1, "{alg}");
        }
    }

    #[test]
    fn doorkeeper_off_is_the_plain_store() {
        let q = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::Gcra);
        // A rule cannot give GCRA a doorkeeper; a quota built in code that does has none.
        assert_eq!(gated(q, 10, 0.01).doorkeeper(), None);
        let s = MemoryStore::with_seed(1000, 1, 2);
        s.check_one(SECOND, &item("k", &gated(q, 10, 0.01), 1))
            .unwrap();
        assert_eq!(s.len(), 1);
        assert!(s.doorkeepers().is_empty());
    }

    /// A filter far too small for its keys: false positives are frequent, and each one costs
    /// its key at most one request of its window's allowance, never grants one.
    #[test]
    fn doorkeeper_false_positives_only_ever_deny_one_early() {
        for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
            let exact = MemoryStore::with_seed(1 << 16, 1, 2);
            let door = MemoryStore::with_seed(1 << 16, 1, 2);
            let q = Quota::new(3, Unit::Minute).with_algorithm(alg);
            let g = gated(q, 64, 0.5);
            let t = 60 * SECOND * 10;
            let (mut admitted_exact, mut admitted_door, mut short) = (0u64, 0u64, 0u64);
            for k in 0..2000 {
                let key = format!("k{k}");
                let (mut a, mut b) = (0, 0);
                for i in 0..5 {
                    a += u64::from(exact.check_one(t + i, &item(&key, &q, 1)).unwrap().allowed);
                    b += u64::from(door.check_one(t + i, &item(&key, &g, 1)).unwrap().allowed);
                }
                assert!(b <= a && a - b <= 1, "{alg} {key}: {a} vs {b}");
                short += a - b;
                admitted_exact += a;
                admitted_door += b;
            }
            assert_eq!(admitted_exact, 3 * 2000);
            assert_eq!(admitted_door + short, admitted_exact);
            assert!(
                short > 0,
                "{alg}: an overfull filter must show false positives"
            );
        }
    }

    /// A flood of one-request keys beside clients at their limits, `max_keys` far below the
    /// flood: with a doorkeeper the clients' decisions are those of a run without the flood and
    /// nothing is evicted; without it, the flood evicts.
    #[test]
    fn doorkeeper_keeps_a_flood_of_one_shot_keys_out_of_the_key_table() {
        let run = |flood: u64, door: bool| {
            let s = MemoryStore::with_seed(4096, 3, 4);
            let mut q = Quota::new(10, Unit::Minute);
            if door {
                q = gated(q, 60_000, 0.01);
            }
            let t0 = 60 * SECOND * 100;
            let (clients, real) = (300u64, 300 * 24);
            let mut decisions = Vec::new();
            let mut sent = 0;
            for r in 0..real {
                let now = t0 + r * 120 * SECOND / real;
                while sent < (r + 1) * flood / real {
                    s.check_one(now, &item(&format!("flood{sent}"), &q, 1))
                        .unwrap();
                    sent += 1;
                }
                decisions.push(
                    s.check_one(now, &item(&format!("c{}", r % clients), &q, 1))
                        .unwrap(),
                );
            }
            (decisions, s.evictions(), s.len())
        };
        let (baseline, _, _) = run(0, false);
        let (with_door, evicted, held) = run(60_000, true);
        assert_eq!(with_door, baseline);
        assert_eq!(evicted, 0);
        assert!(held < 4096, "{held}");
        let (_, evicted, _) = run(60_000, false);
        assert!(evicted > 0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

        /// With a filter that tells the truth (sized far beyond the keys), a limit with a
        /// doorkeeper decides every request, single or in a multi-key check, exactly as the
        /// plain store: the first request of a key in a window included.
        #[test]
        fn doorkeeper_decisions_equal_the_exact_store(
            alg in 0usize..3,
            limit in 1u64..5,
            ops in proptest::collection::vec(
                (0u64..6, 0u64..3, 0u64..40_000_000, proptest::option::of((0u64..6, 0u64..3))),
                1..200,
            ),
        ) {
            let q = Quota::new(limit, Unit::Minute).with_algorithm(GATED[alg])
                .with_sketch(crate::quota::SketchSize { width: 1 << 16, depth: 4 });
            let g = gated(q, 100_000, 1e-6);
            let exact = MemoryStore::with_seed(1 << 12, 9, 9);
            let door = MemoryStore::with_seed(1 << 12, 9, 9);
            let mut now = 60 * SECOND * 1000;
            for (key, cost, gap, other) in ops {
                now += gap;
                let k = format!("k{key}");
                let d = |s: &MemoryStore, q: &Quota| match other {
                    None => vec![s.check_one(now, &item(&k, q, cost)).unwrap()],
                    Some((o, c)) => {
                        let ok = format!("k{o}");
                        s.check(now, &[item(&k, q, cost), item(&ok, q, c)]).unwrap()
                    }
                };
                proptest::prop_assert_eq!(d(&door, &g), d(&exact, &q));
            }
        }
    }
}
