//! tower-http's `TraceLayer` is in `router` only when its DEBUG spans would be recorded.
//!
//! This is a test binary of its own, with one test, on purpose. `trace_wanted` is a
//! `tracing::enabled!` callsite, and tracing caches each callsite's interest process-wide. When
//! another test thread registers that callsite (by building a router) while this test installs
//! its subscriber, the registration can miss the new subscriber and cache "never" for good, and
//! the traced router comes out untraced. That race failed CI (`router.rs` held this test then,
//! and it failed there in about half of the runs on a 2-core machine): regression test for it.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tollgate_core::rules::RuleSet;
use tollgate_server::{router, AppState, LoadedRules};
use tower::ServiceExt;
use tracing_subscriber::layer::SubscriberExt;

/// Counts the spans tower-http's trace layer opens.
struct TowerHttpSpans(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for TowerHttpSpans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().target().starts_with("tower_http") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn api() -> axum::Router {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";
    let set = RuleSet::from_sources(&[("t.yaml".to_string(), yaml.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    router(AppState::builder(LoadedRules::inline(set)).build())
}

async fn status(api: &axum::Router, path: &str) -> StatusCode {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"a"}]}]}"#,
        ))
        .unwrap();
    api.clone().oneshot(req).await.expect("infallible").status()
}

#[tokio::test]
async fn the_trace_layer_is_there_only_when_tower_http_debug_is_recorded() {
    let spans = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::filter::Targets::new()
                .with_target("tower_http", tracing::Level::DEBUG),
        )
        .with(TowerHttpSpans(spans.clone()));
    let count = || spans.load(Ordering::SeqCst);

    // Built and called while `RUST_LOG=tower_http=debug` would be in force: traced, and the
    // answers are the same as untraced.
    let _guard = tracing::subscriber::set_default(subscriber);
    let traced = api();
    assert_eq!(status(&traced, "/v1/check").await, StatusCode::OK);
    assert_eq!(status(&traced, "/nope").await, StatusCode::NOT_FOUND);
    assert_eq!(count(), 2, "one request span per request");

    // A router built without that filter has no trace layer.
    let untraced =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), api);
    assert_eq!(status(&untraced, "/v1/check").await, StatusCode::OK);
    assert_eq!(count(), 2, "no span from the untraced router");
}
