//! The Envoy RLS v3 gRPC service:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the `tollgate-proto`
//! protobuf types (no protoc), plus the standard `grpc.health.v1.Health` service
//! and gRPC server reflection (v1 and v1alpha, so `grpcurl HOST:PORT list` and `describe` work with
//! no proto files), which serves [`RLS_DESCRIPTOR_SET`].
//!
//! Like HTTP, this is only a translation layer: protobuf in,
//! [`CheckRequest`](crate::model::CheckRequest) to [`crate::check::decide`],
//! [`CheckResponse`](crate::model::CheckResponse) back to protobuf, so every transport gives
//! the same decisions. Field mapping (in `rls`) follows Envoy and envoyproxy/ratelimit:
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
//! shutdown); what is gRPC's (the preface, HTTP/2, health) is here.//!
//! One concern a file, the arrows pointing down (no file imports one above it):
//!
//! - `listener`: [`serve`] and [`GrpcTls`]: the listener, health, reflection, shutdown.
//! - `connection`: one connection: the preface, HTTP/2 with [`GrpcLimits`], its age, and
//!   every poll of it under `catch_unwind` (a panic in h2 closes that connection only).
//! - `call`: the direct path of `ShouldRateLimit` and the call's deadline.
//! - `engine`: the inline engine: streams polled inside the connection's poll, writes held
//!   and coalesced, and what that rests on in hyper and h2.
//! - `rls`: the RLS messages: protobuf to [`CheckRequest`](crate::model::CheckRequest) and
//!   back (the answer also written directly), errors to statuses, tonic's service.
//! - `codec`: the wire format of one unary call: the message read whole and bounded, the
//!   answer framed with its trailers.
//! - `limits`: [`GrpcLimits`] and [`GrpcEngine`].
//! - `rlqs`: Envoy's quota service (`StreamRateLimitQuotas`): protobuf to and from
//!   `crate::quota`.

mod call;
mod codec;
mod connection;
mod engine;
mod limits;
mod listener;
mod rlqs;
mod rls;

pub use limits::{GrpcEngine, GrpcLimits, UnknownGrpcEngine};
pub use listener::{serve, GrpcTls, RLS_DESCRIPTOR_SET};
pub(crate) use listener::{serve_on, GrpcListener};
pub(crate) use rls::pb_unit;
pub use rls::{GrpcAnswers, ResponseHeaders, ERROR_CODE_METADATA, RLS_SERVICE_NAME};
