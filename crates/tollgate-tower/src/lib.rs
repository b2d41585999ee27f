#![warn(unreachable_pub)]
//! # tollgate-tower
//!
//! tollgate inside your Rust service: a tower [`Layer`](tower_layer::Layer) for axum, hyper
//! and tonic that limits requests, and can *shape* them (delay a burst into a steady rate)
//! instead of refusing them.
//!
//! ```
//! use axum::{body::Body, extract::ConnectInfo, routing::get, Router};
//! use http::{Request, StatusCode};
//! use std::net::SocketAddr;
//! use tollgate_tower::{Key, Quota, RateLimitLayer, Unit};
//! use tower::ServiceExt as _;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // 2 requests per minute per client address (a sliding window counter, the default).
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::new(2, Unit::Minute))
//!     .key(Key::peer_ip())
//!     .build()
//!     .unwrap();
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//!
//! // A server started with `into_make_service_with_connect_info::<SocketAddr>()` records the
//! // client address; here it is set by hand.
//! let request = || {
//!     let mut r = Request::get("/").body(Body::empty()).unwrap();
//!     r.extensions_mut().insert(ConnectInfo(SocketAddr::from(([203, 0, 113, 7], 4711))));
//!     r
//! };
//! let ok = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(ok.status(), StatusCode::OK);
//! assert_eq!(ok.headers()["x-ratelimit-remaining"], "1");
//! assert_eq!(ok.headers()["ratelimit-policy"], "2;w=60");
//! app.clone().oneshot(request()).await.unwrap();
//! let denied = app.oneshot(request()).await.unwrap();
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(denied.headers().contains_key("retry-after"));
//! # }
//! ```
//!
//! ## Limits from a rules file
//!
//! The same YAML as `tollgate serve` (see the repository's `docs/rules.md`); the domain's `http`
//! section (Envoy's rate limit actions: client address, headers, method, path, query) turns each
//! request into descriptors, so one file can hold per-address, per-API-key and per-route
//! limits, each with its algorithm and its `message` for the 429.
//!
//! ```
//! use tollgate_tower::{RateLimitLayer, RuleSet};
//!
//! let yaml = r#"
//! domain: web
//! http:
//!   - actions: [{remote_address: {}}]
//!   - actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: minute, requests_per_unit: 60}
//!   - key: api_key
//!     rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra}
//!     message: "10 requests per second per API key"
//! "#;
//! let rules = RuleSet::from_sources(&[("rules.yaml".into(), yaml.into())]).unwrap();
//! let layer = RateLimitLayer::builder().rules(rules, "web").build().unwrap();
//! // or, from a file or directory: .rules_file("rules.yaml", "web")
//! # let _ = layer;
//! ```
//!
//! ## Answers
//!
//! Allowed responses get `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` and
//! the IETF draft's `RateLimit-Policy` and `RateLimit` headers of the limit closest to running
//! out (the same values `tollgate serve` sends); [`Builder::allow_headers`] keeps one family
//! ([`HeaderFamilies::XRateLimit`] or [`HeaderFamilies::Ietf`]) and
//! [`Builder::headers_on_allow`]`(false)` none. A denied HTTP request is answered `429 Too Many
//! Requests` with those headers, `Retry-After` and the rule's `message` as a text body, and never
//! reaches your service. A denied gRPC request (`content-type: application/grpc`) gets
//! `RESOURCE_EXHAUSTED` with the message and the same headers as metadata. A request that no
//! limit applies to (no descriptor, an absent header key) passes untouched.
//!
//! ## Shaping
//!
//! A `leaky_bucket` limit is a queue: a burst that fits in it is admitted and each request is
//! *delayed* by its place in the queue (an async sleep, then the inner service is called), so
//! the burst reaches your service at the limit's steady rate instead of being refused, as
//! nginx's `limit_req` with a `burst` does. [`Builder::max_wait`] bounds the wait (a request that
//! would wait longer is refused and consumes nothing). If the client goes away meanwhile,
//! dropping the response future cancels the sleep: the inner service is never called.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_tower::{Algorithm, Key, Quota, RateLimitLayer, Unit};
//!
//! // 10 requests arriving at once are released 200 ms apart.
//! let shaping = RateLimitLayer::builder()
//!     .quota(Quota::new(5, Unit::Second).with_algorithm(Algorithm::LeakyBucket).with_burst(10))
//!     .key(Key::global())
//!     .max_wait(Duration::from_secs(2))
//!     .build()
//!     .unwrap();
//! # let _ = shaping;
//! ```
//!
//! ## Where counters live
//!
//! - In memory (default): one process; the store is bounded (when full, a new key evicts
//!   expired ones first), and [`Builder::store`] shares one store between layers. The layer's
//!   own store names an in-code key's counters in binary (an address as its octets), which no
//!   one else reads; a shared store gets the text counter keys rules files and the service use.
//! - In Redis ([`Builder::redis`], feature `redis`): every instance of your application shares
//!   the counters, through the store and the failure policy `tollgate serve` uses
//!   (`tollgate_redis::Guarded`: a circuit breaker, and `allow`, `deny` or `local` decisions
//!   while Redis is down).
//! - In a running tollgate service ([`Builder::remote`], feature `remote`): the layer asks it
//!   over gRPC with a timeout and fails open or closed ([`Remote`]).
//!
//! ```no_run
//! # async fn redis() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_redis::{Guarded, RedisOptions, RedisSettings, RedisStore};
//! use tollgate_tower::{Key, Quota, RateLimitLayer, Unit};
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
//! let guarded = Guarded::start(store, RedisSettings { expected_instances: 4, ..Default::default() }).await;
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::new(100, Unit::Minute))
//!     .key(Key::header("x-api-key"))
//!     .redis(guarded)
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! ## Time
//!
//! Decisions read an injected [`Clock`](tollgate_core::Clock) ([`Builder::clock`]). The
//! default is [`TokioClock`], which runs on Tokio's time, the same time the shaping sleeps on, so
//! a test under `tokio::time::pause()` sees exact delays. A layer on its own memory store (no
//! `.store`, `.redis` or `.remote`) built while Tokio's clock runs reads the CPU's time-stamp
//! counter instead, as `governor` does: a `clock_gettime` per request cost more than the rest of
//! the decision. That store is the layer's alone, so only time differences matter there; its
//! rate is calibrated once and may drift from the system clock by a few parts per million. A
//! test that pauses Tokio's clock *after* building such a layer gives it
//! `.clock(TokioClock::new())`.
//!
//! ## How it is built
//!
//! The algorithms, rules, request -> descriptors mapping and response headers are
//! `tollgate-core`'s (the same code as the service), the Redis store and its failure policy are
//! `tollgate-redis`'s. This crate does not depend on `tollgate-server`: the pieces it needs from
//! the service (the failure policy and breaker, the header formatting) were moved down into
//! those two crates, so embedding tollgate costs neither the service's HTTP API, metrics and
//! reload machinery nor its dependencies. The remote client is the one thing of its own: a
//! small Envoy RLS v3 client on tonic and `tollgate-proto`, behind the `remote` feature.
//!
//! Features (all on by default): `axum` (client address from axum's `ConnectInfo`), `tonic`
//! (from tonic's `TcpConnectInfo`, and tonic's body), `redis`, `remote`. With
//! `default-features = false` the layer works with the memory store and any server that puts
//! the peer's `SocketAddr` in the request extensions.

mod builder;
mod clock;
mod key;
mod limiter;
#[cfg(feature = "remote")]
mod remote;
mod service;
mod signal;

pub use builder::{Builder, Error};
pub use clock::TokioClock;
pub use key::Key;
#[cfg(feature = "remote")]
pub use remote::Remote;
pub use service::{LimitableService, RateLimit, RateLimitLayer, ResponseBody, ResponseFuture};
pub use signal::Degraded;
pub use tollgate_core::{Algorithm, HeaderFamilies, Quota, RuleSet, Unit};
