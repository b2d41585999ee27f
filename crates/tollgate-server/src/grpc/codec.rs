//! The wire format of one unary call, without tonic: the request's one message read whole and
//! bounded (`MessageReader`), and an answer as one length-prefixed message then the
//! `grpc-status` trailers, or trailers only for an error.

use hyper::body::Incoming;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::codegen::{http, Body};
use tonic::Status;

/// Header names of every call, made once (a name given as a string is parsed and checked each
/// time it is used).
pub(super) const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
pub(super) const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// A response body: one encoded message then the trailers (the direct path), or tonic's.
pub(super) type GrpcBody = http_body_util::Either<UnaryBody, tonic::body::Body>;

/// The wire format of a unary response: one length-prefixed message (RFC-free, from gRPC's
/// "PROTOCOL-HTTP2": compressed flag 0, 4-byte big-endian length) in one DATA frame, then the
/// trailers `grpc-status: 0`. Empty (`Default`), it is the body of a trailers-only answer.
#[derive(Default)]
pub(super) struct UnaryBody {
    message: Option<bytes::Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl Body for UnaryBody {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(message))));
        }
        Poll::Ready(
            this.trailers
                .take()
                .map(|t| Ok(hyper::body::Frame::trailers(t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }

    // No `size_hint`: an exact one makes hyper add a `content-length` header to every answer,
    // which gRPC does not use (its messages carry their length) and which costs a header to
    // insert and HPACK-encode per call.
}

/// The HTTP response of a unary call: the message then `grpc-status: 0`, or the error status.
pub(super) fn unary_response(message: Result<bytes::Bytes, Status>) -> http::Response<GrpcBody> {
    let message = match message {
        Ok(message) => message,
        Err(status) => return trailers_only(status),
    };
    let mut trailers = http::HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, http::HeaderValue::from_static("0"));
    let mut response = http::Response::new(http_body_util::Either::Left(UnaryBody {
        message: Some(message),
        trailers: Some(trailers),
    }));
    // Room for the one header, not the default map's.
    *response.headers_mut() = http::HeaderMap::with_capacity(1);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// An error answer: the status in the headers, no body (gRPC's "trailers-only" response).
pub(super) fn trailers_only(status: Status) -> http::Response<GrpcBody> {
    status
        .into_http::<UnaryBody>()
        .map(http_body_util::Either::Left)
}

/// Reads the request's one message (without its 5-byte prefix) to the end of the stream. A
/// poll that returns `Pending` keeps what was read, so the same reader can be polled first with
/// a no-op waker (is it all here?) and then awaited.
pub(super) struct MessageReader {
    body: Incoming,
    max_message: usize,
    /// Usually the whole message comes in one DATA frame and is used as it is (no copy).
    first: Option<bytes::Bytes>,
    /// The frames so far, when there were several.
    more: Option<bytes::BytesMut>,
}

impl MessageReader {
    pub(super) fn new(body: Incoming, max_message: usize) -> Self {
        Self {
            body,
            max_message,
            first: None,
            more: None,
        }
    }

    pub(super) fn poll_message(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<bytes::Bytes, Status>> {
        use bytes::Buf as _;
        // Until the stream ends: known from h2 after the last DATA frame (one lock), rather than
        // by polling once more for the end (two).
        while let Some(frame) = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            let frame = frame.map_err(|e| Status::internal(format!("reading the request: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            match (&mut self.first, &mut self.more) {
                (None, _) => self.first = Some(data),
                (Some(f), None) => {
                    let mut m = bytes::BytesMut::with_capacity(f.len() + data.len());
                    m.extend_from_slice(f);
                    m.extend_from_slice(&data);
                    self.more = Some(m);
                }
                (Some(_), Some(m)) => m.extend_from_slice(&data),
            }
            let have = self
                .more
                .as_deref()
                .or(self.first.as_deref())
                .unwrap_or_default();
            if have.len() >= 5 {
                let len = u32::from_be_bytes([have[1], have[2], have[3], have[4]]) as usize;
                if len > self.max_message {
                    return Poll::Ready(Err(Status::out_of_range(format!(
                        "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                        self.max_message
                    ))));
                }
                // A unary call carries one message: data past it is refused as it arrives, not
                // buffered (else a client could stream without end into one request).
                if have.len() > 5 + len {
                    return Poll::Ready(Err(Status::invalid_argument(
                        "a unary call carries one request message: data follows it",
                    )));
                }
            }
            if Body::is_end_stream(&self.body) {
                break;
            }
        }
        let mut all = match (self.first.take(), self.more.take()) {
            (None, _) => return Poll::Ready(Err(Status::internal("Missing request message."))),
            (Some(_), Some(m)) => m.freeze(),
            (Some(f), None) => f,
        };
        if all.len() < 5 {
            return Poll::Ready(Err(Status::internal("Unexpected EOF decoding stream.")));
        }
        match all[0] {
            0 => {}
            1 => {
                return Poll::Ready(Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                )))
            }
            f => {
                return Poll::Ready(Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                ))))
            }
        }
        let len = u32::from_be_bytes([all[1], all[2], all[3], all[4]]) as usize;
        all.advance(5);
        if all.len() < len {
            return Poll::Ready(Err(Status::internal("Unexpected EOF decoding stream.")));
        }
        all.truncate(len);
        Poll::Ready(Ok(all))
    }
}
