//! `/v1/check` through the whole axum router (`oneshot`, no sockets): tollgate (memory store,
//! 10,000 keys, a limit so high every request passes) against a bare axum handler that reads and
//! parses the same body and answers a fixed 200 (the HTTP ceiling of `tollgate bench-ceiling`).
//! No network, so what differs is exactly the rate-limiting work: rules, store, metrics and
//! response building.
//!
//! - `cargo bench -p tollgate-server --bench http`: criterion, ns per request.
//! - Instructions per request, repeatable on a noisy machine: `ITERS=N TARGET=tollgate|ceiling`
//!   runs a fixed loop instead of criterion; (Ir at 2N - Ir at N) / N under callgrind:
//!
//! ```sh
//! cargo bench -p tollgate-server --bench http --no-run   # prints the binary path
//! ITERS=20000 TARGET=tollgate valgrind --tool=callgrind target/release/deps/http-<hash> --bench
//! ```

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use criterion::Criterion;
use std::hint::black_box;
use tollgate_core::rules::RuleSet;
use tollgate_server::{router, AppState};
use tower::ServiceExt;

const RULES: &str = "domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
";
const KEYS: usize = 10_000;

fn tollgate() -> Router {
    let set = RuleSet::from_sources(&[("bench.yaml".to_string(), RULES.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    router(AppState::new(set))
}

/// The ceiling: read the body, parse it like the service, answer a fixed OK (the one
/// `tollgate bench-ceiling http` serves).
fn ceiling() -> Router {
    ceiling_router()
}

/// The ceiling's router: the same `POST /v1/check` parsing as the service (`parse_request`) and a fixed 200 body the size of
/// one allowed status, with no rules, store, metrics, response building or layers: the most any
/// service on this stack could do.
fn ceiling_router() -> Router {
    /// What tollgate answers for one allowed descriptor.
    const OK_BODY: &str = r#"{"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"name":null,"requests_per_unit":1000000000,"unit":"SECOND"},"limit_remaining":999999999,"duration_until_reset_ms":1,"retry_after_ms":null,"message":null}],"delay_ms":null}"#;
    async fn check(body: axum::body::Bytes) -> axum::response::Response {
        use axum::response::IntoResponse;
        use tollgate_server::wire::{parse_request, Dialect};
        match parse_request(&body, Dialect::Native).ok() {
            Some(req) => {
                std::hint::black_box(req);
                ([(header::CONTENT_TYPE, "application/json")], OK_BODY).into_response()
            }
            None => (StatusCode::BAD_REQUEST, "invalid request").into_response(),
        }
    }
    Router::new().route("/v1/check", axum::routing::post(check))
}

fn request(i: usize) -> Request<Body> {
    let body = format!(
        r#"{{"domain":"bench","descriptors":[{{"entries":[{{"key":"user","value":"u{}"}}]}}]}}"#,
        i % KEYS
    );
    Request::post("/v1/check")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("request")
}

async fn one(app: &Router, i: usize) {
    let resp = app.clone().oneshot(request(i)).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await;
    black_box(body.expect("body"));
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let app = |name: &str| match name {
        "tollgate" => tollgate(),
        "ceiling" => ceiling(),
        other => panic!("TARGET is tollgate or ceiling, not {other}"),
    };
    if let Ok(iters) = std::env::var("ITERS") {
        let iters: usize = iters.parse().expect("ITERS is a number");
        let target = std::env::var("TARGET").unwrap_or_else(|_| "tollgate".into());
        let app = app(&target);
        rt.block_on(async {
            // Warm-up: every key once (the store and metrics hold them from then on).
            for i in 0..KEYS + iters {
                one(&app, i).await;
            }
        });
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("http_oneshot_v1_check");
    for name in ["ceiling", "tollgate"] {
        let app = app(name);
        let mut i = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                rt.block_on(one(&app, i))
            })
        });
    }
    g.finish();
    c.final_summary();
}
