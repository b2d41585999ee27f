//! Fixed window counter: one counter per aligned window (see [`crate::window`]).
//!
//! Cheapest and easiest to explain ("100 per calendar day, resets at midnight UTC"), but a client
//! can get `2 × limit` through in one rolling period by straddling a boundary.
//!
//! A state whose window is later than `now`'s means the clock went back: by less than a window
//! (or a concurrent caller read the clock after this one but counted first, across a boundary),
//! the state's window is the next one and the check is made in it, as at its start (nothing
//! counted is lost; durations are reported from there). A window further ahead is out of reach
//! of a monotonic clock: it is clamped to the next window ([`clamp`]), count kept, and that is
//! kept. So `retry_after` and `reset_after` never exceed one window, and a client is held for at
//! most two windows, not for the size of the step.

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

/// `w` with a start beyond the window after `now`'s clamped to that next window (see the
/// module docs); `None` when it is not that far ahead.
pub(crate) fn clamp(w: Window, now: Micros, quota: &Quota) -> Option<Window> {
    if w.start <= now {
        return None;
    }
    let next = window(quota.period(), now).1;
    (w.start > next).then_some(Window { start: next, ..w })
}

/// One step. `state` is `None` when nothing is counted.
pub(crate) fn step(
    mut state: Option<Window>,
    mut now: Micros,
    cost: u64,
    quota: &Quota,
) -> Outcome<Window> {
    let (mut start, mut end) = window(quota.period(), now);
    let mut count = 0;
    if let Some(w) = &mut state {
        if w.start == start {
            count = w.count;
        } else if w.start > start {
            // The clock went back: count in the state's window (clamped to the next one), as
            // at its start. See the module docs.
            w.start = w.start.min(end);
            now = w.start;
            (start, end) = window(quota.period(), now);
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
            count: None,
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
            count: None,
        };
        (decision, state)
    }
}
