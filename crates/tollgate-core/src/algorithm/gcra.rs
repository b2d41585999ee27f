//! GCRA (generic cell rate algorithm), the virtual-scheduling form.
//!
//! State is one timestamp, the theoretical arrival time `tat`. With emission interval
//! `T = period / limit` and capacity `burst` (default `limit`), a request of cost `c` is admitted
//! iff `max(tat, now) + c·T - now <= burst·T`. This is the algorithm `governor` and redis-cell use;
//! it admits exactly what a token bucket of `burst` tokens refilled every `T` would.
//!
//! A monotonic clock never leaves `tat` more than `burst·T` ahead of `now` (an admitted request
//! sets at most that much backlog). A `tat` further ahead means the clock stepped back (or the
//! state is corrupt): it is clamped to `now + burst·T` ([`clamp`], "as used as possible"), and the
//! clamped value is kept, so a client is denied for at most `burst·T` instead of for the size of
//! the step, and `retry_after`/`reset_after` never exceed `burst·T`.

use super::{deny_forever, Outcome};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Quota;

/// `tat` clamped to the furthest a monotonic clock can leave it: `now + burst·T`.
pub(crate) fn clamp(tat: Micros, now: Micros, quota: &Quota) -> Micros {
    match quota.emission_interval() {
        Some(t) => tat.min(now.saturating_add(t.saturating_mul(quota.capacity().max(1)))),
        None => tat,
    }
}

/// One step. `tat` is `None` when the key is untracked (full).
#[inline]
pub(crate) fn step(tat: Option<Micros>, now: Micros, cost: u64, quota: &Quota) -> Outcome<Micros> {
    let Some(t) = quota.emission_interval() else {
        return deny_forever(0, tat);
    };
    let burst = quota.capacity().max(1);
    let cap = t.saturating_mul(burst);
    // See the module docs: a no-op unless the clock went back.
    let tat = tat.map(|x| x.min(now.saturating_add(cap)));
    let base = tat.unwrap_or(now).max(now);
    let backlog = base - now;
    // Only the denials need this (a division: computed in their branches, not up front). Most
    // denials leave less than one unit of room (always, for cost 1): 0 without dividing.
    let remaining_before = || {
        let room = cap.saturating_sub(backlog);
        if room < t {
            0
        } else {
            room / t
        }
    };
    if cost > burst {
        let mut d = deny_forever(quota.limit(), tat).0;
        d.remaining = remaining_before();
        d.reset_after = backlog;
        return (d, tat);
    }
    let new_tat = base.saturating_add(cost.saturating_mul(t));
    let new_backlog = new_tat - now;
    if new_backlog <= cap {
        let decision = Decision {
            allowed: true,
            limit: quota.limit(),
            remaining: (cap - new_backlog) / t,
            reset_after: new_backlog,
            retry_after: None,
            delay: 0,
            count: None,
        };
        (decision, (new_tat > now).then_some(new_tat))
    } else {
        let decision = Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: remaining_before(),
            reset_after: backlog,
            retry_after: Some(new_backlog - cap),
            delay: 0,
            count: None,
        };
        (decision, tat)
    }
}
