//! `sync: lease` from the binary: three `tollgate serve` processes on one Redis (the shared
//! server, a fresh `--redis-prefix` per run), 32 keep-alive callers each on one hot key limited
//! to 600 per hour. In every run the fleet never admits more than 600, the units the instances
//! hold come back by themselves once the callers stop (`tollgate_lease_units_held` polled to
//! 0), and a last burst then reaches exactly 600, with one more after the units that came back
//! only once its callers had stopped (a grant that landed after they were turned away).

mod support;

use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::client::Method;
use support::conn::Conn;
use support::{http, serve_store as serve, temp_dir, Server};
use tollgate_testsupport::{delete_prefix, runtime, shared_url, unique_prefix};

const LIMIT: u64 = 600;
const CALLERS: usize = 32;
const RUNS: usize = 5;

fn body() -> String {
    json!({"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]})
        .to_string()
}

/// `CALLERS` callers per server, each sending `per_caller` checks, or (`None`) until it is
/// denied; returns (admitted, denied). Any other answer fails the test.
async fn burst(bases: &[String], per_caller: Option<u64>) -> (u64, u64) {
    let admitted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for base in bases {
        for _ in 0..CALLERS {
            let (base, admitted, denied) = (base.clone(), admitted.clone(), denied.clone());
            tasks.push(tokio::spawn(async move {
                let mut conn = Conn::open(&base).await;
                let mut sent = 0;
                while per_caller.is_none_or(|n| sent < n) {
                    sent += 1;
                    match conn.status(body()).await {
                        200 => admitted.fetch_add(1, Relaxed),
                        429 if per_caller.is_none() => {
                            denied.fetch_add(1, Relaxed);
                            return;
                        }
                        429 => denied.fetch_add(1, Relaxed),
                        other => panic!("unexpected status {other}"),
                    };
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    (admitted.load(Relaxed), denied.load(Relaxed))
}

/// The value of an unlabelled metric on `base`'s `/metrics`.
fn metric(base: &str, name: &str) -> u64 {
    let page = http(base, Method::GET, "/metrics", None).body;
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not on {base}/metrics"))
}

fn utc_hour() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
}

/// One run on fresh servers and prefix: `None` when the hour turned meanwhile (a second window:
/// the run says nothing about one window's limit and is done again).
fn run(rules: &str, run: usize) -> Option<u64> {
    let prefix = unique_prefix("lease-fleet");
    let extra = [
        "--redis-prefix",
        prefix.as_str(),
        // Generous: on a loaded 2-core machine a 50 ms timeout would send some calls to the
        // failure policy, which is not what this test measures.
        "--redis-timeout-ms",
        "5000",
    ];
    let servers: Vec<Server> = (0..3)
        .map(|i| {
            serve(
                rules,
                shared_url(),
                &extra,
                &format!("lease-fleet{run}-{i}"),
            )
        })
        .collect();
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let hour = utc_hour();
    let rt = runtime();
    // 3 x 32 callers x 6 = 576 checks, near the limit of 600: callers stop with units held.
    let (first, _) = rt.block_on(burst(&bases, Some(6)));
    assert!(first <= LIMIT, "run {run}: {first} admitted, limit {LIMIT}");
    let held: u64 = bases
        .iter()
        .map(|b| metric(b, "tollgate_lease_units_held"))
        .sum();
    // Units unused for half a second go back by themselves.
    let all_back = || {
        let start = Instant::now();
        while bases
            .iter()
            .any(|b| metric(b, "tollgate_lease_units_held") > 0)
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "run {run}: leased units never came back"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    all_back();
    // The last burst: every caller until it is denied.
    let (mut second, _) = rt.block_on(burst(&bases, None));
    // A grant can land in an instance's hand after its callers were turned away (its refill
    // was in flight when they learned the denial): those units go back idle, once nobody
    // asks. Once every lease is back, callers reach them too.
    all_back();
    let (rest, _) = rt.block_on(burst(&bases, None));
    second += rest;
    let returned: u64 = bases
        .iter()
        .map(|b| metric(b, "tollgate_lease_units_returned_total"))
        .sum();
    let local: u64 = bases
        .iter()
        .map(|b| metric(b, "tollgate_lease_local_decisions_total"))
        .sum();
    delete_prefix(shared_url(), &prefix);
    if utc_hour() != hour {
        eprintln!("run {run}: the hour turned during the run; running it again");
        return None;
    }
    eprintln!(
        "run {run}: {first} admitted, {held} units held, then {second} ({rest} after the last \
         leases came back); {returned} units returned, {local} decisions made from leases"
    );
    assert!(
        first + second <= LIMIT,
        "run {run}: {first} then {second} admitted, over the limit ({held} units were held)"
    );
    assert_eq!(
        first + second,
        LIMIT,
        "run {run}: {first} then {second} admitted: the full limit must be reachable once \
         leases come back ({held} units were held)"
    );
    assert!(
        returned >= held,
        "run {run}: {returned} returned of {held} held"
    );
    Some(first)
}

#[test]
fn three_serve_processes_share_a_leased_limit_exactly() {
    let dir = temp_dir("lease-fleet");
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, \
         requests_per_unit: 600, algorithm: fixed_window, sync: lease}\n",
    )
    .unwrap();
    let rules = rules.display().to_string();
    let mut done = 0;
    for attempt in 0..RUNS + 2 {
        if run(&rules, attempt).is_some() {
            done += 1;
        }
        if done == RUNS {
            return;
        }
    }
    panic!("only {done} of {RUNS} runs stayed in one hour");
}
