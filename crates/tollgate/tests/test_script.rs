//! scripts/test.sh's own pieces, without running the suite: the total line it ends with (made
//! of cargo test's `test result:` lines), and what it does on a machine that lacks the tools
//! the suite needs: it says up front what it would install, and `--no-install` fails naming
//! each missing tool and its package, without calling apt-get.

mod support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{repo, temp_dir};

fn script() -> PathBuf {
    repo().join("scripts/test.sh")
}

/// `scripts/test.sh --total-of` on a saved cargo test output.
fn total_of(log: &str, name: &str) -> String {
    let dir = temp_dir(name);
    let file = dir.join("cargo-test.log");
    std::fs::write(&file, log).unwrap();
    let out = Command::new("bash")
        .arg(script())
        .arg("--total-of")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The form the total line must have: `N passed, M failed`, possibly `, K skipped` after.
fn is_total_line(line: &str) -> bool {
    let mut parts = line.split(", ");
    let count = |part: Option<&str>, word: &str| {
        part.and_then(|p| p.strip_suffix(word))
            .and_then(|n| n.strip_suffix(' '))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    count(parts.next(), "passed")
        && count(parts.next(), "failed")
        && parts.next().is_none_or(|p| count(Some(p), "skipped"))
        && parts.next().is_none()
}

#[test]
fn the_total_line_adds_up_every_test_result_line() {
    let log = "\
running 3 tests
test a ... ok
test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s

running 13 tests
test b ... FAILED
test result: FAILED. 10 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.00s
a line that says test result: ok. 99 passed; is not one
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 7 filtered out; finished in 0.00s
";
    assert_eq!(
        total_of(log, "total-mixed"),
        "13 passed, 2 failed, 1 skipped\n"
    );
    let passing =
        "test result: ok. 807 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
    assert_eq!(total_of(passing, "total-ok"), "807 passed, 0 failed\n");
    assert_eq!(total_of("", "total-empty"), "0 passed, 0 failed\n");
    for line in [
        "13 passed, 2 failed, 1 skipped",
        "807 passed, 0 failed",
        "0 passed, 0 failed",
    ] {
        assert!(is_total_line(line), "{line}");
    }
    for line in [
        "13 passed",
        "passed, 0 failed",
        "1 passed, 2 failed, x skipped",
    ] {
        assert!(!is_total_line(line), "{line}");
    }
}

/// A `PATH` of the few commands the script needs before it looks for the suite's tools (bash,
/// cargo, coreutils, a real python3), and an `apt-get` that only records that it was called.
/// None of the suite's tools (redis-server, nginx, ...) is on it.
fn bare_path(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let which = |cmd: &str| {
        let out = Command::new("bash")
            .args(["-c", &format!("command -v {cmd}")])
            .output()
            .unwrap();
        let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (!p.is_empty()).then(|| PathBuf::from(p))
    };
    for cmd in [
        "bash", "dirname", "id", "find", "head", "sed", "awk", "cat", "mktemp", "rm", "seq",
        "sleep", "grep", "env",
    ] {
        if let Some(p) = which(cmd) {
            symlink(p, bin.join(cmd)).unwrap();
        }
    }
    symlink(env!("CARGO"), bin.join("cargo")).unwrap();
    // The interpreter itself: a version manager's shim would need its own PATH.
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    let python = String::from_utf8_lossy(&python.stdout).trim().to_owned();
    symlink(python, bin.join("python3")).unwrap();
    let called = dir.join("apt-get-called");
    std::fs::write(
        bin.join("apt-get"),
        format!("#!/bin/sh\necho \"$@\" >> '{}'\n", called.display()),
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(bin.join("apt-get"))
        .status()
        .unwrap();
    bin
}

fn run_bare(dir: &Path, args: &[&str]) -> Output {
    let bin = bare_path(dir);
    Command::new(bin.join("bash"))
        .arg(script())
        .args(args)
        .env("PATH", &bin)
        .env_remove("TOLLGATE_ENVOY_BIN")
        .env_remove("TOLLGATE_VALKEY_SERVER")
        .output()
        .unwrap()
}

#[test]
fn no_install_fails_naming_what_is_missing_and_installs_nothing() {
    let dir = temp_dir("test-sh-no-install");
    let out = run_bare(&dir, &["--no-install"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        !dir.join("apt-get-called").exists(),
        "apt-get was called:\n{stdout}\n{stderr}"
    );
    // Every missing tool with its package, and the one command that installs them.
    for (cmd, package) in [
        ("redis-server", "redis-server"),
        ("nginx", "nginx"),
        ("groff", "groff-base"),
    ] {
        assert!(
            stdout.contains(&format!("  - {cmd} ({package}): ")),
            "{cmd}: {stdout}"
        );
    }
    assert!(
        stderr.contains("--no-install: nothing was installed")
            && stderr.contains("apt-get install redis-server redis-tools"),
        "{stderr}"
    );
    // It stopped before the tests: no total line.
    assert!(!stdout.lines().any(is_total_line), "{stdout}");
}

/// Without `--no-install`, what it will install is said before anything is installed.
#[test]
fn it_says_what_it_will_install_before_installing() {
    let dir = temp_dir("test-sh-install");
    let out = run_bare(&dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The recording apt-get installs nothing, so the run fails.
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("  - redis-server (redis-server): "),
        "{stdout}"
    );
    assert!(stdout.contains("--no-install fails instead"), "{stdout}");
    let root = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&root.stdout).trim() == "0" {
        assert!(
            stdout.contains("will install with apt-get (as root): redis-server"),
            "{stdout}"
        );
        let called = std::fs::read_to_string(dir.join("apt-get-called")).unwrap();
        assert!(called.contains("install -y -qq redis-server"), "{called}");
        assert!(
            stderr.contains("still missing after installing"),
            "{stderr}"
        );
    } else {
        assert!(stderr.contains("not root"), "{stderr}");
        assert!(!dir.join("apt-get-called").exists());
    }
}

/// The `.rs` files under `dir`, at every depth.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Regression: tests and benches talked to whatever Redis answered on 127.0.0.1:6379 (a
/// server that may hold someone's data), some by the port itself, some through the constant
/// that ignored `TOLLGATE_TEST_REDIS_URL`. Every one goes through `shared_url()` (or
/// `shared_port()`, `shared_addr()`): scripts/test.sh points it at its own server. Only
/// comments, and the docs test that maps the docs' 6379 onto that server, name the port.
#[test]
fn no_test_talks_to_the_redis_on_6379() {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(repo().join("crates")).unwrap() {
        let krate = krate.unwrap().path();
        if krate.ends_with("tollgate-testsupport") {
            continue;
        }
        rust_files(&krate.join("tests"), &mut files);
        rust_files(&krate.join("benches"), &mut files);
    }
    assert!(files.len() > 20, "{files:?}");
    let mut found = Vec::new();
    for f in &files {
        if f.ends_with("tests/readme.rs") || f.ends_with("tests/test_script.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let port = line.replace("26379", "").contains("6379");
            if port || line.contains("SHARED_URL") {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "use tollgate_testsupport::shared_url() (TOLLGATE_TEST_REDIS_URL):\n{}",
        found.join("\n")
    );
}
