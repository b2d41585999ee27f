//! The layer around an axum router, driven with `oneshot` (no sockets): keys by peer address,
//! forwarded address, header and closure, the 429's shape, the headers on allowed responses,
//! limits from a rules file, and configuration mistakes reported by `build`.

use axum::body::{to_bytes, Body};
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use std::net::SocketAddr;
use tollgate_tower::{Error, Key, Quota, RateLimitLayer, RuleSet, Unit};
use tower::ServiceExt as _;

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/t/{tenant}/x", get(|| async { "tenant" }))
        .layer(layer)
}

fn from(ip: [u8; 4], path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::get(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut r = r.body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip, 40_000))));
    r
}

async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

fn header<'a>(r: &'a Response<Body>, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", r.headers()))
        .to_str()
        .unwrap()
}

async fn body(r: Response<Body>) -> String {
    String::from_utf8(to_bytes(r.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
}

fn per(key: Key, limit: u64) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::new(limit, Unit::Minute))
        .key(key)
        .build()
        .unwrap()
}

#[tokio::test]
async fn per_peer_ip_counters_and_the_429_shape() {
    let app = app(per(Key::peer_ip(), 2));
    for remaining in ["1", "0"] {
        let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-limit"), "2");
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining);
        assert_eq!(header(&r, "ratelimit-policy"), "2;w=60");
        assert!(
            header(&r, "ratelimit").starts_with(&format!("limit=2, remaining={remaining}, reset="))
        );
        assert!(r.headers().get("retry-after").is_none());
        assert_eq!(body(r).await, "hello", "the handler's own response");
    }
    let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "content-type"), "text/plain; charset=utf-8");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let reset: u64 = header(&r, "x-ratelimit-reset").parse().unwrap();
    // A sliding window counter forgets over up to two windows.
    assert!((1..=120).contains(&reset), "{reset}");
    assert_eq!(body(r).await, "rate limit exceeded\n");
    // Another address has its own counter.
    let r = send(&app, from([192, 0, 2, 2], "/", &[])).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining"), "1");
}

#[tokio::test]
async fn per_header_key_and_requests_without_it_pass_untouched() {
    let app = app(per(Key::header("x-api-key"), 1));
    let key = |k| from([192, 0, 2, 1], "/", &[("x-api-key", k)]);
    assert_eq!(send(&app, key("a")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&app, key("a")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, key("b")).await.status(), StatusCode::OK);
    for _ in 0..3 {
        let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("x-ratelimit-limit").is_none());
    }
}

#[tokio::test]
async fn per_closure_key() {
    let tenant = Key::from_fn("tenant", |req| {
        req.uri
            .path()
            .strip_prefix("/t/")?
            .split('/')
            .next()
            .map(str::to_owned)
    });
    let app = app(per(tenant, 1));
    let get = |p| from([192, 0, 2, 1], p, &[]);
    assert_eq!(send(&app, get("/t/acme/x")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&app, get("/t/acme/x")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, get("/t/initech/x")).await.status(),
        StatusCode::OK
    );
    // No tenant: not limited by this key.
    assert_eq!(send(&app, get("/")).await.status(), StatusCode::OK);
    assert_eq!(send(&app, get("/")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn forwarded_ip_is_trusted_only_from_trusted_proxies() {
    let layer = RateLimitLayer::builder()
        .quota(Quota::new(1, Unit::Minute))
        .key(Key::forwarded_ip())
        .trusted_proxies(["10.0.0.0/8"])
        .build()
        .unwrap();
    let app = app(layer);
    let via_proxy = |client| from([10, 0, 0, 5], "/", &[("x-forwarded-for", client)]);
    // Behind the proxy, each client has its own counter (a spoofed left-most hop is ignored).
    assert_eq!(
        send(&app, via_proxy("198.51.100.1")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, via_proxy("203.0.113.9, 198.51.100.1"))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, via_proxy("198.51.100.2")).await.status(),
        StatusCode::OK
    );
    // An untrusted peer's X-Forwarded-For is ignored: it is counted by its own address.
    let direct = |xff| from([192, 0, 2, 7], "/", &[("x-forwarded-for", xff)]);
    assert_eq!(
        send(&app, direct("198.51.100.3")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, direct("198.51.100.4")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_missing_peer_address_is_a_clear_500_not_a_silent_pass() {
    let app = app(per(Key::peer_ip(), 10));
    let r = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body(r)
        .await
        .contains("into_make_service_with_connect_info"));
    // A plain `SocketAddr` extension (hyper without axum) works too.
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(SocketAddr::from(([192, 0, 2, 1], 1)));
    assert_eq!(send(&app, req).await.status(), StatusCode::OK);
}

const RULES: &str = r#"
domain: web
http:
  - actions: [{remote_address: {}}]
  - actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: api_key
    value: free
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}
    message: "free plan: 1 request per minute"
"#;

fn rules() -> RuleSet {
    RuleSet::from_sources(&[("rules.yaml".into(), RULES.into())]).unwrap()
}

#[tokio::test]
async fn rules_file_limits_per_ip_and_per_api_key_with_the_rule_message() {
    let app = app(RateLimitLayer::builder()
        .rules(rules(), "web")
        .build()
        .unwrap());
    let free = || from([192, 0, 2, 1], "/", &[("x-api-key", "free")]);
    let r = send(&app, free()).await;
    assert_eq!(r.status(), StatusCode::OK);
    // The binding limit is the one closest to running out: the API key's.
    assert_eq!(header(&r, "x-ratelimit-limit"), "1");
    let r = send(&app, free()).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "x-ratelimit-limit"), "1");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(body(r).await, "free plan: 1 request per minute\n");
    // The denied request consumed nothing from the address's limit: 2 of 3 left.
    let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), "1");
    send(&app, from([192, 0, 2, 1], "/", &[])).await;
    let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body(r).await, "rate limit exceeded\n");
}

#[tokio::test]
async fn rules_file_from_disk() {
    let dir = tollgate_testsupport::temp_dir("tower-rules");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    let app = app(RateLimitLayer::builder()
        .rules_file(&path, "web")
        .build()
        .unwrap());
    let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
    assert_eq!(header(&r, "x-ratelimit-limit"), "3");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn configuration_mistakes_are_errors_at_build() {
    let err = |b: tollgate_tower::Builder| match b.build() {
        Err(Error::Config(m)) => m,
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("built"),
    };
    let b = RateLimitLayer::builder;
    assert!(err(b()).contains("no limits"));
    assert!(err(b().key(Key::peer_ip())).contains("without a quota"));
    assert!(err(b()
        .quota(Quota::new(1, Unit::Second))
        .key(Key::header("bad header")))
    .contains("`bad header` is not a valid header name"));
    assert!(err(b().rules(rules(), "nope")).contains("no domain `nope` (they define: web)"));
    let no_http = RuleSet::from_sources(&[(
        "r.yaml".into(),
        "domain: api\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]"
            .into(),
    )])
    .unwrap();
    assert!(err(b().rules(no_http, "api")).contains("no `http` section"));
    assert!(
        err(b().rules(rules(), "web").quota(Quota::new(1, Unit::Second))).contains("choose one")
    );
    assert!(err(b()
        .quota(Quota::new(1, Unit::Second))
        .key(Key::forwarded_ip())
        .trusted_proxies(["10.0.0.0/33"]))
    .contains("10.0.0.0/33"));
    assert!(err(b()
        .remote(tollgate_tower::Remote::new("http://127.0.0.1:1"))
        .quota(Quota::new(1, Unit::Second))
        .key(Key::peer_ip()))
    .contains("drop .quota"));
    match b().rules_file("/nonexistent/rules.yaml", "web").build() {
        Err(Error::Rules(e)) => assert!(e.to_string().contains("/nonexistent/rules.yaml"), "{e}"),
        other => panic!("unexpected {:?}", other.map(|_| ())),
    }
}

/// A request from `addr` (any address family and port).
fn from_addr(addr: SocketAddr) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    r.extensions_mut().insert(ConnectInfo(addr));
    r
}

/// The layer's own store names counters by binary keys (an address as its octets): one counter
/// per address whatever the port, never one for two addresses, whichever bytes they share.
#[tokio::test]
async fn binary_keys_count_per_address_never_across_addresses() {
    let app = app(per(Key::peer_ip(), 1));
    let ok = |r: &Response<Body>| r.status() == StatusCode::OK;
    let addrs: Vec<SocketAddr> = [
        "10.0.0.1:1",
        "1.0.0.10:1",
        "10.0.1.0:1",
        "0.0.0.0:1",
        "[::]:1",
        "[::a00:1]:1", // ::10.0.0.1 (IPv4-compatible, not mapped): IPv6
        "[2001:db8::1]:1",
        "[2001:db8::100]:1",
        "[a00:1::]:1", // begins with 10.0.0.1's bytes
    ]
    .iter()
    .map(|a| a.parse().unwrap())
    .collect();
    for a in &addrs {
        assert!(ok(&send(&app, from_addr(*a)).await), "{a}: first request");
    }
    for a in &addrs {
        // Same address, another port: the same counter, now used up.
        let other_port = SocketAddr::new(a.ip(), 2);
        let r = send(&app, from_addr(other_port)).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{other_port}");
    }
}

/// An IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`, a dual-stack socket's view of an IPv4 client)
/// counts as the IPv4 address it is, as in the text key space (documented in `key.rs`).
#[tokio::test]
async fn an_ipv4_mapped_peer_shares_the_ipv4_counter() {
    let peer = app(per(Key::peer_ip(), 1));
    let v4: SocketAddr = "192.0.2.7:5000".parse().unwrap();
    let mapped: SocketAddr = "[::ffff:192.0.2.7]:6000".parse().unwrap();
    assert_eq!(send(&peer, from_addr(v4)).await.status(), StatusCode::OK);
    let r = send(&peer, from_addr(mapped)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // The same holds the other way round, and for the forwarded-address key.
    let forwarded = app(per(Key::forwarded_ip(), 1));
    assert_eq!(
        send(&forwarded, from_addr(mapped)).await.status(),
        StatusCode::OK
    );
    let r = send(&forwarded, from_addr(v4)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Header values are binary keys too (raw bytes, not escaped text): values that differ only in
/// what escaping or lossy decoding would merge keep their own counters.
#[tokio::test]
async fn binary_header_keys_keep_distinct_values_apart() {
    let app = app(per(Key::header("x-api-key"), 1));
    let with = |v: &[u8]| {
        let mut r = from([192, 0, 2, 1], "/", &[]);
        r.headers_mut()
            .insert("x-api-key", http::HeaderValue::from_bytes(v).unwrap());
        r
    };
    for v in [&b"a|b"[..], b"a=b", b"a\\|b", b"\xff", b"\xfe", b"k"] {
        assert_eq!(send(&app, with(v)).await.status(), StatusCode::OK, "{v:?}");
    }
    assert_eq!(
        send(&app, with(b"\xff")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

const X_RATELIMIT: [&str; 3] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];
const IETF: [&str; 2] = ["ratelimit-policy", "ratelimit"];

/// `allow_headers` picks the families allowed responses carry; denials keep them all.
#[tokio::test]
async fn header_families_on_allowed_responses_and_all_headers_on_denials() {
    use tollgate_tower::HeaderFamilies;
    let layer = |f: Option<HeaderFamilies>| {
        let b = RateLimitLayer::builder()
            .quota(Quota::new(1, Unit::Minute))
            .key(Key::peer_ip());
        match f {
            Some(f) => b.allow_headers(f),
            None => b.headers_on_allow(false),
        }
        .build()
        .unwrap()
    };
    for (families, sent, absent) in [
        (
            Some(HeaderFamilies::Both),
            &[&X_RATELIMIT[..], &IETF[..]],
            &[][..],
        ),
        (
            Some(HeaderFamilies::XRateLimit),
            &[&X_RATELIMIT[..], &[]],
            &IETF[..],
        ),
        (
            Some(HeaderFamilies::Ietf),
            &[&IETF[..], &[]],
            &X_RATELIMIT[..],
        ),
        (
            None,
            &[&[][..], &[]],
            &[&X_RATELIMIT[..], &IETF[..]].concat()[..],
        ),
    ] {
        let app = app(layer(families));
        let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        for name in sent.concat() {
            assert!(r.headers().contains_key(name), "{families:?}: no {name}");
        }
        for name in absent {
            assert!(!r.headers().contains_key(*name), "{families:?}: {name}");
        }
        assert!(!r.headers().contains_key("retry-after"));
        // The denial's contract does not depend on the choice.
        let r = send(&app, from([192, 0, 2, 1], "/", &[])).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        for name in X_RATELIMIT.iter().chain(&IETF).chain(&["retry-after"]) {
            assert!(
                r.headers().contains_key(*name),
                "{families:?}: denial without {name}"
            );
        }
        assert_eq!(body(r).await, "rate limit exceeded\n");
    }
}

/// The choice applies to limits from a rules file too.
#[tokio::test]
async fn header_families_apply_to_rules_file_limits() {
    let layer = RateLimitLayer::builder()
        .rules(rules(), "web")
        .allow_headers(tollgate_tower::HeaderFamilies::Ietf)
        .build()
        .unwrap();
    let r = send(&app(layer), from([192, 0, 2, 1], "/", &[])).await;
    assert_eq!(r.status(), StatusCode::OK);
    for name in IETF {
        assert!(r.headers().contains_key(name), "no {name}");
    }
    for name in X_RATELIMIT {
        assert!(!r.headers().contains_key(name), "{name}");
    }
}

/// Regression: `fn main() -> Result<(), Box<dyn Error>>` printed a build error with Rust's
/// structure dump (`Rules(RuleErrors([RuleError { file: ..., line: 0, ...`). Its `Debug` is
/// now the `file:line:column: problem` lines `tollgate validate` prints.
#[test]
fn build_error_debug_reads_like_validate() {
    let dir = tollgate_testsupport::temp_dir("tower-error-text");
    let file = dir.join("rules.yaml");
    std::fs::write(
        &file,
        "domain: web\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unt: 5}\n",
    )
    .unwrap();
    let build_error = |path: &std::path::Path| -> Box<dyn std::error::Error> {
        match RateLimitLayer::builder().rules_file(path, "web").build() {
            Err(e) => Box::new(e),
            Ok(_) => panic!("{} was accepted", path.display()),
        }
    };
    let boxed = build_error(&file);
    let debug = format!("{boxed:?}");
    let prefix = format!("{}:4:", file.display());
    assert!(debug.starts_with(&prefix), "{debug}");
    assert!(debug.contains("requests_per_unit"), "{debug}");
    assert!(!debug.contains("RuleError"), "{debug}");
    assert_eq!(debug, boxed.to_string());

    let missing = build_error(std::path::Path::new("/nonexistent/rules.yaml"));
    let debug = format!("{missing:?}");
    assert!(debug.starts_with("/nonexistent/rules.yaml: "), "{debug}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Regression: a leaky bucket of 5/second with a burst of 10 answered `x-ratelimit-limit: 5`
/// with `x-ratelimit-remaining: 8`. The limit is the bucket's capacity, the window its refill.
#[tokio::test]
async fn a_bursty_bucket_reports_its_capacity() {
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::builder()
            .quota(
                Quota::new(5, Unit::Second)
                    .with_algorithm(tollgate_tower::Algorithm::LeakyBucket)
                    .with_burst(10),
            )
            .key(Key::peer_ip())
            .build()
            .unwrap(),
    );
    let addr: SocketAddr = "192.0.2.1:1000".parse().unwrap();
    for _ in 0..3 {
        let resp = app.clone().oneshot(from_addr(addr)).await.unwrap();
        let num = |name: &str| -> u64 { resp.headers()[name].to_str().unwrap().parse().unwrap() };
        assert_eq!(num("x-ratelimit-limit"), 10, "{:?}", resp.headers());
        assert!(num("x-ratelimit-remaining") <= 10, "{:?}", resp.headers());
        assert_eq!(resp.headers()["ratelimit-policy"], "10;w=2");
    }
}

const SIGNAL_RULES: &str = r#"
domain: web
http:
  - actions: [{request_headers: {header_name: x-reader, descriptor_key: reader}}]
  - actions: [{request_headers: {header_name: x-abuser, descriptor_key: abuser}}]
descriptors:
  - key: reader
    degrade: {below_remaining: 2}
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding_window_log}
  - key: abuser
    shadowban: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
"#;

/// A request past the `degrade` threshold reaches the handler with the `Degraded` extension and
/// its response carries the header; a shadowbanned one gets the configured response and the
/// handler is never called.
#[tokio::test]
async fn degrade_extension_and_shadowban_response() {
    use axum::Extension;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tollgate_tower::Degraded;
    let rules = RuleSet::from_sources(&[("rules.yaml".into(), SIGNAL_RULES.into())]).unwrap();
    let fake = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(r#"{"results":[]}"#.to_string())
        .unwrap();
    let layer = RateLimitLayer::builder()
        .rules(rules, "web")
        .shadowban_response(fake)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let app = Router::new()
        .route(
            "/",
            get(move |degraded: Option<Extension<Degraded>>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    match degraded {
                        Some(Extension(d)) => format!("short page ({})", d.rule()),
                        None => "full page".to_string(),
                    }
                }
            }),
        )
        .layer(layer);
    // 4 per hour, degrade below 2 remaining: remaining 3, 2 full; 1, 0 degraded; then 429.
    let mut got = Vec::new();
    for _ in 0..5 {
        let r = send(&app, from([192, 0, 2, 1], "/", &[("x-reader", "r")])).await;
        let status = r.status().as_u16();
        let h = r
            .headers()
            .get("x-ratelimit-degrade")
            .map(|v| v.to_str().unwrap().to_string());
        got.push((status, h, body(r).await));
    }
    let full = (200, None, "full page".to_string());
    let short = (
        200,
        Some("web|reader".to_string()),
        "short page (web|reader)".to_string(),
    );
    assert_eq!(got[..4], [full.clone(), full, short.clone(), short]);
    assert_eq!(got[4].0, 429);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // Shadowban: the first passes; the next ones get the configured answer, no handler call.
    let abuser = || from([192, 0, 2, 2], "/", &[("x-abuser", "a")]);
    let r = send(&app, abuser()).await;
    assert_eq!(body(r).await, "full page");
    for _ in 0..2 {
        let r = send(&app, abuser()).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), "application/json");
        assert_eq!(body(r).await, r#"{"results":[]}"#);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    // Denied by the shadowban rule and an honest one too: an honest 429.
    let both = from([192, 0, 2, 2], "/", &[("x-abuser", "a"), ("x-reader", "r")]);
    assert_eq!(
        send(&app, both).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}
