//! Queueing from outside, through a real nginx (`auth_request` to `tollgate serve`'s
//! forward-auth, the shipped example config with a longer auth timeout than the rules'
//! `max_wait`): requests a rule with `queue` denies wait instead of getting 429, paid ones
//! ahead of free ones that came earlier, within `max_length`; a client that goes away leaves
//! its line, and its place is taken by the next request. The upstream sees the requests in the
//! order they were served. On the Redis store, `POST /v1/check` keeps the same order.
//!
//! Then the hostile cases, straight to `tollgate serve`: one counter's flood at the process cap
//! does not keep another counter's request from waiting; a query and a request that can never
//! pass are answered at once behind a line; a head waiter is answered at its deadline with its
//! own Redis server frozen; one HTTP/2 connection carries at most 16 requests (so waiters).
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
        // The plan comes from nginx's table keyed by the API key (a client's own X-Plan is
        // replaced): one key per plan.
        let table = "        default \"\";\n";
        assert!(c.contains(table), "the plan table moved");
        c.replace("proxy_read_timeout 5s;", "proxy_read_timeout 15s;")
            .replace(
                table,
                "        default \"\";\n        key-paid paid;\n        key-free free;\n",
            )
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
            headers.push((
                "X-Api-Key",
                if p == "paid" { "key-paid" } else { "key-free" },
            ));
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

/// The hostile cases' rules (no gateway: `POST /v1/check`, forward-auth over HTTP/2). GCRA
/// limits: after one admission the next request's wait is one emission interval, so it joins
/// its line as the head and waits for that long; later ones wait behind it.
const HOSTILE_RULES: &str = r#"domain: web
http:
  - actions:
      - request_headers: {header_name: x-lane, descriptor_key: lane}
descriptors:
  - key: lane
    value: flood
    rate_limit: {unit: second, unit_multiplier: 20, requests_per_unit: 1, algorithm: gcra}
    queue: {max_wait: 40s, max_length: 100000}
  - key: lane
    value: victim
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
    queue: {max_wait: 20s, max_length: 10}
  - key: lane
    value: line
    rate_limit: {unit: second, unit_multiplier: 5, requests_per_unit: 1, algorithm: gcra}
    queue: {max_wait: 10s, max_length: 10}
  - key: lane
    value: plain
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: lane
    value: h2
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 1, algorithm: gcra}
    queue: {max_wait: 3s, max_length: 1000}
"#;

/// `tollgate serve` with [`HOSTILE_RULES`] on `store` and `extra` flags.
fn start_hostile(name: &str, store: &str, extra: &[&str]) -> Server {
    let dir = temp_dir(name);
    std::fs::write(dir.join("web.yaml"), HOSTILE_RULES).unwrap();
    let mut args = vec![
        "--rules",
        "web.yaml",
        "--store",
        store,
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
    ];
    args.extend(extra);
    Server::start(&args, &dir, name)
}

/// The `/v1/check` body for `lane`, with `hits_addend` when given.
fn lane_body(lane: &str, hits: Option<u64>) -> serde_json::Value {
    let mut b = serde_json::json!({"domain": "web", "descriptors": [{"entries": [
        {"key": "lane", "value": lane}]}]});
    if let Some(h) = hits {
        b["hits_addend"] = h.into();
    }
    b
}

/// `POST /v1/check` for `lane`: the response and how long it took.
fn timed_check(
    base: &str,
    lane: &str,
    hits: Option<u64>,
) -> (support::client::HttpResponse, Duration) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = lane_body(lane, hits).to_string();
    let t = std::time::Instant::now();
    // A timeout above every wait here: a request that waits too long is measured, not cut off.
    let r = rt
        .block_on(support::client::send(
            base,
            Method::POST,
            "/v1/check",
            Some(body),
            Duration::from_secs(30),
        ))
        .expect("HTTP request");
    (r, t.elapsed())
}

/// A waiter left in its line: a raw `POST /v1/check` for `lane` whose answer is never read (the
/// connection stays open until the stream is dropped).
fn hold(base: &str, lane: &str) -> TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let body = lane_body(lane, None).to_string();
    write!(
        s,
        "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-6)
}

/// One counter's flood fills the process's cap (`--queue-max-waiting 20`, the flooding rule's
/// `max_length` far above it, which is warned about at load): a request on another counter
/// still gets a place (the flooding line's last waiter is turned away) and is served when its
/// own counter admits it, instead of an immediate 429.
#[test]
fn one_counters_flood_cannot_keep_another_counters_request_out_of_the_queue() {
    let server = start_hostile("queue-flood", "memory", &["--queue-max-waiting", "20"]);
    let base = server.base.clone();
    let (r, normal) = timed_check(&base, "plain", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, _) = timed_check(&base, "flood", None);
    assert_eq!(r.status, 200, "{}", r.body);
    // 20 waiters on the flooding counter: the whole cap.
    let flood: Vec<TcpStream> = (0..20).map(|_| hold(&base, "flood")).collect();
    until_metric(&base, "tollgate_queue_waiting", "flood", "", 20);
    // One more on the same counter is turned away at once: its line is the longest.
    let (r, _) = timed_check(&base, "flood", None);
    assert_eq!(r.status, 429, "{}", r.body);
    // The victim: admitted, then denied for about a second, which it waits.
    let (r, _) = timed_check(&base, "victim", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, waited) = timed_check(&base, "victim", None);
    println!(
        "victim under a flood: {} after {waited:?} = {:.1}x a normal request ({normal:?}): {}",
        r.status,
        ratio(waited, normal),
        r.body
    );
    assert_eq!(r.status, 200, "the victim waited its turn: {}", r.body);
    assert_eq!(
        queue_metric(&base, "tollgate_queue_served_total", "victim", ""),
        1
    );
    // It took the place of the flood's last waiter.
    assert_eq!(
        queue_metric(
            &base,
            "tollgate_queue_dropped_total",
            "flood",
            ",reason=\"full\""
        ),
        2
    );
    drop(flood);
    server.wait_for_log("queue max_length is above --queue-max-waiting");
}

/// On a counter with a waiter in line, a query (`hits_addend: 0`) and a request that can never
/// pass (a cost above the limit) are answered at once: before the waiter ahead is served.
#[test]
fn a_query_and_a_request_that_can_never_pass_do_not_wait_behind_the_line() {
    let server = start_hostile("queue-nowait", "memory", &[]);
    let base = server.base.clone();
    let (r, normal) = timed_check(&base, "plain", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, _) = timed_check(&base, "line", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let waiter = hold(&base, "line");
    until_metric(&base, "tollgate_queue_waiting", "line", "", 1);
    // Both at once, each on a thread of its own: each finds the waiter in line.
    let send = |hits: u64| {
        let base = base.clone();
        std::thread::spawn(move || timed_check(&base, "line", Some(hits)))
    };
    let (query, never) = (send(0), send(5));
    let ((query, q_took), (never, n_took)) = (query.join().unwrap(), never.join().unwrap());
    println!(
        "behind a waiter: query {} in {q_took:?} = {:.1}x, cost above the limit {} in \
         {n_took:?} = {:.1}x a normal request ({normal:?})",
        query.status,
        ratio(q_took, normal),
        never.status,
        ratio(n_took, normal)
    );
    // Answered while the waiter ahead still waits (it is served 5 s after the admission).
    assert_eq!(
        queue_metric(&base, "tollgate_queue_served_total", "line", ""),
        0
    );
    assert_eq!(queue_metric(&base, "tollgate_queue_waiting", "line", ""), 1);
    assert_eq!(query.status, 200, "{}", query.body);
    assert_eq!(never.status, 429, "{}", never.body);
    assert!(
        never.body.contains("retrying will not help"),
        "{}",
        never.body
    );
    drop(waiter);
}

/// With Redis frozen (SIGSTOP) while a request waits at the head of its line, the store call it
/// makes when its turn comes hangs; it is answered at its deadline (`max_wait`), not when the
/// Redis call times out.
#[test]
fn a_head_waiter_is_answered_at_its_deadline_while_redis_is_frozen() {
    let redis = tollgate_testsupport::RedisServer::start(&[]);
    let dir = temp_dir("queue-frozen");
    // The victim's rule waits 2 s after an admission, and at most 2.5 s.
    let rules = HOSTILE_RULES.replace(
        "{unit: second, requests_per_unit: 1, algorithm: gcra}\n    queue: {max_wait: 20s",
        "{unit: second, unit_multiplier: 2, requests_per_unit: 1, algorithm: gcra}\n    queue: {max_wait: 2500ms",
    );
    assert!(rules.contains("max_wait: 2500ms"));
    std::fs::write(dir.join("web.yaml"), rules).unwrap();
    let server = Server::start(
        &[
            "--rules",
            "web.yaml",
            "--store",
            &redis.url(),
            "--redis-timeout-ms",
            "6000",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ],
        &dir,
        "queue-frozen",
    );
    let base = server.base.clone();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &redis.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    };
    let (r, normal) = timed_check(&base, "victim", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let head = {
        let base = base.clone();
        std::thread::spawn(move || timed_check(&base, "victim", None))
    };
    until_metric(&base, "tollgate_queue_waiting", "victim", "", 1);
    signal("-STOP");
    let (r, took) = head.join().unwrap();
    signal("-CONT");
    println!(
        "head waiter with Redis frozen: {} after {took:?} = {:.1}x a normal request ({normal:?}), \
         max_wait 2.5 s, Redis timeout 6 s: {}",
        r.status,
        ratio(took, normal),
        r.body
    );
    // Its deadline, not the Redis call's timeout: a refusal for waiting too long.
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(
        queue_metric(
            &base,
            "tollgate_queue_dropped_total",
            "victim",
            ",reason=\"timeout\""
        ),
        1
    );
    assert!(
        took < Duration::from_secs(6),
        "waited for the Redis timeout: {took:?}"
    );
}

/// One raw HTTP/2 frame: (type, flags, stream, payload).
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Read one frame: (type, flags, stream, payload); `None` at the end of the connection.
fn h2_read(s: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    use std::io::Read;
    let mut head = [0u8; 9];
    s.read_exact(&mut head).ok()?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    Some((head[3], head[4], stream, payload))
}

/// Prior-knowledge HTTP/2 (h2c) on the HTTP port, one TCP connection: 40 forward-auth requests
/// on a queued counter at once. The connection carries at most 16 requests at once (the server
/// refuses the other streams with REFUSED_STREAM, which a client may retry), so at most 16 of
/// them ever wait: `--max-connections` bounds the waiters over HTTP/2 too.
#[test]
fn one_http2_connection_holds_at_most_16_requests_and_so_16_waiters() {
    const STREAMS: u32 = 40;
    let server = start_hostile("queue-h2", "memory", &[]);
    let base = server.base.clone();
    let (r, normal) = timed_check(&base, "plain", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let mut s = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    // Literal header fields without indexing, new names, no Huffman coding.
    let mut block = Vec::new();
    for (k, v) in [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/v1/forward-auth/web"),
        (":authority", "127.0.0.1"),
        ("x-lane", "h2"),
    ] {
        block.push(0);
        block.push(k.len() as u8);
        block.extend_from_slice(k.as_bytes());
        block.push(v.len() as u8);
        block.extend_from_slice(v.as_bytes());
    }
    for i in 0..STREAMS {
        // END_STREAM | END_HEADERS
        out.extend(h2_frame(1, 0x5, 1 + 2 * i, &block));
    }
    let sent = std::time::Instant::now();
    s.write_all(&out).unwrap();
    // Every stream ends: refused, or answered (the first at once, the waiters at their deadline).
    let (mut refused, mut answered) = (0u32, 0u32);
    let mut ended = std::collections::HashSet::new();
    while ended.len() < STREAMS as usize {
        let Some((kind, flags, stream, payload)) = h2_read(&mut s) else {
            panic!("connection closed after {refused} refused, {answered} answered");
        };
        match kind {
            // SETTINGS (not an ACK): acknowledge.
            4 if flags & 1 == 0 => s.write_all(&h2_frame(4, 1, 0, &[])).unwrap(),
            // PING: answer.
            6 if flags & 1 == 0 => s.write_all(&h2_frame(6, 1, 0, &payload)).unwrap(),
            7 => panic!("GOAWAY after {refused} refused, {answered} answered: {payload:?}"),
            3 if ended.insert(stream) => {
                assert_eq!(payload, 7u32.to_be_bytes(), "REFUSED_STREAM");
                refused += 1;
            }
            0 | 1 if flags & 1 == 1 && ended.insert(stream) => answered += 1,
            _ => {}
        }
    }
    let took = sent.elapsed();
    let waited = queue_metric(&base, "tollgate_queue_served_total", "h2", "")
        + queue_metric(
            &base,
            "tollgate_queue_dropped_total",
            "h2",
            ",reason=\"timeout\"",
        );
    println!(
        "{STREAMS} streams on one HTTP/2 connection: {refused} refused, {answered} answered \
         ({waited} of them waited) in {took:?} = {:.0}x a normal request ({normal:?})",
        ratio(took, normal)
    );
    assert!(
        answered <= 16,
        "{answered} requests in flight on one connection"
    );
    assert!(waited <= 15, "{waited} waiters on one connection");
    assert_eq!(refused + answered, STREAMS);
}
