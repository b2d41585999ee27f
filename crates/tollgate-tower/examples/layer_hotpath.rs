//! A fixed number of requests through the router of `benches/layer.rs`, for
//! `valgrind --tool=callgrind` instruction counts (repeatable where criterion's wall-clock
//! figures drift on a shared machine):
//! `layer_hotpath bare|tollgate|tollgate_x_ratelimit|tollgate_no_headers|governor|governor_headers N`.
//! `tollgate_x_ratelimit` sends only the `X-RateLimit-*` family on allowed responses, the
//! counterpart of `governor_headers` (`use_headers()`: `x-ratelimit-limit` and
//! `x-ratelimit-remaining`). Instructions per request = (Ir at 2N - Ir at N) / N, counted inside
//! the request loop only (`--toggle-collect`), so that one-time setup whose length varies from
//! run to run (quanta's calibration, in both limiters) stays out:
//!
//! ```sh
//! cargo build --release -p tollgate-tower --example layer_hotpath
//! for n in 100000 200000; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   '--toggle-collect=layer_hotpath::main::{{closure}}' \
//!   target/release/examples/layer_hotpath tollgate $n 2>&1 | grep Collected; done
//! ```

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::Request;
use std::net::SocketAddr;
use tollgate_tower::{Algorithm, HeaderFamilies, Key, Quota, RateLimitLayer, Unit};
use tower::ServiceExt as _;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

fn tollgate() -> tollgate_tower::Builder {
    RateLimitLayer::builder()
        .quota(
            Quota::new(1_000_000_000, Unit::Second)
                .with_algorithm(Algorithm::Gcra)
                .with_burst(1_000_000),
        )
        .key(Key::peer_ip())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [who, n] = args.as_slice() else {
        eprintln!(
            "usage: layer_hotpath bare|tollgate|tollgate_x_ratelimit|tollgate_no_headers|governor|governor_headers N"
        );
        std::process::exit(2);
    };
    let n: u32 = n.parse().expect("N is a number");
    let router = Router::new().route("/", get(|| async { "ok" }));
    let mut gov = GovernorConfigBuilder::default();
    gov.per_nanosecond(1).burst_size(1_000_000);
    let app = match who.as_str() {
        "bare" => router,
        "tollgate" => router.layer(tollgate().build().unwrap()),
        "tollgate_x_ratelimit" => router.layer(
            tollgate()
                .allow_headers(HeaderFamilies::XRateLimit)
                .build()
                .unwrap(),
        ),
        "tollgate_no_headers" => router.layer(tollgate().headers_on_allow(false).build().unwrap()),
        "governor" => router.layer(GovernorLayer::new(gov.finish().unwrap())),
        "governor_headers" => router.layer(GovernorLayer::new(gov.use_headers().finish().unwrap())),
        other => {
            eprintln!("unknown variant {other}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..n {
            let mut r = Request::get("/").body(Body::empty()).unwrap();
            let ip = 0x0a00_0000 + i % 1_000;
            r.extensions_mut()
                .insert(ConnectInfo(SocketAddr::from((ip.to_be_bytes(), 4711))));
            let r = app.clone().oneshot(r).await.unwrap();
            assert!(r.status().is_success());
        }
    });
}
