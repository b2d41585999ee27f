//! Shares of one limit divided between clients by their demand, for a quota server (Envoy's
//! Rate Limit Quota Service): each client enforces its share locally as a token bucket and
//! reports what it was asked for; the server divides the limit again.
//!
//! Pure: time is a parameter (µs, from the caller's [`crate::Clock`]), nothing here reads a
//! clock or does I/O.
//!
//! - [`max_min`] divides a limit between demands, max-min fair (water filling): nobody gets
//!   more than it asks while another gets less than it asks, and what the satisfied leave is
//!   lent to everyone equally; the shares never add up to more than the limit.
//! - [`Demands`] keeps each client's latest demand of one bucket, measured from its reports
//!   (requests allowed + denied over the time between two reports, by the caller's clock), and
//!   gives the shares of a limit between them. A client whose demand is not known yet (its
//!   first report) asks for the whole limit: it gets an equal share at once.
//! - [`TokenBucketShare::of`] turns a share (requests per period) into the token bucket a
//!   client applies: the share every period (whole seconds, at least 1 s: Envoy does not limit
//!   with a shorter fill interval), at most one second of it held at once.

use crate::Micros;
use std::collections::BTreeMap;

const MICROS_PER_SEC: u64 = 1_000_000;

/// The max-min fair division of `limit` between `demands` (same order). `None` is a demand not
/// known yet, taken as the whole limit.
///
/// Water filling: the demands are served smallest first, each getting at most an equal part of
/// what is left; when the smallest unserved demand is more than that part, every unserved one
/// gets the part (what the division leaves over goes one each to the largest demands). What is
/// left when every demand is met is lent: spread equally over all clients, so a client whose
/// load grows has room before the next division. The sum of the shares is at most `limit`
/// (exactly `limit` when there is at least one client).
pub fn max_min(limit: u64, demands: &[Option<u64>]) -> Vec<u64> {
    let n = demands.len();
    let mut shares = vec![0u64; n];
    if n == 0 {
        return shares;
    }
    let wants: Vec<u64> = demands.iter().map(|d| d.unwrap_or(limit)).collect();
    // Smallest demand first; ties by position, so the result does not depend on sort stability.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (wants[i], i));
    let mut left = limit;
    let mut next = 0;
    while next < n {
        let unserved = (n - next) as u64;
        let part = left / unserved;
        let i = order[next];
        if wants[i] <= part {
            shares[i] = wants[i];
            left -= wants[i];
            next += 1;
            continue;
        }
        // Every demand from here on is more than an equal part: each gets the part, and the
        // remainder of the division goes to the largest demands.
        let mut extra = left % unserved;
        for &j in order[next..].iter().rev() {
            shares[j] = part + u64::from(extra > 0);
            extra = extra.saturating_sub(1);
        }
        left = 0;
        break;
    }
    if left > 0 {
        // Every demand is met: lend the rest equally (remainder to the first clients).
        let each = left / n as u64;
        let extra = left % n as u64;
        for (k, share) in shares.iter_mut().enumerate() {
            *share += each + u64::from((k as u64) < extra);
        }
    }
    shares
}

/// A token bucket that admits at most a given share (requests per period): `tokens_per_fill`
/// tokens every `fill_interval_secs` seconds (filled continuously at that rate, as Envoy's
/// token buckets are), at most `max_tokens` held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketShare {
    /// The bucket's size, and what it holds when a client starts it: one second of the share
    /// (at least 1 token).
    pub max_tokens: u32,
    /// Tokens per fill: the share itself.
    pub tokens_per_fill: u32,
    /// Seconds between fills: the limit's period in whole seconds (at least 1).
    pub fill_interval_secs: u64,
}

impl TokenBucketShare {
    /// The bucket for a share of `share` requests per `period` µs, or `None` for a share of 0
    /// (or a period of 0): the client admits nothing.
    ///
    /// The fill interval is the period itself (rounded up to whole seconds), the same for every
    /// share of a limit: a client's bucket changes with its share through `tokens_per_fill` and
    /// `max_tokens` only (Envoy keeps a token bucket whose interval alone changed). The rate is
    /// then at most the share, with no rounding when the period is whole seconds. Over any
    /// time `t` a client holding this bucket admits at most `max_tokens + share × t / period`.
    pub fn of(share: u64, period: Micros) -> Option<TokenBucketShare> {
        if share == 0 || period == 0 {
            return None;
        }
        let secs = period.div_ceil(MICROS_PER_SEC).max(1);
        let clamp = |v: u128| v.clamp(1, u128::from(u32::MAX)) as u32;
        let one_second =
            (u128::from(share) * u128::from(MICROS_PER_SEC)).div_ceil(u128::from(period));
        Some(TokenBucketShare {
            max_tokens: clamp(one_second),
            tokens_per_fill: clamp(u128::from(share)),
            fill_interval_secs: secs,
        })
    }

    /// The bucket's rate in requests per `period` µs (rounded down).
    pub fn per_period(&self, period: Micros) -> u64 {
        let r = u128::from(self.tokens_per_fill) * u128::from(period)
            / (u128::from(self.fill_interval_secs.max(1)) * u128::from(MICROS_PER_SEC));
        u64::try_from(r).unwrap_or(u64::MAX)
    }
}

/// One client's demand on a bucket, from its reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Demand {
    /// When its previous report came (µs).
    last_report: Micros,
    /// Requests per period it asked for between its last two reports; `None` until it has
    /// reported twice (the first report covers an unknown time).
    per_period: Option<u64>,
}

/// The clients of one bucket and their latest demands, keyed by a client id `C`.
#[derive(Debug, Clone)]
pub struct Demands<C> {
    clients: BTreeMap<C, Demand>,
}

impl<C> Default for Demands<C> {
    fn default() -> Self {
        Demands {
            clients: BTreeMap::new(),
        }
    }
}

impl<C: Ord + Clone> Demands<C> {
    /// A bucket with no client.
    pub fn new() -> Self {
        Self::default()
    }

    /// `client` reported `requests` (allowed + denied) at `now`, for a limit over `period` µs.
    /// Its demand becomes those requests over the time since its previous report (a first
    /// report only starts the measurement: the client's demand is unknown until the next).
    /// Returns whether the client is new to the bucket.
    pub fn report(&mut self, client: &C, now: Micros, requests: u64, period: Micros) -> bool {
        match self.clients.get_mut(client) {
            None => {
                self.clients.insert(
                    client.clone(),
                    Demand {
                        last_report: now,
                        per_period: None,
                    },
                );
                true
            }
            Some(d) => {
                let elapsed = now.saturating_sub(d.last_report);
                // Two reports in the same instant tell nothing of the rate: keep the last one.
                if elapsed > 0 {
                    let rate = u128::from(requests) * u128::from(period) / u128::from(elapsed);
                    d.per_period = Some(u64::try_from(rate).unwrap_or(u64::MAX));
                    d.last_report = now;
                }
                false
            }
        }
    }

    /// Forget `client` (its stream ended, or it stopped reporting the bucket). Returns whether
    /// it was there.
    pub fn remove(&mut self, client: &C) -> bool {
        self.clients.remove(client).is_some()
    }

    /// Forget the clients that have not reported since `before` (µs); returns how many went.
    pub fn expire(&mut self, before: Micros) -> usize {
        let n = self.clients.len();
        self.clients.retain(|_, d| d.last_report >= before);
        n - self.clients.len()
    }

    /// The clients that have not reported since `before` (µs).
    pub fn quiet_since(&self, before: Micros) -> Vec<C> {
        self.clients
            .iter()
            .filter(|(_, d)| d.last_report < before)
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// How many clients report the bucket.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether no client reports the bucket.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// A client's demand in requests per period (`None`: not known yet, or not a client).
    pub fn demand(&self, client: &C) -> Option<u64> {
        self.clients.get(client).and_then(|d| d.per_period)
    }

    /// The sum of the known demands, in requests per period.
    pub fn total_demand(&self) -> u64 {
        self.clients
            .values()
            .filter_map(|d| d.per_period)
            .fold(0u64, u64::saturating_add)
    }

    /// Each client's share of `limit` ([`max_min`] over their demands), in client order.
    pub fn shares(&self, limit: u64) -> Vec<(C, u64)> {
        let demands: Vec<Option<u64>> = self.clients.values().map(|d| d.per_period).collect();
        self.clients
            .keys()
            .cloned()
            .zip(max_min(limit, &demands))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Micros = 1_000_000;

    #[test]
    fn equal_demands_split_equally_and_small_ones_are_met() {
        assert_eq!(max_min(100, &[Some(80), Some(80)]), vec![50, 50]);
        // 10 is met, the other two share the rest.
        assert_eq!(
            max_min(100, &[Some(10), Some(80), Some(80)]),
            vec![10, 45, 45]
        );
        // Everyone met: the 40 left are lent, 20 each.
        assert_eq!(max_min(100, &[Some(10), Some(50)]), vec![30, 70]);
        assert_eq!(max_min(100, &[]), Vec::<u64>::new());
        assert_eq!(max_min(0, &[Some(5), None]), vec![0, 0]);
    }

    #[test]
    fn a_newcomer_gets_an_equal_share_at_once() {
        assert_eq!(max_min(100, &[Some(90), None]), vec![50, 50]);
        assert_eq!(max_min(90, &[Some(10), None, None]), vec![10, 40, 40]);
    }

    #[test]
    fn the_remainder_of_a_division_goes_to_the_largest() {
        let s = max_min(100, &[Some(200), Some(300), Some(400)]);
        assert_eq!(s.iter().sum::<u64>(), 100);
        assert_eq!(s, vec![33, 33, 34]);
    }

    #[test]
    fn token_buckets_never_exceed_the_share() {
        // 100 per second: 100 tokens every second, at most 100 held.
        let b = TokenBucketShare::of(100, SEC).unwrap();
        assert_eq!(
            (b.max_tokens, b.tokens_per_fill, b.fill_interval_secs),
            (100, 100, 1)
        );
        // 3,000 a minute: 3,000 every 60 s, at most one second's worth (50) held.
        let b = TokenBucketShare::of(3_000, 60 * SEC).unwrap();
        assert_eq!(
            (b.max_tokens, b.tokens_per_fill, b.fill_interval_secs),
            (50, 3_000, 60)
        );
        // 10 an hour: 10 every 3,600 s, at least one token held.
        let b = TokenBucketShare::of(10, 3_600 * SEC).unwrap();
        assert_eq!(
            (b.max_tokens, b.tokens_per_fill, b.fill_interval_secs),
            (1, 10, 3_600)
        );
        assert_eq!(b.per_period(3_600 * SEC), 10);
        assert_eq!(TokenBucketShare::of(0, SEC), None);
    }

    #[test]
    fn demand_is_measured_between_reports() {
        let mut d: Demands<u32> = Demands::new();
        assert!(d.report(&1, 0, 40, SEC));
        assert_eq!(d.demand(&1), None);
        assert!(!d.report(&1, 5 * SEC, 500, SEC));
        assert_eq!(d.demand(&1), Some(100));
        assert!(d.report(&2, 5 * SEC, 3, SEC));
        // The newcomer asks for everything until its demand is known: an equal share.
        assert_eq!(d.shares(100), vec![(1, 50), (2, 50)]);
        d.report(&2, 10 * SEC, 50, SEC);
        assert_eq!(d.shares(100), vec![(1, 90), (2, 10)]);
        assert_eq!(d.expire(6 * SEC), 1);
        assert_eq!(d.shares(100), vec![(2, 100)]);
        assert!(d.remove(&2));
        assert!(d.is_empty());
    }

    fn demands() -> impl Strategy<Value = (u64, Vec<Option<u64>>)> {
        (
            0u64..100_000,
            prop::collection::vec(prop::option::weighted(0.9, 0u64..200_000), 0..12),
        )
    }

    proptest! {
        /// The shares never add up to more than the limit, and to exactly the limit when there
        /// is a client.
        #[test]
        fn shares_add_up_to_the_limit((limit, d) in demands()) {
            let s = max_min(limit, &d);
            let sum: u64 = s.iter().sum();
            prop_assert!(sum <= limit);
            if !d.is_empty() {
                prop_assert_eq!(sum, limit);
            }
        }

        /// Max-min fairness: a client that gets less than it asks gets at least as much as any
        /// other client, less one (the remainder of an integer division), and no client gets
        /// more than it asks while another is short (beyond the lent rest, which only exists
        /// when nobody is short).
        #[test]
        fn shares_are_max_min_fair((limit, d) in demands()) {
            let s = max_min(limit, &d);
            let wants: Vec<u64> = d.iter().map(|x| x.unwrap_or(limit)).collect();
            let short: Vec<usize> = (0..s.len()).filter(|&i| s[i] < wants[i]).collect();
            for &i in &short {
                for j in 0..s.len() {
                    prop_assert!(s[i] + 1 >= s[j], "{:?} -> {:?}", d, s);
                }
            }
            if !short.is_empty() {
                for j in 0..s.len() {
                    prop_assert!(s[j] <= wants[j], "{:?} -> {:?}", d, s);
                }
            }
        }

        /// A token bucket admits no more than its share per period, exactly its share when the
        /// period is whole seconds; its interval depends on the period alone.
        #[test]
        fn token_bucket_rate_is_the_share(share in 1u64..10_000_000, micros in 1u64..86_400_000_000) {
            let b = TokenBucketShare::of(share, micros).unwrap();
            prop_assert!(b.fill_interval_secs >= 1);
            prop_assert!(b.max_tokens >= 1);
            prop_assert!(b.per_period(micros) <= share);
            prop_assert_eq!(b.fill_interval_secs, TokenBucketShare::of(1, micros).unwrap().fill_interval_secs);
            if micros % SEC == 0 {
                prop_assert_eq!(b.per_period(micros), share);
            }
        }
    }
}
