//! `/v1/forward-auth/{domain}` through `router(state)` with `oneshot` (no sockets): the peer
//! address is given as axum's `ConnectInfo` extension, as `serve` provides it.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use std::net::SocketAddr;
use tollgate_core::request::Cidr;
use tollgate_core::rules::RuleSet;
use tollgate_server::{AppState, LoadedRules};
use tower::ServiceExt;

const RULES: &str = "domain: web
http:
  - actions: [{remote_address: {}}]
  - actions:
      - header_value_match:
          descriptor_value: admin
          headers: [{name: ':path', prefix_match: /admin}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
  - key: header_match
    value: admin
    message: admin is limited
    rate_limit: {unit: hour, requests_per_unit: 0}
";

fn app(trusted: &[&str]) -> axum::Router {
    let set = RuleSet::from_sources(&[
        ("web.yaml".to_string(), RULES.to_string()),
        ("plain.yaml".to_string(), "domain: plain\n".to_string()),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let state = AppState::builder(LoadedRules::inline(set)).build();
    tollgate_server::serve::http_api(&state, None)
        .trusted_proxies(trusted.iter().map(|c| c.parse::<Cidr>().unwrap()).collect())
        .router()
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
}

async fn call(app: &axum::Router, peer: Option<&str>, uri: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = Request::post(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::from("ignored body")).unwrap();
    if let Some(p) = peer {
        let addr: SocketAddr = format!("{p}:40000").parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(addr));
    }
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    Resp {
        status,
        headers,
        text: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[tokio::test]
async fn per_peer_untrusted_and_per_forwarded_client_trusted() {
    let app = app(&["10.0.0.0/8"]);
    // Untrusted peer: its X-Forwarded-For is ignored.
    let spoof = [("x-forwarded-for", "192.0.2.1")];
    assert_eq!(
        call(&app, Some("203.0.113.5"), "/v1/forward-auth/web", &spoof)
            .await
            .status,
        200
    );
    let r = call(
        &app,
        Some("203.0.113.5"),
        "/v1/forward-auth/web",
        &[("x-forwarded-for", "192.0.2.2")],
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.text, "rate limit exceeded\n");
    // Trusted peer: the forwarded client.
    let via = |c: &'static str| [("x-forwarded-for", c)];
    assert_eq!(
        call(
            &app,
            Some("10.1.1.1"),
            "/v1/forward-auth/web",
            &via("192.0.2.3")
        )
        .await
        .status,
        200
    );
    assert_eq!(
        call(
            &app,
            Some("10.1.1.1"),
            "/v1/forward-auth/web",
            &via("192.0.2.3")
        )
        .await
        .status,
        429
    );
    assert_eq!(
        call(
            &app,
            Some("10.1.1.1"),
            "/v1/forward-auth/web",
            &via("192.0.2.4")
        )
        .await
        .status,
        200
    );
}

#[tokio::test]
async fn path_match_from_forwarded_uri_json_by_accept() {
    let app = app(&[]);
    let r = call(
        &app,
        None,
        "/v1/forward-auth/web",
        &[
            ("x-original-uri", "/admin/users"),
            ("accept", "application/json"),
        ],
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.text);
    let v: serde_json::Value = serde_json::from_str(&r.text).unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("admin is limited: "), "{message}");
    assert!(message.contains("retrying will not help"), "{message}");
    assert_eq!(r.headers["x-ratelimit-message"], message);
    // 0 per hour can never pass: no Retry-After.
    assert!(r.headers.get("retry-after").is_none());
    // No peer (no ConnectInfo), no path: no entry applies, a bare 200.
    let r = call(&app, None, "/v1/forward-auth/web", &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn unknown_domain_and_domain_without_http_section_are_404() {
    let app = app(&[]);
    let r = call(&app, Some("192.0.2.9"), "/v1/forward-auth/nope", &[]).await;
    assert_eq!(r.status, 404);
    assert!(r.text.contains("unknown domain `nope`"), "{}", r.text);
    let r = call(&app, Some("192.0.2.9"), "/v1/forward-auth/plain", &[]).await;
    assert_eq!(r.status, 404);
    assert!(r.text.contains("has no `http` section"), "{}", r.text);
}
