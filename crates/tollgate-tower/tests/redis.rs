//! The Redis backend: two application instances (two layers, two stores, two breakers) on one
//! real Redis (the suite's shared one) enforce one limit between them; and with Redis gone, the failure
//! policy decides (a Redis started for the test, then killed).

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use std::net::SocketAddr;
use std::sync::Arc;
use tollgate_redis::{Guarded, Policy, RedisOptions, RedisSettings, RedisStore};
use tollgate_testsupport::{delete_prefix, unique_prefix, RedisServer};
use tollgate_tower::{Key, Quota, RateLimitLayer, RuleSet, Unit};
use tower::ServiceExt as _;

async fn guarded(url: &str, prefix: &str, policy: Policy) -> Arc<Guarded> {
    let opts = RedisOptions {
        prefix: prefix.to_owned(),
        timeout: std::time::Duration::from_secs(2),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect_lazy(url, opts).await.unwrap();
    Guarded::start(
        store,
        RedisSettings {
            policy,
            ..RedisSettings::default()
        },
    )
    .await
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer)
}

fn from(ip: [u8; 4]) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip, 1234))));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_enforce_one_limit() {
    let prefix = unique_prefix("tower-two");
    let instance = |g| {
        app(RateLimitLayer::builder()
            .quota(Quota::new(5, Unit::Minute))
            .key(Key::peer_ip())
            .redis(g)
            .build()
            .unwrap())
    };
    let a = instance(guarded(tollgate_testsupport::shared_url(), &prefix, Policy::Local).await);
    let b = instance(guarded(tollgate_testsupport::shared_url(), &prefix, Policy::Local).await);
    let mut seen = Vec::new();
    for i in 0..8 {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = app.clone().oneshot(from([192, 0, 2, 1])).await.unwrap();
        seen.push((
            r.status(),
            r.headers()
                .get("x-ratelimit-remaining")
                .map(|v| v.to_str().unwrap().to_owned()),
        ));
    }
    let expected: Vec<_> = ["4", "3", "2", "1", "0", "0", "0", "0"]
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let status = if i < 5 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            (status, Some(r.to_string()))
        })
        .collect();
    assert_eq!(seen, expected, "one limit of 5 across both instances");
    // Another client is untouched.
    let r = b.clone().oneshot(from([192, 0, 2, 2])).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    delete_prefix(tollgate_testsupport::shared_url(), &prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_file_on_redis_and_the_failure_policy_when_redis_is_gone() {
    let mut redis = RedisServer::start(&[]);
    let url = redis.url();
    let rules = || {
        RuleSet::from_sources(&[(
            "rules.yaml".into(),
            "domain: web\nhttp: [{actions: [{remote_address: {}}]}]\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n".into(),
        )])
        .unwrap()
    };
    let with = |g| {
        app(RateLimitLayer::builder()
            .rules(rules(), "web")
            .redis(g)
            .build()
            .unwrap())
    };
    let deny = with(guarded(&url, "tower-deny", Policy::Deny).await);
    let allow = with(guarded(&url, "tower-allow", Policy::Allow).await);
    let send = |app: &Router| app.clone().oneshot(from([192, 0, 2, 9]));
    assert_eq!(send(&deny).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        send(&deny).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    redis.kill();
    // Redis is gone: `deny` refuses, saying why, and `allow` lets every request through.
    let r = send(&deny).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("store unavailable"));
    for _ in 0..5 {
        assert_eq!(send(&allow).await.unwrap().status(), StatusCode::OK);
    }
}
