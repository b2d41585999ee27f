//! envoyproxy/ratelimit's fixed window, so that a tollgate and an envoyproxy/ratelimit instance
//! decide alike (and, on Redis with the envoy key layout, share their counters).
//!
//! It differs from [`super::fixed_window`] in three ways, each envoy's:
//!
//! - **Windows** are `now / len * len` on whole Unix seconds, with fixed lengths: a second, 60,
//!   3 600, 86 400, 604 800 (a week, from Thursday 1970-01-01), 2 592 000 (a "month" of 30 days)
//!   and 31 536 000 (a "year" of 365 days) seconds, times the rule's `unit_multiplier`. No
//!   calendar: envoy's MONTH does not reset on the 1st.
//! - **Denied hits count.** The counter is incremented by the cost first and compared after
//!   (envoy's `INCRBY`, then "over the limit when the new value is above it"), so a denied step
//!   keeps the incremented state; retrying while over the limit keeps it over. Whether the
//!   *allowed* items of a request that another item denies count too is the store's business
//!   ([`crate::store::CheckItem::count_denied`]).
//! - **`reset_after`** is envoy's `duration_until_reset`, whatever the count: the end of the
//!   window minus `now` in whole seconds (`divider - now % divider`, so up to a second more
//!   than the exact time left), and `remaining` is 0 when denied. `retry_after` is exact.
//!
//! A state of another window is not this window's count: it is dropped, as envoy's per-window
//! Redis keys are never read again. A clock that goes back by a window therefore starts that
//! window from zero (envoy's pods would read the older key); nothing needs clamping.

use super::Outcome;
use crate::clock::{Micros, SECOND};
use crate::decision::Decision;
use crate::quota::{Period, Quota, Unit};

use super::fixed_window::Window;

/// envoyproxy/ratelimit's window length of a unit in seconds (its `UnitToDivider`).
pub(crate) const fn divider(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        Unit::Week => 604_800,
        Unit::Month => 2_592_000,
        Unit::Year => 31_536_000,
    }
}

/// Window length of `period` in seconds: its unit's divider times its multiplier.
pub fn window_secs(period: Period) -> u64 {
    divider(period.unit).saturating_mul(u64::from(period.multiplier.max(1)))
}

/// The window `[start, end)` containing `now`: envoy's `now / divider * divider` on whole
/// seconds (a window boundary is always a whole second, so this is the same on microseconds).
pub fn window(period: Period, now: Micros) -> (Micros, Micros) {
    let len = window_secs(period) * SECOND;
    let start = now - now % len;
    (start, start + len)
}

/// One step. `state` is `None` when nothing is counted.
pub(crate) fn step(
    state: Option<Window>,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> Outcome<Window> {
    let (start, end) = window(quota.period(), now);
    let before = match state {
        Some(w) if w.start == start => w.count,
        _ => 0,
    };
    let after = before.saturating_add(cost);
    let limit = quota.limit();
    let allowed = after <= limit;
    let decision = Decision {
        allowed,
        limit,
        remaining: if allowed { limit - after } else { 0 },
        reset_after: end - (now - now % SECOND),
        // A cost above the limit never passes; any other denial passes in the next window.
        retry_after: (!allowed && cost <= limit).then_some(end - now),
        delay: 0,
        count: Some(after),
    };
    let next = (after > 0).then_some(Window {
        start,
        count: after,
    });
    (decision, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Algorithm;

    fn q(limit: u64, unit: Unit) -> Quota {
        Quota::new(limit, unit).with_algorithm(Algorithm::EnvoyFixedWindow)
    }

    #[test]
    fn dividers_are_envoys() {
        let secs: Vec<u64> = Unit::ALL.iter().map(|&u| divider(u)).collect();
        assert_eq!(secs, [1, 60, 3_600, 86_400, 604_800, 2_592_000, 31_536_000]);
        assert_eq!(window_secs(Period::new(Unit::Minute, 15)), 900);
    }

    #[test]
    fn windows_are_epoch_aligned_like_envoy_cache_keys() {
        // envoyproxy/ratelimit's own cache-key examples: now = 1234 s and 1 000 000 s.
        let at = |s: u64| s * SECOND;
        assert_eq!(window(Unit::Second.into(), at(1234)).0, at(1234));
        assert_eq!(window(Unit::Minute.into(), at(1234)).0, at(1200));
        assert_eq!(window(Unit::Hour.into(), at(1_000_000)).0, at(997_200));
        assert_eq!(window(Unit::Day.into(), at(1_000_000)).0, at(950_400));
        assert_eq!(
            window(Unit::Month.into(), at(100_000_000)).0,
            at(98_496_000)
        );
        assert_eq!(window(Unit::Year.into(), at(100_000_000)).0, at(94_608_000));
    }

    #[test]
    fn reset_is_envoys_duration_until_reset() {
        // envoy: divider - now % divider, on whole seconds.
        for (unit, now_s) in [
            (Unit::Minute, 1234),
            (Unit::Hour, 1_000_000),
            (Unit::Week, 7),
        ] {
            let d = step(None, now_s * SECOND, 0, &q(10, unit)).0;
            let sec = divider(unit);
            assert_eq!(d.reset_after, (sec - now_s % sec) * SECOND);
        }
    }

    #[test]
    fn denied_hits_count() {
        let quota = q(2, Unit::Minute);
        let now = 60 * SECOND;
        let (d, s) = step(None, now, 1, &quota);
        assert!(d.allowed && d.remaining == 1);
        let (d, s) = step(s, now, 1, &quota);
        assert!(d.allowed && d.remaining == 0);
        let (d, s) = step(s, now, 1, &quota);
        assert!(!d.allowed && d.remaining == 0);
        assert_eq!(s.unwrap().count, 3, "a denied hit is counted");
        assert_eq!(d.retry_after, Some(60 * SECOND));
        // A cost that fits the limit is still denied: the counter is over it.
        let (d, s) = step(s, now + SECOND, 0, &quota);
        assert!(!d.allowed);
        // The next window starts from zero.
        let (d, _) = step(s, 120 * SECOND, 1, &quota);
        assert!(d.allowed && d.remaining == 1);
    }

    proptest::proptest! {
        /// Every window contains `now`, starts on a whole multiple of its length in seconds
        /// (envoy's `now / divider * divider`), and `reset_after` is envoy's
        /// `divider - now % divider` (exactly, on whole seconds).
        #[test]
        fn alignment_and_reset_are_envoys(
            secs in 0u64..4_000_000_000,
            frac in 0u64..SECOND,
            unit in proptest::sample::select(Unit::ALL.to_vec()),
            mult in 1u32..5,
        ) {
            let period = Period::new(unit, mult);
            let len = window_secs(period);
            let now = secs * SECOND + frac;
            let (start, end) = window(period, now);
            proptest::prop_assert!(start <= now && now < end);
            proptest::prop_assert_eq!(start, secs / len * len * SECOND);
            proptest::prop_assert_eq!(end - start, len * SECOND);
            let q = Quota::new(3, period).with_algorithm(Algorithm::EnvoyFixedWindow);
            let d = step(None, secs * SECOND, 1, &q).0;
            proptest::prop_assert_eq!(d.reset_after, (len - secs % len) * SECOND);
            // Whole seconds, as envoy computes it, at any fraction of a second.
            let d = step(None, now, 1, &q).0;
            proptest::prop_assert_eq!(d.reset_after, (len - secs % len) * SECOND);
        }
    }

    #[test]
    fn cost_above_limit_never_passes_but_counts() {
        let (d, s) = step(None, 0, 5, &q(3, Unit::Second));
        assert!(d.never_passes());
        assert_eq!(s.unwrap().count, 5);
    }
}
