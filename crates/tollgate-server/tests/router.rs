//! The HTTP API through `router(state)` with `oneshot`: no sockets, a manual clock.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::rules::RuleSet;
use tollgate_core::ManualClock;
use tollgate_server::{router, AppState, LoadedRules};
use tollgate_testsupport::temp_dir;
use tower::ServiceExt;

/// 2023-11-14T22:14:00Z: a whole minute (and second) in µs.
const MINUTE_START: u64 = 1_700_000_040_000_000;
/// 40 s into that minute.
const T0: u64 = MINUTE_START + 40_000_000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct App {
    router: Router,
    state: AppState,
    clock: Arc<ManualClock>,
}

fn app_with(set: RuleSet) -> App {
    let clock = Arc::new(ManualClock::new(T0));
    let state = AppState::builder(LoadedRules::inline(set))
        .clock(clock.clone())
        .build();
    App {
        router: router(state.clone()),
        state,
        clock,
    }
}

fn app(yaml: &str) -> App {
    let set = RuleSet::from_sources(&[("t.yaml".to_string(), yaml.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    app_with(set)
}

fn app_dir(path: &Path) -> App {
    app_with(RuleSet::load(path).unwrap_or_else(|e| panic!("{e}")))
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn call(app: &App, req: Request<Body>) -> Resp {
    send(app.router.clone(), req).await
}

/// One request through any service shaped like the API (`router`, or `HttpApi::service`).
async fn send<S>(svc: S, req: Request<Body>) -> Resp
where
    S: tower::Service<
        Request<Body>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
    >,
{
    let resp = svc.oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        body,
        text,
    }
}

async fn post_raw(app: &App, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Resp {
    let mut b = Request::post(path);
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    call(app, b.body(Body::from(body)).unwrap()).await
}

async fn post(app: &App, path: &str, body: Value) -> Resp {
    post_raw(
        app,
        path,
        Some("application/json"),
        body.to_string().into_bytes(),
    )
    .await
}

async fn get(app: &App, path: &str) -> Resp {
    call(app, Request::get(path).body(Body::empty()).unwrap()).await
}

fn req(domain: &str, descriptors: &[&[(&str, &str)]]) -> Value {
    json!({
        "domain": domain,
        "descriptors": descriptors.iter().map(|d| json!({
            "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()
        })).collect::<Vec<_>>()
    })
}

async fn check(app: &App, domain: &str, descriptors: &[&[(&str, &str)]]) -> Resp {
    post(app, "/v1/check", req(domain, descriptors)).await
}

const THREE: &str = "domain: d
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
    message: slow down
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
  - key: swl
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: gcra}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100}
";

#[tokio::test]
async fn three_per_minute_ok_ok_ok_over_limit() {
    // (key, expected Retry-After seconds on the 4th request at 40 s into the minute).
    // Fixed window: the window ends 20 s later. Token bucket and GCRA: one token per 20 s, the
    // next one 20 s away. Sliding log: the first request leaves the window 60 s after it.
    for (key, retry_s) in [("fw", 20), ("tb", 20), ("gcra", 20), ("swl", 60)] {
        let app = app(THREE);
        for (i, remaining) in [2u64, 1, 0].into_iter().enumerate() {
            let r = check(&app, "d", &[&[(key, "alice")]]).await;
            assert_eq!(r.status, StatusCode::OK, "{key} #{i}: {}", r.text);
            assert_eq!(r.body["overall_code"], "OK");
            let s = &r.body["statuses"][0];
            assert_eq!(s["code"], "OK");
            assert_eq!(s["limit_remaining"], remaining, "{key} #{i}");
            assert_eq!(s["current_limit"]["requests_per_unit"], 3);
            assert_eq!(s["current_limit"]["unit"], "MINUTE");
            assert!(s["retry_after_ms"].is_null());
            assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
            assert_eq!(
                r.header("x-ratelimit-remaining"),
                Some(&*remaining.to_string())
            );
            assert_eq!(r.header("ratelimit-policy"), Some("3;w=60"));
            assert!(r.header("retry-after").is_none());
        }
        let r = check(&app, "d", &[&[(key, "alice")]]).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{key}: {}", r.text);
        assert_eq!(r.body["overall_code"], "OVER_LIMIT");
        let s = &r.body["statuses"][0];
        assert_eq!(s["code"], "OVER_LIMIT");
        assert_eq!(s["limit_remaining"], 0);
        assert_eq!(s["retry_after_ms"], retry_s * 1000, "{key}");
        assert_eq!(
            r.header("retry-after"),
            Some(&*retry_s.to_string()),
            "{key}"
        );
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
        let rl = r.header("ratelimit").unwrap();
        assert!(rl.starts_with("limit=3, remaining=0, reset="), "{rl}");
        if key == "fw" {
            assert_eq!(s["message"], "slow down");
            assert_eq!(r.header("x-ratelimit-reset"), Some("20"));
            assert_eq!(s["duration_until_reset_ms"], 20_000);
        } else {
            assert!(s["message"].is_null());
        }
        // Another user is unaffected; time heals.
        let other = check(&app, "d", &[&[(key, "bob")]]).await;
        assert_eq!(other.status, StatusCode::OK);
        app.clock.advance(Duration::from_secs(retry_s));
        let again = check(&app, "d", &[&[(key, "alice")]]).await;
        assert_eq!(
            again.status,
            StatusCode::OK,
            "{key} after waiting: {}",
            again.text
        );
    }
}

#[tokio::test]
async fn cost_above_limit_has_no_retry_after_and_says_why() {
    let app = app(THREE);
    let mut body = req("d", &[&[("fw", "x")]]);
    body["hits_addend"] = json!(4);
    let r = post(&app, "/v1/check", body).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header("retry-after").is_none());
    let s = &r.body["statuses"][0];
    assert!(s["retry_after_ms"].is_null());
    let msg = s["message"].as_str().unwrap();
    assert!(
        msg.starts_with("slow down: request cost 4 exceeds"),
        "{msg}"
    );
    assert!(msg.contains("retrying will not help"), "{msg}");
    // Nothing was consumed.
    let r = check(&app, "d", &[&[("fw", "x")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 2);
}

#[tokio::test]
async fn hits_zero_is_a_pure_query_and_per_descriptor_hits() {
    let app = app(THREE);
    let mut body = req("d", &[&[("fw", "q")]]);
    body["hits_addend"] = json!(0);
    let r = post(&app, "/v1/check", body.clone()).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 3);
    let r = post(&app, "/v1/check", body).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 3);

    // Descriptor 0 costs 3, descriptor 1 the request's 2.
    let body = json!({
        "domain": "d",
        "hits_addend": 2,
        "descriptors": [
            {"entries": [{"key": "fw", "value": "p"}], "hits_addend": 3},
            {"entries": [{"key": "big", "value": "p"}]}
        ]
    });
    let r = post(&app, "/v1/check", body.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 0);
    assert_eq!(r.body["statuses"][1]["limit_remaining"], 98);
    // Headers follow the binding (least remaining) limit.
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    // All-or-nothing: denied by the first, the second consumes nothing.
    let r = post(&app, "/v1/check", body).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(r.body["statuses"][1]["code"], "OK");
    assert_eq!(r.body["statuses"][1]["limit_remaining"], 98);
}

#[tokio::test]
async fn limit_override_on_v1_check_and_json() {
    let app = app(THREE);
    let over = json!({
        "domain": "d",
        "descriptors": [{"entries": [{"key": "fw", "value": "o"}],
                         "limit": {"requests_per_unit": 2, "unit": "hour"}}]
    });
    let r = post(&app, "/v1/check", over.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = &r.body["statuses"][0];
    assert_eq!(s["limit_remaining"], 1);
    assert_eq!(s["current_limit"]["id"], "d|=override");
    assert_eq!(s["current_limit"]["requests_per_unit"], 2);
    assert_eq!(s["current_limit"]["unit"], "HOUR");
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    // Envoy's protojson spelling on /json shares the counter (same descriptor, same quota).
    let json_over = json!({
        "domain": "d",
        "descriptors": [{"entries": [{"key": "fw", "value": "o"}],
                         "limit": {"requestsPerUnit": 2, "unit": "HOUR"}}]
    });
    let r = post(&app, "/json", json_over).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = post(&app, "/v1/check", over).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    // The rule's own counter (3/minute) was not consumed.
    let r = check(&app, "d", &[&[("fw", "o")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 2);
    // Unknown domain: still no limit.
    let r = post(
        &app,
        "/v1/check",
        json!({"domain": "zz", "descriptors": [{"entries": [{"key": "k", "value": "v"}],
               "limit": {"requests_per_unit": 0, "unit": "second"}}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["statuses"][0]["current_limit"], Value::Null);
}

#[tokio::test]
async fn example_rules_nested_unlimited_shadow_and_unmatched() {
    let app = app_dir(&repo().join("examples/rules"));
    // Nested: [path=/login, ip=...] is limited 5/minute; [path=/login] alone matches nothing.
    for remaining in [4, 3, 2, 1, 0] {
        let r = check(&app, "api", &[&[("path", "/login"), ("ip", "1.2.3.4")]]).await;
        assert_eq!(r.body["statuses"][0]["limit_remaining"], remaining);
    }
    let r = check(&app, "api", &[&[("path", "/login"), ("ip", "1.2.3.4")]]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body["statuses"][0]["message"], "too many login attempts");
    assert_eq!(
        r.body["statuses"][0]["current_limit"]["algorithm"],
        "sliding_window_log"
    );
    let r = check(&app, "api", &[&[("path", "/login")]]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body["statuses"][0]["current_limit"].is_null());
    assert!(r.header("x-ratelimit-limit").is_none());

    // Unlimited: no limit reported, remaining u32::MAX as Envoy does.
    let r = check(&app, "api", &[&[("client", "internal-batch")]]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body["statuses"][0]["current_limit"].is_null());
    assert_eq!(r.body["statuses"][0]["limit_remaining"], u32::MAX);

    // Shadow mode: over the limit, answered OK, counted.
    let mut body = req("api", &[&[("tenant", "t1")]]);
    body["hits_addend"] = json!(60);
    let r = post(&app, "/v1/check", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["statuses"][0]["code"], "OK");
    assert_eq!(r.body["statuses"][0]["shadow_mode"], true);
    assert!(r.header("retry-after").is_none());

    // Unknown domain: OK with no limit.
    let r = check(&app, "nope", &[&[("user", "alice")]]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body["statuses"][0]["current_limit"].is_null());

    let m = get(&app, "/metrics").await;
    assert_eq!(m.status, StatusCode::OK);
    assert!(
        m.text
            .contains("tollgate_shadow_mode{domain=\"api\",rule=\"api.tenant\"} 60"),
        "{}",
        m.text
    );
    assert!(m
        .text
        .contains("tollgate_over_limit{domain=\"api\",rule=\"api.path_/login.ip\"} 1"));
    assert!(m
        .text
        .contains("tollgate_within_limit{domain=\"api\",rule=\"api.path_/login.ip\"} 5"));
    assert!(m
        .text
        .contains("tollgate_near_limit{domain=\"api\",rule=\"api.path_/login.ip\"} 1"));
    assert!(m
        .text
        .contains("tollgate_unmatched_total{domain=\"nope\",reason=\"unknown_domain\"} 1"));
    assert!(m
        .text
        .contains("tollgate_unmatched_total{domain=\"api\",reason=\"no_rule\"} 1"));
    // Raw values never appear in labels without detailed_metric.
    assert!(!m.text.contains("1.2.3.4"));
    assert!(!m.text.contains("t1"));
}

#[tokio::test]
async fn envoy_readme_examples_as_served_decisions() {
    let app = app_dir(&repo().join("crates/tollgate-core/tests/fixtures/rules/good"));
    let limit = |r: &Resp, i: usize| {
        let l = &r.body["statuses"][i]["current_limit"];
        (
            l["requests_per_unit"].as_u64(),
            l["unit"].as_str().map(String::from),
        )
    };
    // Example 1.
    let r = check(&app, "mongo_cps", &[&[("database", "users")]]).await;
    assert_eq!(limit(&r, 0), (Some(500), Some("SECOND".into())));
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 499);
    let r = check(&app, "mongo_cps", &[&[("database", "other")]]).await;
    assert!(r.body["statuses"][0]["current_limit"].is_null());
    // Example 2: marketing to a number 5/day; any message to a number 100/day.
    let r = check(
        &app,
        "messaging",
        &[
            &[("message_type", "marketing"), ("to_number", "2061234567")],
            &[("to_number", "2061234567")],
        ],
    )
    .await;
    assert_eq!(limit(&r, 0), (Some(5), Some("DAY".into())));
    assert_eq!(limit(&r, 1), (Some(100), Some("DAY".into())));
    // Example 3: 10/s per IP, a blacklisted IP 0/s (never passes: no Retry-After).
    let r = check(
        &app,
        "edge_proxy_per_ip",
        &[&[("remote_address", "10.0.0.1")]],
    )
    .await;
    assert_eq!(limit(&r, 0), (Some(10), Some("SECOND".into())));
    let r = check(
        &app,
        "edge_proxy_per_ip",
        &[&[("remote_address", "50.0.0.5")]],
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header("retry-after").is_none());
    assert!(r.body["statuses"][0]["message"]
        .as_str()
        .unwrap()
        .contains("retrying will not help"));
    // Example 4: the two-level config matches a two-entry descriptor; the one-level does not.
    let two: &[(&str, &str)] = &[("key", "value"), ("subkey", "subvalue")];
    let r = check(&app, "example4a", &[two]).await;
    assert!(r.body["statuses"][0]["current_limit"].is_null());
    let r = check(&app, "example4", &[two]).await;
    assert_eq!(limit(&r, 0), (Some(300), Some("SECOND".into())));
    // Example 5: ldap unlimited, azure 100/minute.
    let r = check(&app, "internal", &[&[("ldap", "x")], &[("azure", "y")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], u32::MAX);
    assert_eq!(limit(&r, 1), (Some(100), Some("MINUTE".into())));
    // Example 6: user-a is in shadow mode (10/s, never blocked); user-b 20/s.
    for _ in 0..12 {
        let r = check(&app, "example6", &[&[("service", "s"), ("user", "user-a")]]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let r = check(&app, "example6", &[&[("service", "s"), ("user", "user-b")]]).await;
    assert_eq!(limit(&r, 0), (Some(20), Some("SECOND".into())));
    // Example 7: the 10/s limit replaces the 5/s one when both match.
    let both: &[&[(&str, &str)]] = &[
        &[("key_1", "value_1"), ("user", "bkthomps")],
        &[("key_2", "value_2"), ("user", "bkthomps")],
    ];
    for i in 0..10 {
        let r = check(&app, "example7", both).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text);
        assert!(r.body["statuses"][0]["current_limit"].is_null());
        assert_eq!(limit(&r, 1), (Some(10), Some("SECOND".into())));
    }
    assert_eq!(
        check(&app, "example7", both).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Alone, the specific limit applies.
    let r = check(&app, "example7", &[both[0]]).await;
    assert_eq!(limit(&r, 0), (Some(5), Some("SECOND".into())));
    // Example 8: detailed_metric labels with the value; value1 has its own 20/minute.
    let r = check(&app, "example8", &[&[("key1", "foo")]]).await;
    assert_eq!(limit(&r, 0), (Some(10), Some("MINUTE".into())));
    let r = check(&app, "example8", &[&[("key1", "value1")]]).await;
    assert_eq!(limit(&r, 0), (Some(20), Some("MINUTE".into())));
    // Example 9: wildcard, a counter per value.
    let r = check(&app, "example9", &[&[("key1", "value_a")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 19);
    let r = check(&app, "example9", &[&[("key1", "value_b")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 19);
    let r = check(&app, "example9", &[&[("key1", "other")]]).await;
    assert!(r.body["statuses"][0]["current_limit"].is_null());

    let m = get(&app, "/metrics").await.text;
    assert!(m.contains("tollgate_total_hits{domain=\"example8\",rule=\"example8.key1_foo\"} 1"));
    assert!(m.contains(
        "tollgate_shadow_mode{domain=\"example6\",rule=\"example6.service.user_user-a\"} 2"
    ));
}

/// (name, content type, body, expected status, expected error code).
type Case = (
    &'static str,
    Option<&'static str>,
    Vec<u8>,
    u16,
    &'static str,
);

#[tokio::test]
async fn malformed_requests_get_status_and_code() {
    let app = app(THREE);
    let d = |n: usize| {
        (0..n)
            .map(|i| json!({"entries": [{"key": "k", "value": i.to_string()}]}))
            .collect::<Vec<_>>()
    };
    let entries = |n: usize| {
        (0..n)
            .map(|i| json!({"key": format!("k{i}"), "value": "v"}))
            .collect::<Vec<_>>()
    };
    let long = |n: usize| "x".repeat(n);
    let ok_desc = json!([{"entries": [{"key": "fw", "value": "a"}]}]);
    let cases: Vec<Case> = vec![
        ("not json", Some("application/json"), b"{".to_vec(), 400, "invalid_json"),
        ("empty body", Some("application/json"), b"".to_vec(), 400, "invalid_json"),
        ("text/plain", Some("text/plain"), b"{}".to_vec(), 415, "unsupported_media_type"),
        ("form", Some("application/x-www-form-urlencoded"), b"{}".to_vec(), 415, "unsupported_media_type"),
        ("too large", Some("application/json"), vec![b' '; 64 * 1024 + 1], 413, "payload_too_large"),
        ("array", None, b"[]".to_vec(), 400, "invalid_request"),
        ("no domain", None, json!({"descriptors": ok_desc}).to_string().into(), 400, "invalid_domain"),
        ("empty domain", None, json!({"domain": "", "descriptors": ok_desc}).to_string().into(), 400, "invalid_domain"),
        ("long domain", None, json!({"domain": long(257), "descriptors": ok_desc}).to_string().into(), 400, "invalid_domain"),
        ("domain number", None, json!({"domain": 5, "descriptors": ok_desc}).to_string().into(), 400, "invalid_request"),
        ("no descriptors", None, json!({"domain": "d"}).to_string().into(), 400, "no_descriptors"),
        ("descriptors object", None, json!({"domain": "d", "descriptors": {}}).to_string().into(), 400, "invalid_request"),
        ("65 descriptors", None, json!({"domain": "d", "descriptors": d(65)}).to_string().into(), 400, "too_many_descriptors"),
        ("17 entries", None, json!({"domain": "d", "descriptors": [{"entries": entries(17)}]}).to_string().into(), 400, "too_many_entries"),
        ("no entries", None, json!({"domain": "d", "descriptors": [{"entries": []}]}).to_string().into(), 400, "invalid_descriptor"),
        ("missing key", None, json!({"domain": "d", "descriptors": [{"entries": [{"value": "v"}]}]}).to_string().into(), 400, "invalid_entry"),
        ("empty key", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "", "value": "v"}]}]}).to_string().into(), 400, "invalid_entry"),
        ("long key", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": long(257), "value": "v"}]}]}).to_string().into(), 400, "key_too_long"),
        ("long value", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": long(1025)}]}]}).to_string().into(), 400, "value_too_long"),
        ("value number", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": 1}]}]}).to_string().into(), 400, "invalid_request"),
        ("negative hits", None, json!({"domain": "d", "descriptors": ok_desc, "hits_addend": -1}).to_string().into(), 400, "invalid_hits"),
        ("fractional hits", None, json!({"domain": "d", "descriptors": ok_desc, "hits_addend": 1.5}).to_string().into(), 400, "invalid_hits"),
        ("string hits", None, json!({"domain": "d", "descriptors": ok_desc, "hits_addend": "1"}).to_string().into(), 400, "invalid_hits"),
        ("huge hits", None, json!({"domain": "d", "descriptors": ok_desc, "hits_addend": 1u64 << 40}).to_string().into(), 400, "invalid_hits"),
        ("limit not object", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "limit": 5}]}).to_string().into(), 400, "invalid_limit"),
        ("limit without unit", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "limit": {"requests_per_unit": 5}}]}).to_string().into(), 400, "invalid_limit"),
        ("limit bad unit", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "limit": {"requests_per_unit": 5, "unit": "fortnight"}}]}).to_string().into(), 400, "invalid_limit"),
        ("limit negative", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "limit": {"requests_per_unit": -1, "unit": "second"}}]}).to_string().into(), 400, "invalid_limit"),
        ("limit huge", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "limit": {"requests_per_unit": 1u64 << 33, "unit": "second"}}]}).to_string().into(), 400, "invalid_limit"),
        ("negative descriptor hits", None, json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "hits_addend": -3}]}).to_string().into(), 400, "invalid_hits"),
    ];
    for (name, ct, body, status, code) in cases {
        let r = post_raw(&app, "/v1/check", ct, body).await;
        assert_eq!(r.status.as_u16(), status, "{name}: {}", r.text);
        assert_eq!(r.body["error"]["code"], code, "{name}: {}", r.text);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{name}"
        );
    }
    // Unknown fields are ignored (forward compatibility); a missing content type is accepted.
    let r = post_raw(
        &app,
        "/v1/check",
        None,
        json!({"domain": "d", "descriptors": ok_desc, "future": 1})
            .to_string()
            .into(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Routing errors are JSON too.
    routing_errors_are_json(&app, "/nope").await;
    let m = get(&app, "/metrics").await.text;
    assert!(
        m.contains("tollgate_request_errors_total{code=\"invalid_hits\"} 5"),
        "{m}"
    );
}

/// A key given twice, at any depth, is a 400 `duplicate_key` naming the key, on both check
/// endpoints (a proxy in front may read the first `domain` where a map keeps the last); nothing
/// is counted.
#[tokio::test]
async fn duplicate_keys_are_refused_at_any_depth() {
    let app = app(THREE);
    let cases = [
        (
            r#"{"domain":"nope","domain":"d","descriptors":[{"entries":[{"key":"fw","value":"a"}]}]}"#,
            "domain",
        ),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"fw","value":"a","value":"b"}]}]}"#,
            "value",
        ),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"fw","value":"a"}],"hits_addend":1,"hits_addend":0}]}"#,
            "hits_addend",
        ),
        (
            r#"{"domain":"d","future":1,"future":2,"descriptors":[{"entries":[{"key":"fw","value":"a"}]}]}"#,
            "future",
        ),
        (
            r#"{"domain":"d","x":{"y":[{"z":1,"z":1}]},"descriptors":[{"entries":[{"key":"fw","value":"a"}]}]}"#,
            "z",
        ),
    ];
    for path in ["/v1/check", "/json"] {
        for (body, key) in cases {
            let r = post_raw(&app, path, Some("application/json"), body.into()).await;
            assert_eq!(
                r.status,
                StatusCode::BAD_REQUEST,
                "{path} {body}: {}",
                r.text
            );
            assert_eq!(r.body["error"]["code"], "duplicate_key", "{}", r.text);
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(message.contains(&format!("`{key}`")), "{message}");
        }
    }
    // protojson: one field under its two names is a duplicate on /json only.
    let both = r#"{"domain":"d","descriptors":[{"entries":[{"key":"fw","value":"a"}]}],"hits_addend":1,"hitsAddend":1}"#;
    let r = post_raw(&app, "/json", None, both.into()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.body["error"]["code"], "duplicate_key");
    let r = post_raw(&app, "/v1/check", None, both.into()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Only that request was counted (3 per minute: two more pass).
    for _ in 0..2 {
        assert_eq!(
            check(&app, "d", &[&[("fw", "a")]]).await.status,
            StatusCode::OK
        );
    }
    let r = check(&app, "d", &[&[("fw", "a")]]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
}

/// Domain, key and value lengths are in characters, as the OpenAPI document's `maxLength`
/// counts them: 256 two-byte characters pass (512 bytes), 257 do not.
#[tokio::test]
async fn lengths_are_counted_in_characters() {
    let app = app(THREE);
    let s = |n: usize| "é".repeat(n);
    let body = |domain: String, key: String, value: String| json!({"domain": domain, "descriptors": [{"entries": [{"key": key, "value": value}]}]});
    for path in ["/v1/check", "/json"] {
        let r = post(&app, path, body(s(256), s(256), s(1024))).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        for (b, code) in [
            (body(s(257), s(1), s(1)), "invalid_domain"),
            (body(s(1), s(257), s(1)), "key_too_long"),
            (body(s(1), s(1), s(1025)), "value_too_long"),
        ] {
            let r = post(&app, path, b).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
            assert_eq!(r.body["error"]["code"], code);
            assert!(r.text.contains("characters"), "{}", r.text);
        }
    }
}

#[tokio::test]
async fn envoy_json_endpoint_matches_v1_check() {
    let native = app(THREE);
    let envoy = app(THREE);
    for i in 0..5 {
        let a = post(
            &native,
            "/v1/check",
            req("d", &[&[("fw", "x")], &[("nothing", "y")]]),
        )
        .await;
        let b = post_raw(
            &envoy,
            "/json",
            // envoyproxy/ratelimit's clients send `curl --data` (form type): accepted.
            Some("application/x-www-form-urlencoded"),
            json!({"domain": "d", "descriptors": [
                {"entries": [{"key": "fw", "value": "x"}]},
                {"entries": [{"key": "nothing", "value": "y"}]}
            ]})
            .to_string()
            .into(),
        )
        .await;
        assert_eq!(a.status, b.status, "request {i}: {} / {}", a.text, b.text);
        assert_eq!(a.body["overall_code"], b.body["overallCode"]);
        let (sa, sb) = (&a.body["statuses"][0], &b.body["statuses"][0]);
        assert_eq!(sa["code"], sb["code"]);
        assert_eq!(
            sa["current_limit"]["requests_per_unit"],
            sb["currentLimit"]["requestsPerUnit"]
        );
        assert_eq!(sa["current_limit"]["unit"], sb["currentLimit"]["unit"]);
        // protojson omits zero values.
        let remaining = sa["limit_remaining"].as_u64().unwrap();
        assert_eq!(
            sb.get("limitRemaining")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            remaining
        );
        assert_eq!(sb["durationUntilReset"], "20s");
        assert_eq!(b.body["statuses"][1], json!({"code": "OK"}));
    }
    // snake_case names, string hits (uint64 as protojson string), hitsAddend 0 means 1.
    let r = post(
        &envoy,
        "/json",
        json!({"domain": "d", "hits_addend": 0, "descriptors": [{"entries": [{"key": "big", "value": "z"}], "hits_addend": "7"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["statuses"][0]["limitRemaining"], 93);
    let r = post(&envoy, "/json", json!({"domain": "d", "hitsAddend": 0, "descriptors": [{"entries": [{"key": "big", "value": "z"}]}]})).await;
    assert_eq!(r.body["statuses"][0]["limitRemaining"], 92);
    let r = post(&envoy, "/json", json!({"domain": "", "descriptors": []})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[test]
fn proto_durations() {
    use tollgate_server::envoy::proto_duration;
    assert_eq!(proto_duration(54_000_000), "54s");
    assert_eq!(proto_duration(1_500_000), "1.500s");
    assert_eq!(proto_duration(250), "0.000250s");
    assert_eq!(proto_duration(0), "0s");
}

#[tokio::test]
async fn leaky_bucket_delay_is_reported() {
    let app = app("domain: q
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket}
");
    let first = check(&app, "q", &[&[("k", "a")]]).await;
    let second = check(&app, "q", &[&[("k", "a")]]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(second.status, StatusCode::OK);
    let d1 = first.body["delay_ms"].as_u64().unwrap_or(0);
    let d2 = second.body["delay_ms"].as_u64().unwrap_or(0);
    assert!(d2 > d1, "{} / {}", first.text, second.text);
    assert_eq!(second.body["statuses"][0]["delay_ms"], d2);
}

#[tokio::test]
async fn rules_health_and_openapi() {
    let app = app(THREE);
    // No admin token configured: the summary, never the limits.
    let r = get(&app, "/v1/rules").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["detail"], "summary");
    assert_eq!(r.body["domains"][0]["domain"], "d");
    assert_eq!(r.body["domains"][0]["limit_count"], 5);
    assert!(r.body["domains"][0].get("limits").is_none(), "{}", r.text);
    assert!(r.body["detail_hint"]
        .as_str()
        .is_some_and(|h| h.contains("--admin-token-file")));
    // With one, its holder gets each limit.
    let app = App {
        router: tollgate_server::serve::http_api(&app.state, None)
            .registry(Some(tollgate_server::registry::Registry::in_memory(
                "router-admin",
            )))
            .router(),
        ..app
    };
    let listing = Request::get("/v1/rules")
        .header("authorization", "Bearer router-admin")
        .body(Body::empty())
        .unwrap();
    let r = call(&app, listing).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["detail"], "full");
    assert!(r.body["detail_hint"].is_null());
    assert_eq!(r.body["domains"][0]["domain"], "d");
    let l = &r.body["domains"][0]["limits"][0];
    assert_eq!(l["id"], "d|fw");
    assert_eq!(l["algorithm"], "fixed_window");
    assert_eq!(l["quota"]["requests_per_unit"], 3);
    assert_eq!(l["source"], "t.yaml:3");
    assert_eq!(l["shadow_mode"], false);
    assert_eq!(r.body["version"], "inline");
    assert!(r.body["last_reload_error"].is_null());
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/readyz").await.status, StatusCode::OK);
    let o = get(&app, "/openapi.json").await;
    assert_eq!(o.status, StatusCode::OK);
    assert_eq!(o.body["openapi"].as_str().map(|s| &s[..2]), Some("3."));
    let file =
        std::fs::read_to_string(repo().join("docs/openapi.json")).expect("docs/openapi.json");
    assert_eq!(
        o.text, file,
        "docs/openapi.json differs from the served document"
    );
}

#[tokio::test]
async fn reload_keeps_counters_of_unchanged_limits_and_survives_broken_files() {
    use tollgate_server::reload::{load, reload_now};
    let dir = temp_dir("reload");
    std::fs::write(
        dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}\n",
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let state = AppState::builder(load(&dir, 1).unwrap())
        .clock(clock.clone())
        .rules_path(dir.clone())
        .build();
    let app = App {
        router: router(state.clone()),
        state,
        clock,
    };
    for remaining in [4, 3] {
        let r = check(&app, "d", &[&[("u", "a")]]).await;
        assert_eq!(r.body["statuses"][0]["limit_remaining"], remaining);
    }
    // Add a limit and another domain: the unchanged limit keeps its counter.
    std::fs::write(
        dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}\n  - key: v\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    std::fs::write(dir.join("e.yaml"), "domain: e\n").unwrap();
    let before = app.state.rules().hash.clone();
    assert!(reload_now(&app.state, &dir));
    assert_ne!(app.state.rules().hash, before);
    assert_eq!(app.state.rules().generation, 2);
    let r = check(&app, "d", &[&[("u", "a")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 2);
    let r = check(&app, "d", &[&[("v", "a")]]).await;
    assert_eq!(
        r.body["statuses"][0]["current_limit"]["requests_per_unit"],
        1
    );
    // Raising the limit keeps the count too (same key, algorithm and period).
    std::fs::write(
        dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}\n",
    )
    .unwrap();
    assert!(reload_now(&app.state, &dir));
    let r = check(&app, "d", &[&[("u", "a")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 6);
    // A broken file: the running rules stay, the error shows and is counted.
    std::fs::write(dir.join("f.yaml"), "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    assert!(!reload_now(&app.state, &dir));
    let r = check(&app, "d", &[&[("u", "a")]]).await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 5);
    let rules = get(&app, "/v1/rules").await;
    let err = rules.body["last_reload_error"]["errors"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(err.contains("f.yaml:4:"), "{err}");
    assert_eq!(rules.body["generation"], 3);
    let m = get(&app, "/metrics").await.text;
    assert!(m.contains("tollgate_rule_reloads_total{result=\"failure\"} 1"));
    assert!(m.contains("tollgate_rule_reloads_total{result=\"success\"} 2"));
    // Fixing it clears the error.
    std::fs::remove_file(dir.join("f.yaml")).unwrap();
    assert!(reload_now(&app.state, &dir));
    assert!(get(&app, "/v1/rules").await.body["last_reload_error"].is_null());
    let _ = std::fs::remove_dir_all(&dir);
}

struct FailingStore;
impl tollgate_core::Store for FailingStore {
    fn check(
        &self,
        _now: u64,
        _items: &[tollgate_core::CheckItem<'_>],
    ) -> Result<Vec<tollgate_core::Decision>, tollgate_core::StoreError> {
        Err(tollgate_core::StoreError::Unavailable(
            "connection refused".into(),
        ))
    }
}

struct PanickingStore;
impl tollgate_core::Store for PanickingStore {
    fn check(
        &self,
        _now: u64,
        items: &[tollgate_core::CheckItem<'_>],
    ) -> Result<Vec<tollgate_core::Decision>, tollgate_core::StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        panic!("store bug")
    }
}

fn app_with_store(store: Arc<dyn tollgate_core::Store>) -> App {
    let set = RuleSet::from_sources(&[("t.yaml".to_string(), THREE.to_string())]).unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let state = AppState::builder(LoadedRules::inline(set))
        .clock(clock.clone())
        .store(store)
        .build();
    App {
        router: router(state.clone()),
        state,
        clock,
    }
}

#[tokio::test]
async fn store_failure_is_503_and_not_ready() {
    let app = app_with_store(Arc::new(FailingStore));
    let r = check(&app, "d", &[&[("fw", "a")]]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body["error"]["code"], "store_unavailable");
    // A request touching no counter does not need the store.
    let r = check(&app, "d", &[&[("nothing", "a")]]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        get(&app, "/readyz").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    let m = get(&app, "/metrics").await.text;
    assert!(m.contains("tollgate_store_errors_total 2"), "{m}");
    assert!(app.state.memory_store().is_none());
}

#[tokio::test]
async fn a_panic_becomes_a_json_500() {
    let app = app_with_store(Arc::new(PanickingStore));
    let r = check(&app, "d", &[&[("fw", "a")]]).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.body["error"]["code"], "internal");
    // The service keeps answering.
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    app.clock.advance(Duration::from_secs(1));
}

#[cfg(unix)]
#[test]
fn fingerprint_follows_configmap_symlink_swaps() {
    use std::os::unix::fs::symlink;
    use tollgate_server::reload::{fingerprint, rule_files};
    // Kubernetes layout: a.yaml -> ..data/a.yaml, ..data -> ..2024_01 (swapped atomically).
    let dir = temp_dir("configmap");
    for (v, limit) in [("..2024_01", 1), ("..2024_02", 2)] {
        std::fs::create_dir(dir.join(v)).unwrap();
        std::fs::write(
            dir.join(v).join("a.yaml"),
            format!("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"),
        )
        .unwrap();
    }
    symlink("..2024_01", dir.join("..data")).unwrap();
    symlink("..data/a.yaml", dir.join("a.yaml")).unwrap();
    assert_eq!(rule_files(&dir), vec![dir.join("a.yaml")]);
    let before = fingerprint(&dir);
    assert_eq!(before, fingerprint(&dir), "stable");
    symlink("..2024_02", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    let after = fingerprint(&dir);
    assert_ne!(before, after);
    let rules = tollgate_server::reload::load(&dir, 2).unwrap();
    assert_eq!(rules.hash, after);
    assert_eq!(rules.set.limits().next().unwrap().quota.unwrap().limit(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn unknown_paths_and_methods_get_json_errors_through_the_layers() {
    routing_errors_are_json(&app(THREE), "/no/such/path").await;
}

/// A GET on `/v1/check` is a JSON 405, and `unknown_path` a JSON 404.
async fn routing_errors_are_json(app: &App, unknown_path: &str) {
    let r = get(app, "/v1/check").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.body["error"]["code"], "method_not_allowed");
    let r = get(app, unknown_path).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.body["error"]["code"], "not_found");
}

/// `serve` runs `service(state)` itself, without `router`'s `Router` around it (which would route
/// every request twice). Every kind of answer must be the same through both, byte for byte:
/// allowed, denied, bad requests, 404, 405, and a panic.
#[tokio::test]
async fn the_served_service_answers_exactly_as_the_router() {
    use axum::response::Response;
    use std::convert::Infallible;
    use tower::Service;

    fn requests() -> Vec<Request<Body>> {
        let check = |descriptors: &[&[(&str, &str)]]| {
            Request::post("/v1/check")
                .header("content-type", "application/json")
                .body(Body::from(req("d", descriptors).to_string()))
                .unwrap()
        };
        vec![
            check(&[&[("fw", "a")]]),
            check(&[&[("fw", "a")], &[("gcra", "a")]]),
            check(&[&[("fw", "a")]]),
            check(&[&[("fw", "a")]]), // the fourth of 3 per minute: denied
            check(&[&[("nothing", "a")]]),
            Request::post("/v1/check")
                .header("content-type", "application/json")
                .body(Body::from("{not json"))
                .unwrap(),
            Request::get("/v1/check").body(Body::empty()).unwrap(),
            Request::get("/nowhere").body(Body::empty()).unwrap(),
            Request::get("/healthz").body(Body::empty()).unwrap(),
        ]
    }
    async fn answers<S>(svc: S, reqs: Vec<Request<Body>>) -> Vec<String>
    where
        S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone,
    {
        let mut out = Vec::new();
        for r in reqs {
            let r = send(svc.clone(), r).await;
            // `content-length` as it goes on the wire: axum's router puts it in the map, and
            // hyper writes it from the body's exact size when a service did not (the direct
            // `POST /v1/check` answer of `HttpApi::service`).
            if let Some(len) = r.header("content-length") {
                assert_eq!(len, r.text.len().to_string());
            }
            let mut headers: Vec<String> = r
                .headers
                .iter()
                .filter(|(k, _)| *k != "content-length")
                .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
                .chain([format!("content-length: {}", r.text.len())])
                .collect();
            headers.sort();
            out.push(format!("{} {headers:?} {}", r.status, r.text));
        }
        out
    }
    let state = || app(THREE).state;
    let via_router = answers(router(state()), requests()).await;
    let served = answers(
        tollgate_server::serve::http_api(&state(), None).service(),
        requests(),
    )
    .await;
    assert_eq!(served, via_router);
    let starts =
        |i: usize, status: &str| assert!(via_router[i].starts_with(status), "{}", via_router[i]);
    starts(0, "200 OK");
    starts(3, "429 Too Many Requests");
    starts(5, "400 Bad Request");
    starts(6, "405 Method Not Allowed");
    starts(7, "404 Not Found");
    assert!(via_router[3].contains("retry-after"), "{}", via_router[3]);

    let state = || app_with_store(Arc::new(PanickingStore)).state;
    let one = || requests().into_iter().take(1).collect::<Vec<_>>();
    let via_router = answers(router(state()), one()).await;
    let served = answers(
        tollgate_server::serve::http_api(&state(), None).service(),
        one(),
    )
    .await;
    assert_eq!(served, via_router);
    assert!(
        served[0].starts_with("500 Internal Server Error"),
        "{}",
        served[0]
    );
}
