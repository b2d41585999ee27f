//! Batched counts (`sync: batched`): approximate global limits decided locally, with a bounded
//! over-admission.
//!
//! Each instance keeps, per counter, the fleet's count it learned at its last flush and the
//! units it admitted since (by window). It admits a request while learned + its own unsent
//! units + the cost fit the limit (the algorithm's own step over that state, so headers and
//! retry times are computed as on Redis), and every flush interval sends the units of every
//! counter that admitted some in one script call (`flush.lua`; on a Cluster, one per hash
//! slot), learning the fleet's count back. Other instances' admissions are seen a flush late:
//! that is the over-admission, bounded per window by `(N − 1) × rate × (4 × interval + flush
//! round trip)` (see `docs/distributed.md`).
//!
//! The interval is the limit's own (`flush_interval` in the rule, [`Quota::flush_interval`]),
//! or the store's default. A counter is due on its interval's grid (the multiples of the
//! interval since the epoch) rather than an interval after its first request: counters of
//! one interval are due together, so a flush tick sends every due counter in one call however
//! many there are, and a 50 ms counter meets a 100 ms one on every second tick
//! (`Batches::take`, `Batches::next_due`).
//!
//! What keeps it bounded:
//! - a counter is decided locally only from a count learned recently (two of its flush
//!   intervals, [`Batches::stale_after`]); a counter seen for the first time, or not refreshed
//!   since, goes to Redis (an exact check) and learns the count from its answer;
//! - a flush is applied at most once: it carries the instance's id and a sequence number that
//!   Redis remembers per counter and instance; a flush that failed is sent again as it was (same
//!   sequence, same units) before anything newer, so a retry after a timeout Redis had applied
//!   counts nothing twice;
//! - units belong to the window they were admitted in: a flush after the window rolled over
//!   adds them to that window (a sliding counter's previous one), or drops them once it is over;
//! - at most [`MAX_COUNTERS`] counters are tracked; beyond it, counters are decided by Redis as
//!   with `exact`.
//!
//! Only `fixed_window` and `sliding_window_counter` (counts that add up per window) are batched
//! (see [`SyncMode::supports`]).

use crate::counter::{map_key, repeats};
use crate::limits::LimitStats;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;
use tollgate_core::internals::{previous_start, step, window, Counter as Sliding, State, Window};
use tollgate_core::{Algorithm, CheckItem, Decision, Micros, Quota, SyncMode};

/// The flush interval when none is configured.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Counters tracked at most (beyond it, new counters are decided by Redis, as `exact`).
pub const MAX_COUNTERS: usize = 100_000;

/// A counter's units sent to Redis and not yet confirmed (a failed flush sends them again).
#[derive(Debug, Clone)]
struct Inflight {
    seq: u64,
    /// (window start, units).
    windows: Vec<(Micros, u64)>,
}

/// One counter as this instance sees it.
#[derive(Debug)]
struct Tracked {
    rule: String,
    key: String,
    quota: Quota,
    /// The fleet's state learned last: (window start, previous window's count, count).
    learned: (Micros, u64, u64),
    /// Local time the learned state was read from Redis.
    learned_at: Micros,
    /// Units admitted locally and not sent yet, by window start (at most two windows).
    pending: Vec<(Micros, u64)>,
    inflight: Option<Inflight>,
    /// The excess over the limit already reported for the learned window (overshoot metric).
    excess: (Micros, u64),
    used_at: Micros,
    /// Its flush interval (µs) and the local time its next flush is due (a grid point of it).
    every: Micros,
    due: Micros,
}

/// The first multiple of `every` after `now`: counters of one interval are due together.
fn next_tick(now: Micros, every: Micros) -> Micros {
    (now / every + 1) * every
}

impl Tracked {
    /// Take a (reloaded) quota at `now`: a new interval starts on its own grid, pending units
    /// kept. Returns the new due time when the interval changed.
    fn set_quota(&mut self, quota: Quota, every: Micros, now: Micros) -> Option<Micros> {
        self.quota = quota;
        if self.every == every {
            return None;
        }
        self.every = every;
        self.due = next_tick(now, every);
        Some(self.due)
    }

    /// The state the algorithm steps from at `now`: the learned fleet state rolled to `now`'s
    /// window, plus the units in flight and pending; `limit` is the quota's limit now (a reload
    /// may have changed it).
    fn state(&self, now: Micros, limit: u64) -> State {
        let period = self.quota.period();
        let (start, _) = window(period, now);
        let prev_start = previous_start(period, start);
        let (ls, lp, lc) = self.learned;
        let (mut prev, mut cur) = if ls == start {
            (lp, lc)
        } else if ls == prev_start {
            (lc, 0)
        } else {
            (0, 0)
        };
        let local = self
            .pending
            .iter()
            .chain(self.inflight.iter().flat_map(|f| f.windows.iter()));
        for &(w, units) in local {
            if w == start {
                cur = cur.saturating_add(units);
            } else if w == prev_start {
                prev = prev.saturating_add(units);
            }
        }
        if self.quota.algorithm() == Algorithm::FixedWindow {
            // The fleet may be over the limit (the overshoot): the step expects a count within
            // it, and decides alike for any count at or above it.
            State::Window(Window {
                start,
                count: cur.min(limit),
            })
        } else {
            State::Counter(Sliding { start, prev, cur })
        }
    }

    fn add(&mut self, window_start: Micros, units: u64) {
        match self.pending.iter_mut().find(|(w, _)| *w == window_start) {
            Some((_, u)) => *u += units,
            None => self.pending.push((window_start, units)),
        }
    }
}

/// Counters of what batches did (per store).
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Flushes that reached Redis.
    pub flushes: AtomicU64,
    /// Flushes that failed (their units are sent again).
    pub flush_failures: AtomicU64,
    /// Units sent and confirmed.
    pub units_flushed: AtomicU64,
    /// Requests decided locally.
    pub local_decisions: AtomicU64,
}

/// One counter's entry of a flush, for `RedisStore::flush_batch`.
#[derive(Debug, Clone)]
pub(crate) struct FlushEntry {
    pub key: String,
    pub quota: Quota,
    pub ttl_ms: u64,
    /// (window start, next window's start, previous window's start, units).
    pub windows: Vec<(Micros, Micros, Micros, u64)>,
    pub seq: u64,
}

/// The batched counters of one store.
#[derive(Debug)]
pub struct Batches {
    map: Mutex<HashMap<String, Tracked>>,
    /// This instance's id in Redis' sequence hashes (random per process and store).
    pub(crate) instance: String,
    seq: AtomicU64,
    /// One flush at a time.
    pub(crate) flushing: tokio::sync::Mutex<()>,
    /// The interval of limits that name none.
    interval: Duration,
    /// Wakes the flusher when a counter is due before the time it sleeps until (`planned`).
    pub(crate) wake: std::sync::Arc<tokio::sync::Notify>,
    pub(crate) planned: AtomicU64,
    /// What the batches did.
    pub stats: BatchStats,
}

fn batched(item: &CheckItem<'_>) -> bool {
    crate::counter::kept(item, SyncMode::Batched)
}

impl Batches {
    /// Batches flushed every `interval` (at least 1 ms), under a fresh instance id.
    pub fn new(interval: Duration) -> Self {
        use std::hash::BuildHasher;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let salt = std::collections::hash_map::RandomState::new().hash_one(nanos);
        Self {
            map: Mutex::default(),
            instance: format!("{:x}-{salt:x}", std::process::id()),
            seq: AtomicU64::new(0),
            flushing: tokio::sync::Mutex::const_new(()),
            interval: interval.max(Duration::from_millis(1)),
            wake: std::sync::Arc::default(),
            planned: AtomicU64::new(0),
            stats: BatchStats::default(),
        }
    }

    /// The flush interval of limits that name none.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// `quota`'s flush interval in µs: its own, or the default.
    fn every(&self, quota: &Quota) -> Micros {
        let d = quota.flush_interval().unwrap_or(self.interval);
        (d.as_micros() as Micros).max(1_000)
    }

    /// A learned count of `quota`'s older than this is not decided from (two of its flush
    /// intervals).
    pub fn stale_after(&self, quota: &Quota) -> Micros {
        2 * self.every(quota)
    }

    /// A counter is due at `due`: wake the flusher if it sleeps past it.
    fn due_at(&self, due: Micros) {
        if due < self.planned.load(Relaxed) {
            self.wake.notify_one();
        }
    }

    /// The local time the next counter is due to flush (`None`: nothing tracked).
    pub(crate) fn next_due(&self) -> Option<Micros> {
        self.lock().values().map(|t| t.due).min()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decide `items` at local time `now` locally, when every item is batched and tracked with
    /// a recent count; `None`: ask Redis.
    pub(crate) fn decide(&self, now: Micros, items: &[CheckItem<'_>]) -> Option<Vec<Decision>> {
        if items.is_empty() || !items.iter().all(batched) || (items.len() > 1 && repeats(items)) {
            return None;
        }
        let keys: Vec<String> = items.iter().map(map_key).collect();
        let mut map = self.lock();
        for (item, k) in items.iter().zip(&keys) {
            let t = map.get(k)?;
            let stale = self.stale_after(item.quota);
            if now.saturating_sub(t.learned_at) > stale || t.learned_at > now.saturating_add(stale)
            {
                return None;
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for (item, k) in items.iter().zip(&keys) {
            let t = map.get(k)?;
            let limit = item.quota.limit();
            let (d, _) = step(Some(t.state(now, limit)), now, item.cost, item.quota);
            out.push(d);
        }
        let blocked = items.iter().zip(&out).any(|(i, d)| !d.allowed && !i.shadow);
        for ((item, k), d) in items.iter().zip(&keys).zip(out.iter_mut()) {
            let Some(t) = map.get_mut(k) else { continue };
            t.used_at = now;
            if let Some(due) = t.set_quota(*item.quota, self.every(item.quota), now) {
                self.due_at(due);
            }
            if !d.allowed || item.cost == 0 {
                continue;
            }
            if blocked {
                // Nothing is counted: report what a query sees.
                let limit = item.quota.limit();
                *d = step(Some(t.state(now, limit)), now, 0, item.quota).0;
                continue;
            }
            t.add(window(item.quota.period(), now).0, item.cost);
        }
        self.stats.local_decisions.fetch_add(1, Relaxed);
        Some(out)
    }

    /// Learn the counts of batched `items` from Redis' answer to an exact check at `now` (the
    /// first request of a counter, or one whose count went stale): the count is the limit less
    /// what Redis reported remaining. A sliding counter's weighted estimate is taken as the
    /// current window's count (larger than the truth until the next flush: the safe side).
    pub(crate) fn learn(&self, now: Micros, items: &[CheckItem<'_>], decisions: &[Decision]) {
        if !items.iter().any(batched) || (items.len() > 1 && repeats(items)) {
            return;
        }
        let mut map = self.lock();
        for (item, d) in items.iter().zip(decisions) {
            if !batched(item) {
                continue;
            }
            let k = map_key(item);
            if !map.contains_key(&k) && map.len() >= MAX_COUNTERS {
                continue;
            }
            let start = window(item.quota.period(), now).0;
            let count = item.quota.limit().saturating_sub(d.remaining);
            let every = self.every(item.quota);
            let t = map.entry(k).or_insert_with(|| {
                let due = next_tick(now, every);
                self.due_at(due);
                Tracked {
                    rule: item.rule.to_owned(),
                    key: item.key.to_owned(),
                    quota: *item.quota,
                    learned: (start, 0, 0),
                    learned_at: now,
                    pending: Vec::new(),
                    inflight: None,
                    excess: (start, 0),
                    used_at: now,
                    every,
                    due,
                }
            });
            if let Some(due) = t.set_quota(*item.quota, every, now) {
                self.due_at(due);
            }
            // Units this instance has not had confirmed are not in Redis' count (or are, if a
            // failed flush was applied: counted twice here, the safe side).
            t.learned = (start, 0, count);
            t.learned_at = now;
            t.used_at = now;
        }
    }

    /// The next flush's entries at `now`: of every counter due (every counter when `all`), its
    /// failed batch again, or its pending units under a new sequence number; a due counter is
    /// next due at its interval's next grid point. Forgets counters idle since their window
    /// ended and units whose window is over.
    pub(crate) fn take(&self, now: Micros, grace_ms: u64, all: bool) -> Vec<(String, FlushEntry)> {
        let mut map = self.lock();
        let mut out = Vec::new();
        map.retain(|k, t| {
            let period = t.quota.period();
            let sliding = t.quota.algorithm() == Algorithm::SlidingWindowCounter;
            // Units of a window are moot once it (and, for a sliding counter, the next one, where
            // it weighs as the previous window) is over.
            let live = |w: Micros| {
                let (_, end) = window(period, w);
                let end = if sliding { window(period, end).1 } else { end };
                end > now
            };
            t.pending.retain(|(w, _)| live(*w));
            if let Some(f) = &mut t.inflight {
                f.windows.retain(|(w, _)| live(*w));
                if f.windows.is_empty() {
                    t.inflight = None;
                }
            }
            let due = all || t.due <= now;
            if due {
                t.due = next_tick(now, t.every);
            }
            if due && t.inflight.is_none() && !t.pending.is_empty() {
                let seq = self.seq.fetch_add(1, Relaxed) + 1;
                t.inflight = Some(Inflight {
                    seq,
                    windows: std::mem::take(&mut t.pending),
                });
            }
            let Some(f) = t.inflight.as_ref().filter(|_| due) else {
                // Nothing to send now: kept while its window lasts, or while units wait.
                return t.inflight.is_some()
                    || !t.pending.is_empty()
                    || live(window(period, t.used_at).0);
            };
            let ttl_end = f
                .windows
                .iter()
                .map(|(w, _)| {
                    let (_, end) = window(period, *w);
                    if sliding {
                        window(period, end).1
                    } else {
                        end
                    }
                })
                .max()
                .unwrap_or(now);
            let ttl_ms = ttl_end.saturating_sub(now).div_ceil(1000).max(1) + grace_ms;
            out.push((
                k.clone(),
                FlushEntry {
                    key: t.key.clone(),
                    quota: t.quota,
                    ttl_ms,
                    windows: f
                        .windows
                        .iter()
                        .map(|&(w, u)| {
                            let (_, end) = window(period, w);
                            (w, end, previous_start(period, w), u)
                        })
                        .collect(),
                    seq: f.seq,
                },
            ));
            true
        });
        out
    }

    /// Merge a flush's answer: confirmed batches are dropped, each counter's learned state
    /// becomes what Redis holds (at local time `now`). Reports to `limits` per limit.
    pub(crate) fn merge(
        &self,
        now: Micros,
        sent: &[(String, FlushEntry)],
        states: &[[u64; 3]],
        limits: &LimitStats,
    ) {
        let mut map = self.lock();
        for ((k, e), s) in sent.iter().zip(states) {
            let Some(t) = map.get_mut(k) else { continue };
            if t.inflight.as_ref().is_some_and(|f| f.seq == e.seq) {
                t.inflight = None;
            }
            let units: u64 = e.windows.iter().map(|w| w.3).sum();
            self.stats.units_flushed.fetch_add(units, Relaxed);
            t.learned = (s[0], s[1], s[2]);
            t.learned_at = now;
            let l = limits.get(&t.rule);
            l.flushes.fetch_add(1, Relaxed);
            l.redis_calls.fetch_add(1, Relaxed);
            l.last_flush.fetch_max(now, Relaxed);
            // The fleet's count over the limit, as this flush found it (each unit once per
            // window, whichever flush first saw it).
            let over = s[2].saturating_sub(t.quota.limit());
            if t.excess.0 != s[0] {
                t.excess = (s[0], 0);
            }
            if over > t.excess.1 {
                l.overshoot.fetch_add(over - t.excess.1, Relaxed);
                t.excess.1 = over;
            }
        }
    }

    /// Units of `item`'s counter admitted locally in `now`'s window and not confirmed by Redis
    /// (pending or in a flush not answered): what this instance took from the fleet's count
    /// since it last learned it. 0 for an item not batched or not tracked.
    pub(crate) fn unsent(&self, now: Micros, item: &CheckItem<'_>) -> u64 {
        if !batched(item) {
            return 0;
        }
        let map = self.lock();
        let Some(t) = map.get(&map_key(item)) else {
            return 0;
        };
        let start = window(t.quota.period(), now).0;
        t.pending
            .iter()
            .chain(t.inflight.iter().flat_map(|f| f.windows.iter()))
            .filter(|(w, _)| *w == start)
            .map(|(_, u)| u)
            .sum()
    }

    /// Counters tracked now.
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }

    /// Units admitted locally and not confirmed by Redis yet, over every counter.
    pub fn unconfirmed(&self) -> u64 {
        self.lock()
            .values()
            .map(|t| {
                t.pending.iter().map(|p| p.1).sum::<u64>()
                    + t.inflight
                        .as_ref()
                        .map_or(0, |f| f.windows.iter().map(|w| w.1).sum())
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Unit;

    const T0: Micros = 1_700_000_000_000_000;

    fn answer(remaining: u64) -> Decision {
        Decision {
            allowed: true,
            limit: 10,
            remaining,
            ..Decision::default()
        }
    }

    #[test]
    fn decides_locally_from_the_learned_count_and_resends_a_failed_batch_as_it_was() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Batched);
        let b = Batches::new(Duration::from_millis(100));
        let items = [CheckItem::hit("r", "k", &q)];
        assert!(b.decide(T0, &items).is_none(), "unknown: Redis decides");
        b.learn(T0, &items, &[answer(6)]);
        for _ in 0..6 {
            assert!(b.decide(T0 + 1, &items).unwrap()[0].allowed);
        }
        assert!(!b.decide(T0 + 1, &items).unwrap()[0].allowed, "4 + 6 = 10");
        assert_eq!(b.unconfirmed(), 6);
        let first = b.take(T0 + 2, 0, true);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].1.windows[0].3, 6);
        // No answer came: the same batch, same sequence, nothing newer mixed in.
        let again = b.take(T0 + 3, 0, true);
        assert_eq!(again[0].1.seq, first[0].1.seq);
        assert_eq!(again[0].1.windows[0].3, 6);
        // Stale after two intervals: Redis decides again.
        assert!(b.decide(T0 + 1 + b.stale_after(&q) + 1, &items).is_none());
    }

    #[test]
    fn unsent_counts_pending_and_inflight_units_of_the_current_window_only() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Batched);
        let b = Batches::new(Duration::from_millis(100));
        let items = [CheckItem::hit("r", "k", &q)];
        assert_eq!(b.unsent(T0, &items[0]), 0, "not tracked");
        b.learn(T0, &items, &[answer(8)]);
        b.decide(T0 + 1, &items).unwrap();
        b.take(T0 + 2, 0, true);
        b.decide(T0 + 3, &items).unwrap();
        assert_eq!(b.unsent(T0 + 4, &items[0]), 2, "one in flight, one pending");
        let next_hour = window(q.period(), T0).1;
        assert_eq!(b.unsent(next_hour, &items[0]), 0, "another window");
        let exact = Quota::new(10, Unit::Hour);
        assert_eq!(b.unsent(T0 + 4, &CheckItem::hit("r", "k", &exact)), 0);
    }

    #[test]
    fn each_counter_is_flushed_on_its_own_interval_and_a_reload_keeps_its_units() {
        let slow = Quota::new(100, Unit::Day)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Batched)
            .with_flush_interval(Some(Duration::from_millis(100)));
        let fast = slow.with_flush_interval(Some(Duration::from_millis(50)));
        let b = Batches::new(Duration::from_secs(1));
        let items = [
            CheckItem::hit("s", "a", &slow),
            CheckItem::hit("f", "b", &fast),
        ];
        b.learn(T0, &items, &[answer(10), answer(10)]);
        assert_eq!(b.next_due(), Some(T0 + 50_000), "T0 is on both grids");
        let ms = 1_000;
        let sent = |at: Micros| -> Vec<String> {
            b.decide(at - 1, &items).expect("fresh");
            let mut keys: Vec<String> = b.take(at, 0, false).into_iter().map(|e| e.1.key).collect();
            keys.sort();
            // Answered: the next batch gets a new sequence.
            for e in b.lock().values_mut() {
                e.inflight = None;
                e.learned_at = at;
            }
            keys
        };
        assert_eq!(sent(T0 + 20 * ms), Vec::<String>::new(), "nothing due");
        assert_eq!(sent(T0 + 50 * ms), ["b"]);
        assert_eq!(sent(T0 + 100 * ms), ["a", "b"], "one call for both");
        assert_eq!(sent(T0 + 150 * ms), ["b"]);
        // A late tick sends what is due, and the next one is back on the grid.
        assert_eq!(sent(T0 + 230 * ms), ["a", "b"]);
        assert_eq!(sent(T0 + 250 * ms), ["b"]);
        // Reloaded to flush every second: the units admitted under 50 ms wait for it.
        let reloaded = fast.with_flush_interval(Some(Duration::from_secs(1)));
        let reloaded_items = [CheckItem::hit("f", "b", &reloaded)];
        b.decide(T0 + 260 * ms, &reloaded_items).expect("fresh");
        assert!(b
            .take(T0 + 300 * ms, 0, false)
            .iter()
            .all(|e| e.1.key != "b"));
        let at_second = b.take(T0 + 1_000 * ms, 0, false);
        let e = at_second
            .iter()
            .find(|e| e.1.key == "b")
            .expect("due at the second");
        assert_eq!(e.1.windows[0].3, 1);
        assert_eq!(b.stale_after(&reloaded), 2_000_000);
    }

    #[test]
    fn a_lower_limit_after_a_reload_denies_without_panicking() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Batched);
        let b = Batches::new(Duration::from_millis(100));
        b.learn(T0, &[CheckItem::hit("r", "k", &q)], &[answer(1)]);
        let lower = q.with_limit(3);
        let d = b
            .decide(T0 + 1, &[CheckItem::hit("r", "k", &lower)])
            .unwrap();
        assert!(!d[0].allowed && d[0].remaining == 0);
    }

    #[test]
    fn a_blocked_request_counts_nothing() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::SlidingWindowCounter)
            .with_sync(SyncMode::Batched);
        let tight = q.with_limit(1);
        let b = Batches::new(Duration::from_millis(100));
        let items = [
            CheckItem::hit("r", "a", &q),
            CheckItem::hit("r", "b", &tight),
        ];
        b.learn(T0, &items, &[answer(10), answer(0)]);
        let d = b.decide(T0 + 1, &items).unwrap();
        assert!(d[0].allowed && !d[1].allowed);
        assert_eq!(b.unconfirmed(), 0, "the admitted item is not counted");
    }
}
