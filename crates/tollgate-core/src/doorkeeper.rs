//! The doorkeeper: a Bloom filter per window in front of a limit's counters, so that a key seen
//! once in a window costs a few bits instead of a counter (the memory store's key table, or the
//! cells of a count-min sketch).
//!
//! **What it records.** A key's first request of cost 1 in a window that the limit admits is
//! recorded only as the key's bits in the current generation of the filter (it is "held
//! back"); no counter is created. Two generations are kept, the current window's and the
//! previous one's, rotated at the limit's window boundaries (the same aligned windows its
//! algorithm counts in, from the injected clock: no timer, no clock read).
//!
//! **Why it is exact.** For the windowed algorithms, the state a key would have after such
//! held-back requests is a function of two bits: "seen in the current window" and "seen in the
//! previous one" ([`prior`]). When the key comes back without a counter, that state is rebuilt
//! from the filter and stepped as the exact store would step it; so every decision is the exact
//! store's, as long as the filter tells the truth.
//!
//! **How it errs.** A Bloom filter never forgets a key it holds (no false negatives), so a real
//! first request is always counted. It may say "seen" for a key it does not hold (a false
//! positive, at a rate of about `fill ^ k`): the rebuilt state then counts one request that
//! never happened. So the doorkeeper errs on the strict side only: a key may be admitted one
//! request fewer in a window than the exact store would admit (with a limit of 1, its first
//! request may be denied), with the false-positive probability; it is never admitted more.
//!
//! Bit positions come from the store's keyed 128-bit key fingerprint (Kirsch–Mitzenmacher
//! double hashing), so a client cannot aim at another client's bits.

use crate::algorithm::sliding_counter::roll;
use crate::algorithm::{Counter, State, Window};
use crate::clock::Micros;
use crate::quota::{Algorithm, Doorkeeper, Quota};

/// A Bloom filter of `m` bits with `k` hash functions.
#[derive(Debug, Clone)]
pub(crate) struct Bloom {
    words: Vec<u64>,
    k: u32,
    /// Bits set.
    ones: u64,
}

/// The two base hashes of a key fingerprint: the first as it is, the second mixed from both
/// words and odd (so that the `k` probes are distinct modulo a power of two too).
#[inline]
fn bases(hash: u128) -> (u64, u64) {
    let hi = (hash >> 64) as u64;
    let lo = hash as u64;
    let h2 = (lo ^ hi.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (hi, (h2 ^ h2 >> 31) | 1)
}

impl Bloom {
    /// An empty filter of `bits` bits (rounded up to whole words, at least one) and `k` hashes.
    pub(crate) fn new(bits: u64, k: u32) -> Self {
        let words = usize::try_from(bits.div_ceil(64).max(1)).unwrap_or(usize::MAX);
        Self {
            words: vec![0; words],
            k: k.max(1),
            ones: 0,
        }
    }

    fn bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    #[inline]
    fn probes(&self, hash: u128) -> impl Iterator<Item = u64> {
        let (h1, h2) = bases(hash);
        let m = self.bits();
        (0..u64::from(self.k)).map(move |i| {
            let h = h1.wrapping_add(i.wrapping_mul(h2));
            // Lemire's multiply-shift: uniform over [0, m) without a division.
            ((u128::from(h) * u128::from(m)) >> 64) as u64
        })
    }

    /// Whether the key with fingerprint `hash` may have been inserted (never false for one that
    /// was).
    pub(crate) fn contains(&self, hash: u128) -> bool {
        self.probes(hash)
            .all(|b| self.words[(b / 64) as usize] & 1 << (b % 64) != 0)
    }

    /// Insert the key; returns whether it was (maybe) there already.
    pub(crate) fn insert(&mut self, hash: u128) -> bool {
        let mut present = true;
        for b in self.probes(hash) {
            let w = &mut self.words[(b / 64) as usize];
            let bit = 1 << (b % 64);
            if *w & bit == 0 {
                *w |= bit;
                self.ones += 1;
                present = false;
            }
        }
        present
    }

    fn clear(&mut self) {
        if self.ones > 0 {
            self.words.fill(0);
            self.ones = 0;
        }
    }

    /// Share of bits set.
    pub(crate) fn fill(&self) -> f64 {
        self.ones as f64 / self.bits() as f64
    }

    /// The false-positive rate at the current fill: `fill ^ k`.
    pub(crate) fn fp_estimate(&self) -> f64 {
        self.fill().powi(self.k as i32)
    }

    /// Bytes held.
    pub(crate) fn memory(&self) -> usize {
        self.words.len() * 8
    }
}

/// What the doorkeeper knows of a key: whether it was seen in the previous and the current
/// window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Seen {
    pub prev: bool,
    pub cur: bool,
}

impl Seen {
    /// (seen in the previous window, seen in the current one), as the sketch takes them.
    pub(crate) fn pair(self) -> (bool, bool) {
        (self.prev, self.cur)
    }
}

/// A limit's doorkeeper: two generations of a Bloom filter over its aligned windows.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    /// Start of the current generation's window (`None` until the first request).
    start: Option<Micros>,
    prev: Bloom,
    cur: Bloom,
    /// Requests held back (recorded only in the filter) so far.
    held_back: u64,
}

/// A snapshot of a doorkeeper for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct DoorkeeperStats {
    /// Requests recorded only in the filter (no counter created) so far.
    pub held_back: u64,
    /// Share of the current generation's bits set.
    pub fill_ratio: f64,
    /// The current generation's false-positive rate as its fill implies (`fill ^ k`).
    pub fp_estimate: f64,
    /// Bytes both generations hold.
    pub bytes: usize,
}

impl Gate {
    pub(crate) fn new(size: Doorkeeper) -> Self {
        Self {
            start: None,
            prev: Bloom::new(size.bits(), size.hashes()),
            cur: Bloom::new(size.bits(), size.hashes()),
            held_back: 0,
        }
    }

    /// Rotate the generations to `now`'s window (as the windowed algorithms roll theirs: a
    /// clock that went back stays in the current window). Returns the start of the window the
    /// current generation covers.
    pub(crate) fn rotate(&mut self, now: Micros, quota: &Quota) -> Micros {
        let (_, ws, _, p, c) = roll(quota.period(), self.start, 1, 1, now);
        match (p, c) {
            (1, 1) => {}
            (1, 0) => {
                std::mem::swap(&mut self.prev, &mut self.cur);
                self.cur.clear();
            }
            _ => {
                self.prev.clear();
                self.cur.clear();
            }
        }
        self.start = Some(ws);
        ws
    }

    /// What the filter says of the key (call [`Gate::rotate`] first).
    pub(crate) fn seen(&self, hash: u128) -> Seen {
        Seen {
            prev: self.prev.contains(hash),
            cur: self.cur.contains(hash),
        }
    }

    /// Hold back a request of the key: record it in the current window only.
    pub(crate) fn hold_back(&mut self, hash: u128) {
        self.cur.insert(hash);
        self.held_back += 1;
    }

    pub(crate) fn stats(&self) -> DoorkeeperStats {
        DoorkeeperStats {
            held_back: self.held_back,
            fill_ratio: self.cur.fill(),
            fp_estimate: self.cur.fp_estimate(),
            bytes: self.prev.memory() + self.cur.memory(),
        }
    }
}

/// Whether a request is one the doorkeeper holds back: cost 1, admitted, and the key's first in
/// the window (as far as the filter knows).
pub(crate) fn holds_back(seen: Seen, cost: u64, allowed: bool) -> bool {
    cost == 1 && allowed && !seen.cur
}

/// The state a key without a counter has, given what the filter saw of it, for a windowed
/// algorithm whose current window starts at `start`: what its held-back requests (one per
/// window at most) left. `None`: nothing counted.
pub(crate) fn prior(seen: Seen, start: Micros, quota: &Quota) -> Option<State> {
    let (prev, cur) = (u64::from(seen.prev), u64::from(seen.cur));
    match quota.algorithm() {
        Algorithm::FixedWindow => seen
            .cur
            .then_some(State::Window(Window { start, count: 1 })),
        Algorithm::SlidingWindowCounter => {
            (seen.prev || seen.cur).then_some(State::Counter(Counter { start, prev, cur }))
        }
        // Not taken by rules (`Algorithm::takes_doorkeeper`); the count-min sketch adds the bits
        // to its estimates itself.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm;
    use crate::clock::SECOND;
    use crate::quota::Unit;
    use proptest::prelude::*;

    #[test]
    fn sizing_follows_the_formulas() {
        let d = Doorkeeper::new(10_000_000, 0.01).unwrap();
        // 9.585 bits per key, 7 hashes.
        assert_eq!(d.bits(), 95_850_624);
        assert_eq!(d.hashes(), 7);
        assert!(Doorkeeper::new(0, 0.01).is_err());
        assert!(Doorkeeper::new(10, 0.0).is_err());
        assert!(Doorkeeper::new(10, 0.9).is_err());
        assert!(Doorkeeper::new(1 << 29, 0.1).is_err());
    }

    #[test]
    fn measured_false_positive_rate_is_near_the_target_at_the_design_load() {
        let d = Doorkeeper::new(100_000, 0.01).unwrap();
        let mut b = Bloom::new(d.bits(), d.hashes());
        let key = |i: u64| crate::fingerprint::sip13_128(1, 2, &i.to_le_bytes());
        for i in 0..100_000 {
            b.insert(key(i));
        }
        let fp = (100_000..300_000).filter(|&i| b.contains(key(i))).count() as f64 / 200_000.0;
        assert!(fp < 0.015, "measured {fp}");
        assert!(
            (b.fp_estimate() - 0.01).abs() < 0.003,
            "{}",
            b.fp_estimate()
        );
        assert!((b.fill() - 0.5).abs() < 0.02, "{}", b.fill());
    }

    #[test]
    fn generations_rotate_at_window_boundaries() {
        let q = Quota::new(5, Unit::Second).with_doorkeeper(Doorkeeper::new(100, 0.01).ok());
        let mut g = Gate::new(q.doorkeeper().unwrap());
        assert_eq!(g.rotate(10 * SECOND + 5, &q), 10 * SECOND);
        g.hold_back(42);
        assert_eq!(
            g.seen(42),
            Seen {
                prev: false,
                cur: true
            }
        );
        g.rotate(11 * SECOND, &q);
        assert_eq!(
            g.seen(42),
            Seen {
                prev: true,
                cur: false
            }
        );
        // A clock that went back stays in the current window.
        assert_eq!(g.rotate(10 * SECOND, &q), 11 * SECOND);
        assert_eq!(
            g.seen(42),
            Seen {
                prev: true,
                cur: false
            }
        );
        g.rotate(13 * SECOND, &q);
        assert_eq!(g.seen(42), Seen::default());
        assert_eq!(g.stats().held_back, 1);
    }

    #[test]
    fn prior_is_what_the_exact_step_leaves_after_one_request() {
        for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
            let q = Quota::new(3, Unit::Minute).with_algorithm(alg);
            let t0 = 60 * SECOND * 7 + 5;
            let (_, s) = algorithm::step(None, t0, 1, &q);
            let seen = Seen {
                prev: false,
                cur: true,
            };
            assert_eq!(prior(seen, 60 * SECOND * 7, &q), s, "{alg}");
            // A window later.
            let t1 = t0 + 60 * SECOND;
            let (d_exact, _) = algorithm::step(s.clone(), t1, 1, &q);
            let seen = Seen {
                prev: true,
                cur: false,
            };
            let (d, _) = algorithm::step(prior(seen, 60 * SECOND * 8, &q), t1, 1, &q);
            assert_eq!(d, d_exact, "{alg}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// No false negatives; the count of set bits matches the words.
        #[test]
        fn never_forgets_and_counts_its_bits(
            keys in proptest::collection::vec(any::<u128>(), 0..300),
            bits in 64u64..4096,
            k in 1u32..12,
        ) {
            let mut b = Bloom::new(bits, k);
            for &h in &keys {
                b.insert(h);
                prop_assert!(b.contains(h));
            }
            for &h in &keys {
                prop_assert!(b.contains(h));
            }
            let ones: u64 = b.words.iter().map(|w| u64::from(w.count_ones())).sum();
            prop_assert_eq!(ones, b.ones);
            prop_assert!(b.fill() <= 1.0);
            // Inserting again changes nothing and reports presence.
            for &h in &keys {
                prop_assert!(b.insert(h));
            }
            prop_assert_eq!(ones, b.ones);
            b.clear();
            prop_assert_eq!(b.ones, 0);
            prop_assert!(b.words.iter().all(|w| *w == 0));
        }
    }
}
