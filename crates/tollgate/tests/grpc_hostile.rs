//! The gRPC listener of a real `tollgate serve` process against hostile HTTP/2 clients: a stream
//! flood on one connection, peers that never answer PINGs, long-lived connections, clients that
//! hold shutdown up, and more connections than `--max-connections`.
//!
//! The hostile clients write HTTP/2 frames by hand on a plain socket ([`RawH2`]): a real client
//! library obeys the server's SETTINGS (it would never open more streams than allowed), an
//! attacker does not. Well-behaved clients are tonic's, as Envoy would be.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::client::Method;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;

mod support;

use support::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// One HTTP/2 frame as read.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Frame {
    /// The value of setting `id` in a SETTINGS frame.
    fn setting(&self, id: u16) -> Option<u32> {
        self.payload
            .chunks(6)
            .find(|s| u16::from_be_bytes([s[0], s[1]]) == id)
            .map(|s| u32::from_be_bytes(s[2..6].try_into().unwrap()))
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap()) & 0x7fff_ffff
    }
}

/// A hand-driven HTTP/2 client connection.
struct RawH2 {
    tcp: TcpStream,
}

impl RawH2 {
    /// Connect and send the client preface and an empty SETTINGS frame.
    fn connect(addr: &str) -> RawH2 {
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = RawH2 { tcp };
        c.tcp.write_all(PREFACE).unwrap();
        c.frame(SETTINGS, 0, 0, &[]).unwrap();
        c
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut buf = Vec::with_capacity(9 + payload.len());
        buf.extend_from_slice(&len[1..]);
        buf.push(kind);
        buf.push(flags);
        buf.extend_from_slice(&stream.to_be_bytes());
        buf.extend_from_slice(payload);
        self.tcp.write_all(&buf)
    }

    /// Open stream `id` with a `ShouldRateLimit` call's headers and no body (END_STREAM unset:
    /// the server waits for the request message).
    fn open_stream(&mut self, id: u32) -> std::io::Result<()> {
        self.frame(HEADERS, END_HEADERS, id, &call_headers())
    }

    fn ping(&mut self, data: [u8; 8]) -> std::io::Result<()> {
        self.frame(PING, 0, 0, &data)
    }

    /// The next frame; `None` at end of stream or on a reset/closed connection.
    fn read_frame(&mut self) -> Option<Frame> {
        read_frame(&mut self.tcp)
    }

    /// Read until a frame of `kind` (answering nothing); `None` if the connection ends first.
    fn wait_for(&mut self, kind: u8) -> Option<Frame> {
        loop {
            let f = self.read_frame()?;
            if f.kind == kind {
                return Some(f);
            }
        }
    }
}

fn read_frame(r: &mut impl Read) -> Option<Frame> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
            panic!("no frame within the read timeout")
        }
        Err(_) => return None,
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).ok()?;
    Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
        payload,
    })
}

/// HPACK (RFC 7541) by hand: indexed and literal-without-indexing fields, no Huffman.
fn call_headers() -> Vec<u8> {
    fn literal(out: &mut Vec<u8>, name_index: &[u8], value: &str) {
        out.extend_from_slice(name_index);
        out.push(u8::try_from(value.len()).unwrap());
        out.extend_from_slice(value.as_bytes());
    }
    let mut h = vec![0x83, 0x86]; // :method POST, :scheme http
    literal(
        &mut h,
        &[0x04],
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    literal(&mut h, &[0x01], "localhost"); // :authority
    literal(&mut h, &[0x0f, 0x10], "application/grpc"); // content-type (index 31)
    h.extend_from_slice(&[0x00, 0x02]);
    h.extend_from_slice(b"te");
    h.push(0x08);
    h.extend_from_slice(b"trailers");
    h
}

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n";

/// `tollgate serve` on ephemeral ports with `extra` flags; returns it and its gRPC address.
fn start(extra: &[&str], name: &str) -> (Server, String) {
    start_env(extra, &[], name)
}

/// [`start`] with `TOLLGATE_*` variables.
fn start_env(extra: &[&str], env: &[(&str, &str)], name: &str) -> (Server, String) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("rules.yaml"), RULES).unwrap();
    let rules = dir.join("rules.yaml").display().to_string();
    let server = serve_rules_env(&rules, extra, env, name);
    let grpc = server.addr("gRPC ");
    (server, grpc)
}

/// One `ShouldRateLimit` call on a new connection, as Envoy makes it: the overall code.
async fn call(addr: String) -> Result<i32, String> {
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| e.to_string())?;
    let req = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitRequest::default()
    };
    let resp = client
        .should_rate_limit(req)
        .await
        .map_err(|e| e.to_string())?;
    Ok(resp.into_inner().overall_code)
}

/// [`call`], blocking, bounded by 30 s.
fn call_blocking(addr: &str) -> Result<i32, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), call(addr.to_string()))
            .await
            .unwrap_or_else(|_| Err("no answer within 30 s".into()))
    })
}

/// Resident set size of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 40,000 streams opened on one connection, none sending its request: the server advertises
/// and enforces the 100-stream cap (every stream beyond it is refused), its memory stays small,
/// and a normal call on another connection is answered.
#[test]
fn stream_flood_on_one_connection_is_capped_and_memory_stays_small() {
    const STREAMS: u32 = 40_000;
    const CAP: u32 = 100;
    // A request timeout longer than the test: the accepted streams stay open throughout.
    let (server, addr) = start(&["--grpc-request-timeout", "5m"], "grpc-flood");
    let pid = server.child.id();
    let rss_before = rss_kib(pid);

    let mut conn = RawH2::connect(&addr);
    // Frames are read on another thread: the refusals must not fill the socket buffers while
    // the flood is being written.
    let mut reader = conn.tcp.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut refused, mut advertised, mut goaway) = (HashSet::new(), None, None);
        while let Some(f) = read_frame(&mut reader) {
            match f.kind {
                SETTINGS if f.flags & ACK == 0 => {
                    advertised = f.setting(SETTINGS_MAX_CONCURRENT_STREAMS);
                }
                RST_STREAM if f.u32_at(0) == REFUSED_STREAM => {
                    refused.insert(f.stream);
                }
                GOAWAY => goaway = Some((f.u32_at(0), f.u32_at(4))),
                // The barrier: every HEADERS frame was read (and refused or not) before it.
                PING if f.flags & ACK != 0 => break,
                _ => {}
            }
        }
        let _ = tx.send((refused, advertised, goaway));
    });
    for i in 0..STREAMS {
        if conn.open_stream(2 * i + 1).is_err() {
            break; // the server closed the connection: counted below
        }
    }
    let _ = conn.ping(*b"barrier!");
    let (refused, advertised, goaway) = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server read the flood");
    // Accepted: neither refused nor beyond the last stream a GOAWAY says was processed.
    let last = goaway.map_or(u32::MAX, |(last, _)| last);
    let accepted = (0..STREAMS)
        .map(|i| 2 * i + 1)
        .filter(|id| *id <= last && !refused.contains(id))
        .count();
    let refused = refused.len();
    let rss_after = rss_kib(pid);
    eprintln!(
        "flood: {STREAMS} streams sent, {accepted} accepted, {refused} refused, GOAWAY {goaway:?}; RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert_eq!(advertised, Some(CAP), "SETTINGS_MAX_CONCURRENT_STREAMS");
    assert_eq!(accepted, CAP as usize, "streams accepted");
    assert!(
        rss_after < 64 * 1024,
        "RSS {rss_after} KiB after the flood (was {rss_before} KiB)"
    );
    // Another client is served (the flooding connection itself may have been sent GOAWAY
    // ENHANCE_YOUR_CALM after too many refusals).
    assert_eq!(
        call_blocking(&addr),
        Ok(1),
        "OK (code 1) on another connection"
    );
    drop(conn);
}

/// A peer that never answers the server's keepalive PINGs is disconnected.
#[test]
fn peer_that_never_answers_pings_is_closed() {
    let (_server, addr) = start(
        &[
            "--grpc-keepalive-interval",
            "500ms",
            "--grpc-keepalive-timeout",
            "500ms",
        ],
        "grpc-keepalive",
    );
    let mut conn = RawH2::connect(&addr);
    let ping = conn.wait_for(PING).expect("a keepalive PING");
    assert_eq!(ping.flags & ACK, 0);
    // Unanswered: the connection ends (the read timeout of 30 s would panic first).
    let until = Instant::now() + Duration::from_secs(30);
    while conn.read_frame().is_some() {
        assert!(Instant::now() < until, "still open 30 s after the PING");
    }
}

/// A connection older than `--grpc-max-connection-age` gets GOAWAY (clients reconnect, so a
/// load balancer can rebalance), and is closed after the grace even if the peer stays.
#[test]
fn long_lived_connection_gets_goaway_after_max_age() {
    let (_server, addr) = start(
        &[
            "--grpc-max-connection-age",
            "1s",
            "--grpc-max-connection-age-grace",
            "1s",
        ],
        "grpc-max-age",
    );
    let mut conn = RawH2::connect(&addr);
    // A call that never finishes keeps the connection past its age: closed after the grace.
    conn.open_stream(1).unwrap();
    let goaway = conn.wait_for(GOAWAY).expect("GOAWAY after the max age");
    assert_eq!(goaway.stream, 0);
    let until = Instant::now() + Duration::from_secs(30);
    while conn.read_frame().is_some() {
        assert!(Instant::now() < until, "still open 30 s after GOAWAY");
    }
    // New connections are served as usual.
    assert_eq!(call_blocking(&addr), Ok(1));
}

/// SIGTERM while one client only sent the HTTP/2 preface and another holds a call open that
/// never finishes: the process still exits 0, soon after `--shutdown-timeout`.
#[test]
fn sigterm_with_a_preface_only_client_and_an_open_stream_exits_zero() {
    let (mut server, addr) = start(&["--shutdown-timeout", "1s"], "grpc-shutdown");
    let mut idle = RawH2::connect(&addr);
    idle.wait_for(SETTINGS).expect("server SETTINGS");
    let mut open = RawH2::connect(&addr);
    open.open_stream(1).unwrap();
    open.ping(*b"accepted").unwrap();
    open.wait_for(PING).expect("PING ACK: the stream is open");

    server.terminate();
    let status = server.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", server.stderr());
    assert!(
        server
            .stderr()
            .contains("shutdown timeout: dropping the gRPC connections still open"),
        "{}",
        server.stderr()
    );
    // Both were told to go away, then dropped.
    assert!(open.wait_for(GOAWAY).is_some());
    drop(idle);
}

/// With `--max-connections 20` held by idle HTTP/2 clients, a 21st client waits (not accepted),
/// and is served once one of the others leaves.
#[test]
fn over_max_connections_a_client_waits_then_is_served() {
    const MAX: usize = 20;
    let (_server, addr) = start(&["--max-connections", "20"], "grpc-max-conns");
    let mut held: Vec<RawH2> = (0..MAX).map(|_| RawH2::connect(&addr)).collect();
    for c in &mut held {
        c.wait_for(SETTINGS).expect("served");
    }
    let (tx, rx) = mpsc::channel();
    let a = addr.clone();
    std::thread::spawn(move || {
        let _ = tx.send(call_blocking(&a));
    });
    // At the cap the listener is not accepted from: no answer while all 20 are held.
    assert!(
        rx.recv_timeout(Duration::from_secs(2)).is_err(),
        "a 21st connection was served while {MAX} were open"
    );
    held.truncate(MAX - 1);
    let answer = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("served once a connection closed");
    assert_eq!(answer, Ok(1));
}

/// The gRPC listener's cap is counted in the same connection metrics as the HTTP listener's,
/// under `listener="grpc"` (one HELP and TYPE for both), and logged naming the listener.
#[test]
fn the_grpc_cap_is_counted_in_the_connection_metrics() {
    let (server, addr) = start(&["--max-connections", "1"], "grpc-cap-metric");
    let mut held = RawH2::connect(&addr);
    held.wait_for(SETTINGS).expect("served");
    // Once the only slot is taken the loop waits for one, which it logs after counting it.
    server.wait_for_log("gRPC connection cap reached: new connections wait until one closes");
    let page = http(&server.base, Method::GET, "/metrics", None).body;
    let value = |series: &str| -> u64 {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{page}"))
    };
    assert!(value("tollgate_connections_cap_reached_total{listener=\"grpc\"}") >= 1);
    assert_eq!(value("tollgate_connections_open{listener=\"grpc\"}"), 1);
    // The HTTP listener's series are the same metrics.
    value("tollgate_connections_cap_reached_total{listener=\"http\"}");
    for name in [
        "tollgate_connections_open",
        "tollgate_connections_dropped_total",
        "tollgate_connections_cap_reached_total",
    ] {
        let help = format!("# HELP {name} ");
        assert_eq!(
            page.lines().filter(|l| l.starts_with(&help)).count(),
            1,
            "{page}"
        );
    }
    drop(held);
}

/// A connection that never sends the HTTP/2 preface is closed after `--grpc-handshake-timeout`;
/// a call whose request never comes is answered after `--grpc-request-timeout`, freeing its
/// stream.
#[test]
fn silent_connection_and_unfinished_call_time_out() {
    let (_server, addr) = start(
        &[
            "--grpc-handshake-timeout",
            "500ms",
            "--grpc-request-timeout",
            "500ms",
        ],
        "grpc-timeouts",
    );
    let mut silent = TcpStream::connect(&addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 64];
    loop {
        match silent.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("silent connection not closed: {e}"),
        }
    }

    let mut conn = RawH2::connect(&addr);
    conn.open_stream(1).unwrap();
    let answer = loop {
        let f = conn.read_frame().expect("connection open");
        if f.kind == HEADERS && f.stream == 1 {
            break f;
        }
    };
    assert_ne!(answer.flags & END_STREAM, 0, "a trailers-only error answer");
}

/// The HTTP/2 limits also come from `TOLLGATE_*` variables.
#[test]
fn grpc_limits_from_environment_variables() {
    let (_server, addr) = start_env(
        &[],
        &[
            ("TOLLGATE_GRPC_MAX_CONCURRENT_STREAMS", "7"),
            ("TOLLGATE_GRPC_MAX_HEADER_LIST_BYTES", "4096"),
            ("TOLLGATE_GRPC_KEEPALIVE_INTERVAL", "300ms"),
            ("TOLLGATE_GRPC_KEEPALIVE_TIMEOUT", "10s"),
            ("TOLLGATE_MAX_CONNECTIONS", "5"),
            ("TOLLGATE_SHUTDOWN_TIMEOUT", "2s"),
        ],
        "grpc-env",
    );
    let mut conn = RawH2::connect(&addr);
    let settings = conn.wait_for(SETTINGS).expect("server SETTINGS");
    assert_eq!(settings.setting(SETTINGS_MAX_CONCURRENT_STREAMS), Some(7));
    assert_eq!(settings.setting(SETTINGS_MAX_HEADER_LIST_SIZE), Some(4096));
    assert!(conn.wait_for(PING).is_some(), "keepalive PING");
}

/// `TOLLGATE_GRPC_ENGINE=plain` (`--grpc-engine plain`) serves `ShouldRateLimit` through
/// tonic's ordinary path, with the same HTTP/2 limits and answers as the inline engine.
#[test]
fn the_plain_engine_from_the_environment() {
    let (server, addr) = start_env(
        &[],
        &[
            ("TOLLGATE_GRPC_ENGINE", "plain"),
            ("TOLLGATE_GRPC_MAX_CONCURRENT_STREAMS", "7"),
        ],
        "grpc-plain",
    );
    assert!(
        server.stderr().contains("gRPC engine plain"),
        "{}",
        server.stderr()
    );
    assert_eq!(call_blocking(&addr), Ok(1), "OK: alice's first");
    let mut conn = RawH2::connect(&addr);
    let settings = conn.wait_for(SETTINGS).expect("server SETTINGS");
    assert_eq!(settings.setting(SETTINGS_MAX_CONCURRENT_STREAMS), Some(7));
}

/// Regression: the direct `ShouldRateLimit` path read a unary call's body to its end, so a
/// client that kept sending data after the one message grew that request's buffer without
/// bound. Now the data past the message is refused (INVALID_ARGUMENT) as it arrives.
#[test]
fn data_after_the_one_request_message_is_refused_not_buffered() {
    use http_body_util::BodyExt as _;
    let (server, addr) = start(&[], "grpc-trailing-data");
    let pid = server.child.id();
    let rt = tollgate_testsupport::runtime();
    let (grpc_status, sent) = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut client, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
        let body = ChanBody(rx);
        let req = hyper::Request::post(format!(
            "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
        // One valid (empty) message, then up to 256 MiB more on the same stream.
        let writer = tokio::spawn(async move {
            let mut sent = 0usize;
            if tx
                .send(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]))
                .await
                .is_err()
            {
                return sent;
            }
            let chunk = bytes::Bytes::from(vec![0u8; 64 * 1024]);
            while sent < 256 << 20 {
                if tx.send(chunk.clone()).await.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        let resp = tokio::time::timeout(Duration::from_secs(60), client.send_request(req))
            .await
            .expect("an answer while the client is still sending")
            .unwrap();
        let status = match resp.headers().get("grpc-status") {
            Some(v) => v.to_str().unwrap().to_string(),
            None => {
                let trailers = resp
                    .into_body()
                    .collect()
                    .await
                    .unwrap()
                    .trailers()
                    .cloned();
                trailers.unwrap()["grpc-status"]
                    .to_str()
                    .unwrap()
                    .to_string()
            }
        };
        writer.abort();
        let sent = writer.await.unwrap_or(0);
        (status, sent)
    });
    let rss = rss_kib(pid);
    eprintln!("trailing data: grpc-status {grpc_status}, client sent {sent} bytes, RSS {rss} KiB");
    assert_eq!(grpc_status, "3", "INVALID_ARGUMENT");
    assert!(rss < 64 * 1024, "RSS {rss} KiB");
    assert_eq!(call_blocking(&addr), Ok(1), "the server still answers");
}

/// A request body fed through a channel (each item one DATA frame, flow control by hyper).
struct ChanBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|d| d.map(|d| Ok(hyper::body::Frame::data(d))))
    }
}
