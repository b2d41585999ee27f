//! Redis Cluster faults through the guard ([`Guarded`]), on throwaway clusters on free loopback
//! ports, under load: slot migrations repeated back and forth (some while the source master is
//! frozen long enough to open its breaker) leave no breaker open (every master is back on
//! Redis after every move, without a restart) and a migration alone sends nothing to the
//! failure policy; a master's failover (its replica promoted, `cluster-require-full-coverage
//! no`) sends no decision on the healthy masters' keys to the policy, and the failed master's
//! keys come back to Redis on the promoted replica.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::{migrate, signal, Cluster, RedisServer};
use tollgate_core::{Algorithm, CheckItem, Micros, Quota, Unit};
use tollgate_redis::guard::BreakerState;
use tollgate_redis::{Guarded, Policy, RedisOptions, RedisSettings, RedisStore};

const RULE: &str = "m|k";

fn now() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as Micros
}

fn quota() -> Quota {
    Quota::new(1_000_000_000, Unit::Day)
}

/// The load's limits on each key: one-key counters and the sliding log's two keys (which a
/// migration can split between source and target for a moment: TRYAGAIN).
fn quotas() -> [Quota; 3] {
    [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::Gcra,
    ]
    .map(|a| Quota::new(1_000_000_000, Unit::Day).with_algorithm(a))
}

fn addr(n: &RedisServer) -> String {
    format!("127.0.0.1:{}", n.port)
}

/// Callers hitting `keys` round robin through `g` until stopped, counting calls, errors,
/// decisions by the policy (all, and on keys `watched` says) and the slowest call.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    watched_degraded: Arc<AtomicU64>,
    slowest_us: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(
        rt: &tokio::runtime::Runtime,
        g: &Arc<Guarded>,
        keys: &[String],
        watched: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Load {
        let keys = Arc::new(keys.to_vec());
        let watched = Arc::new(watched);
        let load = Load {
            stop: Arc::default(),
            done: Arc::default(),
            watched_degraded: Arc::default(),
            slowest_us: Arc::default(),
            errors: Arc::default(),
            tasks: Vec::new(),
        };
        let tasks = (0..8)
            .map(|t| {
                let (g, keys, watched) = (g.clone(), keys.clone(), watched.clone());
                let (stop, done, wd, slow, errors) = (
                    load.stop.clone(),
                    load.done.clone(),
                    load.watched_degraded.clone(),
                    load.slowest_us.clone(),
                    load.errors.clone(),
                );
                rt.spawn(async move {
                    let qs = quotas();
                    let mut i = t;
                    while !stop.load(Relaxed) {
                        let k = &keys[i % keys.len()];
                        let q = &qs[(i / keys.len()) % qs.len()];
                        i += 1;
                        let started = Instant::now();
                        match g.check(now(), &[CheckItem::hit(RULE, k, q)]).await {
                            Ok(o) => {
                                if o.degraded.is_some() && watched(k) {
                                    wd.fetch_add(1, Relaxed);
                                }
                            }
                            Err(e) => errors.lock().unwrap().push(e.to_string()),
                        }
                        slow.fetch_max(started.elapsed().as_micros() as u64, Relaxed);
                        done.fetch_add(1, Relaxed);
                        // A decision by the policy awaits nothing: without this, callers
                        // would keep the runtime's workers from the probe (a server's
                        // requests wait on their sockets).
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        Load { tasks, ..load }
    }

    /// Wait for `n` more calls to complete.
    fn wait_calls(&self, n: u64) {
        let target = self.done.load(Relaxed) + n;
        support::wait_for(Duration::from_secs(60), "calls to complete", || {
            self.done.load(Relaxed) >= target
        });
    }

    fn finish(self, rt: &tokio::runtime::Runtime) {
        self.stop.store(true, Relaxed);
        for t in self.tasks {
            rt.block_on(t).unwrap();
        }
        let errors = self.errors.lock().unwrap();
        assert!(
            errors.is_empty(),
            "{} errors, first: {:?}",
            errors.len(),
            errors.first()
        );
    }
}

fn node_state(g: &Guarded, node: &str) -> Option<BreakerState> {
    g.node_stats()
        .into_iter()
        .find(|n| n.node == node)
        .map(|n| n.state)
}

/// Every master that serves slots is healthy, and `key` is decided by Redis.
fn all_back_on_redis(rt: &tokio::runtime::Runtime, g: &Guarded, key: &str) -> bool {
    let q = quota();
    g.state() == BreakerState::Healthy
        && g.node_stats()
            .iter()
            .filter(|n| n.serves_slots)
            .all(|n| n.state == BreakerState::Healthy)
        && rt
            .block_on(g.check(now(), &[CheckItem::hit(RULE, key, &q)]))
            .is_ok_and(|o| o.degraded.is_none())
}

#[test]
fn repeated_slot_migrations_under_load_never_wedge_a_breaker() {
    let cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let rt = support::runtime();
    let opts = RedisOptions {
        prefix: support::unique_prefix("remigrate"),
        ..RedisOptions::default()
    };
    let store = rt
        .block_on(RedisStore::connect(&cluster.url(), opts))
        .unwrap();
    let g = rt.block_on(Guarded::start(store.clone(), RedisSettings::default()));
    let keys: Vec<String> = (0..24).map(|n| format!("m|k=v{n}")).collect();
    let q = quota();
    let moving = keys[0].clone();
    let slot = store.slot_of(&CheckItem::hit(RULE, &moving, &q));
    let owners = rt.block_on(store.slot_owners()).unwrap();
    let owner = owners
        .iter()
        .find(|(a, b, _)| (*a..=*b).contains(&slot))
        .map(|o| o.2.clone())
        .unwrap();
    let masters: Vec<&RedisServer> = cluster.nodes.iter().collect();
    let mut src = *masters.iter().find(|n| addr(n) == owner).unwrap();
    let mut dst = *masters.iter().find(|n| n.port != src.port).unwrap();
    let load = Load::start(&rt, &g, &keys, |_| true);
    load.wait_calls(200);
    let mut plain_moves = Vec::new();
    for round in 0..6 {
        // Every other move: the source freezes first, long enough for its breaker to open,
        // then thaws, and its slot moves while the breaker is still open or half-open.
        let frozen = round % 2 == 1;
        let before = g.degraded_decisions(Policy::Local);
        load.slowest_us.store(0, Relaxed);
        if frozen {
            signal(src.pid(), "-STOP");
            support::wait_for(
                Duration::from_secs(60),
                "the frozen source's breaker to open",
                || node_state(&g, &addr(src)) == Some(BreakerState::Open),
            );
            signal(src.pid(), "-CONT");
        }
        migrate(&masters, slot, src, dst);
        load.wait_calls(200);
        support::wait_for(
            Duration::from_secs(60),
            &format!("every master back on Redis after move {round}"),
            || all_back_on_redis(&rt, &g, &moving),
        );
        if !frozen {
            let degraded = g.degraded_decisions(Policy::Local) - before;
            let slowest = load.slowest_us.load(Relaxed);
            eprintln!(
                "move {round}: {degraded} decisions by the policy, slowest call {slowest} us"
            );
            plain_moves.push(degraded);
        }
        std::mem::swap(&mut src, &mut dst);
    }
    load.finish(&rt);
    assert!(
        plain_moves.iter().all(|d| *d == 0),
        "a migration alone sent decisions to the failure policy: {plain_moves:?}"
    );
    // The frozen moves opened breakers, and every one came back by itself.
    assert!(g.transitions(BreakerState::Open) >= 3);
    assert_eq!(g.state(), BreakerState::Healthy);
}

#[test]
fn a_failover_sends_no_healthy_masters_key_to_the_policy() {
    let mut cluster = Cluster::start_replicated(
        3,
        1,
        &[
            "--cluster-require-full-coverage",
            "no",
            "--cluster-node-timeout",
            "2000",
        ],
    );
    let rt = support::runtime();
    let opts = RedisOptions {
        prefix: support::unique_prefix("failover"),
        ..RedisOptions::default()
    };
    let store = rt
        .block_on(RedisStore::connect(&cluster.url(), opts))
        .unwrap();
    let g = rt.block_on(Guarded::start(store.clone(), RedisSettings::default()));
    let keys: Vec<String> = (0..30).map(|n| format!("m|k=v{n}")).collect();
    let owners = rt.block_on(store.slot_owners()).unwrap();
    let q = quota();
    let owner_of = |k: &str| {
        let slot = store.slot_of(&CheckItem::hit(RULE, k, &q));
        owners
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .map(|o| o.2.clone())
            .unwrap()
    };
    let victim_addr = owner_of(&keys[0]);
    let victim = cluster
        .nodes
        .iter()
        .position(|n| addr(n) == victim_addr)
        .unwrap();
    let replica = cluster
        .nodes
        .iter()
        .position(|n| {
            n.cli(&["INFO", "replication"])
                .contains(&format!("master_port:{}", cluster.nodes[victim].port))
        })
        .expect("the victim's replica");
    let on_victim: Vec<String> = keys
        .iter()
        .filter(|k| owner_of(k) == victim_addr)
        .cloned()
        .collect();
    let victim_keys = on_victim.clone();
    let load = Load::start(&rt, &g, &keys, move |k| !victim_keys.iter().any(|v| v == k));
    load.wait_calls(300);
    cluster.nodes[victim].kill();
    support::wait_for(
        Duration::from_secs(60),
        "the victim's breaker to open",
        || node_state(&g, &victim_addr) == Some(BreakerState::Open),
    );
    support::wait_for(Duration::from_secs(60), "the replica's promotion", || {
        cluster.nodes[replica].cli(&["ROLE"]).starts_with("master")
    });
    support::wait_for(
        Duration::from_secs(60),
        "the victim's keys back on Redis, on the promoted replica",
        || all_back_on_redis(&rt, &g, &on_victim[0]),
    );
    load.wait_calls(300);
    let healthy_degraded = load.watched_degraded.load(Relaxed);
    let total = load.done.load(Relaxed);
    load.finish(&rt);
    eprintln!(
        "{total} calls, {} by the policy, {healthy_degraded} of them on healthy masters' keys",
        g.degraded_decisions(Policy::Local)
    );
    assert_eq!(
        healthy_degraded, 0,
        "keys on healthy masters were decided by the failure policy during another's failover"
    );
    // The dead master's breaker is closed (it serves no slot), not open for good.
    let stats = g.node_stats();
    let dead = stats.iter().find(|n| n.node == victim_addr).unwrap();
    assert!(
        !dead.serves_slots && dead.state == BreakerState::Healthy,
        "{dead:?}"
    );
    assert!(dead.degraded > 0, "{dead:?}");
    assert_eq!(g.state(), BreakerState::Healthy);
}
