//! End-to-end tests of the `tollgate` binary: validate and simulate, run as a user would.

mod support;

use std::process::{Command, Output};
use support::{repo, temp_dir, tollgate};

/// `tollgate simulate` of tests/traces/`trace` on `store`.
fn simulate(trace: &str, store: &str) -> Output {
    tollgate(&[
        "simulate",
        "--rules",
        "tests/rules",
        "--input",
        &format!("tests/traces/{trace}"),
        "--store",
        store,
    ])
}

fn simulate_login(store: &str) -> Output {
    simulate("login.csv", store)
}

/// Every `tests/traces/*.csv` that has a `*.expected.csv` beside it (at least login and
/// windows: between them every algorithm the Redis store runs).
fn traces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("tests/traces"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".csv") && !n.ends_with(".expected.csv"))
        .collect();
    names.sort();
    assert!(names.len() >= 2, "{names:?}");
    names
}

fn expected(trace: &str) -> String {
    let path = repo()
        .join("tests/traces")
        .join(trace.replace(".csv", ".expected.csv"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn simulate_replays_traces_exactly() {
    for trace in traces() {
        let out = simulate(&trace, "memory");
        assert!(out.status.success(), "{trace}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), expected(&trace), "{trace}");
    }
}

/// The same traces on Redis (trace clock, throwaway prefix): the same output, no keys left.
#[test]
fn simulate_on_redis_equals_memory() {
    let leftovers = || {
        tollgate_testsupport::cli(
            tollgate_testsupport::shared_port(),
            &["--scan", "--pattern", "tollgate-simulate-*"],
        )
        .lines()
        .count()
    };
    let before = leftovers();
    for trace in traces() {
        let out = simulate(&trace, tollgate_testsupport::shared_url());
        assert!(out.status.success(), "{trace}: {}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            text(&simulate(&trace, "memory").stdout),
            "{trace}"
        );
        assert_eq!(text(&out.stdout), expected(&trace), "{trace}");
    }
    assert_eq!(leftovers(), before, "the replay's keys are deleted");
}

#[test]
fn simulate_is_deterministic_and_reads_stdin() {
    use std::io::Write;
    let trace = std::fs::read(repo().join("tests/traces/login.csv")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["simulate", "--rules", "tests/rules"])
        .current_dir(repo())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&trace).unwrap();
    let out = child.wait_with_output().unwrap();
    let again = simulate_login("memory");
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn simulate_reports_bad_trace_line_with_position() {
    let dir = temp_dir("cli");
    let trace = dir.join("bad.csv");
    std::fs::write(&trace, "# header\n0,test,login=a,1\n5,test,login,1\n").unwrap();
    let out = tollgate(&[
        "simulate",
        "--rules",
        "tests/rules",
        "--input",
        trace.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.csv:3:") && err.contains("key=value"),
        "{err}"
    );
}

/// A shadow-mode denial is answered as allowed, so no surface tells the client when to retry:
/// `simulate` leaves `retry_after_ms` empty as `/v1/check` leaves it out, for the same rule
/// and the same requests (and gives it for a real denial, as `/v1/check` does).
#[test]
fn simulate_and_http_agree_on_retry_after_for_a_shadow_mode_denial() {
    let dir = temp_dir("cli-shadow");
    let rules = dir.join("shadow.yaml");
    std::fs::write(
        &rules,
        "domain: s\ndescriptors:\n  - key: user\n    shadow_mode: true\n    \
         rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}\n  \
         - key: team\n    \
         rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}\n",
    )
    .unwrap();
    let trace = dir.join("t.csv");
    std::fs::write(
        &trace,
        "0,s,user=a,1\n1,s,user=a,1\n0,s,team=a,1\n1,s,team=a,1\n",
    )
    .unwrap();
    let rules_path = rules.to_str().unwrap();
    let out = tollgate(&[
        "simulate",
        "--rules",
        rules_path,
        "--input",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<Vec<String>> = text(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    // t_ms,domain,descriptor,hits,allowed,remaining,retry_after_ms,...
    let simulated: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l[4].as_str(), l[6].as_str()))
        .collect();
    let server = support::serve_rules(rules_path, &[], "cli-shadow");
    let answered: Vec<(String, Option<u64>)> =
        [("user", "a"), ("user", "a"), ("team", "a"), ("team", "a")]
            .iter()
            .map(|(k, v)| {
                let (_, body) = support::check(&server.base, "s", k, v);
                (
                    body["overall_code"].as_str().unwrap_or_default().to_owned(),
                    body["statuses"][0]["retry_after_ms"].as_u64(),
                )
            })
            .collect();
    println!("simulate: {simulated:?}\nHTTP: {answered:?}");
    for ((allowed, retry), (code, http_retry)) in simulated.iter().zip(&answered) {
        assert_eq!(
            *allowed == "true",
            code == "OK",
            "{simulated:?} {answered:?}"
        );
        assert_eq!(
            retry.is_empty(),
            http_retry.is_none(),
            "{simulated:?} {answered:?}"
        );
    }
    assert_eq!(simulated[1], ("true", ""), "the shadow-mode denial");
    assert!(
        !simulated[3].1.is_empty(),
        "a real denial says when to retry"
    );
}

#[test]
fn validate_accepts_examples_and_rejects_broken_rules() {
    let ok = tollgate(&["validate", "examples/rules"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).contains("ok"));

    let dir = temp_dir("cli");
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: x\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
    )
    .unwrap();
    let out = tollgate(&["validate", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.yaml:5:") && err.contains("fortnight"),
        "{err}"
    );
}

#[test]
fn help_runs() {
    let out = tollgate(&["--help"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("simulate"));
}
