//! The two Redis topologies of envoyproxy/ratelimit beyond one server and a cluster, as real
//! processes under `tollgate serve --profile envoy`:
//!
//! - `REDIS_TYPE=SENTINEL`: a master, its replica and two `redis-sentinel`s; tollgate finds the
//!   master through the sentinels, enforces a limit there in envoy's key layout, and after
//!   `SENTINEL FAILOVER` keeps enforcing it on the promoted replica (its counter written there).
//! - `REDIS_PERSECOND=true`: two `redis-server`s; the counters of limits whose unit is second
//!   land only in the second, the others only in the first, in envoy's key layout; with one of
//!   the two down only its limits go to the failure policy; and a request one Redis blocks
//!   gives back what the other admitted (tollgate algorithms stay all-or-nothing).

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use support::client::Method;
use support::*;
use tollgate_testsupport::{wait_for, RedisServer, SentinelGroup};

/// envoy's runtime folder with `rules` as its only file.
fn runtime_with(name: &str, rules: &str) -> std::path::PathBuf {
    let root = temp_dir(name);
    let app = root.join("ratelimit/config");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("api.yaml"), rules).unwrap();
    root
}

/// `tollgate serve --profile envoy` on loopback ports it picks, with `vars` (and `TOLLGATE_*`
/// settings).
fn start(root: &Path, vars: &[(&str, &str)], name: &str) -> Server {
    let root = root.display().to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("RUNTIME_ROOT", &root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("REDIS_TIMEOUT", "2s"),
    ];
    env.extend_from_slice(vars);
    Server::start_env(&["--profile", "envoy"], &env, &repo(), name)
}

/// `POST /v1/check` with one descriptor per `(key, value)`, each costing `hits`.
fn check_all(base: &str, entries: &[(&str, &str)], hits: u64) -> (u16, Value) {
    let descriptors: Vec<Value> = entries
        .iter()
        .map(|(k, v)| json!({"entries": [{"key": k, "value": v}]}))
        .collect();
    let r = http(
        base,
        Method::POST,
        "/v1/check",
        Some(json!({"domain": "api", "descriptors": descriptors, "hits_addend": hits})),
    );
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

/// The keys of the server on `port` matching `pattern`.
fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    server
        .cli(&["--no-raw", "KEYS", pattern])
        .lines()
        .filter_map(|l| {
            l.split_once('"')
                .map(|(_, k)| k.trim_end_matches('"').to_owned())
        })
        .collect()
}

/// The integer value of `key` on `server` (0 when absent).
fn get(server: &RedisServer, key: &str) -> u64 {
    server.cli(&["GET", key]).trim().parse().unwrap_or(0)
}

/// A 5-per-year limit (envoy's 365-day window: no boundary falls inside a test).
const SENTINEL_RULES: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 5}
";

#[test]
fn sentinel_master_is_found_and_followed_through_a_failover() {
    let group = SentinelGroup::start();
    let root = runtime_with("envoy-sentinel", SENTINEL_RULES);
    let url = format!("{},{}", group.name, group.sentinel_list());
    let s = start(
        &root,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", &url),
            ("CACHE_KEY_PREFIX", "rl:"),
        ],
        "envoy-sentinel",
    );
    assert!(s.line.contains("redis+sentinel://"), "{}", s.line);
    let old = group.master_port();
    for n in 1..=3 {
        let (status, b) = check_all(&s.base, &[("user", "ann")], 1);
        assert_eq!(status, 200, "{b}");
        assert_eq!(b["statuses"][0]["limit_remaining"], 5 - n, "{b}");
    }
    // envoy's key layout: CACHE_KEY_PREFIX, domain, entries, window start.
    let on_old = keys(group.server(old), "rl:api_user_ann_*");
    assert_eq!(on_old.len(), 1, "{on_old:?}");
    let key = on_old[0].clone();
    assert_eq!(get(group.server(old), &key), 3);

    let new = group.failover();
    assert_ne!(old, new);
    // Requests right after the failover may be decided by the failure policy while tollgate
    // asks the sentinels again; then they count on the new master, from the replicated 3.
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(group.server(new), &key) <= 3 {
        assert!(
            Instant::now() < deadline,
            "tollgate never counted on the new master:\n{}",
            s.stderr()
        );
        check_all(&s.base, &[("user", "ann")], 1);
        std::thread::sleep(Duration::from_millis(100));
    }
    // From now on every hit is counted on the new master and the limit holds there.
    let mut seen_over = false;
    for _ in 0..4 {
        let before = get(group.server(new), &key);
        let (status, b) = check_all(&s.base, &[("user", "ann")], 1);
        assert_eq!(get(group.server(new), &key), before + 1, "{b}");
        let over = before + 1 > 5;
        assert_eq!(status, if over { 429 } else { 200 }, "count {before}: {b}");
        seen_over |= over;
    }
    assert!(seen_over);
    assert!(group.server(new).cli(&["ROLE"]).starts_with("master"));
    let ready = http(&s.base, Method::GET, "/readyz", None);
    assert!(ready.body.contains("\"ready\""), "{}", ready.body);
    assert!(s.stderr().contains("master moved"), "{}", s.stderr());
}

/// A per-second and a per-minute limit (envoy's fixed windows), and tollgate algorithms for the
/// all-or-nothing check: a 1-per-second limit no cost above 1 can pass, a 500-per-second bucket
/// and an hourly log.
const SPLIT_RULES: &str = "domain: api
descriptors:
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tight
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 500, algorithm: token_bucket}
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window_log}
";

#[test]
fn per_second_limits_live_on_their_own_redis() {
    let mut main = RedisServer::start(&[]);
    let mut fast = RedisServer::start(&[]);
    let root = runtime_with("envoy-persecond", SPLIT_RULES);
    let (main_addr, fast_addr) = (
        format!("127.0.0.1:{}", main.port),
        format!("127.0.0.1:{}", fast.port),
    );
    let s = start(
        &root,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &main_addr),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", &fast_addr),
            ("REDIS_PERSECOND_TIMEOUT", "2s"),
            ("TOLLGATE_ON_STORE_ERROR", "deny"),
        ],
        "envoy-persecond",
    );
    assert!(
        s.line
            .contains(&format!("per-second limits on redis://{fast_addr}")),
        "{}",
        s.line
    );

    // Counters land by unit, in envoy's layout (empty CACHE_KEY_PREFIX).
    let (status, b) = check_all(&s.base, &[("fast", "a"), ("slow", "b")], 1);
    assert_eq!(status, 200, "{b}");
    assert_eq!(keys(&fast, "api_fast_a_*").len(), 1);
    assert_eq!(keys(&main, "api_slow_b_*").len(), 1);
    assert!(
        keys(&main, "api_fast_*").is_empty(),
        "{:?}",
        keys(&main, "*")
    );
    assert!(
        keys(&fast, "api_slow_*").is_empty(),
        "{:?}",
        keys(&fast, "*")
    );
    assert_eq!(get(&main, &keys(&main, "api_slow_b_*")[0]), 1);

    // One request blocked by one Redis keeps nothing on the other (tollgate algorithms): the
    // cost-5 hit cannot pass the 1-per-second limit, so the hourly log gives its 5 back.
    let (status, b) = check_all(&s.base, &[("tight", "t"), ("hourly", "h")], 5);
    assert_eq!(status, 429, "{b}");
    assert_eq!(b["statuses"][1]["code"], "OK", "{b}");
    let (status, b) = check_all(&s.base, &[("hourly", "h")], 1);
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["statuses"][0]["limit_remaining"], 99, "refunded: {b}");
    // ... and the other way round: blocked on the main Redis (200 > 100 an hour), nothing
    // kept by the per-second bucket (full again, whatever the time taken).
    let (status, b) = check_all(&s.base, &[("bucket", "k"), ("hourly", "h2")], 200);
    assert_eq!(status, 429, "{b}");
    assert_eq!(b["statuses"][0]["code"], "OK", "{b}");
    let (status, b) = check_all(&s.base, &[("bucket", "k")], 1);
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["statuses"][0]["limit_remaining"], 499, "refunded: {b}");

    // The per-second Redis down: its limits go to the failure policy (deny), the others stay
    // on the main Redis and keep counting there.
    let fast_port = fast.port;
    fast.kill();
    let before = get(&main, &keys(&main, "api_slow_b_*")[0]);
    for _ in 0..5 {
        let (status, b) = check_all(&s.base, &[("slow", "b")], 1);
        assert_eq!(status, 200, "main Redis still up: {b}");
        let (status, b) = check_all(&s.base, &[("fast", "a")], 1);
        assert_eq!(status, 429, "per-second Redis down, policy deny: {b}");
    }
    assert_eq!(get(&main, &keys(&main, "api_slow_b_*")[0]), before + 5);
    let ready = http(&s.base, Method::GET, "/readyz", None);
    let r: Value = serde_json::from_str(&ready.body).unwrap();
    assert_eq!(r["status"], "degraded", "{r}");
    assert_eq!(r["store_state"], "healthy", "{r}");
    assert_ne!(r["per_second"]["store_state"], "healthy", "{r}");
    let m = http(&s.base, Method::GET, "/metrics", None).body;
    assert!(
        m.contains("tollgate_store_state{state=\"healthy\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_store_state{store=\"per_second\",state=\"open\"} 1"),
        "{m}"
    );

    // Back up: per-second limits return to their Redis by themselves; then the main one down
    // leaves them alone.
    let fast = RedisServer::start_on(fast_port, &[]);
    wait_for(
        Duration::from_secs(30),
        "the per-second Redis to be used again",
        || check_all(&s.base, &[("fast", "c")], 1).0 == 200,
    );
    main.kill();
    for _ in 0..5 {
        let (status, b) = check_all(&s.base, &[("fast", "c")], 1);
        assert_eq!(status, 200, "per-second Redis up: {b}");
        let (status, b) = check_all(&s.base, &[("slow", "b")], 1);
        assert_eq!(status, 429, "main Redis down, policy deny: {b}");
    }
    let fast_c: u64 = keys(&fast, "api_fast_c_*")
        .iter()
        .map(|k| get(&fast, k))
        .sum();
    assert!(
        fast_c >= 5,
        "per-second hits counted on their Redis: {fast_c}"
    );
}
