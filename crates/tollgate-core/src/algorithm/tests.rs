//! Unit tests of the algorithm steps: the worked examples of docs/algorithms.md and exact sequences.

use super::*;
use crate::clock::SECOND;
use crate::quota::{Period, Unit};

/// 2026-11-22T00:00:00Z (a Sunday), aligned to a minute, hour and day.
const BASE: Micros = 1_795_305_600 * SECOND;
const MIN: Micros = 60 * SECOND;
/// 2026-11-23T00:00:00Z.
const NEXT_DAY: Micros = 1_795_392_000 * SECOND;
/// 2026-12-01T00:00:00Z.
const DEC_1: Micros = 1_796_083_200 * SECOND;
const YEAR: Micros = 365 * 86_400 * SECOND;

/// The exact (per-key) algorithms, i.e. all but the count-min sketch.
const EXACT: [Algorithm; 6] = [
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::Gcra,
];

/// A key's state threaded through successive steps.
struct Key {
    quota: Quota,
    state: Option<State>,
}

impl Key {
    fn new(quota: Quota) -> Self {
        Self { quota, state: None }
    }
    fn with(limit: u64, period: impl Into<Period>, alg: Algorithm) -> Self {
        Self::new(Quota::new(limit, period).with_algorithm(alg))
    }
    fn hit(&mut self, now: Micros, cost: u64) -> Decision {
        let (d, s) = step(self.state.take(), now, cost, &self.quota);
        self.state = s;
        d
    }
    /// A step whose result is thrown away (what `now + r` would say without committing).
    fn peek(&self, now: Micros, cost: u64) -> Decision {
        step(self.state.clone(), now, cost, &self.quota).0
    }
}

fn counter(start: Micros, prev: u64, cur: u64) -> Option<State> {
    Some(State::Counter(Counter { start, prev, cur }))
}

#[test]
fn epoch_base_is_2026_11_22_utc_midnight() {
    let (y, m, d) = crate::window::civil_from_days((BASE / (86_400 * SECOND)) as i64);
    assert_eq!((y, m, d), (2026, 11, 22));
    assert_eq!(BASE % (86_400 * SECOND), 0);
    assert_eq!(NEXT_DAY - BASE, 86_400 * SECOND);
    let (y, m, d) = crate::window::civil_from_days((DEC_1 / (86_400 * SECOND)) as i64);
    assert_eq!((y, m, d), (2026, 12, 1));
}

#[test]
fn emission_interval_rounds_up() {
    assert_eq!(
        Quota::new(3, Unit::Second).emission_interval(),
        Some(333_334)
    );
    assert_eq!(
        Quota::new(3, Unit::Minute).emission_interval(),
        Some(20 * SECOND)
    );
    assert_eq!(
        Quota::new(7, Unit::Minute).emission_interval(),
        Some(8_571_429)
    );
    // Never 0, even above a million per second.
    assert_eq!(
        Quota::new(5_000_000, Unit::Second).emission_interval(),
        Some(1)
    );
    assert_eq!(Quota::new(0, Unit::Second).emission_interval(), None);
}

// ---------------------------------------------------------------------------------------------
// Seeds' worked examples.
// ---------------------------------------------------------------------------------------------

/// Seed: 7/min, 5 requests in the previous minute, 3 in the current one, a request at 1:18 is
/// allowed: floor(5 × 0.7) + 3 + 1 = 7 <= 7.
#[test]
fn seed_sliding_counter_7_per_minute_at_1_18() {
    let q = Quota::new(7, Unit::Minute).with_algorithm(Algorithm::SlidingWindowCounter);
    let at = BASE + MIN + 18 * SECOND;
    // Built from real steps: 5 at 0:30, 3 at 1:05.
    let mut k = Key::new(q);
    for _ in 0..5 {
        assert!(k.hit(BASE + 30 * SECOND, 1).allowed);
    }
    for _ in 0..3 {
        assert!(k.hit(BASE + MIN + 5 * SECOND, 1).allowed);
    }
    assert_eq!(k.state, counter(BASE + MIN, 5, 3));
    let d = k.hit(at, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, None);
    // Current window has counts: full again at the end of the next window.
    assert_eq!(d.reset_after, 2 * MIN - 18 * SECOND);
    // The next one is over the limit: floor(3.5) + 4 + 1 = 8 > 7.
    let d = k.hit(at, 1);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    // floor(5 × r / 60 s) <= 2 first holds when r < 36 s, i.e. 1 µs after 1:24.
    assert_eq!(d.retry_after, Some(6 * SECOND + 1));
    assert!(!k.peek(BASE + MIN + 24 * SECOND, 1).allowed);
    let d = k.hit(BASE + MIN + 24 * SECOND + 1, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
}

/// Seed: 40 per interval, 50 in the previous interval, 5 in the current one, at 41 % of it:
/// floor(0.59 × 50) + 5 + 1 = 35 <= 40, allowed; then exactly 5 more.
#[test]
fn seed_sliding_counter_40_per_interval_at_41_percent() {
    let q = Quota::new(40, Unit::Minute).with_algorithm(Algorithm::SlidingWindowCounter);
    let start = BASE + 10 * MIN;
    // 41 % of a minute is 24.6 s. (50 in the previous window: the limit was higher then.)
    let at = start + 24_600_000;
    let mut k = Key::new(q);
    k.state = counter(start, 50, 5);
    for expected in [5, 4, 3, 2, 1, 0] {
        let d = k.hit(at, 1);
        assert!(d.allowed, "remaining {expected}");
        assert_eq!(d.remaining, expected);
    }
    let d = k.hit(at, 1);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    // floor(50 r / 60 s) <= 28 first holds when r < 34.8 s, i.e. 1 µs after 25.2 s.
    assert_eq!(d.retry_after, Some(600_000 + 1));
    assert_eq!(k.state, counter(start, 50, 11));
}

/// Seed: a fixed window admits 2 × limit within one rolling minute by straddling a boundary.
#[test]
fn seed_fixed_window_boundary_burst() {
    let mut k = Key::with(5, Unit::Minute, Algorithm::FixedWindow);
    let before = BASE + 59 * SECOND + 500_000; // 0:59.5
    let after = BASE + MIN; // 1:00.0
    for expected in (0..5).rev() {
        let d = k.hit(before, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, expected);
        assert_eq!(d.reset_after, 500_000);
    }
    let d = k.hit(before, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(500_000));
    for expected in (0..5).rev() {
        let d = k.hit(after, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, expected);
    }
    // 10 admitted within half a second: twice the limit in one rolling minute.
    let d = k.hit(after, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(MIN));
}

/// Seed: sliding log at 2/min: 0:01 and 0:15 allowed, 0:55 denied (retry after 6 s, when 0:01
/// leaves the window), 1:27 allowed.
#[test]
fn seed_sliding_log_2_per_minute() {
    let mut k = Key::with(2, Unit::Minute, Algorithm::SlidingWindowLog);
    let d = k.hit(BASE + SECOND, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
    let d = k.hit(BASE + 15 * SECOND, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.reset_after, MIN);
    let d = k.hit(BASE + 55 * SECOND, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(6 * SECOND));
    assert_eq!(d.reset_after, 20 * SECOND);
    assert!(!k.peek(BASE + 61 * SECOND - 1, 1).allowed);
    assert!(k.peek(BASE + 61 * SECOND, 1).allowed);
    let d = k.hit(BASE + MIN + 27 * SECOND, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1, "0:01 and 0:15 have both left the window");
}

// ---------------------------------------------------------------------------------------------
// Exact sequences: 3/min, three admitted at the same instant, then the 4th denied.
// ---------------------------------------------------------------------------------------------

/// The retry_after each algorithm gives the 4th request of a 3/min burst at BASE + 10 s.
fn expected_retry(alg: Algorithm) -> Micros {
    match alg {
        // One token (one emission interval, 20 s) away.
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => 20 * SECOND,
        // The window ends at 1:00.
        Algorithm::FixedWindow | Algorithm::EnvoyFixedWindow => 50 * SECOND,
        // The oldest entry leaves the window 60 s after it was logged.
        Algorithm::SlidingWindowLog => MIN,
        // Next window, the 3 weigh floor(3 × r / 60 s) <= 2 once r < 60 s: 1 µs after 1:00.
        Algorithm::SlidingWindowCounter | Algorithm::CountMinSketch => 50 * SECOND + 1,
    }
}

#[test]
fn three_per_minute_exact_sequences() {
    let now = BASE + 10 * SECOND;
    for alg in EXACT {
        let mut k = Key::with(3, Unit::Minute, alg);
        for expected in [2, 1, 0] {
            let d = k.hit(now, 1);
            assert!(d.allowed, "{alg}");
            assert_eq!(d.remaining, expected, "{alg}");
            assert_eq!(d.retry_after, None, "{alg}");
            assert_eq!(d.limit, 3, "{alg}");
        }
        let state = k.state.clone();
        let d = k.hit(now, 1);
        assert!(!d.allowed, "{alg}");
        assert_eq!(d.remaining, 0, "{alg}");
        let r = expected_retry(alg);
        assert_eq!(d.retry_after, Some(r), "{alg}");
        assert_eq!(k.state, state, "{alg}: a denial consumes nothing");
        assert!(!k.peek(now + r - 1, 1).allowed, "{alg}: 1 µs early");
        assert!(k.peek(now + r, 1).allowed, "{alg}: at retry_after");
    }
}

#[test]
fn count_min_sketch_sequence_matches_exact_counter() {
    let q = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::CountMinSketch);
    let mut sk = Sketch::new(q.sketch());
    let now = BASE + 10 * SECOND;
    for expected in [2, 1, 0] {
        let d = sk.check(42, now, 1, &q);
        assert!(d.allowed);
        assert_eq!(d.remaining, expected);
    }
    let d = sk.check(42, now, 1, &q);
    assert!(!d.allowed);
    assert_eq!(
        d.retry_after,
        Some(expected_retry(Algorithm::CountMinSketch))
    );
    // Another key is not affected (no collision in a 2048 × 4 sketch for two keys... in all
    // likelihood; the hash values are fixed here, so this is deterministic).
    assert!(sk.check(7 << 64 | 7, now, 3, &q).allowed);
    // `step` with CountMinSketch is the exact sliding counter.
    let mut k = Key::new(q);
    for _ in 0..3 {
        assert!(k.hit(now, 1).allowed);
    }
    assert_eq!(k.hit(now, 1).retry_after, Some(50 * SECOND + 1));
}

#[test]
fn leaky_bucket_delays_grow_by_the_emission_interval() {
    let mut k = Key::with(3, Unit::Minute, Algorithm::LeakyBucket);
    let now = BASE;
    let t = 20 * SECOND;
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let d = k.hit(now, 1);
        assert!(d.allowed);
        assert_eq!(d.delay, i as u64 * t, "request {i}");
        assert_eq!(d.remaining, remaining);
        assert_eq!(d.reset_after, (i as u64 + 1) * t);
    }
    let d = k.hit(now, 1);
    assert!(!d.allowed);
    assert_eq!(d.delay, 0);
    assert_eq!(d.retry_after, Some(t));
    // Half an interval later the queue still holds 2.5 requests' worth: a query waits for nothing.
    let d = k.hit(now + t / 2, 0);
    assert!(d.allowed);
    assert_eq!(d.delay, 0);
    // One interval later there is room again, and it waits behind the two still queued.
    let d = k.hit(now + t, 1);
    assert!(d.allowed);
    assert_eq!(d.delay, 2 * t);
    // Cost 2 waits behind the whole queue and takes two slots.
    let mut k = Key::with(3, Unit::Minute, Algorithm::LeakyBucket);
    assert_eq!(k.hit(now, 2).delay, 0);
    let d = k.hit(now, 1);
    assert_eq!((d.allowed, d.delay), (true, 2 * t));
}

#[test]
fn token_bucket_keeps_fractional_refill() {
    let mut k = Key::with(3, Unit::Minute, Algorithm::TokenBucket);
    let t = 20 * SECOND;
    for _ in 0..3 {
        assert!(k.hit(BASE, 1).allowed);
    }
    // 1.5 intervals: one token, half a token of progress kept.
    let d = k.hit(BASE + 3 * t / 2, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(
        k.state,
        Some(State::Bucket(Bucket {
            tokens: 0,
            last: BASE + t
        }))
    );
    // Half an interval later the kept half completes a token.
    let d = k.hit(BASE + 2 * t - 1, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(1));
    assert!(k.hit(BASE + 2 * t, 1).allowed);
    // A full bucket is dropped (untracked = full).
    assert!(k.hit(BASE + 10 * t, 0).allowed);
    assert_eq!(k.state, None);
}

#[test]
fn gcra_burst_5_at_1_per_second() {
    let q = Quota::new(1, Unit::Second)
        .with_algorithm(Algorithm::Gcra)
        .with_burst(5);
    let mut k = Key::new(q);
    for expected in [4, 3, 2, 1, 0] {
        let d = k.hit(BASE, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, expected);
    }
    assert_eq!(k.state, Some(State::Gcra(BASE + 5 * SECOND)));
    let d = k.hit(BASE, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(SECOND));
    assert_eq!(d.reset_after, 5 * SECOND);
    // Then one per second, sustained.
    for s in 1..=10 {
        let now = BASE + s * SECOND;
        assert!(k.hit(now, 1).allowed, "second {s}");
        let d = k.hit(now, 1);
        assert!(!d.allowed, "second {s}");
        assert_eq!(d.retry_after, Some(SECOND));
    }
    // Idle 3 s: 3 more at once, not 5.
    let now = BASE + 13 * SECOND;
    for _ in 0..3 {
        assert!(k.hit(now, 1).allowed);
    }
    assert!(!k.hit(now, 1).allowed);
    // Token bucket with the same burst behaves the same.
    let mut tb = Key::new(q.with_algorithm(Algorithm::TokenBucket));
    for _ in 0..5 {
        assert!(tb.hit(BASE, 1).allowed);
    }
    assert!(!tb.hit(BASE, 1).allowed);
    assert!(tb.hit(BASE + SECOND, 1).allowed);
}

#[test]
fn burst_below_limit_caps_buckets() {
    // 60/min with burst 2: two at once, then one per second.
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let q = Quota::new(60, Unit::Minute)
            .with_algorithm(alg)
            .with_burst(2);
        let mut k = Key::new(q);
        assert!(k.hit(BASE, 1).allowed, "{alg}");
        assert!(k.hit(BASE, 1).allowed, "{alg}");
        let d = k.hit(BASE, 1);
        assert_eq!((d.allowed, d.retry_after), (false, Some(SECOND)), "{alg}");
        let d = k.hit(BASE, 3);
        assert!(d.never_passes(), "{alg}: cost above the burst");
    }
}

// ---------------------------------------------------------------------------------------------
// Edge cases, for every algorithm.
// ---------------------------------------------------------------------------------------------

#[test]
fn cost_zero_is_a_pure_query() {
    let now = BASE + 10 * SECOND;
    for alg in EXACT {
        let mut k = Key::with(3, Unit::Minute, alg);
        // Untracked: a query reports a full allowance and stores nothing.
        let d = k.hit(now, 0);
        assert!(d.allowed, "{alg}");
        assert_eq!(d.remaining, 3, "{alg}");
        assert_eq!(k.state, None, "{alg}");
        assert!(k.hit(now, 1).allowed);
        let before = k.state.clone();
        let d = k.hit(now, 0);
        assert!(d.allowed, "{alg}");
        assert_eq!(d.remaining, 2, "{alg}");
        assert_eq!(k.state, before, "{alg}: a query changes nothing");
        // Exhausted: still allowed, with nothing remaining.
        k.hit(now, 1);
        k.hit(now, 1);
        let before = k.state.clone();
        let d = k.hit(now, 0);
        assert!(d.allowed, "{alg}: query on an exhausted key");
        assert_eq!(d.remaining, 0, "{alg}");
        assert_eq!(d.retry_after, None, "{alg}");
        assert_eq!(d.delay, 0, "{alg}");
        assert_eq!(k.state, before, "{alg}");
    }
}

#[test]
fn cost_above_capacity_never_passes() {
    let now = BASE + 10 * SECOND;
    for alg in EXACT {
        let mut k = Key::with(3, Unit::Minute, alg);
        let d = k.hit(now, 4);
        assert!(d.never_passes(), "{alg}: {d:?}");
        assert_eq!(d.remaining, 3, "{alg}");
        assert_eq!(k.state, None, "{alg}: nothing consumed");
        assert!(k.hit(now, 3).allowed, "{alg}: cost == capacity passes");
        let d = k.hit(now + YEAR, 4);
        assert!(d.never_passes(), "{alg}");
    }
    let q = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::CountMinSketch);
    let mut sk = Sketch::new(q.sketch());
    assert!(sk.check(1, now, 4, &q).never_passes());
    assert!(sk.check(1, now, 3, &q).allowed);
}

#[test]
fn limit_zero_denies_everything_forever() {
    for alg in EXACT {
        let mut k = Key::with(0, Unit::Second, alg);
        for (now, cost) in [
            (BASE, 1),
            (BASE, 0),
            (BASE + YEAR, 1),
            (0, 1),
            (u64::MAX / 4, 5),
        ] {
            let d = k.hit(now, cost);
            assert!(d.never_passes(), "{alg} at {now} cost {cost}: {d:?}");
            assert_eq!(d.remaining, 0, "{alg}");
            assert_eq!(d.limit, 0, "{alg}");
        }
        assert_eq!(k.state, None, "{alg}");
    }
    let q = Quota::new(0, Unit::Second).with_algorithm(Algorithm::CountMinSketch);
    let mut sk = Sketch::new(q.sketch());
    assert!(sk.check(1, BASE, 1, &q).never_passes());
    assert!(sk.check(1, BASE, 0, &q).never_passes());
}

#[test]
fn huge_gaps_reset_cleanly() {
    for alg in EXACT {
        for gap in [10 * YEAR, 200 * YEAR] {
            let mut k = Key::with(3, Unit::Minute, alg);
            for _ in 0..3 {
                assert!(k.hit(BASE, 1).allowed);
            }
            let later = BASE + gap;
            let fresh = step(None, later, 1, &k.quota);
            let (d, s) = step(k.state.clone(), later, 1, &k.quota);
            assert_eq!((d, s), fresh, "{alg} after {gap} µs");
        }
    }
}

#[test]
fn time_going_backwards_is_tolerated() {
    let now = BASE + 10 * MIN + 10 * SECOND;
    for alg in EXACT {
        let mut k = Key::with(3, Unit::Minute, alg);
        for _ in 0..3 {
            assert!(k.hit(now, 1).allowed, "{alg}");
        }
        for back in [1, SECOND, MIN, 10 * MIN, YEAR, now] {
            let d = k.hit(now - back, 1);
            assert!(!d.allowed, "{alg}: {back} µs back admitted more");
            assert!(d.remaining <= 3, "{alg}");
            // A query still answers and changes nothing. (GCRA and the leaky bucket deny it: seen
            // from the earlier instant, their backlog is above capacity.)
            let before = k.state.clone();
            let d = k.hit(now - back, 0);
            assert!(d.remaining <= 3, "{alg}");
            assert_eq!(k.state, before, "{alg}");
        }
        // And time coming back works as if it had never left.
        let fresh_run = {
            let mut f = Key::with(3, Unit::Minute, alg);
            for _ in 0..3 {
                f.hit(now, 1);
            }
            f.hit(now + 2 * MIN, 1)
        };
        assert_eq!(k.hit(now + 2 * MIN, 1), fresh_run, "{alg}");
    }
    let q = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::CountMinSketch);
    let mut sk = Sketch::new(q.sketch());
    for _ in 0..3 {
        assert!(sk.check(9, now, 1, &q).allowed);
    }
    for back in [1, MIN, 10 * MIN, now] {
        assert!(!sk.check(9, now - back, 1, &q).allowed);
    }
}

#[test]
fn calendar_day_resets_at_utc_midnight() {
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let mut k = Key::with(2, Unit::Day, alg);
        let late = NEXT_DAY - SECOND; // 23:59:59
        assert!(k.hit(BASE + 3_600 * SECOND, 1).allowed);
        assert!(k.hit(late, 1).allowed);
        let d = k.hit(late, 1);
        assert!(!d.allowed, "{alg}");
        if alg == Algorithm::FixedWindow {
            assert_eq!(d.retry_after, Some(SECOND));
            assert!(k.hit(NEXT_DAY, 1).allowed);
            assert!(k.hit(NEXT_DAY, 1).allowed);
            assert!(!k.hit(NEXT_DAY, 1).allowed);
        } else {
            // Yesterday's 2 still weigh almost fully just after midnight.
            assert!(!k.hit(NEXT_DAY, 1).allowed);
            // Half-way through the next day: floor(2 × 0.5) = 1, one more fits.
            assert!(k.hit(NEXT_DAY + 43_200 * SECOND, 1).allowed);
        }
    }
}

#[test]
fn calendar_month_resets_on_the_first() {
    let mut k = Key::with(3, Unit::Month, Algorithm::FixedWindow);
    for _ in 0..3 {
        assert!(k.hit(BASE, 1).allowed);
    }
    let d = k.hit(BASE, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(DEC_1 - BASE), "the 1st of December");
    assert_eq!(d.reset_after, DEC_1 - BASE);
    assert!(!k.hit(DEC_1 - 1, 1).allowed);
    let d = k.hit(DEC_1, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 2);
    // December has 31 days.
    assert_eq!(d.reset_after, 31 * 86_400 * SECOND);
}

#[test]
fn week_windows_start_monday() {
    let mut k = Key::with(1, Unit::Week, Algorithm::FixedWindow);
    assert!(k.hit(BASE, 1).allowed); // Sunday
    let d = k.hit(BASE, 1);
    assert_eq!(d.retry_after, Some(86_400 * SECOND), "Monday 2026-11-23");
    assert!(k.hit(NEXT_DAY, 1).allowed);
}

#[test]
fn sliding_log_cost_and_retry_after_frees_enough() {
    let mut k = Key::with(5, Unit::Minute, Algorithm::SlidingWindowLog);
    assert!(k.hit(BASE, 2).allowed);
    assert!(k.hit(BASE + 10 * SECOND, 2).allowed);
    assert!(k.hit(BASE + 20 * SECOND, 1).allowed);
    // Cost 4 needs the first two entries (2 + 2) gone: at 1:10.
    let d = k.hit(BASE + 30 * SECOND, 4);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(40 * SECOND));
    assert_eq!(d.remaining, 0);
    assert!(!k.peek(BASE + 70 * SECOND - 1, 4).allowed);
    assert!(k.peek(BASE + 70 * SECOND, 4).allowed);
}

#[test]
fn other_algorithms_state_is_untracked() {
    let q = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::Gcra);
    let foreign = counter(BASE, 3, 3);
    assert_eq!(step(foreign, BASE, 1, &q), step(None, BASE, 1, &q));
}

/// The algorithms that clamp state ahead of the clock (the sliding log has its own rules).
const CLAMPED: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

/// The most `retry_after`, `reset_after` and `delay` may be, whatever the clock did: `burst·T`
/// for GCRA and the buckets, one window for the fixed window, two for the sliding counter.
fn duration_bound(q: &Quota, now: Micros) -> Micros {
    let window_len = {
        let (s, e) = crate::window::window(q.period(), now);
        e - s
    };
    match q.algorithm() {
        Algorithm::FixedWindow => window_len,
        Algorithm::EnvoyFixedWindow => {
            let (s, e) = super::envoy_fixed_window::window(q.period(), now);
            e - s
        }
        Algorithm::SlidingWindowCounter => 2 * window_len,
        _ => q.emission_interval().unwrap_or(0) * q.capacity().max(1),
    }
}

fn clamp_quota() -> impl proptest::strategy::Strategy<Value = Quota> {
    use proptest::prelude::*;
    (
        0usize..CLAMPED.len(),
        1u64..20,
        prop_oneof![
            Just(Unit::Second),
            Just(Unit::Minute),
            Just(Unit::Hour),
            Just(Unit::Day)
        ],
        1u32..4,
        proptest::option::of(1u64..30),
    )
        .prop_map(|(a, limit, unit, mult, burst)| {
            Quota::new(limit, Period::new(unit, mult))
                .with_algorithm(CLAMPED[a])
                .with_burst(burst)
        })
}

proptest::proptest! {
    /// With a monotonic clock the clamp never fires: decisions are those of the unclamped
    /// algorithm.
    #[test]
    fn clamp_never_fires_on_a_monotonic_clock(
        q in clamp_quota(),
        steps in proptest::collection::vec((0u64..3_000_000_000, 0u64..4), 1..80),
    ) {
        let mut k = Key::new(q);
        let mut now = BASE;
        for (gap, cost) in steps {
            now += gap % (2 * duration_bound(&q, now) + 2);
            if let Some(s) = &k.state {
                proptest::prop_assert_eq!(clamp(s, now, &q), None, "{:?} at {}", s, now);
            }
            k.hit(now, cost);
        }
    }

    /// Whatever jumps the clock makes, back and forth, durations stay within the bound.
    #[test]
    fn durations_stay_bounded_after_arbitrary_jumps(
        q in clamp_quota(),
        steps in proptest::collection::vec((-(2 * YEAR as i64)..2 * YEAR as i64, 0u64..4), 1..60),
    ) {
        let mut k = Key::new(q);
        for (offset, cost) in steps {
            let now = (BASE as i64 + offset) as Micros;
            let d = k.hit(now, cost);
            let bound = duration_bound(&q, now);
            proptest::prop_assert!(d.reset_after <= bound, "{d:?} > {bound}");
            proptest::prop_assert!(d.retry_after.unwrap_or(0) <= bound, "{d:?} > {bound}");
            proptest::prop_assert!(d.delay <= bound, "{d:?} > {bound}");
            // And a kept state is clamped: the next check at the same instant clamps nothing.
            if let Some(s) = &k.state {
                proptest::prop_assert_eq!(clamp(s, now, &q), None);
            }
        }
    }

    /// A client that used its quota is not re-admitted by the clock going back: its next request
    /// is denied. Within one window back, the fixed window and sliding counter lose nothing: when
    /// the clock returns, the client is still denied. And with no request while the clock was
    /// back, nothing changed for any algorithm.
    #[test]
    fn a_backward_jump_does_not_readmit(
        a in 0usize..CLAMPED.len(),
        back in 1u64..(2 * YEAR),
        within in 0u64..MIN,
    ) {
        let alg = CLAMPED[a];
        let q = Quota::new(3, Unit::Minute).with_algorithm(alg);
        let t = BASE + 5 * MIN + 30 * SECOND;
        let mut k = Key::new(q);
        for _ in 0..3 {
            proptest::prop_assert!(k.hit(t, 1).allowed);
        }
        let untouched = k.state.clone();
        let d = k.hit(t - back, 1);
        proptest::prop_assert!(!d.allowed, "{alg}: {back} µs back");
        proptest::prop_assert!(d.retry_after.unwrap() <= duration_bound(&q, t - back));
        let windowed = matches!(alg, Algorithm::FixedWindow | Algorithm::SlidingWindowCounter);
        if windowed && back <= 30 * SECOND {
            proptest::prop_assert!(!k.hit(t + within % (30 * SECOND), 1).allowed, "{alg}");
        }
        k.state = untouched;
        proptest::prop_assert!(!k.peek(t, 1).allowed, "{alg}");
    }
}

#[test]
fn a_day_forward_and_back_does_not_lock_out_for_a_day() {
    // The field report: GCRA 1/s, a request during a one-day step forward, then the clock back.
    let day = 86_400 * SECOND;
    for alg in CLAMPED {
        let mut k = Key::with(1, Unit::Second, alg);
        let t = BASE + 500_000;
        assert!(k.hit(t, 1).allowed);
        assert!(k.hit(t + day, 1).allowed, "{alg}");
        let d = k.hit(t + SECOND / 10, 1);
        assert!(!d.allowed, "{alg}");
        let retry = d.retry_after.unwrap();
        let bound = duration_bound(&k.quota, t);
        assert!(retry <= bound, "{alg}: retry after {retry} µs");
        // Retrying when told works (the fixed window and sliding counter may ask once more:
        // the state was clamped to the next window).
        let mut at = t + SECOND / 10 + retry;
        let mut admitted = false;
        for _ in 0..3 {
            let d = k.hit(at, 1);
            if d.allowed {
                admitted = true;
                break;
            }
            at += d.retry_after.unwrap();
        }
        assert!(
            admitted && at <= t + 3 * SECOND,
            "{alg}: still denied at {at}"
        );
    }
}

#[test]
fn count_min_sketch_window_is_clamped_after_a_step_back() {
    let q = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::CountMinSketch);
    let mut sk = Sketch::new(q.sketch());
    let now = BASE + 10 * MIN + 10 * SECOND;
    for _ in 0..3 {
        assert!(sk.check(9, now, 1, &q).allowed);
    }
    for back in [1, MIN, 10 * MIN, YEAR] {
        let d = sk.check(9, now - back, 1, &q);
        assert!(!d.allowed, "{back} µs back");
        assert!(d.retry_after.unwrap() <= 2 * MIN, "{back}: {d:?}");
        assert!(d.reset_after <= 2 * MIN, "{back}: {d:?}");
    }
}
