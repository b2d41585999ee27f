//! envoyproxy/ratelimit's stat names from a running `tollgate serve`: a statsd stream (UDP and
//! TCP, received by listeners in the test) and the Prometheus page with its exporter's names.

mod support;

use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{free_port, http, serve_rules, temp_dir, Server};
use tollgate_server::client::Method;

// Fixed window (envoy's counting): a denial holds until the window ends, so the deny cache
// may answer it. An hour: five quick hits never straddle a window boundary.
const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}\n";

fn rules(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    std::fs::write(dir.join("api.yaml"), RULES).unwrap();
    dir
}

fn start(name: &str, extra: &[&str]) -> Server {
    let dir = rules(name);
    let rules = dir.display().to_string();
    serve_rules(&rules, extra, name)
}

/// Five hits on a 3/hour limit: 3 within (the third near the limit), 2 over.
fn five_hits(server: &Server) {
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let body = json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}]});
        statuses.push(http(&server.base, Method::POST, "/v1/check", Some(body)).status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

const TAGS: &str = ".__az=eu_1.__version=1_2";

/// The totals every flush must add up to (counters are sent as increases since the last flush).
fn expected() -> Vec<(String, u64)> {
    [
        ("ratelimit.service.rate_limit.api.user.total_hits", 5),
        ("ratelimit.service.rate_limit.api.user.over_limit", 2),
        ("ratelimit.service.rate_limit.api.user.within_limit", 3),
        ("ratelimit.service.rate_limit.api.user.near_limit", 1),
        ("ratelimit_server.ShouldRateLimit.total_requests", 5),
        ("ratelimit.service.config_load_success", 1),
    ]
    .iter()
    .map(|(n, v)| (format!("{n}{TAGS}"), *v))
    .collect()
}

/// Sum `name:value|c` lines from `lines` until every expected total is reached (or 30 s).
fn collect(lines: mpsc::Receiver<String>, want: Vec<(String, u64)>) -> HashMap<String, u64> {
    let mut sums: HashMap<String, u64> = HashMap::new();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if want.iter().all(|(n, v)| sums.get(n) == Some(v)) {
            break;
        }
        let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let (name, rest) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("line {line:?}"));
        let value = rest
            .strip_suffix("|c")
            .unwrap_or_else(|| panic!("not a counter: {line:?}"));
        *sums.entry(name.to_string()).or_default() += value.parse::<u64>().unwrap();
    }
    for (n, v) in want {
        assert_eq!(sums.get(&n), Some(&v), "{n} in {sums:#?}");
    }
    sums
}

/// A statsd UDP listener on 127.0.0.1: its address and the lines it receives.
fn udp_listener() -> (String, mpsc::Receiver<String>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        // A read error is the timeout: keep listening (the thread ends with the test process).
        loop {
            if let Ok(n) = socket.recv(&mut buf) {
                assert!(n <= 1432, "datagram of {n} bytes");
                for l in String::from_utf8_lossy(&buf[..n]).lines() {
                    if tx.send(l.to_string()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    (addr, rx)
}

#[test]
fn statsd_udp_stream_carries_envoy_stat_names_counts_and_extra_tags() {
    let (addr, rx) = udp_listener();
    let server = start(
        "envoy-stats-udp",
        &[
            "--statsd-addr",
            &addr,
            "--statsd-flush-interval",
            "100ms",
            "--statsd-tags",
            "version:1.2,az:eu.1",
        ],
    );
    five_hits(&server);
    let sums = collect(rx, expected());
    // Nothing shadowed, nothing denied by a local cache: those counters never moved, so (as
    // gostats) they were never sent.
    assert!(!sums.keys().any(|k| k.contains("shadow_mode")), "{sums:#?}");
}

#[test]
fn statsd_tcp_stream_as_gostats_default_transport() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(conn).lines() {
                    let Ok(l) = l else { return };
                    if tx.send(l).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let server = start(
        "envoy-stats-tcp",
        &[
            "--statsd-addr",
            &addr,
            "--statsd-protocol",
            "tcp",
            "--statsd-flush-interval",
            "100ms",
            "--statsd-tags",
            "az:eu.1,version:1.2",
        ],
    );
    five_hits(&server);
    collect(rx, expected());
}

#[test]
fn prometheus_page_with_envoy_metric_names_and_near_limit_ratio() {
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let server = start(
        "envoy-stats-prom",
        &[
            "--envoy-metrics-addr",
            &metrics_addr,
            "--envoy-metrics-path",
            "/stats",
            // floor(3 * 0.5) = 1: the second and third admitted hits are near the limit.
            "--near-limit-ratio",
            "0.5",
        ],
    );
    five_hits(&server);
    let base = format!("http://{metrics_addr}");
    let page = http(&base, Method::GET, "/stats", None);
    assert_eq!(page.status, 200);
    for line in [
        "ratelimit_service_rate_limit_total_hits{domain=\"api\",key1=\"user\"} 5",
        "ratelimit_service_rate_limit_over_limit{domain=\"api\",key1=\"user\"} 2",
        "ratelimit_service_rate_limit_within_limit{domain=\"api\",key1=\"user\"} 3",
        "ratelimit_service_rate_limit_near_limit{domain=\"api\",key1=\"user\"} 2",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 5",
        "ratelimit_service_config_load_success 1",
        "ratelimit_service_config_load_error 0",
    ] {
        assert!(page.body.contains(line), "{line} in\n{}", page.body);
    }
    assert_eq!(http(&base, Method::GET, "/other", None).status, 404);
}

#[test]
fn over_limit_with_local_cache_counts_hits_denied_by_the_deny_cache() {
    let redis = tollgate_testsupport::RedisServer::start(&[]);
    let prefix = tollgate_testsupport::unique_prefix("envoy-stats");
    let url = redis.url();
    let (addr, rx) = udp_listener();
    let server = start(
        "envoy-stats-cache",
        &[
            "--store",
            &url,
            "--redis-prefix",
            &prefix,
            "--redis-timeout-ms",
            "2000",
            "--on-store-error",
            "deny",
            "--local-deny-cache",
            "--statsd-addr",
            &addr,
            "--statsd-flush-interval",
            "100ms",
            "--statsd-tags",
            "version:1.2,az:eu.1",
        ],
    );
    // The fourth hit is denied by Redis (and learned), the fifth by the cache.
    five_hits(&server);
    let mut want = expected();
    want.push((
        format!("ratelimit.service.rate_limit.api.user.over_limit_with_local_cache{TAGS}"),
        1,
    ));
    collect(rx, want);
}
