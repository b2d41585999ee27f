//! Count-min-sketch limiter: a sliding window counter whose per-key counts come from
//! two count-min sketches (previous and current aligned window) shared by every key of a limit.
//!
//! Memory is fixed (`2 × depth × width × 4` bytes per limit) whatever the number of keys, which
//! makes it the choice for limits keyed by something an attacker can vary freely (source IP,
//! random user ids). A count-min sketch never undercounts, so the estimate is never below the
//! exact sliding-window-counter estimate and the limiter never admits more than the exact one
//! would; collisions can only make it deny early. Updates are conservative (raise each row only
//! up to the new estimate), which keeps overcounting small. Unlike seed 001's version, the
//! windows rotate on the request path from the injected clock, not on a timer thread.

use super::sliding_counter::{decide, roll};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Quota, SketchSize};

/// Two rotating count-min sketches.
#[derive(Debug, Clone)]
pub struct Sketch {
    width: usize,
    depth: usize,
    start: Option<Micros>,
    prev: Vec<u32>,
    cur: Vec<u32>,
}

impl Sketch {
    /// An empty sketch of the given size (width and depth at least 1).
    pub fn new(size: SketchSize) -> Self {
        let width = size.width.max(1) as usize;
        let depth = size.depth.max(1) as usize;
        Self {
            width,
            depth,
            start: None,
            prev: vec![0; width * depth],
            cur: vec![0; width * depth],
        }
    }

    /// Bytes of counters held.
    #[cfg(test)]
    pub(crate) fn memory(&self) -> usize {
        (self.prev.len() + self.cur.len()) * std::mem::size_of::<u32>()
    }

    /// Cell index in each row (Kirsch–Mitzenmacher double hashing of a 128-bit key hash).
    fn cells(&self, hash: u128) -> impl Iterator<Item = usize> + '_ {
        let h1 = hash as u64;
        let h2 = ((hash >> 64) as u64) | 1;
        (0..self.depth).map(move |row| {
            let h = h1.wrapping_add((row as u64).wrapping_mul(h2));
            row * self.width + (h % self.width as u64) as usize
        })
    }

    fn estimate(&self, counts: &[u32], hash: u128) -> u64 {
        self.cells(hash)
            .map(|i| u64::from(counts[i]))
            .min()
            .unwrap_or(0)
    }

    /// Rotate the windows to `now`; returns the instant to decide at (clamped forward if the
    /// clock went backwards) and the window bounds.
    fn rotate(&mut self, now: Micros, quota: &Quota) -> (Micros, Micros, Micros) {
        // roll() on dummy counts (1, 1) tells which way the windows moved.
        let (now, ws, we, p, c) = roll(quota.period(), self.start, 1, 1, now);
        match (p, c) {
            (1, 1) => {}
            (1, 0) => {
                std::mem::swap(&mut self.prev, &mut self.cur);
                self.cur.fill(0);
            }
            _ => {
                self.prev.fill(0);
                self.cur.fill(0);
            }
        }
        self.start = Some(ws);
        (now, ws, we)
    }

    /// Decide for the key with hash `hash`, without recording anything (rotating windows is not
    /// consumption).
    pub(crate) fn evaluate(
        &mut self,
        hash: u128,
        now: Micros,
        cost: u64,
        quota: &Quota,
    ) -> Decision {
        let (now, ws, we) = self.rotate(now, quota);
        let prev = self.estimate(&self.prev, hash);
        let cur = self.estimate(&self.cur, hash);
        decide(quota.period(), quota.limit(), now, ws, we, prev, cur, cost)
    }

    /// [`Sketch::evaluate`] for a limit with a doorkeeper: the key's first request of each
    /// window lives in the filter, not the sketch, so each estimate adds its bit (`seen`: seen
    /// in the previous window, seen in the current one).
    pub(crate) fn evaluate_seen(
        &mut self,
        hash: u128,
        now: Micros,
        cost: u64,
        quota: &Quota,
        seen: (bool, bool),
    ) -> Decision {
        let (now, ws, we) = self.rotate(now, quota);
        let prev = self.estimate(&self.prev, hash) + u64::from(seen.0);
        let cur = self.estimate(&self.cur, hash) + u64::from(seen.1);
        decide(quota.period(), quota.limit(), now, ws, we, prev, cur, cost)
    }

    /// Record `cost` for the key (conservative update). Call after an admitting [`evaluate`].
    ///
    /// [`evaluate`]: Sketch::evaluate
    pub(crate) fn record(&mut self, hash: u128, cost: u64) {
        if cost == 0 {
            return;
        }
        let target = self.estimate(&self.cur, hash).saturating_add(cost);
        let target = u32::try_from(target).unwrap_or(u32::MAX);
        let cells: Vec<usize> = self.cells(hash).collect();
        for i in cells {
            self.cur[i] = self.cur[i].max(target);
        }
    }

    /// Evaluate and, when admitted, record: one complete step.
    pub fn check(&mut self, hash: u128, now: Micros, cost: u64, quota: &Quota) -> Decision {
        let d = self.evaluate(hash, now, cost, quota);
        if d.allowed {
            self.record(hash, cost);
        }
        d
    }
}
