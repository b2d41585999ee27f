//! A platform engineer's first day, from outside: `tollgate serve` as a real process over real
//! sockets. A default start warns about nothing; under `--profile envoy` the flags given win
//! over the profile's defaults (or the start fails naming the clash), the missing-rules error
//! names the variables that made the path, the gRPC libraries' own variables are not warned
//! about, a descriptor with no entries is answered as envoyproxy/ratelimit answers it, and a
//! global-shadow answer tells no one to retry; the rate-limit headers never claim more than the
//! capacity in force; the decision log names domain, rule and key, in JSON when asked, and is
//! itself rate-limited.

mod support;

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::client::Method;
use support::*;

/// `tollgate ARGS` with `env` (and no `TOLLGATE_*` from the caller), run to its end.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TOLLGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .current_dir(repo())
        .output()
        .expect("run tollgate")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A rules directory holding `text` as `rules.yaml`.
fn rules_dir(name: &str, text: &str) -> PathBuf {
    let dir = temp_dir(name);
    std::fs::write(dir.join("rules.yaml"), text).unwrap();
    dir
}

/// Poll `cond` on the server's stderr until it holds (or fail after a generous deadline).
fn wait_for_stderr(s: &Server, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let text = s.stderr();
        if cond(&text) {
            return text;
        }
        assert!(Instant::now() < until, "no {what} in:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- Item: no warning on a default start -------------------------------------------------

/// Run under an open-files limit of at most 20 000 (soft and hard), the limit that made the
/// default start warn: two listeners at the default 10 000 connections each do not fit it.
const LOW_NOFILE: &str = "n=$(ulimit -Hn); if [ \"$n\" = unlimited ] || [ \"$n\" -gt 20000 ]; \
                          then n=20000; fi; ulimit -n \"$n\" && exec \"$0\" \"$@\"";

/// `tollgate ARGS` under [`LOW_NOFILE`].
fn start_low_nofile(args: &[&str], name: &str) -> Server {
    Server::launch_under(&["bash", "-c", LOW_NOFILE], args, &[], &repo(), name).unwrap()
}

/// Regression: every default start warned "--max-connections (per listener, two listeners)
/// exceeds the open-files limit". Defaults must fit each other: nothing is warned about.
#[test]
fn a_default_start_warns_about_nothing() {
    let s = start_low_nofile(
        &[
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ],
        "first-day-default-start",
    );
    let log = s.stderr();
    assert!(!log.contains("WARN"), "{log}");
    assert_eq!(check(&s.base, "api", "user", "alice").0, 200);
}

/// A connection cap the user chose and the open-files limit cannot hold is warned about, with
/// the listeners actually on (one here: gRPC is off).
#[test]
fn a_chosen_connection_cap_that_cannot_fit_is_warned_about_with_the_real_listener_count() {
    let s = start_low_nofile(
        &[
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
            "--max-connections",
            "30000",
        ],
        "first-day-chosen-cap",
    );
    let log = s.stderr();
    assert!(log.contains("WARN"), "{log}");
    assert!(log.contains("1 listener)"), "{log}");
}

// --- Items: errors a user reads, the envoy profile ----------------------------------------

/// envoy's listeners (but HTTP, when `http` is given as a flag) on free loopback ports, the
/// debug port on any port, no statsd.
/// envoy's variables for a gRPC and a debug listener on loopback ports the server picks.
fn profile_env() -> Vec<(&'static str, String)> {
    vec![
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", "0".into()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", "0".into()),
        ("USE_STATSD", "false".into()),
    ]
}

const SHADOWED: &str = "domain: first
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
";

/// `serve --profile envoy --rules DIR --http-addr ADDR --response-headers` with `extra` in the
/// environment: the flags must win over the profile's defaults.
fn profile_with_flags(name: &str, extra: &[(&str, &str)]) -> Server {
    let dir = rules_dir(name, SHADOWED);
    let owned = profile_env();
    let mut env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(extra);
    let s = Server::start_env(
        &[
            "--profile",
            "envoy",
            "--rules",
            dir.to_str().unwrap(),
            "--http-addr",
            "127.0.0.1:0",
            "--response-headers",
        ],
        &env,
        &repo(),
        name,
    );
    // The flag's address, not the profile's default (0.0.0.0:8080).
    assert!(s.line.contains("HTTP http://127.0.0.1:"), "{}", s.line);
    assert!(!s.line.contains(":8080"), "{}", s.line);
    s
}

/// `serve --profile envoy` configured by envoy's variables only (rules under `RUNTIME_ROOT`),
/// with `extra` in the environment.
fn profile_from_env(name: &str, extra: &[(&str, &str)]) -> Server {
    let root = temp_dir(name);
    std::fs::create_dir_all(root.join("config")).unwrap();
    std::fs::write(root.join("config/rules.yaml"), SHADOWED).unwrap();
    let mut owned = profile_env();
    owned.extend([
        ("HOST", "127.0.0.1".into()),
        ("PORT", "0".into()),
        ("RUNTIME_ROOT", root.display().to_string()),
    ]);
    let mut env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(extra);
    Server::start_env(&["--profile", "envoy"], &env, &repo(), name)
}

fn json_call(base: &str, body: Value) -> (u16, Value) {
    let r = http(base, Method::POST, "/json", Some(body));
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

/// Regression: under the profile `--rules`, `--http-addr` and `--response-headers` were
/// silently replaced by envoy's defaults (rules from `/srv/runtime_data/current/config`, HTTP
/// on 8080, no headers). And `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`, a gRPC library's variable,
/// warned on every start.
#[test]
fn envoy_profile_keeps_the_flags_given_and_warns_only_about_its_own_variables() {
    let s = profile_with_flags(
        "first-day-profile-flags",
        &[("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "/etc/ssl/roots.pem")],
    );
    let (status, body) = json_call(
        &s.base,
        json!({"domain": "first", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["statuses"][0]["currentLimit"]["requestsPerUnit"], 1,
        "{body}"
    );
    let headers = body["responseHeadersToAdd"].to_string();
    assert!(headers.contains("RateLimit-Limit"), "{body}");
    let log = s.stderr();
    assert!(!log.contains("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"), "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

/// Regression: a descriptor with no entries was refused (400 / INVALID_ARGUMENT) under the
/// profile; envoyproxy/ratelimit answers it OK with no limit.
#[test]
fn envoy_profile_answers_a_descriptor_with_no_entries_ok() {
    let s = profile_from_env("first-day-profile-empty", &[]);
    let (status, body) = json_call(
        &s.base,
        json!({"domain": "first", "descriptors": [{"entries": []}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["overallCode"], "OK", "{body}");
    assert_eq!(body["statuses"][0]["code"], "OK", "{body}");
    assert!(body["statuses"][0].get("currentLimit").is_none(), "{body}");
    // Over gRPC, as Envoy asks: OK, not INVALID_ARGUMENT.
    let grpc = s.addr("gRPC ");
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
            use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
            use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;
            let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
                .await
                .expect("gRPC connect");
            client
                .should_rate_limit(RateLimitRequest {
                    domain: "first".into(),
                    descriptors: vec![RateLimitDescriptor::default()],
                    hits_addend: 0,
                })
                .await
        });
    let answer = answer.expect("ShouldRateLimit answered").into_inner();
    assert_eq!(answer.overall_code, 1, "OK: {answer:?}");
    // Next to a limited descriptor, the limited one still counts.
    let (_, body) = json_call(
        &s.base,
        json!({"domain": "first", "descriptors": [
            {"entries": []},
            {"entries": [{"key": "user", "value": "b"}]}
        ]}),
    );
    assert_eq!(
        body["statuses"][1]["currentLimit"]["requestsPerUnit"], 1,
        "{body}"
    );
}

/// Regression: with `SHADOW_MODE=true` an over-limit request is answered OK, yet the answer
/// still carried `Retry-After` and a `retry_after_ms`: an allowed answer tells no one to wait.
#[test]
fn envoy_profile_global_shadow_answer_carries_no_retry_after() {
    let s = profile_from_env(
        "first-day-profile-shadow",
        &[
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
    );
    let body =
        json!({"domain": "first", "descriptors": [{"entries": [{"key": "user", "value": "c"}]}]});
    for i in 0..2 {
        let r = http(&s.base, Method::POST, "/v1/check", Some(body.clone()));
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["overall_code"], "OK", "{v}");
        assert_eq!(v["statuses"][0]["retry_after_ms"], Value::Null, "{v}");
        assert!(
            r.header("retry-after").is_none(),
            "request {i}: {:?}",
            r.headers
        );
    }
}

/// A flag and envoy's variable that say different things stop the start, naming both.
#[test]
fn envoy_profile_flag_and_variable_that_disagree_fail_naming_both() {
    let mut env: Vec<(&str, String)> = profile_env();
    env.push(("RUNTIME_ROOT", "/tmp".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run_env(
        &[
            "serve",
            "--profile",
            "envoy",
            "--rules",
            "examples/rules",
            "--http-addr",
            "127.0.0.1:0",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("RUNTIME_ROOT=/tmp"), "{err}");
    assert!(err.contains("--rules"), "{err}");
}

/// Regression: under the profile the missing-rules error said "set it with --rules PATH or
/// TOLLGATE_RULES" although the path came from `RUNTIME_ROOT` and its siblings.
#[test]
fn envoy_profile_missing_rules_names_the_variables_that_made_the_path() {
    let root = temp_dir("first-day-no-runtime").join("absent");
    let root = root.to_str().unwrap().to_owned();
    let mut env: Vec<(&str, String)> = profile_env();
    env.extend([
        ("HOST", "127.0.0.1".into()),
        ("PORT", "0".into()),
        ("RUNTIME_ROOT", root.clone()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run_env(&["serve", "--profile", "envoy"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("RUNTIME_ROOT={root}")), "{err}");
    assert!(err.contains("RUNTIME_SUBDIRECTORY=ratelimit"), "{err}");
    assert!(err.contains("RUNTIME_APPDIRECTORY"), "{err}");
    assert!(!err.contains("TOLLGATE_RULES"), "{err}");
}

// --- Item: headers that describe the capacity in force -------------------------------------

const EVERY_ALGORITHM: &str = "domain: hdr
descriptors:
  - key: sliding_window_counter
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: leaky_bucket
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: leaky_bucket, burst: 10}
  - key: token_bucket
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: gcra, burst: 3}
  - key: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
  - key: sliding_window_log
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window_log}
";

/// The numbers of a `RateLimit-Policy` (`limit;w=window`) and the `X-RateLimit-*` headers.
fn header_numbers(r: &support::client::HttpResponse) -> (u64, u64, u64, u64) {
    let num = |name: &str| -> u64 {
        r.header(name)
            .unwrap_or_else(|| panic!("no {name}: {:?}", r.headers))
            .parse()
            .unwrap()
    };
    let policy = r.header("ratelimit-policy").expect("ratelimit-policy");
    let (limit, window) = policy.split_once(";w=").expect("limit;w=window");
    assert_eq!(
        limit.parse::<u64>().unwrap(),
        num("x-ratelimit-limit"),
        "{policy}"
    );
    (
        num("x-ratelimit-limit"),
        num("x-ratelimit-remaining"),
        num("x-ratelimit-reset"),
        window.parse().unwrap(),
    )
}

/// Regression: the first request on 100/minute answered `x-ratelimit-reset: 88` (more than the
/// window), and a leaky bucket of 5/second with a burst of 10 `limit 5` with `remaining 9`.
/// For every algorithm, remaining <= limit and reset <= window; a bucket's limit is its burst.
#[test]
fn rate_limit_headers_never_claim_more_than_the_capacity_in_force() {
    let dir = rules_dir("first-day-headers", EVERY_ALGORITHM);
    let s = serve_rules(dir.to_str().unwrap(), &[], "first-day-headers");
    for key in [
        "sliding_window_counter",
        "leaky_bucket",
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_window_log",
    ] {
        for i in 0..3 {
            let r = http(
                &s.base,
                Method::POST,
                "/v1/check",
                Some(
                    json!({"domain": "hdr", "descriptors": [{"entries": [{"key": key, "value": "x"}]}]}),
                ),
            );
            let (limit, remaining, reset, window) = header_numbers(&r);
            assert!(remaining <= limit, "{key} #{i}: {:?}", r.headers);
            assert!(reset <= window, "{key} #{i}: {:?}", r.headers);
            if matches!(key, "leaky_bucket" | "token_bucket") {
                assert_eq!((limit, window), (10, 2), "{key}: {:?}", r.headers);
            }
        }
    }
}

// --- Item: the decision log ----------------------------------------------------------------

const ONE_AN_HOUR: &str = "domain: login
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
";

/// The decision lines of a JSON log.
fn decision_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "tollgate::decision")
        .collect()
}

/// Regression: three 429s produced no line at `info`. With `--decision-log denied` each denial
/// is one line naming domain, rule and key, as JSON under `TOLLGATE_LOG_FORMAT=json`; the
/// allowed request is not logged.
#[test]
fn decision_log_names_domain_rule_and_key_in_json() {
    let dir = rules_dir("first-day-decision-log", ONE_AN_HOUR);
    let s = serve_rules_env(
        dir.to_str().unwrap(),
        &[],
        &[
            ("TOLLGATE_DECISION_LOG", "denied"),
            ("TOLLGATE_LOG_FORMAT", "json"),
        ],
        "first-day-decision-log",
    );
    let statuses: Vec<u16> = (0..3)
        .map(|_| check(&s.base, "login", "user", "alice").0)
        .collect();
    assert_eq!(statuses, [200, 429, 429]);
    let log = wait_for_stderr(&s, "two decision lines", |l| decision_lines(l).len() >= 2);
    let lines = decision_lines(&log);
    assert_eq!(lines.len(), 2, "{log}");
    for line in lines {
        let f = &line["fields"];
        assert_eq!(f["domain"], "login", "{line}");
        assert_eq!(f["rule"], "login|user", "{line}");
        assert_eq!(f["key"], "user=alice", "{line}");
        assert_eq!(f["outcome"], "denied", "{line}");
    }
}

/// A flood cannot fill the disk: at most `--decision-log-max-per-second` lines a second, the
/// rest counted and reported in one line. Every decision is either written or counted.
#[test]
fn decision_log_is_rate_limited_and_counts_what_it_drops() {
    let dir = rules_dir("first-day-decision-flood", ONE_AN_HOUR);
    let s = serve_rules_env(
        dir.to_str().unwrap(),
        &[
            "--decision-log",
            "all",
            "--decision-log-max-per-second",
            "3",
        ],
        &[("TOLLGATE_LOG_FORMAT", "json")],
        "first-day-decision-flood",
    );
    let mut sent = 0u64;
    for _ in 0..40 {
        check(&s.base, "login", "user", "flood");
        sent += 1;
    }
    // The count of the dropped lines is written with the first line of a later second: keep
    // deciding until it is.
    let until = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = s.stderr();
        if decision_lines(&log)
            .iter()
            .any(|l| l["fields"]["suppressed"].is_u64())
        {
            break log;
        }
        assert!(Instant::now() < until, "no count of dropped lines:\n{log}");
        check(&s.base, "login", "user", "flood");
        sent += 1;
    };
    let lines = decision_lines(&log);
    let written = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "decision")
        .count() as u64;
    let dropped: u64 = lines
        .iter()
        .filter_map(|l| l["fields"]["suppressed"].as_u64())
        .sum();
    assert!(written < sent, "{written} of {sent} written");
    assert!(
        dropped > 0 && written + dropped <= sent,
        "{written} + {dropped} > {sent}"
    );
}

/// `tollgate serve --help` documents the decision log's modes and that keys are personal data.
#[test]
fn decision_log_flag_is_documented() {
    let out = tollgate(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--decision-log"), "{help}");
    assert!(help.contains("personal data"), "{help}");
}

/// The container image sets `TOLLGATE_RULES` for plain `serve`; under the profile that
/// variable gives way to envoy's `RUNTIME_*` layout (only flags on the command line win), so a
/// swapped deployment loads its ConfigMap, not the image's example rules.
#[test]
fn envoy_profile_lets_the_images_rules_variable_give_way_to_the_runtime_layout() {
    let s = profile_from_env(
        "first-day-profile-image-rules",
        &[("TOLLGATE_RULES", "/etc/tollgate/rules")],
    );
    let (status, body) = json_call(
        &s.base,
        json!({"domain": "first", "descriptors": [{"entries": [{"key": "user", "value": "d"}]}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["statuses"][0]["currentLimit"]["requestsPerUnit"], 1,
        "{body}"
    );
}
