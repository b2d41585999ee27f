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

/// In remote mode the service's `degrade` and `shadowban` rules act in the layer as with a
/// local rules file: the `Degraded` extension and header past the threshold, the configured
/// response for a shadowbanned client, its handler not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_degrade_and_shadowban() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tollgate_tower::Degraded;
    let dir = temp_dir("tower-remote-signals");
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: web
http:
  - actions: [{request_headers: {header_name: x-reader, descriptor_key: reader}}]
  - actions: [{request_headers: {header_name: x-abuser, descriptor_key: abuser}}]
descriptors:
  - key: reader
    degrade: {below_remaining: 1}
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_window_log}
  - key: abuser
    shadowban: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
",
    )
    .unwrap();
    let server = serve_rules(rules.to_str().unwrap(), &[], "tower-remote-signals");
    let url = format!("http://{}", server.addr("gRPC "));
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let fake = axum::http::Response::builder()
        .body("nothing new".to_string())
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(move |req: Request<Body>| {
                seen.fetch_add(1, Ordering::SeqCst);
                let degraded = req
                    .extensions()
                    .get::<Degraded>()
                    .map(|d| d.rule().to_owned());
                async move { degraded.unwrap_or_else(|| "full".to_owned()) }
            }),
        )
        .layer(
            RateLimitLayer::builder()
                .rules_file(&rules, "web")
                .remote(Remote::new(&url).timeout(Duration::from_secs(5)))
                .shadowban_response(fake)
                .build()
                .unwrap(),
        );
    let with = |name: &'static str| {
        let mut r = from([192, 0, 2, 9]);
        r.headers_mut().insert(name, "v".parse().unwrap());
        r
    };
    let body = |r: axum::response::Response| async move {
        let b = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        String::from_utf8(b.to_vec()).unwrap()
    };
    let r = app.clone().oneshot(with("x-reader")).await.unwrap();
    assert!(r.headers().get("x-ratelimit-degrade").is_none());
    assert_eq!(body(r).await, "full");
    let r = app.clone().oneshot(with("x-reader")).await.unwrap();
    assert_eq!(r.headers()["x-ratelimit-degrade"], "web|reader");
    assert_eq!(body(r).await, "web|reader");
    assert_eq!(
        body(app.clone().oneshot(with("x-abuser")).await.unwrap()).await,
        "full"
    );
    let r = app.clone().oneshot(with("x-abuser")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(body(r).await, "nothing new");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    drop(server);
}
