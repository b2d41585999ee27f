//! The HTTP API: [`router`] builds the axum `Router`, `service` the same
//! routes as the one service `serve` runs; no sockets here, so tests drive both with
//! `tower::ServiceExt::oneshot`.
//!
//! `POST /v1/check`, nearly all the traffic, is answered by [`ApiService`] without going
//! through axum's `Router` (the other routes are). Check request bodies are read in one pass by
//! [`crate::wire`], which gives every mistake its own error code and status (never a 500).
//! Check responses are written straight into one pre-sized buffer (no `Value` tree) that also
//! holds the rate-limit header values.

pub mod forward_auth;
mod registry;
mod stats;

use crate::backend::{Backend, BreakerState};
use crate::error::{ApiError, ErrorClass};
use crate::listener::BodyTimedOut;
use crate::metrics::DropReason;
use crate::model::{ms_ceil, CheckResponse, HeaderValues};
use crate::registry::Registry;
use crate::state::AppState;
pub use crate::wire::{parse_request, parse_request_within, Dialect};
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::FromRef;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::FutureExt;
use serde_json::{json, Value};
use std::any::Any;
use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tollgate_core::headers::HEADER_NAMES;
use tollgate_core::request::Cidr;
use tower::{Layer, Service};
use tower_http::trace::TraceLayer;

/// The OpenAPI document served at `/openapi.json` (also checked in as `docs/openapi.json`).
pub(crate) const OPENAPI_JSON: &str = include_str!("../openapi.json");

/// What the HTTP handlers share: the service core and the HTTP transport's own settings.
/// Handlers that need only the core extract [`AppState`] from it (`FromRef`); it also derefs to
/// it.
#[derive(Clone)]
pub struct HttpState {
    app: AppState,
    /// The rule registry, when one runs (`/v1/domains`, the full `/v1/rules` listing).
    pub(crate) registry: Option<Arc<Registry>>,
    /// Proxies whose `X-Forwarded-For` / `X-Real-IP` are believed (`--trusted-proxies`).
    pub(crate) trusted_proxies: Arc<[Cidr]>,
}

impl std::ops::Deref for HttpState {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.app
    }
}

impl FromRef<HttpState> for AppState {
    fn from_ref(state: &HttpState) -> AppState {
        state.app.clone()
    }
}

/// Builds the HTTP API: the service core, the transport's settings and any routes another
/// part of the service adds (the composition root adds the Envoy-compatible ones).
pub struct HttpApi {
    state: HttpState,
    extra: Option<Router<HttpState>>,
}

impl HttpApi {
    /// The API of `state`, with no registry, no trusted proxy and no extra route.
    pub fn new(state: AppState) -> Self {
        Self {
            state: HttpState {
                app: state,
                registry: None,
                trusted_proxies: Arc::from(Vec::new()),
            },
            extra: None,
        }
    }

    /// Serve the rule registry's endpoints with `registry`.
    pub fn registry(mut self, registry: Option<Arc<Registry>>) -> Self {
        self.state.registry = registry;
        self
    }

    /// Believe the forwarded client address from these proxies (`--trusted-proxies`).
    pub fn trusted_proxies(mut self, proxies: Vec<Cidr>) -> Self {
        self.state.trusted_proxies = Arc::from(proxies);
        self
    }

    /// Add these routes (they must not clash with the API's own).
    pub fn routes(mut self, routes: Router<HttpState>) -> Self {
        self.extra = Some(match self.extra.take() {
            Some(r) => r.merge(routes),
            None => routes,
        });
        self
    }

    /// The API as a `Router`: [`Self::service`] in a `Router`, plus tower-http's `TraceLayer`
    /// when [`trace_wanted`] (tests drive it with `oneshot`; an embedding application can nest
    /// or merge it). `serve` runs [`Self::service`] itself when no trace layer is wanted: a
    /// `Router` around it routes every request a second time, for nothing.
    pub fn router(self) -> Router {
        let api = self.service();
        if trace_wanted() {
            Router::new().fallback_service(TraceLayer::new_for_http().layer(api))
        } else {
            Router::new().fallback_service(api)
        }
    }

    /// The routes as one service ([`ApiService`]), with panics caught around each request's
    /// future. What is on the per-request path is kept small:
    /// - `POST /v1/check`, nearly all the traffic, is answered without axum's `Router` (no path
    ///   lookup, no URL-parameter and matched-path extensions, no boxed route service, no second
    ///   `content-length` computation: hyper writes it from the body's exact size): the route is
    ///   still registered in the `Router`, which answers its other methods (405);
    /// - no tower-http `CatchPanicLayer`: it re-boxes every response body (an allocation per
    ///   response); our bodies are built whole, so nothing can panic after the future is done;
    /// - the panic catching wraps the whole service once: `Router::layer` would wrap every route
    ///   and the fallbacks in a boxed layered service of their own, cloned per request.
    pub fn service(self) -> ApiService {
        let mut routes = Router::new()
            .route("/v1/check", post(v1_check))
            .route("/v1/rules", get(v1_rules))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/openapi.json", get(openapi))
            .route(
                "/v1/forward-auth/{domain}",
                axum::routing::any(forward_auth::forward_auth),
            )
            .merge(registry::routes())
            .merge(stats::routes());
        if let Some(extra) = self.extra {
            routes = routes.merge(extra);
        }
        let routes = routes
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self.state.clone());
        ApiService {
            state: self.state.app,
            routes,
            peer: None,
        }
    }
}

/// The HTTP API of `state` alone: [`HttpApi::router`] with no registry, no trusted proxy and
/// no extra route.
pub fn router(state: AppState) -> Router {
    HttpApi::new(state).router()
}

/// The HTTP API as one service: [`HttpApi::service`] builds it. Any request body type is accepted
/// (`serve`'s listener hands over its timed body as it is; tests send axum's `Body`).
#[derive(Clone)]
pub struct ApiService {
    state: AppState,
    routes: Router,
    /// The client's address, given to the routed handlers that read it (forward-auth, the
    /// registry) as axum's `ConnectInfo`. `POST /v1/check` does not: a request extension costs
    /// two allocations.
    peer: Option<std::net::SocketAddr>,
}

impl std::fmt::Debug for ApiService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiService")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl ApiService {
    /// This service for one connection from `peer` (see `crate::listener::serve`).
    pub(crate) fn with_peer(&self, peer: Option<std::net::SocketAddr>) -> Self {
        Self {
            peer,
            ..self.clone()
        }
    }
}

/// The future of [`ApiService`]: the direct `/v1/check` answer or the `Router`'s, with a panic
/// turned into a JSON 500.
pub(crate) type ApiFuture = futures_util::future::Map<
    futures_util::future::CatchUnwind<
        AssertUnwindSafe<
            futures_util::future::Either<
                futures_util::future::BoxFuture<'static, Result<Response, Infallible>>,
                axum::routing::future::RouteFuture<Infallible>,
            >,
        >,
    >,
    fn(Result<Result<Response, Infallible>, Box<dyn Any + Send>>) -> Result<Response, Infallible>,
>;

impl<B> Service<Request<B>> for ApiService
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = ApiFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        // The `Router` is always ready.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> ApiFuture {
        let inner = if req.method() == Method::POST && req.uri().path() == "/v1/check" {
            futures_util::future::Either::Left(
                check_native(self.state.clone(), req)
                    .map(Ok::<_, Infallible>)
                    .boxed(),
            )
        } else {
            let mut req = req.map(Body::new);
            if let Some(peer) = self.peer {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
            }
            futures_util::future::Either::Right(self.routes.call(req))
        };
        AssertUnwindSafe(inner).catch_unwind().map(caught as _)
    }
}

/// A response, or the JSON 500 for a panic.
fn caught(
    result: Result<Result<Response, Infallible>, Box<dyn Any + Send>>,
) -> Result<Response, Infallible> {
    result.unwrap_or_else(|panic| Ok(panic_response(panic)))
}

/// Whether tower-http's `TraceLayer` (spans and events at DEBUG) would record anything
/// (`RUST_LOG=tower_http=debug`). Filtered out, it still costs a span, two clock reads and a
/// wrapped body per request, so it is only installed when this is true. Failures are logged
/// either way, where errors become responses (`ApiError::into_response`).
pub fn trace_wanted() -> bool {
    tracing::enabled!(target: "tower_http::trace", tracing::Level::DEBUG)
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("panic");
    tracing::error!(panic = detail, "handler panicked");
    ApiError::Internal("a handler panicked (see the log)".into()).into_response()
}

async fn not_found() -> Response {
    ApiError::NotFound("no such endpoint: see GET /openapi.json".into()).into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::MethodNotAllowed.into_response()
}

/// Read the body, refused past `limit` bytes (a `Content-Length` over it before any is read),
/// whatever its content type (see [`check_content_type`]). A body that times out
/// ([`BodyTimedOut`], also a `Content-Length` that promises more than is sent) is a 408.
pub(crate) async fn read_body<B>(
    state: &AppState,
    req: Request<B>,
    limit: usize,
) -> Result<Bytes, ApiError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(ApiError::PayloadTooLarge { limit });
        }
    }
    let body = std::pin::pin!(req.into_body());
    collect_body(body, limit).await.map_err(|e| match e {
        ReadError::TooLarge => ApiError::PayloadTooLarge { limit },
        ReadError::Failed(e) => {
            // The errors are the body-read timeout (bodies served by `crate::listener`) and a
            // broken connection.
            if let Some(t) = BodyTimedOut::find(&*e) {
                state
                    .metrics()
                    .http_connections
                    .dropped(DropReason::BodyTimeout, 1);
                ApiError::BodyTimeout(t.0)
            } else {
                ApiError::invalid("invalid_body", format!("cannot read body: {e}"))
            }
        }
    })
}

/// Why [`collect_body`] gave up.
enum ReadError {
    /// More than the limit.
    TooLarge,
    /// The body's own error.
    Failed(axum::BoxError),
}

/// The whole body, refused past `limit` bytes. A body that comes in one frame (what a client's
/// small JSON body does) is that frame's bytes as they are: no copy, no buffer list; several
/// frames are joined into one buffer.
async fn collect_body<B>(mut body: std::pin::Pin<&mut B>, limit: usize) -> Result<Bytes, ReadError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while !body.is_end_stream() {
        let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await else {
            break;
        };
        let frame = frame.map_err(|e| ReadError::Failed(e.into()))?;
        // Trailers are ignored.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total = total.saturating_add(data.len());
        if total > limit {
            return Err(ReadError::TooLarge);
        }
        if data.is_empty() {
            continue;
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            held => {
                if let Some(held) = held {
                    joined.reserve(held.len() + data.len());
                    joined.extend_from_slice(&held);
                }
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(match first {
        Some(data) => data,
        None => Bytes::from(joined),
    })
}

/// JSON only; a missing content type is accepted (as envoyproxy/ratelimit does).
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    // What nearly every client sends, answered without the general parse below.
    if ct.as_bytes() == b"application/json" {
        return Ok(());
    }
    let text = ct.to_str().unwrap_or("");
    let mime = text.split(';').next().unwrap_or("").trim().as_bytes();
    // Case-insensitive without allocating a lower-case copy.
    let (json, prefix, suffix) = (b"application/json", b"application/", b"+json");
    if mime.eq_ignore_ascii_case(json)
        || (mime.len() >= prefix.len() + suffix.len()
            && mime[..prefix.len()].eq_ignore_ascii_case(prefix)
            && mime[mime.len() - suffix.len()..].eq_ignore_ascii_case(suffix))
    {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(text.to_string()))
    }
}

pub(crate) fn fail(state: &AppState, e: ApiError) -> Response {
    if !matches!(e.class(), crate::error::ErrorClass::Unavailable) {
        state.metrics().error(e.code());
    }
    e.into_response()
}

// ---------------------------------------------------------------------------------------------
// POST /v1/check

/// The `Router`'s route (reached by `POST /v1/check` only through [`router`]'s or an
/// embedder's own routing: [`ApiService`] answers it directly with [`check_native`]).
async fn v1_check(State(state): State<AppState>, req: Request) -> Response {
    check_native(state, req).await
}

/// `POST /v1/check`.
async fn check_native<B>(state: AppState, req: Request<B>) -> Response
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let trace_headers = crate::otel::trace_headers(state.tracing(), req.headers());
    let result = async {
        check_content_type(req.headers())?;
        let body = read_body(&state, req, state.limits().max_body_bytes).await?;
        parse_request_within(&body, Dialect::Native, state.limits())
    }
    .await;
    let check = match result {
        Ok(c) => c,
        Err(e) => return fail(&state, e),
    };
    // Only with a `queue` in the rules does a decision go through the queue's driver.
    let decided = if let Some(traced) = state
        .tracing()
        .map(|t| t.start(crate::otel::CHECK_SPAN, &trace_headers))
    {
        let decide = async {
            if state.has_queues() {
                crate::queue::decide_queued(&state, &check).await
            } else {
                crate::check::decide(&state, &check).await
            }
        };
        crate::otel::in_context(Some(traced), decide).await
    } else if state.has_queues() {
        crate::queue::decide_queued(&state, &check).await
    } else {
        crate::check::decide(&state, &check).await
    };
    match decided {
        Ok(resp) => native_response(&resp),
        Err(e) => e.into_response(),
    }
}

/// The `/v1/check` response: 200 / 429, JSON body and rate-limit headers.
///
/// The header values and the body are written into one buffer, shared by the body and every
/// header value: one allocation for all of them (and one for its shared handle), where a buffer
/// for the body and another for the header values cost four. Header names are static. No
/// `content-length`: hyper writes it from the body's exact size (axum's router would add it
/// to the map first, for a second formatting and one more insert).
pub fn native_response(resp: &CheckResponse) -> Response {
    let mut buf = Vec::with_capacity(128 + 320 * resp.statuses.len());
    let mut spans = [(0, 0); HEADER_NAMES.len()];
    let n = match &resp.headers {
        Some(h) => write_header_values(&mut buf, &mut spans, h),
        None => 0,
    };
    let body_start = buf.len();
    write_native(&mut buf, resp);
    let buf = Bytes::from(buf);
    let mut response = Response::new(Body::from(buf.slice(body_start..)));
    *response.status_mut() = status_of(resp);
    let headers = response.headers_mut();
    headers.reserve(1 + n);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Digits and ASCII labels: always valid header values.
    for (name, &(start, end)) in HEADER_NAMES.iter().zip(&spans[..n]) {
        if let Ok(v) = HeaderValue::from_maybe_shared(buf.slice(start..end)) {
            headers.insert(name.clone(), v);
        }
    }
    if let Some(rule) = &resp.degrade {
        headers.insert(DEGRADE_HEADER.clone(), degrade_value(rule));
    }
    response
}

/// On an allowed answer past a rule's `degrade` threshold: that rule's id (see
/// [`degrade_value`]). Forward-auth answers always carry it, empty when nothing degrades (Caddy
/// before 2.7 copies an absent header as the text of its placeholder); `/v1/check` answers only
/// when something does.
pub(crate) static DEGRADE_HEADER: axum::http::HeaderName =
    axum::http::HeaderName::from_static("x-ratelimit-degrade");

/// A rule id as a header value: bytes outside printable ASCII, and `%`, percent-encoded (ids
/// come from rule files and may hold any text).
pub(crate) fn degrade_value(rule: &str) -> HeaderValue {
    let plain = |b: u8| b.is_ascii_graphic() && b != b'%' || b == b' ';
    if rule.bytes().all(plain) {
        if let Ok(v) = HeaderValue::from_str(rule) {
            return v;
        }
    }
    let mut out = String::with_capacity(rule.len() * 3);
    for b in rule.bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static("1"))
}

/// The values of `h`'s headers, as `HeaderValues::for_each` gives them (same order, same text;
/// a test pins that), written one after the other into `buf`; `spans` gets where each is.
/// Returns how many there are (6 with `Retry-After`, else 5).
fn write_header_values(
    buf: &mut Vec<u8>,
    spans: &mut [(usize, usize); 6],
    h: &HeaderValues,
) -> usize {
    let mut n = itoa::Buffer::new();
    let mut num = |buf: &mut Vec<u8>, v: u64| {
        let start = buf.len();
        buf.extend_from_slice(n.format(v).as_bytes());
        (start, buf.len())
    };
    spans[0] = num(buf, h.limit);
    spans[1] = num(buf, h.remaining);
    spans[2] = num(buf, h.reset_secs);
    let (limit, remaining, reset) = (spans[0], spans[1], spans[2]);
    // `RateLimit-Policy`: `{limit};w={window}`.
    let start = buf.len();
    buf.extend_from_within(limit.0..limit.1);
    buf.extend_from_slice(b";w=");
    num(buf, h.window_secs);
    spans[3] = (start, buf.len());
    // `RateLimit`: `limit={limit}, remaining={remaining}, reset={reset}`.
    let start = buf.len();
    buf.extend_from_slice(b"limit=");
    buf.extend_from_within(limit.0..limit.1);
    buf.extend_from_slice(b", remaining=");
    buf.extend_from_within(remaining.0..remaining.1);
    buf.extend_from_slice(b", reset=");
    buf.extend_from_within(reset.0..reset.1);
    spans[4] = (start, buf.len());
    match h.retry_after_secs {
        Some(r) => {
            spans[5] = num(buf, r);
            6
        }
        None => 5,
    }
}

/// Add the rate-limit headers of `resp` (nothing when no limit applied).
pub(crate) fn add_headers(headers: &mut HeaderMap, resp: &CheckResponse) {
    if let Some(h) = &resp.headers {
        h.insert_into(headers);
    }
}

pub(crate) fn status_of(resp: &CheckResponse) -> StatusCode {
    if resp.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

/// A JSON response around `body`, with room for the rate-limit headers (no regrowth).
pub(crate) fn json_body(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.reserve(8);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The `/v1/check` body, written straight into `buf`: constant fragments for the keys, itoa for
/// numbers, serde_json's escaper for the strings that come from rules (no `Value` tree, no
/// per-field `Serialize` calls). The keys are in alphabetical order because that is what the
/// `serde_json::Value` maps this replaced printed; tests/response_bytes.rs pins the bytes.
fn write_native(buf: &mut Vec<u8>, resp: &CheckResponse) {
    let mut n = itoa::Buffer::new();
    // `degrade` and `shadowbanned` appear only when set, so answers without them are unchanged.
    buf.push(b'{');
    if let Some(rule) = &resp.degrade {
        buf.extend_from_slice(b"\"degrade\":");
        json_str(buf, rule);
        buf.push(b',');
    }
    buf.extend_from_slice(b"\"delay_ms\":");
    opt_num(buf, &mut n, (resp.delay > 0).then(|| ms_ceil(resp.delay)));
    // `as_str` names (codes, algorithms, units) are plain ASCII identifiers: nothing to escape.
    buf.extend_from_slice(b",\"overall_code\":\"");
    buf.extend_from_slice(resp.code().as_str().as_bytes());
    if resp.shadowbanned {
        buf.extend_from_slice(b"\",\"shadowbanned\":true,\"statuses\":[");
    } else {
        buf.extend_from_slice(b"\",\"statuses\":[");
    }
    for (i, s) in resp.statuses.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        buf.extend_from_slice(b"{\"code\":\"");
        buf.extend_from_slice(s.code.as_str().as_bytes());
        buf.extend_from_slice(b"\",\"current_limit\":");
        match &s.limit {
            None => buf.extend_from_slice(b"null"),
            Some(l) => {
                buf.extend_from_slice(b"{\"algorithm\":\"");
                buf.extend_from_slice(l.algorithm.as_str().as_bytes());
                buf.extend_from_slice(b"\",\"id\":");
                json_str(buf, &l.id);
                buf.extend_from_slice(b",\"name\":");
                opt_str(buf, l.name.as_deref());
                buf.extend_from_slice(b",\"requests_per_unit\":");
                buf.extend_from_slice(n.format(l.requests_per_unit).as_bytes());
                buf.extend_from_slice(b",\"unit\":\"");
                buf.extend_from_slice(l.unit.as_proto_str().as_bytes());
                buf.extend_from_slice(b"\",\"unit_multiplier\":");
                buf.extend_from_slice(n.format(l.unit_multiplier).as_bytes());
                buf.push(b'}');
            }
        }
        buf.extend_from_slice(b",\"delay_ms\":");
        opt_num(buf, &mut n, s.delay.map(ms_ceil));
        buf.extend_from_slice(b",\"duration_until_reset_ms\":");
        opt_num(buf, &mut n, s.reset_after.map(ms_ceil));
        buf.extend_from_slice(b",\"limit_remaining\":");
        buf.extend_from_slice(n.format(s.remaining).as_bytes());
        buf.extend_from_slice(b",\"message\":");
        opt_str(buf, s.message.as_deref());
        buf.extend_from_slice(b",\"retry_after_ms\":");
        opt_num(buf, &mut n, s.retry_after.map(ms_ceil));
        buf.extend_from_slice(b",\"shadow_mode\":");
        buf.extend_from_slice(if s.shadowed { b"true" } else { b"false" });
        buf.push(b'}');
    }
    buf.extend_from_slice(b"]}");
}

fn opt_num(buf: &mut Vec<u8>, n: &mut itoa::Buffer, v: Option<u64>) {
    match v {
        Some(v) => buf.extend_from_slice(n.format(v).as_bytes()),
        None => buf.extend_from_slice(b"null"),
    }
}

fn opt_str(buf: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => json_str(buf, v),
        None => buf.extend_from_slice(b"null"),
    }
}

/// A JSON string literal, escaped exactly as serde_json escapes it.
fn json_str(buf: &mut Vec<u8>, s: &str) {
    // Writing a `&str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

// ---------------------------------------------------------------------------------------------
// Introspection and health

/// Most limits (or, in a summary, domains) one page of `GET /v1/rules` lists by default, and
/// at most.
const RULES_PAGE: usize = 1000;
const RULES_PAGE_MAX: usize = 10_000;

/// `GET /v1/rules`: the running rules, a page at a time (`?domain=`, `?after=`, `?limit=`).
/// The limits themselves are listed only to a caller presenting the configured admin token (a
/// wrong one is 403); everyone else, and everyone when no token is configured, gets the
/// summary (each domain with its number of limits). Built and serialised on a blocking thread,
/// one listing at a time ([`AppState::admin_work`]).
async fn v1_rules(State(state): State<HttpState>, req: Request) -> Response {
    let query = match RulesQuery::parse(req.uri().query()) {
        Ok(q) => q,
        Err(message) => {
            let e = ApiError::Invalid {
                code: "invalid_query",
                message,
            };
            state.metrics().error(e.code());
            return e.into_response();
        }
    };
    // The limits name client keys (`remote_address` values, API keys): an admin surface. Only
    // the admin token unlocks them; with none configured, everyone gets the summary.
    let full = match state.registry.as_ref().filter(|r| r.writable()) {
        None => false,
        Some(registry) => match req.headers().get(axum::http::header::AUTHORIZATION) {
            None => false,
            Some(value) => match registry.authorize(Some(value.as_bytes())) {
                Ok(()) => true,
                Err(e) => {
                    state.metrics().error(e.code());
                    return e.into_response();
                }
            },
        },
    };
    let st = state.clone();
    let body = state
        .admin_work(move || serde_json::to_vec(&rules_page(&st, &query, full)))
        .await;
    match body {
        Some(Ok(bytes)) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response(),
        _ => ApiError::Internal("the rules listing failed".into()).into_response(),
    }
}

/// The query of `GET /v1/rules`.
#[derive(Debug, Clone, Default)]
pub(crate) struct RulesQuery {
    /// Only this domain.
    pub domain: Option<String>,
    /// Only the domains after this name (the previous page's `next_after`).
    pub after: Option<String>,
    /// Most limits on the page (domains in a summary); a domain is never split.
    pub limit: usize,
}

impl RulesQuery {
    /// `domain=`, `after=`, `limit=` (others are ignored); a message when one is not valid.
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut q = RulesQuery {
            limit: RULES_PAGE,
            ..RulesQuery::default()
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v)
                .ok_or_else(|| format!("`{k}` is not valid UTF-8 once decoded"))?;
            match k {
                "domain" => q.domain = Some(v),
                "after" => q.after = Some(v),
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=RULES_PAGE_MAX).contains(n))
                        .ok_or_else(|| {
                            format!("limit must be a number from 1 to {RULES_PAGE_MAX}, not `{v}`")
                        })?
                }
                _ => {}
            }
        }
        Ok(q)
    }
}

/// `%XX` and `+` decoded; `None` when the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The body of `GET /v1/rules`, everything in one page (tests, embedding).
pub fn rules_json(state: &AppState) -> Value {
    let query = RulesQuery {
        limit: usize::MAX,
        ..RulesQuery::default()
    };
    rules_page(state, &query, true)
}

/// What a summary of `GET /v1/rules` says about getting the limits.
const SUMMARY_HINT: &str = "each limit is listed only to the admin: start serve with \
--admin-token-file and send `Authorization: Bearer <token>`";

/// One page of `GET /v1/rules`: `full` lists each limit, else each domain's number of limits.
pub(crate) fn rules_page(state: &AppState, query: &RulesQuery, full: bool) -> Value {
    let rules = state.rules();
    let set = &rules.set;
    let mut domains: Vec<Value> = Vec::new();
    let mut used = 0usize;
    let mut more = false;
    let selected = set
        .domains()
        .filter(|d| query.domain.as_deref().is_none_or(|name| d.name == name))
        .filter(|d| {
            query
                .after
                .as_deref()
                .is_none_or(|after| d.name.as_str() > after)
        });
    for d in selected {
        let limits = set.limits_of(d);
        let cost = if full { limits.len().max(1) } else { 1 };
        if !domains.is_empty() && used.saturating_add(cost) > query.limit {
            more = true;
            break;
        }
        used = used.saturating_add(cost);
        let mut entry = json!({"domain": d.name, "file": d.file, "limit_count": limits.len()});
        if full {
            let flush = state.backend().redis().map(|g| g.settings().flush_interval);
            entry["limits"] = limits
                .iter()
                .map(|l| limit_json(l, flush))
                .collect::<Vec<_>>()
                .into();
        }
        domains.push(entry);
    }
    // Where the next page starts (`?after=`), when there is one.
    let next_after = domains.last().filter(|_| more).map(|v| v["domain"].clone());
    let report = state
        .backend()
        .redis()
        .map(|g| crate::backend::report(g))
        .unwrap_or_default();
    let store = match state.backend().redis() {
        Some(g) => json!({
            "kind": "redis",
            "url": g.store().url(),
            "prefix": g.store().options().prefix,
            "state": g.state().as_str(),
            "on_store_error": g.settings().policy.as_str(),
            "expected_instances": g.settings().expected_instances,
            "local_deny_cache": g.settings().deny_cache,
            "condition": report["store_condition"],
            "last_error": report["store_error"],
            "per_second": state.backend().per_second().map(|p| {
                let r = crate::backend::report(p);
                json!({
                    "url": p.store().url(),
                    "state": p.state().as_str(),
                    "condition": r["store_condition"],
                    "last_error": r["store_error"],
                })
            }),
        }),
        None => json!({"kind": "memory"}),
    };
    let error = state
        .last_reload_error()
        .map(|e| json!({"at_ms": e.at / 1000, "errors": e.errors}));
    json!({
        "version": rules.hash,
        "generation": rules.generation,
        "loaded_at_ms": rules.loaded_at / 1000,
        "path": state
            .rules_path()
            .filter(|_| state.xds().is_none())
            .map(|p| p.display().to_string()),
        "xds": state.xds().map(|x| json!({
            "server": x.server(),
            "connected": x.connected(),
            "version": x.has_config().then(|| x.version()),
        })),
        "store": store,
        "detail": if full { "full" } else { "summary" },
        "detail_hint": (!full).then_some(SUMMARY_HINT),
        "domain_count": set.domains().count(),
        "limit_count": set.limits().count(),
        "domains": domains,
        "next_after": next_after,
        "last_reload_error": error,
    })
}

/// One limit as `GET /v1/rules` lists it; `flush` is the store's default flush interval (a
/// Redis store's `--sync-flush-interval`), shown for batched limits that name none.
fn limit_json(l: &tollgate_core::rules::Limit, flush: Option<std::time::Duration>) -> Value {
    let batched = l
        .quota
        .filter(|q| q.sync() == tollgate_core::SyncMode::Batched);
    json!({
        "id": l.id,
        "name": l.name,
        "quota": l.quota.map(|q| json!({
            "requests_per_unit": q.limit(),
            "unit": q.period().unit.as_str(),
            "unit_multiplier": q.period().multiplier,
            "burst": q.burst(),
        })),
        "unlimited": l.is_unlimited(),
        "algorithm": l.quota.map(|q| q.algorithm().as_str()),
        "sync": l.quota.map(|q| q.sync().as_str()),
        "doorkeeper": l.quota.and_then(|q| q.doorkeeper()).map(|d| json!({
            "expected_keys": d.expected_keys(),
            "fp_rate": d.fp_rate(),
            "bytes": d.memory(),
        })),
        "flush_interval_ms": batched
            .and_then(|q| q.flush_interval().or(flush))
            .map(|d| d.as_millis() as u64),
        "shadow_mode": l.shadow_mode,
        "message": l.message,
        "replaces": l.replaces,
        "detailed_metric": l.detailed_metric || l.value_to_metric,
        "quota_mode": l.quota_mode,
        "degrade_below_remaining": l.degrade.map(|t| t.to_string()),
        "shadowban": l.shadowban,
        "tiers": l.tiers.as_ref().map(|t| json!({
            "key": t.key,
            "levels": t.levels.iter().map(|v| json!({
                "value": v.value,
                "guaranteed": v.guaranteed,
                "ceiling": v.ceiling,
                "reserve": v.reserve,
            })).collect::<Vec<_>>(),
        })),
        "stats_key": l.stats.base(),
        "source": format!("{}:{}", l.file, l.line),
    })
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// Ready: the memory store always; a custom store when it answers an empty check. With Redis
/// the service is ready whatever the store state (the failure policy answers during an outage,
/// so taking every instance out of rotation would only turn a degraded service into none):
/// `status` is `ready` when Redis answers and `degraded` while the breaker is open or half-open;
/// `store_condition` names a failure going on (`ok`, `out_of_memory`, `wrongtype`, ...) and
/// `store_error` the last one (kind, message, `at_ms`). With a per-second Redis, `per_second`
/// reports it the same way, and `status` is `degraded` while either breaker is not closed.
async fn readyz(State(state): State<AppState>) -> Response {
    if let Some(x) = state.xds().filter(|x| !x.ready()) {
        // Rules come from an xDS server and none have arrived: no traffic yet.
        let body = json!({"error": {
            "code": "rules_not_loaded",
            "message": format!(
                "no rules from the xDS server {} yet (stream {})",
                x.server(),
                if x.connected() { "open" } else { "not open" }
            ),
        }});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    match state.backend() {
        Backend::Redis(g) | Backend::RedisSplit(g, _) => {
            let s = g.state();
            let report = crate::backend::report(g);
            let second = state.backend().per_second();
            let healthy = s == BreakerState::Healthy
                && second.is_none_or(|p| p.state() == BreakerState::Healthy);
            let status = if healthy { "ready" } else { "degraded" };
            let mut body = json!({
                "status": status,
                "store": "redis",
                "store_state": s.as_str(),
                "on_store_error": g.settings().policy.as_str(),
                "store_condition": report["store_condition"],
                "store_error": report["store_error"],
            });
            if let Some(p) = second {
                let r = crate::backend::report(p);
                body["per_second"] = json!({
                    "store_state": p.state().as_str(),
                    "store_condition": r["store_condition"],
                    "store_error": r["store_error"],
                });
            }
            axum::Json(body).into_response()
        }
        Backend::Local(store) => match store.check(state.now(), &[]) {
            Ok(_) => axum::Json(json!({"status": "ready", "store": "memory"})).into_response(),
            Err(e) => {
                state.metrics().store_error();
                ApiError::Store(e).into_response()
            }
        },
    }
}

async fn metrics(State(state): State<HttpState>) -> Response {
    let mut page = crate::exposition::Exposition::with_capacity(16 * 1024);
    state.expose(&mut page);
    if let Some(r) = &state.registry {
        r.expose(&mut page);
    }
    let text = page.into_string();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        Body::from(text),
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI_JSON,
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------------
// Errors as responses: the one place an `ApiError` becomes an HTTP answer.

/// The HTTP status of `e`.
pub(crate) fn error_status(e: &ApiError) -> StatusCode {
    if let ApiError::BodyTimeout(_) = e {
        return StatusCode::REQUEST_TIMEOUT;
    }
    match e.class() {
        ErrorClass::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorClass::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorClass::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorClass::NotFound => StatusCode::NOT_FOUND,
        ErrorClass::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorClass::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = error_status(&self);
        if status.is_server_error() {
            tracing::error!(code = self.code(), error = %self, "request failed");
        } else {
            tracing::debug!(code = self.code(), error = %self, "bad request");
        }
        let mut response = (
            status,
            axum::Json(crate::error::error_body(self.code(), &self.to_string())),
        )
            .into_response();
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body may still come: close rather than read it as the next
            // request (HTTP/1.1; HTTP/2 drops connection headers, the stream ends anyway).
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batched_limit_lists_its_flush_interval() {
        use std::time::Duration;
        use tollgate_core::{Quota, SyncMode, Unit};
        let q = Quota::new(5, Unit::Second).with_sync(SyncMode::Batched);
        let own = tollgate_core::rules::Limit::new(
            "d|k",
            "d",
            Some(q.with_flush_interval(Some(Duration::from_millis(20)))),
        );
        let default = Some(Duration::from_millis(100));
        assert_eq!(limit_json(&own, default)["flush_interval_ms"], 20);
        let named_none = tollgate_core::rules::Limit::new("d|k", "d", Some(q));
        assert_eq!(limit_json(&named_none, default)["flush_interval_ms"], 100);
        let exact =
            tollgate_core::rules::Limit::new("d|k", "d", Some(q.with_sync(SyncMode::Exact)));
        assert!(limit_json(&exact, default)["flush_interval_ms"].is_null());
    }

    #[test]
    fn header_values_are_written_as_for_each_gives_them() {
        let cases = [
            HeaderValues {
                limit: 1_000_000_000,
                remaining: 999_999_999,
                reset_secs: 1,
                retry_after_secs: None,
                window_secs: 1,
            },
            HeaderValues {
                limit: 5,
                remaining: 0,
                reset_secs: 2,
                retry_after_secs: Some(1),
                window_secs: 60,
            },
            HeaderValues {
                limit: u64::MAX,
                remaining: u64::MAX,
                reset_secs: u64::MAX,
                retry_after_secs: Some(u64::MAX),
                window_secs: u64::MAX,
            },
        ];
        for h in cases {
            let mut want = Vec::new();
            h.for_each(|name, value| want.push((name.to_string(), value.to_string())));
            let mut buf = b"prefix".to_vec();
            let mut spans = [(0, 0); 6];
            let n = write_header_values(&mut buf, &mut spans, &h);
            let got: Vec<(String, String)> = HEADER_NAMES
                .iter()
                .zip(&spans[..n])
                .map(|(name, &(a, b))| {
                    let value = std::str::from_utf8(&buf[a..b]).unwrap();
                    (name.as_str().to_string(), value.to_string())
                })
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn content_types() {
        let ok = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            check_content_type(&h).is_ok()
        };
        for good in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ;x=1",
            "application/merge-patch+json",
            "APPLICATION/PROBLEM+JSON",
            "application/+json",
        ] {
            assert!(ok(good), "{good}");
        }
        for bad in [
            "text/plain",
            "application/jsonx",
            "application/xml",
            "text/json",
            "json",
            "application/",
            "+json",
            "",
        ] {
            assert!(!ok(bad), "{bad}");
        }
        assert!(check_content_type(&HeaderMap::new()).is_ok());
    }
}
