//! A new user's first hour, end to end on the built binary: nothing answers "OK" silently when
//! the request named an unknown domain or matched no rule, addresses are accepted as people
//! write them, missing paths say which flag sets them, `validate --store` refuses what `serve`
//! would, and messages are for humans (no `0:0`, no `Some(..)`, no raw millisecond counts).

mod support;

use serde_json::json;
use std::process::{Command, Output};
use support::client::Method;
use support::{http, repo, temp_dir, tollgate, RefusedPort, Server};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `tollgate check --url BASE ARGS`.
fn check(base: &str, args: &[&str]) -> Output {
    let mut all = vec!["check", "--url", base];
    all.extend_from_slice(args);
    tollgate(&all)
}

/// `tollgate ARGS` in `cwd`, with no `TOLLGATE_*` variable from the caller.
fn tollgate_in(cwd: &std::path::Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TOLLGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).current_dir(cwd).output().unwrap()
}

#[test]
fn unknown_domains_and_unmatched_descriptors_are_visible() {
    let server = Server::start(
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
        &repo(),
        "first-hour-unknown",
    );
    let base = server.base.clone();

    // Wrong case: OK (as Envoy expects), but `check` says the domain is unknown and which one
    // was meant; --strict turns it into exit 3.
    let out = check(&base, &["--domain", "API", "--descriptor", "user=alice"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("domain `API` is unknown"), "{err}");
    assert!(err.contains("did you mean `api`?"), "{err}");
    let out = check(
        &base,
        &["--domain", "API", "--descriptor", "user=alice", "--strict"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

    // A comma instead of `;`: flagged, and the known domain with no matching rule is told apart.
    let out = check(
        &base,
        &[
            "--domain",
            "api",
            "--descriptor",
            "plan=premium,user=alice",
            "--strict",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("separated by `;`"), "{err}");
    assert!(err.contains("`plan=premium;user=alice`"), "{err}");
    assert!(
        err.contains("domain `api` is known but no rule matched"),
        "{err}"
    );

    // A real limit: exit 0 even with --strict, and durations for humans.
    let out = check(
        &base,
        &["--domain", "api", "--descriptor", "user=alice", "--strict"],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("resets in "), "{stdout}");
    assert!(!stdout.contains(" ms"), "{stdout}");

    // The service counts unknown domains by name and logs each name's first occurrence once.
    let metrics = http(&base, Method::GET, "/metrics", None).body;
    assert!(
        metrics.contains("tollgate_unmatched_total{domain=\"API\",reason=\"unknown_domain\"} 2"),
        "{metrics}"
    );
    let log = server.stderr();
    assert_eq!(log.matches("unknown domain").count(), 1, "{log}");
    assert!(log.contains("WARN"), "{log}");
    // Start-up fields without debug wrappers.
    assert!(!log.contains("Some("), "{log}");

    // `{"key":..,"value":..}` without `entries`: the error shows the expected shape.
    let r = http(
        &base,
        Method::POST,
        "/v1/check",
        Some(json!({"domain": "api", "descriptors": [{"key": "user", "value": "alice"}]})),
    );
    assert_eq!(r.status, 400);
    assert!(r.body.contains("go inside `entries`"), "{}", r.body);
}

#[test]
fn listen_addresses_as_people_write_them() {
    // A host name with a port, gRPC off. Port 0 everywhere: the server picks the port.
    let server = Server::launch(
        &["serve", "--http-addr", "localhost:0", "--grpc-addr", "off"],
        "first-hour-localhost",
    );
    assert!(
        server.line.starts_with(&format!(
            "listening: HTTP http://127.0.0.1:{} ",
            server.port()
        )),
        "{}",
        server.line
    );
    assert!(!server.line.contains("gRPC"), "{}", server.line);
    assert_eq!(
        http(&server.base, Method::GET, "/healthz", None).status,
        200
    );
    let log = server.stderr();
    assert!(log.contains("grpc=off"), "{log}");
    drop(server);

    // `:port` and a bare port: every interface; HTTP off with gRPC on.
    for form in [":0", "0"] {
        let server = Server::launch(
            &["serve", "--http-addr", form, "--grpc-addr", "0"],
            "first-hour-port",
        );
        assert!(
            server
                .line
                .contains(&format!("HTTP http://0.0.0.0:{} ", server.port())),
            "{}",
            server.line
        );
        let grpc = server.addr("gRPC ");
        assert!(grpc.starts_with("0.0.0.0:"), "{}", server.line);
        assert_ne!(grpc, "0.0.0.0:0", "{}", server.line);
    }
    let server = Server::launch(
        &[
            "serve",
            "--http-addr",
            "off",
            "--grpc-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
        "first-hour-http-off",
    );
    let grpc_port = server.addr("gRPC 127.0.0.1:");
    assert_eq!(
        server.line,
        format!("listening: gRPC 127.0.0.1:{grpc_port}, store memory")
    );
    let log = server.stderr();
    assert!(log.contains("\"http\":\"off\""), "{log}");
    assert!(
        log.contains(&format!("\"grpc\":\"127.0.0.1:{grpc_port}\"")),
        "{log}"
    );
    drop(server);

    let out = tollgate(&["serve", "--http-addr", "off", "--grpc-addr", "off"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("at least one listener"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_missing_rules_path_names_the_flag_and_no_position() {
    let elsewhere = temp_dir("first-hour-cwd");
    let out = tollgate_in(
        &elsewhere,
        &["serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "off"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("rules path examples/rules not found"), "{err}");
    assert!(err.contains("--rules PATH or TOLLGATE_RULES"), "{err}");
    assert!(!err.contains(":0:0"), "{err}");

    let out = tollgate_in(&elsewhere, &["validate", "examples/rules"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("examples/rules: cannot read rules"), "{err}");
    assert!(!err.contains(":0:0"), "{err}");

    let out = tollgate_in(&elsewhere, &["simulate", "--input", "-"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--rules PATH or TOLLGATE_RULES"), "{err}");
}

#[test]
fn validate_with_a_redis_store_refuses_what_serve_refuses() {
    let dir = temp_dir("first-hour-cms");
    std::fs::write(
        dir.join("cms.yaml"),
        "domain: c\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: count_min_sketch}\n",
    )
    .unwrap();
    let path = dir.display().to_string();
    let out = tollgate(&["validate", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Nothing listens on port 1: nothing is connected, the check is on the rules alone.
    let out = tollgate(&["validate", &path, "--store", "redis://127.0.0.1:1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("count_min_sketch, which is memory-only"),
        "{err}"
    );
    let out = tollgate(&["validate", &path, "--store", "mongodb://x"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn loose_ends_of_rules_and_traces() {
    let dir = temp_dir("first-hour-loose");
    std::fs::write(
        dir.join("typo.yaml"),
        "domain: t\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5, algoritm: gcra}\n",
    )
    .unwrap();
    let out = tollgate(&["validate", &dir.display().to_string()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("did you mean `algorithm`?"), "{err}");

    // An input that fails on its first line prints no CSV header.
    let trace = dir.join("bad.csv");
    std::fs::write(&trace, "not,a,trace\n").unwrap();
    let out = tollgate(&["simulate", "--input", &trace.display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    // A directory as input: open succeeds, reading fails; still nothing on stdout.
    let out = tollgate(&["simulate", "--input", &dir.display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
}

/// Regression: a Redis that refuses connections was logged at start as "store timed out after
/// 50 ms" (the probe gave up before the reconnection could say why), then alternated between
/// timeout and refused every probe, and the breaker "opened from healthy" though it never was.
#[test]
fn a_redis_that_refuses_connections_is_named_once_at_start() {
    let dead = RefusedPort::new();
    let store = format!("redis://127.0.0.1:{}", dead.port);
    let server = Server::launch(
        &[
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
            "--store",
            &store,
        ],
        "first-hour-dead-redis",
    );
    server.wait_for_log("Redis unavailable at start");
    server.wait_for_log("connection refused");
    // The scenario: several probe rounds (every 250 ms) while Redis stays down.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let log = server.stderr();
    assert!(log.contains("connection refused"), "{log}");
    assert!(log.contains("Redis unavailable at start"), "{log}");
    assert!(!log.contains("timed out"), "{log}");
    assert!(!log.contains("from=\"healthy\""), "{log}");
    assert_eq!(log.matches("Redis store error").count(), 1, "{log}");
}
