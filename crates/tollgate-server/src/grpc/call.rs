//! On those connections `ShouldRateLimit` itself does not go through tonic: a POST to its path
//! is answered directly on hyper's stream (`should_rate_limit`: the message read whole, prost,
//! `RateLimitGrpc::respond_encoded`, one message and the `grpc-status` trailers back), which
//! costs fewer instructions than tonic's generic unary stack. Health, reflection and every other
//! path go through tonic's routes, and both paths answer the same statuses.

use super::codec::{
    trailers_only, unary_response, GrpcBody, MessageReader, GRPC_ENCODING, GRPC_TIMEOUT,
};
use super::rls::{count_check, status_from, RateLimitGrpc, INVALID_PROTOBUF};

use crate::error::ApiError;
use futures_util::FutureExt;
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::codegen::http;
use tonic::codegen::http::Request as HttpRequest;
use tonic::Status;
use tonic_prost::prost;

/// The HTTP/2 path of `ShouldRateLimit`.
pub(super) const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A stream's answer, as the connection's service returns it: made already (the common case:
/// the whole request was in hand and the store is in this process), or a future to run.
// The answer made (a response, ~240 bytes) is kept inline: boxing it would cost an allocation
// per call to save a copy of a few hundred bytes.
#[allow(clippy::large_enum_variant)]
pub(super) enum Answer {
    /// Answered while hyper handed the request over (`should_rate_limit`).
    Now(Option<http::Response<GrpcBody>>),
    /// A call that has to wait (its body, Redis, tonic's routes), with its timeout.
    Later(Pin<Box<dyn Future<Output = http::Response<GrpcBody>> + Send>>),
}

impl Future for Answer {
    type Output = Result<http::Response<GrpcBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Answer::Now(response) => Poll::Ready(Ok(response
                .take()
                .expect("an answer is polled until it is ready"))),
            Answer::Later(call) => call.as_mut().poll(cx).map(Ok),
        }
    }
}

/// The time a call may take: `--grpc-request-timeout`, or the client's own deadline
/// (`grpc-timeout`, Envoy sends its rate-limit timeout) when shorter.
pub(super) fn call_timeout(headers: &http::HeaderMap, request_timeout: Duration) -> Duration {
    headers
        .get(GRPC_TIMEOUT)
        .and_then(|v| parse_grpc_timeout(v.as_bytes()))
        .map_or(request_timeout, |t| t.min(request_timeout))
}

/// `call`, answered DEADLINE_EXCEEDED if not done within `timeout`. A call that completes when
/// first polled arms no timer (one costs a timer-wheel entry).
pub(super) async fn within(
    timeout: Duration,
    call: impl Future<Output = http::Response<GrpcBody>>,
) -> http::Response<GrpcBody> {
    let mut call = std::pin::pin!(call);
    if let Some(response) = call.as_mut().now_or_never() {
        return response;
    }
    match tokio::time::timeout(timeout, call).await {
        Ok(response) => response,
        Err(_) => trailers_only(Status::deadline_exceeded(
            "request not completed within the server's request timeout",
        )),
    }
}

/// `ShouldRateLimit` served directly on hyper's HTTP/2 stream, without tonic's generic unary
/// machinery (its router, streaming decoder, encoder and three boxed bodies, which cost more
/// than deciding): the request message is read whole, decoded by prost, answered by
/// [`RateLimitGrpc::respond_encoded`] (written straight from the decision, [`encode_decision`]),
/// and sent as one message plus trailers. What a client sees is what tonic answers, error cases
/// included: compressed requests are refused (UNIMPLEMENTED for a `grpc-encoding` other than
/// `identity`, INTERNAL for a compressed flag without one), a message over `--max-body-bytes` is
/// OUT_OF_RANGE before it is read, a missing or truncated message INTERNAL, and one that does
/// not decode INVALID_ARGUMENT (see [`RlsDecoder`]). Data after the one message of this unary
/// call is INVALID_ARGUMENT.
///
/// This runs as hyper hands the request over, inside the connection task's poll. When the
/// whole request is already in hand (h2 has read HEADERS, DATA and END_STREAM before handing
/// the stream over whenever they came in one read) and the store is in this process, the call
/// is answered here and then ([`Answer::Now`]): nothing is spawned, boxed or moved, and
/// [`InlineExecutor`] then sends the answer within the same poll. Otherwise (the body still
/// to come, Redis) the rest runs as a future, within the call's timeout ([`Answer::Later`]).
/// A panic here answers INTERNAL rather than unwinding through the connection.
pub(super) fn should_rate_limit(
    rls: &Arc<RateLimitGrpc>,
    req: HttpRequest<Incoming>,
    max_message: usize,
    request_timeout: Duration,
) -> Answer {
    let answer = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let (parts, body) = req.into_parts();
        // The call's span when traces are on (one branch when off).
        let traced = rls
            .state
            .tracing()
            .map(|t| t.start(crate::otel::RLS_SPAN, &parts.headers));
        if let Some(status) = encoding_refused(&parts.headers) {
            return Answer::Now(Some(trailers_only(status)));
        }
        let mut reader = MessageReader::new(body, max_message);
        let message = match reader.poll_message(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(message)) => message,
            Poll::Ready(Err(status)) => return Answer::Now(Some(trailers_only(status))),
            Poll::Pending => {
                let rls = Arc::clone(rls);
                let call = async move {
                    let message = std::future::poll_fn(|cx| reader.poll_message(cx)).await;
                    let request = match message.and_then(|m| decode_request(&rls, m)) {
                        Ok(request) => request,
                        Err(status) => return trailers_only(status),
                    };
                    unary_response(rls.respond_encoded(request).await)
                };
                let call = crate::otel::in_context(traced, call);
                let timeout = call_timeout(&parts.headers, request_timeout);
                return Answer::Later(Box::pin(within(timeout, call)));
            }
        };
        let request = match decode_request(rls, message) {
            Ok(request) => request,
            Err(status) => return Answer::Now(Some(trailers_only(status))),
        };
        if rls.answers_now() {
            let _current = traced.map(opentelemetry::Context::attach);
            return Answer::Now(Some(unary_response(rls.respond_encoded_now(request))));
        }
        let rls = Arc::clone(rls);
        let call = async move { unary_response(rls.respond_encoded(request).await) };
        let call = crate::otel::in_context(traced, call);
        let timeout = call_timeout(&parts.headers, request_timeout);
        Answer::Later(Box::pin(within(timeout, call)))
    }));
    answer.unwrap_or_else(|_| {
        tracing::error!("gRPC ShouldRateLimit panicked");
        Answer::Now(Some(trailers_only(Status::internal(
            "panic while answering",
        ))))
    })
}

/// UNIMPLEMENTED for a compressed request (tonic's answer: no compression is configured).
fn encoding_refused(headers: &http::HeaderMap) -> Option<Status> {
    let encoding = headers.get(GRPC_ENCODING)?;
    if encoding.as_bytes() == b"identity" {
        return None;
    }
    let mut status = Status::unimplemented(format!(
        "Content is compressed with `{}` which isn't supported",
        String::from_utf8_lossy(encoding.as_bytes())
    ));
    status.metadata_mut().insert(
        "grpc-accept-encoding",
        tonic::metadata::MetadataValue::from_static("identity"),
    );
    Some(status)
}

/// The request message decoded; INVALID_ARGUMENT (counted) when it is not a `RateLimitRequest`
/// or holds more descriptors or entries than the limits (refused before decoding, see
/// [`count_check`]).
fn decode_request(rls: &RateLimitGrpc, message: bytes::Bytes) -> Result<RateLimitRequest, Status> {
    if let Err(e) = count_check(&message, rls.state.limits()) {
        rls.state.metrics().error(e.code());
        return Err(status_from(&e));
    }
    <RateLimitRequest as prost::Message>::decode(message).map_err(|e| {
        rls.state.metrics().error(INVALID_PROTOBUF);
        status_from(&ApiError::invalid(
            INVALID_PROTOBUF,
            format!("request is not a valid RateLimitRequest: {e}"),
        ))
    })
}

/// A `grpc-timeout` header value: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`);
/// `None` when malformed (then only the server's request timeout applies).
fn parse_grpc_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_header() {
        assert_eq!(parse_grpc_timeout(b"20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_grpc_timeout(b"1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            parse_grpc_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in [&b""[..], b"m", b"123456789m", b"10x", b"-1S", b"1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
