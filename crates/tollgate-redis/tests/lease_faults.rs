//! `sync: lease` under Redis faults, on private `redis-server` processes: three guarded stores
//! (each its own connections, leases and probe, as separate processes have) with many callers
//! each on one hot key, while Redis is frozen (`SIGSTOP`, then `SIGCONT`) or killed and
//! restarted empty on the same port.
//!
//! What must hold, whatever the timing:
//!
//! - a frozen Redis keeps its counts: with the `deny` policy the window never admits more than
//!   its limit; with `local`, Redis' decisions and the leases together never do, and each
//!   instance admits at most its share (`limit / instances`) by itself, all of it folded into
//!   Redis afterwards; the units in hand are spent during the stall;
//! - a Redis restarted empty has lost the count: from the restart on, the window admits at most
//!   its limit plus the units the instances still held from before (each spent or given back,
//!   once); the new count is never above what was admitted after the restart;
//! - decisions come back from Redis by themselves (waited for by polling).
//!
//! docs/distributed.md ("Failures") states these bounds for users.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{signal, RedisServer};
use tollgate_core::{Algorithm, CheckItem, Micros, Quota, SyncMode, Unit};
use tollgate_redis::guard::BreakerState;
use tollgate_redis::{Guarded, Policy, RedisOptions, RedisSettings, RedisStore};

const INSTANCES: usize = 3;
const CALLERS: usize = 8;
/// The hot key's limit per day (a day: the window does not roll during a run, and when it does
/// the run says so and checks the bound of two windows).
const LIMIT: u64 = 6_000;
const KEY: &str = "hot|tenant=acme";
/// Generous deadline of every wait for a condition.
const DEADLINE: Duration = Duration::from_secs(60);

fn wall_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as Micros
}

fn utc_day() -> u64 {
    wall_now() / 86_400_000_000
}

fn quota(alg: Algorithm) -> Quota {
    Quota::new(LIMIT, Unit::Day)
        .with_algorithm(alg)
        .with_sync(SyncMode::Lease)
}

async fn instance(port: u16, prefix: &str, policy: Policy) -> Arc<Guarded> {
    let opts = RedisOptions {
        prefix: prefix.to_owned(),
        // Generous: a loaded machine's slow calls must not look like the outage under test.
        timeout: Duration::from_millis(200),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), opts)
        .await
        .unwrap();
    let settings = RedisSettings {
        policy,
        expected_instances: INSTANCES as u64,
        ..RedisSettings::default()
    };
    Guarded::start(store, settings).await
}

/// Decisions of one instance's callers, by phase of the test: `[phase][degraded][allowed]`,
/// and those Redis made (a call answered, not a lease nor the policy), by phase.
#[derive(Default)]
struct Tally([[[AtomicU64; 2]; 2]; 4], [AtomicU64; 4]);

impl Tally {
    fn get(&self, phase: usize, degraded: bool, allowed: bool) -> u64 {
        self.0[phase][degraded as usize][allowed as usize].load(Relaxed)
    }
    /// Admitted in `phases`, (by Redis or a lease, by the failure policy).
    fn admitted(&self, phases: std::ops::Range<usize>) -> (u64, u64) {
        phases.fold((0, 0), |(s, d), p| {
            (s + self.get(p, false, true), d + self.get(p, true, true))
        })
    }
}

/// `CALLERS` tasks per instance sending one-unit requests on [`KEY`] until stopped; each
/// decision is tallied under the phase current when its request started.
struct Load {
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicUsize>,
    tallies: Vec<Arc<Tally>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(fleet: &[Arc<Guarded>], quota: Quota) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(AtomicUsize::new(0));
        let tallies: Vec<Arc<Tally>> = fleet.iter().map(|_| Arc::default()).collect();
        let mut tasks = Vec::new();
        for (g, tally) in fleet.iter().zip(&tallies) {
            for _ in 0..CALLERS {
                let (g, tally, stop, phase) =
                    (g.clone(), tally.clone(), stop.clone(), phase.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Relaxed) {
                        let p = phase.load(Relaxed);
                        let out = g
                            .check(wall_now(), &[CheckItem::hit("hot", KEY, &quota)])
                            .await
                            .unwrap();
                        let (degraded, allowed) =
                            (out.degraded.is_some(), out.decisions[0].allowed);
                        tally.0[p][degraded as usize][allowed as usize].fetch_add(1, Relaxed);
                        if out.receipt.is_some() {
                            tally.1[p].fetch_add(1, Relaxed);
                        }
                        // Pacing (not synchronisation): a decision made without an await point
                        // (a lease, the policy) must not keep the worker from other tasks.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }));
            }
        }
        Load {
            stop,
            phase,
            tallies,
            tasks,
        }
    }

    fn enter(&self, phase: usize) {
        self.phase.store(phase, Relaxed);
    }

    async fn finish(self) -> Vec<Arc<Tally>> {
        self.stop.store(true, Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.tallies
    }
}

/// Poll `ok` every 20 ms until it holds; fail naming `what` after [`DEADLINE`].
async fn until(what: &str, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

fn held(fleet: &[Arc<Guarded>]) -> u64 {
    fleet.iter().map(|g| g.lease_stats().1).sum()
}

/// Every instance's breaker is closed and Redis decided one of its requests in `phase`.
fn redis_decides(fleet: &[Arc<Guarded>], tallies: &[Arc<Tally>], phase: usize) -> bool {
    fleet
        .iter()
        .zip(tallies)
        .all(|(g, t)| g.state() == BreakerState::Healthy && t.1[phase].load(Relaxed) > 0)
}

/// What the counter has left, by a cost-0 query (no lease, no count).
async fn remaining(port: u16, prefix: &str, quota: Quota) -> u64 {
    let opts = RedisOptions {
        prefix: prefix.to_owned(),
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), opts)
        .await
        .unwrap();
    let exact = quota.with_sync(SyncMode::Exact);
    let item = CheckItem {
        cost: 0,
        ..CheckItem::hit("hot", KEY, &exact)
    };
    store.check(None, &[item]).await.unwrap()[0].remaining
}

/// Phases of the stall test.
const BEFORE: usize = 0;
const STALLED: usize = 1;
const RESUMED: usize = 2;

/// One run: load, `SIGSTOP` for 3 s, `SIGCONT`, recovery, then the rest of the limit.
async fn stall_run(policy: Policy, alg: Algorithm, run: usize) {
    let server = RedisServer::start(&[]);
    let prefix = format!("lease-stop-{}-{alg}-{run}", policy.as_str());
    let q = quota(alg);
    let mut fleet = Vec::new();
    for _ in 0..INSTANCES {
        fleet.push(instance(server.port, &prefix, policy).await);
    }
    let day = utc_day();
    let load = Load::start(&fleet, q);
    let tallies = load.tallies.clone();
    let admitted = |phases: std::ops::Range<usize>| {
        tallies.iter().fold((0, 0), |(s, d), t| {
            let (a, b) = t.admitted(phases.clone());
            (s + a, d + b)
        })
    };
    until("a tenth of the limit admitted and units in hand", || {
        admitted(BEFORE..1).0 >= LIMIT / 10 && held(&fleet) > 0
    })
    .await;

    load.enter(STALLED);
    signal(server.pid(), "-STOP");
    let held_at_stop = held(&fleet);
    // The length of the stall (not a synchronisation: what follows waits for conditions).
    tokio::time::sleep(Duration::from_secs(3)).await;
    until("every breaker open and every unit in hand spent", || {
        fleet.iter().all(|g| g.state() == BreakerState::Open) && held(&fleet) == 0
    })
    .await;
    let (spent, _) = admitted(STALLED..RESUMED);
    assert!(
        spent >= held_at_stop,
        "{alg}: the {held_at_stop} units in hand at the stop were spent during the stall \
         (admitted without the policy: {spent})"
    );

    load.enter(RESUMED);
    signal(server.pid(), "-CONT");
    let back = until("Redis deciding again for every instance", || {
        redis_decides(&fleet, &tallies, RESUMED)
    })
    .await;
    // The rest of the limit: until Redis has nothing left and nothing is in hand.
    let mut left = u64::MAX;
    let start = Instant::now();
    while left > 0 || held(&fleet) > 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "{alg}: the limit was never used up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = remaining(server.port, &prefix, q).await;
    }
    let tallies = load.finish().await;
    for g in &fleet {
        g.return_leases(wall_now()).await;
    }
    let left = remaining(server.port, &prefix, q).await;
    let (by_redis, by_policy) = admitted(BEFORE..4);
    let windows = if utc_day() == day { 1 } else { 2 };
    let limit = windows * LIMIT;
    eprintln!(
        "{} {alg} run {run}: {by_redis} admitted by Redis and leases, {by_policy} by the \
         policy (limit {LIMIT}, {windows} window(s)); {held_at_stop} units in hand at the \
         stop; Redis deciding again {back:?} after SIGCONT",
        policy.as_str()
    );
    assert!(
        by_redis + left <= limit,
        "{alg}: Redis and the leases admitted {by_redis} with {left} left: over {limit}"
    );
    match policy {
        Policy::Deny => assert_eq!(by_policy, 0, "deny admits nothing by itself"),
        Policy::Local => {
            for (i, (g, t)) in fleet.iter().zip(&tallies).enumerate() {
                let (_, local) = t.admitted(BEFORE..4);
                let share = windows * LIMIT / INSTANCES as u64;
                assert!(
                    local <= share,
                    "{alg}: instance {i} admitted {local} by itself, its share is {share}"
                );
                // Every local admission is folded into Redis (by the probe, before traffic
                // goes back to it, or by a later one).
                eprintln!("instance {i}: local {local}, folded {:?}", g.folded());
                until("the local admissions folded into Redis", || {
                    g.folded().1 == local
                })
                .await;
            }
        }
        Policy::Allow => unreachable!("fail-open has no bound"),
    }
}

/// `SIGSTOP` freezes Redis with its counts (a stuck host, a long fork, a paused VM): the units in
/// hand are spent, then the policy decides; after `SIGCONT` Redis decides again by itself, and
/// the window stays within the policy's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_keeps_leased_limits_within_the_policy_bound() {
    stall_run(Policy::Deny, Algorithm::FixedWindow, 0).await;
    stall_run(Policy::Local, Algorithm::SlidingWindowCounter, 0).await;
}

/// Phases of the restart test.
const UP: usize = 0;
const DOWN: usize = 1;
const RESTARTED: usize = 2;

/// One run: load, `kill -9`, a new empty `redis-server` on the same port, recovery, the rest of
/// the new count's limit.
async fn restart_run(alg: Algorithm, run: usize) {
    let mut server = RedisServer::start(&[]);
    let port = server.port;
    let prefix = format!("lease-kill-{alg}-{run}");
    let q = quota(alg);
    let mut fleet = Vec::new();
    for _ in 0..INSTANCES {
        fleet.push(instance(port, &prefix, Policy::Deny).await);
    }
    let day = utc_day();
    let load = Load::start(&fleet, q);
    let tallies = load.tallies.clone();
    let admitted = |phases: std::ops::Range<usize>| {
        tallies.iter().fold((0, 0), |(s, d), t| {
            let (a, b) = t.admitted(phases.clone());
            (s + a, d + b)
        })
    };
    until("a tenth of the limit admitted and units in hand", || {
        admitted(UP..1).0 >= LIMIT / 10 && held(&fleet) > 0
    })
    .await;
    load.enter(DOWN);
    server.kill();
    // Redis is down: no unit is granted until it is back, so what is held can only go down;
    // what is held just before the restart bounds what the old Redis' leases add after it.
    let held_before_restart = held(&fleet);
    load.enter(RESTARTED);
    let server = RedisServer::start_on(port, &[]);
    // (An instance may spend units held from the old Redis first.)
    let back = until("Redis deciding again for every instance", || {
        redis_decides(&fleet, &tallies, RESTARTED)
    })
    .await;
    let mut left = u64::MAX;
    let start = Instant::now();
    while left > 0 || held(&fleet) > 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "{alg}: the limit was never used up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = remaining(port, &prefix, q).await;
    }
    let _ = load.finish().await;
    for g in &fleet {
        g.return_leases(wall_now()).await;
    }
    let left = remaining(port, &prefix, q).await;
    let windows = if utc_day() == day { 1 } else { 2 };
    let (before, _) = admitted(UP..DOWN);
    let (since_kill, by_policy) = admitted(DOWN..3);
    let (after, _) = admitted(RESTARTED..3);
    let counted = LIMIT - left;
    eprintln!(
        "{alg} run {run}: {before} admitted before the kill, {after} after the restart \
         ({counted} counted by the new Redis), {held_before_restart} units held from the old \
         one at the restart; Redis deciding again {back:?} after the restart"
    );
    assert_eq!(by_policy, 0, "deny admits nothing by itself");
    // The old Redis counted everything admitted before the kill.
    assert!(
        before <= windows * LIMIT,
        "{alg}: {before} admitted before the kill"
    );
    // From the restart: the limit plus the units held from before (each spent, or given back to
    // the new count, once), never more.
    let bound = windows * LIMIT + held_before_restart;
    assert!(
        after <= bound,
        "{alg}: {after} admitted after the restart, bound {bound}"
    );
    // Nothing counted twice: the new count is never above what was admitted since the kill
    // (a request sent while Redis was down may reach the new one), and it misses at most the
    // old units spent or given back after the restart.
    assert!(
        counted <= since_kill && after <= counted + held_before_restart,
        "{alg}: the new Redis counted {counted}; {since_kill} admitted since the kill, {after} \
         since the restart; {held_before_restart} held from before"
    );
    drop(server);
}

/// `kill -9` and an empty restart on the same port under load: the old count is gone, the
/// window admits at most its limit plus the units held from before, nothing is counted twice,
/// and Redis decides again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_admits_at_most_the_limit_plus_units_held() {
    restart_run(Algorithm::FixedWindow, 0).await;
    restart_run(Algorithm::SlidingWindowCounter, 0).await;
}

/// Calls of the check functions Redis has run since its statistics were reset (`FCALL`, or
/// `EVALSHA`/`EVAL` where functions are unavailable).
fn check_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// While Redis is frozen, the callers of one leased counter with nothing in hand send one call
/// between them (the refill), not one each: the others wait for it, count toward opening the
/// breaker as their own slow calls would, and are answered by the policy when it opens. After
/// `SIGCONT` Redis has received that one call, and decides again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_gets_one_refill_per_counter_not_one_call_per_request() {
    const WAITERS: usize = 64;
    let server = RedisServer::start(&[]);
    let g = instance(server.port, "lease-single-flight", Policy::Deny).await;
    let q = quota(Algorithm::FixedWindow);
    // The function is loaded and the connection up before the freeze (another counter).
    g.check(wall_now(), &[CheckItem::hit("hot", "warm|up=1", &q)])
        .await
        .unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    signal(server.pid(), "-STOP");
    // Requests that start after the breaker opened (on a loaded machine a spawned task may
    // start a second late) go to the policy without waiting for the refill: counted apart.
    let late = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (g, q, late) = (g.clone(), q, late.clone());
            tokio::spawn(async move {
                if g.state() == BreakerState::Open {
                    late.fetch_add(1, Relaxed);
                }
                let out = g
                    .check(wall_now(), &[CheckItem::hit("hot", KEY, &q)])
                    .await
                    .unwrap();
                (out.degraded.is_some(), out.decisions[0].allowed)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(
        answers
            .iter()
            .all(|&(degraded, allowed)| degraded && !allowed),
        "every request answered by the deny policy: {answers:?}"
    );
    // Whether the breaker has opened by the time the last waiter is answered depends on how
    // long the refill's timeouts have lasted (timeouts open it only after
    // TIMEOUTS_OPEN_AFTER without a success): on a loaded machine the waiters may all be
    // answered by the policy on the refill's own timeout first. Either way none reached Redis.
    let waited = g.refill_waits();
    signal(server.pid(), "-CONT");
    until("Redis deciding again", || {
        g.state() == BreakerState::Healthy
    })
    .await;
    let calls = check_calls(&server);
    eprintln!("{WAITERS} requests during the freeze: {waited} waited for a refill, Redis got {calls} check calls");
    assert!(
        calls <= 3,
        "one refill per counter (and at most a call per breaker failure), not {calls}"
    );
    let late = late.load(Relaxed);
    assert!(
        waited + late >= (WAITERS - 3) as u64,
        "{waited} waited, {late} started with the breaker open"
    );
    // Decided by Redis again, exactly.
    let out = g
        .check(wall_now(), &[CheckItem::hit("hot", KEY, &q)])
        .await
        .unwrap();
    assert!(out.degraded.is_none() && out.decisions[0].allowed);
}
