//! Losing rule files is not a reload: `tollgate serve` as a real process on a temporary rules
//! directory whose files vanish the ways they do in production (the last file deleted, a
//! Kubernetes ConfigMap `..data` swapped to nowhere, a symlink's target deleted). The running
//! limits must stay enforced and the failure be reported (log, `/v1/rules`, metric), while
//! deleting one domain's file on purpose still removes that domain. Also `tollgate validate` on
//! a dangling symlink and the start-up warning for an empty rules directory.

use serde_json::Value;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};
use support::client::Method;

mod support;

use support::*;

/// A generous bound for the watcher (50 ms polls, 100 ms debounce) to act: it only proves that
/// it acts, not how fast.
const WAIT: Duration = Duration::from_secs(15);

/// One request per minute on the sliding log (exact, no window boundary to cross mid-test).
fn rule(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 1, algorithm: sliding_window_log}}\n"
    )
}

/// `tollgate serve --rules DIR --reload-interval-ms 50` on free ports.
fn serve(dir: &Path, log_name: &str) -> Server {
    let rules = dir.display().to_string();
    serve_rules(&rules, &["--reload-interval-ms", "50"], log_name)
}

/// Use up `domain`'s limit for `user=u` and see it deny.
fn exhaust(server: &Server, domain: &str) {
    assert_eq!(check(&server.base, domain, "user", "u").0, 200);
    assert_denied(server, domain);
}

fn assert_denied(server: &Server, domain: &str) {
    let (s, b) = check(&server.base, domain, "user", "u");
    assert_eq!(s, 429, "{domain} must still be limited: {b}");
}

/// `GET /v1/rules` once its `last_reload_error` is set.
fn reload_error(server: &Server) -> Value {
    let until = Instant::now() + WAIT;
    loop {
        let r = http(&server.base, Method::GET, "/v1/rules", None);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        if !v["last_reload_error"].is_null() {
            return v;
        }
        assert!(
            Instant::now() < until,
            "no reload error reported: {v}\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The error texts of the last failed reload, joined.
fn errors(rules: &Value) -> String {
    rules["last_reload_error"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn failures(server: &Server) -> String {
    let metrics = http(&server.base, Method::GET, "/metrics", None).body;
    metrics
        .lines()
        .find(|l| l.starts_with("tollgate_rule_reloads_total{result=\"failure\"}"))
        .unwrap_or_default()
        .to_string()
}

/// The failure is reported the way a broken file is: `/v1/rules`, the failure metric, an ERROR
/// log line naming the rules path; and the domain's limit is still enforced.
fn assert_kept_and_reported(server: &Server, dir: &Path, domain: &str, must_mention: &[&str]) {
    let rules = reload_error(server);
    let text = errors(&rules);
    for m in must_mention {
        assert!(text.contains(m), "{m:?} not in {text}");
    }
    let domains: Vec<&str> = rules["domains"]
        .as_array()
        .map(|d| d.iter().filter_map(|d| d["domain"].as_str()).collect())
        .unwrap_or_default();
    assert!(domains.contains(&domain), "{rules}");
    assert_denied(server, domain);
    assert_eq!(
        failures(server),
        "tollgate_rule_reloads_total{result=\"failure\"} 1"
    );
    let logs = server.stderr();
    let line = logs
        .lines()
        .find(|l| l.contains("rules reload failed"))
        .unwrap_or_else(|| panic!("no reload failure logged:\n{logs}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(&dir.display().to_string()), "{line}");
}

/// (a) Deleting the last rule file would leave no domain at all: refused, reported, enforced.
#[test]
fn deleting_the_last_rule_file_keeps_the_running_limits() {
    let dir = temp_dir("lost-last");
    std::fs::write(dir.join("api.yaml"), rule("api")).unwrap();
    let server = serve(&dir, "lost-last");
    exhaust(&server, "api");
    std::fs::remove_file(dir.join("api.yaml")).unwrap();
    assert_kept_and_reported(&server, &dir, "api", &["no rule files left", "refused"]);
    // Putting a file back is an ordinary reload that clears the error.
    std::fs::write(dir.join("api.yaml"), rule("api")).unwrap();
    let until = Instant::now() + WAIT;
    loop {
        let r = http(&server.base, Method::GET, "/v1/rules", None);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        if v["last_reload_error"].is_null() {
            break;
        }
        assert!(Instant::now() < until, "error not cleared: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_denied(&server, "api");
    let _ = std::fs::remove_dir_all(&dir);
}

/// (b) A ConfigMap mount (`api.yaml -> ..data/api.yaml`, `..data -> ..2024_x`) whose `..data`
/// is swapped to a target that does not exist.
#[test]
fn configmap_data_swapped_to_a_missing_target_keeps_the_running_limits() {
    let dir = temp_dir("lost-configmap");
    let version = dir.join("..2024_11_23_00_00_00.1");
    std::fs::create_dir(&version).unwrap();
    std::fs::write(version.join("api.yaml"), rule("api")).unwrap();
    symlink("..2024_11_23_00_00_00.1", dir.join("..data")).unwrap();
    symlink("..data/api.yaml", dir.join("api.yaml")).unwrap();
    let server = serve(&dir, "lost-configmap");
    exhaust(&server, "api");
    // The kubelet's atomic swap (a new link renamed over `..data`), to nowhere.
    symlink("..2024_11_23_00_05_00.2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    let shown = dir.join("api.yaml").display().to_string();
    assert_kept_and_reported(&server, &dir, "api", &[&shown, "dangling symlink"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (c) A rule file that is a symlink whose target is deleted, beside another domain's file (so
/// not the "no domain left" case: the lost file itself is the error).
#[test]
fn symlinked_rule_file_whose_target_vanished_keeps_the_running_limits() {
    let dir = temp_dir("lost-link");
    let elsewhere = temp_dir("lost-link-target");
    std::fs::write(elsewhere.join("api.yaml"), rule("api")).unwrap();
    symlink(elsewhere.join("api.yaml"), dir.join("api.yaml")).unwrap();
    std::fs::write(dir.join("other.yaml"), rule("other")).unwrap();
    let server = serve(&dir, "lost-link");
    exhaust(&server, "api");
    std::fs::remove_file(elsewhere.join("api.yaml")).unwrap();
    let shown = dir.join("api.yaml").display().to_string();
    assert_kept_and_reported(&server, &dir, "api", &[&shown, "dangling symlink"]);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&elsewhere);
}

/// (d) Deleting one of two domains' files on purpose (its directory entry is gone) still
/// removes that domain, and only it, with a WARN naming it.
#[test]
fn deleting_one_domains_file_removes_that_domain_only() {
    let dir = temp_dir("removed");
    std::fs::write(dir.join("api.yaml"), rule("api")).unwrap();
    std::fs::write(dir.join("old.yaml"), rule("old")).unwrap();
    let server = serve(&dir, "removed");
    exhaust(&server, "api");
    exhaust(&server, "old");
    std::fs::remove_file(dir.join("old.yaml")).unwrap();
    let until = Instant::now() + WAIT;
    loop {
        let (s, b) = check(&server.base, "old", "user", "u");
        if s == 200 {
            assert!(b["statuses"][0]["current_limit"].is_null(), "{b}");
            break;
        }
        assert!(Instant::now() < until, "old.yaml's domain not removed: {b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_denied(&server, "api");
    let r = http(&server.base, Method::GET, "/v1/rules", None);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert!(v["last_reload_error"].is_null(), "{v}");
    assert_eq!(
        failures(&server),
        "tollgate_rule_reloads_total{result=\"failure\"} 0"
    );
    let logs = server.stderr();
    let line = logs
        .lines()
        .find(|l| l.contains("domains removed"))
        .unwrap_or_else(|| panic!("removal not logged:\n{logs}"));
    assert!(line.contains("WARN") && line.contains("old"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// (e) `tollgate validate` reports a dangling symlink as an error with its path.
#[test]
fn validate_reports_a_dangling_symlink() {
    let dir = temp_dir("validate-dangling");
    std::fs::write(dir.join("api.yaml"), rule("api")).unwrap();
    symlink(dir.join("gone.yaml.orig"), dir.join("gone.yaml")).unwrap();
    let out = tollgate(&["validate", &dir.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let shown = dir.join("gone.yaml").display().to_string();
    let line = err
        .lines()
        .find(|l| l.starts_with(&shown))
        .unwrap_or_else(|| panic!("{shown} not named: {err}"));
    assert!(line.contains("dangling symlink"), "{line}");
    assert!(line.contains("gone.yaml.orig"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// (f) Starting on a rules directory with no rule file warns that nothing will be limited (a
/// typo in `--rules` must not silently mean "no limits").
#[test]
fn starting_with_no_domains_logs_a_warning() {
    let dir = temp_dir("empty-start");
    let server = serve(&dir, "empty-start");
    let (s, _) = check(&server.base, "api", "user", "u");
    assert_eq!(s, 200);
    let logs = server.stderr();
    let line = logs
        .lines()
        .find(|l| l.contains("no request will be limited"))
        .unwrap_or_else(|| panic!("no warning:\n{logs}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&dir.display().to_string()), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}
