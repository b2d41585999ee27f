//! `tollgate serve` and `tollgate check` as real processes on real sockets: hot reload, graceful
//! shutdown, the README quick start, exit codes.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use support::client::Method;

mod support;

use support::*;

/// A `limit` per minute rule on the sliding log: exact and with no window boundary, so a test
/// on the wall clock cannot see its counter reset between two calls.
fn rule(domain: &str, key: &str, limit: u64) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {limit}, algorithm: sliding_window_log}}\n"
    )
}

/// HTTP and gRPC on loopback ports the server picks (and reports).
const ADDRS: [&str; 4] = ["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"];

/// How long a rules change may take to show before the test calls it a hang (on an idle
/// machine it shows within one reload interval, 500 ms).
const RELOAD_HANG: Duration = Duration::from_secs(60);

/// The `tollgate_rule_limit` rows of `/metrics` (`domain rule value`, sorted) and the
/// `tollgate_rules_last_reload_successful` gauge.
fn limit_metrics(base: &str) -> (Vec<String>, String) {
    let page = http(base, Method::GET, "/metrics", None).body;
    let label = |l: &str, name: &str| {
        let from = l.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        l[from..from + l[from..].find('"').unwrap()].to_string()
    };
    let mut rows: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("tollgate_rule_limit{"))
        .map(|l| {
            let value = l.rsplit(' ').next().unwrap();
            format!("{} {} {value}", label(l, "domain"), label(l, "rule"))
        })
        .collect();
    rows.sort();
    let ok = page
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_rules_last_reload_successful "))
        .unwrap_or_else(|| panic!("{page}"))
        .to_string();
    (rows, ok)
}

#[test]
fn reload_new_rules_and_keep_old_on_broken_file() {
    let dir = temp_dir("reload");
    std::fs::write(dir.join("a.yaml"), rule("r", "user", 2)).unwrap();
    // A file the reload leaves alone: its counters must survive the swap.
    std::fs::write(dir.join("keep.yaml"), rule("keep", "user", 3)).unwrap();
    let server = serve_rules(&dir.display().to_string(), &[], "reload");

    let (s, b) = check(&server.base, "r", "user", "u1");
    assert_eq!(s, 200);
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 2);
    let (_, b) = check(&server.base, "keep", "user", "k");
    assert_eq!(b["statuses"][0]["limit_remaining"], 2);
    assert_eq!(
        limit_metrics(&server.base),
        (
            vec!["keep keep.user 3".into(), "r r.user 2".into()],
            "1".into()
        )
    );

    // The watcher picks the new limit up by itself (no signal, no restart).
    std::fs::write(dir.join("a.yaml"), rule("r", "user", 7)).unwrap();
    std::fs::write(dir.join("b.yaml"), rule("other", "k", 1)).unwrap();
    let changed = Instant::now();
    let until = changed + RELOAD_HANG;
    loop {
        let (_, b) = check(&server.base, "r", "user", "u2");
        if b["statuses"][0]["current_limit"]["requests_per_unit"] == 7 {
            break;
        }
        assert!(
            Instant::now() < until,
            "new rules not active after {RELOAD_HANG:?}: {b}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("new rules active {:?} after the change", changed.elapsed());
    let (_, b) = check(&server.base, "other", "k", "x");
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 1);
    // The limits as metrics follow: the new value, the new rule.
    assert_eq!(
        limit_metrics(&server.base).0,
        ["keep keep.user 3", "other other.k 1", "r r.user 7"]
    );
    // The unchanged limit kept its counter through the watcher's reload (3 - 1 - 1 = 1).
    let (_, b) = check(&server.base, "keep", "user", "k");
    assert_eq!(b["statuses"][0]["limit_remaining"], 1, "{b}");

    // A broken file: the old limit is still enforced and the error is reported.
    std::fs::write(
        dir.join("c.yaml"),
        "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: \"ten\"}\n",
    )
    .unwrap();
    let until = Instant::now() + RELOAD_HANG;
    let rules = loop {
        let r = http(&server.base, Method::GET, "/v1/rules", None);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        if !v["last_reload_error"].is_null() {
            break v;
        }
        assert!(Instant::now() < until, "reload error not reported: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = rules["last_reload_error"]["errors"][0].as_str().unwrap();
    assert!(err.contains("c.yaml:4:"), "{err}");
    let (s, _) = check(&server.base, "other", "k", "x");
    assert_eq!(s, 429, "the running rules must stay");
    let (_, b) = check(&server.base, "r", "user", "u3");
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 7);
    let metrics = http(&server.base, Method::GET, "/metrics", None).body;
    assert!(
        metrics.contains("tollgate_rule_reloads_total{result=\"failure\"} 1"),
        "{metrics}"
    );
    assert!(server.stderr().contains("c.yaml:4:"), "{}", server.stderr());
    // The running rules' limits stay, and the gauge says the files do not load.
    let limits = vec![
        "keep keep.user 3".to_string(),
        "other other.k 1".into(),
        "r r.user 7".into(),
    ];
    assert_eq!(limit_metrics(&server.base), (limits, "0".into()));

    // The broken file and a domain's file removed: a removed rule's limit goes.
    std::fs::remove_file(dir.join("c.yaml")).unwrap();
    std::fs::remove_file(dir.join("b.yaml")).unwrap();
    let until = Instant::now() + RELOAD_HANG;
    loop {
        let now = limit_metrics(&server.base);
        if now.1 == "1" {
            assert_eq!(
                now.0,
                ["keep keep.user 3", "r r.user 7"],
                "a reload that succeeds swaps the rules and their limits at once"
            );
            break;
        }
        assert!(Instant::now() < until, "no reload after {RELOAD_HANG:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_finishes_the_in_flight_request_then_exits_zero() {
    let mut args = ADDRS.to_vec();
    args.extend(["--log-format", "json"]);
    let mut server = Server::start(&args, &repo(), "shutdown");
    let port = server.port();

    let body =
        json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}]})
            .to_string();
    let (first, rest) = body.split_at(10);
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        conn,
        "POST /v1/check HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{first}",
        body.len()
    )
    .unwrap();
    conn.flush().unwrap();
    // In flight: the server has read the head (and the first bytes of the body).
    wait_until_read(&conn);
    server.terminate();
    // The signal is taken: a server that does not wait for the request would be gone now.
    server.wait_for_log("SIGTERM received");
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "exited with a request in flight"
    );
    conn.write_all(rest.as_bytes()).unwrap();
    let mut response = String::new();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"overall_code\":\"OK\""), "{response}");
    let status = server.wait(Duration::from_secs(10));
    assert!(status.success(), "exit {status:?}: {}", server.stderr());
    // New connections are refused once it has stopped.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    // --log-format json: every log line is a JSON object.
    let logs = server.stderr();
    assert!(logs.lines().count() >= 2, "{logs}");
    for line in logs.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string(), "{line}");
    }
    assert!(logs.contains("SIGTERM"), "{logs}");
}

#[test]
fn readme_quick_start_serve_without_arguments() {
    // `tollgate serve` from the repo root binds 8080/8081 and serves examples/rules. When the
    // machine has those ports taken, only the addresses are overridden.
    // (Another process may take them between the check and the start: then retry elsewhere.)
    let default_ports = port_is_free(8080) && port_is_free(8081);
    let started = if default_ports {
        match Server::try_start(&[], &repo(), "quickstart") {
            Ok(s) => Some(s),
            // Only a port taken in the meantime may send the test elsewhere; any other failure
            // of the argument-less start is the bug this test is for.
            Err(e) if e.to_lowercase().contains("in use") => None,
            Err(e) => panic!("`tollgate serve` without arguments failed: {e}"),
        }
    } else {
        None
    };
    let server = match started {
        Some(s) => {
            assert_eq!(s.base, "http://127.0.0.1:8080");
            s
        }
        None => Server::start(&ADDRS, &repo(), "quickstart"),
    };
    let (s, b) = check(&server.base, "api", "user", "alice");
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 100);
    assert_eq!(b["statuses"][0]["limit_remaining"], 99);
    let r = http(&server.base, Method::GET, "/healthz", None);
    assert_eq!(r.status, 200);
    let r = http(&server.base, Method::GET, "/readyz", None);
    assert_eq!(r.status, 200);
}

/// The hint's command as printed (`curl ... -d '...'`), run by a shell.
fn run_hint(line: &str) -> Value {
    let from = line.find("(try: ").expect("a hint") + "(try: ".len();
    let to = line.rfind("')").expect("the hint's end") + 1;
    let out = Command::new("bash")
        .arg("-c")
        .arg(&line[from..to])
        .output()
        .unwrap();
    assert!(out.status.success(), "{line}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Regression: the start line's hint was the example rules' request (`api`, `user=alice`)
/// whatever was loaded, and answered `"current_limit":null` with other rules. It names a
/// request a loaded rule limits, and there is none when no rule limits anything.
#[test]
fn the_start_hint_is_a_request_the_loaded_rules_limit() {
    let dir = temp_dir("hint");
    std::fs::write(
        dir.join("shop.yaml"),
        "domain: shop\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n  \
         - key: path\n    value: /checkout\n    descriptors:\n      - key: tenant\n        \
         rate_limit: {unit: minute, requests_per_unit: 7}\n",
    )
    .unwrap();
    let server = serve_rules(&dir.display().to_string(), &[], "hint");
    let b = run_hint(&server.line);
    assert_eq!(b["overall_code"], "OK", "{b}\n{}", server.line);
    assert_eq!(
        b["statuses"][0]["current_limit"]["requests_per_unit"], 7,
        "{b}\n{}",
        server.line
    );
    assert_eq!(b["statuses"][0]["limit_remaining"], 6, "{b}");

    let none = temp_dir("hint-none");
    std::fs::write(
        none.join("free.yaml"),
        "domain: free\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n",
    )
    .unwrap();
    let server = serve_rules(&none.display().to_string(), &[], "hint-none");
    assert!(
        server.line.starts_with("listening: HTTP http://"),
        "{}",
        server.line
    );
    assert!(!server.line.contains("try:"), "{}", server.line);
}

#[test]
fn check_command_exits_0_then_1_then_2() {
    let dir = temp_dir("check");
    std::fs::write(dir.join("a.yaml"), rule("c", "user", 1)).unwrap();
    let server = serve_rules(&dir.display().to_string(), &[], "check");
    let base = server.base.clone();
    let run = |extra: &[&str]| {
        let mut v = vec!["check", "--url", &base, "--domain", "c"];
        v.extend_from_slice(extra);
        tollgate(&v)
    };
    let out = run(&["--descriptor", "user=alice"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("OK: allowed"), "{text}");
    let out = run(&["--descriptor", "user=alice"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.starts_with("OVER_LIMIT: limited"), "{text}");
    assert!(text.contains("Retry-After:"), "{text}");
    // --json prints the raw response; several descriptors; hits 0 only queries.
    let out = run(&[
        "--descriptor",
        "user=bob",
        "--descriptor",
        "x=1;y=2",
        "--hits",
        "0",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["statuses"][0]["limit_remaining"], 1);
    assert!(v["statuses"][1]["current_limit"].is_null());
    // Errors: bad request and unreachable server exit 2.
    let out = run(&["--descriptor", &format!("user={}", "x".repeat(2000))]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("value_too_long"));
    let refused = RefusedPort::new();
    let dead = format!("http://127.0.0.1:{}", refused.port);
    let out = tollgate(&[
        "check",
        "--url",
        &dead,
        "--domain",
        "c",
        "--descriptor",
        "a=b",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_refuses_unsupported_store_and_bad_rules() {
    let out = tollgate(&[
        "serve",
        "--store",
        "etcd://localhost:2379",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unsupported --store 'etcd://localhost:2379'"),
        "{err}"
    );
    assert!(err.contains("'memory', redis://"), "{err}");
    let dir = temp_dir("bad");
    std::fs::write(dir.join("a.yaml"), "domain: a\ndescriptors: 3\n").unwrap();
    let out = tollgate(&[
        "serve",
        "--rules",
        &dir.display().to_string(),
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a.yaml:2:"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_reloads_immediately() {
    let dir = temp_dir("sighup");
    std::fs::write(dir.join("a.yaml"), rule("h", "user", 2)).unwrap();
    let rules = dir.display().to_string();
    let mut args = ADDRS.to_vec();
    // Polling effectively off: only SIGHUP can reload.
    args.extend(["--rules", &rules, "--reload-interval-ms", "3600000"]);
    let server = Server::start_env(
        &args,
        &[("RUST_LOG", "info,tollgate_server::reload=debug")],
        &repo(),
        "sighup",
    );
    // The watcher's first look (at start-up) must not be the one that sees the change.
    server.wait_for_log("rules watcher took its first look");
    std::fs::write(dir.join("a.yaml"), rule("h", "user", 9)).unwrap();
    let (_, b) = check(&server.base, "h", "user", "u");
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 2);
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let signalled = Instant::now();
    let until = signalled + RELOAD_HANG;
    loop {
        let (_, b) = check(&server.base, "h", "user", "u");
        if b["statuses"][0]["current_limit"]["requests_per_unit"] == 9 {
            break;
        }
        assert!(Instant::now() < until, "SIGHUP did not reload: {b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("SIGHUP reloaded within {:?}", signalled.elapsed());
    assert!(server.stderr().contains("SIGHUP"), "{}", server.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every `serve` setting is also a `TOLLGATE_*` environment variable (clap `env`, for containers):
/// addresses, rules, log format and response limits given only that way take effect.
#[test]
fn settings_from_tollgate_environment_variables() {
    let dir = temp_dir("env");
    std::fs::write(dir.join("a.yaml"), rule("envd", "user", 1)).unwrap();
    let rules = dir.display().to_string();
    let server = Server::start_env(
        &[],
        &[
            ("TOLLGATE_HTTP_ADDR", "127.0.0.1:0"),
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:0"),
            ("TOLLGATE_RULES", &rules),
            ("TOLLGATE_LOG_FORMAT", "json"),
            ("TOLLGATE_MAX_BODY_BYTES", "200"),
        ],
        &repo(),
        "env",
    );
    // The addresses came from the environment: the reported ones are loopback, not the
    // default 0.0.0.0:8080 / 8081.
    assert!(
        server.line.contains("HTTP http://127.0.0.1:"),
        "{}",
        server.line
    );
    assert!(server.line.contains("gRPC 127.0.0.1:"), "{}", server.line);
    assert!(!server.line.contains(":8080"), "{}", server.line);
    let (s, b) = check(&server.base, "envd", "user", "u");
    assert_eq!(s, 200);
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 1);
    assert_eq!(check(&server.base, "envd", "user", "u").0, 429);
    let big = json!({"domain": "envd", "descriptors": [{"entries": [{"key": "user", "value": "x".repeat(220)}]}]});
    let r = http(&server.base, Method::POST, "/v1/check", Some(big));
    assert_eq!(r.status, 413, "{}", r.body);
    let logs = server.stderr();
    let first = logs.lines().next().unwrap_or_default();
    assert!(
        serde_json::from_str::<Value>(first).is_ok(),
        "JSON logs: {logs}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Kubernetes ConfigMap update as the kubelet makes it: the files are symlinks through
/// `..data`, which is swapped atomically (a new symlink renamed over it) to a new hidden
/// directory. Nothing the watcher opened changes in place; the running server must see the new
/// rules all the same.
#[test]
fn configmap_symlink_swap_is_picked_up_by_the_running_server() {
    use std::os::unix::fs::symlink;
    let root = temp_dir("configmap");
    let write_version = |name: &str, limit: u64| {
        let data = root.join(name);
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("api.yaml"), rule("cm", "user", limit)).unwrap();
    };
    write_version("..2026_11_23_00_00_00.1", 2);
    symlink("..2026_11_23_00_00_00.1", root.join("..data")).unwrap();
    symlink("..data/api.yaml", root.join("api.yaml")).unwrap();
    let server = serve_rules(&root.display().to_string(), &[], "configmap");
    let limit_of = |user: &str| {
        let (_, b) = check(&server.base, "cm", "user", user);
        b["statuses"][0]["current_limit"]["requests_per_unit"].clone()
    };
    assert_eq!(limit_of("u1"), 2);

    write_version("..2026_11_23_00_05_00.2", 5);
    symlink("..2026_11_23_00_05_00.2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(root.join("..2026_11_23_00_00_00.1")).unwrap();
    let swapped = Instant::now();
    while limit_of("u2") != 5 {
        assert!(
            swapped.elapsed() < RELOAD_HANG,
            "swap not picked up after {RELOAD_HANG:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("swap picked up {:?} after it", swapped.elapsed());
    let _ = std::fs::remove_dir_all(&root);
}

/// Without an admin token configured, `GET /v1/rules` is the summary for everyone (each domain
/// with its number of limits, never the limits and the client keys they name), and the
/// registry's reads are refused like its writes.
#[test]
fn without_an_admin_token_the_rules_listing_is_the_summary() {
    let dir = temp_dir("rules-summary");
    std::fs::write(
        dir.join("keys.yaml"),
        "domain: keys\ndescriptors:\n  - key: remote_address\n    value: 203.0.113.77\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: api_key\n    value: vip-customer-key\n    rate_limit: {unit: minute, requests_per_unit: 9}\n",
    )
    .unwrap();
    let server = support::registry::serve_http(&dir, &dir.join("keys.yaml"), &[], "rules-summary");
    // A bearer token changes nothing when none is configured.
    let anyone = support::registry::call(&server.base, Method::GET, "/v1/rules", None, &[]);
    let bearer = support::registry::admin_get(&server.base, "/v1/rules");
    for r in [&anyone, &bearer] {
        assert_eq!(r.status, 200, "{}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["detail"], "summary", "{v}");
        assert!(
            v["detail_hint"]
                .as_str()
                .is_some_and(|h| h.contains("--admin-token-file")),
            "{v}"
        );
        assert_eq!(v["domain_count"], 1, "{v}");
        assert_eq!(v["limit_count"], 2, "{v}");
        assert_eq!(v["domains"][0]["domain"], "keys", "{v}");
        assert_eq!(v["domains"][0]["limit_count"], 2, "{v}");
        assert!(v["domains"][0].get("limits").is_none(), "{v}");
        assert!(!v["generation"].is_null() && !v["version"].is_null(), "{v}");
        for key in ["203.0.113.77", "vip-customer-key", "remote_address"] {
            assert!(!r.body.contains(key), "{key} listed: {}", r.body);
        }
    }
    let r = http(&server.base, Method::GET, "/v1/domains/keys", None);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(!r.body.contains("vip-customer-key"), "{}", r.body);
    // What stays public: decisions, health, metrics.
    assert_eq!(
        check(&server.base, "keys", "api_key", "vip-customer-key").0,
        200
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            http(&server.base, Method::GET, path, None).status,
            200,
            "{path}"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A start that fails on a later listener (the gRPC port, the envoy metrics port, taken by this
/// test) exits 2 naming the address, and the listeners bound before it go with the process: it
/// is gone once the error is out, nothing of it left serving. (That `serve` itself stops them
/// before returning the error is `tests/failed_start.rs` of tollgate-server.)
#[test]
fn a_listener_that_cannot_bind_fails_the_start_and_nothing_is_left_running() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    for (flags, message) in [
        (
            vec!["--http-addr", "127.0.0.1:0", "--grpc-addr", &taken],
            format!("cannot listen for gRPC on {taken}"),
        ),
        (
            vec![
                "--http-addr",
                "127.0.0.1:0",
                "--grpc-addr",
                "127.0.0.1:0",
                "--envoy-metrics-addr",
                &taken,
            ],
            format!("cannot listen for envoy metrics on {taken}"),
        ),
    ] {
        let mut args = vec!["serve"];
        args.extend(flags);
        // `output` returns once the process has exited (and its descriptors closed with it).
        let out = tollgate(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&message), "{err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("listening:"),
            "a start that fails announced its listeners"
        );
    }
}
