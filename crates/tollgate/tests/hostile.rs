//! Hostile and careless clients against the HTTP listener of a real `tollgate serve`, on raw TCP
//! sockets: idle connections beyond the connection cap, slowloris heads, slow and short bodies,
//! and a shutdown that clients try to hold open.
//!
//! Timeouts are small (hundreds of milliseconds) so the tests are quick; every assertion about
//! time is a generous "within N seconds" that proves a connection is dropped or the process
//! ends, never a measurement.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod support;

use support::*;

/// How long anything the server should drop may take to be dropped (timeouts are < 1 s).
const GENEROUS: Duration = Duration::from_secs(30);

/// `tollgate serve` on ephemeral ports with `extra` flags.
fn start(extra: &[&str], name: &str) -> Server {
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Server::start(&args, &repo(), name)
}

fn http_addr(server: &Server) -> String {
    server.addr("HTTP http://")
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s
}

/// Whether the peer has closed `s` (EOF or reset) within `limit`. Anything received before is
/// returned too.
fn closed_within(s: &mut TcpStream, limit: Duration) -> (bool, String) {
    let until = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (false, String::from_utf8_lossy(&got).into_owned());
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (true, String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (true, String::from_utf8_lossy(&got).into_owned()),
        }
    }
}

/// A complete `GET path` with `Connection: close`: the whole response.
fn get(addr: &str, path: &str) -> String {
    let mut s = connect(addr);
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let (closed, response) = closed_within(&mut s, GENEROUS);
    assert!(closed, "response not finished: {response}");
    response
}

/// The value of a metric line starting with `prefix` in `/metrics`.
fn metric(addr: &str, prefix: &str) -> u64 {
    let text = get(addr, "/metrics");
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

#[test]
fn idle_connections_beyond_the_cap_are_dropped_and_the_well_behaved_are_served() {
    let server = start(
        &[
            "--max-connections",
            "50",
            "--header-read-timeout",
            "500ms",
            "--idle-timeout",
            "500ms",
        ],
        "hostile-cap",
    );
    let addr = http_addr(&server);
    // One kept-alive connection that made a request and then idles.
    let mut kept = connect(&addr);
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    // An HTTP/2 connection (preface and nothing else).
    let mut h2 = connect(&addr);
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    // 80 more that never send a byte: 30 beyond the cap wait in the kernel's backlog.
    let mut idle: Vec<TcpStream> = (0..80).map(|_| connect(&addr)).collect();

    // A well-behaved client is answered (once timeouts have freed slots).
    let response = get(&addr, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    // Every idle connection is closed by the server, the kept-alive one included.
    let (closed, _) = closed_within(&mut kept, GENEROUS);
    assert!(closed, "idle keep-alive connection still open");
    let (closed, _) = closed_within(&mut h2, GENEROUS);
    assert!(closed, "idle HTTP/2 connection still open");
    for (i, s) in idle.iter_mut().enumerate() {
        let (closed, got) = closed_within(s, GENEROUS);
        assert!(closed, "idle connection {i} still open");
        assert_eq!(got, "", "nothing is sent to a client that sent nothing");
    }
    let response = get(&addr, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    let dropped = metric(
        &addr,
        "tollgate_connections_dropped_total{listener=\"http\",reason=\"header_timeout\"}",
    );
    assert!(dropped >= 80, "header_timeout drops: {dropped}");
    let idled = metric(
        &addr,
        "tollgate_connections_dropped_total{listener=\"http\",reason=\"idle_timeout\"}",
    );
    assert!(idled >= 1, "idle_timeout drops: {idled}");
    assert!(
        metric(
            &addr,
            "tollgate_connections_cap_reached_total{listener=\"http\"}"
        ) >= 1
    );
    assert!(
        server
            .stderr()
            .contains("HTTP connection cap reached: new connections wait"),
        "{}",
        server.stderr()
    );
}

#[test]
fn slowloris_heads_are_dropped() {
    // Settings from the environment this time.
    let server = Server::start_env(
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
        &[
            ("TOLLGATE_HEADER_READ_TIMEOUT", "500ms"),
            ("TOLLGATE_IDLE_TIMEOUT", "30s"),
        ],
        &repo(),
        "hostile-slowloris",
    );
    let addr = http_addr(&server);
    let clients: Vec<_> = (0..20)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut s = connect(&addr);
                s.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
                // One header line every 300 ms, never the blank line that ends the head.
                let until = Instant::now() + GENEROUS;
                loop {
                    let (closed, got) = closed_within(&mut s, Duration::from_millis(300));
                    if closed {
                        assert_eq!(got, "", "client {i} got an answer to half a head");
                        return;
                    }
                    assert!(
                        Instant::now() < until,
                        "slowloris client {i} still connected"
                    );
                    if s.write_all(format!("X-Slow-{i}: x\r\n").as_bytes())
                        .is_err()
                    {
                        return;
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    // The same on a kept-alive connection after one good request.
    let mut s = connect(&addr);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    let until = Instant::now() + GENEROUS;
    loop {
        if closed_within(&mut s, Duration::from_millis(300)).0 {
            break;
        }
        assert!(Instant::now() < until, "slow second head still connected");
        if s.write_all(b"X-Slow: x\r\n").is_err() {
            break;
        }
    }
    let response = get(&addr, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

/// `POST /v1/check` head announcing `len` body bytes, then `sent` of them.
fn partial_post(addr: &str, len: usize, sent: &[u8]) -> TcpStream {
    let mut s = connect(addr);
    write!(
        s,
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
    .unwrap();
    s.write_all(sent).unwrap();
    s
}

fn assert_408_and_closed(s: &mut TcpStream, what: &str) {
    let (closed, response) = closed_within(s, GENEROUS);
    assert!(closed, "{what}: connection still open; got {response:?}");
    assert!(
        response.starts_with("HTTP/1.1 408"),
        "{what}: expected 408, got {response:?}"
    );
    assert!(
        response.contains(r#""code":"body_timeout""#),
        "{what}: {response}"
    );
}

#[test]
fn slow_and_short_bodies_get_408_and_are_closed() {
    let server = start(
        &[
            "--body-read-timeout",
            "500ms",
            "--header-read-timeout",
            "5s",
        ],
        "hostile-body",
    );
    let addr = http_addr(&server);
    let body = br#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"slow"}]}]}"#;

    // A Content-Length that promises more than is ever sent.
    let mut short = partial_post(&addr, body.len() + 100, body);
    assert_408_and_closed(&mut short, "short body");

    // A body trickled one byte every 200 ms (it would take ~16 s).
    let mut slow = partial_post(&addr, body.len(), &body[..1]);
    let trickle = {
        let mut w = slow.try_clone().unwrap();
        let rest = body[1..].to_vec();
        std::thread::spawn(move || {
            for b in rest {
                std::thread::sleep(Duration::from_millis(200));
                if w.write_all(&[b]).is_err() {
                    return;
                }
            }
        })
    };
    assert_408_and_closed(&mut slow, "slow body");
    drop(slow);
    trickle.join().unwrap();

    // A body that arrives in time is answered as always.
    let mut ok = connect(&addr);
    write!(
        ok,
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    ok.write_all(body).unwrap();
    let (_, response) = closed_within(&mut ok, GENEROUS);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let timeouts = metric(
        &addr,
        "tollgate_connections_dropped_total{listener=\"http\",reason=\"body_timeout\"}",
    );
    assert_eq!(timeouts, 2);
}

#[test]
fn sigterm_ends_despite_half_sent_requests_and_a_raw_h2_preface() {
    // Long client timeouts: only the shutdown deadline can end these connections in time.
    let mut server = start(
        &[
            "--shutdown-timeout",
            "5s",
            "--header-read-timeout",
            "5m",
            "--body-read-timeout",
            "5m",
            "--idle-timeout",
            "5m",
        ],
        "hostile-shutdown",
    );
    let addr = http_addr(&server);
    let mut half_head = connect(&addr);
    half_head
        .write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        .unwrap();
    let mut h2 = connect(&addr);
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    // The same on the gRPC port: the whole shutdown is bounded, not only the HTTP side.
    let mut grpc_h2 = connect(&server.addr("gRPC "));
    grpc_h2
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    let body =
        br#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"inflight"}]}]}"#;
    // In flight at SIGTERM: head and half the body are in.
    let mut in_flight = partial_post(&addr, body.len(), &body[..10]);
    // An idle kept-alive connection: closed at once on shutdown.
    let mut idle = connect(&addr);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    // The server has read what each connection sent before the signal.
    for conn in [&half_head, &h2, &grpc_h2, &in_flight, &idle] {
        wait_until_read(conn);
    }

    let signalled = Instant::now();
    server.terminate();
    let until = Instant::now() + GENEROUS;
    while !server.stderr().contains("shutting down") {
        assert!(
            Instant::now() < until,
            "no shutdown line: {}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    in_flight.write_all(&body[10..]).unwrap();
    let (closed, response) = closed_within(&mut in_flight, GENEROUS);
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "in-flight request not completed: {response:?}"
    );
    assert!(closed, "in-flight connection not closed after its response");
    let (closed, _) = closed_within(&mut idle, GENEROUS);
    assert!(closed, "idle connection not closed on shutdown");

    // 5 s shutdown timeout + a generous margin for a loaded machine.
    let status = server.wait(Duration::from_secs(5) + GENEROUS);
    assert!(status.success(), "exit status {status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(5) + GENEROUS);
    assert!(
        server
            .stderr()
            .contains("shutdown timeout: dropping the HTTP connections still open"),
        "{}",
        server.stderr()
    );
    // Both holders were dropped, not answered.
    assert!(closed_within(&mut half_head, GENEROUS).0);
    assert!(closed_within(&mut h2, GENEROUS).0);
    assert!(closed_within(&mut grpc_h2, GENEROUS).0);
}

#[test]
fn zero_timeouts_and_caps_are_rejected() {
    for (flag, value) in [
        ("--header-read-timeout", "0s"),
        ("--body-read-timeout", "0ms"),
        ("--idle-timeout", "0s"),
        ("--shutdown-timeout", "0s"),
        ("--max-connections", "0"),
        ("--idle-timeout", "10"),
    ] {
        // Unreadable rules too: a flag wrongly accepted fails on them instead of serving.
        let out = tollgate(&["serve", flag, value, "--rules", "/nonexistent/rules"]);
        assert!(!out.status.success(), "{flag} {value} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

#[test]
fn oversized_request_heads_get_431() {
    let server = start(&[], "hostile-head");
    let addr = http_addr(&server);
    let head = |n: usize| {
        let mut s = connect(&addr);
        let big = "a".repeat(n);
        // The server may close before taking it all: a failed write is an answer too.
        let _ = write!(
            s,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n"
        );
        closed_within(&mut s, GENEROUS)
    };
    let (_, r) = head(16 * 1024);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // What one connection can make the process buffer is bounded (64 KiB, not hyper's 400 KB):
    // 431, or (when the close with unread input resets the connection first) nothing.
    let (closed, r) = head(100 * 1024);
    assert!(closed);
    assert!(r.is_empty() || r.starts_with("HTTP/1.1 431"), "{r}");
}

#[test]
fn open_files_limit_is_raised_and_a_cap_beyond_it_warned() {
    let server = start(&["--max-connections", "1000000000"], "hostile-nofile");
    // Linux caps descriptors near 2^30: two listeners of 10^9 never fit.
    let until = Instant::now() + GENEROUS;
    while !server.stderr().contains("exceeds the open-files limit") {
        assert!(Instant::now() < until, "no WARN: {}", server.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Ok(limits) = std::fs::read_to_string(format!("/proc/{}/limits", server.child.id())) {
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("open files line");
        let v: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(v[3], v[4], "soft limit raised to the hard limit: {line}");
    }
    let response = get(&http_addr(&server), "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}
