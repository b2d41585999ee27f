//! Admin work against decisions, on a real `tollgate serve` over real sockets: with many
//! registered limits, parallel `GET /v1/rules` callers and registry `PUT`s must not hold up a
//! normal client's `/v1/check`. Also what `/v1/rules` shows without the admin token, and its
//! pages.
//!
//! Nothing here asserts a duration: "never held up" is counted in events (how many admin calls
//! completed while one check was waiting for its answer: a check queued behind admin work sees
//! several finish); the latencies are printed as figures.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::client::Method;
use support::conn::Conn;
use support::registry::*;
use support::*;

/// `tollgate serve` with the admin token (memory registry) and a rules file of one domain.
fn start(dir: &std::path::Path, name: &str) -> Server {
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n",
    )
    .unwrap();
    serve_registry(dir, &rules, &[], name)
}

/// A domain of `rules` limits (`k0`..), each `per_minute` per minute.
fn many_limits(domain: &str, rules: usize, per_minute: u64) -> String {
    let mut y = format!("domain: {domain}\ndescriptors:\n");
    for j in 0..rules {
        y.push_str(&format!(
            "  - key: k{j}\n    rate_limit: {{unit: minute, requests_per_unit: {per_minute}}}\n"
        ));
    }
    y
}

/// How long an admin call may wait: listings run one at a time, so ten queued ones may wait a
/// while on a busy machine.
const ADMIN_WAIT: Duration = Duration::from_secs(300);

/// `GET /v1/rules{query}`, with the admin token when `token`; `answered` is called as soon as
/// the answer is in (before it is parsed).
fn rules_call_then(base: &str, query: &str, token: bool, answered: impl FnOnce()) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let headers: Vec<(&str, &str)> = if token {
        vec![("authorization", auth.as_str())]
    } else {
        Vec::new()
    };
    let path = format!("/v1/rules{query}");
    let r = call_within(base, Method::GET, &path, None, &headers, ADMIN_WAIT);
    answered();
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

fn rules_call(base: &str, query: &str, token: bool) -> (u16, Value) {
    rules_call_then(base, query, token, || {})
}

/// `PUT /v1/domains/{domain}` with the admin token, waiting up to [`ADMIN_WAIT`].
fn put_waiting(base: &str, domain: &str, yaml: &str) -> u16 {
    let auth = format!("Bearer {TOKEN}");
    call_within(
        base,
        Method::PUT,
        &format!("/v1/domains/{domain}"),
        Some(("application/yaml", yaml)),
        &[("authorization", auth.as_str())],
        ADMIN_WAIT,
    )
    .status
}

/// Counts a finished thread however it ends (a panic too), so that the waiting loop ends.
struct Finished(Arc<AtomicUsize>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn listings_and_registry_writes_do_not_hold_up_decisions() {
    let dir = temp_dir("admin-load");
    let server = start(&dir, "admin-load");
    let base = server.base.clone();
    let (domains, per_domain) = (100, 100);
    let registering = Instant::now();
    for i in 0..domains {
        let r = put(
            &base,
            &format!("d{i}"),
            &many_limits(&format!("d{i}"), per_domain, 10),
            None,
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    eprintln!(
        "registered {} limits in {domains} domains in {:?}",
        domains * per_domain,
        registering.elapsed()
    );
    // One domain's change among them all, measured (printed, not asserted).
    let mut one_put: Vec<Duration> = (0..10)
        .map(|n| {
            let t = Instant::now();
            let status = put_waiting(&base, "d1", &many_limits("d1", per_domain, 20 + n));
            assert_eq!(status, 200);
            t.elapsed()
        })
        .collect();
    one_put.sort();
    eprintln!(
        "a PUT of one {per_domain}-limit domain among {} limits: median {:?}, max {:?}",
        domains * per_domain,
        one_put[one_put.len() / 2],
        one_put[one_put.len() - 1]
    );
    let (status, summary) = rules_call(&base, "", false);
    assert_eq!(status, 200);
    assert_eq!(summary["limit_count"], domains * per_domain + 1);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body =
        json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "u"}]}]})
            .to_string();
    let mut conn = rt.block_on(Conn::open(&base));
    // Admin calls answered so far (listings and PUTs, counted by their callers).
    let admin_done = Arc::new(AtomicUsize::new(0));
    // The checks' latencies, and the most admin calls answered while one check waited.
    let mut timed_checks = |n: Option<usize>, until: &dyn Fn() -> bool| {
        let mut latencies = Vec::new();
        let mut most_during_one = 0;
        while n.is_none_or(|n| latencies.len() < n) && !until() {
            let (t, before) = (Instant::now(), admin_done.load(SeqCst));
            let status = rt.block_on(conn.status(body.clone()));
            assert_eq!(status, 200);
            latencies.push(t.elapsed());
            most_during_one = most_during_one.max(admin_done.load(SeqCst) - before);
        }
        latencies.sort();
        (latencies, most_during_one)
    };
    let (quiet, _) = timed_checks(Some(300), &|| false);

    // The attack: 10 callers listing every limit at once (with the token), one writer
    // changing a domain over and over, for as long as the listings last.
    let (callers, rounds) = (10, 1);
    let done = Arc::new(AtomicUsize::new(0));
    let stop_writes = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for _ in 0..callers {
        let (base, done, admin_done) = (base.clone(), done.clone(), admin_done.clone());
        threads.push(std::thread::spawn(move || {
            let _finished = Finished(done);
            for _ in 0..rounds {
                let (status, page) = rules_call_then(&base, "?limit=10000", true, || {
                    admin_done.fetch_add(1, SeqCst);
                });
                assert_eq!(status, 200, "{page}");
                assert_eq!(page["detail"], "full");
                assert!(page["domains"][0]["limits"].is_array(), "{page}");
            }
        }));
    }
    let writes = {
        let (base, stop, admin_done) = (base.clone(), stop_writes.clone(), admin_done.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                n += 1;
                let status = put_waiting(&base, "d0", &many_limits("d0", per_domain, 10 + n));
                admin_done.fetch_add(1, SeqCst);
                assert_eq!(status, 200);
            }
            n
        })
    };
    let (during, most_during_one) = timed_checks(None, &|| done.load(SeqCst) == callers);
    stop_writes.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let puts = writes.join().unwrap();
    eprintln!(
        "/v1/check p50/p99/max: quiet {:?}/{:?}/{:?} ({} checks); during {} listings of {} limits \
         and {puts} PUTs: {:?}/{:?}/{:?} ({} checks; at most {most_during_one} admin calls \
         answered during one check)",
        percentile(&quiet, 0.5),
        percentile(&quiet, 0.99),
        quiet[quiet.len() - 1],
        quiet.len(),
        callers * rounds,
        domains * per_domain,
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        during[during.len() - 1],
        during.len(),
    );
    // No check waited behind the admin work: admin calls run one at a time, each far longer
    // than a check, so a check that is not queued behind them sees at most one or two of them
    // answered while it waits (their callers may see answers a little apart from when they were
    // made: one more is allowed); one queued behind them sees several.
    assert!(
        most_during_one <= 3,
        "a check waited while {most_during_one} admin calls were answered"
    );
    assert!(!during.is_empty());
    drop(server);
}

#[test]
fn rules_lists_limits_to_the_admin_token_holder_and_pages() {
    let dir = temp_dir("admin-rules-pages");
    let server = start(&dir, "admin-rules-pages");
    let base = server.base.clone();
    for i in 0..5 {
        let r = put(
            &base,
            &format!("p{i}"),
            &many_limits(&format!("p{i}"), 3, 10),
            None,
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    // Without the token: the summary, each domain with its number of limits only.
    let (status, summary) = rules_call(&base, "", false);
    assert_eq!(status, 200);
    assert_eq!(summary["detail"], "summary");
    assert_eq!(summary["domain_count"], 6);
    assert_eq!(summary["limit_count"], 16);
    let names: Vec<&str> = summary["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert!(d.get("limits").is_none(), "{d}");
            d["domain"].as_str().unwrap()
        })
        .collect();
    assert_eq!(names, ["api", "p0", "p1", "p2", "p3", "p4"]);
    assert_eq!(summary["domains"][1]["limit_count"], 3);
    // A wrong token is refused; the right one lists the limits.
    let r = call(
        &base,
        Method::GET,
        "/v1/rules",
        None,
        &[("authorization", "Bearer nope")],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let (_, full) = rules_call(&base, "?domain=p3", true);
    assert_eq!(full["detail"], "full");
    assert_eq!(full["domains"].as_array().unwrap().len(), 1);
    assert_eq!(full["domains"][0]["limits"].as_array().unwrap().len(), 3);
    // Pages of at most 7 limits, whole domains: api (1) + p0 (3) + ... follow `next_after`.
    let mut seen = Vec::new();
    let mut query = "?limit=7".to_string();
    loop {
        let (status, page) = rules_call(&base, &query, true);
        assert_eq!(status, 200, "{page}");
        let listed: usize = page["domains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                seen.push(d["domain"].as_str().unwrap().to_string());
                d["limits"].as_array().unwrap().len()
            })
            .sum();
        assert!(listed <= 7, "{page}");
        match page["next_after"].as_str() {
            Some(after) => query = format!("?limit=7&after={after}"),
            None => break,
        }
    }
    assert_eq!(seen, ["api", "p0", "p1", "p2", "p3", "p4"]);
    let (status, bad) = rules_call(&base, "?limit=0", true);
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], "invalid_query");
    drop(server);
}
