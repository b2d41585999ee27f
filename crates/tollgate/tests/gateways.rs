//! End to end: real nginx and Caddy, configured from the shipped examples, with `tollgate serve`
//! as their forward-auth endpoint in front of a tiny upstream; and tollgate answering the exact
//! requests Traefik's ForwardAuth sends (Traefik is not packaged here). Clients connect from
//! distinct loopback addresses (127.0.0.X), so per-IP limits are really per client.
//!
//! Limits are per hour with a token bucket: nothing refills during a test, whatever the load.

mod support;

use std::path::Path;
use support::gateway::{get, Gateway, Resp, Upstream};
use support::{temp_dir, tollgate, Server};

/// Per client address, per API key, per path prefix; a shadow-mode rule by header.
const RULES: &str = r#"domain: web
http:
  - actions: [{remote_address: {}}]
  - actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
  - actions:
      - header_value_match:
          descriptor_key: path
          descriptor_value: expensive
          headers: [{name: ':path', prefix_match: /expensive}]
  - actions: [{request_headers: {header_name: x-tier, descriptor_key: tier}}]
  - actions: [{request_headers: {header_name: x-reader, descriptor_key: reader}}]
  - actions: [{request_headers: {header_name: x-abuser, descriptor_key: abuser}}]
descriptors:
  - key: remote_address
    message: too many requests from your address
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
  - key: api_key
    message: too many requests for this API key
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
  - key: path
    value: expensive
    message: /expensive is busy
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
  - key: tier
    value: free
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
  - key: reader
    degrade: {below_remaining: 50%}
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: token_bucket}
  - key: abuser
    shadowban: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
"#;

/// One limit for every request.
const GLOBAL_RULES: &str = r#"domain: web
http:
  - actions: [{generic_key: {descriptor_value: all}}]
descriptors:
  - key: generic_key
    value: all
    message: the API is busy
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
"#;

/// `tollgate serve` with `rules`, trusting the gateway on 127.0.0.1.
fn tollgate_with(name: &str, rules: &str) -> (Server, u16) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("web.yaml"), rules).unwrap();
    let server = Server::start(
        &[
            "--rules",
            "web.yaml",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--trusted-proxies",
            "127.0.0.1/32",
        ],
        &dir,
        name,
    );
    let port = server.base.rsplit(':').next().unwrap().parse().unwrap();
    (server, port)
}

fn ok(r: &Resp, what: &str) {
    assert_eq!(r.status, 200, "{what}: {r:?}");
    assert!(r.body.starts_with("upstream saw:"), "{what}: {r:?}");
}

fn limited(r: &Resp, message: &str, what: &str) {
    assert_eq!(r.status, 429, "{what}: {r:?}");
    let retry: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no Retry-After: {r:?}"));
    assert!(retry >= 1, "{what}: {r:?}");
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("0"),
        "{what}: {r:?}"
    );
    assert!(r.header("x-ratelimit-limit").is_some(), "{what}: {r:?}");
    assert!(r.header("ratelimit-policy").is_some(), "{what}: {r:?}");
    assert!(r.header("ratelimit").is_some(), "{what}: {r:?}");
    assert!(r.body.contains(message), "{what}: {r:?}");
}

/// The upstream received the rate-limit headers (it echoes the request head, lower case).
fn upstream_saw(r: &Resp, header: &str) {
    assert!(
        r.body.contains(header),
        "upstream did not get {header:?}: {r:?}"
    );
}

/// The scenario both gateways pass: per IP, spoofed X-Forwarded-For, per API key, per path.
fn per_client_key_and_path(port: u16, first_ip_octet: u8, per_ip_answer_headers: bool) {
    let ip = |n: u8| format!("127.0.{first_ip_octet}.{n}");
    // Per client address: 3 per hour.
    for i in 1..=3u8 {
        let r = get(&ip(1), port, "/items", &[]);
        ok(&r, "per-ip allowed");
        upstream_saw(&r, &format!("x-ratelimit-remaining: {}", 3 - i));
        upstream_saw(&r, "x-ratelimit-limit: 3");
        if per_ip_answer_headers {
            assert_eq!(
                r.header("x-ratelimit-remaining"),
                Some((3 - i).to_string().as_str()),
                "{r:?}"
            );
        }
    }
    let r = get(&ip(1), port, "/items", &[]);
    limited(&r, "too many requests from your address", "per-ip 4th");
    // Spoofing X-Forwarded-For / X-Real-IP does not get a fresh counter...
    let spoof = [
        ("X-Forwarded-For", "203.0.113.77"),
        ("X-Real-IP", "203.0.113.78"),
    ];
    let r = get(&ip(1), port, "/items", &spoof);
    limited(&r, "too many requests from your address", "spoofed xff");
    // ... nor does claiming to be the exhausted client hurt anyone else.
    let r = get(&ip(2), port, "/items", &[("X-Forwarded-For", &ip(1))]);
    ok(&r, "other client claiming the exhausted address");
    upstream_saw(&r, "x-ratelimit-remaining: 2");

    // Per API key: 2 per hour, whichever address it comes from.
    for n in [10, 11] {
        let r = get(&ip(n), port, "/items", &[("X-Api-Key", "key-a")]);
        ok(&r, "api key allowed");
    }
    let r = get(&ip(12), port, "/items", &[("X-Api-Key", "key-a")]);
    limited(&r, "too many requests for this API key", "api key 3rd");
    let r = get(&ip(12), port, "/items", &[("X-Api-Key", "key-b")]);
    ok(&r, "another key");

    // Per path: /expensive 2 per hour for everyone; other paths unaffected.
    for n in [20, 21] {
        ok(
            &get(&ip(n), port, "/expensive/report?q=1", &[]),
            "path allowed",
        );
    }
    let r = get(&ip(22), port, "/expensive", &[]);
    limited(&r, "/expensive is busy", "path 3rd");
    ok(&get(&ip(22), port, "/cheap", &[]), "other path");
}

/// The shadow-mode and global scenarios through a gateway.
fn shadow_header(port: u16, ip: &str) {
    let r = get(ip, port, "/items", &[("X-Tier", "free")]);
    ok(&r, "shadow 1st");
    upstream_saw(&r, "x-ratelimit-shadow-limited: false");
    let r = get(ip, port, "/items", &[("X-Tier", "free")]);
    ok(&r, "shadow 2nd goes through");
    upstream_saw(&r, "x-ratelimit-shadow-limited: true");
}

/// Degrade and shadowban through a gateway: past the threshold the upstream gets
/// X-RateLimit-Degrade; a shadowbanned client gets the gateway's fake success (the shipped
/// `{"results":[]}`) and the upstream never sees the request. `ip` is the client's address
/// (the rules' first action limits every address to 3 per hour: each request here comes from
/// its own).
fn degrade_and_shadowban(upstream: &Upstream, port: u16, ip: &dyn Fn(u8) -> String) {
    // 4 per hour, degrade below 50%: remaining 3 and 2 full quality; 1 and 0 degraded.
    for (n, degraded) in [(40, false), (41, false), (42, true), (43, true)] {
        let r = get(&ip(n), port, "/items", &[("X-Reader", "r1")]);
        ok(&r, "reader");
        assert_eq!(
            r.body.contains("x-ratelimit-degrade: web|reader"),
            degraded,
            "request {n}: {r:?}"
        );
    }
    let r = get(&ip(44), port, "/items", &[("X-Reader", "r1")]);
    assert_eq!(r.status, 429, "{r:?}");
    // Shadowban: the first passes, the next ones get the fake success and never arrive. The
    // fake success carries the rate-limit headers a real one does (here the per-address
    // limit's, each request its address's first), never the shadowban rule's.
    let real = get(&ip(50), port, "/items?banned", &[("X-Abuser", "a1")]);
    ok(&real, "abuser 1st");
    for n in [51, 52] {
        let r = get(&ip(n), port, "/items?banned", &[("X-Abuser", "a1")]);
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "{\"results\":[]}\n"),
            "{r:?}"
        );
        assert_eq!(r.header("retry-after"), None, "{r:?}");
        for h in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "ratelimit-policy",
        ] {
            assert_eq!(r.header(h), real.header(h), "{h}: {r:?}\nreal: {real:?}");
        }
    }
    assert_eq!(upstream.saw("/items?banned"), 1);
}

#[test]
fn nginx_limits_per_client_key_and_path_with_true_429s() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("gw-nginx", RULES);
    let nginx = Gateway::nginx("gw-nginx-ngx", tg, upstream.port, |c| c);
    per_client_key_and_path(nginx.port, 1, true);
    shadow_header(nginx.port, "127.0.1.30");
    degrade_and_shadowban(&upstream, nginx.port, &|n| format!("127.0.1.{n}"));
    drop(nginx);
}

#[test]
fn caddy_limits_per_client_key_and_path_with_true_429s() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("gw-caddy", RULES);
    let caddy = Gateway::caddy("gw-caddy-cad", tg, upstream.port);
    per_client_key_and_path(caddy.port, 2, false);
    shadow_header(caddy.port, "127.0.2.30");
    degrade_and_shadowban(&upstream, caddy.port, &|n| format!("127.0.2.{n}"));
    // Caddy passes tollgate's body on: JSON when the client asks for JSON.
    let r = get(
        "127.0.2.1",
        caddy.port,
        "/items",
        &[("Accept", "application/json")],
    );
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["message"], "too many requests from your address");
    assert!(
        v["error"]["retry_after_s"].as_u64().is_some_and(|s| s >= 1),
        "{v}"
    );
}

#[test]
fn nginx_global_limit_then_fails_closed_when_tollgate_stops() {
    let upstream = Upstream::start();
    let (mut tollgate, tg) = tollgate_with("gw-nginx-global", GLOBAL_RULES);
    let nginx = Gateway::nginx("gw-nginx-global-ngx", tg, upstream.port, |c| c);
    ok(&get("127.0.3.1", nginx.port, "/a", &[]), "global 1");
    ok(&get("127.0.3.2", nginx.port, "/b", &[]), "global 2");
    limited(
        &get("127.0.3.3", nginx.port, "/c", &[]),
        "the API is busy",
        "global 3rd, another client and path",
    );
    tollgate.terminate();
    assert!(tollgate.wait(std::time::Duration::from_secs(30)).success());
    // As shipped: fail closed, 503 (not the upstream, not a bare 500).
    let r = get("127.0.3.4", nginx.port, "/a", &[]);
    assert_eq!(r.status, 503, "{r:?}\n{}", nginx.log());
    assert!(r.body.contains("rate limiter unavailable"), "{r:?}");
}

#[test]
fn nginx_fails_open_when_configured_to() {
    let upstream = Upstream::start();
    let (mut tollgate, tg) = tollgate_with("gw-nginx-open", GLOBAL_RULES);
    let line = "# error_page 502 504 = @tollgate_fail_open;";
    let nginx = Gateway::nginx("gw-nginx-open-ngx", tg, upstream.port, |c| {
        assert!(c.contains(line), "the fail-open line moved");
        c.replace(line, "error_page 502 504 = @tollgate_fail_open;")
    });
    ok(&get("127.0.4.1", nginx.port, "/a", &[]), "up: allowed");
    tollgate.terminate();
    assert!(tollgate.wait(std::time::Duration::from_secs(30)).success());
    for n in 2..5 {
        // Unlimited while tollgate is down (the global limit of 2 would deny the 3rd).
        ok(
            &get(&format!("127.0.4.{n}"), nginx.port, "/a", &[]),
            "down: fail open",
        );
    }
}

#[test]
fn caddy_fails_closed_when_tollgate_stops() {
    let upstream = Upstream::start();
    let (mut tollgate, tg) = tollgate_with("gw-caddy-down", GLOBAL_RULES);
    let caddy = Gateway::caddy("gw-caddy-down-cad", tg, upstream.port);
    ok(&get("127.0.5.1", caddy.port, "/a", &[]), "up");
    tollgate.terminate();
    assert!(tollgate.wait(std::time::Duration::from_secs(30)).success());
    let r = get("127.0.5.2", caddy.port, "/a", &[]);
    assert_eq!(r.status, 502, "{r:?}\n{}", caddy.log());
}

/// What Traefik's ForwardAuth sends (per its documentation): a GET to the auth address with the
/// original request's headers plus X-Forwarded-Method, -Proto, -Host, -Uri and -For; Traefik
/// (`trustForwardHeader: false`, the default) sets X-Forwarded-For to the client address.
fn traefik(port: u16, client: &str, method: &str, uri: &str, extra: &[(&str, &str)]) -> Resp {
    let mut h = vec![
        ("X-Forwarded-Method", method),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "api.example.com"),
        ("X-Forwarded-Uri", uri),
        ("X-Forwarded-For", client),
        ("User-Agent", "curl/8"),
    ];
    h.extend_from_slice(extra);
    // Traefik is the peer: 127.0.0.1, the trusted proxy.
    get("127.0.0.1", port, "/v1/forward-auth/web", &h)
}

#[test]
fn traefik_forward_auth_requests() {
    let (_tollgate, tg) = tollgate_with("gw-traefik", RULES);
    let c = "198.51.100.7";
    for i in 1..=3u8 {
        let r = traefik(tg, c, "GET", "/items", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some((3 - i).to_string().as_str())
        );
    }
    let r = traefik(tg, c, "POST", "/items", &[("Accept", "text/plain")]);
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert_eq!(r.body, "too many requests from your address\n");
    // With trustForwardHeader: true, Traefik appends the client to what it received: the
    // client's own entries are left of it and ignored.
    let r = traefik(tg, &format!("6.6.6.6, {c}"), "GET", "/items", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    let r = traefik(tg, &format!("{c}, 198.51.100.8"), "GET", "/items", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    // Per path, read from X-Forwarded-Uri.
    for n in 1..=2 {
        let r = traefik(tg, &format!("192.0.2.{n}"), "GET", "/expensive?x=1", &[]);
        assert_eq!(r.status, 200, "{r:?}");
    }
    let r = traefik(tg, "192.0.2.3", "GET", "/expensive", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.body.contains("/expensive is busy"), "{r:?}");
    // Degrade: the header Traefik copies upstream names the rule past its threshold, and is
    // empty before. Shadowban: Traefik can only pass tollgate's 429 on, marked.
    let reader = |ip: &str| traefik(tg, ip, "GET", "/items", &[("X-Reader", "t1")]);
    let r = reader("192.0.2.20");
    assert_eq!(
        (r.status, r.header("x-ratelimit-degrade")),
        (200, Some("")),
        "{r:?}"
    );
    reader("192.0.2.21");
    let r = reader("192.0.2.22");
    assert_eq!(r.header("x-ratelimit-degrade"), Some("web|reader"), "{r:?}");
    let abuser = |ip: &str| traefik(tg, ip, "GET", "/items", &[("X-Abuser", "t1")]);
    assert_eq!(abuser("192.0.2.23").status, 200);
    let r = abuser("192.0.2.24");
    assert_eq!(
        (r.status, r.header("x-ratelimit-shadowban")),
        (429, Some("true")),
        "{r:?}"
    );
    // Shadow mode: 200, with the header saying it would have been limited.
    let r = traefik(tg, "192.0.2.10", "GET", "/items", &[("X-Tier", "free")]);
    assert_eq!(
        (r.status, r.header("x-ratelimit-shadow-limited")),
        (200, Some("false")),
        "{r:?}"
    );
    let r = traefik(tg, "192.0.2.11", "GET", "/items", &[("X-Tier", "free")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("x-ratelimit-shadow-limited"),
        Some("true"),
        "{r:?}"
    );
}

#[test]
fn forward_auth_edge_cases() {
    let (_tollgate, tg) = tollgate_with("gw-edges", RULES);
    // An untrusted peer's X-Forwarded-For is ignored: its counter is its own address.
    for _ in 0..3 {
        let r = get(
            "127.0.6.1",
            tg,
            "/v1/forward-auth/web",
            &[("X-Forwarded-For", "192.0.2.99")],
        );
        assert_eq!(r.status, 200, "{r:?}");
    }
    let r = get(
        "127.0.6.1",
        tg,
        "/v1/forward-auth/web",
        &[("X-Forwarded-For", "192.0.2.98")],
    );
    assert_eq!(r.status, 429, "{r:?}");
    // Unknown domain: 404, so a misconfigured gateway is seen at once.
    let r = get("127.0.0.1", tg, "/v1/forward-auth/nope", &[]);
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.body.contains("unknown domain `nope`"), "{r:?}");
    // Values obey /v1/check's limits: an oversized API key is a 400, not a new counter.
    let long = "k".repeat(2000);
    let r = get(
        "127.0.6.2",
        tg,
        "/v1/forward-auth/web",
        &[("X-Api-Key", &long)],
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("value_too_long"), "{r:?}");
    // A bad deny_status.
    let r = get("127.0.6.3", tg, "/v1/forward-auth/web?deny_status=200", &[]);
    assert_eq!(r.status, 400, "{r:?}");
    // The denial status nginx needs.
    let r = get("127.0.6.1", tg, "/v1/forward-auth/web?deny_status=403", &[]);
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
}

#[test]
fn shipped_example_rules_are_valid() {
    for dir in ["examples/nginx", "examples/caddy", "examples/traefik"] {
        let path = Path::new(dir).join("rules.yaml");
        let out = tollgate(&["validate", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn validate_reports_http_section_errors_with_lines() {
    let dir = temp_dir("gw-validate");
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "domain: web\nhttp:\n  - actions: [{remote_adress: {}}]\n  - actions: [{masked_remote_address: {v4_prefix_mask_len: 40}}]\n  - actions: [{header_value_match: {descriptor_value: x, headers: [{name: a, safe_regex_match: {regex: '('}}]}}]\n",
    )
    .unwrap();
    let out = tollgate(&["validate", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let f = file.display();
    assert!(
        err.contains(&format!("{f}:3:16: unknown action `remote_adress`")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{f}:4:60: `v4_prefix_mask_len` is too large")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{f}:5:")) && err.contains("invalid `regex`"),
        "{err}"
    );
}

#[test]
fn trusted_proxies_from_the_environment_and_bad_blocks() {
    let dir = temp_dir("gw-env");
    std::fs::write(dir.join("web.yaml"), RULES).unwrap();
    let args = [
        "--rules",
        "web.yaml",
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
    ];
    // Trusted through the variable: X-Forwarded-For is believed.
    let server = Server::start_env(
        &args,
        &[("TOLLGATE_TRUSTED_PROXIES", "10.0.0.0/8,127.0.0.1")],
        &dir,
        "gw-env",
    );
    let port: u16 = server.base.rsplit(':').next().unwrap().parse().unwrap();
    for _ in 0..3 {
        let r = get(
            "127.0.0.1",
            port,
            "/v1/forward-auth/web",
            &[("X-Forwarded-For", "192.0.2.50")],
        );
        assert_eq!(r.status, 200, "{r:?}");
    }
    let r = get(
        "127.0.0.1",
        port,
        "/v1/forward-auth/web",
        &[("X-Forwarded-For", "192.0.2.50")],
    );
    assert_eq!(r.status, 429, "{r:?}");
    let r = get(
        "127.0.0.1",
        port,
        "/v1/forward-auth/web",
        &[("X-Forwarded-For", "192.0.2.51")],
    );
    assert_eq!(r.status, 200, "{r:?}");
    drop(server);
    // An empty variable trusts nobody; a bad block is refused at start.
    let server = Server::start_env(
        &args,
        &[("TOLLGATE_TRUSTED_PROXIES", "")],
        &dir,
        "gw-env-empty",
    );
    drop(server);
    let out = tollgate(&[
        "serve",
        "--trusted-proxies",
        "10.0.0.0/33",
        "--rules",
        "examples/nginx/rules.yaml",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid address block `10.0.0.0/33`"));
}

#[test]
fn bench_drives_forward_auth() {
    let (_tollgate, tg) = tollgate_with("gw-bench", RULES);
    let target = format!("http://127.0.0.1:{tg}/v1/forward-auth/web");
    let out = tollgate(&[
        "bench",
        &target,
        "--header",
        "X-Api-Key: k{key}",
        "--keys",
        "5",
        "--duration",
        "1s",
        "--concurrency",
        "4",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(n("errors"), 0, "{r}");
    assert_eq!(n("allowed") + n("denied"), n("requests"), "{r}");
    // Every request comes from 127.0.0.1 (3 per hour): exactly 3 allowed, whatever the keys.
    assert_eq!(n("allowed"), 3, "{r}");
    assert!(n("denied") > 0, "{r}");
}
