//! The messages of an xDS state-of-the-world subscription to rate-limit rules, and the client of
//! the aggregated discovery service's stream: what tollgate needs to take its rules from an xDS
//! management server (as envoyproxy/ratelimit's `GRPC_XDS_SOTW` configuration does).
//!
//! Field numbers and types are those of Envoy's `discovery.proto` (`DiscoveryRequest`,
//! `DiscoveryResponse`), `base.proto` (`Node`), Google's `any.proto` and `status.proto`, and
//! envoyproxy/ratelimit's `rls_conf.proto` (`RateLimitConfig`). Only the fields a rate-limit
//! rules client reads or writes are declared; the others are skipped on decode.

use crate::pb::google::protobuf::Struct;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{Body, Bytes, GrpcMethod, StdError};

/// `google.protobuf.Any`: a message with its type's URL.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct Any {
    /// `type.googleapis.com/<full message name>`.
    #[prost(string, tag = "1")]
    pub type_url: ::prost::alloc::string::String,
    /// The encoded message.
    #[prost(bytes = "vec", tag = "2")]
    pub value: ::prost::alloc::vec::Vec<u8>,
}

/// `google.rpc.Status`: an error, as a NACK carries it.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Status {
    /// A `google.rpc.Code` (3: INVALID_ARGUMENT).
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// What is wrong, for people.
    #[prost(string, tag = "2")]
    pub message: ::prost::alloc::string::String,
    /// Details (unused by tollgate).
    #[prost(message, repeated, tag = "3")]
    pub details: ::prost::alloc::vec::Vec<Any>,
}

/// `envoy.config.core.v3.Node`: who is asking.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Node {
    /// The node id the management server keys its snapshots by.
    #[prost(string, tag = "1")]
    pub id: ::prost::alloc::string::String,
    /// The cluster the node belongs to.
    #[prost(string, tag = "2")]
    pub cluster: ::prost::alloc::string::String,
    /// Free-form metadata.
    #[prost(message, optional, tag = "3")]
    pub metadata: ::core::option::Option<Struct>,
    /// The client's name (`tollgate`).
    #[prost(string, tag = "6")]
    pub user_agent_name: ::prost::alloc::string::String,
    /// The client's version.
    #[prost(string, tag = "7")]
    pub user_agent_version: ::prost::alloc::string::String,
}

/// `envoy.service.discovery.v3.DiscoveryRequest`: a subscription, an ACK or a NACK.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct DiscoveryRequest {
    /// The version last applied (empty before the first).
    #[prost(string, tag = "1")]
    pub version_info: ::prost::alloc::string::String,
    /// The node.
    #[prost(message, optional, tag = "2")]
    pub node: ::core::option::Option<Node>,
    /// Resource names (empty: all, a wildcard subscription).
    #[prost(string, repeated, tag = "3")]
    pub resource_names: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
    /// The resource type.
    #[prost(string, tag = "4")]
    pub type_url: ::prost::alloc::string::String,
    /// The nonce of the response this request answers.
    #[prost(string, tag = "5")]
    pub response_nonce: ::prost::alloc::string::String,
    /// Set in a NACK: why the response was refused.
    #[prost(message, optional, tag = "6")]
    pub error_detail: ::core::option::Option<Status>,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`: the whole state of one resource type.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct DiscoveryResponse {
    /// The version of this state.
    #[prost(string, tag = "1")]
    pub version_info: ::prost::alloc::string::String,
    /// The resources.
    #[prost(message, repeated, tag = "2")]
    pub resources: ::prost::alloc::vec::Vec<Any>,
    /// Canary flag (unused).
    #[prost(bool, tag = "3")]
    pub canary: bool,
    /// The resource type.
    #[prost(string, tag = "4")]
    pub type_url: ::prost::alloc::string::String,
    /// The nonce the ACK or NACK must carry.
    #[prost(string, tag = "5")]
    pub nonce: ::prost::alloc::string::String,
}

/// `ratelimit.config.ratelimit.v3.RateLimitConfig`: one domain's rules.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitConfig {
    /// The resource's name.
    #[prost(string, tag = "1")]
    pub name: ::prost::alloc::string::String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: ::prost::alloc::string::String,
    /// The descriptor tree.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: ::prost::alloc::vec::Vec<RateLimitDescriptor>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitDescriptor`: one node of the descriptor tree.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitDescriptor {
    /// The descriptor key.
    #[prost(string, tag = "1")]
    pub key: ::prost::alloc::string::String,
    /// The value (empty: any value).
    #[prost(string, tag = "2")]
    pub value: ::prost::alloc::string::String,
    /// The limit.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: ::core::option::Option<RateLimitPolicy>,
    /// Nested descriptors.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: ::prost::alloc::vec::Vec<RateLimitDescriptor>,
    /// Count but never deny.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Per-value statistics.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// Quota mode.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Free-form metadata (not used for decisions).
    #[prost(message, optional, tag = "8")]
    pub metadata: ::core::option::Option<Struct>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitPolicy`: a limit.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitPolicy {
    /// The unit (`ratelimit.config.ratelimit.v3.RateLimitUnit`, numbered as Envoy's).
    #[prost(enumeration = "crate::pb::envoy::r#type::v3::RateLimitUnit", tag = "1")]
    pub unit: i32,
    /// Requests per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// No limit.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The limit's name (what `replaces` refers to).
    #[prost(string, tag = "4")]
    pub name: ::prost::alloc::string::String,
    /// Limits this one replaces.
    #[prost(message, repeated, tag = "5")]
    pub replaces: ::prost::alloc::vec::Vec<RateLimitReplace>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitReplace`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitReplace {
    /// The name of the limit replaced.
    #[prost(string, tag = "1")]
    pub name: ::prost::alloc::string::String,
}

/// The `type_url` of [`RateLimitConfig`] resources.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const METHOD: &str = "StreamAggregatedResources";
const PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// A client of `envoy.service.discovery.v3.AggregatedDiscoveryService`.
#[derive(Debug, Clone)]
pub struct AggregatedDiscoveryServiceClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> AggregatedDiscoveryServiceClient<T>
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

    /// Open the bidirectional stream: requests (subscription, ACKs, NACKs) go out on `request`,
    /// responses come back on the returned stream.
    pub async fn stream_aggregated_resources(
        &mut self,
        request: impl tonic::IntoStreamingRequest<Message = DiscoveryRequest>,
    ) -> Result<tonic::Response<tonic::codec::Streaming<DiscoveryResponse>>, tonic::Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {}", e.into())))?;
        let mut req = request.into_streaming_request();
        req.extensions_mut()
            .insert(GrpcMethod::new(SERVICE, METHOD));
        let codec = tonic_prost::ProstCodec::default();
        self.inner
            .streaming(req, PathAndQuery::from_static(PATH), codec)
            .await
    }
}
