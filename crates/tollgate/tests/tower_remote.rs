//! tollgate-tower in remote mode against a real `tollgate serve` process over gRPC: the
//! service's rules decide (its headers passed on, 429 when over), and once the service is
//! stopped each failure policy answers within the timeout: open lets requests through, closed
//! refuses them.

mod support;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::time::Duration;
use support::{serve_rules, temp_dir};
use tollgate_tower::{Key, RateLimitLayer, Remote};
use tower::ServiceExt as _;

const RULES: &str = "domain: web
http:
  - actions: [{remote_address: {}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
";

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
async fn remote_service_decides_and_each_policy_answers_when_it_is_stopped() {
    let dir = temp_dir("tower-remote");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let mut server = serve_rules(
        rules.to_str().unwrap(),
        &["--response-headers"],
        "tower-remote",
    );
    let url = format!("http://{}", server.addr("gRPC "));
    let timeout = Duration::from_millis(500);
    let from_file = app(RateLimitLayer::builder()
        .rules_file(&rules, "web")
        .remote(Remote::new(&url).timeout(timeout))
        .build()
        .unwrap());
    // In code: the same descriptor (`remote_address`), so the same counter in the service.
    let closed = app(RateLimitLayer::builder()
        .remote(Remote::new(&url).timeout(timeout).fail_closed())
        .domain("web")
        .key(Key::peer_ip())
        .build()
        .unwrap());

    for remaining in ["1", "0"] {
        let r = from_file
            .clone()
            .oneshot(from([192, 0, 2, 1]))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["x-ratelimit-limit"], "2");
        assert_eq!(r.headers()["x-ratelimit-remaining"], remaining);
    }
    let r = closed.clone().oneshot(from([192, 0, 2, 1])).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["ratelimit-policy"], "2;w=60");
    let r = closed.clone().oneshot(from([192, 0, 2, 2])).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "another address has its own counter"
    );

    // The service stops.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    for _ in 0..3 {
        // Fail open (the default): through, without rate-limit headers.
        let r = from_file
            .clone()
            .oneshot(from([192, 0, 2, 1]))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("x-ratelimit-limit").is_none());
        // Fail closed: refused, retry in a second.
        let r = closed.clone().oneshot(from([192, 0, 2, 3])).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "1");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("unavailable"));
    }
    std::fs::remove_dir_all(dir).unwrap();
}
