//! Conformance: the Redis store decides exactly what the memory store decides, for the
//! hand-written edge-case suite and for random traces, on the shared Redis (unique key prefix).

mod support;

use proptest::prelude::*;
use std::time::Duration;
use support::conformance::{random_trace, replay, runner, traces, ALGORITHMS};
use support::runtime;
use tollgate_core::Algorithm;
use tollgate_redis::KeyLayout;
use tollgate_redis::{RedisOptions, RedisStore};

/// Options for replays: explicit times unrelated to the real clock, so keys get a generous TTL
/// grace (they must outlive the replay), and a timeout that tolerates a loaded CI machine.
pub fn replay_options(what: &str) -> RedisOptions {
    RedisOptions {
        prefix: support::unique_prefix(what),
        ttl_grace: Duration::from_secs(120),
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    }
}

#[test]
fn edge_case_suite_matches_memory_store() {
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::connect(support::shared_url(), replay_options("conf"))
            .await
            .unwrap();
        let all = traces();
        assert!(all.len() >= 170, "{}", all.len());
        for t in &all {
            replay(&store, t).await;
        }
        support::delete_prefix(support::shared_url(), &store.options().prefix);
    });
}

#[test]
fn random_traces_match_memory_store() {
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(
            support::shared_url(),
            replay_options("prop"),
        ))
        .unwrap();
    for alg in ALGORITHMS.into_iter().chain([Algorithm::EnvoyFixedWindow]) {
        let mut runner = runner(48);
        runner
            .run(&random_trace(alg, true), |trace| {
                rt.block_on(replay(&store, &trace));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{alg}: {e}"));
    }
    support::delete_prefix(support::shared_url(), &store.options().prefix);
}

/// envoyproxy/ratelimit's key layout (a key per window, `INCRBY`/`EXPIRE`) decides as the
/// memory store does, on the hand-written suite and on random traces whose time only moves
/// forward (going back, envoy's layout finds the older window's key again, as envoy does, where
/// the memory store keeps one state per counter).
#[test]
fn envoy_key_layout_matches_memory_store() {
    let rt = runtime();
    let base = replay_options("envoy");
    // envoy's keys are `<prefix><domain>_...`: end the prefix with `:` for delete_prefix.
    let ns = base.prefix.clone();
    let opts = RedisOptions {
        key_layout: KeyLayout::Envoy,
        expiration_jitter: Duration::from_secs(30),
        prefix: format!("{ns}:"),
        ..base
    };
    let store = rt
        .block_on(RedisStore::connect(support::shared_url(), opts))
        .unwrap();
    rt.block_on(async {
        for t in traces().iter().filter(|t| {
            t.steps.windows(2).all(|w| w[0].t <= w[1].t)
                && t.steps
                    .iter()
                    .flat_map(|s| &s.reqs)
                    .any(|r| r.quota.algorithm() == Algorithm::EnvoyFixedWindow)
        }) {
            replay(&store, t).await;
        }
    });
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&random_trace(Algorithm::EnvoyFixedWindow, false), |trace| {
            rt.block_on(replay(&store, &trace));
            Ok(())
        })
        .unwrap();
    let written = support::delete_prefix(support::shared_url(), &ns);
    assert!(written > 0, "envoy keys written");
}

/// `sync: lease` on one instance decides what `exact` decides, on the hand-written suite and on
/// random traces of the leasable algorithms whose time only moves forward (what is compared:
/// `lease_agrees`; the clock set back by more than a window strands units in hand, see
/// docs/distributed.md).
#[test]
fn leased_limits_on_one_instance_decide_as_exact() {
    use support::conformance::{leasable, replay_leased, LEASABLE};
    use tollgate_redis::{Guarded, RedisSettings};
    let rt = runtime();
    let opts = replay_options("lease");
    let prefix = opts.prefix.clone();
    let guarded = rt.block_on(async {
        let store = RedisStore::connect(support::shared_url(), opts)
            .await
            .unwrap();
        let settings = RedisSettings {
            caller_clock: true,
            ..RedisSettings::default()
        };
        Guarded::start(store, settings).await
    });
    let all: Vec<_> = traces().into_iter().filter(leasable).collect();
    assert!(all.len() >= 50, "{}", all.len());
    rt.block_on(async {
        for t in &all {
            replay_leased(&guarded, t).await;
        }
    });
    for alg in LEASABLE {
        let mut runner = runner(48);
        runner
            .run(&random_trace(alg, false), |trace| {
                rt.block_on(replay_leased(&guarded, &trace));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{alg} leased: {e}"));
    }
    support::delete_prefix(support::shared_url(), &prefix);
}

/// Tiered limits (priority tiers sharing one limit) decide on Redis exactly as on the memory
/// store: the hand-written tiered traces and random ones, time going back too.
#[test]
fn tiered_traces_match_memory_store() {
    use support::conformance::{random_tiered_trace, tiered_traces, TIERED};
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(
            support::shared_url(),
            replay_options("tiers"),
        ))
        .unwrap();
    rt.block_on(async {
        for t in &tiered_traces() {
            replay(&store, t).await;
        }
    });
    // The overload traces' shape (Redis decides as the memory store, checked above): in each
    // window the parent fills to exactly 100, paid gets at least its 60, free 10 to 20.
    for t in tiered_traces()
        .iter()
        .filter(|t| t.name.ends_with("overload"))
    {
        use tollgate_core::{MemoryStore, Store};
        let mem = MemoryStore::default();
        let mut per_window: std::collections::BTreeMap<u64, [u64; 2]> = Default::default();
        for step in &t.steps {
            let r = &step.reqs[0];
            let (levels, tier) = r.tier.as_ref().unwrap();
            let item = tollgate_core::CheckItem {
                cost: r.cost,
                tier: Some(tollgate_core::store::Tier {
                    levels,
                    index: *tier,
                }),
                ..tollgate_core::CheckItem::hit("r", &r.key, &r.quota)
            };
            if mem.check_one(step.t, &item).unwrap().allowed {
                per_window.entry(step.t / 1_000_000).or_default()[usize::from(*tier)] += r.cost;
            }
        }
        assert_eq!(per_window.len(), 5, "{}", t.name);
        for (w, [paid, free]) in per_window {
            assert_eq!(paid + free, 100, "{} window {w}", t.name);
            assert!(
                paid >= 60 && (10..=20).contains(&free),
                "{} window {w}: {paid} {free}",
                t.name
            );
        }
    }
    for alg in TIERED {
        let mut runner = runner(64);
        runner
            .run(&random_tiered_trace(alg, true), |trace| {
                rt.block_on(replay(&store, &trace));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{alg} tiered: {e}"));
    }
    support::delete_prefix(support::shared_url(), &store.options().prefix);
}
