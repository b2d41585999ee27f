//! The Envoy RLS v3 gRPC service (DESIGN.md section 5):
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the `envoy-types`
//! pre-generated protobuf types (no protoc), plus the standard `grpc.health.v1.Health` service.
//!
//! Like HTTP, this is only a translation layer: protobuf in, [`CheckRequest`] to
//! [`crate::check::decide`], [`CheckResponse`] back to protobuf, so every transport gives the
//! same decisions. Field mapping follows Envoy and envoyproxy/ratelimit:
//!
//! - request `hits_addend` (proto3 `uint32`): 0 or unset means 1;
//! - descriptor `hits_addend` (`UInt64Value`): when set, that descriptor's cost, even 0 (a query);
//! - descriptor `limit` (the per-request override): replaces the configured rule in a known
//!   domain, as envoyproxy/ratelimit does ([`tollgate_core::limiter::LimitOverride`]); unit
//!   `UNKNOWN` is INVALID_ARGUMENT;
//! - `limit_remaining`: `u32::MAX` for an `unlimited` rule, 0 when no rule matched, otherwise
//!   the remaining count (saturated to `u32`);
//! - `current_limit.unit`: all seven units map one to one (WEEK=7, MONTH=5, YEAR=6 in the enum);
//!   a `unit_multiplier` has no Envoy field and is not reported here (see `/v1/check`);
//! - `response_headers_to_add`: the same headers as HTTP ([`crate::model::HeaderValues::pairs`])
//!   when `--response-headers` is on.
//!
//! Errors are mapped once, by [`status_from`]. A request that is not valid protobuf (garbage
//! bytes, a `domain` that is not UTF-8, groups nested past prost's recursion limit) is the
//! client's fault: INVALID_ARGUMENT with prost's message and the `invalid_protobuf` error code
//! (counted in `tollgate_request_errors_total`), not the INTERNAL that tonic's prost codec
//! answers. That is done once, in the codec (`RlsCodec`), which is why the service is served by
//! [`RlsServer`] (the generated `RateLimitServiceServer` hard-wires tonic-prost's codec). A message larger than
//! `--max-body-bytes` is refused by tonic before decoding: OUT_OF_RANGE with a message.

use crate::check::decide;
use crate::error::{ApiError, ErrorClass};
use crate::model::{CheckRequest, CheckResponse, Code, Descriptor, DescriptorStatus};
use crate::state::AppState;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus as PbStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use futures_util::FutureExt;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::TcpListener;
use tollgate_core::limiter::LimitOverride;
use tollgate_core::quota::Unit;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The fully-qualified name of the RLS service (also a health-check service name).
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Metadata key carrying [`ApiError::code`] on error statuses (e.g. `no_descriptors`).
pub const ERROR_CODE_METADATA: &str = "tollgate-error-code";

/// The error code (in [`ERROR_CODE_METADATA`]) of a request that is not valid protobuf.
pub const INVALID_PROTOBUF: &str = "invalid_protobuf";

/// The HTTP/2 path of `ShouldRateLimit`.
const SHOULD_RATE_LIMIT_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The `RateLimitService` implementation: one [`AppState`] clone, shared with HTTP.
#[derive(Debug, Clone)]
pub struct RateLimitGrpc {
    state: AppState,
}

impl RateLimitGrpc {
    /// A service deciding with `state` (its rules, store, clock and `--response-headers`).
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// The tonic service, with the request size capped at `--max-body-bytes` like HTTP.
    pub fn into_server(self) -> RlsServer {
        RlsServer {
            max_decoding_message_size: self.state.limits().max_body_bytes,
            inner: Arc::new(self),
        }
    }
}

/// The RLS service as tonic serves it: what envoy-types generates as `RateLimitServiceServer`
/// (same routing, same two boxed futures per call, no compression), with a codec of its own in
/// place of tonic-prost's (undecodable requests are INVALID_ARGUMENT, see the module docs). Any other path of the service is UNIMPLEMENTED.
#[derive(Debug, Clone)]
pub struct RlsServer {
    inner: Arc<RateLimitGrpc>,
    max_decoding_message_size: usize,
}

impl NamedService for RlsServer {
    const NAME: &'static str = RLS_SERVICE_NAME;
}

impl<B> tower::Service<http::Request<B>> for RlsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT_PATH {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let method = ShouldRateLimit(Arc::clone(&self.inner));
        let codec = RlsCodec(Some(Arc::clone(&self.inner)));
        let max = self.max_decoding_message_size;
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(method, req).await)
        })
    }
}

/// One `ShouldRateLimit` call, as tonic's unary plumbing wants it.
struct ShouldRateLimit(Arc<RateLimitGrpc>);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.should_rate_limit(request).await })
    }
}

/// tonic-prost's codec for the RLS messages, except that a request that does not decode is
/// INVALID_ARGUMENT (the client sent it) rather than INTERNAL, and counted. It holds the
/// service (for its metrics) until its one decoder takes it: nothing is allocated per call
/// except on that error path.
struct RlsCodec(Option<Arc<RateLimitGrpc>>);

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = RlsDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<RateLimitResponse, RateLimitRequest>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RlsDecoder {
            prost: ProstCodec::<RateLimitResponse, RateLimitRequest>::default().decoder(),
            service: self.0.take(),
        }
    }
}

/// [`RlsCodec`]'s decoder: tonic-prost's, with its decode errors made INVALID_ARGUMENT.
struct RlsDecoder {
    prost: ProstDecoder<RateLimitRequest>,
    service: Option<Arc<RateLimitGrpc>>,
}

impl Decoder for RlsDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        // tonic-prost's only error is prost's `DecodeError`, as INTERNAL with its message.
        self.prost.decode(buf).map_err(|e| {
            if let Some(service) = &self.service {
                service.state.metrics().error(INVALID_PROTOBUF);
            }
            status_from(&ApiError::invalid(
                INVALID_PROTOBUF,
                format!("request is not a valid RateLimitRequest: {}", e.message()),
            ))
        })
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.prost.buffer_settings()
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let check = match to_check_request(request.get_ref()) {
            Ok(c) => c,
            Err(e) => {
                self.state.metrics().error(e.code());
                return Err(status_from(&e));
            }
        };
        // `decide` never panics by design; if it ever does, answer INTERNAL instead of dropping
        // the connection (HTTP does the same with its catch-panic layer).
        let result = AssertUnwindSafe(decide(&self.state, &check))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                tracing::error!("gRPC ShouldRateLimit panicked");
                Err(ApiError::Internal("panic while deciding".into()))
            });
        match result {
            Ok(resp) => Ok(Response::new(to_proto_response(
                &resp,
                self.state.response_headers(),
            ))),
            Err(e) => Err(status_from(&e)),
        }
    }
}

/// Translate a protobuf request (see the module docs for the `hits_addend` rules).
/// Validation (empty domain, too many descriptors, ...) is left to [`crate::check::validate`];
/// only what cannot be represented is refused here: a `limit` override with unit `UNKNOWN`.
pub fn to_check_request(req: &RateLimitRequest) -> Result<CheckRequest, ApiError> {
    let descriptors = req
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match &d.limit {
                None => None,
                Some(l) => Some(LimitOverride {
                    requests_per_unit: u64::from(l.requests_per_unit),
                    unit: unit_from_proto(l.unit).ok_or_else(|| {
                        ApiError::invalid(
                            "invalid_limit",
                            format!(
                                "descriptors[{i}].limit.unit: unknown unit number {}",
                                l.unit
                            ),
                        )
                    })?,
                }),
            };
            Ok(Descriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect(),
                hits: d.hits_addend.as_ref().map(|h| h.value),
                limit,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(CheckRequest {
        domain: req.domain.clone(),
        descriptors,
        hits: (req.hits_addend != 0).then_some(u64::from(req.hits_addend)),
    })
}

/// Envoy's `RateLimitResponse.RateLimit.Unit` number as tollgate's unit; `None` for `UNKNOWN`
/// (0) and numbers Envoy does not define.
pub fn unit_from_proto(n: i32) -> Option<Unit> {
    match PbUnit::try_from(n).ok()? {
        PbUnit::Unknown => None,
        PbUnit::Second => Some(Unit::Second),
        PbUnit::Minute => Some(Unit::Minute),
        PbUnit::Hour => Some(Unit::Hour),
        PbUnit::Day => Some(Unit::Day),
        PbUnit::Week => Some(Unit::Week),
        PbUnit::Month => Some(Unit::Month),
        PbUnit::Year => Some(Unit::Year),
    }
}

/// Translate a decision; `headers` adds `response_headers_to_add` (`--response-headers`).
pub fn to_proto_response(resp: &CheckResponse, headers: bool) -> RateLimitResponse {
    let response_headers_to_add = match (&resp.headers, headers) {
        (Some(h), true) => h
            .pairs()
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_string(),
                value,
                ..HeaderValue::default()
            })
            .collect(),
        _ => Vec::new(),
    };
    RateLimitResponse {
        overall_code: pb_code(resp.code()) as i32,
        statuses: resp.statuses.iter().map(to_proto_status).collect(),
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

fn to_proto_status(s: &DescriptorStatus) -> PbStatus {
    PbStatus {
        code: pb_code(s.code) as i32,
        current_limit: s.limit.as_ref().map(|l| PbRateLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: saturate_u32(l.requests_per_unit),
            unit: pb_unit(l.unit) as i32,
        }),
        limit_remaining: saturate_u32(s.remaining),
        duration_until_reset: s.reset_after.map(pb_duration),
        ..PbStatus::default()
    }
}

fn saturate_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn pb_code(c: Code) -> PbCode {
    match c {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    }
}

/// tollgate's unit as Envoy's `RateLimitResponse.RateLimit.Unit`.
pub fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

/// Microseconds as a `google.protobuf.Duration`.
pub fn pb_duration(us: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        // < 1e9, fits.
        nanos: ((us % 1_000_000) * 1_000) as i32,
    }
}

/// The one place an [`ApiError`] becomes a gRPC status: client errors are INVALID_ARGUMENT with
/// the message, a failing store UNAVAILABLE (Envoy then applies its `failure_mode_deny`), bugs
/// INTERNAL. The stable error code travels in the `tollgate-error-code` metadata.
pub fn status_from(e: &ApiError) -> Status {
    let code = match e.class() {
        ErrorClass::InvalidInput
        | ErrorClass::TooLarge
        | ErrorClass::UnsupportedMediaType
        | ErrorClass::NotFound
        | ErrorClass::MethodNotAllowed => tonic::Code::InvalidArgument,
        ErrorClass::Unavailable => tonic::Code::Unavailable,
        ErrorClass::Internal => tonic::Code::Internal,
    };
    let mut status = Status::new(code, e.to_string());
    if let Ok(v) = e.code().parse() {
        status.metadata_mut().insert(ERROR_CODE_METADATA, v);
    }
    if code == tonic::Code::InvalidArgument {
        tracing::debug!(code = e.code(), error = %e, "bad gRPC request");
    } else {
        tracing::error!(code = e.code(), error = %e, "gRPC request failed");
    }
    status
}

/// Serve RLS and health on `listener` until `shutdown` resolves (in-flight calls finish).
/// Health reports SERVING for `""` and for [`RLS_SERVICE_NAME`].
///
/// At shutdown, health `Watch` streams get NOT_SERVING and then end: an open `Watch` is a call
/// that never finishes, and would otherwise hold the graceful shutdown forever.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (mut reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::Serving)
        .await;
    let signal = async move {
        shutdown.await;
        for name in ["", RLS_SERVICE_NAME] {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        for name in ["", RLS_SERVICE_NAME] {
            reporter.clear_service_status(name).await;
        }
    };
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitGrpc::new(state).into_server())
        .serve_with_incoming_shutdown(incoming, signal)
        .await
}
