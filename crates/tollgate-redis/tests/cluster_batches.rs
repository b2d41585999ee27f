//! Coalescing on a Redis Cluster: one-item checks that arrive while calls are in flight go to
//! each master as one call of the batched function, whose keys span the slots that master
//! serves. On throwaway 3-master clusters: such a batch decides as the memory store decides one
//! request at a time (a bad key failing alone); a key another master serves fails alone having
//! read and written nothing; a slot migrated while batches are in flight decides every request
//! exactly once; and two stores under many concurrent callers never admit more than an exact
//! limit.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::conformance::ALGORITHMS;
use support::{migrate_slot, Cluster, RedisServer};
use tollgate_core::{Algorithm, CheckItem, MemoryStore, Micros, Quota, Store, Unit};
use tollgate_redis::keys::{counter_keys, slot};
use tollgate_redis::script::{self, Call, Mode};
use tollgate_redis::{KeyLayout, RedisOptions, RedisStore};

const RULE: &str = "b|k";
/// An instant every request of a test shares (the batch's time, and the memory store's).
const NOW: Micros = 1_795_000_000 * 1_000_000 + 123_456;

fn options(what: &str) -> RedisOptions {
    RedisOptions {
        prefix: support::unique_prefix(what),
        ttl_grace: Duration::from_secs(3600),
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    }
}

/// The master (`host:port`) serving `slot`, from `CLUSTER SLOTS`.
fn owner(owners: &[(u16, u16, String)], slot: u16) -> &str {
    owners
        .iter()
        .find(|(a, b, _)| (*a..=*b).contains(&slot))
        .map(|o| o.2.as_str())
        .expect("every slot is served")
}

/// `n` counter names (`<tag>=c<i>`) for `quota` whose keys are in distinct slots served by
/// `master`.
fn counters_on(
    prefix: &str,
    tag: &str,
    quota: &Quota,
    owners: &[(u16, u16, String)],
    master: &str,
    n: usize,
) -> Vec<String> {
    let mut seen = HashSet::new();
    (0..)
        .map(|i| format!("{tag}=c{i}"))
        .filter(|c| {
            let s = slot(&counter_keys(prefix, c, quota).0);
            owner(owners, s) == master && seen.insert(s)
        })
        .take(n)
        .collect()
}

/// A 3-master cluster, a store on it (prefix `what`) that knows the slot map (which batches are
/// grouped by; the first batch learns it otherwise), its key prefix and the slot map.
fn cluster_store(
    rt: &tokio::runtime::Runtime,
    what: &str,
) -> (Cluster, RedisStore, String, Vec<(u16, u16, String)>) {
    let cluster = Cluster::start(3);
    let store = rt
        .block_on(RedisStore::connect(&cluster.url(), options(what)))
        .unwrap();
    let prefix = store.options().prefix.clone();
    let owners = rt.block_on(store.slot_owners()).unwrap();
    (cluster, store, prefix, owners)
}

fn masters(owners: &[(u16, u16, String)]) -> Vec<String> {
    let mut m: Vec<String> = owners.iter().map(|o| o.2.clone()).collect();
    m.sort();
    m.dedup();
    m
}

/// Requests of one `join_all` on a current-thread runtime: per master, the first goes alone
/// and the others all join that master's line before its sender runs, so each master gets one
/// batch holding keys of many slots (repeated keys among them, a bad key in the middle). The
/// decisions are the memory store's for the same requests one at a time in arrival order.
#[test]
fn a_batch_spans_the_slots_of_one_master_and_decides_as_one_at_a_time() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (cluster, store, prefix, owners) = cluster_store(&rt, "span");
    let masters = masters(&owners);
    assert_eq!(masters.len(), 3);
    // The function loaded on every master first: a call that must load it first comes back
    // after the batch sent beside it, which would then be decided before it.
    let warm = Quota::new(3, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
    for m in &masters {
        let name = counters_on(&prefix, "warm", &warm, &owners, m, 1).remove(0);
        rt.block_on(store.check(Some(NOW), &[CheckItem::hit(RULE, &name, &warm)]))
            .unwrap();
    }
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let q = Quota::new(3, Unit::Minute).with_algorithm(alg);
        let mem = MemoryStore::with_seed(1000, 7, 11);
        let mut names: Vec<String> = Vec::new();
        for m in &masters {
            let on = counters_on(&prefix, &format!("{alg}"), &q, &owners, m, 8);
            // Each counter twice, one of them five times: some requests are denied.
            names.extend(on.iter().cloned());
            names.extend(on.iter().cloned());
            names.extend(std::iter::repeat_n(on[0].clone(), 3));
        }
        // One counter holds a string that is no counter state: its request fails alone.
        let junk = names[9].clone();
        let junk_key = counter_keys(&prefix, &junk, &q).0;
        let plant = cluster
            .nodes
            .iter()
            .map(|n| n.cli(&["SET", &junk_key, "junk!"]))
            .find(|r| r.contains("OK"));
        assert!(plant.is_some(), "one master takes the junk");
        let by_master = |n: &str| owner(&owners, slot(&counter_keys(&prefix, n, &q).0));
        for m in &masters {
            let slots: HashSet<u16> = names
                .iter()
                .filter(|n| by_master(n) == m)
                .map(|n| slot(&counter_keys(&prefix, n, &q).0))
                .collect();
            assert!(slots.len() >= 8, "{m}: {} slots", slots.len());
        }
        let requests: Vec<CheckItem<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| CheckItem {
                cost: 1 + (i % 2) as u64,
                ..CheckItem::hit(RULE, n, &q)
            })
            .collect();
        let before = store.coalescing();
        let got = rt.block_on(futures_util::future::join_all(
            requests
                .iter()
                .map(|r| store.check(Some(NOW), std::slice::from_ref(r))),
        ));
        let after = store.coalescing();
        assert_eq!(
            (after.calls - before.calls, after.requests - before.requests),
            (6, requests.len() as u64),
            "{alg}: per master, one request alone, then one batch of the rest"
        );
        assert_eq!(
            after.resent, 0,
            "{alg}: every key on the master it was sent to"
        );
        let mut junk_answered = false;
        for (i, (r, got)) in requests.iter().zip(got).enumerate() {
            if r.key == junk {
                let e = got.unwrap_err();
                assert!(e.to_string().contains("not a counter state"), "{alg}: {e}");
                junk_answered = true;
                continue;
            }
            let want = mem.check(NOW, std::slice::from_ref(r)).unwrap();
            assert_eq!(got.unwrap(), want, "{alg}: request {i} ({})", r.key);
        }
        assert!(junk_answered);
    }
}

/// The batched function on one master, called with a key another master serves among its own:
/// that request fails (the node does not serve it) having read and written nothing, the others
/// are decided. (What the store does with such an answer, send it again on its own, is
/// exercised by the migration below.)
#[test]
fn a_key_another_master_serves_fails_alone_and_writes_nothing() {
    let rt = support::runtime();
    let (cluster, store, prefix, owners) = cluster_store(&rt, "alien");
    let masters = masters(&owners);
    let q = Quota::new(2, Unit::Hour).with_algorithm(Algorithm::FixedWindow);
    let mine = counters_on(&prefix, RULE, &q, &owners, &masters[0], 3);
    let alien = counters_on(&prefix, RULE, &q, &owners, &masters[1], 1).remove(0);
    let order = [&mine[0], &mine[1], &mine[0], &alien, &mine[2], &mine[0]];
    let items: Vec<CheckItem<'_>> = order.iter().map(|n| CheckItem::hit(RULE, n, &q)).collect();
    let keys: Vec<_> = order.iter().map(|n| counter_keys(&prefix, n, &q)).collect();
    let call = Call {
        now: Some(NOW),
        reqid: "r",
        mode: Mode::Check,
        single: true,
        grace_ms: 3_600_000,
        layout: KeyLayout::Tollgate,
        jitter_max_s: 0,
        jitter_seed: 0,
        leases: &[],
    };
    let packed: Vec<script::FastItem> = items
        .iter()
        .zip(&keys)
        .map(|(it, k)| script::fast_item(&call, &[(0, it, k)]).unwrap())
        .collect();
    let name = store.function_name().to_string();
    let cmd = script::fast_command(
        &script::fast_function(&name),
        &script::fast_header(Some(NOW), 3_600_000),
        keys.iter().map(|k| k.0.as_str()).zip(&packed),
        script::FastKeys::OnNode,
    );
    let node = cluster
        .nodes
        .iter()
        .find(|n| format!("127.0.0.1:{}", n.port) == masters[0])
        .unwrap();
    let reply = rt.block_on(async {
        let mut c = redis::Client::open(node.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: redis::Value = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(script::library(&name))
            .query_async(&mut c)
            .await
            .unwrap();
        cmd.query_async::<redis::Value>(&mut c).await.unwrap()
    });
    let (now, answers) = script::decode_fast(reply, order.len()).unwrap();
    assert_eq!(now, NOW);
    let allowed: Vec<Result<bool, String>> =
        answers.into_iter().map(|a| a.map(|a| a.allowed)).collect();
    assert_eq!(allowed[..3], [Ok(true), Ok(true), Ok(true)]);
    assert_eq!(allowed[4..], [Ok(true), Ok(false)]);
    let e = allowed[3].clone().unwrap_err();
    assert!(e.contains("non local key"), "{e}");
    // Nothing of the alien counter anywhere; the others hold what the batch decided.
    let query = |n: &str| {
        let q0 = CheckItem {
            cost: 0,
            ..CheckItem::hit(RULE, n, &q)
        };
        rt.block_on(store.check(Some(NOW), &[q0])).unwrap()[0].remaining
    };
    assert_eq!(query(&alien), 2);
    assert_eq!(
        [query(&mine[0]), query(&mine[1]), query(&mine[2])],
        [0, 1, 1]
    );
}

/// Callers on many counters, across every master, while the slot of some of them moves to
/// another master and back, twice (`migrate_slot`: its keys move while the slot is migrating, then
/// every master learns the new owner; a key counted afresh on the target before its move would
/// make the move fail). The store's slot map is stale for a while: a batch's request whose
/// key the node no longer serves goes again on its own. Every call is answered, none is an
/// error, and each counter in Redis holds exactly the calls made on it.
#[test]
fn a_slot_migrated_while_batches_are_in_flight_decides_every_request_once() {
    let rt = support::runtime();
    let (cluster, store, prefix, owners) = cluster_store(&rt, "moving");
    const LIMIT: u64 = 1_000_000_000;
    let q = Quota::new(LIMIT, Unit::Day).with_algorithm(Algorithm::FixedWindow);
    let mut names: Vec<String> = masters(&owners)
        .iter()
        .flat_map(|m| counters_on(&prefix, RULE, &q, &owners, m, 8))
        .collect();
    // The moving slot: the first counter's, with two more counters in it.
    let moving = slot(&counter_keys(&prefix, &names[0], &q).0);
    names.extend(
        (0..)
            .map(|i| format!("{RULE}=same{i}"))
            .filter(|c| slot(&counter_keys(&prefix, c, &q).0) == moving)
            .take(2),
    );
    let names = Arc::new(names);
    let calls: Arc<Vec<AtomicU64>> = Arc::new(names.iter().map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let callers: Vec<_> = (0..16)
        .map(|t| {
            let (store, names, calls) = (store.clone(), names.clone(), calls.clone());
            let (stop, done, errors) = (stop.clone(), done.clone(), errors.clone());
            rt.spawn(async move {
                let mut i = t;
                while !stop.load(Relaxed) {
                    let k = i % names.len();
                    i += 7;
                    let hit = CheckItem::hit(RULE, &names[k], &q);
                    match store.check(Some(NOW), &[hit]).await {
                        Ok(d) => {
                            assert!(d[0].allowed);
                            calls[k].fetch_add(1, Relaxed);
                        }
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                    done.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    support::wait_for_more(&done, 500);
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    let at = |addr: &str| {
        *nodes
            .iter()
            .find(|n| format!("127.0.0.1:{}", n.port) == addr)
            .unwrap()
    };
    let mut src = at(owner(&owners, moving));
    let mut dst = *nodes.iter().find(|n| n.port != src.port).unwrap();
    // There and back, twice, each while the store still learns the move before.
    for _ in 0..4 {
        migrate_slot(&nodes, moving, src, dst);
        support::wait_for_more(&done, 500);
        std::mem::swap(&mut src, &mut dst);
    }
    support::stop_load(&rt, &stop, callers, &errors);
    let c = store.coalescing();
    eprintln!(
        "{} calls: {} batched calls carried {} requests, {} sent again on their own",
        done.load(Relaxed),
        c.calls,
        c.requests,
        c.resent
    );
    assert!(c.calls < c.requests, "batches formed: {c:?}");
    assert!(
        c.resent > 0,
        "a stale slot map sent requests to the old owner"
    );
    // Each counter holds exactly the calls made on it: none lost, none counted twice.
    for (k, n) in names.iter().enumerate() {
        let query = CheckItem {
            cost: 0,
            ..CheckItem::hit(RULE, n, &q)
        };
        let left = rt.block_on(store.check(Some(NOW), &[query])).unwrap()[0].remaining;
        assert_eq!(LIMIT - left, calls[k].load(Relaxed), "counter {n}");
    }
}

/// Two stores (two instances) on one 3-master cluster, 64 concurrent callers each, on counters
/// of every exact algorithm spread over the masters, all at one instant: each counter admits
/// exactly what the memory store admits for the same number of attempts, never more than its
/// limit.
#[test]
fn two_stores_never_admit_more_than_an_exact_limit() {
    let cluster = Cluster::start(3);
    let rt = support::runtime();
    let opts = options("exact");
    let stores: Vec<RedisStore> = (0..2)
        .map(|_| {
            rt.block_on(RedisStore::connect(&cluster.url(), opts.clone()))
                .unwrap()
        })
        .collect();
    const LIMIT: u64 = 7;
    const ATTEMPTS: usize = 19;
    const COUNTERS: usize = 24;
    let quotas: Vec<Quota> = ALGORITHMS
        .iter()
        .map(|&a| Quota::new(LIMIT, Unit::Hour).with_algorithm(a))
        .collect();
    // (counter, quota) pairs, each attempted ATTEMPTS times, interleaved.
    let work: Arc<Vec<(String, usize)>> = Arc::new(
        (0..ATTEMPTS)
            .flat_map(|_| {
                (0..COUNTERS * quotas.len())
                    .map(|i| (format!("{RULE}=x{}", i / quotas.len()), i % quotas.len()))
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let admitted: Arc<Vec<AtomicU64>> = Arc::new(
        (0..COUNTERS * quotas.len())
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let errors = Arc::new(AtomicU64::new(0));
    let quotas = Arc::new(quotas);
    let tasks: Vec<_> = stores
        .iter()
        .flat_map(|s| (0..64).map(move |_| s.clone()))
        .map(|store| {
            let (work, next, admitted, errors, quotas) = (
                work.clone(),
                next.clone(),
                admitted.clone(),
                errors.clone(),
                quotas.clone(),
            );
            rt.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    let Some((name, qi)) = work.get(i) else {
                        return;
                    };
                    let hit = CheckItem::hit(RULE, name, &quotas[*qi]);
                    match store.check(Some(NOW), &[hit]).await {
                        Ok(d) if d[0].allowed => {
                            admitted[i % (COUNTERS * quotas.len())].fetch_add(1, Relaxed);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            errors.fetch_add(1, Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    assert_eq!(errors.load(Relaxed), 0);
    for (qi, q) in quotas.iter().enumerate() {
        let mem = MemoryStore::new(1000);
        let want = (0..ATTEMPTS)
            .filter(|_| mem.check(NOW, &[CheckItem::hit(RULE, "one", q)]).unwrap()[0].allowed)
            .count() as u64;
        assert!(want <= LIMIT, "{}: {want}", q.algorithm());
        for c in 0..COUNTERS {
            let got = admitted[c * quotas.len() + qi].load(Relaxed);
            assert_eq!(got, want, "{} counter {c}", q.algorithm());
        }
    }
    for (i, s) in stores.iter().enumerate() {
        let c = s.coalescing();
        eprintln!(
            "store {i}: {} batched calls carried {} requests",
            c.calls, c.requests
        );
        assert!(c.calls < c.requests, "store {i} batched: {c:?}");
    }
}
