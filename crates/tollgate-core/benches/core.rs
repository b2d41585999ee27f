//! Side-by-side benchmarks: every tollgate algorithm through `MemoryStore::check` (one item)
//! against `governor`'s keyed limiter, on the same workloads, plus the pure `internals::step`.
//!
//! Workloads:
//! - `single_key`: one key; `keys_100k`: 100,000 pre-generated key strings cycled in order;
//!   `threads_2_*`: two threads on the same store / limiter.
//! - `admit`: a quota so large everything passes; `deny`: 1 per hour, so after the first
//!   request of a key everything is denied.
//!
//! Time: tollgate takes `now` from the caller; here it is a counter advanced by 1 µs per check
//! (no clock read). governor reads its own default clock (quanta) on every check: that is part of
//! its measured cost (a few ns); `governor_fake_clock` is the same limiter on governor's
//! `FakeRelativeClock` (an atomic load per check), which is the equal-work comparison.
//! Keys: tollgate hashes the `&str` key (SipHash-1-3, 128 bit); governor is a keyed limiter over
//! `String` keys (`RateLimiter::keyed`, a `DashMap` with std `RandomState`, SipHash-1-3, 64 bit)
//! checked with `&String`, so both hash the same key bytes per check and neither allocates a key
//! on the hot path (governor clones the `String` only when it inserts a new key).

mod support;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::clock::{Clock as GClock, FakeRelativeClock};
use governor::RateLimiter;
use std::hint::black_box;
use std::time::{Duration, Instant};
use support::{check, keys, Governor, BASE};
use tollgate_core::internals::{self, State};
use tollgate_core::{Algorithm, Clock, MemoryStore, Micros, Quota, SystemClock, Unit};

const KEYS: usize = 100_000;

#[derive(Clone, Copy)]
enum Load {
    Admit,
    Deny,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Admit => "admit",
            Load::Deny => "deny",
        }
    }
}

/// Our quota and the time step per check for `alg` under `load`.
fn quota(alg: Algorithm, load: Load) -> (Quota, Micros) {
    match (load, alg) {
        // The sliding log keeps one entry per admitted request in the window (and sums it on
        // every check), so "everything passes" is modelled with a realistic small limit that the
        // request rate stays under: 64 per second, one request per 20 ms.
        (Load::Admit, Algorithm::SlidingWindowLog) => {
            (Quota::new(64, Unit::Second).with_algorithm(alg), 20_000)
        }
        // The same quotas as GCRA's (`support::gcra_quota`), with `alg`.
        (load, _) => (
            support::gcra_quota(matches!(load, Load::Admit)).with_algorithm(alg),
            1,
        ),
    }
}

fn run_governor<C: GClock>(lim: &Governor<C>, keys: &[String], offset: usize, iters: u64) {
    let mut i = offset % keys.len();
    for _ in 0..iters {
        black_box(lim.check_key(&keys[i]).is_ok());
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
}

/// `threads` threads each doing `iters` checks concurrently; reports wall time (so ns/op is the
/// time of one check while the other thread is checking too).
fn in_threads(threads: usize, iters: u64, f: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || f(t, iters));
        }
    });
    start.elapsed()
}

fn store_benches(c: &mut Criterion) {
    let many = keys(KEYS);
    let one = keys(1);
    let cases: [(&str, &[String], usize); 4] = [
        ("single_key", &one, 1),
        ("keys_100k", &many, 1),
        ("threads_2_single_key", &one, 2),
        ("threads_2_keys_100k", &many, 2),
    ];
    for (name, keys, threads) in cases {
        for load in [Load::Admit, Load::Deny] {
            if threads > 1 && matches!(load, Load::Deny) {
                continue;
            }
            let mut g = c.benchmark_group(format!("{name}/{}", load.name()));
            // As shipped: `RateLimiter::keyed` reads its default clock (std `Instant`) per check.
            let lim: Governor<_> =
                RateLimiter::keyed(support::governor_quota(matches!(load, Load::Admit)));
            g.bench_function("governor", |b| {
                b.iter_custom(|iters| {
                    in_threads(threads, iters, |t, n| {
                        run_governor(&lim, keys, t * keys.len() / threads, n)
                    })
                })
            });
            // Equal work: time from a `FakeRelativeClock` (an atomic load), like our counter.
            let fake: Governor<FakeRelativeClock> = RateLimiter::dashmap_with_clock(
                support::governor_quota(matches!(load, Load::Admit)),
                FakeRelativeClock::default(),
            );
            g.bench_function("governor_fake_clock", |b| {
                b.iter_custom(|iters| {
                    in_threads(threads, iters, |t, n| {
                        run_governor(&fake, keys, t * keys.len() / threads, n)
                    })
                })
            });
            for alg in Algorithm::ALL {
                let (q, dt) = quota(alg, load);
                let store = MemoryStore::with_seed(1 << 22, 1, 2);
                g.bench_with_input(BenchmarkId::from_parameter(alg), &q, |b, q| {
                    // Each sample continues the time line where the previous one stopped.
                    let mut done = 0u64;
                    b.iter_custom(|iters| {
                        let el = in_threads(threads, iters, |t, n| {
                            // Every thread starts from the same instant (times interleave).
                            run_ours(&store, q, dt, keys, t * keys.len() / threads, n, done * dt)
                        });
                        done += iters;
                        el
                    })
                });
                if alg == Algorithm::Gcra {
                    // Equal work with governor as shipped: read the real clock on every check.
                    let fresh = MemoryStore::with_seed(1 << 22, 1, 2);
                    g.bench_with_input("gcra_system_clock", &q, |b, q| {
                        b.iter_custom(|iters| {
                            in_threads(threads, iters, |t, n| {
                                run_ours_clock(&fresh, q, keys, t * keys.len() / threads, n)
                            })
                        })
                    });
                }
            }
            g.finish();
        }
    }
}

/// Like [`run_ours`] but with time from [`SystemClock`] on every check.
fn run_ours_clock(store: &MemoryStore, q: &Quota, keys: &[String], offset: usize, iters: u64) {
    let clock = SystemClock;
    let mut i = offset % keys.len();
    for _ in 0..iters {
        black_box(check(store, q, &keys[i], clock.now()));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
}

/// One thread's loop: `iters` checks over `keys[offset..]` cycled, time from `BASE + from`.
#[allow(clippy::too_many_arguments)]
fn run_ours(
    store: &MemoryStore,
    q: &Quota,
    dt: Micros,
    keys: &[String],
    offset: usize,
    iters: u64,
    from: Micros,
) {
    let mut now = BASE + from;
    let mut i = offset % keys.len();
    for _ in 0..iters {
        black_box(check(store, q, &keys[i], now));
        now += dt;
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
}

fn step_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("step/admit");
    for alg in Algorithm::ALL {
        let (q, dt) = quota(alg, Load::Admit);
        g.bench_with_input(BenchmarkId::from_parameter(alg), &q, |b, q| {
            let mut state: Option<State> = None;
            let mut now = BASE;
            b.iter(|| {
                let (d, s) = internals::step(state.take(), now, 1, q);
                state = s;
                now += dt;
                black_box(d.allowed)
            })
        });
    }
    g.finish();
}

/// The doorkeeper's cost per decision (sliding window counter, 100 per second): `off` and `on`
/// over 100,000 keys that all hold counters (the lookup finds the counter: the doorkeeper is one
/// branch), and over keys never seen before (`one_shot_*`: off, a counter is inserted and the
/// table evicts; on, the request is held back in the Bloom filter).
fn doorkeeper_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("doorkeeper");
    let q = Quota::new(100, Unit::Second);
    let on = q.with_doorkeeper(tollgate_core::Doorkeeper::new(1_000_000, 0.01).ok());
    let ks = keys(KEYS);
    for (name, quota) in [("off", q), ("on", on)] {
        let store = MemoryStore::new(1 << 20);
        // Every key seen twice: each holds a counter.
        for k in ks.iter().chain(&ks) {
            check(&store, &quota, k, BASE);
        }
        g.bench_function(format!("keys_100k/{name}"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(check(&store, &quota, &ks[i], BASE + 1))
            })
        });
        let store = MemoryStore::new(1 << 16);
        let mut key = String::new();
        g.bench_function(format!("one_shot/{name}"), |b| {
            let mut n = 0u64;
            b.iter(|| {
                use std::fmt::Write;
                n += 1;
                key.clear();
                let _ = write!(key, "one-shot-{n}");
                // A window a second: the filter rotates as in production.
                black_box(check(&store, &quota, &key, BASE + n))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, store_benches, step_benches, doorkeeper_benches);
criterion_main!(benches);
