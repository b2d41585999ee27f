//! Property tests of the sliding window log under wall-clock steps: entries later than `now`
//! (the clock went backwards) are clamped to `now`.
//!
//! * with a monotonic clock the clamp never changes a decision (checked against the log as it
//!   was written before the clamp existed);
//! * after arbitrary steps back and forth, `retry_after` and `reset_after` stay within the
//!   period, no logged entry lies after `now`, and stepping back never gives quota back;
//! * under a monotonic clock (also after such steps) no window `(t - period, t]` admits more than
//!   the limit.

mod support;

use proptest::prelude::*;
use support::max_in_rolling_window;
use tollgate_core::clock::SECOND;
use tollgate_core::internals::sliding_log::{step, Log};
use tollgate_core::{Algorithm, Decision, Micros, Period, Quota, Unit};

/// 2026-11-22T00:00:00Z.
const BASE: Micros = 1_795_305_600 * SECOND;

fn quota() -> impl Strategy<Value = Quota> {
    (
        0u64..40,
        prop_oneof![Just(Unit::Second), Just(Unit::Minute), Just(Unit::Hour)],
        1u32..=3,
    )
        .prop_map(|(limit, unit, mult)| {
            Quota::new(limit, Period::new(unit, mult)).with_algorithm(Algorithm::SlidingWindowLog)
        })
}

/// Steps of up to a period (in per-mille, plus µs jitter), forward only or also backwards, and
/// then sometimes by a day or a year either way; costs up to a little above the limit.
fn trace(q: Quota, backwards: bool) -> impl Strategy<Value = Vec<(Micros, u64)>> {
    let unit = (q.period().nominal() / 1_000) as i64;
    let day = (86_400 * SECOND) as i64;
    let dt = if backwards {
        prop_oneof![
            4 => (0i64..1_000).prop_map(move |p| p * unit),
            3 => (-1_000i64..0).prop_map(move |p| p * unit),
            1 => (-400_000i64..400_000).prop_map(move |p| p * unit),
            1 => prop::sample::select(vec![-365 * day, -day, day, 365 * day]),
        ]
        .boxed()
    } else {
        prop_oneof![
            3 => Just(0i64),
            4 => (0i64..1_000).prop_map(move |p| p * unit),
            1 => (0i64..5_000).prop_map(move |p| p * unit),
        ]
        .boxed()
    };
    let limit = q.limit();
    prop::collection::vec(
        (
            dt,
            0i64..3,
            prop_oneof![6 => 0..=limit.min(2), 2 => 0..=limit + 1],
        ),
        1..120,
    )
    .prop_map(move |steps| {
        let mut t = (BASE + 400 * 86_400 * SECOND) as i64;
        steps
            .into_iter()
            .map(|(d, jitter, cost)| {
                t = (t + d + jitter).max(0);
                (t as Micros, cost)
            })
            .collect()
    })
}

/// The step as written before the clamp: future entries kept as they are (inserted in order).
fn unclamped(log: &mut Vec<(Micros, u64)>, now: Micros, cost: u64, q: &Quota) -> Decision {
    let len = q.period().nominal();
    log.retain(|&(t, _)| t + len > now);
    let count: u64 = log.iter().map(|&(_, c)| c).sum();
    let limit = q.limit();
    let empties_in = |log: &Vec<(Micros, u64)>| {
        log.last()
            .map_or(0, |&(t, _)| (t + len).saturating_sub(now))
    };
    let mut d = Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(count),
        reset_after: 0,
        retry_after: None,
        delay: 0,
        count: None,
    };
    if limit == 0 || cost > limit {
        d.reset_after = empties_in(log);
        return d;
    }
    if count + cost <= limit {
        if cost > 0 {
            let at = log.partition_point(|&(t, _)| t <= now);
            log.insert(at, (now, cost));
        }
        d.allowed = true;
        d.remaining = limit - count - cost;
    } else {
        let mut to_free = count + cost - limit;
        for &(t, c) in log.iter() {
            d.retry_after = Some((t + len).saturating_sub(now));
            to_free = to_free.saturating_sub(c);
            if to_free == 0 {
                break;
            }
        }
    }
    d.reset_after = empties_in(log);
    d
}

/// Run the trace; returns each decision with the log after it.
fn run(q: &Quota, trace: &[(Micros, u64)]) -> Vec<(Decision, Option<Log>)> {
    let mut log = None;
    trace
        .iter()
        .map(|&(now, cost)| {
            let (d, next) = step(log.take(), now, cost, q);
            log = next.clone();
            (d, next)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Monotonic clock: identical decisions to the unclamped log, and never more than the
    /// limit in any window.
    #[test]
    fn clamp_changes_nothing_on_a_monotonic_clock((q, trace) in quota().prop_flat_map(|q| (Just(q), trace(q, false)))) {
        let mut reference = Vec::new();
        let ds = run(&q, &trace);
        let mut adm = Vec::new();
        for (&(now, cost), (d, _)) in trace.iter().zip(&ds) {
            prop_assert_eq!(*d, unclamped(&mut reference, now, cost, &q), "at {} cost {}", now, cost);
            if d.allowed && cost > 0 {
                adm.push((now, cost));
            }
        }
        prop_assert!(max_in_rolling_window(&adm, q.period().nominal()) <= q.limit());
    }

    /// Any clock: `retry_after`/`reset_after` within the period, no entry after `now`, and a
    /// step back never frees quota that was in use (a query just before and just after).
    /// Once the clock is monotonic again, no window admits more than the limit.
    #[test]
    fn clock_steps_stay_bounded(
        (q, trace, tail) in quota().prop_flat_map(|q| (Just(q), trace(q, true), trace(q, false)))
    ) {
        let len = q.period().nominal();
        let ds = run(&q, &trace);
        let mut prev: Option<(Micros, Option<Log>)> = None;
        for (&(now, _), (d, log)) in trace.iter().zip(&ds) {
            prop_assert!(d.reset_after <= len, "reset_after {} > period {}: {:?}", d.reset_after, len, d);
            prop_assert!(d.retry_after.is_none_or(|r| r <= len), "retry_after beyond the period: {:?}", d);
            if let Some(l) = log {
                prop_assert!(l.iter().all(|(t, _)| t <= now), "an entry after now: {:?}", l);
            }
            if let Some((before, log_before)) = &prev {
                if now < *before {
                    let used = |log: Option<Log>, at: Micros| {
                        let d = step(log, at, 0, &q).0;
                        q.limit() - d.remaining
                    };
                    prop_assert!(
                        used(log_before.clone(), now) >= used(log_before.clone(), *before),
                        "stepping back from {} to {} gave quota back", before, now
                    );
                }
            }
            prev = Some((now, log.clone()));
        }
        // Monotonic again from the last time on.
        let last = trace.last().map_or(BASE, |&(t, _)| t);
        let start = tail.first().map_or(0, |&(t, _)| t);
        let tail: Vec<(Micros, u64)> = tail.iter().map(|&(t, c)| (t - start + last, c)).collect();
        let mut log = ds.last().and_then(|(_, l)| l.clone());
        let mut adm = Vec::new();
        for &(now, cost) in &tail {
            let (d, next) = step(log.take(), now, cost, &q);
            log = next;
            prop_assert!(d.reset_after <= len && d.retry_after.is_none_or(|r| r <= len));
            if d.allowed && cost > 0 {
                adm.push((now, cost));
            }
        }
        prop_assert!(max_in_rolling_window(&adm, len) <= q.limit());
    }
}

/// A year's step back (the example of the report): the wait is one period, not a year.
#[test]
fn a_year_back_waits_one_period() {
    let q = Quota::new(2, Unit::Minute).with_algorithm(Algorithm::SlidingWindowLog);
    let mut log = None;
    for _ in 0..2 {
        let (d, l) = step(log.take(), BASE, 1, &q);
        assert!(d.allowed);
        log = l;
    }
    let year = 365 * 86_400 * SECOND;
    let (d, _) = step(log, BASE - year, 1, &q);
    assert!(!d.allowed, "a step back re-admitted: {d:?}");
    assert_eq!(d.retry_after, Some(60 * SECOND));
    assert_eq!(d.reset_after, 60 * SECOND);
}
