//! Fixed window counter: one counter per aligned window (see [`crate::window`]).
//!
//! Cheapest and easiest to explain ("100 per calendar day, resets at midnight UTC"), but a client
//! can get `2 × limit` through in one rolling period by straddling a boundary.

use super::{deny_forever, Outcome};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Quota;
use crate::window::window;

/// Fixed window state: `count` admitted in the window starting at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Start of the window.
    pub start: Micros,
    /// Cost admitted in it.
    pub count: u64,
}

/// One step. `state` is `None` when nothing is counted.
pub fn step(state: Option<Window>, now: Micros, cost: u64, quota: &Quota) -> Outcome<Window> {
    let (mut start, mut end) = window(quota.period(), now);
    let mut count = 0;
    if let Some(w) = state {
        if w.start == start {
            count = w.count;
        } else if w.start > start {
            // The clock went backwards: stay in the window we already counted.
            (start, end) = window(quota.period(), w.start);
            count = w.count;
        }
    }
    let limit = quota.limit();
    let reset_after = if count > 0 {
        end.saturating_sub(now)
    } else {
        0
    };
    if limit == 0 || cost > limit {
        let mut d = deny_forever(limit, state).0;
        d.remaining = limit - count.min(limit);
        d.reset_after = reset_after;
        return (d, state);
    }
    if count + cost <= limit {
        count += cost;
        let decision = Decision {
            allowed: true,
            limit,
            remaining: limit - count,
            reset_after: if count > 0 { end - now.min(end) } else { 0 },
            retry_after: None,
            delay: 0,
        };
        (decision, (count > 0).then_some(Window { start, count }))
    } else {
        let decision = Decision {
            allowed: false,
            limit,
            remaining: limit - count,
            reset_after,
            retry_after: Some(end.saturating_sub(now)),
            delay: 0,
        };
        (decision, state)
    }
}
