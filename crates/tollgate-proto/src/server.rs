//! `RateLimitService` (the trait a server implements) and `RateLimitServiceServer` (the tower
//! service that routes `ShouldRateLimit` to it through tonic), as a protobuf code generator
//! writes them for this service, less the compression settings.

use crate::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::Codec;
use tonic::codegen::{http, Body, BoxFuture, StdError};

/// The service's fully-qualified name.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// What a rate-limit server implements.
#[tonic::async_trait]
pub trait RateLimitService: Send + Sync + 'static {
    /// Decide on one request.
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status>;
}

/// A [`RateLimitService`] as a tower service of gRPC requests (for `tonic`'s router).
#[derive(Debug)]
pub struct RateLimitServiceServer<T> {
    inner: Arc<T>,
    max_decoding_message_size: Option<usize>,
}

impl<T> RateLimitServiceServer<T> {
    /// Serve `inner`.
    pub fn new(inner: T) -> Self {
        Self::from_arc(Arc::new(inner))
    }

    /// Serve a shared `inner`.
    pub fn from_arc(inner: Arc<T>) -> Self {
        Self {
            inner,
            max_decoding_message_size: None,
        }
    }

    /// Refuse requests larger than `limit` bytes (tonic's default is 4 MiB).
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }
}

impl<T> Clone for RateLimitServiceServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_decoding_message_size: self.max_decoding_message_size,
        }
    }
}

impl<T> tonic::server::NamedService for RateLimitServiceServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

/// `ShouldRateLimit` as tonic's unary service.
struct ShouldRateLimit<T>(Arc<T>);

impl<T: RateLimitService> tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit<T> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.should_rate_limit(request).await })
    }
}

/// Answer one HTTP/2 request to this service: `ShouldRateLimit` through `inner`, with `codec`
/// and requests over `max_decoding_message_size` refused; any other method UNIMPLEMENTED, as
/// gRPC specifies. [`RateLimitServiceServer`] calls it with tonic-prost's codec; a server that
/// needs its own codec (to map decoding errors, say) calls it with that one.
pub fn route<T, C, B>(
    inner: &Arc<T>,
    codec: C,
    max_decoding_message_size: Option<usize>,
    req: http::Request<B>,
) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>
where
    T: RateLimitService,
    C: Codec<Encode = RateLimitResponse, Decode = RateLimitRequest> + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if req.uri().path() != PATH {
        return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
    }
    let method = ShouldRateLimit(Arc::clone(inner));
    Box::pin(async move {
        let mut grpc = tonic::server::Grpc::new(codec)
            .apply_max_message_size_config(max_decoding_message_size, None);
        Ok(grpc.unary(method, req).await)
    })
}

impl<T, B> tonic::codegen::Service<http::Request<B>> for RateLimitServiceServer<T>
where
    T: RateLimitService,
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
        let codec = tonic_prost::ProstCodec::default();
        route(&self.inner, codec, self.max_decoding_message_size, req)
    }
}
