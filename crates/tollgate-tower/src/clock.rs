//! [`TokioClock`]: the layer's default clock, wall time at start plus Tokio's monotonic time.
//!
//! The layer sleeps with Tokio's timer (shaping), so the clock that decides how long to sleep
//! must run on the same time: under `tokio::time::pause()` (tests) both stop and advance
//! together, and a shaping test is exact instead of racing the machine's real clock. Outside a
//! paused runtime `tokio::time::Instant` is the system's monotonic clock, so this is
//! [`tollgate_core::MonotonicWallClock`] read through Tokio.

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

/// The clock a layer reads: the default [`TokioClock`] held inline (read per request without an
/// indirect call), or one given to [`Builder::clock`](crate::Builder::clock).
pub(crate) enum LayerClock {
    Tokio(TokioClock),
    Custom(Arc<dyn Clock>),
}

impl LayerClock {
    #[inline]
    pub(crate) fn now(&self) -> Micros {
        match self {
            LayerClock::Tokio(c) => c.now(),
            LayerClock::Custom(c) => c.now(),
        }
    }
}
