//! Leaky bucket as a queue (the form nginx `limit_req` uses without `nodelay`).
//!
//! A queue of capacity `burst` (default `limit`) drains one request every `T = period / limit`.
//! State is `free_at`, when the queue will be empty. A request of cost `c` fits iff the queue's
//! backlog plus `c·T` is at most `burst·T`; it is then admitted with `delay` = the time it waits
//! behind the requests already queued, so the caller releases work at a steady rate. One that
//! does not fit is denied and consumes nothing.

use super::{deny_forever, Outcome};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Quota;

/// One step. `free_at` is `None` when the queue is empty.
pub fn step(free_at: Option<Micros>, now: Micros, cost: u64, quota: &Quota) -> Outcome<Micros> {
    let Some(t) = quota.emission_interval() else {
        return deny_forever(0, free_at);
    };
    let burst = quota.capacity().max(1);
    let cap = t.saturating_mul(burst);
    let base = free_at.unwrap_or(now).max(now);
    let backlog = base - now;
    let remaining_before = cap.saturating_sub(backlog) / t;
    if cost > burst {
        let mut d = deny_forever(quota.limit, free_at).0;
        d.remaining = remaining_before;
        d.reset_after = backlog;
        return (d, free_at);
    }
    let new_free = base.saturating_add(cost * t);
    let new_backlog = new_free - now;
    if new_backlog <= cap {
        let decision = Decision {
            allowed: true,
            limit: quota.limit,
            remaining: (cap - new_backlog) / t,
            reset_after: new_backlog,
            retry_after: None,
            // A pure query (cost 0) waits for nothing.
            delay: if cost == 0 { 0 } else { backlog },
        };
        (decision, (new_free > now).then_some(new_free))
    } else {
        let decision = Decision {
            allowed: false,
            limit: quota.limit,
            remaining: remaining_before,
            reset_after: backlog,
            retry_after: Some(new_backlog - cap),
            delay: 0,
        };
        (decision, free_at)
    }
}
