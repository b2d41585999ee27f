//! The tower side: [`RateLimitLayer`] wraps a service in [`RateLimit`], whose future either
//! answers a denial itself, calls the inner service right away (adding the rate-limit headers to
//! its response), or, for a shaped request or a backend that does I/O, waits first.
//!
//! The fast path (memory store, no delay) is one synchronous decision in `call` and the inner
//! service's own future, wrapped without boxing. The other paths box one future that owns a
//! clone of the inner service (the ready one is moved into it, tower's usual pattern for
//! services called later than `poll_ready`). Dropping that future (the client went away)
//! drops the sleep or the store call with it: nothing is left running, and the inner service
//! is never called. A request's place in a leaky bucket's queue stays consumed, as in nginx.
//!
//! gRPC requests (`content-type: application/grpc...`) are refused the gRPC way: HTTP 200
//! with `grpc-status: 8` (RESOURCE_EXHAUSTED), the message in `grpc-message`, the rate-limit
//! headers as metadata and no body (a trailers-only response).

use crate::key::Head;
use crate::limiter::{Answer, Headers, Later, Limiter, Prepared};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The message of a request that a key needs the client address of, served without it.
const NO_PEER: &str = "tollgate: the request carries no client address (serve axum with \
     `into_make_service_with_connect_info::<SocketAddr>()`, or insert a `SocketAddr` extension)";

/// A tower [`Layer`] that rate-limits (and shapes) the requests of the service it wraps.
/// Built by [`RateLimitLayer::builder`]; cheap to clone, and every clone and every service it
/// makes share one limiter (one set of counters).
#[derive(Clone)]
pub struct RateLimitLayer {
    pub(crate) limiter: Arc<Limiter>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// How many requests wait now in the queues of rules with a `queue` option (see
    /// docs/rules.md, "Queueing"), all lines together: for a gauge of the application's own.
    pub fn waiting(&self) -> usize {
        self.limiter.queue.waiting()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes: `S` behind the limits.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Response bodies the layer can answer a denial with (the message, as text).
///
/// Implemented for axum's and tonic's bodies, `http_body_util::Full<Bytes>` and `String`.
pub trait ResponseBody: Sized {
    /// A body holding `text`.
    fn from_text(text: String) -> Self;
}

impl ResponseBody for String {
    fn from_text(text: String) -> Self {
        text
    }
}

impl ResponseBody for http_body_util::Full<bytes::Bytes> {
    fn from_text(text: String) -> Self {
        Self::new(text.into())
    }
}

#[cfg(feature = "axum")]
impl ResponseBody for axum::body::Body {
    fn from_text(text: String) -> Self {
        text.into()
    }
}

#[cfg(feature = "tonic")]
impl ResponseBody for tonic::body::Body {
    fn from_text(text: String) -> Self {
        tonic::body::Body::new(text)
    }
}

type BoxFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

pin_project! {
    /// The future of [`RateLimit`]'s responses.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
        // Beside the state, not in it: the inner future is then built in place (one copy less).
        headers: Headers,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Ready { response: Option<Response<B>> },
        Inner { #[pin] future: F },
        Boxed { future: BoxFuture<B, E> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Ready { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r)),
                None => panic!("ResponseFuture polled after completion"),
            },
            // Nothing to add: the inner future's own poll, with nothing moved.
            StateProj::Inner { future } if matches!(this.headers, Headers::None) => future.poll(cx),
            StateProj::Inner { future } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                this.headers.add_to(response.headers_mut());
                Poll::Ready(Ok(response))
            }
            StateProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// A service [`RateLimit`] can wrap: one of HTTP requests, cloneable, whose future and error
/// may move to another task (a request that waits first is served from a future of its own,
/// which owns a clone of the service). Implemented for every such service.
pub trait LimitableService<ReqBody>:
    Service<Request<ReqBody>, Future: Send + 'static, Error: Send + 'static> + Clone + Send + 'static
{
}

impl<S, ReqBody> LimitableService<ReqBody> for S
where
    S: Service<Request<ReqBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: LimitableService<ReqBody, Response = Response<ResBody>>,
    ReqBody: Send + 'static,
    ResBody: ResponseBody + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let prepared = if self.limiter.needs_parts() {
            // A closure key reads the request's `Parts`.
            let (parts, body) = req.into_parts();
            let prepared = self.limiter.prepare(&Head::of_parts(&parts));
            req = Request::from_parts(parts, body);
            prepared
        } else {
            self.limiter.prepare(&Head::of(&req))
        };
        let headers = match prepared {
            Prepared::Pass(headers) => headers,
            // Out of line, so that the common case builds its future in place.
            Prepared::Later(later) => return self.call_otherwise(req, *later),
        };
        ResponseFuture {
            state: State::Inner {
                future: self.inner.call(req),
            },
            headers,
        }
    }
}

impl<S> RateLimit<S> {
    /// [`Service::call`] for a request that is refused, shaped, or decided by a backend that
    /// does I/O.
    #[inline(never)]
    fn call_otherwise<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
        prepared: Later,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: LimitableService<ReqBody, Response = Response<ResBody>>,
        ReqBody: Send + 'static,
        ResBody: ResponseBody + Send + 'static,
    {
        let Ok((query, known)) = prepared else {
            return ready(refusal(Answer::NoPeer, req.headers()));
        };
        let query = match (query, known) {
            (_, Some(a @ (Answer::Deny { .. } | Answer::NoPeer))) => {
                return ready(refusal(a, req.headers()));
            }
            (_, Some(Answer::Shadowban)) => {
                return ready(self.limiter.shadowban.to_response());
            }
            (query, known) => (query, known),
        };
        // Shaped, or a backend that does I/O: a future that owns the ready inner service.
        let grpc = is_grpc(req.headers());
        let ready_one = self.inner.clone();
        let mut service = std::mem::replace(&mut self.inner, ready_one);
        let limiter = self.limiter.clone();
        let future = async move {
            let answer = match query {
                (_, Some(a)) => a,
                (Some(q), None) => limiter.decide(&q).await,
                (None, None) => Answer::Allow {
                    headers: Headers::None,
                    delay: std::time::Duration::ZERO,
                },
            };
            match answer {
                Answer::Allow { headers, delay } => {
                    let headers = limiter.on_allow(headers);
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let mut response = service.call(req).await?;
                    headers.add_to(response.headers_mut());
                    Ok(response)
                }
                Answer::Degrade {
                    headers,
                    delay,
                    degraded,
                } => {
                    let headers = limiter.on_allow(headers);
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let value = degraded.header_value();
                    let mut req = req;
                    req.extensions_mut().insert(degraded);
                    let mut response = service.call(req).await?;
                    headers.add_to(response.headers_mut());
                    response
                        .headers_mut()
                        .insert(crate::signal::DEGRADE_HEADER.clone(), value);
                    Ok(response)
                }
                Answer::Shadowban => Ok(limiter.shadowban.to_response()),
                refused => Ok(refusal_as(refused, grpc)),
            }
        };
        ResponseFuture {
            state: State::Boxed {
                future: Box::pin(future),
            },
            headers: Headers::None,
        }
    }
}

#[inline(always)]
fn ready<F, B, E>(response: Response<B>) -> ResponseFuture<F, B, E> {
    ResponseFuture {
        state: State::Ready {
            response: Some(response),
        },
        headers: Headers::None,
    }
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The response to a denial or a request the layer cannot limit, for a request with `headers`.
fn refusal<B: ResponseBody>(answer: Answer, headers: &HeaderMap) -> Response<B> {
    refusal_as(answer, is_grpc(headers))
}

/// [`refusal`], for a gRPC request or not.
fn refusal_as<B: ResponseBody>(answer: Answer, grpc: bool) -> Response<B> {
    let (status, grpc_code, headers, message) = match answer {
        Answer::Deny { headers, message } => (StatusCode::TOO_MANY_REQUESTS, "8", headers, message),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "13",
            Headers::None,
            NO_PEER.to_owned(),
        ),
    };
    let mut response;
    if grpc {
        response = Response::new(B::from_text(String::new()));
        let h = response.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from_static(grpc_code));
        if let Ok(v) = HeaderValue::from_str(&grpc_message(&message)) {
            h.insert("grpc-message", v);
        }
    } else {
        response = Response::new(B::from_text(format!("{message}\n")));
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    headers.add_to(response.headers_mut());
    response
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%` itself.
fn grpc_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(super::grpc_message("50% off, é"), "50%25 off, %C3%A9");
    }
}
