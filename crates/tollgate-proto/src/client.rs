//! `RateLimitServiceClient`: the client side of `ShouldRateLimit`, on tonic's generic unary
//! call (what a protobuf code generator writes for this service, less compression settings
//! tollgate's callers never set).

use crate::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{Body, Bytes, GrpcMethod, StdError};

const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
const METHOD: &str = "ShouldRateLimit";
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A client of `envoy.service.ratelimit.v3.RateLimitService`.
#[derive(Debug, Clone)]
pub struct RateLimitServiceClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl RateLimitServiceClient<tonic::transport::Channel> {
    /// Connect to `dst` (a URI such as `http://127.0.0.1:8081`).
    pub async fn connect<D>(dst: D) -> Result<Self, tonic::transport::Error>
    where
        D: TryInto<tonic::transport::Endpoint>,
        D::Error: Into<StdError>,
    {
        let conn = tonic::transport::Endpoint::new(dst)?.connect().await?;
        Ok(Self::new(conn))
    }
}

impl<T> RateLimitServiceClient<T>
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

    /// Refuse responses larger than `limit` bytes (tonic's default is 4 MiB).
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.inner = self.inner.max_decoding_message_size(limit);
        self
    }

    /// Ask for a decision.
    pub async fn should_rate_limit(
        &mut self,
        request: impl tonic::IntoRequest<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {}", e.into())))?;
        let mut req = request.into_request();
        req.extensions_mut()
            .insert(GrpcMethod::new(SERVICE, METHOD));
        let codec = tonic_prost::ProstCodec::default();
        self.inner
            .unary(req, PathAndQuery::from_static(PATH), codec)
            .await
    }
}
