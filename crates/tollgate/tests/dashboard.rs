//! The live view of the limits, from outside (the real binary on real sockets):
//! - `/v1/stats` and `/dashboard` are refused without the admin token (and to everyone when no
//!   token is configured); with it, as a bearer token or the HTTP Basic password, after traffic
//!   `/v1/stats` names the denied client, its counts move, and a shadow-mode rule lists who it
//!   would have denied;
//! - in a real browser (headless Chromium driven by Selenium, a script beside this file), the
//!   page loaded with the token shows the denied client in the most-limited list and moving
//!   counts, and writes `target/dashboard.png`; without the token the page is refused.
//!
//! - with a Redis Cluster store, `/v1/stats` lists every master with its breaker; one master
//!   killed, its breaker opens and its keys' fallback decisions are counted on it alone, and the
//!   page's cluster panel shows it (a screenshot of the panel: `target/dashboard-cluster.png`).
//!
//! Selenium is a Python library: `scripts/test.sh` installs it into a venv and exports
//! `TOLLGATE_TEST_SELENIUM_PYTHON` (that venv's python). Unset, the browser test fails and says
//! how to set it up: it never skips.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::client::Method;
use support::registry::{call, serve_http, token_file, TOKEN};

mod support;

use support::*;

/// A limit of 3 a minute per user, and a shadow-mode limit of 2 a minute per API key.
const RULES: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: api_key
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";

/// `tollgate serve` with [`RULES`] on an ephemeral HTTP port, with the admin token when
/// `with_token`.
fn start(name: &str, with_token: bool) -> Server {
    let dir = temp_dir(name);
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let token = token_file(&dir);
    let extra = match with_token {
        true => vec!["--admin-token-file", token.to_str().unwrap()],
        false => vec![],
    };
    serve_http(&dir, &rules, &extra, name)
}

fn get(base: &str, path: &str, auth: Option<&str>) -> support::client::HttpResponse {
    let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
    call(base, Method::GET, path, None, &headers)
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// `admin:TOKEN` in base64, as a browser sends HTTP Basic credentials.
fn basic(password: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let plain = format!("admin:{password}").into_bytes();
    let mut out = String::new();
    for chunk in plain.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Basic {out}")
}

fn stats(base: &str) -> Value {
    let r = get(base, "/v1/stats", Some(&bearer()));
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("JSON")
}

fn rule<'a>(stats: &'a Value, id: &str) -> &'a Value {
    stats["rules"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["rule"] == id))
        .unwrap_or_else(|| panic!("no rule {id} in {stats}"))
}

/// Poll `/v1/stats` until `cond` holds (a generous deadline: the figures are there as soon as
/// the decisions are made, this only rides out a slow machine).
fn wait_stats(base: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = stats(base);
        if cond(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn denied_count(stats: &Value, id: &str, key: &str) -> Option<u64> {
    rule(stats, id)["most_limited"]
        .as_array()?
        .iter()
        .find(|c| c["key"] == key)?["count"]
        .as_u64()
}

#[test]
fn stats_and_dashboard_need_the_admin_token() {
    let server = start("dash-refused", true);
    let base = &server.base;
    for path in ["/v1/stats", "/dashboard"] {
        let none = get(base, path, None);
        assert_eq!(none.status, 401, "{path}: {}", none.body);
        assert!(
            none.header("www-authenticate")
                .is_some_and(|h| h.starts_with("Basic ")),
            "{path}: a browser must be asked for credentials: {:?}",
            none.headers
        );
        let body: Value = serde_json::from_str(&none.body).expect("JSON error");
        assert_eq!(body["error"]["code"], "unauthenticated");
        let wrong = get(base, path, Some("Bearer not-the-token"));
        assert_eq!(wrong.status, 403, "{path}: {}", wrong.body);
        let wrong_basic = get(base, path, Some(&basic("not-the-token")));
        assert_eq!(wrong_basic.status, 401, "{path}: {}", wrong_basic.body);
        assert!(!wrong_basic.body.contains("most_limited"));
        for auth in [bearer(), basic(TOKEN)] {
            let ok = get(base, path, Some(&auth));
            assert_eq!(ok.status, 200, "{path} with {auth}: {}", ok.body);
            assert_eq!(ok.header("cache-control"), Some("no-store"));
        }
    }
    let page = get(base, "/dashboard", Some(&basic(TOKEN)));
    assert!(page
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/html")));
    assert!(page.header("content-security-policy").is_some());
    assert!(page.body.contains("/v1/stats"));

    // Without a configured token nobody gets them, and the answer says how to enable them.
    let open = start("dash-no-token", false);
    for path in ["/v1/stats", "/dashboard"] {
        for auth in [None, Some(bearer())] {
            let r = get(&open.base, path, auth.as_deref());
            assert_eq!(r.status, 403, "{path}: {}", r.body);
            let body: Value = serde_json::from_str(&r.body).expect("JSON error");
            assert_eq!(body["error"]["code"], "admin_token_not_configured");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("--admin-token-file"),
                "{body}"
            );
        }
    }
}

#[test]
fn stats_name_the_denied_client_and_counts_move() {
    let server = start("dash-stats", true);
    let base = &server.base;
    let s = stats(base);
    assert_eq!(s["enabled"], true);
    assert_eq!(s["rules_total"], 2);
    assert_eq!(s["store"]["kind"], "memory");
    assert_eq!(rule(&s, "shop|user")["last_60s"]["denied"], 0);
    assert_eq!(rule(&s, "shop|user")["most_limited"], serde_json::json!([]));

    // mallory: 3 allowed, then 4 denied; alice once.
    let mut codes = Vec::new();
    for _ in 0..7 {
        codes.push(check(base, "shop", "user", "mallory").0);
    }
    assert_eq!(codes, [200, 200, 200, 429, 429, 429, 429]);
    assert_eq!(check(base, "shop", "user", "alice").0, 200);
    // The shadow rule answers OK and remembers who it would have denied.
    for _ in 0..5 {
        assert_eq!(check(base, "shop", "api_key", "k-noisy").0, 200);
    }

    let s = wait_stats(base, "the denials", |s| {
        denied_count(s, "shop|user", "user=mallory") == Some(4)
    });
    let user = rule(&s, "shop|user");
    assert_eq!(user["last_60s"]["allowed"], 4, "{user:#}");
    assert_eq!(user["last_60s"]["denied"], 4, "{user:#}");
    assert_eq!(user["busiest"]["recent"], 1.0);
    assert_eq!(
        user["most_limited"].as_array().unwrap().len(),
        1,
        "{user:#}"
    );
    assert_eq!(user["most_limited"][0]["error"], 0);
    assert_eq!(user["limit"]["requests_per_unit"], 3);
    let per_second: u64 = user["per_second"]["denied"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(per_second, 4);
    let shadow = rule(&s, "shop|api_key");
    assert_eq!(shadow["shadow_mode"], true);
    assert_eq!(shadow["last_60s"]["shadow_denied"], 3, "{shadow:#}");
    assert_eq!(shadow["would_be_denied"][0]["key"], "api_key=k-noisy");
    assert_eq!(shadow["would_be_denied"][0]["count"], 3);
    assert_eq!(shadow["most_limited"], serde_json::json!([]));
    // The busiest rule comes first.
    assert_eq!(s["rules"][0]["rule"], "shop|user");

    // More denials: the count moves.
    for _ in 0..3 {
        assert_eq!(check(base, "shop", "user", "mallory").0, 429);
    }
    wait_stats(base, "the count to move", |s| {
        denied_count(s, "shop|user", "user=mallory") == Some(7)
    });
}

#[test]
fn live_stats_off_records_nothing() {
    let dir = temp_dir("dash-off");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let token = token_file(&dir);
    let server = Server::start(
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
            "--rules",
            rules.to_str().unwrap(),
            "--admin-token-file",
            token.to_str().unwrap(),
            "--live-stats",
            "off",
        ],
        &dir,
        "dash-off",
    );
    for _ in 0..5 {
        check(&server.base, "shop", "user", "mallory");
    }
    let s = stats(&server.base);
    assert_eq!(s["enabled"], false);
    let user = rule(&s, "shop|user");
    assert_eq!(user["last_60s"]["allowed"], 0, "{user:#}");
    assert_eq!(user["most_limited"], serde_json::json!([]));
}

/// The python of the venv that holds Selenium.
fn selenium_python() -> PathBuf {
    match std::env::var_os("TOLLGATE_TEST_SELENIUM_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "TOLLGATE_TEST_SELENIUM_PYTHON is not set: run scripts/test.sh (it installs Selenium \
             into target/selenium and sets it), or `python3 -m venv target/selenium && \
             target/selenium/bin/pip install 'selenium>=4.20,<5'` and set \
             TOLLGATE_TEST_SELENIUM_PYTHON=$PWD/target/selenium/bin/python; the test also needs \
             `chromium` and `chromedriver` (Debian: chromium, chromium-driver)"
        ),
    }
}

/// Headless Chromium loads `/dashboard` with the token (HTTP Basic), the script drives traffic
/// and waits, polling the page, for the denied client and moving counts, then saves a
/// screenshot to `target/dashboard.png`; without the token the page is refused.
#[test]
fn the_page_shows_the_most_limited_client_in_a_browser() {
    let python = selenium_python();
    let server = start("dash-browser", true);
    let script = repo().join("crates/tollgate/tests/dashboard_browser.py");
    let shot = repo().join("target/dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let out = Command::new(&python)
        .arg(&script)
        .args(["--base", &server.base, "--token", TOKEN, "--screenshot"])
        .arg(&shot)
        .env("TOLLGATE_BROWSER_HOME", temp_dir("dash-browser-home"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser test failed (exit {:?}):\n{stdout}\n{}\nserver stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    assert!(stdout.contains("dashboard ok"), "{stdout}");
    assert!(
        std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0),
        "no screenshot"
    );
}

#[test]
fn reloads_and_registry_changes_are_listed() {
    let dir = temp_dir("dash-events");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let token = token_file(&dir);
    let server = Server::start(
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
            "--rules",
            rules.to_str().unwrap(),
            "--admin-token-file",
            token.to_str().unwrap(),
            "--reload-interval-ms",
            "100",
        ],
        &dir,
        "dash-events",
    );
    let base = &server.base;
    let s = stats(base);
    assert_eq!(s["reloads"][0]["ok"], true, "the start-up load: {s:#}");

    std::fs::write(&rules, "domain: shop\ndescriptors: [{key: user, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n").unwrap();
    let s = wait_stats(base, "the failed reload", |s| {
        s["reloads"][0]["ok"] == false
    });
    let errors = s["reloads"][0]["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap_or("").contains("fortnight")),
        "{errors:?}"
    );
    std::fs::write(
        &rules,
        RULES.replace("requests_per_unit: 3", "requests_per_unit: 4"),
    )
    .unwrap();
    wait_stats(base, "the good reload", |s| s["reloads"][0]["ok"] == true);

    let r = support::registry::put(base, "reg", &support::registry::user_limit("reg", 5), None);
    assert_eq!(r.status, 201, "{}", r.body);
    let s = stats(base);
    let change = &s["registry_changes"][0];
    assert_eq!(change["action"], "put", "{s:#}");
    assert_eq!(change["domain"], "reg");
    assert_eq!(change["version"], 1);
    assert!(s["rules"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["domain"] == "reg"));
}

/// With an admin token the registry runs and applies its (empty) domains at start: a rules
/// generation of its own, which the reload list shows (before: the header said generation 2,
/// the list only 1). The page's script is allowed by its hash, never `'unsafe-inline'`.
#[test]
fn every_generation_is_in_the_reload_list_and_no_inline_script_is_allowed() {
    let server = start("dash-generation", true);
    let s = stats(&server.base);
    let generation = &s["rules_generation"];
    assert_eq!(&s["reloads"][0]["generation"], generation, "{s:#}");
    assert_eq!(s["reloads"][0]["source"], "registry", "{s:#}");
    assert_eq!(
        s["reloads"].as_array().unwrap().last().unwrap()["source"],
        "files"
    );
    let page = get(&server.base, "/dashboard", Some(&bearer()));
    assert_eq!(page.status, 200);
    let csp = page
        .headers
        .iter()
        .find(|(k, _)| k == "content-security-policy")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let script_src = csp
        .split(';')
        .find(|d| d.trim().starts_with("script-src"))
        .unwrap_or_else(|| panic!("no script-src: {csp}"));
    assert!(!script_src.contains("unsafe-inline"), "{csp}");
    assert!(script_src.contains("'sha256-"), "{csp}");
}

/// A Redis Cluster store: `/v1/stats` lists each master with its breaker. One master killed
/// (no replica, `cluster-require-full-coverage no`): checks on its keys are decided by the
/// failure policy, its breaker opens and the fallback decisions are counted on it, while the
/// other masters stay healthy; the page's panel shows that in a real browser.
#[test]
fn stats_list_each_cluster_master_and_its_breaker() {
    let python = selenium_python();
    let mut cluster =
        tollgate_testsupport::Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let dir = temp_dir("dash-cluster");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let token = token_file(&dir);
    let url = cluster.url();
    let server = serve_http(
        &dir,
        &rules,
        &[
            "--admin-token-file",
            token.to_str().unwrap(),
            "--store",
            &url,
            "--on-store-error",
            "local",
        ],
        "dash-cluster",
    );
    let addrs: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let masters = |s: &Value| -> Vec<(String, String, u64)> {
        let mut m: Vec<_> = s["store"]["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| {
                        (
                            n["node"].as_str().unwrap_or("").to_string(),
                            n["state"].as_str().unwrap_or("").to_string(),
                            n["degraded_decisions"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        m.sort();
        m
    };
    let s = wait_stats(&server.base, "every master, healthy", |s| {
        let m = masters(s);
        m.len() == 3
            && m.iter()
                .all(|(a, st, _)| addrs.contains(a) && st == "healthy")
    });
    assert!(
        s["store"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["serves_slots"] == true && n["transitions"]["open"] == 0),
        "{s:#}"
    );
    // One master dies; checks over many users reach it too.
    let dead = addrs[2].clone();
    cluster.nodes[2].kill();
    let user = std::cell::Cell::new(0);
    let s = wait_stats(&server.base, "the dead master's breaker open", |s| {
        for _ in 0..20 {
            let body = format!(
                r#"{{"domain": "shop", "descriptors": [{{"entries": [{{"key": "user", "value": "u{}"}}]}}]}}"#,
                user.get()
            );
            user.set(user.get() + 1);
            call(
                &server.base,
                Method::POST,
                "/v1/check",
                Some(("application/json", &body)),
                &[],
            );
        }
        masters(s)
            .iter()
            .any(|(a, st, d)| *a == dead && st == "open" && *d > 0)
    });
    for (addr, state, degraded) in masters(&s) {
        if addr != dead {
            assert_eq!((state.as_str(), degraded), ("healthy", 0), "{addr}: {s:#}");
        }
    }
    // The page's panel, in a browser.
    let shot = repo().join("target/dashboard-cluster.png");
    let _ = std::fs::remove_file(&shot);
    let out = Command::new(&python)
        .arg(repo().join("crates/tollgate/tests/dashboard_browser.py"))
        .args(["--base", &server.base, "--token", TOKEN, "--screenshot"])
        .arg(&shot)
        .args(["--masters", "3", "--open", &dead])
        .env("TOLLGATE_BROWSER_HOME", temp_dir("dash-cluster-home"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("cluster panel ok"),
        "the browser test failed (exit {:?}):\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));
}
