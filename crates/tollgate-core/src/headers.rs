//! The rate-limit response headers: `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
//! `X-RateLimit-Reset`, the IETF draft's `RateLimit-Policy` and `RateLimit`, and `Retry-After`.
//!
//! One place computes them from a decision ([`HeaderValues::new`], [`HeaderValues::of_verdict`])
//! and formats them ([`HeaderValues::for_each`], [`HeaderValues::insert_into`]), so the service's
//! HTTP API, forward-auth, its gRPC `response_headers_to_add` and the in-process middleware all
//! send the same values. Formatting uses a stack buffer and [`insert_into`] one shared byte
//! buffer for all the values: these run on every request. [`HeaderFamilies`] picks the
//! `X-RateLimit-*` headers, the IETF ones or both ([`HeaderValues::insert_families`]); only
//! the chosen ones are formatted.
//!
//! [`insert_into`]: HeaderValues::insert_into

use crate::clock::Micros;
use crate::decision::Decision;
use crate::limiter::Verdict;
use crate::quota::{Algorithm, Quota};
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

/// Values for the rate-limit response headers, from the limit that binds a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderValues {
    /// `X-RateLimit-Limit`.
    pub limit: u64,
    /// `X-RateLimit-Remaining`.
    pub remaining: u64,
    /// `X-RateLimit-Reset`: seconds until the counter is full again, rounded up.
    pub reset_secs: u64,
    /// `Retry-After` in seconds, rounded up: denied requests that can pass later only.
    pub retry_after_secs: Option<u64>,
    /// Period of the binding limit in seconds (the `w=` of `RateLimit-Policy`).
    pub window_secs: u64,
}

/// Which families of rate-limit headers to send. `Retry-After` goes with every denial that can
/// pass later, whatever the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderFamilies {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` and the IETF draft's
    /// `RateLimit-Policy` and `RateLimit`.
    #[default]
    Both,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` only (the de facto
    /// headers most clients read).
    XRateLimit,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` only.
    Ietf,
}

impl HeaderFamilies {
    fn x_ratelimit(self) -> bool {
        self != HeaderFamilies::Ietf
    }

    fn ietf(self) -> bool {
        self != HeaderFamilies::XRateLimit
    }
}

/// The header names, in the order [`HeaderValues::for_each`] gives them, built once
/// (`HeaderName::from_static` at run time re-validates the name on every call).
pub static HEADER_NAMES: [HeaderName; 6] = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
    HeaderName::from_static("ratelimit-policy"),
    HeaderName::from_static("ratelimit"),
    RETRY_AFTER,
];

impl HeaderValues {
    /// The headers for decision `d` of a limit with `quota` (`None`: a limit without one, whose
    /// reset is the decision's own), at `now`, in a request whose overall verdict is `allowed`:
    /// `Retry-After` only when the request is denied and `d` can pass later.
    ///
    /// The values describe the capacity in force, so that `remaining <= limit` and
    /// `reset <= window` always hold, as clients of the IETF fields assume:
    /// - token bucket, leaky bucket and GCRA: the limit is the bucket's capacity (`burst`, the
    ///   most that can pass at once), the window the time an empty bucket takes to fill
    ///   (`burst / limit` periods), the reset the time until it is full again;
    /// - sliding window counter and count-min sketch: the reset is the end of the current
    ///   aligned window, when the hits counted in it start to fade (they are gone one window
    ///   later; until the current window ends none of them comes back);
    /// - fixed windows and the sliding log: the time until the counter is full again, which
    ///   is at most one period.
    pub fn new(quota: Option<&Quota>, d: &Decision, allowed: bool, now: Micros) -> Self {
        let reset = quota.map_or(d.reset_after, |q| d.reported_reset(q.period(), now));
        let (limit, window, reset) = match quota {
            Some(q) => in_force(q, d, reset, now),
            None => (d.limit, 0, reset),
        };
        let window_secs = secs_ceil(window);
        let reset_secs = secs_ceil(reset);
        Self {
            limit,
            remaining: d.reported_remaining().min(limit),
            reset_secs: if window_secs > 0 {
                reset_secs.min(window_secs)
            } else {
                reset_secs
            },
            // An allowed request may be bound by a quota-mode limit that is over: no Retry-After.
            retry_after_secs: if d.allowed || allowed {
                None
            } else {
                d.retry_after.map(|r| secs_ceil(r).max(1))
            },
            window_secs,
        }
    }

    /// The headers of a whole request, from its binding limit ([`Verdict::binding`]); `None`
    /// when no (non-shadow) limit applied.
    pub fn of_verdict(verdict: &Verdict<'_>, allowed: bool, now: Micros) -> Option<Self> {
        verdict
            .binding()
            .map(|(limit, d)| Self::new(limit.quota.as_ref(), &d, allowed, now))
    }

    /// Call `f(name, value)` for each header, in a stable order: `X-RateLimit-Limit`,
    /// `X-RateLimit-Remaining`, `X-RateLimit-Reset`, `RateLimit-Policy`, `RateLimit`, and
    /// `Retry-After` when set. Values are formatted into one stack buffer (no allocation).
    pub fn for_each(&self, mut f: impl FnMut(&'static str, &str)) {
        let mut buf = HeaderBuf::default();
        f("x-ratelimit-limit", buf.num(self.limit));
        f("x-ratelimit-remaining", buf.num(self.remaining));
        f("x-ratelimit-reset", buf.num(self.reset_secs));
        f(
            "ratelimit-policy",
            buf.join(&[("", self.limit), (";w=", self.window_secs)]),
        );
        f(
            "ratelimit",
            buf.join(&[
                ("limit=", self.limit),
                (", remaining=", self.remaining),
                (", reset=", self.reset_secs),
            ]),
        );
        if let Some(r) = self.retry_after_secs {
            f("retry-after", buf.num(r));
        }
    }

    /// The headers as `(name, value)` pairs, in the order of [`HeaderValues::for_each`].
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::with_capacity(6);
        self.for_each(|name, value| v.push((name, value.to_string())));
        v
    }

    /// Insert the headers into `headers` (replacing any of the same names): both families, as
    /// [`HeaderValues::insert_families`] does.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        self.insert_families(headers, HeaderFamilies::Both)
    }

    /// How many headers [`HeaderValues::insert_families`] inserts for `families`.
    pub fn count(&self, families: HeaderFamilies) -> usize {
        3 * usize::from(families.x_ratelimit())
            + 2 * usize::from(families.ietf())
            + usize::from(self.retry_after_secs.is_some())
    }

    /// Insert the headers of `families` (and `Retry-After` when set) into `headers`, replacing
    /// any of the same names, with the values [`HeaderValues::for_each`] gives. The values are
    /// written straight into one buffer (one allocation for all of them; each header value is a
    /// slice of it) and the names are static.
    pub fn insert_families(&self, headers: &mut HeaderMap, families: HeaderFamilies) {
        let mut buf = bytes::BytesMut::with_capacity(96);
        let mut ints = itoa::Buffer::new();
        // (index into HEADER_NAMES, end of its value in `buf`)
        let mut spans = [(0, 0); 6];
        let mut n = 0;
        let mut add = |buf: &mut bytes::BytesMut, header: usize, parts: &[(&str, u64)]| {
            for (label, v) in parts {
                buf.extend_from_slice(label.as_bytes());
                buf.extend_from_slice(ints.format(*v).as_bytes());
            }
            spans[n] = (header, buf.len());
            n += 1;
        };
        if families.x_ratelimit() {
            add(&mut buf, 0, &[("", self.limit)]);
            add(&mut buf, 1, &[("", self.remaining)]);
            add(&mut buf, 2, &[("", self.reset_secs)]);
        }
        if families.ietf() {
            add(&mut buf, 3, &[("", self.limit), (";w=", self.window_secs)]);
            let (l, r, t) = (self.limit, self.remaining, self.reset_secs);
            add(
                &mut buf,
                4,
                &[("limit=", l), (", remaining=", r), (", reset=", t)],
            );
        }
        if let Some(r) = self.retry_after_secs {
            add(&mut buf, 5, &[("", r)]);
        }
        let buf = buf.freeze();
        let mut start = 0;
        for &(header, end) in &spans[..n] {
            // Digits and ASCII labels: always a valid value.
            if let Ok(v) = HeaderValue::from_maybe_shared(buf.slice(start..end)) {
                headers.insert(HEADER_NAMES[header].clone(), v);
            }
            start = end;
        }
    }
}

/// The capacity in force for decision `d` of `quota`: (limit, window, reset), in cost units and
/// microseconds (see [`HeaderValues::new`]).
fn in_force(quota: &Quota, d: &Decision, reset: Micros, now: Micros) -> (u64, Micros, Micros) {
    let nominal = quota.period().nominal();
    match quota.algorithm() {
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra if quota.limit() > 0 => {
            // The decision's limit may be a share of the quota's (a degraded Redis store
            // divides it among instances): the capacity is scaled with it.
            let scale = |v: u64| {
                u64::try_from(
                    u128::from(v) * u128::from(quota.capacity()) / u128::from(quota.limit()),
                )
                .unwrap_or(u64::MAX)
            };
            (scale(d.limit), scale(nominal), reset)
        }
        algorithm => {
            // Calendar months and years: the current window may be longer than the nominal.
            let (start, end) = crate::window::window(quota.period(), now);
            let window = nominal.max(end - start);
            let reset = match algorithm {
                Algorithm::SlidingWindowCounter | Algorithm::CountMinSketch => {
                    reset.min(end.saturating_sub(now))
                }
                _ => reset,
            };
            (d.limit, window, reset)
        }
    }
}

/// Microseconds to whole seconds, rounded up.
pub fn secs_ceil(us: Micros) -> u64 {
    us.div_ceil(1_000_000)
}

/// A stack buffer for one header value: at most three `u64`s (20 digits each) and their labels.
struct HeaderBuf {
    buf: [u8; 96],
    ints: itoa::Buffer,
}

impl Default for HeaderBuf {
    fn default() -> Self {
        Self {
            buf: [0; 96],
            ints: itoa::Buffer::new(),
        }
    }
}

impl HeaderBuf {
    fn num(&mut self, n: u64) -> &str {
        self.ints.format(n)
    }

    /// `label1 n1 label2 n2 ...` (labels are short ASCII constants, so this fits and is UTF-8).
    fn join(&mut self, parts: &[(&str, u64)]) -> &str {
        let mut len = 0;
        for (label, n) in parts {
            for piece in [label.as_bytes(), self.ints.format(*n).as_bytes()] {
                self.buf[len..len + piece.len()].copy_from_slice(piece);
                len += piece.len();
            }
        }
        std::str::from_utf8(&self.buf[..len]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;
    use crate::quota::Unit;

    #[test]
    fn denied_headers_carry_retry_after_and_the_ietf_fields() {
        let q = Quota::new(10, Unit::Minute);
        let d = Decision {
            allowed: false,
            limit: 10,
            remaining: 3,
            reset_after: 30 * SECOND + 1,
            retry_after: Some(SECOND / 2),
            delay: 0,
            count: None,
        };
        let h = HeaderValues::new(Some(&q), &d, false, 0);
        let mut map = HeaderMap::new();
        h.insert_into(&mut map);
        let get = |n: &str| map.get(n).unwrap().to_str().unwrap().to_string();
        assert_eq!(get("x-ratelimit-limit"), "10");
        assert_eq!(get("x-ratelimit-remaining"), "0");
        assert_eq!(get("x-ratelimit-reset"), "31");
        assert_eq!(get("ratelimit-policy"), "10;w=60");
        assert_eq!(get("ratelimit"), "limit=10, remaining=0, reset=31");
        assert_eq!(get("retry-after"), "1");
        let allowed = HeaderValues::new(Some(&q), &Decision { allowed: true, ..d }, true, 0);
        assert_eq!(allowed.retry_after_secs, None);
        assert_eq!(allowed.pairs().len(), 5);
    }

    #[test]
    fn each_family_inserts_its_headers_with_the_same_values() {
        let h = HeaderValues {
            limit: 100,
            remaining: 7,
            reset_secs: 42,
            retry_after_secs: Some(3),
            window_secs: 60,
        };
        let all: Vec<(&str, String)> = h.pairs();
        for (families, names) in [
            (HeaderFamilies::Both, &HEADER_NAMES[..]),
            (HeaderFamilies::XRateLimit, &HEADER_NAMES[..3]),
            (HeaderFamilies::Ietf, &HEADER_NAMES[3..5]),
        ] {
            let mut map = HeaderMap::new();
            h.insert_families(&mut map, families);
            // The family's names, and Retry-After whatever the family.
            let mut expected: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            if !expected.contains(&"retry-after") {
                expected.push("retry-after");
            }
            assert_eq!(map.len(), expected.len(), "{families:?}");
            assert_eq!(h.count(families), expected.len(), "{families:?}");
            for (name, value) in &all {
                match map.get(*name) {
                    Some(v) => assert_eq!(v.to_str().unwrap(), value, "{families:?} {name}"),
                    None => assert!(!expected.contains(name), "{families:?} lacks {name}"),
                }
            }
        }
    }
    /// Regression: a leaky bucket of 5/second with a burst of 10 answered `limit 5` with
    /// `remaining 8`. The limit is the capacity in force, and the window the time it takes to
    /// refill.
    #[test]
    fn a_bucket_reports_its_capacity_as_the_limit() {
        use crate::quota::Algorithm;
        let q = Quota::new(5, Unit::Second)
            .with_algorithm(Algorithm::LeakyBucket)
            .with_burst(10);
        let mut state = None;
        for _ in 0..2 {
            let (d, next) = crate::algorithm::step(state.take(), 1_000 * SECOND, 1, &q);
            state = next;
            let h = HeaderValues::new(Some(&q), &d, true, 1_000 * SECOND);
            assert_eq!(h.limit, 10, "{h:?}");
            assert!(h.remaining <= h.limit, "{h:?}");
            assert_eq!(h.window_secs, 2, "{h:?}");
            assert!(h.reset_secs <= h.window_secs, "{h:?}");
        }
    }

    /// Regression: the first request on 100/minute (sliding window counter, the default) 32 s
    /// into the minute answered `reset 88`, more than the window. It is the end of the current
    /// minute, when the counted hits start to fade.
    #[test]
    fn a_sliding_window_counter_resets_within_the_window() {
        let q = Quota::new(100, Unit::Minute);
        let now = 1_000 * 60 * SECOND + 32 * SECOND;
        let (d, _) = crate::algorithm::step(None, now, 1, &q);
        let h = HeaderValues::new(Some(&q), &d, true, now);
        assert_eq!(
            (h.limit, h.remaining, h.reset_secs, h.window_secs),
            (100, 99, 28, 60)
        );
    }

    proptest::proptest! {
        /// Whatever the algorithm, burst and trace: remaining <= limit and reset <= window.
        #[test]
        fn remaining_and_reset_stay_within_the_capacity_in_force(
            alg in proptest::sample::select(crate::quota::Algorithm::ALL.to_vec()),
            limit in 1u64..50,
            burst in proptest::option::of(1u64..80),
            unit in proptest::sample::select(vec![Unit::Second, Unit::Minute, Unit::Hour, Unit::Month]),
            steps in proptest::collection::vec((0u64..5_000_000, 0u64..4), 1..60),
        ) {
            let q = Quota::new(limit, unit).with_algorithm(alg).with_burst(burst);
            let mut state = None;
            let mut now = 1_795_305_600 * SECOND;
            for (gap, cost) in steps {
                now += gap * unit.nominal() / 10_000_000;
                let (d, next) = crate::algorithm::step(state.take(), now, cost, &q);
                state = next;
                for allowed in [true, false] {
                    let h = HeaderValues::new(Some(&q), &d, allowed, now);
                    proptest::prop_assert!(h.remaining <= h.limit, "{:?} {:?}", h, d);
                    proptest::prop_assert!(h.reset_secs <= h.window_secs, "{:?} {:?}", h, d);
                }
            }
        }
    }
}
