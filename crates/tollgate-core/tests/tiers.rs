//! Priority tiers under overload on the memory store: paid and free traffic, both offering far
//! more than the shared 100 per second, from racing threads through the rules.
//!
//! Every window's outcome is fixed by the rules whatever the interleaving: the parent fills to
//! exactly 100 (paid has no ceiling below it and keeps borrowing), paid gets at least its
//! guaranteed 60, free gets its guaranteed 10 and borrows only while more than its reserve of
//! 20 (and paid's unused guarantee) is left, so never more than 20. Each window is one instant
//! of a manual clock: nothing depends on timing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use tollgate_core::clock::SECOND;
use tollgate_core::limiter::{check, Descriptor};
use tollgate_core::{MemoryStore, Micros, RuleSet};

/// 2026-11-22T00:00:00Z.
const T0: Micros = 1_795_305_600 * SECOND;

fn rules(algorithm: &str) -> RuleSet {
    let text = format!(
        "domain: api
descriptors:
  - key: api
    rate_limit: {{unit: second, requests_per_unit: 100, algorithm: {algorithm}}}
    tiers:
      key: plan
      levels:
        - value: paid
          guaranteed: 60
        - value: free
          guaranteed: 10
          ceiling: 80
          reserve: 20
"
    );
    RuleSet::from_sources(&[("tiers.yaml".to_string(), text)]).expect("valid rules")
}

/// One window: two paid and two free threads, each offering 300 requests at `now`, through
/// two handles of one store. Returns (paid, free) admitted.
fn window(rules: &Arc<RuleSet>, stores: &[Arc<MemoryStore>; 2], now: Micros) -> (u64, u64) {
    let admitted = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (rules, store) = (rules.clone(), stores[i % 2].clone());
            let (admitted, start) = (admitted.clone(), start.clone());
            std::thread::spawn(move || {
                let plan = if i < 2 { "paid" } else { "free" };
                let d = [Descriptor::new([("api", "v1"), ("plan", plan)])];
                start.wait();
                for _ in 0..300 {
                    let v = check(&rules, &*store, now, "api", &d, 1).expect("memory never fails");
                    if v.allowed() {
                        admitted[usize::from(i >= 2)].fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no panic");
    }
    (
        admitted[0].load(Ordering::Relaxed),
        admitted[1].load(Ordering::Relaxed),
    )
}

#[test]
fn paid_and_free_overload_share_the_parent_as_the_tiers_say() {
    for algorithm in ["fixed_window", "sliding_window_counter"] {
        let rules = Arc::new(rules(algorithm));
        let store = Arc::new(MemoryStore::default());
        let stores = [store.clone(), store];
        // Five windows, two apart so that a sliding window's previous one is empty.
        for run in 0..5 {
            let now = T0 + 2 * run * SECOND;
            let (paid, free) = window(&rules, &stores, now);
            assert_eq!(
                paid + free,
                100,
                "{algorithm} run {run}: parent filled exactly"
            );
            assert!(
                paid >= 60,
                "{algorithm} run {run}: paid {paid} below its guarantee"
            );
            assert!(
                (10..=20).contains(&free),
                "{algorithm} run {run}: free {free} outside its guarantee and what is left above the reserve"
            );
        }
    }
}

#[test]
fn free_alone_keeps_paid_guarantee_and_the_reserve() {
    let rules = rules("fixed_window");
    let store = MemoryStore::default();
    let free = [Descriptor::new([("api", "v1"), ("plan", "free")])];
    let unknown = [Descriptor::new([("api", "v1"), ("plan", "gold")])];
    let none = [Descriptor::new([("api", "v1")])];
    let mut admitted = 0;
    for d in [&free, &unknown, &none] {
        for _ in 0..50 {
            admitted += u64::from(check(&rules, &store, T0, "api", d, 1).unwrap().allowed());
        }
    }
    // Unknown and missing tiers are free traffic: together 10 + (100 - 60 - 20 - 10) = 20.
    assert_eq!(admitted, 20);
    let paid = [Descriptor::new([("api", "v1"), ("plan", "paid")])];
    let mut paid_admitted = 0;
    for _ in 0..200 {
        paid_admitted += u64::from(
            check(&rules, &store, T0, "api", &paid, 1)
                .unwrap()
                .allowed(),
        );
    }
    assert_eq!(paid_admitted, 80);
    // A request of two descriptors on one parent is decided on the state the first leaves.
    let both = [paid[0].clone(), free[0].clone()];
    let v = check(&rules, &store, T0 + SECOND, "api", &both, 1).unwrap();
    assert!(v.allowed());
}
