//! envoyproxy/ratelimit's rule files (the fixtures of `tollgate-core`, copied unchanged from
//! its repository) served through `router(state)` with `oneshot` and a manual clock: what its
//! service answers and which stats it bumps, observed from the HTTP API.
//!
//! Behaviours checked here (envoy's expectation in brackets):
//!
//! | # | behaviour | source |
//! |---|---|---|
//! | 1 | hits 21 on a fresh 20/minute limit: OVER_LIMIT, `limit_remaining` 0 on `/v1/check` | base_limiter.go (over limit: remaining 0) |
//! | 2 | the same on `/json` (`limitRemaining` omitted = 0) | same |
//! | 3 | `X-RateLimit-Remaining` 0 on the denial | service headers: remaining of the over descriptor |
//! | 3b | `duration_until_reset` of that denial is the end of the current window, not 0 | base_limiter.go (CalculateReset for every status) |
//! | 4 | the denial consumed nothing in default mode (difference: envoy counts it) | migration guide |
//! | 5 | shadow-mode limit over: code OK, `limit_remaining` 0 | base_limiter.go (shadow keeps remaining 0) |
//! | 6 | quota-mode limit over with another quota limit under: overall OK, status OVER_LIMIT | TestServiceQuotaModeOnlySomeOverTheLimit |
//! | 7 | only quota limit over, regular under: overall OVER_LIMIT | TestServiceMixedPerDescriptorModes |
//! | 7b | rate-limit headers from the descriptor with the least remaining (the over quota one) | service.go (minimumDescriptor) |
//! | 1-7b | the same on the Redis store (shared counters, Lua scripts) | |
//! | 8-15 | metric `rule` labels equal envoy's stats keys (static, detailed, value_to_metric on parents, wildcard, share_threshold hiding the value with value_to_metric / detailed_metric) | config_test.go, README examples 8, 10, 11 |

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use tollgate_core::rules::RuleSet;
use tollgate_core::ManualClock;
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_server::backend::{Guarded, RedisSettings};
use tollgate_server::{router, AppState, LoadedRules};
use tollgate_testsupport::{delete_prefix, shared_url, unique_prefix};
use tower::ServiceExt;

/// 2023-11-14T22:14:00Z: a whole minute, in µs.
const T0: u64 = 1_700_000_040_000_000;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tollgate-core/tests/fixtures/envoy-ratelimit")
        .join(rel)
}

fn fixture_set(files: &[&str]) -> RuleSet {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let p = fixture(f);
            let text = std::fs::read_to_string(&p).expect("fixture");
            (p.display().to_string(), text)
        })
        .collect();
    RuleSet::from_sources(&sources).unwrap_or_else(|e| panic!("{e}"))
}

fn app(files: &[&str]) -> Router {
    app_with(fixture_set(files))
}

/// The same rules on the shared Redis (wall clock) under a fresh key prefix, returned for
/// cleanup.
async fn redis_app(set: RuleSet) -> (Router, String) {
    let prefix = unique_prefix("envoy-fixtures");
    let opts = RedisOptions {
        prefix: prefix.clone(),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect_lazy(shared_url(), opts)
        .await
        .expect("redis store");
    let guarded = Guarded::start(store, RedisSettings::default()).await;
    let state = AppState::builder(LoadedRules::inline(set))
        .redis(guarded)
        .build();
    (router(state), prefix)
}

/// The admin token of [`app_with`]'s registry, which the full `/v1/rules` listing needs.
const ADMIN_TOKEN: &str = "envoy-fixtures-admin";

fn app_with(set: RuleSet) -> Router {
    let state = AppState::builder(LoadedRules::inline(set))
        .clock(Arc::new(ManualClock::new(T0)))
        .build();
    tollgate_server::serve::http_api(&state, None)
        .registry(Some(tollgate_server::registry::Registry::in_memory(
            ADMIN_TOKEN,
        )))
        .router()
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

async fn send(app: &Router, req: Request<Body>) -> Resp {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Resp {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    }
}

async fn post(app: &Router, path: &str, body: Value) -> Resp {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    send(app, req).await
}

async fn metrics(app: &Router) -> String {
    send(app, Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text
}

fn body(domain: &str, descriptors: &[&[(&str, &str)]], hits: u64) -> Value {
    json!({
        "domain": domain,
        "hits_addend": hits,
        "descriptors": descriptors.iter().map(|d| json!({
            "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()
        })).collect::<Vec<_>>()
    })
}

#[tokio::test]
async fn over_limit_reports_zero_remaining_on_v1_check_and_json() {
    over_limit_reports_zero_remaining(&app(&["config/basic_config.yaml"])).await;
}

#[tokio::test]
async fn over_limit_reports_zero_remaining_on_redis() {
    let (app, prefix) = redis_app(fixture_set(&["config/basic_config.yaml"])).await;
    over_limit_reports_zero_remaining(&app).await;
    delete_prefix(shared_url(), &prefix);
}

async fn over_limit_reports_zero_remaining(app: &Router) {
    // basic_config.yaml: key2 is 20/minute. Hits 21 on a fresh counter is over.
    let r = post(
        app,
        "/v1/check",
        body("test-domain", &[&[("key2", "a")]], 21),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.body["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 0, "{}", r.text);
    // Never 0 once over (nothing to reset on a fresh counter): the end of the current minute
    // window, as envoy reports it.
    let reset = r.body["statuses"][0]["duration_until_reset_ms"]
        .as_u64()
        .unwrap_or(0);
    assert!(reset > 0 && reset <= 60_000, "{}", r.text);
    assert_eq!(
        r.headers
            .get("x-ratelimit-remaining")
            .and_then(|v| v.to_str().ok()),
        Some("0")
    );
    let r = post(app, "/json", body("test-domain", &[&[("key2", "b")]], 21)).await;
    assert_eq!(r.body["overallCode"], "OVER_LIMIT", "{}", r.text);
    let s = &r.body["statuses"][0];
    assert_eq!(s["code"], "OVER_LIMIT");
    // protojson omits a zero `limitRemaining`.
    assert_eq!(
        s.get("limitRemaining").and_then(Value::as_u64).unwrap_or(0),
        0,
        "{}",
        r.text
    );
    // Default mode: the denied request consumed nothing (envoy would have counted 21).
    let r = post(
        app,
        "/v1/check",
        body("test-domain", &[&[("key2", "a")]], 1),
    )
    .await;
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 19, "{}", r.text);
}

#[tokio::test]
async fn shadow_mode_over_limit_is_ok_with_zero_remaining() {
    // shadowmode_config.yaml: key2 is 20/minute in shadow mode.
    let app = app(&["config/shadowmode_config.yaml"]);
    let r = post(
        &app,
        "/v1/check",
        body("test-domain", &[&[("key2", "a")]], 21),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = &r.body["statuses"][0];
    assert_eq!(s["code"], "OK");
    assert_eq!(s["limit_remaining"], 0, "{}", r.text);
    assert!(metrics(&app)
        .await
        .contains("tollgate_shadow_mode{domain=\"test-domain\",rule=\"test-domain.key2\"} 21"));
}

/// Quota-mode rules on the sliding log (exact on Redis' wall clock too).
fn quota_set() -> RuleSet {
    RuleSet::from_sources(&[(
        "quota.yaml".to_string(),
        "domain: q
descriptors:
  - key: regular
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: quota
    quota_mode: true
    metadata: {name: service_q}
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}
"
        .to_string(),
    )])
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn quota_mode_limits_block_only_together() {
    quota_mode(&app_with(quota_set())).await;
}

#[tokio::test]
async fn quota_mode_limits_block_only_together_on_redis() {
    let (app, prefix) = redis_app(quota_set()).await;
    quota_mode(&app).await;
    delete_prefix(shared_url(), &prefix);
}

async fn quota_mode(app: &Router) {
    assert_eq!(
        post(app, "/v1/check", body("q", &[&[("quota", "a")]], 1))
            .await
            .status,
        StatusCode::OK
    );
    // One quota limit over, another under: OK overall, the over one says so.
    let r = post(
        app,
        "/v1/check",
        body("q", &[&[("quota", "a")], &[("quota2", "b")]], 1),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["overall_code"], "OK");
    assert_eq!(r.body["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(r.body["statuses"][0]["limit_remaining"], 0);
    assert_eq!(r.body["statuses"][1]["code"], "OK");
    assert_eq!(r.body["statuses"][1]["limit_remaining"], 4);
    // Headers from the descriptor closest to its limit (the over one, as envoy picks it), and
    // no Retry-After on an allowed request.
    let header = |name: &str| r.headers.get(name).and_then(|v| v.to_str().ok());
    assert_eq!(header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(header("retry-after"), None);
    // The only quota limit over, the regular one under: OVER_LIMIT overall.
    let r = post(
        app,
        "/v1/check",
        body("q", &[&[("regular", "r")], &[("quota", "a")]], 1),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.body["overall_code"], "OVER_LIMIT");
    assert_eq!(r.body["statuses"][0]["code"], "OK");
}

#[tokio::test]
async fn metric_rule_labels_are_envoy_stats_keys() {
    let app = app(&[
        "config/share_threshold.yaml",
        "readme/example8.yaml",
        "readme/example10.yaml",
        "readme/example11_metrics.yaml",
    ]);
    let requests: &[(&str, &[(&str, &str)])] = &[
        ("test-domain", &[("files", "files/a.pdf")]),
        ("test-domain", &[("files", "files/b.pdf")]),
        ("test-domain", &[("route", "api/v1"), ("method", "GET")]),
        (
            "test-domain",
            &[("service", "svc/user"), ("endpoint", "get")],
        ),
        ("test-domain", &[("file", "test1")]),
        ("test-domain", &[("midroute", "/api-beta-v2")]),
        ("example8", &[("key1", "foo")]),
        (
            "example10",
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123"),
            ],
        ),
        (
            "example11_metrics",
            &[("route", "api/v2"), ("method", "POST")],
        ),
    ];
    for (domain, entries) in requests {
        let r = post(&app, "/v1/check", body(domain, &[entries], 1)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let m = metrics(&app).await;
    for (domain, rule, hits) in [
        ("test-domain", "test-domain.files_files/*", 2),
        ("test-domain", "test-domain.route_api/*.method", 1),
        ("test-domain", "test-domain.service_svc/*.endpoint_get", 1),
        ("test-domain", "test-domain.file_test1", 1),
        ("test-domain", "test-domain.midroute_/api*v2", 1),
        ("example8", "example8.key1_foo", 1),
        (
            "example10",
            "example10.route_draw.http_method_GET.subject_id",
            1,
        ),
        (
            "example11_metrics",
            "example11_metrics.route_api/*.method",
            1,
        ),
    ] {
        let line = format!("tollgate_total_hits{{domain=\"{domain}\",rule=\"{rule}\"}} {hits}");
        assert!(m.contains(&line), "missing {line} in\n{m}");
    }
    // `/v1/rules` lists each rule's stats key (the configured path) and quota mode.
    let listing = Request::get("/v1/rules")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let rules = send(&app, listing).await.body;
    let listed: Vec<String> = rules["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .flat_map(|d| d["limits"].as_array().cloned().unwrap_or_default())
        .map(|l| {
            assert_eq!(l["quota_mode"], false);
            l["stats_key"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert!(
        listed.iter().any(|k| k == "test-domain.route_api/*.method"),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .any(|k| k == "example10.route.http_method.subject_id"),
        "{listed:?}"
    );
    // share_threshold hides the request's value even with value_to_metric / detailed_metric.
    for hidden in [
        "files/a.pdf",
        "api/v1",
        "svc/user",
        "/api-beta-v2",
        "api/v2",
    ] {
        assert!(!m.contains(hidden), "{hidden} leaked into\n{m}");
    }
}
