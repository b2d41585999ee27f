//! What a limit allows: [`Quota`] = how many ([`Quota::limit`]) per how long ([`Period`]), with
//! which [`Algorithm`] and burst.
//!
//! A period is a unit times a multiplier (`15 × minute`), not a bare `Duration`, because fixed and
//! sliding-counter windows for day/week/month/year align to UTC calendar boundaries, whose lengths
//! vary. Algorithms that need a rate (buckets, GCRA, sliding log) use [`Period::nominal`]: months
//! and years are the mean Gregorian lengths.

use crate::clock::{Micros, SECOND};
use std::fmt;
use std::str::FromStr;

/// The unit of a rate-limit period (Envoy's `RateLimitUnit`, plus `week`, `month` and `year`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One UTC calendar day.
    Day,
    /// One UTC calendar week, starting Monday.
    Week,
    /// One UTC calendar month.
    Month,
    /// One UTC calendar year.
    Year,
}

impl Unit {
    /// All units, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Nominal length in microseconds (mean Gregorian month and year).
    pub const fn nominal(self) -> Micros {
        match self {
            Unit::Second => SECOND,
            Unit::Minute => 60 * SECOND,
            Unit::Hour => 3_600 * SECOND,
            Unit::Day => 86_400 * SECOND,
            Unit::Week => 7 * 86_400 * SECOND,
            // 365.2425 days / 12
            Unit::Month => 2_629_746 * SECOND,
            Unit::Year => 31_556_952 * SECOND,
        }
    }

    /// Lower-case name as written in rule files.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Upper-case name as Envoy's protobuf enum spells it (`MINUTE`).
    pub const fn as_proto_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Unit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown unit '{s}' (expected second, minute, hour, day, week, month or year)"
                )
            })
    }
}

/// A period: `multiplier` × `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    /// The unit.
    pub unit: Unit,
    /// How many units (at least 1).
    pub multiplier: u32,
}

impl Period {
    /// `multiplier` × `unit`; a multiplier of 0 is taken as 1.
    pub const fn new(unit: Unit, multiplier: u32) -> Self {
        Self {
            unit,
            multiplier: if multiplier == 0 { 1 } else { multiplier },
        }
    }

    /// Nominal length in microseconds (saturating: rule files cannot ask for more than
    /// [`MAX_PERIOD`], but a `Quota` built in code could).
    pub const fn nominal(self) -> Micros {
        self.unit.nominal().saturating_mul(self.multiplier as u64)
    }
}

/// The longest period a rule may have, and the longest time a bucket (`burst` × `period` /
/// `limit`) may take to fill: 100 years. Rule validation enforces it so that every product of
/// times and counts in the algorithms stays below 2^53 µs: no overflow in Rust, and exact in the
/// Lua ports, whose numbers are doubles.
pub const MAX_PERIOD: Micros = 100 * Unit::Year.nominal();

impl From<Unit> for Period {
    fn from(unit: Unit) -> Self {
        Period::new(unit, 1)
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.multiplier == 1 {
            write!(f, "{}", self.unit)
        } else {
            write!(f, "{} {}s", self.multiplier, self.unit)
        }
    }
}

/// The rate-limiting algorithms. See `docs/algorithms.md` for the semantics and trade-offs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Bucket of `burst` tokens, refilled one token every `period / limit`.
    TokenBucket,
    /// Queue of `burst` requests drained one every `period / limit`; admitted requests wait.
    LeakyBucket,
    /// One counter per aligned window.
    FixedWindow,
    /// Timestamps of admitted requests; exact over any rolling window.
    SlidingWindowLog,
    /// Weighted previous window plus current window (the default).
    #[default]
    SlidingWindowCounter,
    /// Generic cell rate algorithm: one timestamp per key.
    Gcra,
    /// Sliding window counter over count-min sketches: fixed memory for any number of keys.
    CountMinSketch,
    /// envoyproxy/ratelimit's fixed window: epoch-aligned windows of fixed length (a month is
    /// 30 days, a year 365), and a request's hits counted even when it is over the limit.
    EnvoyFixedWindow,
}

impl Algorithm {
    /// All algorithms.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::Gcra,
        Algorithm::CountMinSketch,
        Algorithm::EnvoyFixedWindow,
    ];

    /// snake_case name as written in rule files.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::Gcra => "gcra",
            Algorithm::CountMinSketch => "count_min_sketch",
            Algorithm::EnvoyFixedWindow => "envoy_fixed_window",
        }
    }

    /// Whether a [`Doorkeeper`] can stand in front of this algorithm: the windowed counters,
    /// whose state after a key's first request in a window is known from one bit.
    pub const fn takes_doorkeeper(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::CountMinSketch
        )
    }

    /// Whether `burst` means something for this algorithm.
    pub const fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
                format!(
                    "unknown algorithm '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// How the instances sharing a store keep one limit's counter in step (`sync:` in a rule).
/// Only a shared store (Redis) reads it: on the memory store there is one instance and every
/// mode decides alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SyncMode {
    /// Every decision is made by the store (one round trip per request).
    #[default]
    Exact,
    /// An instance takes a share of the window's remaining count from the store and decides
    /// locally from it: never more than the limit across instances, most decisions without a
    /// round trip. Windowed algorithms only ([`SyncMode::supports`]).
    Lease,
    /// An instance counts locally and sends its counts to the store in batches (every flush
    /// interval), learning the fleet's count back: approximate (the fleet may admit a bounded
    /// amount over the limit per window, see `docs/distributed.md`), no round trip on the
    /// request path. Windowed algorithms only ([`SyncMode::supports`]).
    Batched,
}

impl SyncMode {
    /// All modes.
    pub const ALL: [SyncMode; 3] = [SyncMode::Exact, SyncMode::Lease, SyncMode::Batched];

    /// The name as written in rule files.
    pub const fn as_str(self) -> &'static str {
        match self {
            SyncMode::Exact => "exact",
            SyncMode::Lease => "lease",
            SyncMode::Batched => "batched",
        }
    }

    /// Whether `algorithm` can be kept this way. A lease is a share of the count of the current
    /// window, given back or lost when the window ends, so it needs an algorithm whose state is
    /// a count per aligned window: `fixed_window` and `sliding_window_counter`. A bucket or GCRA
    /// leased ahead of use would let the units spent late meet the refill that others see
    /// (admitting more than the limit over a short interval), and a sliding log keeps each
    /// admission's time, which a share cannot carry. Batches are deltas added to a window's
    /// count, so they need the same: counts that add up per window.
    pub const fn supports(self, algorithm: Algorithm) -> bool {
        match self {
            SyncMode::Exact => true,
            SyncMode::Lease | SyncMode::Batched => matches!(
                algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
            ),
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(SyncMode::Exact),
            "lease" => Ok(SyncMode::Lease),
            "batched" => Ok(SyncMode::Batched),
            _ => Err(format!(
                "unknown sync mode '{s}' (expected exact, lease or batched)"
            )),
        }
    }
}

/// Size of the count-min sketch used by [`Algorithm::CountMinSketch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SketchSize {
    /// Counters per row.
    pub width: u32,
    /// Rows (independent hash functions).
    pub depth: u32,
}

impl Default for SketchSize {
    fn default() -> Self {
        Self {
            width: 2048,
            depth: 4,
        }
    }
}

/// A doorkeeper in front of a limit's counters: a Bloom filter per window that records a key's
/// first request, so that keys seen once cost a few bits instead of a counter (see the
/// `doorkeeper` module docs for what it admits). Windowed algorithms only (fixed window,
/// sliding window counter, count-min sketch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Doorkeeper {
    expected_keys: u32,
    /// The target false-positive rate in parts per billion.
    fp_ppb: u32,
}

impl Doorkeeper {
    /// Most keys a doorkeeper may be sized for.
    pub const MAX_EXPECTED_KEYS: u64 = 1 << 28;
    /// Smallest target false-positive rate.
    pub const MIN_FP_RATE: f64 = 1e-6;
    /// Largest target false-positive rate.
    pub const MAX_FP_RATE: f64 = 0.5;

    /// A filter sized for `expected_keys` distinct keys per window at a false-positive rate of
    /// `fp_rate` (in `[1e-6, 0.5]`); `expected_keys` in `1..=2^28`.
    pub fn new(expected_keys: u64, fp_rate: f64) -> Result<Self, String> {
        if !(1..=Self::MAX_EXPECTED_KEYS).contains(&expected_keys) {
            return Err(format!(
                "expected_keys must be between 1 and {}, got {expected_keys}",
                Self::MAX_EXPECTED_KEYS
            ));
        }
        if !(Self::MIN_FP_RATE..=Self::MAX_FP_RATE).contains(&fp_rate) {
            return Err(format!(
                "fp_rate must be between {} and {}, got {fp_rate}",
                Self::MIN_FP_RATE,
                Self::MAX_FP_RATE
            ));
        }
        Ok(Self {
            expected_keys: u32::try_from(expected_keys).unwrap_or(u32::MAX),
            fp_ppb: (fp_rate * 1e9).round() as u32,
        })
    }

    /// Distinct keys per window the filter is sized for.
    pub fn expected_keys(&self) -> u64 {
        u64::from(self.expected_keys)
    }

    /// The target false-positive rate at `expected_keys` keys.
    pub fn fp_rate(&self) -> f64 {
        f64::from(self.fp_ppb) / 1e9
    }

    /// Bits of one generation: `-n ln p / (ln 2)^2`, rounded up to whole 64-bit words.
    pub fn bits(&self) -> u64 {
        let n = self.expected_keys() as f64;
        let m = (-n * self.fp_rate().ln() / (std::f64::consts::LN_2.powi(2))).ceil() as u64;
        m.max(64).div_ceil(64) * 64
    }

    /// Hash functions: `(m / n) ln 2`, rounded, between 1 and 30.
    pub fn hashes(&self) -> u32 {
        let k = (self.bits() as f64 / self.expected_keys() as f64 * std::f64::consts::LN_2).round();
        (k as u32).clamp(1, 30)
    }

    /// Bytes both generations hold.
    pub fn memory(&self) -> u64 {
        2 * self.bits() / 8
    }
}

/// How much a limit allows: `limit` per `period`, with an algorithm, a burst and (count-min
/// sketch only) a sketch size.
///
/// Built with [`Quota::new`] and the `with_*` methods; the fields are read through accessors so
/// that the emission interval (`period / limit`, which GCRA and both buckets need on every check)
/// is computed once here, not divided out again per decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period: Period,
    burst: Option<u64>,
    algorithm: Algorithm,
    sketch: SketchSize,
    doorkeeper: Option<Doorkeeper>,
    sync: SyncMode,
    /// `sync: batched` only: how often this limit's counts are flushed, in ms (0: the store's
    /// default). Milliseconds in 32 bits keep the quota small; rules allow 1 ms to 60 s.
    flush_ms: u32,
    /// `emission_interval_of(period, limit)`: derived, so equality and hashing are unaffected.
    emission: Micros,
}

/// `period / limit` rounded **up** to whole microseconds (at least 1), so that rounding can only
/// make a limit stricter, never looser; 0 when `limit` is 0.
fn emission_interval_of(period: Period, limit: u64) -> Micros {
    if limit == 0 {
        0
    } else {
        period.nominal().div_ceil(limit).max(1)
    }
}

impl Quota {
    /// `limit` per `period` with the default algorithm (sliding window counter).
    pub fn new(limit: u64, period: impl Into<Period>) -> Self {
        let period = period.into();
        Self {
            limit,
            period,
            burst: None,
            algorithm: Algorithm::default(),
            sketch: SketchSize::default(),
            doorkeeper: None,
            sync: SyncMode::Exact,
            flush_ms: 0,
            emission: emission_interval_of(period, limit),
        }
    }

    /// The same quota with another algorithm.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The same quota with an explicit burst (`None`: the limit).
    pub fn with_burst(mut self, burst: impl Into<Option<u64>>) -> Self {
        self.burst = burst.into();
        self
    }

    /// The same quota with another limit (the period, algorithm, burst and sketch kept).
    pub fn with_limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self.emission = emission_interval_of(self.period, limit);
        self
    }

    /// The same quota kept in step across instances another way (a shared store only).
    pub fn with_sync(mut self, sync: SyncMode) -> Self {
        self.sync = sync;
        self
    }

    /// How instances sharing a store keep this quota's counter in step.
    #[inline]
    pub fn sync(&self) -> SyncMode {
        self.sync
    }

    /// The same quota flushed every `interval` when batched (whole milliseconds, at least 1;
    /// `None`: the store's default interval). Only `sync: batched` reads it.
    pub fn with_flush_interval(mut self, interval: Option<std::time::Duration>) -> Self {
        self.flush_ms = interval.map_or(0, |d| {
            u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
        });
        self
    }

    /// How often this quota's counts are flushed when batched; `None`: the store's default.
    #[inline]
    pub fn flush_interval(&self) -> Option<std::time::Duration> {
        (self.flush_ms > 0).then(|| std::time::Duration::from_millis(u64::from(self.flush_ms)))
    }

    /// The same quota with another sketch size ([`Algorithm::CountMinSketch`] only).
    pub fn with_sketch(mut self, sketch: SketchSize) -> Self {
        self.sketch = sketch;
        self
    }

    /// The same quota with a doorkeeper in front of its counters (memory store; windowed
    /// algorithms only, see [`Doorkeeper`]), or none.
    pub fn with_doorkeeper(mut self, doorkeeper: Option<Doorkeeper>) -> Self {
        self.doorkeeper = doorkeeper;
        self
    }

    /// The doorkeeper, if any (never for an algorithm that cannot take one, see
    /// [`Algorithm::takes_doorkeeper`]).
    #[inline]
    pub fn doorkeeper(&self) -> Option<Doorkeeper> {
        self.doorkeeper
            .filter(|_| self.algorithm.takes_doorkeeper())
    }

    /// Requests (cost units) per period. 0 denies everything.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    #[inline]
    pub fn period(&self) -> Period {
        self.period
    }

    /// The burst as configured: `None` means the limit (see [`Quota::capacity`]).
    #[inline]
    pub fn burst(&self) -> Option<u64> {
        self.burst
    }

    /// The algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Sketch dimensions ([`Algorithm::CountMinSketch`] only).
    #[inline]
    pub fn sketch(&self) -> SketchSize {
        self.sketch
    }

    /// Bucket capacity for token bucket, leaky bucket and GCRA: `burst`, or `limit` when unset.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// Time one unit of cost takes to replenish, rounded **up** to whole microseconds so that
    /// rounding can only make a limit stricter, never looser. `None` when `limit` is 0.
    #[inline]
    pub fn emission_interval(&self) -> Option<Micros> {
        (self.emission > 0).then_some(self.emission)
    }
}
