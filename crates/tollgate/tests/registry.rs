//! The rule registry end to end, on real `tollgate serve` processes with the memory store and a
//! registry directory: register a limit over HTTP and it limits at once; change it, delete it,
//! roll it back from history; every refusal (stale `If-Match`, broken body, no or wrong token,
//! a file's domain, the caps) changes nothing; a restart keeps every registered domain; the
//! service-registration JSON shape limits like the equivalent YAML; `tollgate rules` drives it
//! all from the command line. Redis-backed registries: tests/registry_redis.rs.

mod support;

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use support::client::Method;
use support::registry::*;
use support::*;

const FILE_RULES: &str = "domain: files\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 50}\n";

/// `tollgate serve` with a rules directory (domain `files`), the admin token and a registry
/// directory, plus `extra` flags.
fn start(dir: &Path, extra: &[&str], name: &str) -> Server {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("files.yaml"), FILE_RULES).unwrap();
    let registry = dir.join("registry");
    let mut args = vec!["--registry-dir", registry.to_str().unwrap()];
    args.extend(extra);
    serve_registry(dir, &rules, &args, name)
}

/// The `tollgate_rule_limit` value of `domain`'s `user` rule in `/metrics`, `None` without one.
fn limit_metric(base: &str, domain: &str) -> Option<String> {
    let page = call(base, Method::GET, "/metrics", None, &[]).body;
    let row = format!("tollgate_rule_limit{{domain=\"{domain}\",rule=\"{domain}.user\",");
    let mut rows = page.lines().filter(|l| l.starts_with(&row));
    let value = rows
        .next()
        .map(|l| l.rsplit(' ').next().unwrap().to_string());
    assert!(rows.next().is_none(), "{page}");
    value
}

/// One hit for `user=value`: the status and `limit_remaining`.
fn hit(base: &str, domain: &str, value: &str) -> (u16, Value) {
    let (status, v) = check(base, domain, "user", value);
    (status, v["statuses"][0]["limit_remaining"].clone())
}

#[test]
fn register_change_delete_and_roll_back() {
    let dir = temp_dir("registry-lifecycle");
    let server = start(&dir, &[], "registry-lifecycle");
    let base = &server.base;

    // Register: limits at once on this instance.
    let r = put(base, "shop", &user_limit("shop", 2), None);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.header("etag"), Some("\"1\""));
    assert_eq!(body(&r)["changes"]["added"].as_array().unwrap().len(), 1);
    assert_eq!(hit(base, "shop", "ann"), (200, 1.into()));
    assert_eq!(hit(base, "shop", "ann"), (200, 0.into()));
    assert_eq!(hit(base, "shop", "ann").0, 429);
    // Its limit is a metric beside the file's.
    assert_eq!(limit_metric(base, "shop").as_deref(), Some("2"));
    assert_eq!(limit_metric(base, "files").as_deref(), Some("50"));

    // Listed with its source and version; readable with its ETag.
    let list = body(&admin_get(base, "/v1/domains"));
    let shop = listed(&list, "shop");
    assert_eq!(shop["source"], "registry");
    assert_eq!(shop["version"], 1);
    assert_eq!(shop["updated_by"], "127.0.0.1");
    let files = listed(&list, "files");
    assert_eq!(files["source"], "file");
    assert!(files["file"].as_str().unwrap().ends_with("files.yaml"));
    let got = admin_get(base, "/v1/domains/shop");
    assert_eq!(got.header("etag"), Some("\"1\""));
    assert_eq!(body(&got)["rules"], user_limit("shop", 2));

    // Dry run: shows the change, changes nothing.
    let auth = format!("Bearer {TOKEN}");
    let dry = call(
        base,
        Method::PUT,
        "/v1/domains/shop?dry_run=true",
        Some(("application/yaml", &user_limit("shop", 4))),
        &[("authorization", &auth)],
    );
    assert_eq!(dry.status, 200, "{}", dry.body);
    let d = body(&dry);
    assert_eq!(d["dry_run"], true);
    assert!(d["changes"]["changed"][0]["to"]
        .as_str()
        .unwrap()
        .starts_with("4 per minute"));
    assert_eq!(current_limit(base, "shop", "ann"), Some(2));

    // Change (with the ETag): the counter of the unchanged path keeps its state: 2 used of 4.
    let r = put(base, "shop", &user_limit("shop", 4), Some("\"1\""));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(body(&r)["previous_version"], 1);
    assert_eq!(r.header("etag"), Some("\"2\""));
    assert_eq!(hit(base, "shop", "ann"), (200, 1.into()));
    assert_eq!(limit_metric(base, "shop").as_deref(), Some("4"));

    // History: both versions, newest first; a PUT of the old one rolls back.
    let h = body(&admin_get(base, "/v1/domains/shop/history"));
    let versions = h["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[0]["version"], 2);
    let old = versions[1]["rules"].as_str().unwrap().to_string();
    let r = put(base, "shop", &old, Some("\"2\""));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(current_limit(base, "shop", "ann"), Some(2));
    assert_eq!(hit(base, "shop", "ann").0, 429);

    // Delete: no longer limited.
    let r = delete(base, "shop");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(body(&r)["deleted_version"], 3);
    assert_eq!(current_limit(base, "shop", "ann"), None);
    assert_eq!(admin_get(base, "/v1/domains/shop").status, 404);
    assert_eq!(limit_metric(base, "shop"), None);
    // The file's domain was never touched.
    assert_eq!(current_limit(base, "files", "ann"), Some(50));
    assert_eq!(limit_metric(base, "files").as_deref(), Some("50"));

    // Every change is in the audit log (caller and versions) and counted; the token is in
    // neither the log, the metrics nor /v1/rules.
    let log = server.stderr();
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("registry change"))
        .collect();
    assert_eq!(audit.len(), 4, "{log}");
    assert!(
        audit[1].contains("domain=\"shop\"")
            && audit[1].contains("old_version=1")
            && audit[1].contains("new_version=2")
            && audit[1].contains("caller=\"127.0.0.1\""),
        "{}",
        audit[1]
    );
    let metrics = call(base, Method::GET, "/metrics", None, &[]).body;
    assert!(
        metrics.contains("tollgate_registry_changes_total{action=\"put\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_registry_changes_total{action=\"delete\"} 1"),
        "{metrics}"
    );
    let rules = admin_get(base, "/v1/rules").body;
    for text in [&log, &metrics, &rules] {
        assert!(!text.contains(TOKEN));
    }
}

/// The registry's reads name client keys as its writes do: each needs the admin token (401
/// without, 403 with a wrong one), for a file's domain too. `/v1/rules` lists the limits only
/// to the token's holder; others get the summary.
#[test]
fn reads_and_the_full_listing_need_the_admin_token() {
    let dir = temp_dir("registry-reads");
    let server = start(&dir, &[], "registry-reads");
    let base = &server.base;
    assert_eq!(put(base, "shop", &user_limit("shop", 2), None).status, 201);
    let code = |r: &support::client::HttpResponse| body(r)["error"]["code"].clone();
    for path in [
        "/v1/domains",
        "/v1/domains?limit=1",
        "/v1/domains/shop",
        "/v1/domains/files",
        "/v1/domains/shop/history",
        "/v1/domains/unknown",
    ] {
        let r = call(base, Method::GET, path, None, &[]);
        assert_eq!(
            (r.status, code(&r)),
            (401, "unauthenticated".into()),
            "{path}"
        );
        assert!(
            r.header("www-authenticate")
                .is_some_and(|h| h.starts_with("Bearer")),
            "{path}"
        );
        assert!(!r.body.contains("requests_per_unit"), "{path}: {}", r.body);
        let r = call(
            base,
            Method::GET,
            path,
            None,
            &[("authorization", "Bearer not-the-token")],
        );
        assert_eq!((r.status, code(&r)), (403, "forbidden".into()), "{path}");
    }
    assert_eq!(admin_get(base, "/v1/domains").status, 200);
    assert_eq!(
        body(&admin_get(base, "/v1/domains/files"))["source"],
        "file"
    );
    assert_eq!(admin_get(base, "/v1/domains/shop/history").status, 200);
    assert_eq!(admin_get(base, "/v1/domains/unknown").status, 404);

    let summary = call(base, Method::GET, "/v1/rules", None, &[]);
    assert_eq!(summary.status, 200);
    let v = body(&summary);
    assert_eq!(v["detail"], "summary");
    assert!(v["detail_hint"].is_string(), "{v}");
    assert_eq!(v["domain_count"], 2, "{v}");
    for d in v["domains"].as_array().unwrap() {
        assert!(d.get("limits").is_none(), "{d}");
        assert_eq!(d["limit_count"], 1, "{d}");
    }
    let r = call(
        base,
        Method::GET,
        "/v1/rules",
        None,
        &[("authorization", "Bearer not-the-token")],
    );
    assert_eq!((r.status, code(&r)), (403, "forbidden".into()));
    let full = body(&admin_get(base, "/v1/rules"));
    assert_eq!(full["detail"], "full");
    assert!(full["detail_hint"].is_null(), "{full}");
    let shop = listed(&full, "shop");
    assert_eq!(shop["limits"][0]["quota"]["requests_per_unit"], 2, "{shop}");
}

#[test]
fn refusals_change_nothing() {
    let dir = temp_dir("registry-refusals");
    let server = start(
        &dir,
        &[
            "--registry-max-domains",
            "2",
            "--registry-max-descriptors",
            "3",
            "--registry-max-body-bytes",
            "2000",
        ],
        "registry-refusals",
    );
    let base = &server.base;
    assert_eq!(put(base, "shop", &user_limit("shop", 2), None).status, 201);
    let before = body(&admin_get(base, "/v1/rules"));
    let code = |r: &support::client::HttpResponse| body(r)["error"]["code"].clone();

    // A stale If-Match: 412, naming the current version.
    let r = put(base, "shop", &user_limit("shop", 9), Some("\"7\""));
    assert_eq!(r.status, 412, "{}", r.body);
    assert_eq!(code(&r), "version_mismatch");
    assert!(r.body.contains("version 1"), "{}", r.body);

    // A broken body: 400 with line and column inside the body.
    let broken = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
    let r = put(base, "shop", broken, None);
    assert_eq!(r.status, 400, "{}", r.body);
    let b = body(&r);
    assert_eq!(b["error"]["code"], "invalid_rules");
    assert_eq!(b["problems"][0]["line"], 4);
    assert_eq!(b["problems"][0]["column"], 24);
    assert!(b["error"]["message"]
        .as_str()
        .unwrap()
        .contains("body:4:24: invalid `unit`"));
    let r = put(base, "shop", "domain: shop\ndescriptors: [", None);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(body(&r)["problems"][0]["line"].as_u64().is_some());
    let r = put(base, "shop", &user_limit("other", 1), None);
    assert_eq!((r.status, code(&r)), (400, "domain_mismatch".into()));

    // No token: 401 with a challenge; a wrong one: 403.
    let yaml = user_limit("shop", 9);
    let r = call(
        base,
        Method::PUT,
        "/v1/domains/shop",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!((r.status, code(&r)), (401, "unauthenticated".into()));
    assert!(r
        .header("www-authenticate")
        .is_some_and(|h| h.starts_with("Bearer")));
    let r = call(
        base,
        Method::PUT,
        "/v1/domains/shop",
        Some(("application/yaml", &yaml)),
        &[("authorization", "Bearer not-the-token")],
    );
    assert_eq!((r.status, code(&r)), (403, "forbidden".into()));
    let r = call(
        base,
        Method::DELETE,
        "/v1/domains/shop",
        None,
        &[("authorization", "Bearer x")],
    );
    assert_eq!(r.status, 403);

    // A file's domain: 409 naming the file.
    let r = put(base, "files", &user_limit("files", 1), None);
    assert_eq!((r.status, code(&r)), (409, "domain_owned_by_file".into()));
    assert!(r.body.contains("files.yaml"), "{}", r.body);
    assert_eq!(delete(base, "files").status, 409);

    // Caps: descriptors (413), body size (413), domains (409); a bad name (400).
    let many = "domain: big\ndescriptors:\n  - key: a\n  - key: b\n  - key: c\n  - key: d\n";
    let r = put(base, "big", many, None);
    assert_eq!((r.status, code(&r)), (413, "too_many_descriptors".into()));
    let huge = format!("{}# {}\n", user_limit("big", 1), "x".repeat(3000));
    let r = put(base, "big", &huge, None);
    assert_eq!((r.status, code(&r)), (413, "payload_too_large".into()));
    assert_eq!(
        put(base, "second", &user_limit("second", 1), None).status,
        201
    );
    let r = put(base, "third", &user_limit("third", 1), None);
    assert_eq!((r.status, code(&r)), (409, "too_many_domains".into()));
    let r = put(base, ".hidden", "domain: .hidden\n", None);
    assert_eq!((r.status, code(&r)), (400, "invalid_domain".into()));
    let r = call(
        base,
        Method::PUT,
        "/v1/domains/shop",
        Some(("text/html", &yaml)),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 415);

    // Nothing of that changed the running rules but the one accepted registration.
    assert_eq!(current_limit(base, "shop", "ann"), Some(2));
    assert_eq!(current_limit(base, "files", "ann"), Some(50));
    assert_eq!(current_limit(base, "big", "ann"), None);
    let after = body(&admin_get(base, "/v1/rules"));
    assert_eq!(
        after["generation"].as_u64().unwrap(),
        before["generation"].as_u64().unwrap() + 1,
        "only `second` was applied"
    );
    // Refusals are counted by code.
    let metrics = call(base, Method::GET, "/metrics", None, &[]).body;
    assert!(
        metrics.contains("tollgate_request_errors_total{code=\"version_mismatch\"} 1"),
        "{metrics}"
    );
}

/// Regression: an admin token alone (set for the dashboard) logged a WARN that the registry is
/// kept in memory. That is said at info on start; the WARN comes with the first registration.
#[test]
fn an_admin_token_alone_warns_of_a_memory_registry_only_once_it_is_used() {
    let dir = temp_dir("registry-memory-warn");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, FILE_RULES).unwrap();
    let server = serve_registry(&dir, &rules, &[], "registry-memory-warn");
    let warnings = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains(" WARN "))
            .map(str::to_owned)
            .collect()
    };
    let log = server.stderr();
    assert_eq!(warnings(&log), Vec::<String>::new(), "{log}");
    assert!(log.contains("registry kept in memory only"), "{log}");
    for value in ["shop", "shop2"] {
        let r = put(&server.base, value, &user_limit(value, 2), None);
        assert!(r.status < 300, "{}: {}", r.status, r.body);
    }
    let log = server.stderr();
    let warned = warnings(&log);
    assert_eq!(warned.len(), 1, "once: {log}");
    assert!(
        warned[0].contains("registry kept in memory only") && warned[0].contains("shop"),
        "{log}"
    );
}

#[test]
fn the_registry_is_closed_without_a_token() {
    let dir = temp_dir("registry-off");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, FILE_RULES).unwrap();
    // No registry at all: reads and writes are refused alike (no token could unlock them).
    let server = serve_http(&dir, &rules, &[], "registry-off");
    for r in [
        admin_get(&server.base, "/v1/domains"),
        admin_get(&server.base, "/v1/domains/files"),
        put(&server.base, "shop", &user_limit("shop", 2), None),
    ] {
        assert_eq!(r.status, 403, "{}", r.body);
        assert_eq!(body(&r)["error"]["code"], "registry_writes_off");
        assert!(!r.body.contains("requests_per_unit"), "{}", r.body);
    }
    // A registry directory without a token: its domains are served, the registry answers no one.
    let reg = dir.join("registry");
    let server = serve_http(
        &dir,
        &rules,
        &["--registry-dir", reg.to_str().unwrap()],
        "registry-readonly",
    );
    for r in [
        admin_get(&server.base, "/v1/domains"),
        put(&server.base, "shop", &user_limit("shop", 2), None),
    ] {
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(r.body.contains("--admin-token-file"), "{}", r.body);
    }
}

#[test]
fn a_restart_keeps_registered_domains() {
    let dir = temp_dir("registry-restart");
    let mut server = start(&dir, &[], "registry-restart-1");
    assert_eq!(
        put(&server.base, "shop", &user_limit("shop", 3), None).status,
        201
    );
    assert_eq!(
        put(&server.base, "shop", &user_limit("shop", 5), None).status,
        200
    );
    server.terminate();
    assert!(server.wait(Duration::from_secs(15)).success());
    // The directory holds one file per domain, written atomically (no temporary file left).
    let names: Vec<String> = std::fs::read_dir(dir.join("registry/domains"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["shop.json"]);
    let server = start(&dir, &[], "registry-restart-2");
    assert_eq!(current_limit(&server.base, "shop", "ann"), Some(5));
    let got = admin_get(&server.base, "/v1/domains/shop");
    assert_eq!(got.header("etag"), Some("\"2\""));
    let h = body(&admin_get(&server.base, "/v1/domains/shop/history"));
    assert_eq!(h["versions"].as_array().unwrap().len(), 2);
    // Versions go on from the stored revision.
    let r = put(&server.base, "other", &user_limit("other", 1), None);
    assert_eq!(body(&r)["version"], 3);
}

#[test]
fn the_service_registration_shape_limits_like_the_equivalent_yaml() {
    let dir = temp_dir("registry-shape");
    let server = start(&dir, &[], "registry-shape");
    let base = &server.base;
    let auth = format!("Bearer {TOKEN}");
    let shape = r#"{"field": "user", "rate": {"requests_per_unit": 3, "unit": "minute"}, "request_rejection_message": "retry-with-exponential-backoff"}"#;
    let r = call(
        base,
        Method::PUT,
        "/v1/domains/json",
        Some(("application/json", shape)),
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let yaml = "domain: yaml\ndescriptors:\n  - key: user\n    message: retry-with-exponential-backoff\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";
    assert_eq!(put(base, "yaml", yaml, None).status, 201);
    for _ in 0..5 {
        let (sa, a) = check(base, "json", "user", "zoe");
        let (sb, b) = check(base, "yaml", "user", "zoe");
        assert_eq!(sa, sb);
        for field in ["code", "limit_remaining", "message"] {
            assert_eq!(a["statuses"][0][field], b["statuses"][0][field], "{field}");
        }
    }
    let (status, v) = check(base, "json", "user", "zoe");
    assert_eq!(status, 429);
    assert_eq!(
        v["statuses"][0]["message"],
        "retry-with-exponential-backoff"
    );
    // A list registers several rules; a misspelt field is named.
    let list = r#"[{"field": "user", "rate": {"requests_per_unit": 3, "unit": "minute"}},
                   {"field": "ip", "rate": {"requests_per_unit": 10, "unit": "second"}}]"#;
    let r = call(
        base,
        Method::PUT,
        "/v1/domains/json",
        Some(("application/json", list)),
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(body(&r)["changes"]["added"].as_array().unwrap().len(), 1);
    let r = call(
        base,
        Method::PUT,
        "/v1/domains/json",
        Some((
            "application/json",
            r#"{"field": "user", "rate": {"requests_per_unit": 3, "units": "minute"}}"#,
        )),
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("units"), "{}", r.body);
}

#[test]
fn rules_cli_applies_gets_lists_and_deletes() {
    let dir = temp_dir("registry-cli");
    let server = start(&dir, &[], "registry-cli");
    let token = dir.join("token");
    let token = token.to_str().unwrap();
    let url = server.base.as_str();
    let apply_dir = dir.join("apply");
    std::fs::create_dir_all(&apply_dir).unwrap();
    std::fs::write(apply_dir.join("a.yaml"), user_limit("alpha", 7)).unwrap();
    std::fs::write(apply_dir.join("b.yaml"), user_limit("beta", 8)).unwrap();
    let run = |args: &[&str]| {
        let out = tollgate(args);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let apply = apply_dir.to_str().unwrap();

    let (code, out, err) = run(&[
        "rules",
        "apply",
        "-f",
        apply,
        "--url",
        url,
        "--token-file",
        token,
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("alpha") && out.contains("would be created"),
        "{out}"
    );
    assert!(out.contains("+ alpha|user: 7 per minute"), "{out}");
    assert_eq!(current_limit(url, "alpha", "x"), None);

    let (code, out, err) = run(&[
        "rules",
        "apply",
        "-f",
        apply,
        "--url",
        url,
        "--token-file",
        token,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("created, version"), "{out}");
    assert_eq!(current_limit(url, "alpha", "x"), Some(7));
    assert_eq!(current_limit(url, "beta", "x"), Some(8));

    std::fs::write(apply_dir.join("a.yaml"), user_limit("alpha", 9)).unwrap();
    let (code, out, _) = run(&[
        "rules",
        "apply",
        "-f",
        apply,
        "--url",
        url,
        "--token-file",
        token,
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("~ alpha|user: 7 per minute"), "{out}");
    assert!(out.contains("1 limit(s) unchanged"), "{out}");

    // Reads name client keys too: without the token, exit 2 saying to pass it.
    let (code, _, err) = run(&["rules", "list", "--url", url]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--token-file"), "{err}");
    let (code, _, err) = run(&["rules", "get", "alpha", "--url", url]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--token-file"), "{err}");
    // The token from the environment, as writes take it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["rules", "list", "--url", url])
        .env("TOLLGATE_ADMIN_TOKEN_FILE", token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (code, out, _) = run(&["rules", "list", "--url", url, "--token-file", token]);
    assert_eq!(code, 0);
    assert!(
        out.contains("alpha") && out.contains("registry") && out.contains("files.yaml"),
        "{out}"
    );
    let (code, out, _) = run(&["rules", "get", "alpha", "--url", url, "--token-file", token]);
    assert_eq!(code, 0);
    assert_eq!(out, user_limit("alpha", 9));

    // A broken file: nothing applied, file:line:column, exit 1.
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, "domain: alpha\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: -1}\n").unwrap();
    let (code, _, err) = run(&[
        "rules",
        "apply",
        "-f",
        broken.to_str().unwrap(),
        "--url",
        url,
        "--token-file",
        token,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("broken.yaml:4:"), "{err}");
    // A file's domain: refused by the service, exit 1, naming the file.
    let owned = dir.join("owned.yaml");
    std::fs::write(&owned, user_limit("files", 1)).unwrap();
    let (code, _, err) = run(&[
        "rules",
        "apply",
        "-f",
        owned.to_str().unwrap(),
        "--url",
        url,
        "--token-file",
        token,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("files.yaml"), "{err}");
    // No token: exit 2 with a hint; no service: exit 2.
    let (code, _, err) = run(&["rules", "apply", "-f", apply, "--url", url]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--token-file"), "{err}");
    let refused = RefusedPort::new();
    let dead = format!("http://127.0.0.1:{}", refused.port);
    let (code, _, _) = run(&["rules", "list", "--url", &dead]);
    assert_eq!(code, 2);

    let (code, out, err) = run(&[
        "rules",
        "delete",
        "beta",
        "--url",
        url,
        "--token-file",
        token,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = run(&[
        "rules",
        "delete",
        "beta",
        "--url",
        url,
        "--token-file",
        token,
    ]);
    assert_eq!(code, 1, "{err}");
    let (code, _, _) = run(&["rules", "get", "beta", "--url", url, "--token-file", token]);
    assert_eq!(code, 1);
    assert_eq!(current_limit(url, "beta", "x"), None);
}

/// `rules history` lists the versions kept, `rules rollback` makes an old one current (as a new
/// version, only over the version it looked at), `rules get` prints YAML (a JSON body too) and
/// `rules list` follows the pages of `/v1/domains`.
#[test]
fn rules_cli_history_rollback_yaml_and_pages() {
    let dir = temp_dir("registry-cli-history");
    let server = start(&dir, &[], "registry-cli-history");
    let token = dir.join("token");
    let token = token.to_str().unwrap();
    let url = server.base.as_str();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", url, "--token-file", token]);
        let out = tollgate(&all);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let versions: Vec<u64> = [5, 6, 7]
        .iter()
        .map(|limit| {
            let r = put(url, "hist", &user_limit("hist", *limit), None);
            assert!(r.status == 200 || r.status == 201, "{}", r.body);
            body(&r)["version"].as_u64().unwrap()
        })
        .collect();
    let (code, out, err) = run(&["rules", "history", "hist"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("VERSION"), "{out}");
    assert!(
        lines[1].trim_start().starts_with(&versions[2].to_string()) && lines[1].contains("current"),
        "{out}"
    );
    assert!(
        lines[3].trim_start().starts_with(&versions[0].to_string()),
        "{out}"
    );

    // Back to the first version: 7 -> 5 per minute, as a new version.
    let (code, out, err) = run(&["rules", "rollback", "hist", &versions[0].to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("7 per minute") && out.contains("-> 5 per minute"),
        "{out}"
    );
    assert_eq!(current_limit(url, "hist", "ann"), Some(5));
    let (_, out, _) = run(&["rules", "history", "hist", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["versions"].as_array().unwrap().len(), 4, "{v}");
    // A version no longer (or never) kept is refused, naming those kept.
    let (code, _, err) = run(&["rules", "rollback", "hist", "999999"]);
    assert_eq!(code, 1);
    assert!(err.contains("no version 999999"), "{err}");

    // `get` prints YAML, for a body registered as JSON too; `--json` the service's answer.
    let json_body = r#"{"domain":"js","descriptors":[{"key":"user","rate_limit":{"unit":"minute","requests_per_unit":4}}]}"#;
    let r = call(
        url,
        Method::PUT,
        "/v1/domains/js",
        Some(("application/json", json_body)),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let (code, out, err) = run(&["rules", "get", "js"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("domain: \"js\"\ndescriptors:\n  - key: \"user\""),
        "{out}"
    );
    let file = dir.join("js-back.yaml");
    std::fs::write(&file, &out).unwrap();
    let (code, out2, err) = run(&["rules", "apply", "-f", file.to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, 0, "{out2}{err}");
    assert!(
        out2.contains("1 limit(s) unchanged"),
        "the YAML means the same: {out2}"
    );
    let (_, out, _) = run(&["rules", "get", "js", "--json"]);
    assert!(serde_json::from_str::<Value>(&out).unwrap()["version"].is_u64());

    // Pages of /v1/domains: 2 at a time, followed by `rules list`.
    let r = admin_get(url, "/v1/domains?limit=2");
    let page = body(&r);
    assert_eq!(page["domains"].as_array().unwrap().len(), 2, "{page}");
    assert!(page["next_after"].is_string(), "{page}");
    let (code, out, err) = run(&["rules", "list"]);
    assert_eq!(code, 0, "{out}{err}");
    for d in ["hist", "js"] {
        assert!(out.lines().any(|l| l.starts_with(d)), "{d}: {out}");
    }
    drop(server);
}
