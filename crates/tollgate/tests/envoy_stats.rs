//! envoyproxy/ratelimit's stat names from a running `tollgate serve`: a statsd stream (UDP and
//! TCP, received by listeners in the test) and the Prometheus page with its exporter's names.
//! Under `--profile envoy` (configured by envoy's variables only), the counts are envoy's own:
//! with `hits_addend` crossing the limit only the hits past it are `over_limit`.

mod support;

use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::client::Method;
use support::{http, serve_rules, temp_dir, Server};

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
    let server = start(
        "envoy-stats-prom",
        &[
            "--envoy-metrics-addr",
            "127.0.0.1:0",
            "--envoy-metrics-path",
            "/stats",
            // floor(3 * 0.5) = 1: the second and third admitted hits are near the limit.
            "--near-limit-ratio",
            "0.5",
        ],
    );
    five_hits(&server);
    let base = format!(
        "http://{}",
        server.logged_addr("serving envoy-named metrics")
    );
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

/// envoy's fixed window (no `algorithm`), DAY limits: the only window boundary, midnight UTC,
/// is waited out when near (see [`away_from_midnight`]).
const PROFILE_RULES: &str = "domain: stats
descriptors:
  - key: key8
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: key10
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: shadow8
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 20}
";

/// Wait until no midnight UTC is within the next minute (a DAY window then holds the test).
fn away_from_midnight() {
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    while 86_400 - secs() % 86_400 < 60 {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `tollgate serve --profile envoy` with envoy's listeners, runtime folder and `vars`.
fn start_profile(name: &str, vars: &[(&str, &str)]) -> Server {
    let root = temp_dir(name);
    let app = root.join("ratelimit/config");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("stats.yaml"), PROFILE_RULES).unwrap();
    let root = root.display().to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("RUNTIME_ROOT", &root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ];
    env.extend_from_slice(vars);
    Server::start_env(&["--profile", "envoy"], &env, &support::repo(), name)
}

/// envoyproxy/ratelimit's key8/key10 sequences (fixed_cache_impl_test), with their counters
/// brought to 19 and 27 by a first request: 19 then 3 hits on 20/day (2 past the limit), 27
/// then 3 on 10/day, and 19 then 3 on a shadow-mode 20/day rule (answered OK).
fn crossing_sequences(server: &Server) {
    let send = |key: &str, hits: u64| {
        let body = json!({"domain": "stats", "hits_addend": hits,
            "descriptors": [{"entries": [{"key": key, "value": "x"}]}]});
        http(&server.base, Method::POST, "/json", Some(body)).status
    };
    away_from_midnight();
    assert_eq!([send("key8", 19), send("key8", 3)], [200, 429]);
    assert_eq!([send("key10", 27), send("key10", 3)], [429, 429]);
    assert_eq!([send("shadow8", 19), send("shadow8", 3)], [200, 200]);
}

/// What envoy counts for [`crossing_sequences`] (near threshold floor(0.8 limit): 16 and 8):
/// (stats key, total_hits, over_limit, near_limit, within_limit, shadow_mode).
const CROSSING: [(&str, u64, u64, u64, u64, u64); 3] = [
    // 0 -> 19: 19 within, 3 near; 19 -> 22: 2 over, 1 near, none within.
    ("stats.key8", 22, 2, 4, 19, 0),
    // 0 -> 27: 17 over, 2 near (8..10); 27 -> 30: all 3 over.
    ("stats.key10", 30, 20, 2, 0, 0),
    // As key8, the hits over the limit counted in shadow_mode too.
    ("stats.shadow8", 22, 2, 4, 19, 2),
];

#[test]
fn profile_statsd_udp_counts_as_envoy_when_hits_cross_the_limit() {
    let (addr, rx) = udp_listener();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let server = start_profile(
        "envoy-stats-profile-udp",
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", host),
            ("STATSD_PORT", port),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
        ],
    );
    crossing_sequences(&server);
    let mut want = Vec::new();
    for (key, total, over, near, within, shadow) in CROSSING {
        for (stat, v) in [
            ("total_hits", total),
            ("over_limit", over),
            ("near_limit", near),
            ("within_limit", within),
            ("shadow_mode", shadow),
        ] {
            if v > 0 {
                want.push((format!("ratelimit.service.rate_limit.{key}.{stat}"), v));
            }
        }
    }
    want.push(("ratelimit_server.ShouldRateLimit.total_requests".into(), 6));
    let sums = collect(rx, want);
    // Counters that never moved are never sent (key10 admitted nothing).
    assert!(!sums.contains_key("ratelimit.service.rate_limit.stats.key10.within_limit"));
}

#[test]
fn profile_prometheus_counts_as_envoy_when_hits_cross_the_limit() {
    let server = start_profile(
        "envoy-stats-profile-prom",
        &[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            // The log line that names the bound address is at info (envoy's default: warn).
            ("LOG_LEVEL", "info"),
        ],
    );
    crossing_sequences(&server);
    let page = http(
        &format!(
            "http://{}",
            server.logged_addr("serving envoy-named metrics")
        ),
        Method::GET,
        "/metrics",
        None,
    );
    assert_eq!(page.status, 200);
    for (key, total, over, near, within, shadow) in CROSSING {
        let key1 = key.strip_prefix("stats.").unwrap();
        for (stat, v) in [
            ("total_hits", total),
            ("over_limit", over),
            ("near_limit", near),
            ("within_limit", within),
            ("shadow_mode", shadow),
        ] {
            let line = format!(
                "ratelimit_service_rate_limit_{stat}{{domain=\"stats\",key1=\"{key1}\"}} {v}\n"
            );
            assert!(page.body.contains(&line), "{line} in\n{}", page.body);
        }
    }
}
