//! Priority tiers under overload on Redis: paid and free traffic, both offering far more than
//! the shared 100 per second, from concurrent callers on two store instances (two connection
//! pools, as two service instances have) against one Redis.
//!
//! Every window is one instant given to the store (the caller's clock), so each window's outcome
//! is fixed by the rules whatever the interleaving: the parent fills to exactly 100, paid gets
//! at least its guaranteed 60, free gets its guaranteed 10 and borrows only while more than its
//! reserve of 20 (and paid's unused guarantee) is left, so never more than 20.

mod support;

use std::sync::Arc;
use std::time::Duration;
use support::runtime;
use tollgate_core::clock::SECOND;
use tollgate_core::limiter::{Descriptor, Plan};
use tollgate_core::{Micros, RuleSet};
use tollgate_redis::{RedisOptions, RedisStore};

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

/// Whether one request of `plan` is admitted at `now`.
async fn hit(rules: &RuleSet, store: &RedisStore, now: Micros, plan: &str) -> bool {
    let d = [Descriptor::new([("api", "v1"), ("plan", plan)])];
    let p = Plan::new(rules, "api", &d, 1);
    let decisions = store
        .check(Some(now), &p.items())
        .await
        .expect("redis answers");
    p.finish(decisions).allowed()
}

#[test]
fn paid_and_free_overload_share_the_parent_on_redis() {
    let rt = runtime();
    rt.block_on(async {
        let opts = RedisOptions {
            prefix: support::unique_prefix("tiers"),
            ttl_grace: Duration::from_secs(120),
            timeout: Duration::from_secs(5),
            ..RedisOptions::default()
        };
        let prefix = opts.prefix.clone();
        let stores = [
            Arc::new(RedisStore::connect(support::shared_url(), opts.clone()).await.unwrap()),
            Arc::new(RedisStore::connect(support::shared_url(), opts).await.unwrap()),
        ];
        for algorithm in ["fixed_window", "sliding_window_counter"] {
            let rules = Arc::new(rules(algorithm));
            for run in 0..5u64 {
                // Two windows apart, so that a sliding window's previous one is empty.
                let now = T0 + 2 * run * SECOND;
                let mut callers = Vec::new();
                for i in 0..8usize {
                    let (rules, store) = (rules.clone(), stores[i % 2].clone());
                    let plan = if i < 4 { "paid" } else { "free" };
                    callers.push(tokio::spawn(async move {
                        let mut admitted = 0u64;
                        for _ in 0..75 {
                            admitted += u64::from(hit(&rules, &store, now, plan).await);
                        }
                        (plan, admitted)
                    }));
                }
                let (mut paid, mut free) = (0, 0);
                for c in callers {
                    match c.await.expect("caller") {
                        ("paid", n) => paid += n,
                        (_, n) => free += n,
                    }
                }
                assert_eq!(paid + free, 100, "{algorithm} run {run}: parent filled exactly");
                assert!(paid >= 60, "{algorithm} run {run}: paid {paid} below its guarantee");
                assert!(
                    (10..=20).contains(&free),
                    "{algorithm} run {run}: free {free} outside its guarantee and what is left above the reserve"
                );
            }
        }
        support::delete_prefix(support::shared_url(), &prefix);
    });
}
