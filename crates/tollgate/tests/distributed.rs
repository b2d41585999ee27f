//! Distributed mode end to end: real `tollgate serve` processes sharing real Redis servers.
//!
//! - 4 instances, 64 concurrent keep-alive clients, 5,000 attempts on one key per algorithm:
//!   exactly the limit admitted (sliding window counter: never above its documented bound).
//! - A Redis outage under steady load, under each failure policy; recovery by itself after a
//!   restart (the time it took is printed); a hung Redis (timeouts only until the breaker opens); starting with
//!   Redis down; `SCRIPT FLUSH` and `FUNCTION FLUSH` mid-run; Redis Cluster with a request whose
//!   counters live in different slots; count-min-sketch rules refused; `simulate --store redis`.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::client::Method;
use support::conn::Conn;
use support::{http, serve_store as serve, temp_dir, tollgate, RefusedPort, Server, HANG};
use tollgate_core::{Algorithm, Quota, Unit};
use tollgate_redis::keys::{counter_keys, slot};
use tollgate_testsupport::{
    assert_every_key_has_a_ttl, delete_prefix, runtime, shared_url, unique_prefix, Cluster,
    RedisServer,
};

const LIMIT: u64 = 1000;

/// One key per algorithm, `LIMIT` per day (the window does not roll during the test).
fn rules() -> String {
    let mut y = String::from("domain: dist\ndescriptors:\n");
    for (key, alg, extra) in [
        ("log", "sliding_window_log", ""),
        ("fw", "fixed_window", ""),
        ("gcra", "gcra", ""),
        ("tb", "token_bucket", ", burst: 1000"),
        ("sc", "sliding_window_counter", ""),
    ] {
        y += &format!(
            "  - key: {key}\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}, algorithm: {alg}{extra}}}\n"
        );
    }
    y += "  - key: tiny\n    rate_limit: {unit: day, requests_per_unit: 3, algorithm: fixed_window}\n";
    y += "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}\n";
    y += "  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}\n";
    y
}

fn rules_dir(name: &str) -> String {
    let dir = temp_dir(name);
    std::fs::write(dir.join("dist.yaml"), rules()).unwrap();
    dir.display().to_string()
}

fn body(key: &str, value: &str) -> String {
    json!({"domain": "dist", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
        .to_string()
}

/// `attempts` checks of `key=value` from 64 clients spread over `bases`: (admitted, denied, other).
async fn hammer(bases: &[String], key: &str, value: &str, attempts: u64) -> [u64; 3] {
    let next = Arc::new(AtomicU64::new(0));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut tasks = Vec::new();
    for c in 0..64 {
        let base = bases[c % bases.len()].clone();
        let (next, counts) = (next.clone(), counts.clone());
        let body = body(key, value);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(&base).await;
            while next.fetch_add(1, Relaxed) < attempts {
                let i = match conn.check(body.clone()).await.0 {
                    200 => 0,
                    429 => 1,
                    _ => 2,
                };
                counts[i].fetch_add(1, Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    [0, 1, 2].map(|i| counts[i].load(Relaxed))
}

fn utc_day() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400
}

#[test]
fn four_instances_admit_exactly_the_limit() {
    let rules = rules_dir("dist-exact");
    let prefix = unique_prefix("dist-exact");
    // A generous per-call timeout: on a loaded 2-core machine a 50 ms timeout would send some
    // calls to the local fallback, which is not what this test measures.
    let extra = ["--redis-prefix", &prefix, "--redis-timeout-ms", "5000"];
    let servers: Vec<Server> = (0..4)
        .map(|i| serve(&rules, shared_url(), &extra, &format!("exact{i}")))
        .collect();
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let rt = runtime();
    let day = utc_day();
    let mut results = Vec::new();
    for key in ["log", "fw", "gcra", "tb", "sc"] {
        let started = Instant::now();
        let [admitted, denied, other] = rt.block_on(hammer(&bases, key, "one", 5000));
        eprintln!(
            "{key}: {admitted} admitted, {denied} denied in {:?}",
            started.elapsed()
        );
        assert_eq!(other, 0, "{key}: failed requests");
        assert_eq!(admitted + denied, 5000);
        results.push((key, admitted));
    }
    let rolled = utc_day() != day;
    for (key, admitted) in results {
        match key {
            // In one fresh window (previous count 0) the counter is exact; across a day
            // boundary its documented bound is 2 x limit.
            "sc" if rolled => assert!(admitted <= 2 * LIMIT),
            "fw" if rolled => assert!(admitted <= 2 * LIMIT),
            _ => assert_eq!(admitted, LIMIT, "{key}"),
        }
    }
    for s in &servers {
        let m = http(&s.base, Method::GET, "/metrics", None).body;
        assert!(
            m.contains("tollgate_degraded_decisions_total{policy=\"local\"} 0"),
            "{m}"
        );
    }
    // The one-item checks of the counting algorithms (fw, sc) went to Redis in batched calls,
    // several checks per call.
    let batched = |name: &str| -> u64 { bases.iter().map(|b| metric_sum(b, name)).sum() };
    let (calls, checks) = (
        batched("tollgate_redis_batched_calls_total"),
        batched("tollgate_redis_batched_requests_total"),
    );
    assert_eq!(checks, 10_000, "fw and sc: every check batched");
    assert!(calls < checks, "{checks} checks in {calls} calls");
    assert!(assert_every_key_has_a_ttl(shared_url(), &prefix) >= 5);
    delete_prefix(shared_url(), &prefix);
}

/// `/readyz`'s `store_state`.
fn store_state(base: &str) -> Value {
    let r = http(base, Method::GET, "/readyz", None);
    let b: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    b["store_state"].clone()
}

/// Poll `/readyz` until `store_state` is `healthy`; the time it took. Once Redis answers again
/// the service gets back on it by itself (the breaker's probe runs every 250 ms); the deadline
/// only turns a service that never does into a failure.
fn until_healthy(base: &str) -> Duration {
    let start = Instant::now();
    loop {
        let r = http(base, Method::GET, "/readyz", None);
        let b: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        if b["store_state"] == "healthy" {
            assert_eq!((r.status, &b["status"]), (200, &json!("ready")));
            return start.elapsed();
        }
        assert!(start.elapsed() < HANG, "never recovered: {b}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn until_open(base: &str) {
    let start = Instant::now();
    loop {
        let b: Value =
            serde_json::from_str(&http(base, Method::GET, "/readyz", None).body).unwrap();
        if b["store_state"] == "open" {
            assert_eq!(b["status"], "degraded");
            return;
        }
        assert!(start.elapsed() < HANG, "breaker never opened: {b}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Steady load on one instance until stopped: (status, latency) of every request.
struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(u16, Duration, Value)>>,
}

impl Load {
    fn start(base: &str, key: &'static str) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (base, flag) = (base.to_string(), stop.clone());
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut conn = Conn::open(&base).await;
                let mut seen = Vec::new();
                while !flag.load(Relaxed) {
                    let t = Instant::now();
                    let (s, b) = conn.check(body(key, "steady")).await;
                    seen.push((s, t.elapsed(), b));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen
            })
        });
        Load { stop, handle }
    }

    fn finish(self) -> Vec<(u16, Duration, Value)> {
        self.stop.store(true, Relaxed);
        self.handle.join().unwrap()
    }
}

#[test]
fn outage_under_each_policy_then_back_to_redis_by_itself() {
    let mut redis = RedisServer::start(&[]);
    let port = redis.port;
    let rules = rules_dir("dist-outage");
    let prefix = unique_prefix("dist-outage");
    let mut servers: Vec<(&str, Server)> = ["allow", "deny", "local"]
        .into_iter()
        .map(|p| {
            let extra = ["--redis-prefix", &prefix, "--on-store-error", p];
            (
                p,
                serve(&rules, &redis.url(), &extra, &format!("outage-{p}")),
            )
        })
        .collect();
    for (_, s) in &servers {
        until_healthy(&s.base);
    }
    let answered: Vec<u64> = servers.iter().map(|(_, s)| requests(&s.base)).collect();
    let loads: Vec<Load> = servers
        .iter()
        .map(|(_, s)| Load::start(&s.base, "fw"))
        .collect();
    // Each load is under way on Redis before the outage.
    for ((_, s), n) in servers.iter().zip(&answered) {
        until_more(&s.base, requests, *n);
    }
    redis.kill();
    for (_, s) in &servers {
        until_open(&s.base);
    }
    // Requests made from here on are all decided by the policy, breaker open; each load makes
    // some of them.
    let before: Vec<u64> = servers.iter().map(|(_, s)| degraded(&s.base)).collect();
    for ((_, s), n) in servers.iter().zip(&before) {
        until_more(&s.base, degraded, *n);
    }
    let base_local = servers[2].1.base.clone();
    let tiny: Vec<u16> = (0..5)
        .map(|_| {
            let r = http(
                &base_local,
                Method::POST,
                "/v1/check",
                Some(serde_json::from_str(&body("tiny", "t")).unwrap()),
            );
            r.status
        })
        .collect();
    assert_eq!(
        tiny,
        [200, 200, 200, 429, 429],
        "local policy limits locally"
    );

    let _redis = RedisServer::start_on(port, &[]);
    let restarted = Instant::now();
    for (p, s) in &servers {
        until_healthy(&s.base);
        let back = restarted.elapsed();
        println!("{p}: back on Redis {back:?} after the restart answered");
    }
    let after_recovery: Vec<u64> = servers.iter().map(|(_, s)| degraded(&s.base)).collect();
    // Each load makes more requests, on Redis again.
    let answered: Vec<u64> = servers.iter().map(|(_, s)| requests(&s.base)).collect();
    for ((_, s), n) in servers.iter().zip(&answered) {
        until_more(&s.base, requests, *n);
    }
    for (((p, s), load), (b, a)) in servers
        .iter_mut()
        .zip(loads)
        .zip(before.iter().zip(&after_recovery))
    {
        let seen = load.finish();
        assert!(s.child.try_wait().unwrap().is_none(), "{p} crashed");
        assert!(a > b, "{p}: degraded decisions are counted");
        assert_eq!(
            degraded(&s.base),
            *a,
            "{p}: back on Redis, nothing degraded"
        );
        // Printed, not asserted: a busy machine can be slow whatever the breaker does.
        let slowest = seen.iter().map(|x| x.1).max().unwrap();
        println!("{p}: slowest request through the outage {slowest:?}");
        assert!(
            seen.iter().all(|x| x.0 == 200 || x.0 == 429),
            "{p}: failed requests"
        );
        let denied_by_policy = seen.iter().filter(|x| {
            x.0 == 429
                && x.2["statuses"][0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("denied by policy"))
        });
        match *p {
            "allow" | "local" => assert!(seen.iter().all(|x| x.0 == 200), "{p}"),
            _ => assert!(denied_by_policy.count() > 0, "deny denies"),
        }
    }
}

/// A hung Redis (SIGSTOP: calls time out instead of failing fast, unlike a killed one). Until the
/// breaker opens each request waits one per-call timeout; from then on none waits on Redis at all
/// (the breaker's whole point). Then SIGCONT: back on Redis by itself.
#[test]
fn hung_redis_costs_timeouts_only_until_the_breaker_opens() {
    // A timeout long enough that "waited on Redis" and "decided locally" cannot be confused on a
    // loaded machine.
    const TIMEOUT: Duration = Duration::from_millis(400);
    let redis = RedisServer::start(&[]);
    let rules = rules_dir("dist-hung");
    let prefix = unique_prefix("dist-hung");
    let timeout_ms = TIMEOUT.as_millis().to_string();
    let extra = ["--redis-prefix", &prefix, "--redis-timeout-ms", &timeout_ms];
    let s = serve(&rules, &redis.url(), &extra, "hung");
    until_healthy(&s.base);
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &redis.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    };
    let check = || {
        let t = Instant::now();
        let r = http(
            &s.base,
            Method::POST,
            "/v1/check",
            Some(serde_json::from_str(&body("log", "hung")).unwrap()),
        );
        assert_eq!(r.status, 200, "the local policy admits: {}", r.body);
        t.elapsed()
    };
    signal("-STOP");
    let mut before_open = Vec::new();
    let started = Instant::now();
    while store_state(&s.base) != "open" {
        before_open.push(check());
        assert!(started.elapsed() < HANG, "breaker never opened");
    }
    assert!(
        before_open.iter().any(|d| *d >= TIMEOUT),
        "no request waited for the timeout before the breaker opened: {before_open:?}"
    );
    let after_open: Vec<Duration> = (0..30).map(|_| check()).collect();
    assert!(
        after_open.iter().all(|d| *d < TIMEOUT),
        "a request waited on the hung Redis after the breaker opened: {after_open:?}"
    );
    signal("-CONT");
    let resumed = Instant::now();
    until_healthy(&s.base);
    println!("back on Redis {:?} after SIGCONT", resumed.elapsed());
}

fn degraded(base: &str) -> u64 {
    metric_sum(base, "tollgate_degraded_decisions_total{")
}

/// Requests answered (every code).
fn requests(base: &str) -> u64 {
    metric_sum(base, "tollgate_requests_total{")
}

/// The sum of the series of `/metrics` starting with `prefix`.
fn metric_sum(base: &str, prefix: &str) -> u64 {
    let m = http(base, Method::GET, "/metrics", None).body;
    m.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Wait until `count(base)` has grown past `from` by a few.
fn until_more(base: &str, count: fn(&str) -> u64, from: u64) {
    let start = Instant::now();
    while count(base) < from + 5 {
        assert!(start.elapsed() < HANG, "{base}: stuck at {}", count(base));
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn starts_with_redis_down_and_recovers() {
    // Refused until Redis starts there; held meanwhile, so no other server can take it.
    let down = RefusedPort::new();
    let port = down.port;
    let rules = rules_dir("dist-down");
    let s = serve(&rules, &format!("redis://127.0.0.1:{port}"), &[], "down");
    let r = http(&s.base, Method::GET, "/readyz", None);
    let b: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        (r.status, &b["status"], &b["store_state"]),
        (200, &json!("degraded"), &json!("open"))
    );
    let r = http(
        &s.base,
        Method::POST,
        "/v1/check",
        Some(serde_json::from_str(&body("fw", "x")).unwrap()),
    );
    assert_eq!(r.status, 200, "local policy answers");
    drop(down);
    let _redis = RedisServer::start_on(port, &[]);
    let started = Instant::now();
    until_healthy(&s.base);
    println!(
        "recovered {back:?} after Redis started",
        back = started.elapsed()
    );
    let r = http(
        &s.base,
        Method::POST,
        "/v1/check",
        Some(serde_json::from_str(&body("fw", "x")).unwrap()),
    );
    let b: Value = serde_json::from_str(&r.body).unwrap();
    // The request admitted locally while Redis was down was folded into Redis on its return.
    assert_eq!(
        b["statuses"][0]["limit_remaining"],
        LIMIT - 2,
        "counted on Redis now, with the local admission folded in"
    );
}

#[test]
fn script_flush_mid_run_fails_no_request() {
    let redis = RedisServer::start(&[]);
    let rules = rules_dir("dist-flush");
    let servers: Vec<Server> = (0..2)
        .map(|i| {
            serve(
                &rules,
                &redis.url(),
                &["--redis-timeout-ms", "5000"],
                &format!("flush{i}"),
            )
        })
        .collect();
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let rt = runtime();
    let flusher = {
        let port = redis.port;
        std::thread::spawn(move || {
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(50));
                assert!(tollgate_testsupport::cli(port, &["SCRIPT", "FLUSH"]).contains("OK"));
                assert!(tollgate_testsupport::cli(port, &["FUNCTION", "FLUSH"]).contains("OK"));
            }
        })
    };
    let [admitted, denied, other] = rt.block_on(hammer(&bases, "log", "flush", 3000));
    flusher.join().unwrap();
    assert_eq!(other, 0);
    for s in &servers {
        assert_eq!(degraded(&s.base), 0, "no call failed: {}", s.stderr());
    }
    assert_eq!((admitted, denied), (LIMIT, 2000));
}

#[test]
fn cluster_request_across_slots_is_all_or_nothing() {
    let cluster = Cluster::start(3);
    let rules = rules_dir("dist-cluster");
    let prefix = "tollgate";
    // Values whose counters land in different slots.
    let qa = Quota::new(10, Unit::Hour).with_algorithm(Algorithm::Gcra);
    let qb = Quota::new(1, Unit::Hour).with_algorithm(Algorithm::SlidingWindowLog);
    let (va, vb) = (0..)
        .map(|i| (format!("x{i}"), format!("y{i}")))
        .find(|(a, b)| {
            slot(&counter_keys(prefix, &format!("dist|a={a}"), &qa).0)
                != slot(&counter_keys(prefix, &format!("dist|b={b}"), &qb).0)
        })
        .unwrap();
    let s = serve(
        &rules,
        &cluster.url(),
        &["--redis-timeout-ms", "2000"],
        "cluster",
    );
    until_healthy(&s.base);
    let both = json!({"domain": "dist", "descriptors": [
        {"entries": [{"key": "a", "value": va}]},
        {"entries": [{"key": "b", "value": vb}]},
    ]});
    let r = http(&s.base, Method::POST, "/v1/check", Some(both.clone()));
    let b: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(r.status, 200, "{b}");
    assert_eq!(b["statuses"][0]["limit_remaining"], 9);
    // Denied by b's slot: a's slot gives back what it consumed.
    let r = http(&s.base, Method::POST, "/v1/check", Some(both));
    let b: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(r.status, 429, "{b}");
    assert_eq!(b["statuses"][0]["limit_remaining"], 9);
    assert_eq!(b["statuses"][1]["code"], "OVER_LIMIT");
    let r = http(
        &s.base,
        Method::POST,
        "/v1/check",
        Some(serde_json::from_str(&body("a", &va)).unwrap()),
    );
    let b: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(b["statuses"][0]["limit_remaining"], 8);
    assert_eq!(degraded(&s.base), 0);
}

#[test]
fn count_min_sketch_with_redis_is_refused_at_start() {
    let dir = temp_dir("dist-cms");
    std::fs::write(
        dir.join("cms.yaml"),
        "domain: c\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: count_min_sketch}\n",
    )
    .unwrap();
    let out = tollgate(&[
        "serve",
        "--rules",
        &dir.display().to_string(),
        "--store",
        shared_url(),
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cms.yaml:3"), "{err}");
    assert!(err.contains("count_min_sketch"), "{err}");
    let out = tollgate(&[
        "simulate",
        "--rules",
        &dir.display().to_string(),
        "--store",
        shared_url(),
        "--input",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("count_min_sketch"));
}
