//! The answer to one check: a denial is a value, not an error.

use crate::clock::Micros;
use crate::quota::Period;

/// The outcome of checking one counter.
///
/// All durations are in microseconds from the instant of the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// Whether the request may proceed (after `delay`).
    pub allowed: bool,
    /// The limit (requests per period) this decision was made against.
    pub limit: u64,
    /// How many more unit-cost requests would be admitted right now, after this one.
    pub remaining: u64,
    /// Time until the counter is back to full (nothing left to forget).
    pub reset_after: Micros,
    /// Denied: the earliest time the same request could pass. `None` when denied and it can never
    /// pass (cost above capacity, or a limit of 0), and always `None` when allowed.
    pub retry_after: Option<Micros>,
    /// Leaky bucket only: how long an admitted request should wait in the queue.
    pub delay: Micros,
    /// [`crate::Algorithm::EnvoyFixedWindow`] only: the window's count after this step (what
    /// envoyproxy/ratelimit's `INCRBY` returns; after a cost-0 query, the count as it stands).
    /// envoy's statistics split a request's hits at the limit with it. `None` for the other
    /// algorithms.
    pub count: Option<u64>,
}

impl Decision {
    /// The remaining a status reports, as envoyproxy/ratelimit reports it: 0 once the limit is
    /// over (denied, in shadow or quota mode too), else [`Decision::remaining`]. A denied
    /// request consumes nothing (but with envoy_fixed_window), so the counter itself may still
    /// have room for a cheaper request; clients are told there is none left for this one.
    pub fn reported_remaining(&self) -> u64 {
        if self.allowed {
            self.remaining
        } else {
            0
        }
    }

    /// The `duration_until_reset` a status reports: [`Decision::reset_after`], except that a
    /// status over its limit never reports 0. That happens when a request that can never pass
    /// (cost above the limit, or a limit of 0) meets a full counter: there is nothing to reset,
    /// and envoyproxy/ratelimit reports the end of the current window of the limit's `period`,
    /// so this does too (a client must not read 0 as "retry now").
    pub fn reported_reset(&self, period: Period, now: Micros) -> Micros {
        if self.allowed || self.reset_after > 0 {
            return self.reset_after;
        }
        let (_, end) = crate::window::window(period, now);
        end.saturating_sub(now)
    }

    /// Denied, and retrying cannot help (cost above what the limit can ever admit).
    pub fn never_passes(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }
}
