//! The shared store under real faults, measured from outside, against the one bound per failure
//! policy that docs/distributed.md ("What a window admits across an outage") states for every
//! fault.
//!
//! Each scenario runs its own store on ports of its own: a Redis Cluster of 3 masters and 3
//! replicas (`cluster-require-full-coverage no`), a Sentinel group (a master, a replica, 3
//! `redis-sentinel`s) or a standalone `redis-server`. On it, one fleet of 2 `tollgate serve`
//! instances (`--expected-instances 2`) per failure policy (`local`, the default, `deny`,
//! `allow`), each on a prefix of its own. A run drives the `local` fleet and one other (`deny`
//! and `allow` in turn) with 48 paced keep-alive callers per fleet, split across its two
//! instances, over 24 keys of three rules of 300 per day (fixed window, sliding window log,
//! GCRA), each key hit by one caller on each instance. The callers first send a third of the
//! limit per key, then the fault comes under load, and the load goes on past the recovery until
//! every caller was denied twice.
//!
//! Faults: Cluster: a master killed (its replica promoted), slots moved between masters under
//! load, a master killed and restarted empty (its replica may not take over); Sentinel: the
//! master killed (switch-master); standalone: a 3 s `SIGSTOP` stall, `kill -9` and a restart
//! empty. One Cluster serves its three faults in turn, a killed node restarted after each run.
//!
//! After every fault every instance of every fleet goes back to Redis by itself (`/readyz`
//! ready, every master's breaker closed), polled with a generous deadline; per key, what the
//! fleet admitted is within its policy's bound; on a Cluster failover, the healthy masters'
//! `tollgate_store_node_degraded_decisions_total` does not move. The figures are printed as a
//! table per scenario, with the breakers a migration opened and the calls it left to the policy
//! (on a saturated host a call can outlast its timeout whatever the cause: printed, not
//! asserted).
//!
//! With Redis' default `cluster-require-full-coverage yes`, every master would answer
//! `CLUSTERDOWN` while one is failing: every key, on every master, would go to the policy
//! (docs/operations.md, "Cluster faults"); the check on the healthy masters needs `no`.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::client::Method;
use support::conn::Conn;
use support::registry::metric;
use support::{http, serve_fleet, temp_dir, Server};
use tollgate_testsupport::{
    migrate_slot, runtime, signal, unique_prefix, wait_for, Cluster, RedisServer, SentinelGroup,
};

/// The limit of every rule, per day: the window spans every run.
const L: u64 = 300;
/// Instances per fleet (`--expected-instances`).
const N: u64 = 2;
/// Callers per fleet, split across its instances; each has one request in flight at most.
const CALLERS: usize = 48;
/// Caller pairs per fleet (one caller on each instance): a pair owns one key (rule `pair % 3`),
/// so each instance has at most one request in flight on a key.
const PAIRS: usize = CALLERS / N as usize;
/// The rules: (descriptor key, algorithm).
const RULES: [(&str, &str); 3] = [
    ("fw", "fixed_window"),
    ("log", "sliding_window_log"),
    ("gcra", "gcra"),
];
/// Requests each caller sends on its key before the fault (a third of the limit per key, both
/// callers together).
const BEFORE: u64 = L / 6;
/// Denials each caller waits for on its key once the fleet is back on Redis.
const DENIED_AFTER: u64 = 2;
/// Each caller sends at most one request per `PACE`.
const PACE: Duration = Duration::from_millis(20);
/// Runs per scenario.
const RUNS: usize = 5;
/// Generous: an event (a breaker opening, a failover, every instance back on Redis) must come
/// well within it on a busy machine; a run fails only when it never comes.
const DEADLINE: Duration = Duration::from_secs(90);
/// The standalone stall's length.
const STALL: Duration = Duration::from_secs(3);
/// Which policy shares each run with `local`.
const OTHERS: [&str; RUNS] = ["deny", "allow", "deny", "allow", "deny"];

/// The rules file (three rules of `L` per day) in a fresh directory.
fn rules(name: &str) -> String {
    let mut y = String::from("domain: matrix\ndescriptors:\n");
    for (key, alg) in RULES {
        y += &format!(
            "  - key: {key}\n    rate_limit: {{unit: day, requests_per_unit: {L}, algorithm: {alg}}}\n"
        );
    }
    let path = temp_dir(name).join("rules.yaml");
    std::fs::write(&path, y).unwrap();
    path.display().to_string()
}

fn readyz(base: &str) -> Value {
    serde_json::from_str(&http(base, Method::GET, "/readyz", None).body).unwrap_or(Value::Null)
}

/// Every `/metrics` line starting with `series` (a name and, optionally, the start of its
/// labels), as (labels, value).
fn series(base: &str, series: &str) -> Vec<(String, u64)> {
    http(base, Method::GET, "/metrics", None)
        .body
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(series)?;
            let (labels, v) = rest.rsplit_once(' ')?;
            Some((labels.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// `tollgate_store_node_<what>{node="addr"...}` summed over the labels that follow.
fn node_metric(base: &str, what: &str, addr: &str, extra: &str) -> u64 {
    series(
        base,
        &format!("tollgate_store_node_{what}{{node=\"{addr}\"{extra}"),
    )
    .iter()
    .map(|(_, v)| v)
    .sum()
}

/// A fleet's sum of an unlabelled counter.
fn fleet_sum(f: &Fleet, name: &str) -> u64 {
    f.servers.iter().map(|s| metric(&s.base, name)).sum()
}

/// Times the breaker (any master's, on a Cluster) opened.
fn opens(base: &str) -> u64 {
    series(base, "tollgate_store_breaker_transitions_total{")
        .iter()
        .filter(|(labels, _)| labels.contains("to=\"open\""))
        .map(|(_, v)| v)
        .sum()
}

fn degraded(base: &str) -> u64 {
    series(base, "tollgate_degraded_decisions_total{")
        .iter()
        .map(|(_, v)| v)
        .sum()
}

/// Two instances with `--on-store-error policy` on the store at `url`, a prefix of their own.
struct Fleet {
    policy: &'static str,
    prefix: String,
    servers: Vec<Server>,
}

impl Fleet {
    fn bases(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.base.clone()).collect()
    }
}

/// The three fleets on `url`, started side by side.
fn fleets(url: &str, name: &str) -> Vec<Fleet> {
    let rules = rules(name);
    std::thread::scope(|scope| {
        let handles: Vec<_> = ["local", "deny", "allow"]
            .map(|policy| {
                let (rules, url) = (&rules, url);
                scope.spawn(move || {
                    let prefix = unique_prefix(&format!("{name}-{policy}"));
                    let servers =
                        serve_fleet(rules, url, &prefix, N, policy, &format!("{name}-{policy}"));
                    Fleet {
                        policy,
                        prefix,
                        servers,
                    }
                })
            })
            .into_iter()
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Wait until every instance of every fleet is back on Redis: `/readyz` `ready` (the breaker,
/// and on a Cluster every master's breaker, closed). Returns how long each fleet's slowest
/// instance took from `since`.
fn until_back(fleets: &[Fleet], since: Instant, what: &str) -> Vec<Duration> {
    fleets
        .iter()
        .map(|f| {
            for s in &f.servers {
                wait_for(
                    DEADLINE,
                    &format!("{what}: {} back on Redis", s.base),
                    || readyz(&s.base)["status"] == "ready",
                );
            }
            since.elapsed()
        })
        .collect()
}

/// Wait until every instance of `fleets` has seen the fault: `ready(base)` holds.
fn until_all(fleets: &[&Fleet], what: &str, ready: impl Fn(&str) -> bool) {
    for f in fleets {
        for s in &f.servers {
            wait_for(
                DEADLINE,
                &format!("{what} ({} {})", f.policy, s.base),
                || ready(&s.base),
            );
        }
    }
}

/// Admissions per key of one fleet in one run: before the fault, while it lasted (until every
/// instance was back on Redis), after; and every request until then, for [`stale`].
#[derive(Default)]
struct Counts {
    before: Vec<AtomicU64>,
    during: Vec<AtomicU64>,
    after: Vec<AtomicU64>,
    requests: Vec<Mutex<Vec<Request>>>,
}

/// A request on a key before the fleet was back on Redis.
struct Request {
    instance: usize,
    sent: Instant,
    answered: Instant,
}

impl Counts {
    fn new() -> Counts {
        let v = || (0..PAIRS).map(|_| AtomicU64::new(0)).collect();
        Counts {
            before: v(),
            during: v(),
            after: v(),
            requests: (0..PAIRS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// The `local` policy's excess on a key, `E`: the requests sent before every instance's breaker
/// was open (`open`, seen on `/readyz`) and answered after the earliest of the instances' last
/// answers before the fault `began`. Each instance's local share is what the key had left at
/// its own last answer from Redis; what the others were granted after that, and the calls in
/// flight when the fault came (on a frozen Redis, every call until the breaker opens: Redis
/// counts them when it resumes while the policy decides them too), is what the fleet can admit
/// over the limit. Under load on every instance, it is the calls in flight, `N × C`.
fn stale(requests: &[Request], began: Instant, open: Instant) -> u64 {
    let last = (0..N as usize)
        .map(|i| {
            requests
                .iter()
                .filter(|r| r.instance == i && r.answered < began)
                .map(|r| r.answered)
                .max()
        })
        .min()
        .flatten();
    let Some(last) = last else {
        return requests.iter().filter(|r| r.sent < open).count() as u64;
    };
    requests
        .iter()
        .filter(|r| r.answered > last && r.sent < open)
        .count() as u64
}

/// Where the load is: the callers read it before each request and count its answer there.
#[derive(Default)]
struct Phase {
    /// 0 before the fault, 1 during, 2 after (every instance back on Redis).
    now: AtomicUsize,
    /// Callers done with their requests before the fault.
    ready: AtomicUsize,
    /// Requests answered.
    answered: AtomicU64,
}

fn body(rule: usize, value: &str) -> String {
    json!({"domain": "matrix", "descriptors": [{"entries": [{"key": RULES[rule].0, "value": value}]}]})
        .to_string()
}

/// One caller: on instance `instance` of a fleet at `base`, for pair `pair`'s key
/// (`tag-p<pair>` of rule `pair % 3`).
async fn caller(
    base: String,
    instance: usize,
    pair: usize,
    tag: String,
    counts: Arc<Counts>,
    phase: Arc<Phase>,
) {
    let value = format!("{tag}-p{pair}");
    let body = body(pair % RULES.len(), &value);
    let mut conn = Conn::open(&base).await;
    let mut tick = tokio::time::interval(PACE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let (mut sent_before, mut denied_after) = (0u64, 0u64);
    loop {
        assert!(started.elapsed() < 2 * DEADLINE, "a run never ended");
        tick.tick().await;
        let now = phase.now.load(Relaxed);
        match now {
            0 if sent_before == BEFORE => {
                sent_before += 1;
                phase.ready.fetch_add(1, Relaxed);
                continue;
            }
            // Hold the load until the fault comes (the others finish their share).
            0 if sent_before > BEFORE => continue,
            2 if denied_after >= DENIED_AFTER => return,
            _ => {}
        }
        let sent = Instant::now();
        let status = conn.status(body.clone()).await;
        if now < 2 {
            counts.requests[pair].lock().unwrap().push(Request {
                instance,
                sent,
                answered: Instant::now(),
            });
        }
        let bucket = match now {
            0 => {
                sent_before += 1;
                &counts.before
            }
            1 => &counts.during,
            _ => &counts.after,
        };
        match status {
            200 => {
                bucket[pair].fetch_add(1, Relaxed);
            }
            429 => {
                if now == 2 {
                    denied_after += 1;
                }
            }
            other => panic!("HTTP {other} from {base}"),
        }
        phase.answered.fetch_add(1, Relaxed);
    }
}

/// A store and the faults it can take.
enum Store {
    Cluster(Cluster),
    Sentinel(SentinelGroup),
    Alone(RedisServer),
}

impl Store {
    fn url(&self) -> String {
        match self {
            Store::Cluster(c) => c.url(),
            Store::Sentinel(g) => g.url(),
            Store::Alone(r) => r.url(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    /// Cluster: a master killed, its replica promoted (then the old one restarted: it rejoins
    /// as a replica).
    Failover,
    /// Cluster: a slot holding keys of each driven fleet moved from master to master three
    /// times, under load.
    Migration,
    /// Cluster: a master killed, then restarted empty (same node) once every driven instance
    /// saw it down; its replica may not take over meanwhile (`cluster-replica-no-failover`), so
    /// it copies the empty master.
    MasterRestart,
    /// Sentinel: the master killed; the sentinels promote the replica (switch-master).
    SentinelSwitch,
    /// Standalone: `SIGSTOP` for [`STALL`], then `SIGCONT` (the counts kept).
    Stall,
    /// Standalone: `kill -9`, then a new empty server on the same port.
    RestartEmpty,
}

impl Fault {
    /// Whether the store may forget what it counted: a restart without persistence, or a
    /// replica promoted before it got the master's last writes.
    fn lossy(self) -> bool {
        matches!(
            self,
            Fault::Failover | Fault::MasterRestart | Fault::SentinelSwitch | Fault::RestartEmpty
        )
    }
}

/// The bound docs/distributed.md states per policy for every fault, for one key: `L`, plus the
/// policy's own excess (`local`: `E`, see [`stale`], and `S`, the others' shares of what the key
/// had left, which an instance still grants locally while another is back on Redis; `allow`:
/// what it admitted, `P`, at most what was admitted while the fault lasted), plus, for `deny`
/// and `allow`, what the store forgot (`F`, at most what was admitted on the key before Redis
/// was back; `local` restores it with the fold).
fn bound(policy: &str, fault: Fault, before: u64, during: u64, stale: u64) -> u64 {
    let forgot = if fault.lossy() { before + during } else { 0 };
    let shares = (N - 1) * (L - before.min(L)) / N;
    match policy {
        "local" => L + stale + shares,
        "deny" => L + forgot,
        _ => L + during + forgot,
    }
}

/// The Cluster's masters now (`ROLE`), in node order.
fn masters(c: &Cluster) -> Vec<&RedisServer> {
    c.nodes
        .iter()
        .filter(|n| n.cli(&["ROLE"]).starts_with("master"))
        .collect()
}

/// The index of the node that replicates `master`.
fn replica_of(c: &Cluster, master: &RedisServer) -> usize {
    c.nodes
        .iter()
        .position(|n| {
            n.cli(&["INFO", "replication"])
                .contains(&format!("master_port:{}", master.port))
        })
        .expect("the master's replica")
}

/// Wait until every node sees the cluster whole again: `cluster_state:ok`, every replica's
/// link up.
fn until_cluster_whole(c: &Cluster) {
    wait_for(DEADLINE, "the cluster whole again", || {
        c.nodes.iter().all(|n| {
            let role = n.cli(&["INFO", "replication"]);
            n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                && (role.contains("role:master") || role.contains("master_link_status:up"))
        }) && masters(c).len() == 3
    });
}

/// The slots holding keys matching `pattern` and their owner's node index (at most `n`).
fn slots_with_keys(c: &Cluster, pattern: &str, n: usize) -> Vec<(u16, usize)> {
    let mut found: Vec<(u16, usize)> = Vec::new();
    for (i, node) in c.nodes.iter().enumerate() {
        if !node.cli(&["ROLE"]).starts_with("master") {
            continue;
        }
        for key in node.cli(&["KEYS", pattern]).lines() {
            if found.len() == n {
                return found;
            }
            let slot: u16 = node
                .cli(&["CLUSTER", "KEYSLOT", key])
                .trim()
                .parse()
                .unwrap();
            if !found.iter().any(|f| f.0 == slot) {
                found.push((slot, i));
            }
        }
    }
    found
}

/// How the `local` fleet's instances left the fault, watched on `/readyz` from its start until
/// `done`: whether they went back to Redis at moments apart (their breakers left `open` more
/// than two probe intervals apart, or one opened again after it had left `open`), and the
/// spread.
fn watch(fleet: &Fleet, done: &std::sync::atomic::AtomicBool) -> (bool, Duration, Option<Instant>) {
    let n = fleet.servers.len();
    let (mut opened, mut back, mut reopened) = (vec![None; n], vec![None; n], false);
    while !done.load(Relaxed) {
        for (i, s) in fleet.servers.iter().enumerate() {
            let open = readyz(&s.base)["store_state"] == "open";
            match (open, opened[i].is_some(), back[i]) {
                (true, false, None) => opened[i] = Some(Instant::now()),
                (true, _, None) => {}
                (true, _, Some(_)) => reopened = true,
                (false, true, None) => back[i] = Some(Instant::now()),
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let backs: Vec<Instant> = back.iter().flatten().copied().collect();
    let spread = match (backs.iter().min(), backs.iter().max()) {
        (Some(a), Some(b)) => *b - *a,
        _ => Duration::ZERO,
    };
    // Within two probe intervals (250 ms each), plus a poll's own latency.
    let all_open = match opened.iter().all(Option::is_some) {
        true => opened.iter().flatten().max().copied(),
        false => None,
    };
    (
        reopened || spread > Duration::from_millis(600),
        spread,
        all_open,
    )
}

/// An instance's last breaker transitions and warnings, for a failure's message.
fn warnings(s: &Server) -> String {
    let log = s.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("breaker") || l.contains("answers again") || l.contains("WARN"))
        .collect();
    format!(
        "{}, last lines:\n{}",
        s.base,
        lines[lines.len().saturating_sub(12)..].join("\n")
    )
}

/// What the fault did that the checks need.
#[derive(Default)]
struct Injected {
    /// Cluster: the masters the fault left alone (their per-master degraded decisions, per
    /// driven instance, before the fault).
    healthy: Vec<(String, Vec<u64>)>,
    /// A migration: the driven instances' breaker openings before it, and their decisions by
    /// the policy.
    opens_before: Option<Vec<u64>>,
    degraded_before: u64,
    /// Cluster and Sentinel: a server killed, to start again once the run is over.
    restart: Option<usize>,
    /// Cluster: a replica told not to take over, to allow again once the run is over.
    no_failover: Option<usize>,
}

/// Inject `fault` into `store` under load; returns once the fault is over (the store can
/// answer again), with when that was. `began` is set when the fault begins.
fn inject(
    store: &mut Store,
    fault: Fault,
    run: usize,
    driven: &[&Fleet],
    began: &mut Instant,
) -> (Injected, Instant) {
    let bases: Vec<String> = driven.iter().flat_map(|f| f.bases()).collect();
    let mut out = Injected::default();
    match (store, fault) {
        (Store::Cluster(c), Fault::Failover | Fault::MasterRestart) => {
            let ms = masters(c);
            let victim_port = ms[run % ms.len()].port;
            let victim = c.nodes.iter().position(|n| n.port == victim_port).unwrap();
            let addr = c.nodes[victim].addr();
            out.healthy = ms
                .iter()
                .filter(|m| m.port != victim_port)
                .map(|m| {
                    let a = m.addr();
                    let per = bases
                        .iter()
                        .map(|b| node_metric(b, "degraded_decisions_total", &a, ""))
                        .collect();
                    (a, per)
                })
                .collect();
            let replica = replica_of(c, &c.nodes[victim]);
            if fault == Fault::MasterRestart {
                // The master comes back before its replica may take over: a restart, not a
                // failover (on a busy host the restart can outlast `cluster-node-timeout`).
                let ok =
                    c.nodes[replica].cli(&["CONFIG", "SET", "cluster-replica-no-failover", "yes"]);
                assert!(ok.contains("OK"), "{ok}");
                out.no_failover = Some(replica);
            }
            *began = Instant::now();
            c.nodes[victim].kill();
            if fault == Fault::Failover {
                wait_for(DEADLINE, "the replica's promotion", || {
                    c.nodes[replica].cli(&["ROLE"]).starts_with("master")
                });
                out.restart = Some(victim);
                (out, Instant::now())
            } else {
                until_all(driven, "the killed master's breaker open", |b| {
                    node_metric(b, "state", &addr, ",state=\"open\"") == 1
                });
                c.nodes[victim].restart();
                (out, Instant::now())
            }
        }
        (Store::Cluster(c), Fault::Migration) => {
            out.opens_before = Some(bases.iter().map(|b| opens(b)).collect());
            out.degraded_before = bases.iter().map(|b| degraded(b)).sum();
            let mut slots: Vec<(u16, usize)> = Vec::new();
            for f in driven {
                let pattern = format!("{}:*{fault:?}-r{run}-p*", f.prefix);
                for found in slots_with_keys(c, &pattern, 1) {
                    if !slots.iter().any(|s| s.0 == found.0) {
                        slots.push(found);
                    }
                }
            }
            assert!(
                !slots.is_empty(),
                "no key of the run's fleets on the cluster"
            );
            *began = Instant::now();
            for _round in 0..3 {
                for (slot, owner) in slots.iter_mut() {
                    let ms = masters(c);
                    let src = &c.nodes[*owner];
                    let dst = ms.iter().copied().find(|m| m.port != src.port).unwrap();
                    migrate_slot(&ms, *slot, src, dst);
                    *owner = c.nodes.iter().position(|n| n.port == dst.port).unwrap();
                }
            }
            (out, Instant::now())
        }
        (Store::Sentinel(g), Fault::SentinelSwitch) => {
            let old = g.master_port();
            let victim = g.servers.iter().position(|s| s.port == old).unwrap();
            *began = Instant::now();
            g.servers[victim].kill();
            wait_for(DEADLINE, "the sentinels' switch-master", || {
                g.sentinels.iter().all(|s| {
                    let out = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.name]);
                    !out.contains(&old.to_string()) && out.lines().count() >= 2
                })
            });
            let new = g.master_port();
            wait_for(DEADLINE, "the new master to take writes", || {
                g.server(new).cli(&["ROLE"]).starts_with("master")
            });
            out.restart = Some(victim);
            (out, Instant::now())
        }
        (Store::Alone(r), Fault::Stall) => {
            *began = Instant::now();
            signal(r.pid(), "-STOP");
            until_all(driven, "the stall opens the breakers", |b| {
                readyz(b)["store_state"] == "open"
            });
            // The stall's length is the fault itself, not a wait for an event.
            std::thread::sleep(STALL.saturating_sub(began.elapsed()));
            signal(r.pid(), "-CONT");
            (out, Instant::now())
        }
        (Store::Alone(r), Fault::RestartEmpty) => {
            *began = Instant::now();
            signal(r.pid(), "-KILL");
            until_all(driven, "the crash opens the breakers", |b| {
                readyz(b)["store_state"] == "open"
            });
            r.restart();
            (out, Instant::now())
        }
        (_, fault) => panic!("{fault:?} does not apply to this store"),
    }
}

/// Bring the store whole again after the run: a killed server started again (a Cluster node
/// rejoins as a replica, a Sentinel master is turned into one by the sentinels).
fn mend(store: &mut Store, injected: &Injected) {
    match store {
        Store::Cluster(c) => {
            if let Some(i) = injected.restart {
                c.nodes[i].restart();
            }
            until_cluster_whole(c);
            if let Some(i) = injected.no_failover {
                let ok = c.nodes[i].cli(&["CONFIG", "SET", "cluster-replica-no-failover", "no"]);
                assert!(ok.contains("OK"), "{ok}");
            }
        }
        Store::Sentinel(g) => {
            if let Some(i) = injected.restart {
                g.servers[i].restart();
                // What the sentinels would do once they see it back (they look every 10 s).
                let master = g.master_port().to_string();
                let ok = g.servers[i].cli(&["REPLICAOF", "127.0.0.1", &master]);
                assert!(ok.contains("OK"), "{ok}");
                let port = g.servers[i].port.to_string();
                wait_for(DEADLINE, "the old master to replicate the new one", || {
                    g.servers[i]
                        .cli(&["INFO", "replication"])
                        .contains("master_link_status:up")
                });
                wait_for(DEADLINE, "the sentinels to know the new replica", || {
                    g.sentinels.iter().all(|s| {
                        let r = s.cli(&["SENTINEL", "REPLICAS", g.name]);
                        r.contains(&port) && !r.contains("s_down")
                    })
                });
            }
        }
        Store::Alone(_) => {}
    }
}

/// One row of a scenario's table.
struct Row {
    run: usize,
    policy: &'static str,
    /// Per rule: the largest admitted count over the fleet's keys, and that key's bound.
    per_rule: [(u64, u64); 3],
    /// The fleet's slowest instance back on Redis after the fault ended.
    back: Duration,
    /// `local`: its instances went back to Redis at moments apart.
    apart: bool,
    /// `local`: keys over `L + E`.
    gaps: u64,
}

/// One run: the `local` fleet and `OTHERS[run]`'s driven through `fault`.
fn run(
    store: &mut Store,
    all: &[Fleet],
    fault: Fault,
    run: usize,
    over: &mut Vec<String>,
) -> Vec<Row> {
    let driven: Vec<&Fleet> = all
        .iter()
        .filter(|f| f.policy == "local" || f.policy == OTHERS[run])
        .collect();
    let started = Instant::now();
    let rt = runtime();
    let phase = Arc::new(Phase::default());
    let tag = format!("{fault:?}-r{run}");
    let counts: Vec<Arc<Counts>> = driven.iter().map(|_| Arc::new(Counts::new())).collect();
    let mut tasks = Vec::new();
    for (f, counts) in driven.iter().zip(&counts) {
        for i in 0..CALLERS {
            let base = f.servers[i % N as usize].base.clone();
            tasks.push(rt.spawn(caller(
                base,
                i % N as usize,
                i / N as usize,
                tag.clone(),
                counts.clone(),
                phase.clone(),
            )));
        }
    }
    let callers = driven.len() * CALLERS;
    wait_for(DEADLINE, "the load before the fault", || {
        phase.ready.load(Relaxed) == callers
    });
    phase.now.store(1, Relaxed);
    // The fault comes under load.
    let under_way = phase.answered.load(Relaxed) + callers as u64;
    wait_for(DEADLINE, "the load to resume", || {
        phase.answered.load(Relaxed) >= under_way
    });
    let mut began = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let local = driven.iter().find(|f| f.policy == "local").unwrap();
    let restored = fleet_sum(local, "tollgate_store_restored_units_total");
    let folded = fleet_sum(local, "tollgate_store_folded_cost_total");
    let (back, (apart, spread, all_open)) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch(local, &done));
        // Stop the watcher however this ends (a failed wait panics).
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let stop = Stop(&done);
        let (injected, healed) = inject(store, fault, run, &driven, &mut began);
        let back = until_back(all, healed, &format!("{fault:?} run {run}"));
        drop(stop);
        ((back, injected), watcher.join().unwrap())
    });
    let (back, injected) = back;
    phase.now.store(2, Relaxed);
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    let bases = |f: &Fleet| f.bases();
    for (addr, before) in &injected.healthy {
        let now: Vec<u64> = driven
            .iter()
            .flat_map(|f| bases(f))
            .map(|b| node_metric(&b, "degraded_decisions_total", addr, ""))
            .collect();
        assert_eq!(
            &now,
            before,
            "{fault:?} run {run}: keys on the healthy master {addr} were decided by the policy; \
             logs:\n{}",
            driven
                .iter()
                .flat_map(|f| &f.servers)
                .map(warnings)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    if let Some(before) = &injected.opens_before {
        // A migration alone decides nothing by the policy (crates/tollgate-redis/tests/
        // cluster_faults.rs asserts it on the store); here, on a saturated host, a call may
        // outlast its timeout during the move and a breaker open for it: printed, not asserted
        // (every breaker closes again by itself, which is asserted above).
        let all: Vec<String> = driven.iter().flat_map(|f| bases(f)).collect();
        let opened = all.iter().map(|b| opens(b)).sum::<u64>() - before.iter().sum::<u64>();
        let by_policy = all.iter().map(|b| degraded(b)).sum::<u64>() - injected.degraded_before;
        eprintln!(
            "{fault:?} run {run}: {opened} breakers opened, {by_policy} calls decided by the \
             policy"
        );
    }
    let restored = fleet_sum(local, "tollgate_store_restored_units_total") - restored;
    let folded = fleet_sum(local, "tollgate_store_folded_cost_total") - folded;
    mend(store, &injected);
    eprintln!(
        "{fault:?} run {run}: {} requests in {:.1?}; local fleet: {folded} folded, {restored} \
         restored",
        phase.answered.load(Relaxed),
        started.elapsed()
    );
    let mut rows = Vec::new();
    let over_before = over.len();
    let mut gaps = 0u64;
    for (f, counts) in driven.iter().zip(&counts) {
        let back = back[all.iter().position(|a| a.policy == f.policy).unwrap()];
        let mut per_rule = [(0u64, 0u64); 3];
        for pair in 0..PAIRS {
            let rule = pair % RULES.len();
            let (b, d, a) = (
                counts.before[pair].load(Relaxed),
                counts.during[pair].load(Relaxed),
                counts.after[pair].load(Relaxed),
            );
            let e = stale(
                &counts.requests[pair].lock().unwrap(),
                began,
                all_open.unwrap_or(began).max(began),
            );
            let admitted = b + d + a;
            let bound = bound(f.policy, fault, b, d, e);
            // `local`: what the keys admitted over `L + E` (the share an instance still granted
            // locally while another was back on Redis) is counted for the table.
            if f.policy == "local" && admitted > L + e {
                gaps += 1;
            }
            if admitted > bound {
                over.push(format!(
                    "{fault:?} run {run}, {} / {} key p{pair}: {admitted} admitted ({b} before, \
                     {d} during, {a} after; E = {e}; back on Redis apart: {apart}, by \
                     {spread:?}), over the bound {bound}",
                    f.policy, RULES[rule].1
                ));
            }
            let worst = &mut per_rule[rule];
            if admitted > worst.0 || (admitted == worst.0 && bound < worst.1) {
                *worst = (admitted, bound);
            }
        }
        if over.len() > over_before && f.policy == "local" {
            over.extend(f.servers.iter().map(warnings));
        }
        rows.push(Row {
            run,
            policy: f.policy,
            apart: apart && f.policy == "local",
            gaps: if f.policy == "local" { gaps } else { 0 },
            per_rule,
            back,
        });
    }
    rows
}

/// Every run of every fault on one store; prints one table per fault.
fn scenario(mut store: Store, faults: &[Fault], name: &str) {
    let fleets = fleets(&store.url(), name);
    until_back(&fleets, Instant::now(), "at start");
    for &fault in faults {
        let mut rows = Vec::new();
        let mut over = Vec::new();
        for r in 0..RUNS {
            rows.extend(run(&mut store, &fleets, fault, r, &mut over));
        }
        let mut table = format!(
            "{fault:?} ({name}), per key: max admitted / its bound (L = {L}); back on Redis\n\
             run policy | fixed_window | sliding_window_log | gcra | back\n"
        );
        for row in rows {
            let cell = |i: usize| format!("{} / {}", row.per_rule[i].0, row.per_rule[i].1);
            table += &format!(
                "{} {:<6} | {} | {} | {} | {:.1?}{}{}\n",
                row.run,
                row.policy,
                cell(0),
                cell(1),
                cell(2),
                row.back,
                if row.apart { " (apart)" } else { "" },
                match row.gaps {
                    0 => String::new(),
                    n => format!(" ({n} keys over L + E)"),
                }
            );
        }
        eprintln!("{table}");
        assert!(over.is_empty(), "over the bound:\n{}", over.join("\n"));
    }
}

#[test]
fn cluster_failover_migration_and_master_restart() {
    let cluster = Cluster::start_replicated(
        3,
        1,
        &[
            "--cluster-require-full-coverage",
            "no",
            "--cluster-node-timeout",
            "2000",
        ],
    );
    scenario(
        Store::Cluster(cluster),
        &[Fault::Failover, Fault::Migration, Fault::MasterRestart],
        "matrix-cluster",
    );
}

#[test]
fn sentinel_switch_master() {
    scenario(
        Store::Sentinel(SentinelGroup::start_with(3, 2)),
        &[Fault::SentinelSwitch],
        "matrix-sentinel",
    );
}

#[test]
fn standalone_stall_and_restart_empty() {
    scenario(
        Store::Alone(RedisServer::start(&[])),
        &[Fault::Stall, Fault::RestartEmpty],
        "matrix-alone",
    );
}
