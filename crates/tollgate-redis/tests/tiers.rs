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

/// Paid and free sharing 100 per `unit` (`extra`: more `rate_limit` fields, such as a sync mode).
fn tiered(unit: &str, algorithm: &str, extra: &str) -> RuleSet {
    let text = format!(
        "domain: api
descriptors:
  - key: api
    rate_limit: {{unit: {unit}, requests_per_unit: 100, algorithm: {algorithm}{extra}}}
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

fn rules(algorithm: &str) -> RuleSet {
    tiered("second", algorithm, "")
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

/// Under the `local` failure policy a tier is itself: a free denial is not cached for paid, the
/// fallback starts from what Redis last reported for paid's tier (not free's), and what it
/// admitted is folded into the tiered state once a Redis is back. A private Redis, killed and
/// restarted; the decisions are made at the test's instants (the caller's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_under_the_local_policy() {
    use tollgate_redis::{Guarded, Policy, RedisSettings};
    let mut server = support::RedisServer::start(&[]);
    let port = server.port;
    let opts = RedisOptions {
        prefix: "tiers-local".to_owned(),
        timeout: Duration::from_millis(200),
        ttl_grace: Duration::from_secs(600),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.url(), opts).await.unwrap();
    let settings = RedisSettings {
        policy: Policy::Local,
        expected_instances: 1,
        deny_cache: true,
        caller_clock: true,
        ..RedisSettings::default()
    };
    let g = Guarded::start(store, settings).await;
    let rules = tiered("minute", "fixed_window", "");
    let now = T0 + 10 * SECOND;
    // (allowed, degraded) of `n` requests of `plan`.
    let run = |plan: &'static str, n: usize| {
        let (rules, g) = (&rules, &g);
        async move {
            let d = [Descriptor::new([("api", "v1"), ("plan", plan)])];
            let mut out = (0u64, 0u64);
            for _ in 0..n {
                let p = Plan::new(rules, "api", &d, 1);
                let o = g.check(now, &p.items()).await.expect("the policy answers");
                let degraded = o.degraded.is_some();
                if p.finish(o.decisions).allowed() {
                    out.0 += 1;
                    out.1 += u64::from(degraded);
                }
            }
            out
        }
    };
    // Redis up: paid takes 10, free gets 20 and is then denied (a denial the cache must keep
    // to free: paid still passes, decided by Redis).
    assert_eq!(run("paid", 10).await, (10, 0));
    assert_eq!(run("free", 30).await, (20, 0));
    assert_eq!(run("paid", 1).await, (1, 0));
    // Paid may take 69 more now (the least of 100 - 31 left and borrowing 100 - 31 - 0 - 0):
    // the local fallback grants no more than what Redis last reported for paid's tier (free's
    // was 0).
    server.kill();
    let (allowed, degraded) = run("paid", 100).await;
    assert_eq!((allowed, degraded), (69, 69), "paid under the local policy");
    let server = support::RedisServer::start_on(port, &[]);
    // The probe finds Redis back and folds what the fallback admitted into the tiered state
    // (paid's count; a request whose failed call may have reached Redis is not owed again).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while g.folded().1 < 68 {
        assert!(
            std::time::Instant::now() < deadline,
            "the local admissions folded: {:?}",
            g.folded()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // (A fold may come in parts: the state is read until it holds every part.)
    let key = "tiers-local:{api|api=v1}:fixed2:1m:tiers";
    let window = T0 + 10 * SECOND - (T0 + 10 * SECOND) % (60 * SECOND);
    loop {
        let folded = g.folded().1;
        assert!((68..=69).contains(&folded), "{folded}");
        let state = server.cli(&["GET", key]);
        if state.trim() == format!("{window} 0 {folded} 0 0") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key} holds {state:?}, {folded} folded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The overload with `sync: lease`, on two guarded instances (each its own leases and
/// connection pool) against one private Redis, with concurrent callers deciding at each
/// window's instant (the caller's clock). Each window: the parent admits at most 100, paid at
/// least its guaranteed 60, free 10 to 20 (a lease is counted on its tier and the parent when
/// granted, so no tier borrows what another holds, and a tier's Redis denial means its
/// guarantee is used); and once the instances give their units in hand back, the tiers' counts
/// in Redis are exactly what was admitted.
#[test]
fn leased_tiers_stay_exact_across_instances() {
    use tollgate_redis::{Guarded, RedisSettings};
    let server = support::RedisServer::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let opts = RedisOptions {
            prefix: "tlease".to_owned(),
            ttl_grace: Duration::from_secs(120),
            timeout: Duration::from_secs(5),
            ..RedisOptions::default()
        };
        let settings = RedisSettings {
            caller_clock: true,
            ..RedisSettings::default()
        };
        let mut guards = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::connect(&server.url(), opts.clone())
                .await
                .unwrap();
            guards.push(Guarded::start(store, settings.clone()).await);
        }
        for algorithm in ["fixed_window", "sliding_window_counter"] {
            let rules = Arc::new(leased_rules(algorithm));
            for run in 0..5u64 {
                let now = T0 + 2 * run * SECOND;
                let before: Vec<u64> = guards.iter().map(|g| local_decisions(g)).collect();
                let mut callers = Vec::new();
                for i in 0..8usize {
                    let (rules, g) = (rules.clone(), guards[i % 2].clone());
                    let plan = if i < 4 { "paid" } else { "free" };
                    callers.push(tokio::spawn(async move {
                        let d = [Descriptor::new([("api", "v1"), ("plan", plan)])];
                        let mut admitted = 0u64;
                        for _ in 0..75 {
                            let p = Plan::new(&rules, "api", &d, 1);
                            let o = g.check(now, &p.items()).await.expect("redis answers");
                            assert!(o.degraded.is_none(), "decided by Redis or a lease");
                            admitted += u64::from(p.finish(o.decisions).allowed());
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
                let what = format!("{algorithm} run {run}: paid {paid}, free {free}");
                for (g, b) in guards.iter().zip(&before) {
                    assert!(
                        local_decisions(g) > *b,
                        "{what}: decided from leases on each instance"
                    );
                }
                assert!(paid + free <= 100, "{what}: the parent over its limit");
                assert!(paid >= 60, "{what}: paid below its guarantee");
                assert!(
                    (10..=20).contains(&free),
                    "{what}: free outside its guarantee and what the reserve leaves"
                );
                for g in &guards {
                    g.return_leases(now).await;
                    assert_eq!(g.lease_stats().1, 0, "{what}: every unit given back");
                }
                let keys = server.cli(&["KEYS", "tlease:*"]);
                let key = keys
                    .lines()
                    .find(|k| {
                        k.contains(&format!(":{}:", short(algorithm))) && k.ends_with(":tiers")
                    })
                    .unwrap_or_else(|| panic!("{what}: no tiered key in {keys:?}"));
                let state = server.cli(&["GET", key]);
                let counts: Vec<u64> = state
                    .split_whitespace()
                    .map(|n| n.parse().expect("a count"))
                    .collect();
                assert_eq!(
                    counts,
                    [now, 0, paid, 0, free],
                    "{what}: Redis counts what was admitted"
                );
            }
        }
    });
}

fn leased_rules(algorithm: &str) -> RuleSet {
    tiered("second", algorithm, ", sync: lease")
}

/// The algorithm's part of a counter key.
fn short(algorithm: &str) -> &'static str {
    match algorithm {
        "fixed_window" => "fixed2",
        _ => "counter2",
    }
}

fn local_decisions(g: &tollgate_redis::Guarded) -> u64 {
    g.lease_stats()
        .0
        .local_decisions
        .load(std::sync::atomic::Ordering::Relaxed)
}
