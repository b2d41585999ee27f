//! Request heads and refused bodies from clients that do not play by the rules, against a real
//! `tollgate serve` on raw TCP sockets: a bare LF line ending that would split one header into
//! two (on the data-plane API and on forward-auth), and a body refused with 413 from a client
//! that writes all of it before reading the answer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod support;

use support::*;

/// Every wait here is for an event; this only bounds a test that would otherwise hang.
const GENEROUS: Duration = Duration::from_secs(30);

/// Limits per client address (forward-auth) and per user (`/v1/check`).
const RULES: &str = r#"domain: web
http:
  - actions: [{remote_address: {}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
"#;

/// `tollgate serve` with [`RULES`], trusting the proxy on 127.0.0.1 as a gateway's.
fn start(name: &str) -> (Server, String) {
    let dir = temp_dir(name);
    let rules = dir.join("web.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let server = serve_rules(
        rules.to_str().unwrap(),
        &["--trusted-proxies", "127.0.0.1/32"],
        name,
    );
    let addr = server.addr("HTTP http://");
    (server, addr)
}

/// Write `request` whole (its head, then the rest in 64 KiB writes, as a client's buffered
/// writer sends it), then read until the server closes: what came back, and whether the write
/// and the read went through (no reset).
fn exchange(addr: &str, request: &[u8]) -> (String, Result<(), std::io::Error>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.set_write_timeout(Some(GENEROUS)).unwrap();
    let head = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(request.len(), |i| i + 4);
    let written = std::iter::once(&request[..head])
        .chain(request[head..].chunks(64 * 1024))
        .try_for_each(|chunk| s.write_all(chunk));
    let mut got = Vec::new();
    let read = s.read_to_end(&mut got).map(|_| ());
    (
        String::from_utf8_lossy(&got).into_owned(),
        written.and(read),
    )
}

#[test]
fn bare_lf_in_a_request_head_is_refused_with_400() {
    let (server, addr) = start("heads-bare-lf");
    // Read by hyper alone, this is two X-Forwarded-For headers, and the last one (6.6.6.6)
    // is the client a trusted gateway would be taken to vouch for.
    let forged = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.1.1.1\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n"
        )
    };
    for path in ["/v1/forward-auth/web", "/healthz"] {
        let (response, io) = exchange(&addr, forged(path).as_bytes());
        io.unwrap_or_else(|e| panic!("{path}: {e} after {response:?}"));
        assert!(response.starts_with("HTTP/1.1 400"), "{path}: {response}");
        assert!(
            response.contains(r#""code":"malformed_request_head""#),
            "{path}: {response}"
        );
    }
    // A bare LF as the last line end, and on the second request of a kept-alive connection.
    let (response, _) = exchange(&addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\n");
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    // On a kept-alive connection, after a good request; and pipelined behind one.
    let mut kept = TcpStream::connect(&addr).unwrap();
    kept.set_read_timeout(Some(GENEROUS)).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&first).ends_with(r#"{"status":"ok"}"#) {
        let n = kept.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&first));
        first.extend_from_slice(&buf[..n]);
    }
    kept.write_all(forged("/v1/forward-auth/web").as_bytes())
        .unwrap();
    let mut rest = String::new();
    kept.read_to_string(&mut rest).unwrap();
    assert!(rest.starts_with("HTTP/1.1 400"), "{rest}");
    let pipelined = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n{}",
        forged("/v1/forward-auth/web")
    );
    let (response, _) = exchange(&addr, pipelined.as_bytes());
    assert!(response.contains("HTTP/1.1 400"), "{response}");
    assert!(!response.contains("ratelimit"), "{response}");

    // Bodies may hold any bytes: pretty-printed JSON with bare LFs is answered.
    let body = "{\n  \"domain\": \"web\",\n  \"descriptors\": [{\"entries\": [{\"key\": \"user\", \"value\": \"a\"}]}]\n}\n";
    let post = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}\
         POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        body.len()
    );
    let (response, io) = exchange(&addr, post.as_bytes());
    io.unwrap();
    assert_eq!(
        response.matches("HTTP/1.1 200").count(),
        2,
        "both answered: {response}"
    );

    // The forged address was never counted: the gateway's own (1 per hour) is still free,
    // then spent.
    for want in ["200", "429"] {
        let (response, _) = exchange(
            &addr,
            b"GET /v1/forward-auth/web HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n",
        );
        assert!(
            response.starts_with(&format!("HTTP/1.1 {want}")),
            "{want}: {response}"
        );
    }
    let refused = registry::metric(
        &format!("http://{addr}"),
        "tollgate_connections_dropped_total{listener=\"http\",reason=\"malformed_head\"}",
    );
    assert_eq!(refused, 5);
    drop(server);
}

/// A client that writes a request and its whole body before it reads anything (as Python's
/// `http.client` and `urllib` do), the body far over `--max-body-bytes`: it must read the 413,
/// every time, rather than a reset that destroys it.
#[test]
fn a_refused_body_written_whole_before_reading_reads_413_every_time() {
    let (server, addr) = start("heads-linger");
    let body = vec![b'x'; 8 * 1024 * 1024];
    let mut request = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let tries = 40;
    let mut failures = Vec::new();
    let started = Instant::now();
    for i in 0..tries {
        let (response, io) = exchange(&addr, &request);
        let ok = io.is_ok() && response.starts_with("HTTP/1.1 413");
        if !ok {
            let e = io.err().map(|e| format!("{:?}: {e}", e.kind()));
            failures.push(format!(
                "try {i}: {e:?}, read {:?}",
                response.lines().next()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {tries} tries did not read 413: {failures:#?}",
        failures.len()
    );
    eprintln!(
        "{tries} tries of a 8 MiB body written whole: all read 413 ({:?} in all)",
        started.elapsed()
    );
    // The service still answers.
    let (response, _) = exchange(
        &addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    drop(server);
}

/// The client of the report itself: Python's `http.client`, which sends a request's head, then
/// its whole body, then reads. 2 MiB bodies, 40 tries: every one reads the 413.
#[test]
fn python_http_client_reads_413_for_a_2_mib_body_every_time() {
    let (server, addr) = start("heads-linger-python");
    let (host, port) = addr.rsplit_once(':').unwrap();
    let script = r#"
import http.client, sys
host, port, tries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bad = []
for i in range(tries):
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("POST", "/v1/check", body=b"x" * (2 * 1024 * 1024),
                  headers={"content-type": "application/json"})
        status = c.getresponse().status
        if status != 413:
            bad.append(f"try {i}: {status}")
        c.close()
    except Exception as e:
        bad.append(f"try {i}: {e!r}")
print(len(bad))
print("\n".join(bad))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, host, port, "40"])
        .output()
        .expect("python3 (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().next(),
        Some("0"),
        "tries that did not read 413:\n{stdout}"
    );
    drop(server);
}
