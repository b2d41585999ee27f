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

    // Every node forgets the script: the next calls reload it transparently.
    for n in &cluster.nodes {
        assert!(n.cli(&["SCRIPT", "FLUSH"]).contains("OK"));
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
    let wait_for_calls = |n: u64| {
        let target = done.load(Relaxed) + n;
        support::wait_for(Duration::from_secs(60), "calls to complete", || {
            done.load(Relaxed) >= target
        });
    };
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
    wait_for_calls(1_000);
    for n in &cluster.nodes {
        assert!(n
            .cli(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id])
            .contains("OK"));
    }
    wait_for_calls(1_000);
    stop.store(true, Relaxed);
    for c in callers {
        rt.block_on(c).unwrap();
    }
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        errors.first()
    );
    // No count lost: every call counted once, on the node that owns the slot now.
    let query = CheckItem {
        cost: 0,
        ..CheckItem::hit("d|k", counter, &quota)
    };
    let left = rt.block_on(store.check(None, &[query])).unwrap()[0].remaining;
    assert_eq!(LIMIT - left, done.load(Relaxed) + 1);
    assert!(!dst.cli(&["GET", &main]).contains("MOVED"));
}
