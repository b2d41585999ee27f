//! GCRA keyed check against `governor`, timed in **paired, interleaved rounds**: the figure for
//! the "no slower than governor" target on a host whose speed drifts.
//!
//! Criterion times one benchmark for seconds, then the next; on a shared VM the machine's speed
//! changes between them (the same bench repeats at ±30 % and more), so two medians taken minutes
//! apart compare two machines. Here both limiters run alternately in short batches (same
//! workloads, keys and quotas as `benches/core.rs`, through `support`), each round timing one
//! batch of each in alternating order, and the figure is the median over rounds of the per-round
//! ratio: drift that lasts longer than a round cancels out.
//!
//! ```sh
//! cargo run --release -p tollgate-core --example versus            # 200 rounds of 20,000 checks
//! cargo run --release -p tollgate-core --example versus -- 400 10000
//! ```
//!
//! Rows: `equal work` = governor on its `FakeRelativeClock` against tollgate with time passed in
//! (neither reads a clock); `as shipped` = governor's default clock against tollgate reading
//! [`SystemClock`] per check.

#[path = "../benches/support/mod.rs"]
mod support;
use governor::clock::{Clock as GClock, DefaultClock, FakeRelativeClock};
use governor::RateLimiter;
use std::hint::black_box;
use std::time::Instant;
use support::{check, gcra_quota, governor_quota, keys, Governor, BASE};
use tollgate_core::{Clock, MemoryStore, Quota, SystemClock};

/// One side of a pair: runs `n` checks continuing where the previous batch stopped.
trait Side {
    fn batch(&mut self, n: usize);
}

struct Ours<'a> {
    store: MemoryStore,
    quota: Quota,
    keys: &'a [String],
    i: usize,
    /// `Some`: tollgate's own time line (1 µs per check); `None`: read `SystemClock`.
    now: Option<u64>,
}

impl Side for Ours<'_> {
    fn batch(&mut self, n: usize) {
        for _ in 0..n {
            let now = match &mut self.now {
                Some(t) => {
                    *t += 1;
                    *t
                }
                None => SystemClock.now(),
            };
            black_box(check(&self.store, &self.quota, &self.keys[self.i], now));
            self.i += 1;
            if self.i == self.keys.len() {
                self.i = 0;
            }
        }
    }
}

struct Theirs<'a, C: GClock> {
    lim: Governor<C>,
    keys: &'a [String],
    i: usize,
}

impl<C: GClock> Side for Theirs<'_, C> {
    fn batch(&mut self, n: usize) {
        for _ in 0..n {
            black_box(self.lim.check_key(&self.keys[self.i]).is_ok());
            self.i += 1;
            if self.i == self.keys.len() {
                self.i = 0;
            }
        }
    }
}

/// One timed batch of `n`, after an untimed pass of `warm` checks (one full cycle over the keys)
/// that brings this side's state back into cache after the other side's batch evicted it: each
/// batch then times a limiter in the steady state it has running alone, as in the criterion
/// bench.
fn ns_per_check(side: &mut dyn Side, warm: usize, n: usize) -> f64 {
    side.batch(warm);
    let t = Instant::now();
    side.batch(n);
    t.elapsed().as_nanos() as f64 / n as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn quartiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 4], v[v.len() * 3 / 4])
}

/// `rounds` rounds of one batch each, order alternating; prints one row.
fn pair(
    label: &str,
    ours: &mut dyn Side,
    theirs: &mut dyn Side,
    keys: usize,
    rounds: usize,
    batch: usize,
) {
    let warm = keys.max(1_000);
    // Warm up: every key seen by both, caches and branch predictors settled.
    ours.batch(batch.max(100_000));
    theirs.batch(batch.max(100_000));
    let (mut a, mut b, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (x, y) = if r % 2 == 0 {
            let x = ns_per_check(ours, warm, batch);
            (x, ns_per_check(theirs, warm, batch))
        } else {
            let y = ns_per_check(theirs, warm, batch);
            (ns_per_check(ours, warm, batch), y)
        };
        a.push(x);
        b.push(y);
        ratio.push(x / y);
    }
    let wins = ratio.iter().filter(|&&r| r <= 1.0).count();
    let (q1, q3) = quartiles(&mut ratio);
    println!(
        "{label:<34} {:>8.1} {:>8.1} {:>7.2} {:>6.2}-{:<6.2} {:>5.0}%",
        median(&mut a),
        median(&mut b),
        median(&mut ratio),
        q1,
        q3,
        100.0 * wins as f64 / rounds as f64
    );
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: versus [rounds] [batch]"))
        .collect();
    let rounds = args.first().copied().unwrap_or(200);
    let batch = args.get(1).copied().unwrap_or(20_000);
    println!("{rounds} rounds x {batch} checks each side; ns per check (medians), ratio = tollgate / governor per round");
    println!(
        "{:<34} {:>8} {:>8} {:>7} {:>13} {:>6}",
        "workload", "gcra", "governor", "ratio", "ratio IQR", "wins"
    );
    for (name, n) in [("single_key", 1), ("keys_100k", 100_000)] {
        let ks = keys(n);
        for admit in [true, false] {
            let load = if admit { "admit" } else { "deny" };
            let ours = |now| Ours {
                store: MemoryStore::with_seed(1 << 22, 1, 2),
                quota: gcra_quota(admit),
                keys: &ks,
                i: 0,
                now,
            };
            let mut theirs = Theirs {
                lim: RateLimiter::dashmap_with_clock(
                    governor_quota(admit),
                    FakeRelativeClock::default(),
                ),
                keys: &ks,
                i: 0,
            };
            let label = format!("{name}/{load} (equal work)");
            pair(&label, &mut ours(Some(BASE)), &mut theirs, n, rounds, batch);
            let mut shipped: Theirs<DefaultClock> = Theirs {
                lim: RateLimiter::keyed(governor_quota(admit)),
                keys: &ks,
                i: 0,
            };
            let label = format!("{name}/{load} (as shipped)");
            pair(&label, &mut ours(None), &mut shipped, n, rounds, batch);
        }
    }
}
