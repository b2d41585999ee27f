//! The messages of Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`, the
//! `envoy.filters.http.rate_limit_quota` filter's server), the quota strategies it assigns
//! (`envoy.type.v3.RateLimitStrategy`, `TokenBucket`), and the server and client of its one
//! bidirectional stream, `StreamRateLimitQuotas`.
//!
//! Field numbers and types are those of Envoy's `rlqs.proto`, `ratelimit_strategy.proto` and
//! `token_bucket.proto`, with Google's `UInt32Value` and `Duration`.

use crate::pb::google::protobuf::Duration;
use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::Codec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::tokio_stream::Stream;
use tonic::codegen::{http, Body, BoxFuture, Bytes, GrpcMethod, StdError};
use tonic_prost::ProstCodec;

/// `google.protobuf.UInt32Value`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct UInt32Value {
    /// The value.
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

/// `envoy.type.v3.TokenBucket`: `max_tokens` at most, `tokens_per_fill` added every
/// `fill_interval`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct TokenBucket {
    /// The bucket's size (and its tokens when it starts).
    #[prost(uint32, tag = "1")]
    pub max_tokens: u32,
    /// Tokens added per fill (unset: 1).
    #[prost(message, optional, tag = "2")]
    pub tokens_per_fill: ::core::option::Option<UInt32Value>,
    /// The time between fills.
    #[prost(message, optional, tag = "3")]
    pub fill_interval: ::core::option::Option<Duration>,
}

/// `envoy.type.v3.RateLimitStrategy`: how a bucket's requests are limited.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct RateLimitStrategy {
    /// The strategy.
    #[prost(oneof = "rate_limit_strategy::Strategy", tags = "1, 2, 3")]
    pub strategy: ::core::option::Option<rate_limit_strategy::Strategy>,
}

/// [`RateLimitStrategy`]'s nested types.
pub mod rate_limit_strategy {
    /// `BlanketRule`: every request allowed, or every request denied.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum BlanketRule {
        /// Allow every request.
        AllowAll = 0,
        /// Deny every request.
        DenyAll = 1,
    }

    /// `RequestsPerTimeUnit` (declared for decoding; Envoy 1.40 does not apply it).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct RequestsPerTimeUnit {
        /// Requests per unit.
        #[prost(uint64, tag = "1")]
        pub requests_per_time_unit: u64,
        /// The unit (`envoy.type.v3.RateLimitUnit`).
        #[prost(enumeration = "crate::pb::envoy::r#type::v3::RateLimitUnit", tag = "2")]
        pub time_unit: i32,
    }

    /// The strategy oneof.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum Strategy {
        /// A blanket rule.
        #[prost(enumeration = "BlanketRule", tag = "1")]
        BlanketRule(i32),
        /// Requests per time unit.
        #[prost(message, tag = "2")]
        RequestsPerTimeUnit(RequestsPerTimeUnit),
        /// A token bucket.
        #[prost(message, tag = "3")]
        TokenBucket(super::TokenBucket),
    }
}

/// `envoy.service.rate_limit_quota.v3.BucketId`: the bucket's identity, a map of strings.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct BucketId {
    /// The entries.
    #[prost(btree_map = "string, string", tag = "1")]
    pub bucket: ::prost::alloc::collections::BTreeMap<
        ::prost::alloc::string::String,
        ::prost::alloc::string::String,
    >,
}

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports`: one client's usage report.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitQuotaUsageReports {
    /// The filter's domain.
    #[prost(string, tag = "1")]
    pub domain: ::prost::alloc::string::String,
    /// One entry per bucket.
    #[prost(message, repeated, tag = "2")]
    pub bucket_quota_usages:
        ::prost::alloc::vec::Vec<rate_limit_quota_usage_reports::BucketQuotaUsage>,
}

/// [`RateLimitQuotaUsageReports`]'s nested types.
pub mod rate_limit_quota_usage_reports {
    use super::{BucketId, Duration};

    /// One bucket's usage since its previous report.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct BucketQuotaUsage {
        /// The bucket.
        #[prost(message, optional, tag = "1")]
        pub bucket_id: ::core::option::Option<BucketId>,
        /// The time the counts cover.
        #[prost(message, optional, tag = "2")]
        pub time_elapsed: ::core::option::Option<Duration>,
        /// Requests allowed.
        #[prost(uint64, tag = "3")]
        pub num_requests_allowed: u64,
        /// Requests denied.
        #[prost(uint64, tag = "4")]
        pub num_requests_denied: u64,
    }
}

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse`: actions on buckets.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitQuotaResponse {
    /// The actions.
    #[prost(message, repeated, tag = "1")]
    pub bucket_action: ::prost::alloc::vec::Vec<rate_limit_quota_response::BucketAction>,
}

/// [`RateLimitQuotaResponse`]'s nested types.
pub mod rate_limit_quota_response {
    use super::BucketId;

    /// What to do with one bucket.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct BucketAction {
        /// The bucket.
        #[prost(message, optional, tag = "1")]
        pub bucket_id: ::core::option::Option<BucketId>,
        /// The action.
        #[prost(oneof = "bucket_action::BucketAction", tags = "2, 3")]
        pub bucket_action: ::core::option::Option<bucket_action::BucketAction>,
    }

    /// [`BucketAction`]'s nested types.
    pub mod bucket_action {
        use crate::pb::google::protobuf::Duration;
        use crate::rlqs::RateLimitStrategy;

        /// A quota assignment, valid for its time to live.
        #[derive(Clone, Copy, PartialEq, ::prost::Message)]
        pub struct QuotaAssignmentAction {
            /// How long the assignment holds.
            #[prost(message, optional, tag = "2")]
            pub assignment_time_to_live: ::core::option::Option<Duration>,
            /// The strategy.
            #[prost(message, optional, tag = "3")]
            pub rate_limit_strategy: ::core::option::Option<RateLimitStrategy>,
        }

        /// Forget the bucket (the client reports it again as new).
        #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
        pub struct AbandonAction {}

        /// The action oneof.
        #[derive(Clone, Copy, PartialEq, ::prost::Oneof)]
        pub enum BucketAction {
            /// Assign a quota.
            #[prost(message, tag = "2")]
            QuotaAssignmentAction(QuotaAssignmentAction),
            /// Abandon the bucket.
            #[prost(message, tag = "3")]
            AbandonAction(AbandonAction),
        }
    }
}

/// The service's fully-qualified name.
pub const SERVICE_NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

const METHOD: &str = "StreamRateLimitQuotas";
const PATH: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// What a quota server implements.
#[tonic::async_trait]
pub trait RateLimitQuotaService: Send + Sync + 'static {
    /// The stream of responses.
    type ResponseStream: Stream<Item = Result<RateLimitQuotaResponse, tonic::Status>>
        + Send
        + 'static;

    /// Serve one client's stream of reports.
    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Self::ResponseStream>, tonic::Status>;
}

/// The codec of one stream of a [`RateLimitQuotaServiceServer`] of `T`, made per stream from
/// the service (to map or count decoding errors).
pub trait QuotaCodec<T>:
    Codec<Encode = RateLimitQuotaResponse, Decode = RateLimitQuotaUsageReports> + Send + 'static
{
    /// The codec of a stream served by `service`.
    fn for_call(service: &Arc<T>) -> Self;
}

impl<T> QuotaCodec<T> for ProstCodec<RateLimitQuotaResponse, RateLimitQuotaUsageReports> {
    fn for_call(_: &Arc<T>) -> Self {
        Self::default()
    }
}

/// A [`RateLimitQuotaService`] as a tower service of gRPC requests, with codec `C`.
pub struct RateLimitQuotaServiceServer<
    T,
    C = ProstCodec<RateLimitQuotaResponse, RateLimitQuotaUsageReports>,
> {
    inner: Arc<T>,
    max_decoding_message_size: Option<usize>,
    codec: PhantomData<fn() -> C>,
}

impl<T> RateLimitQuotaServiceServer<T> {
    /// Serve a shared `inner` with tonic-prost's codec.
    pub fn from_arc(inner: Arc<T>) -> Self {
        Self::with_codec(inner)
    }
}

impl<T, C> RateLimitQuotaServiceServer<T, C> {
    /// Serve a shared `inner` with codec `C`.
    pub fn with_codec(inner: Arc<T>) -> Self {
        Self {
            inner,
            max_decoding_message_size: None,
            codec: PhantomData,
        }
    }

    /// Refuse report messages larger than `limit` bytes (tonic's default is 4 MiB).
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }
}

impl<T: fmt::Debug, C> fmt::Debug for RateLimitQuotaServiceServer<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitQuotaServiceServer")
            .field("inner", &self.inner)
            .field("max_decoding_message_size", &self.max_decoding_message_size)
            .finish()
    }
}

impl<T, C> Clone for RateLimitQuotaServiceServer<T, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_decoding_message_size: self.max_decoding_message_size,
            codec: PhantomData,
        }
    }
}

impl<T, C> tonic::server::NamedService for RateLimitQuotaServiceServer<T, C> {
    const NAME: &'static str = SERVICE_NAME;
}

/// `StreamRateLimitQuotas` as tonic's streaming service.
struct StreamQuotas<T>(Arc<T>);

impl<T: RateLimitQuotaService> tonic::server::StreamingService<RateLimitQuotaUsageReports>
    for StreamQuotas<T>
{
    type Response = RateLimitQuotaResponse;
    type ResponseStream = T::ResponseStream;
    type Future = BoxFuture<tonic::Response<T::ResponseStream>, tonic::Status>;

    fn call(
        &mut self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.stream_rate_limit_quotas(request).await })
    }
}

impl<T, C, B> tonic::codegen::Service<http::Request<B>> for RateLimitQuotaServiceServer<T, C>
where
    T: RateLimitQuotaService,
    C: QuotaCodec<T>,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    /// `StreamRateLimitQuotas` through the service; any other method UNIMPLEMENTED.
    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let codec = C::for_call(&self.inner);
        let method = StreamQuotas(Arc::clone(&self.inner));
        let max = self.max_decoding_message_size;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(codec).apply_max_message_size_config(max, None);
            Ok(grpc.streaming(method, req).await)
        })
    }
}

/// A client of `RateLimitQuotaService` (for tests and tools; Envoy is the usual client).
#[derive(Debug, Clone)]
pub struct RateLimitQuotaServiceClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> RateLimitQuotaServiceClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    /// A client over an existing transport (a `Channel`, or any gRPC service).
    pub fn new(inner: T) -> Self {
        Self {
            inner: tonic::client::Grpc::new(inner),
        }
    }

    /// Open the stream: reports go out on `request`, responses come back on the returned
    /// stream.
    pub async fn stream_rate_limit_quotas(
        &mut self,
        request: impl tonic::IntoStreamingRequest<Message = RateLimitQuotaUsageReports>,
    ) -> Result<tonic::Response<tonic::codec::Streaming<RateLimitQuotaResponse>>, tonic::Status>
    {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {}", e.into())))?;
        let mut req = request.into_streaming_request();
        req.extensions_mut()
            .insert(GrpcMethod::new(SERVICE_NAME, METHOD));
        let codec = ProstCodec::default();
        self.inner
            .streaming(req, PathAndQuery::from_static(PATH), codec)
            .await
    }
}
