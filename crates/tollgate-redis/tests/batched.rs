//! `sync: batched` across instances: several guarded stores (each its own connection, instance
//! id and batches, as separate processes have) on one real redis-server. The flushes are driven
//! by the test (`Guarded::flush`) at a fixed caller time, so what each instance admits between
//! two of its flushes is what the test lets it, and the stated bound is computed from that, not
//! from timing: `limit ≤ admitted ≤ limit + 2 × (N − 1) × u` per window (docs/distributed.md).
//! Then idempotency (a flush Redis applied but whose answer never came, sent again: counted
//! once) and a stopped Redis (the failure policy decides; the units are counted once after it
//! comes back, by itself).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{signal, RedisServer};
use tollgate_core::{Algorithm, CheckItem, Micros, Quota, SyncMode, Unit};
use tollgate_redis::guard::Policy;
use tollgate_redis::keys::counter_keys;
use tollgate_redis::{Guarded, RedisOptions, RedisSettings, RedisStore};

fn wall_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as Micros
}

/// An instance deciding at the caller's time, flushing only when told to (the background flush
/// runs hourly: never within a test).
async fn instance(url: &str, prefix: &str, policy: Policy) -> Arc<Guarded> {
    let opts = RedisOptions {
        prefix: prefix.to_owned(),
        timeout: Duration::from_millis(200),
        patience: Duration::from_millis(300),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(url, opts).await.unwrap();
    let settings = RedisSettings {
        caller_clock: true,
        policy,
        flush_interval: Duration::from_secs(3600),
        ..RedisSettings::default()
    };
    Guarded::start(store, settings).await
}

/// The state Redis holds for `key`, as text: "start count" (fixed window) or "start prev
/// count" (sliding window counter); empty when there is none. (Stored as numbers packed
/// little-endian, the last one the time its TTL was set: see `scripts/common.lua`.)
fn redis_state(server: &RedisServer, prefix: &str, key: &str, quota: &Quota) -> String {
    let name = counter_keys(prefix, key, quota).0;
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let v: Option<Vec<u8>> = redis::cmd("GET").arg(&name).query(&mut con).unwrap();
    let numbers = tollgate_redis::script::numbers(&v.unwrap_or_default());
    let fields = numbers.len().saturating_sub(1);
    numbers[..fields]
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The count Redis holds for `key` (the last field of the counter's state).
fn redis_count(server: &RedisServer, prefix: &str, key: &str, quota: &Quota) -> u64 {
    redis_state(server, prefix, key, quota)
        .split_whitespace()
        .last()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// One round: `callers` concurrent one-unit requests on each instance at `now`; the number
/// admitted per instance.
async fn round(
    fleet: &[Arc<Guarded>],
    callers: usize,
    now: Micros,
    key: &'static str,
    quota: Quota,
) -> Vec<u64> {
    let counts: Vec<Arc<AtomicU64>> = fleet.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (g, n) in fleet.iter().zip(&counts) {
        for _ in 0..callers {
            let (g, n) = (g.clone(), n.clone());
            tasks.push(tokio::spawn(async move {
                let out = g
                    .check(now, &[CheckItem::hit("hot", key, &quota)])
                    .await
                    .unwrap();
                assert!(out.degraded.is_none(), "Redis answered");
                if out.decisions[0].allowed {
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    counts.iter().map(|n| n.load(Ordering::Relaxed)).collect()
}

/// Poll `ok` until it holds (a condition the background flusher brings about, not a timing
/// assumption); panics after `within`.
async fn until(within: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 3 instances × 32 callers on one hot key, each instance's counts flushed after each round:
/// the fleet admits at least the limit and at most the limit plus `2 × (N − 1) × u`, `u` = 32
/// (what one instance admits between two of its flushes); every admitted unit is in Redis once.
/// Twice: flushes driven by the test at a fixed time, then by the instances' own flushers on
/// the limit's `flush_interval` (20 ms, the instances' default being an hour), at the wall
/// clock, each round waiting for every unit to be confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_stay_within_the_stated_bound() {
    const N: u64 = 3;
    const CALLERS: u64 = 32;
    const LIMIT: u64 = 1_000;
    let server = RedisServer::start(&[]);
    // Mid-window, so that every round is in one window.
    let now = {
        let t = wall_now();
        t - t % 3_600_000_000 + 1_800_000_000
    };
    let own = Some(Duration::from_millis(20));
    for (alg, interval) in [
        (Algorithm::FixedWindow, None),
        (Algorithm::SlidingWindowCounter, None),
        (Algorithm::FixedWindow, own),
        (Algorithm::SlidingWindowCounter, own),
    ] {
        let quota = Quota::new(LIMIT, Unit::Hour)
            .with_algorithm(alg)
            .with_sync(SyncMode::Batched)
            .with_flush_interval(interval);
        // Its own flusher decides at the wall clock: so do the requests.
        let at = || if interval.is_some() { wall_now() } else { now };
        let hour = |t: Micros| t / 3_600_000_000;
        for run in 0..3 {
            let prefix = format!("batched-{alg}-{interval:?}-{run}");
            let began = at();
            let mut fleet = Vec::new();
            for _ in 0..N {
                fleet.push(instance(&server.url(), &prefix, Policy::Deny).await);
            }
            let mut admitted = 0;
            let mut rounds = 0;
            loop {
                let got = round(&fleet, CALLERS as usize, at(), "hot|tenant=a", quota).await;
                for n in &got {
                    assert!(*n <= CALLERS);
                }
                rounds += 1;
                if interval.is_some() {
                    until(Duration::from_secs(30), "every unit confirmed", || {
                        fleet.iter().all(|g| g.batch_stats().2 == 0)
                    })
                    .await;
                } else {
                    for g in &fleet {
                        g.flush(now).await.expect("flushed");
                    }
                }
                let sum: u64 = got.iter().sum();
                admitted += sum;
                if sum == 0 {
                    break;
                }
                assert!(rounds < 100, "the fleet stops admitting");
            }
            if hour(began) != hour(at()) {
                eprintln!("{alg} run {run}: the hour rolled over during the run; not measured");
                continue;
            }
            let bound = LIMIT + 2 * (N - 1) * CALLERS;
            eprintln!(
                "{alg} flush interval {interval:?} run {run}: {admitted} admitted in {rounds} rounds (limit {LIMIT}, overshoot {}, bound {bound})",
                admitted.saturating_sub(LIMIT)
            );
            assert!(
                (LIMIT..=bound).contains(&admitted),
                "{alg} run {run}: {admitted} admitted, limit {LIMIT}, bound {bound}"
            );
            assert_eq!(
                redis_count(&server, &prefix, "hot|tenant=a", &quota),
                admitted,
                "{alg} run {run}: Redis holds every admitted unit, once"
            );
            // What the limit cost Redis, per limit: far fewer calls than decisions.
            let (mut decisions, mut calls, mut flushes, mut over) = (0, 0, 0, 0);
            for g in &fleet {
                let per = g.limit_stats().get("hot");
                assert_eq!(per.mode(), SyncMode::Batched);
                decisions += per.decisions.load(Ordering::Relaxed);
                calls += per.redis_calls.load(Ordering::Relaxed);
                flushes += per.flushes.load(Ordering::Relaxed);
                over = over.max(per.overshoot.load(Ordering::Relaxed));
                assert_eq!(g.batch_stats().2, 0, "nothing left unconfirmed");
            }
            assert_eq!(decisions, N * CALLERS * rounds);
            assert!(
                flushes > 0 && calls < decisions,
                "{calls} calls for {decisions} decisions"
            );
            // On its own interval, a count gone stale is checked on Redis (exact): the last
            // units may be counted there, where no flush reports them.
            if interval.is_some() {
                assert!(over <= admitted - LIMIT, "{over} reported over");
            } else if alg == Algorithm::FixedWindow {
                assert_eq!(
                    over,
                    admitted - LIMIT,
                    "the last flush saw the whole overshoot"
                );
            }
        }
    }
}

/// A flush Redis applies but whose answer never arrives (Redis stopped while it is on the
/// wire) is sent again, under the same sequence: counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_flush_counts_once() {
    let server = RedisServer::start(&[]);
    let prefix = "batched-retry";
    let quota = Quota::new(1_000, Unit::Day)
        .with_algorithm(Algorithm::FixedWindow)
        .with_sync(SyncMode::Batched);
    let key = "hot|tenant=retry";
    let g = instance(&server.url(), prefix, Policy::Deny).await;
    let now = wall_now();
    let check = || async {
        let out = g
            .check(now, &[CheckItem::hit("hot", key, &quota)])
            .await
            .unwrap();
        assert!(out.decisions[0].allowed && out.degraded.is_none());
    };
    // The first request is decided by Redis (the count is learned), the next 9 locally.
    for _ in 0..10 {
        check().await;
    }
    assert_eq!(g.batch_stats().0.local_decisions.load(Ordering::Relaxed), 9);
    assert_eq!(g.flush(now).await.unwrap(), 1);
    assert_eq!(redis_count(&server, prefix, key, &quota), 10);
    for _ in 0..5 {
        check().await;
    }
    // Stopped: the flush reaches the server's socket, times out, and is applied on resume.
    signal(server.pid(), "-STOP");
    let r = g.flush(now).await;
    signal(server.pid(), "-CONT");
    assert!(r.is_err(), "the answer never came: {r:?}");
    support::wait_for(Duration::from_secs(10), "the stalled flush applied", || {
        redis_count(&server, prefix, key, &quota) == 15
    });
    assert_eq!(g.batch_stats().2, 5, "unconfirmed until an answer comes");
    // Sent again (same sequence): not applied twice, and the count is learned.
    assert_eq!(g.flush(now).await.unwrap(), 1);
    assert_eq!(redis_count(&server, prefix, key, &quota), 15);
    assert_eq!(g.batch_stats().2, 0);
    for _ in 0..3 {
        check().await;
    }
    g.flush(now).await.unwrap();
    assert_eq!(redis_count(&server, prefix, key, &quota), 18);
}

/// Redis stopped: the breaker opens and the failure policy decides the batched limit too; the
/// units admitted before are counted once when Redis answers again, and decisions return to
/// the batches by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_hands_over_to_the_policy_and_nothing_counts_twice() {
    let server = RedisServer::start(&[]);
    let prefix = "batched-faults";
    let quota = Quota::new(1_000, Unit::Day)
        .with_algorithm(Algorithm::FixedWindow)
        .with_sync(SyncMode::Batched);
    let exact = Quota::new(1_000, Unit::Day).with_algorithm(Algorithm::FixedWindow);
    let key = "hot|tenant=faults";
    let g = instance(&server.url(), prefix, Policy::Deny).await;
    // The wall clock: the breaker counts how long timeouts last by the callers' times.
    let check = |q: &'static Quota, k: &'static str| {
        let g = g.clone();
        async move {
            g.check(wall_now(), &[CheckItem::hit("hot", k, q)])
                .await
                .unwrap()
        }
    };
    let (quota, exact): (&'static Quota, &'static Quota) =
        (Box::leak(Box::new(quota)), Box::leak(Box::new(exact)));
    for _ in 0..10 {
        assert!(check(quota, key).await.decisions[0].allowed);
    }
    g.flush(wall_now()).await.unwrap();
    for _ in 0..5 {
        assert!(check(quota, key).await.decisions[0].allowed);
    }
    signal(server.pid(), "-STOP");
    let flushed = g.flush(wall_now()).await;
    assert!(flushed.is_err());
    // Calls on an exact limit time out until the breaker opens; then the batched limit is
    // decided by the policy (deny) as well, without Redis.
    let mut opened = false;
    for _ in 0..100 {
        if check(exact, "hot|tenant=other").await.degraded.is_some()
            && g.state() == tollgate_redis::guard::BreakerState::Open
        {
            opened = true;
            break;
        }
    }
    assert!(opened, "the breaker opens");
    let out = check(quota, key).await;
    assert_eq!(out.degraded, Some(Policy::Deny));
    assert!(!out.decisions[0].allowed);
    signal(server.pid(), "-CONT");
    // Back by itself (the probe), then decided from the batches again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while g.state() == tollgate_redis::guard::BreakerState::Open {
        assert!(std::time::Instant::now() < deadline, "Redis decides again");
        // Polling a condition (the probe closes the breaker), not a timing assumption.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = check(quota, key).await;
    assert!(out.degraded.is_none() && out.decisions[0].allowed);
    // The batch that failed goes first, as it was; what was admitted since, with the next.
    assert_eq!(g.flush(wall_now()).await.unwrap(), 1);
    assert_eq!(redis_count(&server, prefix, key, quota), 15);
    assert_eq!(g.flush(wall_now()).await.unwrap(), 1);
    assert_eq!(
        redis_count(&server, prefix, key, quota),
        16,
        "10 + 5 (flushed once, though sent twice) + 1"
    );
}

/// Units belong to the window they were admitted in: flushed after the window rolled over, a
/// sliding counter's go to its previous window (where they still weigh), a fixed window's are
/// dropped (their window is over); the new window's go to the new window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_count_in_the_window_they_were_admitted_in() {
    let server = RedisServer::start(&[]);
    let minute: Micros = 60_000_000;
    let w = {
        let t = wall_now();
        t - t % minute
    };
    for (alg, want) in [
        (
            Algorithm::SlidingWindowCounter,
            format!("{} 10 5", w + minute),
        ),
        (Algorithm::FixedWindow, format!("{} 5", w + minute)),
    ] {
        let prefix = format!("batched-windows-{alg}");
        let quota = Quota::new(100, Unit::Minute)
            .with_algorithm(alg)
            .with_sync(SyncMode::Batched);
        let g = instance(&server.url(), &prefix, Policy::Deny).await;
        let key = "hot|tenant=windows";
        let hit = |t: Micros| {
            let g = g.clone();
            async move {
                let out = g
                    .check(t, &[CheckItem::hit("hot", key, &quota)])
                    .await
                    .unwrap();
                assert!(out.decisions[0].allowed && out.degraded.is_none());
            }
        };
        // One decided by Redis, nine locally, in window w; five more in the next window.
        for _ in 0..10 {
            hit(w + minute / 2).await;
        }
        for _ in 0..5 {
            hit(w + minute + 1_000_000).await;
        }
        g.flush(w + minute + 2_000_000).await.unwrap();
        assert_eq!(redis_state(&server, &prefix, key, &quota), want, "{alg}");
        assert_eq!(g.batch_stats().2, 0, "{alg}: nothing left to send");
    }
}

/// Two batched limits with their own `flush_interval` (20 ms and 400 ms) in one instance, its
/// default an hour: each counter's flushes (per limit, as the instance reports them) follow its
/// own interval. A counter is flushed at most once per step of its interval's grid, so over a
/// run from `began` to `ended` the 400 ms counter is flushed at most once per 400 ms step
/// however often the 20 ms one is; then the 20 ms limit is reloaded to 400 ms and follows that.
/// Every admitted unit reaches Redis once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_is_flushed_on_its_own_interval() {
    let server = RedisServer::start(&[]);
    let prefix = "batched-intervals";
    let base = Quota::new(1_000_000, Unit::Day)
        .with_algorithm(Algorithm::FixedWindow)
        .with_sync(SyncMode::Batched);
    let ms = Duration::from_millis;
    let fast = base.with_flush_interval(Some(ms(20)));
    let slow = base.with_flush_interval(Some(ms(400)));
    let g = instance(&server.url(), prefix, Policy::Deny).await;
    let flushes = |rule: &str| g.limit_stats().get(rule).flushes.load(Ordering::Relaxed);
    // Grid steps of `every` from `began` to `ended`: the most flushes a counter can have had.
    let steps = |began: Micros, ended: Micros, every: Duration| {
        let every = every.as_micros() as Micros;
        ended / every - began / every
    };
    // Units admitted per limit.
    let phase = |fast: Quota, want_fast: u64| {
        let g = g.clone();
        async move {
            let mut admitted = [0u64; 2];
            let began = wall_now();
            let before = [flushes("fast"), flushes("slow")];
            let mut counts = before;
            // Requests on both until the fast one has flushed `want_fast` times and the slow one
            // twice (events the flusher brings about; the pace of requests is arbitrary).
            while counts[0] - before[0] < want_fast || counts[1] - before[1] < 2 {
                for (i, (rule, q)) in [("fast", &fast), ("slow", &slow)].into_iter().enumerate() {
                    let key = format!("{rule}|tenant=a");
                    let out = g
                        .check(wall_now(), &[CheckItem::hit(rule, &key, q)])
                        .await
                        .unwrap();
                    assert!(out.decisions[0].allowed && out.degraded.is_none());
                    admitted[i] += 1;
                }
                tokio::time::sleep(ms(2)).await;
                counts = [flushes("fast"), flushes("slow")];
                assert!(counts[0] - before[0] < 10_000, "the slow limit flushes");
            }
            let ended = wall_now();
            let n = [counts[0] - before[0], counts[1] - before[1]];
            let fast_every = fast.flush_interval().unwrap();
            eprintln!(
                "fast ({fast_every:?}): {} flushes, slow (400ms): {} flushes over {} ms",
                n[0],
                n[1],
                (ended - began) / 1000
            );
            assert!(n[0] <= steps(began, ended, fast_every), "{n:?}");
            assert!(n[1] <= steps(began, ended, ms(400)), "{n:?}");
            admitted
        }
    };
    let first = phase(fast, 10).await;
    // Reloaded: the same limit flushed every 400 ms from now on (its pending units kept).
    let second = phase(fast.with_flush_interval(Some(ms(400))), 2).await;
    let admitted = [first[0] + second[0], first[1] + second[1]];
    g.flush(wall_now()).await.unwrap();
    for (i, (rule, q)) in [("fast", &fast), ("slow", &slow)].into_iter().enumerate() {
        let key = format!("{rule}|tenant=a");
        assert_eq!(
            redis_count(&server, prefix, &key, q),
            admitted[i],
            "{rule}: every unit once"
        );
    }
}
