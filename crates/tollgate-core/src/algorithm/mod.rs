//! The algorithms, each a pure step `(state, now, cost, quota) -> (decision, state)`.
//!
//! A step never reads a clock and never mutates shared data: stores (memory, Redis) own the state
//! and apply a step atomically per key. `None` state means "untracked", which is the same as
//! "full": every step returns `None` when its result is back to that, so stores can drop it.
//! Denied requests never consume (except in [`envoy_fixed_window`], which counts them as
//! envoyproxy/ratelimit does); `cost = 0` is a pure query.
//!
//! Time may step (Redis `TIME` follows the host's wall clock). Each algorithm clamps a state
//! that lies further in the future than a monotonic clock could have left it, keeps the clamped
//! state (a step that writes nothing else still writes that, see [`clamp`]), and so bounds
//! `retry_after`/`reset_after` by its period (times `burst / limit` for GCRA and the buckets,
//! two windows for the sliding window counter). For every state a monotonic clock can reach the
//! clamp is a no-op.
//!
//! The count-min-sketch limiter keeps one shared [`Sketch`] per limit instead of per-key state;
//! its exact per-key counterpart (used by [`step`] and as its reference) is the sliding window
//! counter it approximates.

pub(crate) mod count_min;
pub(crate) mod envoy_fixed_window;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod sliding_counter;
pub(crate) mod sliding_log;
pub(crate) mod tiers;
pub(crate) mod token_bucket;

pub(crate) use count_min::Sketch;
pub(crate) use fixed_window::Window;
pub(crate) use sliding_counter::Counter;
pub(crate) use sliding_log::Log;
pub(crate) use token_bucket::Bucket;

use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};

/// What a step returns: the decision and the state to keep (`None` = untracked/full).
pub(crate) type Outcome<S> = (Decision, Option<S>);

/// A denial that retrying cannot fix, keeping `state` as it is.
pub(crate) fn deny_forever<S>(limit: u64, state: S) -> (Decision, S) {
    let d = Decision {
        allowed: false,
        limit,
        remaining: 0,
        reset_after: 0,
        retry_after: None,
        delay: 0,
        count: None,
    };
    (d, state)
}

/// Per-key state of any algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// GCRA: theoretical arrival time.
    Gcra(Micros),
    /// Leaky bucket: when the queue will be empty.
    Leaky(Micros),
    /// Token bucket.
    Bucket(Bucket),
    /// Fixed window.
    Window(Window),
    /// Sliding window counter (and the exact form of count-min sketch).
    Counter(Counter),
    /// Sliding window log.
    Log(Log),
}

/// `state` clamped as the step at `now` would clamp it (see the module docs), or `None` when the
/// clamp leaves it as it is. Stores write the clamped state even when a request is blocked and
/// writes nothing else: otherwise every retry would find the state as far ahead as before.
pub fn clamp(state: &State, now: Micros, quota: &Quota) -> Option<State> {
    let changed = |a: Micros, b: Micros| (a != b).then_some(b);
    match state {
        State::Gcra(t) => changed(*t, gcra::clamp(*t, now, quota)).map(State::Gcra),
        State::Leaky(t) => changed(*t, gcra::clamp(*t, now, quota)).map(State::Leaky),
        State::Bucket(b) => changed(b.last, token_bucket::clamp(*b, now, quota).last)
            .map(|last| State::Bucket(Bucket { last, ..*b })),
        State::Window(_) if quota.algorithm() == Algorithm::EnvoyFixedWindow => None,
        State::Window(w) => fixed_window::clamp(*w, now, quota).map(State::Window),
        State::Counter(c) => sliding_counter::clamp(*c, now, quota).map(State::Counter),
        State::Log(_) => None,
    }
}

/// One step of `quota.algorithm` for one key. A state of another algorithm's shape (the rule
/// changed algorithm) is treated as untracked.
pub fn step(state: Option<State>, now: Micros, cost: u64, quota: &Quota) -> Outcome<State> {
    use Algorithm as A;
    match quota.algorithm() {
        A::Gcra => {
            let s = match state {
                Some(State::Gcra(t)) => Some(t),
                _ => None,
            };
            let (d, s) = gcra::step(s, now, cost, quota);
            (d, s.map(State::Gcra))
        }
        A::LeakyBucket => {
            let s = match state {
                Some(State::Leaky(t)) => Some(t),
                _ => None,
            };
            let (d, s) = leaky_bucket::step(s, now, cost, quota);
            (d, s.map(State::Leaky))
        }
        A::TokenBucket => {
            let s = match state {
                Some(State::Bucket(b)) => Some(b),
                _ => None,
            };
            let (d, s) = token_bucket::step(s, now, cost, quota);
            (d, s.map(State::Bucket))
        }
        A::FixedWindow => {
            let s = match state {
                Some(State::Window(w)) => Some(w),
                _ => None,
            };
            let (d, s) = fixed_window::step(s, now, cost, quota);
            (d, s.map(State::Window))
        }
        A::EnvoyFixedWindow => {
            let s = match state {
                Some(State::Window(w)) => Some(w),
                _ => None,
            };
            let (d, s) = envoy_fixed_window::step(s, now, cost, quota);
            (d, s.map(State::Window))
        }
        A::SlidingWindowCounter | A::CountMinSketch => {
            let s = match state {
                Some(State::Counter(c)) => Some(c),
                _ => None,
            };
            let (d, s) = sliding_counter::step(s, now, cost, quota);
            (d, s.map(State::Counter))
        }
        A::SlidingWindowLog => {
            let s = match state {
                Some(State::Log(l)) => Some(l),
                _ => None,
            };
            let (d, s) = sliding_log::step(s, now, cost, quota);
            (d, s.map(State::Log))
        }
    }
}

#[cfg(test)]
mod tests;
