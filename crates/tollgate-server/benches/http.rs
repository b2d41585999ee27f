//! `/v1/check` through the whole HTTP API (`oneshot`, no sockets): tollgate with the memory
//! store, 10,000 keys and a limit so high every request passes. No network: what is measured is
//! the request's work in the service (parsing, rules, store, metrics, response building). The
//! same stack without the rate limiting is `tollgate bench-ceiling http`, measured over sockets
//! (BENCHMARKS-HISTORY.md).
//!
//! - `cargo bench -p tollgate-server --bench http`: criterion, ns per request.
//! - Instructions per request, repeatable on a noisy machine: `ITERS=N TARGET=tollgate`
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
        other => panic!("TARGET is tollgate, not {other}"),
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
    let app = app("tollgate");
    let mut i = 0;
    g.bench_function("tollgate", |b| {
        b.iter(|| {
            i += 1;
            rt.block_on(one(&app, i))
        })
    });
    g.finish();
    c.final_summary();
}
