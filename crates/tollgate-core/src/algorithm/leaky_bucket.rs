//! Leaky bucket as a queue (the form nginx `limit_req` uses without `nodelay`).
//!
//! A queue of capacity `burst` (default `limit`) drains one request every `T = period / limit`.
//! State is `free_at`, when the queue will be empty. A request of cost `c` fits iff the queue's
//! backlog plus `c·T` is at most `burst·T`; it is then admitted with `delay` = the time it waits
//! behind the requests already queued, so the caller releases work at a steady rate. One that
//! does not fit is denied and consumes nothing.
//!
//! Admission is therefore exactly GCRA's (`free_at` is GCRA's theoretical arrival time); what the
//! queue adds is the `delay`. So this is GCRA's step plus that one field, not a second copy of it.

use super::{gcra, Outcome};
use crate::clock::Micros;
use crate::quota::Quota;

/// One step. `free_at` is `None` when the queue is empty.
#[inline]
pub(crate) fn step(
    free_at: Option<Micros>,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> Outcome<Micros> {
    let (mut decision, next) = gcra::step(free_at, now, cost, quota);
    if decision.allowed && cost > 0 {
        // A pure query (cost 0) waits for nothing.
        decision.delay = free_at.map_or(0, |f| gcra::clamp(f, now, quota).saturating_sub(now));
    }
    (decision, next)
}
