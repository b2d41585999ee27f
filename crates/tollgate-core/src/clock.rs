//! Time as a parameter.
//!
//! Core code never reads the system clock: every algorithm takes `now` as an argument, and callers
//! get it from a [`Clock`]. Tests and `tollgate simulate` use [`ManualClock`] so runs are exact
//! and repeatable; the service uses [`MonotonicWallClock`].
//!
//! Time is **microseconds since the Unix epoch** in a `u64` ([`Micros`]). Microseconds, not
//! nanoseconds, because the same arithmetic runs as Lua inside Redis, where numbers are IEEE
//! doubles: microsecond timestamps stay exact integers (below 2^53) until the year 2255, and
//! Redis `TIME` reports microseconds. Wall-clock (not monotonic) time is needed anyway because
//! fixed windows align to UTC calendar boundaries.
//!
//! The wall clock can step (an NTP correction, a VM resumed with a stale clock). A store whose
//! time follows such a step sees a day pass, or go back, in an instant: it would forget every
//! counter (forward) or see its state lie in the future (back). [`MonotonicWallClock`] reads the
//! wall clock once, at start, and then adds monotonic elapsed time: calendar windows line up with
//! UTC as at start, and later steps do not move it. The algorithms clamp state that lies further
//! ahead than a monotonic clock could have left it (see `algorithm`), for stores whose time does
//! follow steps (Redis `TIME`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (UTC).
pub type Micros = u64;

/// One second in [`Micros`].
pub const SECOND: Micros = 1_000_000;

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time in microseconds since the Unix epoch.
    fn now(&self) -> Micros;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }
}

/// Wall time at start plus monotonic time elapsed since: follows the calendar, not later steps of
/// the wall clock. A difference that appears after start (a step, time spent suspended, which the
/// monotonic clock does not count) is kept until the process restarts.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicWallClock {
    wall: Micros,
    at: Instant,
}

impl MonotonicWallClock {
    /// A clock anchored to the system wall clock now.
    pub fn new() -> Self {
        Self::anchored(SystemClock.now(), Instant::now())
    }

    /// A clock that reads `wall` at the instant `at`.
    pub fn anchored(wall: Micros, at: Instant) -> Self {
        Self { wall, at }
    }
}

impl Default for MonotonicWallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicWallClock {
    fn now(&self) -> Micros {
        let elapsed = Instant::now().saturating_duration_since(self.at);
        self.wall
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to: for tests and deterministic replays.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `now`.
    pub fn new(now: Micros) -> Self {
        Self(AtomicU64::new(now))
    }
    /// Set the time (it may go backwards: algorithms tolerate that).
    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::Relaxed);
    }
    /// Move the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::Relaxed)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_wall_clock_is_the_anchor_plus_elapsed_time() {
        let at = Instant::now();
        let c = MonotonicWallClock::anchored(1_000 * SECOND, at);
        let a = c.now();
        assert!(a >= 1_000 * SECOND);
        std::thread::sleep(Duration::from_millis(2));
        let b = c.now();
        assert!(b >= a + 2_000, "{a} {b}");
        // Anchored in the future: never below the anchor.
        let later = MonotonicWallClock::anchored(5 * SECOND, at + Duration::from_secs(3600));
        assert_eq!(later.now(), 5 * SECOND);
    }
}
