//! Wall-clock steps from outside: `tollgate serve` runs under libfaketime (the `faketime` Debian
//! package, installed by scripts/test.sh), its wall clock read from a file the test rewrites
//! (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`), its monotonic clock left real
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`). The clock steps a day forward and back, then a year back:
//! a GCRA 1/s client is not locked out, and an exhausted fixed-window client is not re-admitted.
//! (With a Redis store, Redis `TIME` decides, and `redis-server` cannot run under libfaketime:
//! its allocator's clock calls recurse into the preload. The Lua ports' clamps are checked by
//! the conformance suite on a real `redis-server` with explicit times that jump.)

use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::client::{HttpResponse, Method};

mod support;

use support::*;

const RULES: &str = "domain: api
descriptors:
  - key: rate
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: fixed_window}
";

/// libfaketime's preload library.
fn libfaketime() -> PathBuf {
    let mut candidates = vec![
        PathBuf::from("/usr/lib/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"),
    ];
    if let Ok(dirs) = std::fs::read_dir("/usr/lib") {
        for d in dirs.flatten() {
            candidates.push(d.path().join("faketime/libfaketime.so.1"));
        }
    }
    candidates.into_iter().find(|p| p.exists()).expect(
        "libfaketime not found: install the Debian package 'faketime' (scripts/test.sh does)",
    )
}

fn check(base: &str, key: &str, value: &str) -> HttpResponse {
    http(
        base,
        Method::POST,
        "/v1/check",
        Some(
            json!({"domain": "api", "descriptors": [{"entries": [{"key": key, "value": value}]}]}),
        ),
    )
}

fn retry_after(r: &HttpResponse) -> u64 {
    r.header("retry-after")
        .unwrap_or_else(|| panic!("429 without Retry-After: {:?}", r.headers))
        .parse()
        .unwrap()
}

/// The environment that runs a process on the wall clock in `file`, monotonic clock real.
fn faketime_env(file: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", libfaketime().display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ]
}

/// Set the server's wall clock offset (libfaketime's relative format: `+0`, `+1d`, `-365d`).
fn step(file: &Path, offset: &str) {
    std::fs::write(file, format!("{offset}\n")).unwrap();
}

/// The GCRA 1/s client is admitted again within a few seconds, never told to wait more than 1 s.
fn not_locked_out(base: &str, when: &str) {
    for _ in 0..10 {
        let r = check(base, "rate", "g");
        if r.status == 200 {
            return;
        }
        assert_eq!(r.status, 429);
        let wait = retry_after(&r);
        assert!(
            wait <= 1,
            "{when}: GCRA 1/s client told to retry after {wait} s"
        );
        std::thread::sleep(Duration::from_millis(1_100));
    }
    panic!("{when}: GCRA 1/s client still denied after 10 retries");
}

#[test]
fn wall_clock_steps_neither_lock_out_nor_readmit() {
    let dir = temp_dir("clock-jump");
    std::fs::write(dir.join("api.yaml"), RULES).unwrap();
    let clock = dir.join("faketime");
    step(&clock, "+0");
    let rules = dir.display().to_string();
    let env = faketime_env(&clock);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = serve_rules_env(&rules, &[], &env, "clock-jump");
    let base = server.base.clone();

    // Used: one GCRA request, the whole fixed-window day.
    assert_eq!(check(&base, "rate", "g").status, 200);
    for _ in 0..2 {
        assert_eq!(check(&base, "daily", "f").status, 200);
    }
    assert_eq!(check(&base, "daily", "f").status, 429);

    // A day forward: the service's clock does not follow the step, so no new day begins.
    step(&clock, "+1d");
    let _ = check(&base, "rate", "g");
    assert_eq!(
        check(&base, "daily", "f").status,
        429,
        "a one-day wall-clock step opened a new window"
    );

    // And back: not locked out for a day, not re-admitted.
    step(&clock, "+0");
    not_locked_out(&base, "a day forward and back");
    assert_eq!(
        check(&base, "daily", "f").status,
        429,
        "re-admitted after the step back"
    );

    // A year back.
    step(&clock, "-365d");
    not_locked_out(&base, "a year back");
    let r = check(&base, "daily", "f");
    assert_eq!(r.status, 429, "re-admitted after a year back");
    assert!(retry_after(&r) <= 86_400, "{:?}", r.headers);
    step(&clock, "+0");
}
