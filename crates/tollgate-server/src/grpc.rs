//! The Envoy RLS v3 gRPC service:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the `tollgate-proto`
//! protobuf types (no protoc), plus the standard `grpc.health.v1.Health` service
//! and gRPC server reflection (v1 and v1alpha, so `grpcurl HOST:PORT list` and `describe` work with
//! no proto files), which serves [`RLS_DESCRIPTOR_SET`].
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
//! Errors are mapped once, by `status_from`. A request that is not valid protobuf (garbage
//! bytes, a `domain` that is not UTF-8, groups nested past prost's recursion limit) is the
//! client's fault: INVALID_ARGUMENT with prost's message and the `invalid_protobuf` error code
//! (counted in `tollgate_request_errors_total`), not the INTERNAL that tonic's prost codec
//! answers. That is done once, in the codec (`RlsCodec`), which `RlsServer` (`tollgate-proto`'s
//! `RateLimitServiceServer` with that codec) makes for each call. A message larger than
//! `--max-body-bytes` is refused by tonic before decoding: OUT_OF_RANGE with a message.
//!
//! [`serve`] runs the services on hyper's HTTP/2 connections itself rather than with tonic's
//! `Server`, which leaves the concurrent streams per connection unlimited, has no handshake
//! timeout or cap on connections, and waits for every connection at shutdown without bound:
//! here each of those is bounded by [`GrpcLimits`], `--max-connections` and
//! `--shutdown-timeout`. Connections are taken by the accept loop every listener shares
//! (`listener::accept_loop`: the cap, accept errors, the TLS handshake, the drain at
//! shutdown); what is gRPC's (the preface, HTTP/2, health) is here.
//!
//! On those connections `ShouldRateLimit` itself does not go through tonic: a POST to its path
//! is answered directly on hyper's stream (`should_rate_limit`: the message read whole, prost,
//! `RateLimitGrpc::respond_encoded`, one message and the `grpc-status` trailers back), which
//! costs fewer instructions than tonic's generic unary stack. Health, reflection and every other
//! path go through tonic's routes, and both paths answer the same statuses.
//!
//! The common call costs no task and no future: when hyper hands a stream over, h2 has usually
//! read its HEADERS, DATA and END_STREAM already (they come in one read), and with the memory
//! store the decision is synchronous ([`crate::check::decide_now`]), so the call is answered
//! there and then, and hyper's stream future is polled once inline (`InlineExecutor`) instead of
//! being spawned. A call that has to wait (its body still coming, Redis, tonic's routes) becomes
//! a task. The connection's writes are held while it is polled and let through at the
//! end of the poll (`poll_coalesced`), and deferred one scheduler turn while stream tasks are
//! answering (`Replayed::hold_or_defer`): with many calls in flight, one `writev` carries the
//! answers of a whole turn instead of one each.
//!
//! That is the inline engine ([`GrpcEngine::Inline`]), which the `tollgate` binary runs by
//! default. The plain engine ([`GrpcEngine::Plain`], `--grpc-engine plain`) serves
//! `ShouldRateLimit` through tonic's routes like the other methods, each stream a task spawned
//! by hyper-util's `TokioExecutor`, writes as h2 makes them: more instructions per call
//! (BENCHMARKS.md has both), and it rests only on what hyper, h2 and tonic document. The two
//! share the listener, the limits, the timeouts and the panic handling below.
//!
//! The library's default ([`GrpcLimits::default`]) is the plain engine: a crate that embeds
//! this one resolves hyper and h2 with its own `Cargo.lock`, which may hold versions nobody
//! audited. The binary opts into the inline engine, and its manifest pins hyper and h2 to the
//! audited versions exactly, so `cargo install` resolves those too. An embedder whose lock
//! file resolves the versions named in [`GrpcEngine::Inline`] may opt in the same way.
//!
//! # What the inline engine relies on
//!
//! hyper documents `Executor` as "spawn this future", and `AsyncWrite` wants a waker registered
//! with every `Pending`; the inline engine goes beyond that on the strength of reading hyper
//! 1.12.0 and h2 0.4.20 (`hyper/src/proto/h2/server.rs`, `h2/src/server.rs`,
//! `h2/src/proto/streams/streams.rs`, `h2/src/codec/framed_write.rs`). A test fails when
//! `Cargo.lock` resolves other versions (`audited_hyper_and_h2` in `tests/grpc_inline.rs`): read
//! these again against the new sources, then update the versions there and the binary's pins
//! (`crates/tollgate/Cargo.toml`, checked by the same test). If one no longer holds, run
//! `--grpc-engine plain` until the inline engine is fixed.
//!
//! - **I1, no lock across `execute`.** hyper's `Serving::poll_server` calls the executor for a
//!   stream after `h2::server::Connection::poll_accept` returned it, from inside the
//!   connection's poll, with none of h2's locks held; the stream's future takes h2's lock only
//!   within each of its calls (`send_response`, `send_data`, `poll_data`, `poll_capacity`), and
//!   what it wakes there is the connection task, which is the one running. So a stream future
//!   polled inside `execute` neither deadlocks nor re-enters the connection. Held by every
//!   gRPC test on the inline engine (`tests/grpc.rs`, `tests/grpc_inline.rs`, the binary's
//!   `grpc_*` tests), which answer calls this way.
//! - **I2, the first poll loses nothing.** A stream future left `Pending` by the no-op waker is
//!   spawned and polled again by its task with a real waker, and everything it waits on keeps
//!   the waker of the latest poll (h2's stream recv, send and capacity tasks; tokio's timers and
//!   sockets; tonic's routes). Held by `inline_executor_polls_once_then_spawns` and, end to end,
//!   `a_body_that_arrives_in_later_reads_is_still_answered` and
//!   `calls_over_a_slow_redis_are_answered_when_it_answers`.
//! - **I3, held writes.** h2 touches the socket only inside `Connection::poll` (stream handles
//!   queue frames and wake the connection task), and a write that returned `Pending` is tried
//!   again, whole, at its next poll (`FramedWrite` keeps its buffer). A write held by
//!   `Replayed` returns `Pending` *without registering a waker*: that is sound only because
//!   `poll_coalesced` is the only place that sets the hold and it polls again at once, with
//!   writes let through, whenever one was held; so no `Pending` reaches the runtime unless the
//!   socket or h2 registered the real waker. A deferred write (`Replayed::hold_or_defer`) wakes
//!   its task itself. Held by `writes_of_a_poll_go_out_together` and
//!   `a_write_is_deferred_once_not_for_ever`.
//! - **I4, panics.** A panic in a stream's future outside h2's lock (the service, the body, the
//!   store) is caught (`should_rate_limit`, `RateLimitGrpc::decide_caught`, the executor) and
//!   the stream answered INTERNAL or reset: the connection and its other calls go on (both
//!   engines: `a_panicking_call_is_internal_and_the_connection_goes_on`). A panic while h2's
//!   streams mutex is held (h2 itself, or a `Buf` it reads under the lock) poisons it, and h2
//!   then panics on every use of that connection (`lock().unwrap()`, and "StreamRef::drop;
//!   mutex poisoned" when a stream handle is dropped). Such a connection cannot go on: every
//!   poll of it runs under `catch_unwind` (`drive`), and the first panic out of it closes it
//!   (the socket is dropped without a GOAWAY, which h2 would write under the same lock; calls in
//!   flight on it fail at the client as UNAVAILABLE), logged as an error; the task, the
//!   listener and the other connections go on. A stream task still waiting on that connection
//!   (for flow-control window, say) is not woken by it and ends at its own timeout or wake-up.
//!   Both engines: `a_poisoned_connection_is_closed_inline` and `_plain` (unit tests).

use crate::check::{decide, decide_now};
use crate::error::{ApiError, ErrorClass};
use crate::listener::{accept_loop, AcceptLimits, NoDelay, Tls};
use crate::model::HeaderNames;
use crate::model::{CheckRequest, CheckResponse, Code, Descriptor, DescriptorStatus};
use crate::state::AppState;
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_core::limiter::LimitOverride;
use tollgate_core::quota::Unit;
use tollgate_proto::pb::envoy::config::core::v3::HeaderValue;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus as PbStatus, RateLimit as PbRateLimit,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    CallCodec, RateLimitService, RateLimitServiceServer,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_proto::pb::google::protobuf::Duration as PbDuration;
use tollgate_proto::pb::google::protobuf::Struct as PbStruct;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::http::Request as HttpRequest;
use tonic::codegen::{http, Body, StdError};
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_prost::{prost, ProstCodec, ProstDecoder, ProstEncoder};
use tower::ServiceExt as _;

/// The fully-qualified name of the RLS service (also a health-check service name).
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Metadata key carrying [`ApiError::code`] on error statuses (e.g. `no_descriptors`).
pub const ERROR_CODE_METADATA: &str = "tollgate-error-code";

/// The error code (in [`ERROR_CODE_METADATA`]) of a request that is not valid protobuf.
pub(crate) const INVALID_PROTOBUF: &str = "invalid_protobuf";

/// Header names of every call, made once (a name given as a string is parsed and checked each
/// time it is used).
const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// The HTTP/2 path of `ShouldRateLimit`.
const SHOULD_RATE_LIMIT_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Builds a response's `dynamic_metadata` from the request and the decision.
pub(crate) type MetadataFn = Arc<dyn Fn(&CheckRequest, &CheckResponse) -> PbStruct + Send + Sync>;

/// A health service name, and whether it is healthy now.
pub(crate) type HealthFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// Which rate-limit headers an answer carries in `response_headers_to_add`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseHeaders {
    /// None (the default: Envoy adds what the HTTP filter is configured to add).
    #[default]
    Off,
    /// tollgate's headers, both families (`--response-headers`).
    Tollgate,
    /// Three headers under these names: the limit, the remaining and the reset.
    Named(HeaderNames),
}

/// What the gRPC transport adds to the decision's answer; the default adds nothing.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct GrpcAnswers {
    /// The rate-limit headers of an answer.
    pub headers: ResponseHeaders,
    /// Builds `dynamic_metadata`, when answers carry it.
    pub dynamic_metadata: Option<MetadataFn>,
    /// One more health service (besides `""` and [`RLS_SERVICE_NAME`]), and its state.
    pub health: Option<(&'static str, HealthFn)>,
}

impl GrpcAnswers {
    /// Answers with the rate-limit headers chosen by `headers`, nothing else.
    pub fn with_headers(headers: ResponseHeaders) -> Self {
        Self {
            headers,
            ..Self::default()
        }
    }
}

impl std::fmt::Debug for GrpcAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcAnswers")
            .field("headers", &self.headers)
            .field("dynamic_metadata", &self.dynamic_metadata.is_some())
            .field("health", &self.health.as_ref().map(|(name, _)| name))
            .finish()
    }
}

/// The `RateLimitService` implementation: one [`AppState`] clone, shared with HTTP.
#[derive(Debug, Clone)]
pub(crate) struct RateLimitGrpc {
    state: AppState,
    answers: GrpcAnswers,
}

impl RateLimitGrpc {
    /// A service deciding with `state` (its rules, store and clock), answering as `answers`
    /// says.
    pub fn new(state: AppState, answers: GrpcAnswers) -> Self {
        Self { state, answers }
    }
}

/// The RLS service as tonic serves it: `tollgate-proto`'s server (no compression) with a codec of
/// its own in place of tonic-prost's (undecodable requests are INVALID_ARGUMENT, see the module
/// docs). Any other path of the service is UNIMPLEMENTED.
type RlsServer = RateLimitServiceServer<RateLimitGrpc, RlsCodec>;

/// tonic-prost's codec for the RLS messages, except that a request that does not decode is
/// INVALID_ARGUMENT (the client sent it) rather than INTERNAL, and counted. It holds the
/// service (for its metrics) until its one decoder takes it: nothing is allocated per call
/// except on that error path.
struct RlsCodec(Option<Arc<RateLimitGrpc>>);

impl CallCodec<RateLimitGrpc> for RlsCodec {
    fn for_call(service: &Arc<RateLimitGrpc>) -> Self {
        RlsCodec(Some(Arc::clone(service)))
    }
}

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
        if let Some(service) = &self.service {
            let limits = service.state.limits();
            if let Err(e) = count_check(bytes::Buf::chunk(buf), limits) {
                service.state.metrics().error(e.code());
                return Err(status_from(&e));
            }
        }
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
        self.respond(request.into_inner()).await.map(Response::new)
    }
}

impl RateLimitGrpc {
    /// Answer one `ShouldRateLimit` request, for tonic's service.
    async fn respond(&self, request: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let check = self.check_request(request)?;
        let result = self.decide_caught(&check).await;
        self.reply(&check, result)
    }

    /// Answer one `ShouldRateLimit` request as the message to send (the direct path of
    /// [`serve`], `should_rate_limit`, when [`Self::respond_encoded_now`] cannot answer).
    async fn respond_encoded(&self, request: RateLimitRequest) -> Result<bytes::Bytes, Status> {
        let check = self.check_request(request)?;
        let result = self.decide_caught(&check).await;
        self.reply_encoded(&check, result)
    }

    /// [`decide`], a panic answered INTERNAL instead of dropping the connection (`decide` never
    /// panics by design; HTTP does the same with its catch-panic layer).
    async fn decide_caught(&self, check: &CheckRequest) -> Result<CheckResponse, ApiError> {
        AssertUnwindSafe(decide(&self.state, check))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(decide_panicked()))
    }

    /// Whether [`Self::respond_encoded_now`] can answer: the store is in this process.
    fn answers_now(&self) -> bool {
        matches!(self.state.backend(), crate::backend::Backend::Local(_))
    }

    /// [`Self::respond_encoded`] without awaiting, when [`Self::answers_now`] ([`decide_now`]).
    fn respond_encoded_now(&self, request: RateLimitRequest) -> Result<bytes::Bytes, Status> {
        let check = self.check_request(request)?;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| decide_now(&self.state, &check)))
            .unwrap_or_else(|_| Some(Err(decide_panicked())))
            .unwrap_or_else(|| Err(ApiError::Internal("the store cannot answer at once".into())));
        self.reply_encoded(&check, result)
    }

    /// The request as [`decide`] takes it; what cannot be represented is INVALID_ARGUMENT.
    fn check_request(&self, request: RateLimitRequest) -> Result<CheckRequest, Status> {
        to_check_request(request).map_err(|e| {
            self.state.metrics().error(e.code());
            status_from(&e)
        })
    }

    /// The protobuf answer of a decision.
    fn reply(
        &self,
        check: &CheckRequest,
        result: Result<CheckResponse, ApiError>,
    ) -> Result<RateLimitResponse, Status> {
        let resp = result.map_err(|e| status_from(&e))?;
        let mut out = to_proto_response(&resp, false);
        out.response_headers_to_add = self
            .header_pairs(&resp)
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                ..HeaderValue::default()
            })
            .collect();
        if let Some(metadata) = &self.answers.dynamic_metadata {
            out.dynamic_metadata = Some(metadata(check, &resp));
        }
        add_signals(&mut out, &resp);
        Ok(out)
    }

    /// The answer's `response_headers_to_add` ([`ResponseHeaders`]).
    fn header_pairs(&self, resp: &CheckResponse) -> Vec<(&str, String)> {
        match (&self.answers.headers, &resp.headers) {
            (ResponseHeaders::Tollgate, Some(h)) => h.pairs(),
            (ResponseHeaders::Named(names), Some(h)) => vec![
                (names.limit.as_str(), h.limit.to_string()),
                (names.remaining.as_str(), h.remaining.to_string()),
                (names.reset.as_str(), h.reset_secs.to_string()),
            ],
            _ => Vec::new(),
        }
    }

    /// [`Self::reply`] as the message to send: written directly from the decision
    /// ([`encode_decision`]), without building the protobuf structs, except when answers carry
    /// `dynamic_metadata` (then prost encodes [`Self::reply`]).
    fn reply_encoded(
        &self,
        check: &CheckRequest,
        result: Result<CheckResponse, ApiError>,
    ) -> Result<bytes::Bytes, Status> {
        let signals = matches!(&result, Ok(r) if r.degrade.is_some() || r.shadowbanned);
        if self.answers.dynamic_metadata.is_some() || signals {
            return encode_response(self.reply(check, result)?);
        }
        let resp = result.map_err(|e| status_from(&e))?;
        Ok(encode_decision(&resp, &self.header_pairs(&resp)))
    }
}

/// The degrade signal and the shadowban mark of a decision, in `dynamic_metadata` (beside what
/// the configured metadata holds): `tollgate_degrade` (the rule's id) on an allowed answer past
/// a `degrade` threshold, `tollgate_shadowbanned: true` on a denial made only by `shadowban`
/// rules. Envoy's ratelimit filter puts them in the request's dynamic metadata (namespace
/// `envoy.filters.http.ratelimit`), where a later filter or the access log reads them.
fn add_signals(out: &mut RateLimitResponse, resp: &CheckResponse) {
    use tollgate_proto::pb::google::protobuf::value::Kind as PbKind;
    use tollgate_proto::pb::google::protobuf::Value as PbValue;
    if resp.degrade.is_none() && !resp.shadowbanned {
        return;
    }
    let fields = &mut out
        .dynamic_metadata
        .get_or_insert_with(PbStruct::default)
        .fields;
    if let Some(rule) = &resp.degrade {
        fields.insert(
            "tollgate_degrade".to_owned(),
            PbValue {
                kind: Some(PbKind::StringValue(rule.clone())),
            },
        );
    }
    if resp.shadowbanned {
        fields.insert(
            "tollgate_shadowbanned".to_owned(),
            PbValue {
                kind: Some(PbKind::BoolValue(true)),
            },
        );
    }
}

/// What a panic while deciding becomes (logged): INTERNAL.
fn decide_panicked() -> ApiError {
    tracing::error!("gRPC ShouldRateLimit panicked");
    ApiError::Internal("panic while deciding".into())
}

/// Translate a protobuf request (see the module docs for the `hits_addend` rules); its strings
/// are moved, not copied. Validation (empty domain, too many descriptors, ...) is left to
/// [`crate::check::validate`]; only what cannot be represented is refused here: a `limit`
/// override with unit `UNKNOWN`.
pub(crate) fn to_check_request(req: RateLimitRequest) -> Result<CheckRequest, ApiError> {
    let descriptors = req
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match &d.limit {
                None => None,
                Some(l) => Some(LimitOverride {
                    requests_per_unit: u64::from(l.requests_per_unit),
                    unit: crate::model::unit_from_number(l.unit).ok_or_else(|| {
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
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                hits: d.hits_addend.map(|h| h.value),
                limit,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(CheckRequest {
        domain: req.domain,
        descriptors,
        hits: (req.hits_addend != 0).then_some(u64::from(req.hits_addend)),
    })
}

/// Translate a decision; `headers` adds `response_headers_to_add` (`--response-headers`).
pub(crate) fn to_proto_response(resp: &CheckResponse, headers: bool) -> RateLimitResponse {
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
pub(crate) fn pb_unit(u: Unit) -> PbUnit {
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
pub(crate) fn pb_duration(us: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        // < 1e9, fits.
        nanos: ((us % 1_000_000) * 1_000) as i32,
    }
}

/// The one place an [`ApiError`] becomes a gRPC status: client errors are INVALID_ARGUMENT with
/// the message, a failing store UNAVAILABLE (Envoy then applies its `failure_mode_deny`), bugs
/// INTERNAL. The stable error code travels in the `tollgate-error-code` metadata.
pub(crate) fn status_from(e: &ApiError) -> Status {
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

/// The HTTP/2 client connection preface (RFC 9113 section 3.4): the first bytes of every
/// connection; the handshake timeout is on these.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/2 and connection limits of the gRPC listener, and its engine (`--grpc-*` flags). A zero
/// duration turns the keepalive pings and the connection age off.
///
/// The defaults bound one connection's memory to about `max_concurrent_streams` requests of at
/// most `--max-body-bytes` plus the connection window, whatever the client sends: streams beyond
/// the cap are refused (`REFUSED_STREAM`), and a stream that never finishes its request is
/// answered `DEADLINE_EXCEEDED` after `request_timeout`, freeing its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcLimits {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (`--grpc-max-concurrent-streams`, default 100, Envoy's
    /// recommended edge value and RFC 9113's suggested minimum). Streams beyond it are refused.
    pub max_concurrent_streams: u32,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE` (`--grpc-max-header-list-bytes`, default 16 KiB).
    pub max_header_list_bytes: u32,
    /// Interval of the server's HTTP/2 PING frames (`--grpc-keepalive-interval`, default 60 s).
    pub keepalive_interval: Duration,
    /// A PING not acknowledged within this closes the connection (`--grpc-keepalive-timeout`,
    /// default 20 s, as gRPC).
    pub keepalive_timeout: Duration,
    /// After this, a connection gets GOAWAY so the client reconnects, and a load balancer such as
    /// Envoy rebalances (`--grpc-max-connection-age`, default 24 h as envoyproxy/ratelimit).
    pub max_connection_age: Duration,
    /// How long calls may still run on a connection past its age before it is closed
    /// (`--grpc-max-connection-age-grace`, default 1 h as envoyproxy/ratelimit).
    pub max_connection_age_grace: Duration,
    /// A call not answered within this (body still unsent included) gets DEADLINE_EXCEEDED
    /// (`--grpc-request-timeout`, default 10 s).
    pub request_timeout: Duration,
    /// A connection that has not sent the HTTP/2 preface within this is closed
    /// (`--grpc-handshake-timeout`, default 10 s).
    pub handshake_timeout: Duration,
    /// Per-stream receive window (`SETTINGS_INITIAL_WINDOW_SIZE`), 64 KiB: the most a client may
    /// send on a stream before the service reads it.
    pub stream_window_bytes: u32,
    /// Per-connection receive window, 1 MiB: the most a client may have in flight on one
    /// connection.
    pub connection_window_bytes: u32,
    /// `SETTINGS_MAX_FRAME_SIZE`, 16 KiB (the protocol's minimum).
    pub max_frame_bytes: u32,
    /// How `ShouldRateLimit` is served (`--grpc-engine`). The library's default is
    /// [`GrpcEngine::Plain`]; the `tollgate` binary chooses [`GrpcEngine::Inline`].
    pub engine: GrpcEngine,
}

/// How the gRPC listener serves `ShouldRateLimit` (`--grpc-engine`). Both answer the same
/// statuses and messages; only the cost and the HTTP/2 machinery differ (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrpcEngine {
    /// Answered on hyper's stream inside the connection's poll, streams polled once inline and
    /// writes coalesced: the fast path, resting on the hyper and h2 behaviour written down in
    /// the module docs, audited for hyper 1.12.0 and h2 0.4.20 only. Choose it only where the
    /// build resolves exactly those (the `tollgate` binary pins them).
    Inline,
    /// Through tonic's routes like every other method, each stream a spawned task, writes as
    /// h2 makes them: only what hyper and tonic document. The library's default, and the
    /// fallback if a hyper or h2 update breaks the inline engine's assumptions.
    #[default]
    Plain,
}

impl GrpcEngine {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::Plain => "plain",
        }
    }
}

impl std::fmt::Display for GrpcEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--grpc-engine` value that is neither `inline` nor `plain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGrpcEngine(pub String);

impl std::fmt::Display for UnknownGrpcEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown gRPC engine `{}` (inline or plain)", self.0)
    }
}

impl std::error::Error for UnknownGrpcEngine {}

impl std::str::FromStr for GrpcEngine {
    type Err = UnknownGrpcEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inline" => Ok(Self::Inline),
            "plain" => Ok(Self::Plain),
            other => Err(UnknownGrpcEngine(other.to_owned())),
        }
    }
}

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            max_header_list_bytes: 16 * 1024,
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            max_connection_age: Duration::from_secs(24 * 3600),
            max_connection_age_grace: Duration::from_secs(3600),
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            stream_window_bytes: 64 * 1024,
            connection_window_bytes: 1024 * 1024,
            max_frame_bytes: 16 * 1024,
            engine: GrpcEngine::Plain,
        }
    }
}

impl GrpcLimits {
    /// The HTTP/2 connection settings these limits stand for, streams run by `exec`.
    fn builder<E>(&self, exec: E) -> http2::Builder<E> {
        let mut b = http2::Builder::new(exec);
        b.timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_header_list_size(self.max_header_list_bytes)
            .initial_stream_window_size(self.stream_window_bytes)
            .initial_connection_window_size(self.connection_window_bytes)
            .max_frame_size(self.max_frame_bytes)
            .keep_alive_interval(nonzero(self.keepalive_interval))
            .keep_alive_timeout(self.keepalive_timeout)
            // No `date` header on every answer: gRPC does not use it (grpc-go sends none), and
            // it costs a clock read, a header and its HPACK encoding per call.
            .auto_date_header(false);
        b
    }
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Sleep for `d`, or forever when it is `None`.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The encoded `FileDescriptorSet` of `envoy.service.ratelimit.v3` and its imports, served by
/// the reflection service (made by protoc from Envoy's proto files: `scripts/gen-rls-descriptors.sh`).
pub const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!("../proto/rls_descriptor_set.bin");

/// Serve RLS, health and reflection on `listener` until `shutdown` resolves. Health reports
/// SERVING for `""` and for [`RLS_SERVICE_NAME`], and for the extra service of
/// [`GrpcAnswers::health`] as long as it says so.
///
/// Connections are taken by `listener::accept_loop`, as the HTTP listener's, at most
/// `max_connections` at once (at the cap the listener is not accepted from: clients wait in the
/// kernel's backlog; counted in `tollgate_connections_cap_reached_total{listener="grpc"}`), and
/// served by hyper's HTTP/2 server with `limits`.
///
/// At shutdown, the listener closes, health turns NOT_SERVING (open `Watch` streams get it and
/// then end: an open `Watch` is a call that never finishes), every connection gets GOAWAY and
/// in-flight calls finish; after `shutdown_timeout` the connections left (a client that never
/// finishes a call, or only sent the preface and never answers) are dropped, and this returns.
pub async fn serve(
    state: AppState,
    answers: GrpcAnswers,
    listener: TcpListener,
    limits: GrpcLimits,
    max_connections: usize,
    shutdown_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_on(
        state,
        answers,
        GrpcListener::Tcp(listener),
        limits,
        max_connections,
        shutdown_timeout,
        shutdown,
    )
    .await
}

/// Where the gRPC service accepts connections: TCP, or a unix socket (envoyproxy/ratelimit's
/// `GRPC_UDS`).
pub(crate) enum GrpcListener {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A TCP listener, TLS on every connection (envoy profile's `GRPC_SERVER_USE_TLS`).
    Tls(TcpListener, tokio_rustls::TlsAcceptor),
    /// A unix-domain socket listener.
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
}

impl std::fmt::Debug for GrpcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(l) => f.debug_tuple("Tcp").field(l).finish(),
            Self::Tls(l, _) => f.debug_tuple("Tls").field(l).finish_non_exhaustive(),
            #[cfg(unix)]
            Self::Unix(l) => f.debug_tuple("Unix").field(l).finish(),
        }
    }
}

/// [`serve`] on any [`GrpcListener`].
pub(crate) async fn serve_on(
    state: AppState,
    answers: GrpcAnswers,
    listener: GrpcListener,
    limits: GrpcLimits,
    max_connections: usize,
    shutdown_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let (mut reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::Serving)
        .await;
    // The extra service: its status set once here and then only when it changes (a Watch
    // stream gets one message per change, never the same status twice).
    let mut names = vec!["", RLS_SERVICE_NAME];
    let extra_health = match answers.health.clone() {
        Some((name, healthy)) => {
            let now = healthy();
            reporter.set_service_status(name, serving(now)).await;
            names.push(name);
            Some(tokio::spawn(follow_health(
                name,
                healthy,
                reporter.clone(),
                now,
            )))
        }
        None => None,
    };
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let metrics = Arc::clone(&state.metrics().grpc_connections);
    // The request size capped at `--max-body-bytes` like HTTP.
    let max_message = state.limits().max_body_bytes;
    let direct = Arc::new(RateLimitGrpc::new(state, answers));
    let rls = RlsServer::with_codec(Arc::clone(&direct)).max_decoding_message_size(max_message);
    let routes = Routes::new(health)
        .add_service(rls)
        .add_service(reflection().build_v1().map_err(std::io::Error::other)?)
        .add_service(
            reflection()
                .build_v1alpha()
                .map_err(std::io::Error::other)?,
        )
        .prepare();
    let routes = Services {
        routes,
        rls: direct,
        max_message,
    };
    // Past the listener's close and before its connections are told to go: health turns
    // NOT_SERVING, then the statuses are cleared (which ends the open `Watch` streams).
    let on_stop = async move {
        if let Some(task) = extra_health {
            task.abort();
        }
        for &name in &names {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        for &name in &names {
            reporter.clear_service_status(name).await;
        }
    };
    let accept = AcceptLimits {
        kind: "gRPC",
        max_connections,
        shutdown_timeout,
    };
    // One closure per kind of socket (each a stream type of its own); the loop is the same.
    match listener {
        GrpcListener::Tcp(tcp) => {
            let serve = move |s, _, close| connection(s, routes.clone(), limits, close);
            accept_loop(NoDelay(tcp), accept, metrics, shutdown, on_stop, serve).await;
        }
        GrpcListener::Tls(tcp, acceptor) => {
            let tls = Tls {
                listener: tcp,
                acceptor,
                handshake_timeout: limits.handshake_timeout,
            };
            let serve = move |s, _, close| connection(s, routes.clone(), limits, close);
            accept_loop(tls, accept, metrics, shutdown, on_stop, serve).await;
        }
        #[cfg(unix)]
        GrpcListener::Unix(unix) => {
            let serve = move |s, _, close| connection(s, routes.clone(), limits, close);
            accept_loop(unix, accept, metrics, shutdown, on_stop, serve).await;
        }
    }
    Ok(())
}

/// Keep the extra health service `name` in step with `healthy`, checked every 100 ms until
/// aborted.
async fn follow_health(
    name: &'static str,
    healthy: HealthFn,
    reporter: tonic_health::server::HealthReporter,
    mut last: bool,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = healthy();
        if now != last {
            reporter.set_service_status(name, serving(now)).await;
            last = now;
        }
    }
}

/// The health status for `healthy`.
fn serving(healthy: bool) -> ServingStatus {
    if healthy {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// TLS on the gRPC listener: a certificate chain and key (PEM files), and optionally the CAs
/// client certificates must chain to (then a client without a valid certificate is refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcTls {
    /// The server's certificate chain (PEM).
    pub cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub key: std::path::PathBuf,
    /// CA certificates (PEM) that client certificates are verified against; `None`: no client
    /// certificate asked for.
    pub client_ca: Option<std::path::PathBuf>,
}

impl GrpcTls {
    /// The TLS acceptor (ALPN `h2`), or why the files cannot be used.
    pub(crate) fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let read_certs = |path: &std::path::Path| -> Result<Vec<CertificateDer<'static>>, String> {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("{}: no certificate in the file", path.display()));
            }
            Ok(certs)
        };
        let certs = read_certs(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("{}: {e}", self.key.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in read_certs(ca)? {
                    roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("{} and {}: {e}", self.cert.display(), self.key.display()))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

/// One connection (its slot of `--max-connections` held by the accept loop until this ends):
/// the preface within the handshake timeout, then HTTP/2 until the client leaves, the
/// connection's age (GOAWAY, then at most the grace) or shutdown (`drain`: GOAWAY, then until
/// the accept loop gives up and drops this task).
async fn connection<S>(
    mut tcp: S,
    services: Services,
    limits: GrpcLimits,
    mut drain: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut preface = [0u8; PREFACE.len()];
    let read = tokio::select! {
        r = tokio::time::timeout(limits.handshake_timeout, tcp.read_exact(&mut preface)) => r,
        _ = drain.wait_for(|d| *d) => return,
    };
    match read {
        Ok(Ok(_)) if &preface == PREFACE => {}
        Ok(Ok(_)) => {
            tracing::debug!("gRPC connection closed: not HTTP/2");
            return;
        }
        Ok(Err(_)) => return,
        Err(_) => {
            tracing::debug!(
                "gRPC connection closed: no HTTP/2 preface within the handshake timeout"
            );
            return;
        }
    }
    let inline = limits.engine == GrpcEngine::Inline;
    let service = hyper::service::service_fn(move |req: HttpRequest<Incoming>| {
        let answer = if inline
            && req.method() == http::Method::POST
            && req.uri().path() == SHOULD_RATE_LIMIT_PATH
        {
            should_rate_limit(
                &services.rls,
                req,
                services.max_message,
                limits.request_timeout,
            )
        } else {
            let timeout = call_timeout(req.headers(), limits.request_timeout);
            let call = services.routes.clone().oneshot(req).map(|r| match r {
                Ok(response) => response.map(http_body_util::Either::Right),
                Err(never) => match never {},
            });
            Answer::Later(Box::pin(within(timeout, call)))
        };
        answer
    });
    serve_http2(Replayed::new(tcp, inline), service, limits, drain).await;
}

/// Serve HTTP/2 on `io` with `service`, its streams run by `limits.engine`'s executor, until
/// [`drive`] ends it.
async fn serve_http2<S, Svc, B>(
    io: Replayed<S>,
    service: Svc,
    limits: GrpcLimits,
    drain: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    Svc: hyper::service::HttpService<Incoming, ResBody = B>,
    Svc::Error: Into<StdError>,
    B: Body + 'static,
    B::Error: Into<StdError>,
    InlineExecutor: hyper::rt::bounds::Http2ServerConnExec<Svc::Future, B>,
    hyper_util::rt::TokioExecutor: hyper::rt::bounds::Http2ServerConnExec<Svc::Future, B>,
{
    let shared = Arc::clone(&io.shared);
    let io = TokioIo::new(io);
    match limits.engine {
        GrpcEngine::Inline => {
            let exec = InlineExecutor {
                shared: Arc::clone(&shared),
            };
            let conn = limits.builder(exec).serve_connection(io, service);
            drive(conn, Some(&shared), limits, drain).await;
        }
        GrpcEngine::Plain => {
            let exec = hyper_util::rt::TokioExecutor::new();
            let conn = limits.builder(exec).serve_connection(io, service);
            drive(conn, None, limits, drain).await;
        }
    }
}

/// hyper's HTTP/2 connection as [`drive`] uses it, whatever runs its streams.
trait Http2Conn: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, E, B> Http2Conn for http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<StdError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: Body + 'static,
    B::Error: Into<StdError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

/// A panic came out of hyper's connection: h2's state is poisoned, the connection is closed.
#[derive(Debug)]
struct ConnPanicked;

/// Serve `conn` until the client leaves, the connection's age (GOAWAY, then at most the grace)
/// or `drain` (GOAWAY, then until the caller drops this task). `coalesce`: the inline engine's
/// connection, polled by [`poll_coalesced`].
///
/// Every poll of hyper's connection, and its graceful shutdown, is made under `catch_unwind`
/// (see "Panics" in the module docs): a panic out of hyper's connection means h2's mutex is
/// poisoned, and the connection is closed ([`close_poisoned`]) instead of unwinding this task.
async fn drive<C>(
    conn: C,
    coalesce: Option<&ConnShared>,
    limits: GrpcLimits,
    mut drain: watch::Receiver<bool>,
) where
    C: Http2Conn<Output = hyper::Result<()>>,
{
    let mut conn = Box::pin(conn);
    let grace = tokio::select! {
        r = std::future::poll_fn(|cx| poll_caught(conn.as_mut(), cx, coalesce)) => Err(r),
        () = sleep_or_never(nonzero(limits.max_connection_age)) => {
            Ok(Some(limits.max_connection_age_grace))
        }
        _ = drain.wait_for(|d| *d) => Ok(None),
    };
    let grace = match grace {
        Ok(grace) => grace,
        Err(Ok(Ok(()))) => return,
        Err(Ok(Err(e))) => {
            tracing::debug!(error = %e, "gRPC connection ended");
            return;
        }
        Err(Err(ConnPanicked)) => return close_poisoned(conn),
    };
    let shutdown = std::panic::catch_unwind(AssertUnwindSafe(|| conn.as_mut().graceful_shutdown()));
    if shutdown.is_err() {
        return close_poisoned(conn);
    }
    let closed = tokio::select! {
        r = std::future::poll_fn(|cx| poll_caught(conn.as_mut(), cx, coalesce)) => r.is_ok(),
        () = sleep_or_never(grace) => {
            tracing::debug!("gRPC connection closed: max connection age and grace reached");
            true
        }
    };
    if !closed {
        close_poisoned(conn);
    }
}

/// Poll hyper's connection (through [`poll_coalesced`] when `coalesce`), a panic out of it
/// caught.
fn poll_caught<F: Future>(
    conn: Pin<&mut F>,
    cx: &mut Context<'_>,
    coalesce: Option<&ConnShared>,
) -> Poll<Result<F::Output, ConnPanicked>> {
    let polled = std::panic::catch_unwind(AssertUnwindSafe(|| match coalesce {
        Some(shared) => poll_coalesced(conn, cx, shared),
        None => conn.poll(cx),
    }));
    match polled {
        Ok(poll) => poll.map(Ok),
        Err(_) => Poll::Ready(Err(ConnPanicked)),
    }
}

/// Close a connection whose h2 state is poisoned: drop it (the socket closes; not even a
/// GOAWAY can be written, h2 writes under that lock), its slot released by the caller. Calls in
/// flight on it fail at the client (UNAVAILABLE); other connections are not concerned.
fn close_poisoned<C>(conn: Pin<Box<C>>) {
    tracing::error!(
        "gRPC connection closed: a panic while HTTP/2's state was locked left it unusable"
    );
    // A stream handle dropped with it may find the lock poisoned and panic again.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(conn)));
}

/// Poll hyper's connection with its writes held, then, if it wanted to write, once more with
/// them let through: everything this turn produced (the answers of every call answered inline
/// as hyper handed their streams over, see [`InlineExecutor`]) goes out in one `writev`.
/// Without the hold, h2 writes what is queued each time hyper asks it for the next stream: one
/// system call per answer.
fn poll_coalesced<F: Future>(
    mut conn: Pin<&mut F>,
    cx: &mut Context<'_>,
    shared: &ConnShared,
) -> Poll<F::Output> {
    shared.hold.store(true, Relaxed);
    let first = conn.as_mut().poll(cx);
    shared.hold.store(false, Relaxed);
    if first.is_pending() && shared.held.swap(false, Relaxed) {
        return conn.poll(cx);
    }
    first
}

/// What one connection's socket ([`Replayed`]), its streams' executor ([`InlineExecutor`]) and
/// [`poll_coalesced`] share. One task uses it at a time (the connection's, and its streams'
/// tasks only to count themselves): relaxed atomics, for `Send`.
#[derive(Debug, Default)]
struct ConnShared {
    /// Writes are held (set around the first poll of [`poll_coalesced`]).
    hold: AtomicBool,
    /// A write was held: poll again to let it through.
    held: AtomicBool,
    /// The socket brought frames, or a stream task finished, since the last write: with stream
    /// tasks still running, the next write waits one turn for them (`Replayed::hold_or_defer`).
    armed: AtomicBool,
    /// Stream tasks of this connection still running (streams not answered inline).
    spawned: AtomicUsize,
}

/// What a gRPC connection serves: `ShouldRateLimit` directly (`should_rate_limit`),
/// everything else (health, reflection, unknown methods) through tonic's routes.
#[derive(Clone)]
struct Services {
    routes: Routes,
    rls: Arc<RateLimitGrpc>,
    /// `--max-body-bytes`: the largest request message.
    max_message: usize,
}

/// A response body: one encoded message then the trailers (the direct path), or tonic's.
type GrpcBody = http_body_util::Either<UnaryBody, tonic::body::Body>;

/// The wire format of a unary response: one length-prefixed message (RFC-free, from gRPC's
/// "PROTOCOL-HTTP2": compressed flag 0, 4-byte big-endian length) in one DATA frame, then the
/// trailers `grpc-status: 0`. Empty (`Default`), it is the body of a trailers-only answer.
#[derive(Default)]
struct UnaryBody {
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

/// A stream's answer, as the connection's service returns it: made already (the common case:
/// the whole request was in hand and the store is in this process), or a future to run.
// The answer made (a response, ~240 bytes) is kept inline: boxing it would cost an allocation
// per call to save a copy of a few hundred bytes.
#[allow(clippy::large_enum_variant)]
enum Answer {
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
fn call_timeout(headers: &http::HeaderMap, request_timeout: Duration) -> Duration {
    headers
        .get(GRPC_TIMEOUT)
        .and_then(|v| parse_grpc_timeout(v.as_bytes()))
        .map_or(request_timeout, |t| t.min(request_timeout))
}

/// `call`, answered DEADLINE_EXCEEDED if not done within `timeout`. A call that completes when
/// first polled arms no timer (one costs a timer-wheel entry).
async fn within(
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
fn should_rate_limit(
    rls: &Arc<RateLimitGrpc>,
    req: HttpRequest<Incoming>,
    max_message: usize,
    request_timeout: Duration,
) -> Answer {
    let answer = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let (parts, body) = req.into_parts();
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
                let timeout = call_timeout(&parts.headers, request_timeout);
                return Answer::Later(Box::pin(within(timeout, call)));
            }
        };
        let request = match decode_request(rls, message) {
            Ok(request) => request,
            Err(status) => return Answer::Now(Some(trailers_only(status))),
        };
        if rls.answers_now() {
            return Answer::Now(Some(unary_response(rls.respond_encoded_now(request))));
        }
        let rls = Arc::clone(rls);
        let call = async move { unary_response(rls.respond_encoded(request).await) };
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

/// Refuse a `RateLimitRequest` message with more descriptors (field 2) than
/// `limits.max_descriptors`, or a descriptor with more entries (its field 1) than
/// `limits.max_entries`, by walking the wire format up to the first one too many: nothing is
/// built, so a message of thousands of empty descriptors (2 bytes each) costs what the limit
/// allows. Malformed input is left to the decoder, which names what is wrong.
fn count_check(message: &[u8], limits: &crate::state::RequestLimits) -> Result<(), ApiError> {
    /// The fields of `msg` as (field number, its bytes when length-delimited); `None` at the
    /// first malformed or group field.
    fn fields(mut msg: &[u8]) -> impl Iterator<Item = (u64, Option<&[u8]>)> {
        std::iter::from_fn(move || {
            let key = varint(&mut msg)?;
            let value = match key & 7 {
                0 => varint(&mut msg).map(|_| None)?,
                1 => skip(&mut msg, 8).map(|_| None)?,
                2 => {
                    let len = usize::try_from(varint(&mut msg)?).ok()?;
                    Some(skip(&mut msg, len)?)
                }
                5 => skip(&mut msg, 4).map(|_| None)?,
                _ => return None,
            };
            Some((key >> 3, value))
        })
    }
    fn varint(msg: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = msg.split_first()?;
            *msg = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }
    fn skip<'a>(msg: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if msg.len() < n {
            return None;
        }
        let (head, rest) = msg.split_at(n);
        *msg = rest;
        Some(head)
    }
    let mut descriptors = 0usize;
    for (field, value) in fields(message) {
        let (2, Some(descriptor)) = (field, value) else {
            continue;
        };
        if descriptors == limits.max_descriptors {
            return Err(ApiError::too_many_descriptors(limits.max_descriptors));
        }
        let entries = fields(descriptor)
            .filter(|(f, v)| *f == 1 && v.is_some())
            .nth(limits.max_entries);
        if entries.is_some() {
            return Err(ApiError::too_many_entries(descriptors, limits.max_entries));
        }
        descriptors += 1;
    }
    Ok(())
}

/// The response as one length-prefixed message (compressed flag 0, 4-byte big-endian length).
fn encode_response(response: RateLimitResponse) -> Result<bytes::Bytes, Status> {
    let len = prost::Message::encoded_len(&response);
    let mut out = bytes::BytesMut::with_capacity(5 + len);
    bytes::BufMut::put_u8(&mut out, 0);
    bytes::BufMut::put_u32(&mut out, u32::try_from(len).unwrap_or(u32::MAX));
    prost::Message::encode(&response, &mut out)
        .map_err(|e| Status::internal(format!("encoding the response: {e}")))?;
    Ok(out.freeze())
}

/// What prost writes for the `RateLimitResponse` of `resp` ([`to_proto_response`] without
/// headers) with `headers` as its `response_headers_to_add`, length-prefixed as a gRPC message,
/// written straight from the decision: the same bytes (fields in tag order as prost writes them,
/// defaults left out; a test compares the two) without building, measuring twice and dropping
/// the protobuf structs.
fn encode_decision<K: AsRef<str>>(resp: &CheckResponse, headers: &[(K, String)]) -> bytes::Bytes {
    use prost::encoding::encoded_len_varint;
    // A `Vec` and byte pushes: `BufMut`'s generic varint writer costs several times more.
    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    /// A field's key: its number and wire type (0 varint, 2 length-delimited); all < 128.
    fn key(out: &mut Vec<u8>, tag: u8, wire: u8) {
        out.push(tag << 3 | wire);
    }
    /// A varint field, left out when 0 (proto3 default).
    fn varint_len(v: u64) -> usize {
        if v == 0 {
            0
        } else {
            1 + encoded_len_varint(v)
        }
    }
    fn varint(out: &mut Vec<u8>, tag: u8, v: u64) {
        if v != 0 {
            key(out, tag, 0);
            put_varint(out, v);
        }
    }
    /// A string field, left out when empty.
    fn string_len(s: &str) -> usize {
        if s.is_empty() {
            0
        } else {
            1 + encoded_len_varint(s.len() as u64) + s.len()
        }
    }
    fn string(out: &mut Vec<u8>, tag: u8, s: &str) {
        if !s.is_empty() {
            key(out, tag, 2);
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
    }
    /// A nested message field of `len` bytes (written even when empty).
    fn message_len(len: usize) -> usize {
        1 + encoded_len_varint(len as u64) + len
    }
    fn message(out: &mut Vec<u8>, tag: u8, len: usize) {
        key(out, tag, 2);
        put_varint(out, len as u64);
    }
    // Enums and int32 are sign-extended to 64 bits; every value here is positive.
    let enum_code = |c: Code| pb_code(c) as i32 as u64;
    let limit_len = |l: &crate::model::LimitInfo| {
        varint_len(u64::from(saturate_u32(l.requests_per_unit)))
            + varint_len(pb_unit(l.unit) as i32 as u64)
            + string_len(l.name.as_deref().unwrap_or_default())
    };
    let duration_len = |d: &PbDuration| varint_len(d.seconds as u64) + varint_len(d.nanos as u64);
    let status_len = |s: &DescriptorStatus| {
        varint_len(enum_code(s.code))
            + s.limit.as_ref().map_or(0, |l| message_len(limit_len(l)))
            + varint_len(u64::from(saturate_u32(s.remaining)))
            + s.reset_after
                .map_or(0, |us| message_len(duration_len(&pb_duration(us))))
    };
    let header_len = |(k, v): &(K, String)| string_len(k.as_ref()) + string_len(v);
    let len = varint_len(enum_code(resp.code()))
        + resp
            .statuses
            .iter()
            .map(|s| message_len(status_len(s)))
            .sum::<usize>()
        + headers
            .iter()
            .map(|h| message_len(header_len(h)))
            .sum::<usize>();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    varint(&mut out, 1, enum_code(resp.code()));
    for s in &resp.statuses {
        message(&mut out, 2, status_len(s));
        varint(&mut out, 1, enum_code(s.code));
        if let Some(l) = &s.limit {
            message(&mut out, 2, limit_len(l));
            varint(&mut out, 1, u64::from(saturate_u32(l.requests_per_unit)));
            varint(&mut out, 2, pb_unit(l.unit) as i32 as u64);
            string(&mut out, 3, l.name.as_deref().unwrap_or_default());
        }
        varint(&mut out, 3, u64::from(saturate_u32(s.remaining)));
        if let Some(us) = s.reset_after {
            let d = pb_duration(us);
            message(&mut out, 4, duration_len(&d));
            varint(&mut out, 1, d.seconds as u64);
            varint(&mut out, 2, d.nanos as u64);
        }
    }
    for h in headers {
        message(&mut out, 3, header_len(h));
        string(&mut out, 1, h.0.as_ref());
        string(&mut out, 2, &h.1);
    }
    debug_assert_eq!(out.len(), 5 + len, "measured as written");
    bytes::Bytes::from(out)
}

/// The HTTP response of a unary call: the message then `grpc-status: 0`, or the error status.
fn unary_response(message: Result<bytes::Bytes, Status>) -> http::Response<GrpcBody> {
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
fn trailers_only(status: Status) -> http::Response<GrpcBody> {
    status
        .into_http::<UnaryBody>()
        .map(http_body_util::Either::Left)
}

/// Reads the request's one message (without its 5-byte prefix) to the end of the stream. A
/// poll that returns `Pending` keeps what was read, so the same reader can be polled first with
/// a no-op waker (is it all here?) and then awaited.
struct MessageReader {
    body: Incoming,
    max_message: usize,
    /// Usually the whole message comes in one DATA frame and is used as it is (no copy).
    first: Option<bytes::Bytes>,
    /// The frames so far, when there were several.
    more: Option<bytes::BytesMut>,
}

impl MessageReader {
    fn new(body: Incoming, max_message: usize) -> Self {
        Self {
            body,
            max_message,
            first: None,
            more: None,
        }
    }

    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<bytes::Bytes, Status>> {
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

/// How hyper runs each stream of a gRPC connection (`hyper::rt::Executor`) under the inline
/// engine: polled once at once, inside the connection task, with a no-op waker, and spawned as
/// a task only if that poll left it pending. A call answered at once ([`Answer::Now`]) is then
/// sent within the connection's own poll: no task per stream (spawning, scheduling and freeing
/// one cost about a tenth of a decision), and its frames join the connection's next write.
///
/// What this rests on is in the module docs ("What the inline engine relies on"): hyper holds
/// none of h2's locks when it hands a stream over (I1), and a future left pending by the no-op
/// waker is made whole by its task's first poll (I2). A panic in that first poll is caught and
/// the stream dropped (I4): h2 resets it and the connection goes on, unless the panic came
/// while h2's lock was held, in which case the connection is closed by [`drive`].
#[derive(Clone, Debug)]
struct InlineExecutor {
    shared: Arc<ConnShared>,
}

impl<F> hyper::rt::Executor<F> for InlineExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut = Box::pin(fut);
        let first = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        }));
        match first {
            Ok(Poll::Ready(_)) => {}
            Ok(Poll::Pending) => {
                self.shared.spawned.fetch_add(1, Relaxed);
                tokio::spawn(StreamTask {
                    fut,
                    shared: Arc::clone(&self.shared),
                });
            }
            Err(_) => {
                tracing::error!("gRPC stream panicked; the stream was reset");
                // Dropping the stream panics if the panic poisoned h2's lock; then the next
                // poll of the connection panics too, and [`drive`] closes it.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(fut)));
            }
        }
    }
}

/// A stream that was not answered inline, as a task: counted in [`ConnShared::spawned`] while it
/// lives, and arming the connection's write deferral when it finishes, so that the answers of
/// the tasks finishing in the same turn share a write.
struct StreamTask<F> {
    fut: Pin<Box<F>>,
    shared: Arc<ConnShared>,
}

impl<F: Future> Future for StreamTask<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let done = self.fut.as_mut().poll(cx);
        if done.is_ready() {
            self.shared.armed.store(true, Relaxed);
        }
        done
    }
}

impl<F> Drop for StreamTask<F> {
    fn drop(&mut self) {
        self.shared.spawned.fetch_sub(1, Relaxed);
    }
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

/// A connection whose preface was read (to time it), handed to hyper as if it were not: the
/// preface is read again first. It also holds and defers writes so that answers share them (see
/// [`poll_coalesced`] and [`Replayed::hold_or_defer`]).
struct Replayed<S> {
    io: S,
    replayed: usize,
    shared: Arc<ConnShared>,
    /// The last write attempt was deferred: the next one goes out whatever happened since, so
    /// frames arriving and tasks finishing turn after turn cannot put writes off for ever.
    deferred: bool,
    /// Writes are held and deferred (the inline engine); otherwise they go straight through.
    coalesce: bool,
}

impl<S> Replayed<S> {
    /// `io` with the connection's [`ConnShared`], made here.
    fn new(io: S, coalesce: bool) -> Self {
        Self {
            io,
            replayed: 0,
            shared: Arc::new(ConnShared::default()),
            deferred: false,
            coalesce,
        }
    }

    /// Whether this write waits: held ([`poll_coalesced`]), or deferred. A deferred write is put
    /// off by one turn of the scheduler when stream tasks are still running and frames came in
    /// or a stream task finished since the last write: the connection task wakes itself and goes
    /// to the back of the run queue (a task waking itself is not run next), so the tasks
    /// answering meanwhile join this write. Without it, each task answering wakes the connection
    /// task, the runtime runs it next (its LIFO slot), and h2 writes and flushes one answer per
    /// system call. Calls answered inline need no deferral: their answers are all queued when
    /// the hold is lifted. Nothing waits on a timer.
    fn hold_or_defer(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.coalesce {
            return false;
        }
        // No waker registered: [`poll_coalesced`], the only one to set `hold`, polls again at
        // once with the writes let through (see "Held writes" in the module docs).
        if self.shared.hold.load(Relaxed) {
            self.shared.held.store(true, Relaxed);
            return true;
        }
        let armed = self.shared.armed.swap(false, Relaxed);
        if std::mem::take(&mut self.deferred) {
            return false;
        }
        if armed && self.shared.spawned.load(Relaxed) > 0 {
            self.deferred = true;
            cx.waker().wake_by_ref();
            return true;
        }
        false
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.replayed < PREFACE.len() {
            let n = buf.remaining().min(PREFACE.len() - this.replayed);
            buf.put_slice(&PREFACE[this.replayed..this.replayed + n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.shared.armed.store(true, Relaxed);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.hold_or_defer(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.hold_or_defer(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_numbers_are_the_protocols() {
        for u in Unit::ALL {
            assert_eq!(crate::model::unit_from_number(pb_unit(u) as i32), Some(u));
        }
        assert_eq!(crate::model::unit_from_number(PbUnit::Unknown as i32), None);
        assert_eq!(crate::model::unit_from_number(8), None);
    }

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

    /// The executor of the connections' streams runs a future that is ready at once within
    /// `execute` (no task), spawns one that is pending (its task then finishes it), and
    /// survives a panic in the first poll.
    #[test]
    fn inline_executor_polls_once_then_spawns() {
        use hyper::rt::Executor as _;
        use std::sync::atomic::{AtomicBool, Ordering};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let exec = InlineExecutor {
            shared: Arc::new(ConnShared::default()),
        };
        rt.block_on(async {
            let ran = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&ran);
            exec.execute(async move { flag.store(true, Ordering::SeqCst) });
            assert!(
                ran.load(Ordering::SeqCst),
                "ready at once: run within execute"
            );

            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
            exec.execute(async move {
                let n = rx.await.unwrap();
                let _ = done_tx.send(n + 1);
            });
            tx.send(41).unwrap();
            assert_eq!(done_rx.await.unwrap(), 42, "pending: spawned and woken");
            while exec.shared.spawned.load(Relaxed) != 0 {
                tokio::task::yield_now().await; // the task is counted until it is dropped
            }

            exec.execute(async { panic!("a stream that panics") });
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            exec.execute(async move {
                let _ = tx.send(());
            });
            rx.await.expect("streams after a panicking one still run");
        });
    }

    /// The writes of a connection's poll are held, then let through by one more poll: what a
    /// poll queued reaches the socket together (regression: answering streams inline made h2
    /// write once per stream, as hyper asked it for the next one).
    #[test]
    fn writes_of_a_poll_go_out_together() {
        use tokio::io::AsyncWriteExt as _;
        /// A socket counting the writes that reach it.
        #[derive(Default)]
        struct Counting(Vec<usize>);
        impl AsyncRead for Counting {
            fn poll_read(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Pending
            }
        }
        impl AsyncWrite for Counting {
            fn poll_write(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                self.0.push(buf.len());
                Poll::Ready(Ok(buf.len()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        let mut io = Replayed::new(Counting::default(), true);
        let shared = Arc::clone(&io.shared);
        io.replayed = PREFACE.len();
        let mut polls = 0;
        // A connection that, each time it is polled, tries to write what it has queued.
        let mut conn = std::pin::pin!(std::future::poll_fn(|cx| {
            polls += 1;
            let mut write = std::pin::pin!(io.write_all(b"answers"));
            match write.as_mut().poll(cx) {
                Poll::Ready(r) => Poll::Ready(r.map(|()| polls)),
                Poll::Pending => Poll::Pending,
            }
        }));
        let mut cx = Context::from_waker(Waker::noop());
        let done = poll_coalesced(conn.as_mut(), &mut cx, &shared);
        assert!(
            matches!(done, Poll::Ready(Ok(2))),
            "held once, then written"
        );
        assert_eq!(io.io.0, vec![7], "one write of everything");
        assert!(!shared.held.load(Relaxed) && !shared.hold.load(Relaxed));
    }

    /// Any decision, as `encode_decision` sees it.
    fn any_decision() -> impl proptest::strategy::Strategy<Value = CheckResponse> {
        use proptest::prelude::*;
        let unit = prop::sample::select(Unit::ALL.to_vec());
        let big = prop_oneof![Just(0u64), 0u64..300, any::<u64>()];
        let limit = (
            prop::option::of(prop_oneof![Just(String::new()), "[a-z_é]{1,20}"]),
            big.clone(),
            unit,
        )
            .prop_map(|(name, requests_per_unit, unit)| crate::model::LimitInfo {
                id: "d|k".into(),
                name,
                requests_per_unit,
                unit,
                unit_multiplier: 1,
                algorithm: tollgate_core::quota::Algorithm::FixedWindow,
            });
        let status = (
            any::<bool>(),
            prop::option::of(limit),
            big.clone(),
            prop::option::of(big),
        )
            .prop_map(|(ok, limit, remaining, reset_after)| DescriptorStatus {
                reset_after,
                ..DescriptorStatus::new(
                    if ok { Code::Ok } else { Code::OverLimit },
                    limit,
                    remaining,
                )
            });
        (any::<bool>(), prop::collection::vec(status, 0..4)).prop_map(|(allowed, statuses)| {
            CheckResponse {
                allowed,
                statuses,
                headers: None,
                delay: 0,
                degrade: None,
                shadowbanned: false,
            }
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// The direct encoding is byte for byte what prost writes for the protobuf response.
        #[test]
        fn direct_encoding_is_prosts(
            resp in any_decision(),
            headers in proptest::collection::vec(("[a-zA-Z-]{0,12}", "[0-9]{0,12}"), 0..4),
        ) {
            let headers: Vec<(String, String)> = headers;
            let mut proto = to_proto_response(&resp, false);
            proto.response_headers_to_add = headers
                .iter()
                .map(|(key, value)| HeaderValue {
                    key: key.clone(),
                    value: value.clone(),
                    ..HeaderValue::default()
                })
                .collect();
            let prost = encode_response(proto).unwrap();
            proptest::prop_assert_eq!(encode_decision(&resp, &headers), prost);
        }
    }

    /// Regression (liveness): a write is deferred at most one turn, even when frames keep
    /// arriving and stream tasks keep finishing (each would arm another deferral).
    #[test]
    fn a_write_is_deferred_once_not_for_ever() {
        let mut io = Replayed::new((), true);
        let shared = Arc::clone(&io.shared);
        shared.spawned.store(3, Relaxed);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..3 {
            shared.armed.store(true, Relaxed);
            assert!(io.hold_or_defer(&mut cx), "deferred one turn");
            shared.armed.store(true, Relaxed);
            assert!(!io.hold_or_defer(&mut cx), "then written");
        }
        shared.spawned.store(0, Relaxed);
        shared.armed.store(true, Relaxed);
        assert!(
            !io.hold_or_defer(&mut cx),
            "no task to wait for: written at once"
        );
    }

    /// A response body of one DATA frame whose `Buf` panics when h2 measures it, which h2 does
    /// under its streams mutex: the panic poisons the connection's HTTP/2 state, as a bug in h2
    /// would. hyper measures it first, outside the lock: that first measure answers 0 (an
    /// empty frame, handed to h2 at once). It reports on its channel just before panicking.
    struct PoisoningBody(Option<PoisoningBuf>);
    struct PoisoningBuf {
        measured: std::sync::atomic::AtomicUsize,
        reached: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    }

    impl bytes::Buf for PoisoningBuf {
        fn remaining(&self) -> usize {
            if self.measured.fetch_add(1, Relaxed) == 0 {
                return 0;
            }
            if let Some(reached) = self.reached.lock().unwrap().take() {
                let _ = reached.send(());
            }
            panic!("a Buf that panics under h2's lock");
        }
        fn chunk(&self) -> &[u8] {
            &[]
        }
        fn advance(&mut self, _: usize) {}
    }

    impl Body for PoisoningBody {
        type Data = PoisoningBuf;
        type Error = Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<PoisoningBuf>, Infallible>>> {
            Poll::Ready(
                self.get_mut()
                    .0
                    .take()
                    .map(|b| Ok(hyper::body::Frame::data(b))),
            )
        }
    }

    /// A connection whose HTTP/2 state a panic poisoned is closed: the client's calls on it
    /// fail, and the connection's task ends normally (no panic out of it; the listener and the
    /// other connections are other tasks). On both engines.
    fn a_poisoned_connection_is_closed(engine: GrpcEngine) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (reached_tx, reached) = tokio::sync::oneshot::channel();
            let reached_tx = std::sync::Mutex::new(Some(reached_tx));
            let server = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let service = hyper::service::service_fn(move |_req: HttpRequest<Incoming>| {
                    let buf = PoisoningBuf {
                        measured: AtomicUsize::new(0),
                        reached: std::sync::Mutex::new(reached_tx.lock().unwrap().take()),
                    };
                    let response = http::Response::new(PoisoningBody(Some(buf)));
                    async move { Ok::<_, Infallible>(response) }
                });
                let mut io = Replayed::new(tcp, engine == GrpcEngine::Inline);
                io.replayed = PREFACE.len(); // the client's preface is read by hyper itself
                let limits = GrpcLimits {
                    engine,
                    ..GrpcLimits::default()
                };
                let (_drain_tx, drain) = watch::channel(false);
                serve_http2(io, service, limits, drain).await;
            });
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut client, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                TokioIo::new(tcp),
            )
            .await
            .unwrap();
            let client_conn = tokio::spawn(conn);
            let request = || {
                http::Request::post(format!("http://{addr}/x"))
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap()
            };
            /// `f`, with a bound on a hang (a failure, not a synchronisation).
            fn within<F: Future>(f: F) -> tokio::time::Timeout<F> {
                tokio::time::timeout(Duration::from_secs(10), f)
            }
            let first = client.send_request(request());
            let first = tokio::spawn(async move {
                let response = first.await?;
                http_body_util::BodyExt::collect(response.into_body()).await
            });
            within(reached).await.expect("the body reached h2").unwrap();
            // The poisoned lock is found by the connection's next poll at the latest: this
            // call's frames wake it (the plain engine's stream task panicked on its own).
            let second = within(client.send_request(request()))
                .await
                .expect("the connection ends");
            assert!(second.is_err(), "a call on a poisoned connection fails");
            let first = within(first).await.expect("the call ends").unwrap();
            assert!(first.is_err(), "the call that poisoned it fails");
            within(server)
                .await
                .expect("the connection is closed")
                .expect("and its task ends without a panic");
            let _ = within(client_conn)
                .await
                .expect("the client sees it closed");
        });
    }

    #[test]
    fn a_poisoned_connection_is_closed_inline() {
        a_poisoned_connection_is_closed(GrpcEngine::Inline);
    }

    #[test]
    fn a_poisoned_connection_is_closed_plain() {
        a_poisoned_connection_is_closed(GrpcEngine::Plain);
    }

    #[test]
    fn engines_by_name() {
        for engine in [GrpcEngine::Inline, GrpcEngine::Plain] {
            assert_eq!(engine.as_str().parse(), Ok(engine));
        }
        assert_eq!(GrpcEngine::default(), GrpcEngine::Inline);
        assert_eq!(
            "fast".parse::<GrpcEngine>(),
            Err(UnknownGrpcEngine("fast".into()))
        );
    }

    #[test]
    fn default_limits_bound_a_connection() {
        let l = GrpcLimits::default();
        assert_eq!(l.max_concurrent_streams, 100);
        assert_eq!(l.max_header_list_bytes, 16 * 1024);
        assert!(l.stream_window_bytes <= l.connection_window_bytes);
        assert_eq!(nonzero(Duration::ZERO), None);
    }
}
