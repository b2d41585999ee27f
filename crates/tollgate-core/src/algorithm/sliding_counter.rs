//! Sliding window counter: the previous aligned window's count, weighted by how much of it the
//! rolling window still covers, plus the current window's count.
//!
//! A request of cost `c` at fraction `f` of the current window is admitted iff
//! `floor(prev · (1 - f)) + current + c <= limit`. Rounding the weighted part down matches both
//! worked examples of docs/algorithms.md (7/min, 5 previous, 3 current at 1:18: `floor(3.5) + 3 + 1 = 7`,
//! allowed; 40/interval, 50 previous, 5 current at 41 %: `floor(29.5) + 5 + 1 = 35`, allowed).
//! Two counters per key; it assumes the previous window's requests were evenly spread, so over
//! a rolling window it can admit more than `limit` when they were not (see docs/algorithms.md).
//!
//! `decide` is shared with the count-min-sketch limiter, which feeds it estimated counts.
//!
//! Clock steps back are handled as in the fixed window: a state in the next window is decided
//! as at that window's start; one further ahead is clamped to the next window, counts kept
//! ([`clamp`]). `retry_after` and `reset_after` stay within two windows (the most a monotonic
//! clock gives too: the current window's count decays over the next one).

use super::{deny_forever, Outcome};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Period, Quota};
use crate::window::{previous_start, window};

/// Sliding window counter state: counts of the window starting at `start` and of the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// Start of the current window.
    pub start: Micros,
    /// Cost admitted in the previous window.
    pub prev: u64,
    /// Cost admitted in the current window.
    pub cur: u64,
}

/// `c` with a start beyond the window after `now`'s clamped to that next window; `None` when it
/// is not that far ahead.
pub(crate) fn clamp(c: Counter, now: Micros, quota: &Quota) -> Option<Counter> {
    if c.start <= now {
        return None;
    }
    let next = window(quota.period(), now).1;
    (c.start > next).then_some(Counter { start: next, ..c })
}

/// The counts as seen from `now`: windows rolled forward, and, if the clock went backwards, the
/// start clamped to the next window and the instant clamped forward to it. Returns (now, window
/// start, window end, prev, cur).
pub(crate) fn roll(
    period: Period,
    start: Option<Micros>,
    prev: u64,
    cur: u64,
    now: Micros,
) -> (Micros, Micros, Micros, u64, u64) {
    let (ws, we) = window(period, now);
    match start {
        Some(s) if s == ws => (now, ws, we, prev, cur),
        Some(s) if s > ws => {
            let s = s.min(we);
            let (ws, we) = window(period, s);
            (s, ws, we, prev, cur)
        }
        Some(s) if s == previous_start(period, ws) => (now, ws, we, cur, 0),
        _ => (now, ws, we, 0, 0),
    }
}

/// floor(prev × (end - now) / (end - start)), exactly.
pub(crate) fn weighted(prev: u64, now: Micros, start: Micros, end: Micros) -> u64 {
    let len = (end - start).max(1);
    (u128::from(prev) * u128::from(end.saturating_sub(now)) / u128::from(len)) as u64
}

/// Earliest instant in `[start, end)` at which `floor(prev·(end-t)/len) <= k`.
fn earliest_within(prev: u64, k: u64, start: Micros, end: Micros) -> Micros {
    if prev <= k {
        return start;
    }
    let len = u128::from(end - start);
    // floor(prev·r/len) <= k  <=>  prev·r < (k+1)·len  <=>  r <= ceil((k+1)·len/prev) - 1
    let r = ((u128::from(k) + 1) * len).div_ceil(u128::from(prev)) - 1;
    end - (r as u64).min(end - start)
}

/// The decision for `cost` given the rolled counts. Does not update anything.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide(
    period: Period,
    limit: u64,
    now: Micros,
    start: Micros,
    end: Micros,
    prev: u64,
    cur: u64,
    cost: u64,
) -> Decision {
    let estimate = weighted(prev, now, start, end) + cur;
    let next_end = window(period, end).1;
    let reset_after = |cur: u64| {
        if cur > 0 {
            next_end - now
        } else if prev > 0 {
            end - now
        } else {
            0
        }
    };
    if limit == 0 || cost > limit {
        let mut d = deny_forever(limit, ()).0;
        d.remaining = limit.saturating_sub(estimate);
        d.reset_after = reset_after(cur);
        return d;
    }
    if estimate + cost <= limit {
        return Decision {
            allowed: true,
            limit,
            remaining: limit - estimate - cost,
            reset_after: reset_after(cur + cost),
            retry_after: None,
            delay: 0,
            count: None,
        };
    }
    let retry_at = if cur + cost <= limit {
        earliest_within(prev, limit - cur - cost, start, end)
    } else {
        // Next window: today's count becomes the weighted "previous" one.
        earliest_within(cur, limit - cost, end, next_end)
    };
    Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(estimate),
        reset_after: reset_after(cur),
        retry_after: Some(retry_at.saturating_sub(now).max(1)),
        delay: 0,
        count: None,
    }
}

/// One step. `state` is `None` when nothing is counted.
pub(crate) fn step(
    state: Option<Counter>,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> Outcome<Counter> {
    let (s, p, c) = state.map_or((None, 0, 0), |st| (Some(st.start), st.prev, st.cur));
    let (now, start, end, prev, cur) = roll(quota.period(), s, p, c, now);
    let decision = decide(
        quota.period(),
        quota.limit(),
        now,
        start,
        end,
        prev,
        cur,
        cost,
    );
    let cur = if decision.allowed { cur + cost } else { cur };
    let next = (prev > 0 || cur > 0).then_some(Counter { start, prev, cur });
    (decision, next)
}
