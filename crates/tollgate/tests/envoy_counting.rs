//! envoyproxy/ratelimit's counting from outside: `tollgate serve --default-algorithm
//! envoy_fixed_window --count-denied-hits --redis-key-layout envoy` on a real Redis, next to
//! counters written by hand the way an envoyproxy/ratelimit pod writes them (its cache key,
//! `INCRBY` then `EXPIRE`). Both count in one counter per descriptor and window: the limit is
//! one, a denied request still counts on every descriptor, and envoy reads tollgate's counts.

use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::client::Method;

mod support;

use support::*;
use tollgate_testsupport::envoy_incr;

const RULES: &str = "domain: shared
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 2}
";

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn check(base: &str, user: &str) -> (u16, Value) {
    let body = json!({
        "domain": "shared",
        "descriptors": [
            {"entries": [{"key": "user", "value": user}]},
            {"entries": [{"key": "path", "value": user}]},
        ]
    });
    let r = http(base, Method::POST, "/v1/check", Some(body));
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

#[test]
fn envoy_counting_and_keys_shared_with_envoy_pods() {
    let dir = temp_dir("envoy-counting");
    std::fs::write(dir.join("shared.yaml"), RULES).unwrap();
    let rules = dir.display().to_string();
    let prefix = format!("tgtest-envoycount-{}:", std::process::id());
    let server = serve_store(
        &rules,
        tollgate_testsupport::shared_url(),
        &[
            "--redis-timeout-ms",
            "3000",
            "--default-algorithm",
            "envoy_fixed_window",
            "--count-denied-hits",
            "--redis-key-layout",
            "envoy",
            "--redis-prefix",
            &prefix,
            "--redis-expiration-jitter",
            "5s",
        ],
        "envoy-counting",
    );
    let mut c = redis::Client::open(tollgate_testsupport::shared_url())
        .unwrap()
        .get_connection()
        .unwrap();
    // The scenario must run inside one minute window (envoy's keys are per window): start it
    // early in a minute, and run it again with fresh keys if the minute turned meanwhile.
    for attempt in 0..3 {
        if unix_now() % 60 > 45 {
            std::thread::sleep(Duration::from_secs(61 - unix_now() % 60));
        }
        let start = unix_now() / 60 * 60;
        let user = format!("alice{attempt}");
        let user_key = format!("{prefix}shared_user_{user}_{start}");
        let path_key = format!("{prefix}shared_path_{user}_{start}");

        // An envoy pod counted 4 of alice's 5.
        envoy_incr(&mut c, &user_key, 4, 60);
        let (s1, b1) = check(&server.base, &user);
        // The 6th hit on alice: over the limit, and counted on both descriptors.
        let (s2, b2) = check(&server.base, &user);
        let user_count: u64 = redis::cmd("GET").arg(&user_key).query(&mut c).unwrap();
        let path_count: u64 = redis::cmd("GET").arg(&path_key).query(&mut c).unwrap();
        // The envoy pod reads tollgate's counts: path is over for it too.
        let envoy_path = envoy_incr(&mut c, &path_key, 1, 60);
        let ttl: i64 = redis::cmd("TTL").arg(&user_key).query(&mut c).unwrap();
        if unix_now() / 60 * 60 != start {
            continue;
        }
        assert_eq!(s1, 200, "{b1}");
        assert_eq!(b1["statuses"][0]["limit_remaining"], 0, "{b1}");
        assert_eq!(b1["statuses"][1]["limit_remaining"], 1, "{b1}");
        let reset = b1["statuses"][0]["duration_until_reset_ms"]
            .as_u64()
            .unwrap();
        assert!(
            reset <= 60_000,
            "envoy's window end, not a rolling period: {b1}"
        );
        assert_eq!(s2, 429, "{b2}");
        assert_eq!(b2["statuses"][0]["code"], "OVER_LIMIT", "{b2}");
        assert_eq!(b2["statuses"][0]["limit_remaining"], 0, "{b2}");
        assert_eq!(b2["statuses"][1]["code"], "OK", "{b2}");
        assert_eq!(b2["statuses"][1]["limit_remaining"], 0, "{b2}");
        assert_eq!(
            user_count, 6,
            "the denied hit counts on the denied descriptor"
        );
        assert_eq!(path_count, 2, "and on the others of the request");
        assert_eq!(envoy_path, 3);
        assert!((1..=65).contains(&ttl), "EXPIRE window + jitter: {ttl}");
        let _: () = redis::cmd("DEL")
            .arg(&user_key)
            .arg(&path_key)
            .query(&mut c)
            .unwrap();
        return;
    }
    panic!("three minutes turned during the scenario");
}

/// `--default-algorithm` holds at start and after a hot reload (memory store, env settings):
/// a request denied by one descriptor still counts on the other (envoy_fixed_window with
/// `TOLLGATE_COUNT_DENIED_HITS`), where the all-or-nothing default would count nothing.
#[test]
fn default_algorithm_survives_a_reload() {
    const YEARLY: &str = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: year, requests_per_unit: LIMIT}
";
    let dir = temp_dir("envoy-default-reload");
    let file = dir.join("d.yaml");
    std::fs::write(&file, YEARLY.replace("LIMIT", "5")).unwrap();
    let rules = dir.display().to_string();
    let server = serve_rules_env(
        &rules,
        &["--reload-interval-ms", "50"],
        &[
            ("TOLLGATE_DEFAULT_ALGORITHM", "envoy_fixed_window"),
            ("TOLLGATE_COUNT_DENIED_HITS", "true"),
        ],
        "envoy-default-reload",
    );
    let pair = |v: &str, hits: u64| {
        let body = json!({
            "domain": "d",
            "hits_addend": hits,
            "descriptors": [
                {"entries": [{"key": "a", "value": v}]},
                {"entries": [{"key": "b", "value": v}]},
            ]
        });
        let r = http(&server.base, Method::POST, "/v1/check", Some(body));
        let b: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        (r.status, b)
    };
    pair("u1", 1);
    let (status, b) = pair("u1", 1);
    assert_eq!(status, 429, "{b}");
    assert_eq!(
        b["statuses"][1]["limit_remaining"], 3,
        "b counted twice: {b}"
    );

    std::fs::write(&file, YEARLY.replace("LIMIT", "10")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, b) = pair("probe", 0);
        if b["statuses"][1]["current_limit"]["requests_per_unit"] == 10 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not reloaded: {b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    pair("u2", 1);
    let (status, b) = pair("u2", 1);
    assert_eq!(status, 429, "{b}");
    assert_eq!(
        b["statuses"][1]["limit_remaining"], 8,
        "still envoy_fixed_window after the reload: {b}"
    );
}
