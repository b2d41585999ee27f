//! An axum service with tollgate in-process: per-address and per-API-key limits from a rules
//! file (`examples/axum-app/rules.yaml`), the per-address one a leaky bucket that shapes bursts
//! instead of refusing them.
//!
//! ```sh
//! cargo run -p axum-app                                   # 127.0.0.1:3000, the rules beside this crate
//! cargo run -p axum-app -- 127.0.0.1:3001 path/to/rules.yaml
//! curl -i localhost:3000/ -H 'x-api-key: k1'
//! ```

use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::path::Path;
use tollgate_tower::RateLimitLayer;

/// The application: its routes behind the limits of `rules` (domain `app`).
fn app(rules: &Path) -> Result<Router, tollgate_tower::Error> {
    let limits = RateLimitLayer::builder().rules_file(rules, "app").build()?;
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limits))
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".into());
    let rules = args
        .next()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/rules.yaml").into());
    let app = match app(Path::new(&rules)) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("axum-app: {e}");
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("axum-app: cannot listen on {addr}: {e}");
            std::process::exit(2);
        }
    };
    println!("listening on http://{addr} (limits: {rules})");
    // `with_connect_info`: the layer counts per client address, which axum records this way.
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, service).await {
        eprintln!("axum-app: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt as _;

    fn request(key: &str) -> Request<Body> {
        let mut r = Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap();
        r.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1))));
        r
    }

    #[tokio::test(start_paused = true)]
    async fn the_shipped_rules_limit_per_api_key_and_shape_per_address() {
        let app = app(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/rules.yaml"
        )))
        .unwrap();
        let started = tokio::time::Instant::now();
        let r = app.clone().oneshot(request("k1")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        // The headers describe the capacity in force: the address's queue holds 10.
        assert_eq!(r.headers()["x-ratelimit-limit"], "10");
        // The second request from the address is queued 200 ms (5 per second), not refused.
        let r = app.clone().oneshot(request("k1")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(started.elapsed(), std::time::Duration::from_millis(200));
    }

    #[test]
    fn a_missing_rules_file_is_an_error() {
        let e = app(Path::new("/nonexistent.yaml")).err().unwrap();
        assert!(e.to_string().contains("/nonexistent.yaml"), "{e}");
    }
}
