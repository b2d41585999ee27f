//! `RateLimitService` (the trait a server implements) and `RateLimitServiceServer` (the tower
//! service that routes `ShouldRateLimit` to it through tonic), as a protobuf code generator
//! writes them for this service, less the compression settings and with the codec a type
//! parameter (tonic-prost's by default).

use crate::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::Codec;
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic_prost::ProstCodec;

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

/// A [`RateLimitService`] as a tower service of gRPC requests (for `tonic`'s router), with
/// codec `C`: tonic-prost's unless the server needs its own (see [`CallCodec`]).
pub struct RateLimitServiceServer<T, C = ProstCodec<RateLimitResponse, RateLimitRequest>> {
    inner: Arc<T>,
    max_decoding_message_size: Option<usize>,
    codec: PhantomData<fn() -> C>,
}

/// The codec of one call of a [`RateLimitServiceServer`] of `T`, made for each call from the
/// service (to map decoding errors, or count them in the service's metrics, say).
pub trait CallCodec<T>:
    Codec<Encode = RateLimitResponse, Decode = RateLimitRequest> + Send + 'static
{
    /// The codec of a call to `service`.
    fn for_call(service: &Arc<T>) -> Self;
}

impl<T> CallCodec<T> for ProstCodec<RateLimitResponse, RateLimitRequest> {
    fn for_call(_: &Arc<T>) -> Self {
        Self::default()
    }
}

impl<T> RateLimitServiceServer<T> {
    /// Serve `inner`.
    pub fn new(inner: T) -> Self {
        Self::from_arc(Arc::new(inner))
    }

    /// Serve a shared `inner`.
    pub fn from_arc(inner: Arc<T>) -> Self {
        Self::with_codec(inner)
    }
}

impl<T, C> RateLimitServiceServer<T, C> {
    /// Serve a shared `inner` with codec `C`.
    pub fn with_codec(inner: Arc<T>) -> Self {
        Self {
            inner,
            max_decoding_message_size: None,
            codec: PhantomData,
        }
    }

    /// Refuse requests larger than `limit` bytes (tonic's default is 4 MiB).
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }
}

impl<T: fmt::Debug, C> fmt::Debug for RateLimitServiceServer<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitServiceServer")
            .field("inner", &self.inner)
            .field("max_decoding_message_size", &self.max_decoding_message_size)
            .finish()
    }
}

impl<T, C> Clone for RateLimitServiceServer<T, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_decoding_message_size: self.max_decoding_message_size,
            codec: PhantomData,
        }
    }
}

impl<T, C> tonic::server::NamedService for RateLimitServiceServer<T, C> {
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

impl<T, C, B> tonic::codegen::Service<http::Request<B>> for RateLimitServiceServer<T, C>
where
    T: RateLimitService,
    C: CallCodec<T>,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    /// `ShouldRateLimit` through the service, requests over `max_decoding_message_size`
    /// refused; any other method UNIMPLEMENTED, as gRPC specifies.
    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let codec = C::for_call(&self.inner);
        let method = ShouldRateLimit(Arc::clone(&self.inner));
        let max_decoding_message_size = self.max_decoding_message_size;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_max_message_size_config(max_decoding_message_size, None);
            Ok(grpc.unary(method, req).await)
        })
    }
}
