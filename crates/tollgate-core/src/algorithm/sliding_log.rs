//! Sliding window log: the timestamps (with cost) of admitted requests.
//!
//! Exact: at most `limit` is admitted in any window `(t - period, t]`. Memory grows with the
//! limit (one entry per admitted request still in the window), so it suits small limits such as
//! logins per minute. Denied requests are not logged (seed 001's variant logs them too, which
//! lets a client that keeps retrying lock itself out forever).
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

/// Admitted requests still inside the window, oldest first: (time, cost).
pub type Log = VecDeque<(Micros, u64)>;

/// One step. `log` is `None` when nothing is logged. Returns the log to keep (`None` if empty).
pub fn step(log: Option<Log>, now: Micros, cost: u64, quota: &Quota) -> Outcome<Log> {
    let len = quota.period().nominal();
    let mut log = log.unwrap_or_default();
    // Keep entries inside (now - len, now].
    while log
        .front()
        .is_some_and(|&(t, _)| t.saturating_add(len) <= now)
    {
        log.pop_front();
    }
    // Clamp entries from the future (the clock went backwards): they are the newest ones.
    for e in log.iter_mut().rev() {
        if e.0 <= now {
            break;
        }
        e.0 = now;
    }
    let count: u64 = log.iter().map(|&(_, c)| c).sum();
    let limit = quota.limit();
    let empties_in = |log: &Log| {
        log.back()
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
            log.push_back((now, cost));
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
        // Wait until enough of the oldest entries have left the window.
        let mut to_free = count + cost - limit;
        let mut retry = 0;
        for &(t, c) in &log {
            retry = (t + len).saturating_sub(now);
            to_free = to_free.saturating_sub(c);
            if to_free == 0 {
                break;
            }
        }
        let decision = Decision {
            allowed: false,
            limit,
            remaining: limit - count,
            reset_after: empties_in(&log),
            retry_after: Some(retry),
            delay: 0,
            count: None,
        };
        (decision, Some(log))
    }
}
