//! Time as a parameter.
//!
//! Core code never reads the system clock: every algorithm takes `now` as an argument, and callers
//! get it from a [`Clock`]. Tests and `tollgate simulate` use [`ManualClock`] so runs are exact
//! and repeatable; the service uses [`SystemClock`].
//!
//! Time is **microseconds since the Unix epoch** in a `u64` ([`Micros`]). Microseconds, not
//! nanoseconds, because the same arithmetic runs as Lua inside Redis, where numbers are IEEE
//! doubles: microsecond timestamps stay exact integers (below 2^53) until the year 2255, and
//! Redis `TIME` reports microseconds. Wall-clock (not monotonic) time is needed anyway because
//! fixed windows align to UTC calendar boundaries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// Convert microseconds to a [`Duration`].
pub fn micros(us: Micros) -> Duration {
    Duration::from_micros(us)
}
