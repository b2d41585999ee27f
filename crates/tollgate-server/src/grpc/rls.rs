//! The RLS messages: a `RateLimitRequest` becomes a [`CheckRequest`] for
//! [`crate::check::decide`] (its descriptor list bounded while it is scanned, `count_check`),
//! the [`CheckResponse`] becomes a `RateLimitResponse` or, on the direct path, its bytes
//! (`encode_decision`: what prost would write, without building it), and an [`ApiError`] a gRPC
//! status, in one place (`status_from`). Also the `RateLimitService` that tonic serves, with
//! the codec that answers INVALID_ARGUMENT for a message that is not valid protobuf.

use crate::check::{decide, decide_now};
use crate::error::{ApiError, ErrorClass};
use crate::model::HeaderNames;
use crate::model::{CheckRequest, CheckResponse, Code, Descriptor, DescriptorStatus};
use crate::state::AppState;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
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
use tonic::{Request, Response, Status};
use tonic_prost::{prost, ProstCodec, ProstDecoder, ProstEncoder};

/// The fully-qualified name of the RLS service (also a health-check service name).
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Metadata key carrying [`ApiError::code`] on error statuses (e.g. `no_descriptors`).
pub const ERROR_CODE_METADATA: &str = "tollgate-error-code";

/// The error code (in [`ERROR_CODE_METADATA`]) of a request that is not valid protobuf.
pub(crate) const INVALID_PROTOBUF: &str = "invalid_protobuf";

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
    pub(super) state: AppState,
    answers: GrpcAnswers,
}

impl RateLimitGrpc {
    /// A service deciding with `state` (its rules, store and clock), answering as `answers`
    /// says.
    pub(super) fn new(state: AppState, answers: GrpcAnswers) -> Self {
        Self { state, answers }
    }
}

/// The RLS service as tonic serves it: `tollgate-proto`'s server (no compression) with a codec of
/// its own in place of tonic-prost's (undecodable requests are INVALID_ARGUMENT, see the module
/// docs). Any other path of the service is UNIMPLEMENTED.
pub(super) type RlsServer = RateLimitServiceServer<RateLimitGrpc, RlsCodec>;

/// tonic-prost's codec for the RLS messages, except that a request that does not decode is
/// INVALID_ARGUMENT (the client sent it) rather than INTERNAL, and counted. It holds the
/// service (for its metrics) until its one decoder takes it: nothing is allocated per call
/// except on that error path.
pub(super) struct RlsCodec(Option<Arc<RateLimitGrpc>>);

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
pub(super) struct RlsDecoder {
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
        let traced = self
            .state
            .tracing()
            .map(|t| t.start(crate::otel::RLS_SPAN, request.metadata().as_ref()));
        crate::otel::in_context(traced, self.respond(request.into_inner()))
            .await
            .map(Response::new)
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
    pub(super) async fn respond_encoded(
        &self,
        request: RateLimitRequest,
    ) -> Result<bytes::Bytes, Status> {
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
    pub(super) fn answers_now(&self) -> bool {
        matches!(self.state.backend(), crate::backend::Backend::Local(_))
    }

    /// [`Self::respond_encoded`] without awaiting, when [`Self::answers_now`] ([`decide_now`]).
    pub(super) fn respond_encoded_now(
        &self,
        request: RateLimitRequest,
    ) -> Result<bytes::Bytes, Status> {
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

/// Translate a protobuf request (see the `grpc` module docs for the `hits_addend` rules); its
/// strings are moved, not copied. Validation (empty domain, too many descriptors, ...) is left to
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

/// Refuse a `RateLimitRequest` message with more descriptors (field 2) than
/// `limits.max_descriptors`, or a descriptor with more entries (its field 1) than
/// `limits.max_entries`, by walking the wire format up to the first one too many: nothing is
/// built, so a message of thousands of empty descriptors (2 bytes each) costs what the limit
/// allows. Malformed input is left to the decoder, which names what is wrong.
pub(super) fn count_check(
    message: &[u8],
    limits: &crate::state::RequestLimits,
) -> Result<(), ApiError> {
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
}
