//! The layer's clocks: [`TokioClock`] (wall time at start plus Tokio's monotonic time) and, on
//! the layer's own memory store, a cheaper counter clock.
//!
//! The layer sleeps with Tokio's timer (shaping), so under `tokio::time::pause()` (tests) the
//! clock that decides how long to sleep must run on the same time: both stop and advance
//! together, and a shaping test is exact instead of racing the machine's real clock.
//! [`TokioClock`] does that; outside a paused runtime `tokio::time::Instant` is the system's
//! monotonic clock, so it is [`tollgate_core::MonotonicWallClock`] read through Tokio.
//!
//! Reading it costs a `clock_gettime` and std's `Instant` subtraction on every request, more
//! than the rest of the decision. So a layer on its own memory store, built while Tokio's clock
//! is not paused, reads the CPU's time-stamp counter instead (`CounterClock`, through `quanta`,
//! the clock `governor` uses; it falls back to the system's monotonic clock where the counter
//! is not invariant). Its rate is calibrated once, so it may drift from the system clock by a
//! few parts per million; that store is private to the layer, where only time differences
//! matter (fixed windows stay aligned to UTC as at creation, to within that drift). Shared
//! stores (Redis, a store given to the builder) and remote services keep [`TokioClock`], since
//! other processes' counters meet there. A layer built while Tokio's clock is paused gets
//! [`TokioClock`] too; one paused only after it was built needs
//! [`Builder::clock`](crate::Builder::clock)`(TokioClock::new())`.

use std::sync::Arc;
use tokio::time::Instant;
use tollgate_core::{Clock, Micros, SystemClock};

/// Wall-clock time when created, plus the time elapsed since on Tokio's clock (which follows
/// `tokio::time::pause`/`advance`). Fixed windows align to UTC as at creation.
///
/// ```
/// use tollgate_core::Clock;
/// use tollgate_tower::TokioClock;
///
/// let clock = TokioClock::new();
/// assert!(clock.now() > 1_600_000_000_000_000); // microseconds since the Unix epoch
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    wall: Micros,
    at: Instant,
}

impl TokioClock {
    /// A clock anchored to the system's wall clock now.
    pub fn new() -> Self {
        Self::anchored(SystemClock.now())
    }

    /// A clock that reads `wall` (microseconds since the Unix epoch) now.
    pub fn anchored(wall: Micros) -> Self {
        Self {
            wall,
            at: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline(always)]
    fn now(&self) -> Micros {
        let elapsed = Instant::now().saturating_duration_since(self.at);
        // Whole seconds and microseconds: no 128-bit `as_micros`, and no overflow before
        // the year 500,000.
        self.wall
            .saturating_add(elapsed.as_secs().saturating_mul(1_000_000))
            .saturating_add(u64::from(elapsed.subsec_micros()))
    }
}

/// Wall-clock time when created, plus the time elapsed since on the CPU's time-stamp counter
/// (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CounterClock {
    wall: Micros,
    clock: quanta::Clock,
    at: u64,
}

impl CounterClock {
    pub(crate) fn new() -> Self {
        let clock = quanta::Clock::new();
        Self {
            wall: SystemClock.now(),
            at: clock.raw(),
            clock,
        }
    }

    #[inline(always)]
    fn now(&self) -> Micros {
        let elapsed = self.clock.delta_as_nanos(self.at, self.clock.raw()) / 1_000;
        self.wall.saturating_add(elapsed)
    }
}

/// Whether Tokio's clock is paused here: paused time stands still, so two readings are equal.
/// (Real time could read equal on a coarse clock: that only picks the exact clock.)
pub(crate) fn tokio_paused() -> bool {
    Instant::now() == Instant::now()
}

/// The clock a layer reads: a default held inline (read per request without an indirect call),
/// or one given to [`Builder::clock`](crate::Builder::clock).
pub(crate) enum LayerClock {
    Tokio(TokioClock),
    Counter(CounterClock),
    Custom(Arc<dyn Clock>),
}

impl LayerClock {
    #[inline]
    pub(crate) fn now(&self) -> Micros {
        match self {
            LayerClock::Tokio(c) => c.now(),
            LayerClock::Counter(c) => c.now(),
            LayerClock::Custom(c) => c.now(),
        }
    }
}
