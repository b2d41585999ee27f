//! What a client must not be able to do through the shipped gateway configurations, from
//! outside (the real binary, real nginx and Caddy from `examples/`, a tiny upstream):
//! - choose its own tier: the gateways set `X-Plan` from their own table and replace whatever
//!   the client sent, and `tollgate validate` warns when a tier comes from a header the client
//!   writes;
//! - tell a shadowban's fake success from a real success: the two answers differ only in the
//!   body the operator configured, and `?shadowban_delay=` holds the fake one as long as asked;
//! - escape every limit by leaving out the tier header: a request without it is in the lowest
//!   level (docs/rules.md's queue example, served as written).
//!
//! Limits are per hour: nothing refills during a test.

mod support;

use std::time::{Duration, Instant};
use support::gateway::{get, Gateway, Resp, Upstream};
use support::{temp_dir, tollgate, Server};

/// One tiered limit, for every request: paid may reach 90, free (and anyone unlisted) 20. The
/// tier's ceiling is the `X-RateLimit-Limit` of the answer: it shows which tier tollgate saw.
const TIER_RULES: &str = r#"domain: web
http:
  - actions:
      - generic_key: {descriptor_value: api}
      - request_headers: {header_name: x-plan, descriptor_key: plan}
descriptors:
  - key: generic_key
    value: api
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
    tiers:
      key: plan
      levels:
        - {value: paid, guaranteed: 60, ceiling: 90}
        - {value: free, guaranteed: 10, ceiling: 20}
"#;

/// 3 per hour per client address; a shadowban of 1 per hour per `X-Abuser` value.
const BAN_RULES: &str = r#"domain: web
http:
  - actions: [{remote_address: {}}]
  - actions: [{request_headers: {header_name: x-abuser, descriptor_key: abuser}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
  - key: abuser
    shadowban: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
"#;

/// `tollgate serve` with `rules`, trusting the gateway on 127.0.0.1 (clients come from other
/// loopback addresses).
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
            "off",
            "--trusted-proxies",
            "127.0.0.1/32",
        ],
        &dir,
        name,
    );
    let port = server.base.rsplit(':').next().unwrap().parse().unwrap();
    (server, port)
}

/// The commented table entry of the shipped configs, made a real one: API key `k-paid` is on
/// the paid plan.
fn nginx_plan_table(c: String) -> String {
    let line = r#"# "an-api-key-of-a-paying-customer" paid;"#;
    assert!(c.contains(line), "the plan table's example line moved");
    c.replace(line, r#""k-paid" paid;"#)
}

fn caddy_plan_table(c: String) -> String {
    let line = "# an-api-key-of-a-paying-customer paid";
    assert!(c.contains(line), "the plan table's example line moved");
    c.replace(line, "k-paid paid")
}

/// The tier tollgate saw, through a gateway: the tier's ceiling, as the client (nginx) or the
/// upstream (Caddy copies the headers to the API only) got it.
fn seen_limit(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{r:?}");
    if let Some(l) = r.header("x-ratelimit-limit") {
        return l.to_string();
    }
    r.body
        .lines()
        .find_map(|l| l.strip_prefix("x-ratelimit-limit: "))
        .unwrap_or_else(|| panic!("no limit header: {r:?}"))
        .trim()
        .to_string()
}

/// A client's `X-Plan` never reaches tollgate (nor the API): only the gateway's table decides.
fn the_client_cannot_choose_its_tier(port: u16, ip: &dyn Fn(u8) -> String) {
    let forged = get(&ip(1), port, "/items", &[("X-Plan", "paid")]);
    assert_eq!(
        seen_limit(&forged),
        "20",
        "a forged X-Plan got the paid tier"
    );
    assert!(
        !forged.body.contains("x-plan: paid"),
        "the API got the client's X-Plan: {forged:?}"
    );
    let none = get(&ip(2), port, "/items", &[]);
    assert_eq!(seen_limit(&none), "20", "no plan: the lowest tier");
    let paid = get(&ip(3), port, "/items", &[("X-Api-Key", "k-paid")]);
    assert_eq!(seen_limit(&paid), "90", "the table's paid key");
    assert!(paid.body.contains("x-plan: paid"), "{paid:?}");
    // The table wins over what the key holder claims.
    let both = get(
        &ip(4),
        port,
        "/items",
        &[("X-Api-Key", "k-paid"), ("X-Plan", "free")],
    );
    assert_eq!(seen_limit(&both), "90");
    let unknown = get(
        &ip(5),
        port,
        "/items",
        &[("X-Api-Key", "k-stolen?"), ("X-Plan", "paid")],
    );
    assert_eq!(seen_limit(&unknown), "20");
}

#[test]
fn nginx_replaces_a_client_sent_x_plan() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("trust-plan-nginx", TIER_RULES);
    let nginx = Gateway::nginx("trust-plan-ngx", tg, upstream.port, nginx_plan_table);
    the_client_cannot_choose_its_tier(nginx.port, &|n| format!("127.0.21.{n}"));
}

#[test]
fn caddy_replaces_a_client_sent_x_plan() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("trust-plan-caddy", TIER_RULES);
    let caddy = Gateway::caddy_with("trust-plan-cad", tg, upstream.port, caddy_plan_table);
    the_client_cannot_choose_its_tier(caddy.port, &|n| format!("127.0.22.{n}"));
}

/// The shipped fake success answers with the API's content type (the operator's choice; the
/// test's API answers text/plain).
fn nginx_fake_like_the_api(c: String) -> String {
    let c = nginx_plan_table(c);
    let line = "default_type application/json;\n            return 200";
    assert!(c.contains(line), "the fake success moved");
    c.replace(line, "default_type text/plain;\n            return 200")
}

fn caddy_fake_like_the_api(c: String) -> String {
    let line = "header Content-Type application/json";
    assert!(c.contains(line), "the fake success moved");
    c.replace(line, "header Content-Type text/plain")
}

/// The headers of an answer a client can compare, without those that differ between any two
/// answers (`Date`) or follow from the body (`Content-Length`).
fn comparable(r: &Resp) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = r
        .headers
        .iter()
        .filter(|(k, _)| k != "date" && k != "content-length")
        .cloned()
        .collect();
    h.sort();
    h
}

/// A real success and a shadowbanned client's fake one, each the first request of its client
/// address: the same status and headers; only the body differs. Returns the two answers'
/// times (real, fake).
fn fake_success_looks_real(
    upstream: &Upstream,
    port: u16,
    ip: &dyn Fn(u8) -> String,
) -> (Duration, Duration) {
    let started = Instant::now();
    let real = get(&ip(1), port, "/items?banned", &[("X-Abuser", "a1")]);
    let real_time = started.elapsed();
    assert_eq!(real.status, 200, "{real:?}");
    assert!(real.body.starts_with("upstream saw:"), "{real:?}");
    let started = Instant::now();
    let fake = get(&ip(2), port, "/items?banned", &[("X-Abuser", "a1")]);
    let fake_time = started.elapsed();
    assert_eq!(fake.status, 200, "{fake:?}");
    assert!(!fake.body.starts_with("upstream saw:"), "{fake:?}");
    assert_eq!(
        upstream.saw("/items?banned"),
        1,
        "the banned request went through"
    );
    assert_eq!(
        comparable(&real),
        comparable(&fake),
        "a client can tell the fake success:\nreal {real:?}\nfake {fake:?}"
    );
    // And the shadowban rule is never advertised: the headers are the per-address limit's.
    if let Some(policy) = real.header("ratelimit-policy") {
        assert_eq!(policy, "3;w=3600", "{real:?}");
    }
    // A fake success counts against the client's other limits as a real one does: its
    // address has 2 left, then 1, then 0 and the honest denial of that limit.
    if real.header("x-ratelimit-remaining").is_some() {
        let again = get(&ip(2), port, "/items?banned", &[("X-Abuser", "a1")]);
        assert_eq!(
            again.header("x-ratelimit-remaining"),
            Some("1"),
            "{again:?}"
        );
        get(&ip(2), port, "/items?banned", &[("X-Abuser", "a1")]);
        let over = get(&ip(2), port, "/items?banned", &[("X-Abuser", "a1")]);
        assert_eq!(over.status, 429, "{over:?}");
        assert_eq!(upstream.saw("/items?banned"), 1);
    }
    (real_time, fake_time)
}

#[test]
fn nginx_fake_success_differs_from_a_real_one_only_in_its_body() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("trust-ban-nginx", BAN_RULES);
    let nginx = Gateway::nginx("trust-ban-ngx", tg, upstream.port, nginx_fake_like_the_api);
    let (real, fake) = fake_success_looks_real(&upstream, nginx.port, &|n| format!("127.0.23.{n}"));
    eprintln!("nginx: real success {real:?}, fake success {fake:?} (no delay)");
}

#[test]
fn caddy_fake_success_differs_from_a_real_one_only_in_its_body() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("trust-ban-caddy", BAN_RULES);
    let caddy = Gateway::caddy_with("trust-ban-cad", tg, upstream.port, caddy_fake_like_the_api);
    let (real, fake) = fake_success_looks_real(&upstream, caddy.port, &|n| format!("127.0.24.{n}"));
    eprintln!("caddy: real success {real:?}, fake success {fake:?} (no delay)");
}

/// `?shadowban_delay=` holds the fake success at least as long as asked (a lower bound the
/// sleep guarantees, not a timing threshold), and only the fake one.
#[test]
fn nginx_fake_success_waits_for_the_configured_delay() {
    let upstream = Upstream::start();
    let (_tollgate, tg) = tollgate_with("trust-delay-nginx", BAN_RULES);
    let nginx = Gateway::nginx("trust-delay-ngx", tg, upstream.port, |c| {
        let c = nginx_fake_like_the_api(c);
        let url = "/v1/forward-auth/web?deny_status=403;";
        assert!(c.contains(url), "the forward-auth URL moved");
        c.replace(
            url,
            "/v1/forward-auth/web?deny_status=403&shadowban_delay=300ms-400ms;",
        )
    });
    let (real, fake) = fake_success_looks_real(&upstream, nginx.port, &|n| format!("127.0.25.{n}"));
    eprintln!("nginx, shadowban_delay=300ms-400ms: real success {real:?}, fake success {fake:?}");
    assert!(fake >= Duration::from_millis(300), "{fake:?}");
    // A bad value is refused (the gateway then answers its failure answer).
    let r = get(
        "127.0.0.1",
        tg,
        "/v1/forward-auth/web?shadowban_delay=11s",
        &[],
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("invalid_shadowban_delay"), "{r:?}");
}

/// docs/rules.md's queue example, served as written: a request without the tier header is
/// limited, in the lowest level (before: 200 without any rate-limit header, no limit at all).
#[test]
fn the_documented_queue_example_limits_a_request_without_the_tier_header() {
    let page = std::fs::read_to_string(support::repo().join("docs/rules.md")).unwrap();
    let at = page
        .find("<!-- queue example -->")
        .expect("the queue example's marker in docs/rules.md");
    let block = page[at..]
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(yaml, _)| yaml)
        .expect("a yaml block after the marker");
    assert!(block.contains("descriptor_key: plan"), "{block}");
    let (_tollgate, tg) = tollgate_with("trust-doc-queue", block);
    let fa = "/v1/forward-auth/api";
    let ask = |headers: &[(&str, &str)]| {
        let r = get("127.0.0.1", tg, fa, headers);
        assert_eq!(r.status, 200, "{r:?}");
        let remaining: u64 = r
            .header("x-ratelimit-remaining")
            .unwrap_or_else(|| panic!("no limit applied: {r:?}"))
            .parse()
            .unwrap();
        (r.header("x-ratelimit-limit").map(str::to_string), remaining)
    };
    // The lowest level (free: guarantee 10, borrows while paid's 60 stay free) can never have
    // more than 100 - 60 - 1 = 39 left after a request; paid starts at 89 in a fresh window.
    let (limit, remaining) = ask(&[]);
    assert_eq!(limit.as_deref(), Some("100"));
    assert!(remaining <= 39, "not in the lowest level: {remaining}");
    let (_, remaining) = ask(&[("X-Plan", "gold")]);
    assert!(remaining <= 39, "an unlisted tier: {remaining}");
}

fn validate(name: &str, yaml: &str) -> (bool, String, String) {
    let dir = temp_dir(name);
    let file = dir.join("t.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = tollgate(&["validate", file.to_str().unwrap()]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn validate_warns_when_a_tier_comes_from_a_header_the_client_sends() {
    let forgeable = TIER_RULES.replace("header_name: x-plan", "header_name: x-tier");
    let (ok, _, err) = validate("trust-validate-warn", &forgeable);
    assert!(ok, "a warning, not an error: {err}");
    assert!(
        err.contains("warning:")
            && err.contains("request header `x-tier`")
            && err.contains("a client can choose its own tier"),
        "{err}"
    );
    let query = TIER_RULES.replace(
        "request_headers: {header_name: x-plan, descriptor_key: plan}",
        "query_parameters: {query_parameter_name: plan, descriptor_key: plan}",
    );
    let (ok, _, err) = validate("trust-validate-query", &query);
    assert!(ok && err.contains("query parameter `plan`"), "{err}");
    // The header the shipped gateways set themselves: no warning.
    let (ok, _, err) = validate("trust-validate-quiet", TIER_RULES);
    assert!(ok && !err.contains("warning"), "{err}");
}

#[test]
fn validate_reports_every_tier_error_and_refuses_the_rules_own_key() {
    // A first-level reserve and a duplicate tier value: both reported.
    let yaml = "domain: d\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}\n    tiers:\n      key: plan\n      levels:\n        - {value: paid, guaranteed: 10, reserve: 5}\n        - {value: free, guaranteed: 1}\n        - {value: free, guaranteed: 1}\n";
    let (ok, _, err) = validate("trust-validate-all", yaml);
    assert!(!ok);
    assert!(
        err.contains("t.yaml:8:") && err.contains("first (highest priority) level"),
        "{err}"
    );
    assert!(
        err.contains("t.yaml:10:") && err.contains("duplicate tier value `free`"),
        "{err}"
    );
    assert!(err.contains("2 error(s)"), "{err}");
    // `tiers.key` equal to the tiered descriptor's own key.
    let yaml = "domain: d\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}\n    tiers: {key: api, levels: [{value: paid, guaranteed: 10}]}\n";
    let (ok, _, err) = validate("trust-validate-own-key", yaml);
    assert!(!ok, "{err}");
    assert!(
        err.contains("t.yaml:5:") && err.contains("is the tiered descriptor's own key"),
        "{err}"
    );
}
