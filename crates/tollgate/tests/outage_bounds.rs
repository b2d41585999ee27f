//! What one window admits across a Redis outage, for every sync mode (`exact`, `lease`,
//! `batched`), every failure policy (`local`, `deny`, `allow`) and two faults (Redis frozen with
//! SIGSTOP then resumed with SIGCONT; Redis killed with `kill -9` and restarted empty), from
//! outside: two `tollgate serve` processes (`--expected-instances 2`), four paced keep-alive
//! callers each on one hot key limited per day, a private `redis-server` on a port of its own.
//!
//! Each run: the callers admit half the limit on Redis; the fault comes and they keep calling
//! until both instances' breakers are open (polled on `/readyz`) and then until the policy turns
//! them away (`local`) or for a few more requests each (`deny`, `allow`); Redis comes back and
//! both instances return to it by themselves (polled); the callers then call until each is
//! denied. The window's admissions are asserted within the bound docs/distributed.md states for
//! the mode, policy and fault, computed from the configuration below.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::client::Method;
use support::conn::Conn;
use support::registry::metric;
use support::{http, serve_fleet, temp_dir, Server, HANG};
use tollgate_testsupport::{runtime, unique_prefix, RedisServer};

/// Instances (`--expected-instances`).
const N: u64 = 2;
/// Callers per instance; each has at most one request in flight.
const CALLERS: u64 = 4;
/// The hot key's limit per day (the window does not roll within a run).
const LIMIT: u64 = 2_000;
/// Each caller sends at most one request per `PACE`: an instance admits at most
/// `r = CALLERS / PACE` requests per second.
const PACE: Duration = Duration::from_millis(5);
/// Requests each caller sends once the breakers are open, with `deny` and `allow`.
const AFTER_OPEN: u64 = 10;
/// `batched`: the flush interval `F` (the default `--sync-flush-interval`) and the allowance
/// for a flush's round trip `d` (a local Redis; generous, as in docs/distributed.md's example).
const FLUSH_S: f64 = 0.1;
const ROUND_TRIP_S: f64 = 0.1;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Exact,
    Lease,
    Batched,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    /// SIGSTOP, then SIGCONT: Redis keeps its counts.
    Frozen,
    /// `kill -9`, then a new empty server on the same port.
    RestartedEmpty,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Lease => "lease",
            Mode::Batched => "batched",
        }
    }
}

fn body() -> String {
    json!({"domain": "outage", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]})
        .to_string()
}

fn readyz(base: &str) -> Value {
    serde_json::from_str(&http(base, Method::GET, "/readyz", None).body).unwrap()
}

fn sum(servers: &[Server], series: &str) -> u64 {
    servers.iter().map(|s| metric(&s.base, series)).sum()
}

fn utc_day() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400
}

/// How a caller stops.
#[derive(Clone, Copy)]
enum Until {
    /// Once the fleet admitted this many in the phase.
    Admitted(u64),
    /// At its first denial.
    Denied,
    /// Once `open` is set: at its first denial (`after: None`), or after `n` more requests.
    Open { after: Option<u64> },
}

/// Every instance's `CALLERS` paced callers until `until`; returns the requests admitted. Any
/// answer but 200 or 429 fails the test, as does a phase that outlasts [`HANG`].
async fn drive(bases: &[String], until: Until, open: Arc<AtomicBool>) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for base in bases {
        for _ in 0..CALLERS {
            let (base, admitted, open) = (base.clone(), admitted.clone(), open.clone());
            tasks.push(tokio::spawn(async move {
                let mut conn = Conn::open(&base).await;
                let mut tick = tokio::time::interval(PACE);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut since_open = 0u64;
                loop {
                    assert!(started.elapsed() < HANG, "a phase never ended");
                    if let Until::Admitted(n) = until {
                        if admitted.load(Relaxed) >= n {
                            return;
                        }
                    }
                    tick.tick().await;
                    let was_open = open.load(Relaxed);
                    let status = conn.status(body()).await;
                    match status {
                        200 => {
                            admitted.fetch_add(1, Relaxed);
                        }
                        429 => {}
                        other => panic!("HTTP {other} from {base}"),
                    }
                    match until {
                        Until::Denied if status == 429 => return,
                        Until::Open { after } if was_open => {
                            since_open += 1;
                            match after {
                                None if status == 429 => return,
                                Some(n) if since_open >= n => return,
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    admitted.load(Relaxed)
}

/// Wait until every instance's `/readyz` says `store_state` is `state`.
fn until_state(servers: &[Server], state: &str, what: &str) {
    let started = Instant::now();
    while !servers
        .iter()
        .all(|s| readyz(&s.base)["store_state"] == state)
    {
        assert!(
            started.elapsed() < HANG,
            "{what}: never {state}: {:?}",
            servers.iter().map(|s| readyz(&s.base)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What one run measured.
struct Run {
    /// Admitted before the fault, during it, and after Redis came back.
    before: u64,
    during: u64,
    after: u64,
    /// `allow`: requests admitted by the policy (its degraded decisions).
    allowed_by_policy: u64,
    /// `lease`: units the instances held when Redis came back.
    held: u64,
}

impl Run {
    fn admitted(&self) -> u64 {
        self.before + self.during + self.after
    }
}

/// One run on fresh servers and a fresh Redis; `None` when the day turned meanwhile.
fn run(mode: Mode, policy: &str, fault: Fault) -> Option<Run> {
    let name = format!("outage-{}-{policy}-{fault:?}", mode.as_str());
    let dir = temp_dir(&name);
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        format!(
            "domain: outage\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: day, \
             requests_per_unit: {LIMIT}, algorithm: fixed_window, sync: {}}}\n",
            mode.as_str()
        ),
    )
    .unwrap();
    let mut redis = RedisServer::start(&[]);
    let port = redis.port;
    let prefix = unique_prefix(&name);
    let servers: Vec<Server> = serve_fleet(
        &rules.display().to_string(),
        &redis.url(),
        &prefix,
        N,
        policy,
        &name,
    );
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    until_state(&servers, "healthy", "at start");
    let day = utc_day();
    let rt = runtime();
    let open = Arc::new(AtomicBool::new(false));
    let before = rt.block_on(drive(&bases, Until::Admitted(LIMIT / 2), open.clone()));
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &redis.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    };
    match fault {
        Fault::Frozen => signal("-STOP"),
        Fault::RestartedEmpty => signal("-KILL"),
    }
    let after = match policy {
        "local" => None,
        _ => Some(AFTER_OPEN),
    };
    let during = std::thread::scope(|scope| {
        let (flag, servers) = (open.clone(), &servers);
        scope.spawn(move || {
            until_state(servers, "open", "the fault");
            flag.store(true, Relaxed);
        });
        rt.block_on(drive(&bases, Until::Open { after }, open.clone()))
    });
    let held = sum(&servers, "tollgate_lease_units_held");
    match fault {
        Fault::Frozen => signal("-CONT"),
        Fault::RestartedEmpty => {
            redis.kill();
            redis = RedisServer::start_on(port, &[]);
        }
    }
    let resumed = Instant::now();
    until_state(&servers, "healthy", "recovery");
    let back = resumed.elapsed();
    let after = rt.block_on(drive(&bases, Until::Denied, open));
    let allowed_by_policy = sum(
        &servers,
        "tollgate_degraded_decisions_total{policy=\"allow\"}",
    );
    drop(redis);
    if utc_day() != day {
        eprintln!("{name}: the day turned during the run; running it again");
        return None;
    }
    eprintln!("{name}: back on Redis {back:?} after the fault ended");
    Some(Run {
        before,
        during,
        after,
        allowed_by_policy,
        held,
    })
}

/// The bound docs/distributed.md ("What a window admits across an outage") states for `mode`,
/// `policy` and `fault`, given what the run measured.
fn bound(mode: Mode, policy: &str, fault: Fault, run: &Run) -> u64 {
    let r = CALLERS as f64 / PACE.as_secs_f64();
    // The mode's own bound over the limit: `batched` decides from counts up to 4F + d old.
    let overshoot = match mode {
        Mode::Batched => ((N - 1) as f64 * r * (4.0 * FLUSH_S + ROUND_TRIP_S)).ceil() as u64,
        _ => 0,
    };
    // `local`: the requests in flight when the fault began (counted by Redis, possibly admitted
    // by the policy too), and with `lease` what Redis granted the other instances after this
    // one's last refill: one grant each, at most an eighth of the limit.
    let local = N * CALLERS
        + match mode {
            Mode::Lease => (N - 1) * LIMIT.div_ceil(8),
            _ => 0,
        };
    let outage = match policy {
        "deny" => 0,
        "allow" => run.allowed_by_policy,
        _ => local,
    };
    // A restarted Redis lost what it had counted: what was admitted before, and the lease
    // units the instances held (spent during the outage, or still held when Redis came back:
    // the new Redis never counts them). The `local` policy's fold restores the count of the
    // keys it decided, all but the units still held.
    let lost = match (fault, policy) {
        (Fault::Frozen, _) => 0,
        (Fault::RestartedEmpty, "local") => run.held,
        (Fault::RestartedEmpty, _) => {
            let from_hand = run.during - run.allowed_by_policy;
            run.before + from_hand + run.held
        }
    };
    LIMIT + overshoot + outage + lost
}

fn check(mode: Mode, policies: &[&str], faults: &[Fault]) {
    for policy in policies {
        for &fault in faults {
            let run = (0..3)
                .find_map(|_| run(mode, policy, fault))
                .expect("three runs crossed midnight");
            let bound = bound(mode, policy, fault, &run);
            let admitted = run.admitted();
            eprintln!(
                "{} / {policy} / {fault:?}: {admitted} admitted ({} before the fault, {} during, {} \
                 after; {} by the allow policy, {} lease units held), bound {bound}, limit {LIMIT}",
                mode.as_str(),
                run.before,
                run.during,
                run.after,
                run.allowed_by_policy,
                run.held
            );
            assert!(
                admitted <= bound,
                "{} / {policy} / {fault:?}: {admitted} admitted, over the bound {bound}",
                mode.as_str()
            );
        }
    }
}

const FAULTS: [Fault; 2] = [Fault::Frozen, Fault::RestartedEmpty];

#[test]
fn batched_fallback_counts_what_the_fleet_already_admitted() {
    check(Mode::Batched, &["local"], &FAULTS);
}

#[test]
fn every_mode_and_policy_stays_within_its_outage_bound() {
    check(Mode::Exact, &["local", "deny", "allow"], &FAULTS);
    check(Mode::Lease, &["local", "deny", "allow"], &FAULTS);
    check(Mode::Batched, &["deny", "allow"], &FAULTS);
}
