//! Queueing from outside, through a real nginx (`auth_request` to `tollgate serve`'s
//! forward-auth, the shipped example config with a longer auth timeout than the rules'
//! `max_wait`): requests a rule with `queue` denies wait instead of getting 429, paid ones
//! ahead of free ones that came earlier, within `max_length`; a client that goes away leaves
//! its line, and its place is taken by the next request. The upstream sees the requests in the
//! order they were served. On the Redis store, `POST /v1/check` keeps the same order.
//!
//! Each step waits for an event: a response, or a queue gauge on `/metrics`. The limits are one
//! request per 4-second fixed window (aligned to the Unix epoch), and a scenario starts early
//! in a window so that its waiters all join before the window ends.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::client::Method;
use support::gateway::{get, Gateway, Resp, Upstream};
use support::registry::metric;
use support::{http, serve_store, temp_dir, tollgate, Server};
use tollgate_testsupport::{delete_prefix, shared_url, unique_prefix};

const RULES: &str = r#"domain: web
http:
  - actions:
      - request_headers: {header_name: x-lane, descriptor_key: lane}
      - request_headers: {header_name: x-plan, descriptor_key: plan, skip_if_absent: true}
descriptors:
  - key: lane
    value: order
    message: the API is busy
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 1, algorithm: fixed_window}
    tiers: {key: plan, levels: [{value: paid, guaranteed: 0}, {value: free, guaranteed: 0}]}
    queue: {max_wait: 9s, max_length: 2}
  - key: lane
    value: check
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 1, algorithm: fixed_window}
    queue: {max_wait: 9s, max_length: 1}
  - key: lane
    value: gone
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 1, algorithm: fixed_window}
    queue: {max_wait: 9s, max_length: 1}
"#;

/// `tollgate serve` with the rules, nginx in front of it (its auth timeout raised above the
/// rules' 9 s `max_wait`, as docs/gateways.md says), and the upstream.
fn start(name: &str) -> (Server, Gateway, Upstream) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("web.yaml"), RULES).unwrap();
    let server = Server::start(
        &[
            "--rules",
            "web.yaml",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ],
        &dir,
        name,
    );
    let port = server.base.rsplit(':').next().unwrap().parse().unwrap();
    let upstream = Upstream::start();
    let nginx = Gateway::nginx(&format!("{name}-ngx"), port, upstream.port, |c| {
        assert!(c.contains("proxy_read_timeout 5s;"));
        c.replace("proxy_read_timeout 5s;", "proxy_read_timeout 15s;")
    });
    (server, nginx, upstream)
}

/// The value of `family` for the rule `web|lane=<lane>` (and `extra` labels), 0 when absent.
fn queue_metric(base: &str, family: &str, lane: &str, extra: &str) -> u64 {
    metric(
        base,
        &format!(
            "{family}{{domain=\"web\",rule=\"web.lane_{lane}\",limit=\"web|lane={lane}\"{extra}}}"
        ),
    )
}

/// Wait until `family` of `lane` reads `n`: polled, each read a full `/metrics` round trip.
fn until_metric(base: &str, family: &str, lane: &str, extra: &str, n: u64) {
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    while queue_metric(base, family, lane, extra) != n {
        assert!(
            std::time::Instant::now() < give_up,
            "{family}{{{lane}{extra}}} never reached {n}"
        );
        std::thread::yield_now();
    }
}

/// Wait for the start of a 4-second window (the limits' fixed windows, aligned to the epoch),
/// so that a scenario's first request opens a window with nearly all of it ahead.
fn window_start() {
    loop {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let into = now.as_millis() % 4_000;
        if into < 300 {
            return;
        }
        std::thread::sleep(Duration::from_millis((4_000 - into) as u64));
    }
}

/// A request on `lane` in `plan`, sent through nginx on a thread of its own.
fn send(
    port: u16,
    id: &'static str,
    lane: &'static str,
    plan: Option<&'static str>,
) -> std::thread::JoinHandle<Resp> {
    std::thread::spawn(move || {
        let mut headers = vec![("X-Lane", lane), ("X-Id", id)];
        if let Some(p) = plan {
            headers.push(("X-Plan", p));
        }
        get("127.0.0.1", port, &format!("/{id}"), &headers)
    })
}

/// The paths the upstream received, in order.
fn upstream_paths(upstream: &Upstream) -> Vec<String> {
    let heads = upstream.heads.lock().unwrap();
    heads
        .iter()
        .filter_map(|h| h.split_whitespace().nth(1).map(str::to_owned))
        .collect()
}

#[test]
fn nginx_serves_paid_waiters_before_earlier_free_ones_within_max_length() {
    let (server, nginx, upstream) = start("queue-order");
    let base = server.base.clone();
    window_start();
    let a = send(nginx.port, "a", "order", Some("free")).join().unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    // The window is used: free requests wait.
    let f1 = send(nginx.port, "f1", "order", Some("free"));
    until_metric(&base, "tollgate_queue_waiting", "order", "", 1);
    let f2 = send(nginx.port, "f2", "order", Some("free"));
    until_metric(&base, "tollgate_queue_waiting", "order", "", 2);
    // A paid one comes later: the line is full, so it takes the last free one's place, and
    // that one is refused at once.
    let p1 = send(nginx.port, "p1", "order", Some("paid"));
    let f2 = f2.join().unwrap();
    assert_eq!(f2.status, 429, "{f2:?}");
    assert!(f2.body.contains("queue full"), "{f2:?}");
    assert_eq!(
        queue_metric(
            &base,
            "tollgate_queue_dropped_total",
            "order",
            ",reason=\"full\""
        ),
        1
    );
    // Beyond max_length, a free one (behind the waiting free one, and of no higher priority
    // than anyone in the line) is refused at once too.
    let f3 = send(nginx.port, "f3", "order", Some("free"))
        .join()
        .unwrap();
    assert_eq!(f3.status, 429, "{f3:?}");
    assert!(f3.header("retry-after").is_some(), "{f3:?}");
    // The paid one is served at the next window, the earlier free one at the window after.
    let p1 = p1.join().unwrap();
    assert_eq!(p1.status, 200, "{p1:?}");
    let f1 = f1.join().unwrap();
    assert_eq!(f1.status, 200, "{f1:?}");
    assert_eq!(upstream_paths(&upstream), ["/a", "/p1", "/f1"]);
    assert_eq!(
        queue_metric(&base, "tollgate_queue_served_total", "order", ""),
        2
    );
    assert_eq!(
        queue_metric(&base, "tollgate_queue_waiting", "order", ""),
        0
    );
    // Nobody waited longer than max_wait (9 s): every wait is in the buckets up to 10 s.
    assert_eq!(
        queue_metric(
            &base,
            "tollgate_queue_wait_seconds_bucket",
            "order",
            ",le=\"10\""
        ),
        2
    );
    drop(nginx);
}

#[test]
fn nginx_client_that_goes_away_leaves_the_line_and_its_place_is_reused() {
    let (server, nginx, upstream) = start("queue-gone");
    let base = server.base.clone();
    window_start();
    let first = send(nginx.port, "g0", "gone", None).join().unwrap();
    assert_eq!(first.status, 200, "{first:?}");
    // A client waits in the line of one...
    let mut leaving = TcpStream::connect(("127.0.0.1", nginx.port)).unwrap();
    leaving
        .write_all(
            format!(
                "GET /g1 HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Lane: gone\r\nConnection: close\r\n\r\n",
                nginx.port
            )
            .as_bytes(),
        )
        .unwrap();
    until_metric(&base, "tollgate_queue_waiting", "gone", "", 1);
    // ... which is full.
    let refused = send(nginx.port, "g2", "gone", None).join().unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.body.contains("queue full"), "{refused:?}");
    // It goes away: nginx drops its auth request, tollgate its place.
    drop(leaving);
    until_metric(
        &base,
        "tollgate_queue_dropped_total",
        "gone",
        ",reason=\"gone\"",
        1,
    );
    assert_eq!(queue_metric(&base, "tollgate_queue_waiting", "gone", ""), 0);
    // The next request gets the place instead of "queue full", and is served.
    let next = send(nginx.port, "g3", "gone", None);
    until_metric(&base, "tollgate_queue_waiting", "gone", "", 1);
    let next = next.join().unwrap();
    assert_eq!(next.status, 200, "{next:?}");
    assert_eq!(upstream_paths(&upstream), ["/g0", "/g3"]);
    drop(nginx);
}

/// `POST /v1/check` queues too: the second request of a window waits for the next one and is
/// answered OK then.
#[test]
fn v1_check_waits_in_the_queue_too() {
    let (server, _nginx, _upstream) = start("queue-check");
    let base = server.base.clone();
    window_start();
    let (status, body) = support::check(&base, "web", "lane", "check");
    assert_eq!(status, 200, "{body}");
    let waiting = {
        let base = base.clone();
        std::thread::spawn(move || support::check(&base, "web", "lane", "check"))
    };
    until_metric(&base, "tollgate_queue_waiting", "check", "", 1);
    let (status, body) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        queue_metric(&base, "tollgate_queue_served_total", "check", ""),
        1
    );
}

/// On the Redis store too (the shared server, a fresh prefix): a paid request that arrives after
/// a waiting free one is served first, each at the window its turn comes in.
#[test]
fn on_redis_paid_waiters_are_served_before_earlier_free_ones() {
    let dir = temp_dir("queue-redis");
    let rules = dir.join("web.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let prefix = unique_prefix("queue-redis");
    let server = serve_store(
        rules.to_str().unwrap(),
        shared_url(),
        &["--redis-prefix", &prefix],
        "queue-redis",
    );
    let base = server.base.clone();
    let body = |plan: &str| {
        serde_json::json!({"domain": "web", "descriptors": [{"entries": [
            {"key": "lane", "value": "order"}, {"key": "plan", "value": plan}]}]})
    };
    let done = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let send = |id: &'static str, plan: &'static str| {
        let (base, body, done) = (base.clone(), body(plan), done.clone());
        std::thread::spawn(move || {
            let r = http(&base, Method::POST, "/v1/check", Some(body));
            done.lock().unwrap().push(id);
            r
        })
    };
    window_start();
    let first = http(&base, Method::POST, "/v1/check", Some(body("free")));
    assert_eq!(first.status, 200, "{}", first.body);
    let f1 = send("f1", "free");
    until_metric(&base, "tollgate_queue_waiting", "order", "", 1);
    let p1 = send("p1", "paid");
    until_metric(&base, "tollgate_queue_waiting", "order", "", 2);
    let (p1, f1) = (p1.join().unwrap(), f1.join().unwrap());
    assert_eq!(
        (p1.status, f1.status),
        (200, 200),
        "{} / {}",
        p1.body,
        f1.body
    );
    assert_eq!(*done.lock().unwrap(), ["p1", "f1"], "paid first");
    assert_eq!(
        queue_metric(&base, "tollgate_queue_served_total", "order", ""),
        2
    );
    drop(server);
    delete_prefix(shared_url(), &prefix);
}

/// The example rules of docs/rules.md's "Queueing" section validate as written.
#[test]
fn the_documented_queue_example_validates() {
    let page = std::fs::read_to_string(support::repo().join("docs/rules.md")).unwrap();
    let at = page
        .find("<!-- queue example -->")
        .expect("the queue example's marker in docs/rules.md");
    let block = page[at..]
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(yaml, _)| yaml)
        .expect("a yaml block after the marker");
    assert!(block.contains("queue: {max_wait: 500ms"), "{block}");
    let dir = temp_dir("queue-doc");
    let file = dir.join("api.yaml");
    std::fs::write(&file, block).unwrap();
    let out = tollgate(&["validate", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
