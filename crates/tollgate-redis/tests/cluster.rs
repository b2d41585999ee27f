//! Redis Cluster: a throwaway 3-master cluster on free loopback ports runs the conformance
//! suite through `redis+cluster://`, and cross-slot requests are all-or-nothing (a request
//! blocked in one slot gives back what the other slots consumed).

mod support;

use std::time::Duration;
use support::conformance::{random_trace, replay, runner, traces, ALGORITHMS};
use support::Cluster;
use tollgate_core::{CheckItem, Quota, Unit};
use tollgate_redis::keys::{counter_keys, slot};
use tollgate_redis::{RedisOptions, RedisStore};

#[test]
fn cluster_conformance_and_cross_slot_refunds() {
    let cluster = Cluster::start(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let opts = RedisOptions {
        prefix: support::unique_prefix("cluster"),
        ttl_grace: Duration::from_secs(120),
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    };
    let store = rt
        .block_on(RedisStore::connect(&cluster.url(), opts))
        .unwrap();
    assert!(store.is_cluster());
    rt.block_on(store.ping()).unwrap();

    // The same suite as on a single server; multi-key steps span slots and nodes. Except the
    // blocked requests with clock steps back: across slots, a window counter that counted in a
    // later window (the clock went back) is not refunded, on purpose (the safe side, see
    // fixed_window.lua's refund), so the cluster keeps one more count than a single server.
    rt.block_on(async {
        for t in traces()
            .iter()
            .filter(|t| !t.name.starts_with("clock jumps blocked"))
        {
            replay(&store, t).await;
        }
    });
    for alg in ALGORITHMS {
        let mut runner = runner(16);
        runner
            .run(&random_trace(alg, false), |trace| {
                rt.block_on(replay(&store, &trace));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{alg}: {e}"));
    }

    // Every node forgets the function and the script: the next calls reload them.
    for n in &cluster.nodes {
        assert!(n.cli(&["SCRIPT", "FLUSH"]).contains("OK"));
        let flushed = n.cli(&["FUNCTION", "FLUSH"]);
        // A replica refuses writes; its master's flush reaches it.
        assert!(
            flushed.contains("OK") || flushed.contains("READONLY"),
            "{flushed}"
        );
    }

    // Cross-slot all-or-nothing, time from Redis, for every algorithm.
    rt.block_on(async {
        let prefix = store.options().prefix.clone();
        for alg in ALGORITHMS {
            let wide = Quota::new(10, Unit::Hour).with_algorithm(alg);
            let narrow = Quota::new(1, Unit::Hour).with_algorithm(alg);
            let (a, b) = (format!("api|user=a-{alg}"), format!("api|ip=b-{alg}"));
            let (ka, _) = counter_keys(&prefix, &a, &wide);
            let (kb, _) = counter_keys(&prefix, &b, &narrow);
            assert_ne!(slot(&ka), slot(&kb));
            let both = |ca, cb| {
                [
                    CheckItem {
                        cost: ca,
                        ..CheckItem::hit("w", &a, &wide)
                    },
                    CheckItem {
                        cost: cb,
                        ..CheckItem::hit("n", &b, &narrow)
                    },
                ]
            };
            let d = store.check(None, &both(1, 1)).await.unwrap();
            assert!(d[0].allowed && d[1].allowed, "{alg}: {d:?}");
            assert_eq!(d[0].remaining, 9);
            // Denied by b's slot: a's slot consumed, then gave it back.
            for _ in 0..3 {
                let d = store.check(None, &both(2, 1)).await.unwrap();
                assert!(d[0].allowed && !d[1].allowed, "{alg}: {d:?}");
                assert_eq!(d[0].remaining, 9, "{alg}: reports the unconsumed state");
            }
            let d = store.check(None, &both(0, 0)).await.unwrap();
            assert_eq!(d[0].remaining, 9, "{alg}: refunded");
            if alg == tollgate_core::Algorithm::SlidingWindowLog {
                let node = cluster
                    .nodes
                    .iter()
                    .find(|n| {
                        n.cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot(&ka).to_string()])
                            .trim()
                            != "0"
                    })
                    .expect("a node holds the log");
                assert_eq!(
                    node.cli(&["ZCARD", &ka]).trim(),
                    "1",
                    "only the first entry remains"
                );
            }
        }
    });
    drop(store);
    drop(rt);
    drop(cluster);
}

/// A slot migrating under load (`MIGRATE` of a live counter, then `SETSLOT ... NODE`): the
/// store follows `ASK` (with `ASKING` on the named node, the script loaded there if needed) and
/// then `MOVED`, so every call is answered, none is an error, and no count is lost.
#[test]
fn a_slot_migrating_under_load_is_followed_not_an_error() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};
    let cluster = Cluster::start(3);
    let rt = support::runtime();
    let opts = RedisOptions {
        prefix: support::unique_prefix("migrate"),
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    };
    let store = rt
        .block_on(RedisStore::connect(&cluster.url(), opts.clone()))
        .unwrap();
    const LIMIT: u64 = 1_000_000;
    let quota = Quota::new(LIMIT, Unit::Day).with_algorithm(tollgate_core::Algorithm::FixedWindow);
    let counter = "d|k=migrating";
    let (main, aux) = counter_keys(&opts.prefix, counter, &quota);
    assert!(aux.is_none());
    let hit = CheckItem::hit("d|k", counter, &quota);
    rt.block_on(store.check(None, &[hit])).unwrap();
    let s = slot(&main).to_string();
    let owns = |n: &&support::RedisServer| !n.cli(&["GET", &main]).contains("MOVED");
    let src = cluster.nodes.iter().find(owns).expect("the slot's owner");
    let dst = cluster.nodes.iter().find(|n| n.port != src.port).unwrap();
    let id = |n: &support::RedisServer| n.cli(&["CLUSTER", "MYID"]).trim().to_string();
    let (src_id, dst_id) = (id(src), id(dst));

    // 8 callers hitting the counter until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (store, stop, done, errors) =
                (store.clone(), stop.clone(), done.clone(), errors.clone());
            rt.spawn(async move {
                let (quota, counter) = (quota, counter);
                while !stop.load(Relaxed) {
                    let hit = CheckItem::hit("d|k", counter, &quota);
                    match store.check(None, &[hit]).await {
                        Ok(d) => assert!(d[0].allowed),
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                    done.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    let wait_for_calls = |n: u64| support::wait_for_more(&done, n);
    wait_for_calls(200);
    // The migration: the key moves, the slot is still the source's (ASK), then the target's.
    assert!(dst
        .cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id])
        .contains("OK"));
    assert!(src
        .cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id])
        .contains("OK"));
    let port = dst.port.to_string();
    let migrated = src.cli(&[
        "MIGRATE",
        "127.0.0.1",
        &port,
        "",
        "0",
        "5000",
        "KEYS",
        &main,
    ]);
    assert!(migrated.contains("OK"), "{migrated}");
    // Every call from here on is asked to go to the target: a few hundred show ASK is followed
    // (under load each can take a while: latency is what a migration may cost).
    wait_for_calls(200);
    // The slot is the target's: the target is told first, then the source, then the others,
    // as Redis prescribes (the source first would send MOVED to a target still importing,
    // which sends MOVED back: a ping-pong no client can follow).
    let mut order: Vec<&support::RedisServer> = vec![dst, src];
    order.extend(
        cluster
            .nodes
            .iter()
            .filter(|n| n.port != src.port && n.port != dst.port),
    );
    for n in order {
        assert!(n
            .cli(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id])
            .contains("OK"));
    }
    wait_for_calls(200);
    support::stop_load(&rt, &stop, callers, &errors);
    // No count lost: every call counted once, on the node that owns the slot now.
    let query = CheckItem {
        cost: 0,
        ..CheckItem::hit("d|k", counter, &quota)
    };
    let left = rt.block_on(store.check(None, &[query])).unwrap()[0].remaining;
    assert_eq!(LIMIT - left, done.load(Relaxed) + 1);
    assert!(!dst.cli(&["GET", &main]).contains("MOVED"));
}

/// One master of a cluster dies (no replica takes over): only the keys it served are decided by
/// the failure policy; keys on the healthy masters never are, and their breakers stay closed.
#[test]
fn a_dead_master_sends_only_its_own_keys_to_the_policy() {
    use tollgate_redis::guard::BreakerState;
    use tollgate_redis::{Guarded, RedisSettings};
    let mut cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let rt = support::runtime();
    let opts = RedisOptions {
        prefix: support::unique_prefix("deadmaster"),
        ..RedisOptions::default()
    };
    let quota = Quota::new(1_000_000, Unit::Day);
    let counters: Vec<String> = (0..60).map(|n| format!("d|k=v{n}")).collect();
    rt.block_on(async {
        let store = RedisStore::connect(&cluster.url(), opts).await.unwrap();
        let owners = store.slot_owners().await.unwrap();
        assert_eq!(
            owners
                .iter()
                .map(|o| &o.2)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            3
        );
        let g = Guarded::start(store.clone(), RedisSettings::default()).await;
        let victim = format!("127.0.0.1:{}", cluster.nodes[0].port);
        let (on_victim, healthy): (Vec<&String>, Vec<&String>) = counters.iter().partition(|c| {
            let slot = store.slot_of(&CheckItem::hit("d|k", c, &quota));
            owners
                .iter()
                .any(|(a, b, addr)| (*a..=*b).contains(&slot) && *addr == victim)
        });
        assert!(!on_victim.is_empty() && !healthy.is_empty());
        cluster.nodes[0].kill();
        // The victim's keys go to the policy once its breaker opens.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut n = 0;
        loop {
            let c = on_victim[n % on_victim.len()];
            n += 1;
            let o = g
                .check(0, &[CheckItem::hit("d|k", c, &quota)])
                .await
                .unwrap();
            if o.degraded.is_some() && g.state() == BreakerState::Open {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the dead master's breaker never opened"
            );
        }
        // The healthy masters' keys: on Redis, every one.
        for round in 0..5 {
            for c in &healthy {
                let o = g
                    .check(0, &[CheckItem::hit("d|k", c, &quota)])
                    .await
                    .unwrap();
                assert!(
                    o.degraded.is_none() && !o.store_failed,
                    "round {round}: {c} (on a healthy master) was decided by the policy"
                );
            }
        }
        // And the victim's keys still go to the policy, without waiting on the dead node.
        let o = g
            .check(0, &[CheckItem::hit("d|k", on_victim[0], &quota)])
            .await
            .unwrap();
        assert!(o.degraded.is_some());
    });
}
