//! Per-request cost of the middleware around a trivial axum handler, in one run:
//!
//! - `bare`: the router alone (the floor every variant pays: building the request, routing,
//!   the handler, the response);
//! - `tollgate_memory`: with `tollgate-tower`, per client address, memory store, GCRA, every
//!   request admitted, the rate-limit headers added to each response (its default: five
//!   headers); `tollgate_memory_x_ratelimit`: only the `X-RateLimit-*` family (three headers,
//!   `allow_headers(HeaderFamilies::XRateLimit)`), the counterpart of `tower_governor_headers`;
//!   `tollgate_memory_no_headers`: none, `headers_on_allow(false)`;
//! - `tower_governor`: with `tower_governor` (governor's GCRA) per client address
//!   (`PeerIpKeyExtractor`), every request admitted, its default (no headers on allowed
//!   responses); `tower_governor_headers`: with its `use_headers()` (on allowed responses two
//!   headers, `x-ratelimit-limit` and `x-ratelimit-remaining`);
//! - `tollgate_redis`: throughput of the layer on the Redis store (the suite's, `TOLLGATE_TEST_REDIS_URL`, else 127.0.0.1:6379), 32 requests
//!   in flight on a two-thread runtime: one round trip per request.
//!
//! Requests come from 1,000 client addresses in turn (`ConnectInfo`, as axum's
//! `into_make_service_with_connect_info` sets it), driven with `oneshot` in a loop inside one
//! `block_on` per sample (`iter_custom`), so no runtime entry is counted per request.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::StreamExt as _;
use http::Request;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tollgate_redis::{Guarded, RedisOptions, RedisSettings, RedisStore};
use tollgate_tower::{Algorithm, HeaderFamilies, Key, Quota, RateLimitLayer, Unit};
use tower::ServiceExt as _;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

const ADDRESSES: u32 = 1_000;

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn request(i: u32) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    let ip = 0x0a00_0000 + i % ADDRESSES;
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip.to_be_bytes(), 4711))));
    r
}

/// A GCRA quota nothing in the run exceeds: a billion per second, bursts of a million.
fn admit_all() -> Quota {
    Quota::new(1_000_000_000, Unit::Second)
        .with_algorithm(Algorithm::Gcra)
        .with_burst(1_000_000)
}

fn tollgate(quota: Quota) -> tollgate_tower::Builder {
    RateLimitLayer::builder().quota(quota).key(Key::peer_ip())
}

fn per_request(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let governor = |headers: bool| {
        let mut b = GovernorConfigBuilder::default();
        b.per_nanosecond(1).burst_size(1_000_000);
        let router = router();
        if headers {
            router.layer(GovernorLayer::new(b.use_headers().finish().unwrap()))
        } else {
            router.layer(GovernorLayer::new(b.finish().unwrap()))
        }
    };
    let apps = [
        ("bare", router()),
        (
            "tollgate_memory",
            router().layer(tollgate(admit_all()).build().unwrap()),
        ),
        (
            "tollgate_memory_x_ratelimit",
            router().layer(
                tollgate(admit_all())
                    .allow_headers(HeaderFamilies::XRateLimit)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "tollgate_memory_no_headers",
            router().layer(
                tollgate(admit_all())
                    .headers_on_allow(false)
                    .build()
                    .unwrap(),
            ),
        ),
        ("tower_governor", governor(false)),
        ("tower_governor_headers", governor(true)),
    ];
    let mut g = c.benchmark_group("per_request");
    g.throughput(Throughput::Elements(1));
    for (name, app) in apps {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for i in 0..iters {
                        let r = app.clone().oneshot(request(i as u32)).await.unwrap();
                        assert!(r.status().is_success());
                        black_box(r);
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

fn redis(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let prefix = tollgate_testsupport::unique_prefix("bench-tower");
    let app = rt.block_on(async {
        let opts = RedisOptions {
            prefix: prefix.clone(),
            timeout: Duration::from_secs(1),
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(tollgate_testsupport::shared_url(), opts)
            .await
            .expect("the suite's Redis (TOLLGATE_TEST_REDIS_URL; scripts/test.sh starts one)");
        let guarded = Guarded::start(store, RedisSettings::default()).await;
        router().layer(tollgate(admit_all()).redis(guarded).build().unwrap())
    });
    let mut g = c.benchmark_group("redis");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate_redis_32_in_flight", |b| {
        b.iter_custom(|iters| {
            let app = app.clone();
            rt.block_on(async move {
                let start = Instant::now();
                futures_util::stream::iter(0..iters)
                    .map(|i| app.clone().oneshot(request(i as u32)))
                    .buffer_unordered(32)
                    .for_each(|r| {
                        assert!(r.unwrap().status().is_success());
                        async {}
                    })
                    .await;
                start.elapsed()
            })
        })
    });
    g.finish();
    tollgate_testsupport::delete_prefix(tollgate_testsupport::shared_url(), &prefix);
}

criterion_group!(benches, per_request, redis);
criterion_main!(benches);
