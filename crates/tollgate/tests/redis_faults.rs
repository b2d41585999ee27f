//! Redis faults end to end: real `tollgate serve` processes on private `redis-server`s.
//!
//! - A wrong password or a missing database fails `serve` at start (exit 2, a clear message, no
//!   secret), as a cluster already did.
//! - A `WRONGTYPE` value at one counter key fails only that key's requests (decided by the
//!   policy, counted by kind): every other key is still decided by Redis, the breaker stays
//!   healthy, and `/readyz` says what is wrong.
//! - Out of memory (`maxmemory` + `noeviction`): `/readyz` says so, the error is logged once, the
//!   breaker does not flap, and a breaker opened by an outage is not half-opened by a Redis that
//!   answers `PING` but refuses writes (the probe writes).
//! - Slow is not down: 2 instances x 64 concurrent callers over one Redis admit exactly the limit
//!   for every algorithm, 5 runs; and Redis stalls (`CLIENT PAUSE`, timeouts interleaved with
//!   answers) neither open the breaker nor hand out a fresh local budget.

mod support;

use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::client::Method;
use support::conn::Conn;
use support::{http, serve_store as serve, temp_dir, Server, HANG};
use tollgate_testsupport::{runtime, unique_prefix, RedisServer};

const LIMIT: u64 = 300;

/// Every algorithm that runs on Redis, `LIMIT` per day (the window does not roll in a test).
const ALGORITHMS: [(&str, &str, &str); 6] = [
    ("log", "sliding_window_log", ""),
    ("fw", "fixed_window", ""),
    ("gcra", "gcra", ""),
    ("tb", "token_bucket", ", burst: 300"),
    ("lb", "leaky_bucket", ", burst: 300"),
    ("sc", "sliding_window_counter", ""),
];

fn rules_dir(name: &str) -> String {
    let mut y = String::from("domain: faults\ndescriptors:\n");
    for (key, alg, extra) in ALGORITHMS {
        y += &format!(
            "  - key: {key}\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}, algorithm: {alg}{extra}}}\n"
        );
    }
    let dir = temp_dir(name);
    std::fs::write(dir.join("faults.yaml"), y).unwrap();
    dir.display().to_string()
}

fn body(key: &str, value: &str) -> Value {
    json!({"domain": "faults", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
}

fn check(base: &str, key: &str, value: &str) -> (u16, Value) {
    let r = http(base, Method::POST, "/v1/check", Some(body(key, value)));
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

fn readyz(base: &str) -> Value {
    serde_json::from_str(&http(base, Method::GET, "/readyz", None).body).unwrap()
}

/// The value of one metric line (`name{labels}`), 0 when absent.
fn metric(base: &str, line: &str) -> u64 {
    let m = http(base, Method::GET, "/metrics", None).body;
    m.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or(0)
}

fn transitions(base: &str, to: &str) -> u64 {
    metric(
        base,
        &format!("tollgate_store_breaker_transitions_total{{to=\"{to}\"}}"),
    )
}

/// `tollgate serve ...` that must exit by itself: (exit code, stderr, how long it took).
fn serve_must_exit(store: &str, name: &str) -> (Option<i32>, String, Duration) {
    let rules = rules_dir(name);
    let log = temp_dir(name).join("stderr.log");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .args(["--rules", &rules, "--store", store])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve kept running with {store}: {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    (status.code(), stderr, started.elapsed())
}

#[test]
fn wrong_password_or_missing_db_fails_at_start() {
    let redis = RedisServer::start(&["--requirepass", "right-pw"]);
    let url = format!("redis://:hunter2-wrong@127.0.0.1:{}", redis.port);
    let (code, stderr, took) = serve_must_exit(&url, "faults-auth");
    eprintln!("wrong password: exit {code:?} after {took:?}: {stderr}");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("rejected the credentials"), "{stderr}");
    assert!(
        !stderr.contains("hunter2-wrong"),
        "password leaked: {stderr}"
    );

    let open = RedisServer::start(&[]);
    let (code, stderr, took) = serve_must_exit(&format!("{}/99", open.url()), "faults-db");
    eprintln!("missing db: exit {code:?} after {took:?}: {stderr}");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no database 99"), "{stderr}");
}

/// Every key of `prefix` in `redis` but the probe's.
fn counter_keys(redis: &RedisServer, prefix: &str) -> Vec<String> {
    redis
        .cli(&["--scan", "--pattern", &format!("{prefix}:*")])
        .lines()
        .map(str::to_string)
        .filter(|k| !k.ends_with(":probe"))
        .collect()
}

#[test]
fn wrongtype_at_one_key_is_not_an_outage() {
    let redis = RedisServer::start(&[]);
    let rules = rules_dir("faults-wrongtype");
    let prefix = unique_prefix("wrongtype");
    let s = serve(
        &rules,
        &redis.url(),
        &["--redis-prefix", &prefix, "--redis-timeout-ms", "2000"],
        "wrongtype",
    );
    assert_eq!(check(&s.base, "fw", "bad").0, 200);
    let keys = counter_keys(&redis, &prefix);
    assert_eq!(keys.len(), 1, "{keys:?}");
    redis.cli(&["DEL", &keys[0]]);
    redis.cli(&["HSET", &keys[0], "not", "a counter"]);
    for i in 0..20 {
        // The bad key: decided by the local policy (it admits), counted.
        assert_eq!(check(&s.base, "fw", "bad").0, 200);
        // Every other key: still decided by Redis.
        let (status, b) = check(&s.base, "fw", &format!("good{i}"));
        assert_eq!(status, 200);
        assert_eq!(b["statuses"][0]["limit_remaining"], LIMIT - 1, "{b}");
    }
    assert_eq!(transitions(&s.base, "open"), 0);
    // One per request on the bad key, and at most one more: the hits the policy admitted are
    // owed to Redis, and folding them back meets the same key once (then they are dropped), at
    // a moment of the store's own choosing.
    let wrongtype = metric(&s.base, "tollgate_redis_errors_total{kind=\"wrongtype\"}");
    assert!((20..=21).contains(&wrongtype), "{wrongtype}");
    assert_eq!(
        metric(
            &s.base,
            "tollgate_degraded_decisions_total{policy=\"local\"}"
        ),
        20,
        "only the bad key's requests were decided by the policy"
    );
    let r = readyz(&s.base);
    assert_eq!(r["store_state"], "healthy", "{r}");
    assert_eq!(r["status"], "ready", "{r}");
    assert_eq!(r["store_error"]["kind"], "wrongtype", "{r}");
    assert!(
        r["store_error"]["message"]
            .as_str()
            .unwrap()
            .contains("WRONGTYPE"),
        "{r}"
    );
    let rules_json: Value =
        serde_json::from_str(&http(&s.base, Method::GET, "/v1/rules", None).body).unwrap();
    assert_eq!(rules_json["store"]["last_error"]["kind"], "wrongtype");
}

#[test]
fn out_of_memory_is_reported_and_the_breaker_does_not_flap() {
    let mut redis = RedisServer::start(&[]);
    let port = redis.port;
    let rules = rules_dir("faults-oom");
    let prefix = unique_prefix("oom");
    let s = serve(&rules, &redis.url(), &["--redis-prefix", &prefix], "oom");
    assert_eq!(check(&s.base, "fw", "before").0, 200);
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    // Requests for 2 s (each a write Redis refuses), PING still answering.
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(2) {
        assert_eq!(
            check(&s.base, "fw", &format!("u{n}")).0,
            200,
            "local policy"
        );
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let (open, half) = (
        transitions(&s.base, "open"),
        transitions(&s.base, "half_open"),
    );
    eprintln!("{n} requests under OOM: {open} opens, {half} half-opens");
    assert_eq!((open, half), (0, 0), "the breaker flapped");
    let r = readyz(&s.base);
    assert_eq!(r["store_condition"], "out_of_memory", "{r}");
    assert_eq!(r["store_error"]["kind"], "out_of_memory", "{r}");
    assert!(
        r["store_error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of memory"),
        "{r}"
    );
    assert_eq!(
        metric(
            &s.base,
            "tollgate_redis_errors_total{kind=\"out_of_memory\"}"
        ),
        n
    );
    let logged = s.stderr().matches("out of memory").count();
    assert_eq!(logged, 1, "logged once: {}", s.stderr());

    // An outage opens the breaker; Redis comes back out of memory: PING answers but the probe
    // (a write) fails, so the breaker stays open instead of half-opening on every probe.
    redis.kill();
    let started = Instant::now();
    while readyz(&s.base)["store_state"] != "open" {
        check(&s.base, "fw", "outage");
        assert!(started.elapsed() < HANG, "never opened");
    }
    let redis = RedisServer::start_on(
        port,
        &["--maxmemory", "1", "--maxmemory-policy", "noeviction"],
    );
    assert!(redis.cli(&["PING"]).contains("PONG"));
    // The scenario: several probe rounds (every 250 ms) against a Redis that answers PING.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(readyz(&s.base)["store_state"], "open");
    assert_eq!(
        transitions(&s.base, "half_open"),
        0,
        "a PING is not a write"
    );
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let started = Instant::now();
    while readyz(&s.base)["store_state"] != "healthy" {
        check(&s.base, "fw", "after");
        assert!(started.elapsed() < HANG, "never recovered");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Regression: after an outage, `/readyz` went back to `store_state: healthy` (the probe) but
/// kept `store_condition: connection_refused` until the next request. The probe's write
/// reaching Redis clears it: no request is sent once Redis is back.
#[test]
fn readyz_clears_the_store_condition_when_redis_is_back() {
    let mut redis = RedisServer::start(&[]);
    let port = redis.port;
    let rules = rules_dir("faults-condition");
    let prefix = unique_prefix("condition");
    let s = serve(
        &rules,
        &redis.url(),
        &["--redis-prefix", &prefix],
        "condition",
    );
    assert_eq!(check(&s.base, "fw", "before").0, 200);
    assert_eq!(readyz(&s.base)["store_condition"], "ok");
    redis.kill();
    let started = Instant::now();
    while readyz(&s.base)["store_state"] != "open" {
        check(&s.base, "fw", "outage");
        assert!(started.elapsed() < HANG, "never opened");
    }
    let r = readyz(&s.base);
    assert_eq!(r["store_condition"], "connection_refused", "{r}");
    let _redis = RedisServer::start_on(port, &[]);
    // Only `/readyz` from here on: the probe alone brings the breaker back.
    let started = Instant::now();
    let r = loop {
        let r = readyz(&s.base);
        if r["store_state"] == "healthy" {
            break r;
        }
        assert!(started.elapsed() < HANG, "never recovered: {r}");
        std::thread::sleep(Duration::from_millis(25));
    };
    assert_eq!(r["status"], "ready", "{r}");
    assert_eq!(r["store_condition"], "ok", "{r}");
    // The last failure stays on record.
    assert_eq!(r["store_error"]["kind"], "connection_refused", "{r}");
    assert!(
        s.stderr().contains("Redis store answers again"),
        "{}",
        s.stderr()
    );
}

/// `attempts` checks of `key=value` from 64 callers per instance: (admitted, denied, other).
async fn hammer(bases: &[String], key: &str, value: &str, attempts: u64) -> [u64; 3] {
    let next = Arc::new(AtomicU64::new(0));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut tasks = Vec::new();
    for c in 0..64 * bases.len() {
        let base = bases[c % bases.len()].clone();
        let (next, counts) = (next.clone(), counts.clone());
        let body = body(key, value).to_string();
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(&base).await;
            while next.fetch_add(1, Relaxed) < attempts {
                let i = match conn.status(body.clone()).await {
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

/// Two instances with the default per-call timeout (50 ms) and the `local` policy told there
/// are 2 of them, on one private Redis.
fn two_instances(redis: &RedisServer, name: &str) -> Vec<Server> {
    let rules = rules_dir(name);
    let prefix = unique_prefix(name);
    (0..2)
        .map(|i| {
            serve(
                &rules,
                &redis.url(),
                &["--redis-prefix", &prefix, "--expected-instances", "2"],
                &format!("{name}{i}"),
            )
        })
        .collect()
}

/// Summed over the instances at `bases`: calls slower than the slow threshold, calls that timed
/// out, and breaker openings.
fn slow_timeouts_opened(bases: &[String]) -> (u64, u64, u64) {
    let sum = |line: &str| bases.iter().map(|b| metric(b, line)).sum::<u64>();
    (
        sum("tollgate_redis_slow_calls_total"),
        sum("tollgate_redis_errors_total{kind=\"timeout\"}"),
        bases.iter().map(|b| transitions(b, "open")).sum(),
    )
}

#[test]
fn two_instances_64_callers_each_admit_exactly_the_limit_5_times() {
    let redis = RedisServer::start(&[]);
    let servers = two_instances(&redis, "slow-exact");
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let rt = runtime();
    let mut seen = Vec::new();
    for run in 0..5 {
        for (key, _, _) in ALGORITHMS {
            let [admitted, denied, other] =
                rt.block_on(hammer(&bases, key, &format!("run{run}"), 2 * LIMIT));
            assert_eq!((other, admitted + denied), (0, 2 * LIMIT), "{key}");
            seen.push((key, admitted));
        }
    }
    let (slow, timeouts, opened) = slow_timeouts_opened(&bases);
    eprintln!(
        "admitted per run: {seen:?}; {slow} calls slower than 50 ms, {timeouts} timed out, breaker opened {opened} times"
    );
    for (key, admitted) in seen {
        // One fresh window (nothing in the previous one): the sliding window counter is exact.
        assert_eq!(admitted, LIMIT, "{key}");
    }
    assert_eq!(opened, 0);
}

#[test]
fn redis_stalls_neither_open_the_breaker_nor_grant_a_fresh_budget() {
    let redis = RedisServer::start(&[]);
    let servers = two_instances(&redis, "slow-stall");
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let rt = runtime();
    // Stalls of 150 ms every 300 ms: calls queue up and time out (50 ms), interleaved with
    // answers, as under load.
    let stop = Arc::new(AtomicBool::new(false));
    let staller = {
        let (stop, port) = (stop.clone(), redis.port);
        std::thread::spawn(move || {
            let mut stalls = 0;
            while !stop.load(Relaxed) {
                tollgate_testsupport::cli(port, &["CLIENT", "PAUSE", "150", "ALL"]);
                stalls += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            stalls
        })
    };
    let mut seen = Vec::new();
    for (key, _, _) in ALGORITHMS {
        let [admitted, denied, other] = rt.block_on(hammer(&bases, key, "stalled", 3 * LIMIT));
        assert_eq!((other, admitted + denied), (0, 3 * LIMIT), "{key}");
        seen.push((key, admitted));
    }
    stop.store(true, Relaxed);
    let stalls = staller.join().unwrap();
    let (slow, timeouts, opened) = slow_timeouts_opened(&bases);
    eprintln!(
        "under {stalls} stalls: admitted {seen:?}; {slow} calls slower than 50 ms, {timeouts} timed out, breaker opened {opened} times"
    );
    for (key, admitted) in seen {
        // Slow calls waited for Redis' answer instead of a fresh local budget (2 x 150).
        assert_eq!(admitted, LIMIT, "{key}");
    }
    assert_eq!(opened, 0, "queueing opened the breaker");
    assert!(
        slow > 0,
        "the stalls slowed no call: the test tests nothing"
    );
}
