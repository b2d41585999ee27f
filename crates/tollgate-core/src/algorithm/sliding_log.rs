//! Sliding window log: the timestamps (with cost) of admitted requests.
//!
//! Exact: at most `limit` is admitted in any window `(t - period, t]`. Memory grows with the
//! limit (one entry per distinct admission time still in the window), so it suits small limits
//! such as logins per minute. Denied requests are not logged (seed 001's variant logs them too,
//! which lets a client that keeps retrying lock itself out forever).
//!
//! Cost per step does not grow with the log: entries carry the running total of the costs
//! logged so far, so the sum in the window is one subtraction and the entry that frees enough
//! for a denied request is a binary search. Admissions at the same time share one entry (their
//! costs add up), so a burst of requests in one instant, or one request naming a counter many
//! times, adds one entry. Expired entries are dropped from the front, each once.
//!
//! Clock steps: an entry later than `now` can only mean the clock went backwards since it was
//! logged. Such entries are clamped to `now` (kept and counted, so a forward-then-back step does
//! not hand out a fresh quota, but never waited on for longer than one period), which also keeps
//! the log sorted with every new entry at its end. With a monotonic clock nothing is ever
//! clamped, so decisions are unchanged. `retry_after` and `reset_after` never exceed the period.

use super::{deny_forever, Outcome};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Quota;
use std::collections::VecDeque;

/// Running totals are renumbered from zero before they pass this (never in practice: it takes
/// 2^62 admitted hits on one key).
const REBASE: u64 = 1 << 62;

/// Admitted requests still inside the window, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Log {
    /// `(time, running total of the costs up to and including this entry)`, oldest first,
    /// times non-decreasing, one entry per time at the end.
    entries: VecDeque<(Micros, u64)>,
    /// The running total before the oldest entry.
    base: u64,
}

impl PartialEq for Log {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Log {}

impl Log {
    /// An empty log.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether nothing is logged.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of entries (distinct admission times) held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries as `(time, cost)`, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (Micros, u64)> + '_ {
        let mut prev = self.base;
        self.entries.iter().map(move |&(t, cum)| {
            let cost = cum - prev;
            prev = cum;
            (t, cost)
        })
    }

    /// The sum of the logged costs.
    pub(crate) fn total(&self) -> u64 {
        self.entries.back().map_or(0, |&(_, cum)| cum - self.base)
    }

    /// Log `cost` (> 0) at `t`, which is at or after every entry.
    fn push(&mut self, t: Micros, cost: u64) {
        if self.base > REBASE {
            let base = self.base;
            self.entries.iter_mut().for_each(|e| e.1 -= base);
            self.base = 0;
        }
        let cum = self.entries.back().map_or(self.base, |&(_, c)| c) + cost;
        match self.entries.back_mut() {
            Some(back) if back.0 == t => back.1 = cum,
            _ => self.entries.push_back((t, cum)),
        }
    }

    /// Shrink the buffer when it holds far more than the entries (after a burst left).
    fn trim(&mut self) {
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
    }
}

/// The decision of a step of `cost` at `now` on `log` after `added` more was logged at `now` by
/// earlier items of the same request, without changing the log: what [`step`] would answer on
/// the log those steps left (pruned, clamped, `added` appended), found by binary searches on the
/// running totals. A store checking a counter named several times in one request asks this per
/// item and writes once ([`Log::commit`]) only if the request consumes, so the stored log is
/// neither copied nor touched by a request that does not.
pub(crate) fn peek(
    log: Option<&Log>,
    added: u64,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> Decision {
    let len = quota.period().nominal();
    let empty = Log::new();
    let log = log.unwrap_or(&empty);
    // The first entry still inside (now - len, now], and the running total before it.
    let first = log
        .entries
        .partition_point(|&(t, _)| t.saturating_add(len) <= now);
    let before = first.checked_sub(1).map_or(log.base, |i| log.entries[i].1);
    let kept = log.total() + log.base - before;
    let count = kept + added;
    let limit = quota.limit();
    // The newest entry, clamped to `now`; `now` itself once this request logged something.
    let last = if added > 0 {
        Some(now)
    } else {
        log.entries
            .back()
            .filter(|_| first < log.entries.len())
            .map(|&(t, _)| t.min(now))
    };
    let empties_in = |last: Option<Micros>| last.map_or(0, |t| (t + len).saturating_sub(now));
    if limit == 0 || cost > limit {
        let mut d = deny_forever(limit, ()).0;
        d.remaining = limit.saturating_sub(count);
        d.reset_after = empties_in(last);
        return d;
    }
    if count + cost <= limit {
        let last = if cost > 0 { Some(now) } else { last };
        return Decision {
            allowed: true,
            limit,
            remaining: limit - count - cost,
            reset_after: empties_in(last),
            retry_after: None,
            delay: 0,
            count: None,
        };
    }
    // As in `step`: the first entry whose running total covers the excess; past the stored
    // entries, one this request logged at `now`.
    let excess = count + cost - limit;
    let retry = if excess <= kept {
        let target = before + excess;
        // Totals grow along the log and every one before `first` is at most `before`: the
        // search over the whole log lands at or after `first`.
        let at = log.entries.partition_point(|&(_, cum)| cum < target);
        let t = log.entries.get(at).map_or(now, |&(t, _)| t.min(now));
        (t + len).saturating_sub(now)
    } else {
        len
    };
    Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(count),
        reset_after: empties_in(last),
        retry_after: Some(retry),
        delay: 0,
        count: None,
    }
}

impl Log {
    /// What the steps that [`peek`] stood for leave: the log pruned and clamped at `now` for a
    /// window of `quota`, with `added` (> 0 or not) logged at `now`; `None` when empty.
    pub(crate) fn commit(self, now: Micros, added: u64, quota: &Quota) -> Option<Log> {
        // A step of cost 0 prunes and clamps (on the limit-0 path too); the push follows it.
        let mut log = step(Some(self), now, 0, quota).1.unwrap_or_default();
        if added > 0 {
            log.push(now, added);
        }
        (!log.is_empty()).then_some(log)
    }
}

/// One step. `log` is `None` when nothing is logged. Returns the log to keep (`None` if empty).
pub fn step(log: Option<Log>, now: Micros, cost: u64, quota: &Quota) -> Outcome<Log> {
    let len = quota.period().nominal();
    let mut log = log.unwrap_or_default();
    // Keep entries inside (now - len, now].
    let mut pruned = false;
    while let Some(&(t, cum)) = log.entries.front() {
        if t.saturating_add(len) > now {
            break;
        }
        log.base = cum;
        log.entries.pop_front();
        pruned = true;
    }
    if pruned {
        log.trim();
    }
    // Clamp entries from the future (the clock went backwards): they are the newest ones.
    for e in log.entries.iter_mut().rev() {
        if e.0 <= now {
            break;
        }
        e.0 = now;
    }
    let count = log.total();
    let limit = quota.limit();
    let empties_in = |log: &Log| {
        log.entries
            .back()
            .map_or(0, |&(t, _)| (t + len).saturating_sub(now))
    };
    if limit == 0 || cost > limit {
        let mut d = deny_forever(limit, ()).0;
        d.remaining = limit.saturating_sub(count);
        d.reset_after = empties_in(&log);
        return (d, (!log.is_empty()).then_some(log));
    }
    if count + cost <= limit {
        if cost > 0 {
            // Every entry is at or before `now` (clamped above): the log stays sorted.
            log.push(now, cost);
        }
        let decision = Decision {
            allowed: true,
            limit,
            remaining: limit - count - cost,
            reset_after: empties_in(&log),
            retry_after: None,
            delay: 0,
            count: None,
        };
        (decision, (!log.is_empty()).then_some(log))
    } else {
        // Wait until enough of the oldest entries have left the window: the first entry whose
        // running total covers the excess (`cost <= limit`, so the excess is at most `count`
        // and such an entry exists).
        let target = log.base + (count + cost - limit);
        let at = log
            .entries
            .partition_point(|&(_, cum)| cum < target)
            .min(log.entries.len().saturating_sub(1));
        let retry = log
            .entries
            .get(at)
            .map_or(0, |&(t, _)| (t + len).saturating_sub(now));
        let decision = Decision {
            allowed: false,
            limit,
            remaining: limit.saturating_sub(count),
            reset_after: empties_in(&log),
            retry_after: Some(retry),
            delay: 0,
            count: None,
        };
        (decision, Some(log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Unit;
    use crate::Algorithm;

    fn q(limit: u64) -> Quota {
        Quota::new(limit, Unit::Minute).with_algorithm(Algorithm::SlidingWindowLog)
    }

    #[test]
    fn admissions_at_one_time_share_an_entry() {
        let mut log = None;
        for _ in 0..1_000 {
            let (d, l) = step(log.take(), 5, 1, &q(10_000));
            assert!(d.allowed);
            log = l;
        }
        let l = log.unwrap();
        assert_eq!((l.len(), l.total()), (1, 1_000));
        let l = l.commit(5, 400, &q(10_000)).unwrap();
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![(5, 1_400)]);
    }

    #[test]
    fn retry_is_found_among_many_entries() {
        let mut log = None;
        for t in 0..5_000u64 {
            log = step(log.take(), t, 2, &q(10_000)).1;
        }
        // 10,000 logged, one per microsecond 0..5000: a cost of 7 waits for the 4th entry.
        let (d, _) = step(log, 5_000, 7, &q(10_000));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(3 + 60_000_000 - 5_000));
    }
}
