//! Concurrency: many threads through one `MemoryStore` admit exactly what one thread admits.
//!
//! With unit costs and a fixed `now`, how many of N attempts a key admits does not depend on
//! their order, so the total over 8 racing threads must equal a single-threaded run exactly; any
//! lost update or double admission shows up as a difference. The advancing-time variant keeps
//! that determinism with a barrier per time step (every thread makes its attempts of step `p` at
//! the same instant), so it is still an exact comparison.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use tollgate_core::clock::SECOND;
use tollgate_core::{Algorithm, CheckItem, MemoryStore, Micros, Quota, Store, Unit};

/// 2026-11-22T00:00:00Z, plus 10 s.
const NOW: Micros = 1_795_305_600 * SECOND + 10 * SECOND;
const THREADS: usize = 8;
const ATTEMPTS: usize = 10_000;

const EXACT: [Algorithm; 6] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::SlidingWindowCounter,
];

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("api|user={i}")).collect()
}

fn attempt(store: &MemoryStore, q: &Quota, key: &str, now: Micros) -> bool {
    store.check(now, &[CheckItem::hit("api", key, q)]).unwrap()[0].allowed
}

/// Attempt `i` of thread `t`: which key and at which time step.
type Plan = dyn Fn(usize, usize) -> (usize, usize) + Sync;

/// Run `threads` × `ATTEMPTS` attempts in `steps` barrier-separated time steps; returns admitted.
fn racing(
    q: &Quota,
    keys: &[String],
    threads: usize,
    steps: usize,
    dt: Micros,
    plan: &Plan,
) -> u64 {
    let store = MemoryStore::with_seed(1 << 20, 3, 4);
    let admitted = AtomicU64::new(0);
    let barrier = Barrier::new(threads);
    let per_step = ATTEMPTS / steps;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, admitted, barrier) = (&store, &admitted, &barrier);
            s.spawn(move || {
                let mut mine = 0;
                for step in 0..steps {
                    barrier.wait();
                    let now = NOW + step as u64 * dt;
                    for i in step * per_step..(step + 1) * per_step {
                        let (k, _) = plan(t, i);
                        mine += u64::from(attempt(store, q, &keys[k], now));
                    }
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    admitted.into_inner()
}

/// The same attempts, one thread, in thread-then-attempt order per step.
fn single(
    q: &Quota,
    keys: &[String],
    threads: usize,
    steps: usize,
    dt: Micros,
    plan: &Plan,
) -> u64 {
    let store = MemoryStore::with_seed(1 << 20, 3, 4);
    let per_step = ATTEMPTS / steps;
    let mut n = 0;
    for step in 0..steps {
        let now = NOW + step as u64 * dt;
        for t in 0..threads {
            for i in step * per_step..(step + 1) * per_step {
                let (k, _) = plan(t, i);
                n += u64::from(attempt(&store, q, &keys[k], now));
            }
        }
    }
    n
}

fn compare(limit: u64, nkeys: usize, steps: usize, dt: Micros) {
    compare_algorithms(&EXACT, limit, nkeys, steps, dt);
}

fn compare_algorithms(algs: &[Algorithm], limit: u64, nkeys: usize, steps: usize, dt: Micros) {
    let ks = keys(nkeys);
    let plan = move |t: usize, i: usize| ((t * 7 + i) % nkeys, i);
    for &alg in algs {
        let q = Quota::new(limit, Unit::Minute).with_algorithm(alg);
        let want = single(&q, &ks, THREADS, steps, dt, &plan);
        let got = racing(&q, &ks, THREADS, steps, dt, &plan);
        assert_eq!(got, want, "{alg}: {nkeys} keys, {steps} steps");
        assert!(
            want > 0 && want < (THREADS * ATTEMPTS) as u64,
            "{alg}: {want}"
        );
    }
}

#[test]
fn one_key_fixed_now() {
    compare(1_000, 1, 1, 0);
}

#[test]
fn hundred_keys_fixed_now() {
    compare(50, 100, 1, 0);
}

#[test]
fn one_key_advancing_time() {
    // 20 steps of 7 s: windows roll, buckets refill, log entries expire mid-run.
    compare(500, 1, 20, 7 * SECOND);
}

/// The count-min sketch on one key (no other key to collide with, so the order of the attempts
/// cannot matter): 8 racing threads admit exactly what one thread admits.
#[test]
fn count_min_sketch_one_key() {
    compare_algorithms(&[Algorithm::CountMinSketch], 1_000, 1, 1, 0);
    compare_algorithms(&[Algorithm::CountMinSketch], 500, 1, 20, 7 * SECOND);
}

#[test]
fn hundred_keys_advancing_time() {
    compare(20, 100, 10, 13 * SECOND);
}

/// Multi-key requests (3 of 5 keys, limits 40..200) racing: no key ever consumes above its
/// limit, and what each key consumed equals what the admitted requests that named it add up to.
#[test]
fn multi_key_all_or_nothing_under_contention() {
    let ks = keys(5);
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindowCounter,
    ] {
        let quotas: Vec<Quota> = [40, 80, 120, 160, 200]
            .into_iter()
            .map(|l| Quota::new(l, Unit::Hour).with_algorithm(alg))
            .collect();
        let store = MemoryStore::with_seed(1 << 20, 5, 6);
        let consumed: Vec<AtomicU64> = (0..5).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (store, consumed, ks, quotas) = (&store, &consumed, &ks, &quotas);
                s.spawn(move || {
                    let mut rng = 0x9E37_79B9u64 + t as u64 * 0x1234_5678_9ABC;
                    for _ in 0..2_000 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let first = (rng % 5) as usize;
                        let picked = [
                            first,
                            (first + 1 + (rng >> 8) as usize % 2) % 5,
                            (first + 3) % 5,
                        ];
                        let cost = 1 + (rng >> 16) % 2;
                        let items: Vec<CheckItem<'_>> = picked
                            .iter()
                            .map(|&k| CheckItem {
                                cost,
                                ..CheckItem::hit("api", &ks[k], &quotas[k])
                            })
                            .collect();
                        let d = store.check(NOW, &items).unwrap();
                        if d.iter().all(|d| d.allowed) {
                            for &k in &picked {
                                consumed[k].fetch_add(cost, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        for (k, q) in quotas.iter().enumerate() {
            let used = consumed[k].load(Ordering::Relaxed);
            assert!(
                used <= q.limit(),
                "{alg}: key {k} consumed {used} > {}",
                q.limit()
            );
            let item = CheckItem {
                cost: 0,
                ..CheckItem::hit("api", &ks[k], q)
            };
            let left = store.check(NOW, &[item]).unwrap()[0].remaining;
            assert_eq!(left, q.limit() - used, "{alg}: key {k}");
        }
        // The tightest key must have been (nearly) exhausted, or the test tested nothing.
        assert!(consumed[0].load(Ordering::Relaxed) >= 38, "{alg}");
    }
}
