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
