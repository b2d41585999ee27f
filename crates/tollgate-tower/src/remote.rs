//! [`Remote`]: decisions from a running `tollgate serve`, over its Envoy RLS v3 gRPC API
//! (`ShouldRateLimit`), for applications that share limits through one service instead of
//! one Redis.
//!
//! The layer derives the descriptors itself (from its key or the rules file's `http` section)
//! and sends them; the limits are the service's rules. Every call is bounded by a timeout, and a
//! call that fails or times out is decided by the failure policy: open (let the request through,
//! Envoy's default `failure_mode_deny: false`) or closed (refuse it). The RLS answer has no
//! message and no leaky-bucket delay, so remote denials carry a generic message and remote
//! limits never shape; the rate-limit headers are the ones the service sends when it runs with
//! `--response-headers`.

use http::{HeaderMap, HeaderName, HeaderValue};
use std::sync::OnceLock;
use std::time::Duration;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::{Channel, Endpoint};

/// Where and how to ask a remote tollgate service.
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::{Key, RateLimitLayer, Remote};
///
/// // Limits from the service's rules for domain `api`, per client address; 50 ms at most per
/// // decision, and requests are refused while the service cannot answer.
/// let layer = RateLimitLayer::builder()
///     .remote(Remote::new("http://127.0.0.1:8081").timeout(Duration::from_millis(50)).fail_closed())
///     .domain("api")
///     .key(Key::peer_ip())
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct Remote {
    pub(crate) url: String,
    pub(crate) timeout: Duration,
    pub(crate) fail_closed: bool,
}

impl Remote {
    /// The service's gRPC address (`http://host:port`, its `--grpc-addr`); timeout 100 ms,
    /// failing open.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: Duration::from_millis(100),
            fail_closed: false,
        }
    }

    /// The longest a decision may take (connecting included) before the failure policy decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// While the service cannot answer, refuse requests (429 with `Retry-After: 1`).
    pub fn fail_closed(mut self) -> Self {
        self.fail_closed = true;
        self
    }

    /// While the service cannot answer, let requests through unlimited (the default).
    pub fn fail_open(mut self) -> Self {
        self.fail_closed = false;
        self
    }
}

/// A connected (lazily: on the first request, inside the runtime) RLS client.
pub(crate) struct Client {
    endpoint: Endpoint,
    channel: OnceLock<Channel>,
    pub(crate) timeout: Duration,
    pub(crate) fail_closed: bool,
}

/// The service's answer.
pub(crate) struct Answer {
    pub(crate) allowed: bool,
    pub(crate) headers: HeaderMap,
    /// The `tollgate_degrade` of the answer's dynamic metadata: the rule whose `degrade`
    /// threshold the request crossed.
    pub(crate) degrade: Option<String>,
    /// The answer's `tollgate_shadowbanned`: denied only by `shadowban` rules.
    pub(crate) shadowbanned: bool,
}

impl Client {
    pub(crate) fn new(r: &Remote) -> Result<Self, String> {
        let endpoint = Endpoint::from_shared(r.url.clone())
            .map_err(|e| format!("invalid remote address `{}`: {e}", r.url))?
            .timeout(r.timeout)
            .connect_timeout(r.timeout);
        Ok(Self {
            endpoint,
            channel: OnceLock::new(),
            timeout: r.timeout,
            fail_closed: r.fail_closed,
        })
    }

    /// Ask about `descriptors` of `domain`; `Err` when the service did not answer in time.
    pub(crate) async fn check(
        &self,
        domain: &str,
        descriptors: &[Vec<(String, String)>],
    ) -> Result<Answer, tonic::Status> {
        let channel = self
            .channel
            .get_or_init(|| self.endpoint.connect_lazy())
            .clone();
        let request = RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(key, value)| Entry {
                            key: key.clone(),
                            value: value.clone(),
                        })
                        .collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let mut client = RateLimitServiceClient::new(channel);
        let call = client.should_rate_limit(request);
        let response = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("rate limit service timed out"))??
            .into_inner();
        let mut headers = HeaderMap::new();
        for h in &response.response_headers_to_add {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(h.key.as_bytes()),
                HeaderValue::from_str(&h.value),
            ) {
                headers.insert(n, v);
            }
        }
        use tollgate_proto::pb::google::protobuf::value::Kind;
        let field = |name: &str| {
            response
                .dynamic_metadata
                .as_ref()
                .and_then(|m| m.fields.get(name))
                .and_then(|v| v.kind.as_ref())
        };
        let degrade = match field("tollgate_degrade") {
            Some(Kind::StringValue(rule)) => Some(rule.clone()),
            _ => None,
        };
        let shadowbanned = matches!(field("tollgate_shadowbanned"), Some(Kind::BoolValue(true)));
        Ok(Answer {
            allowed: response.overall_code != Code::OverLimit as i32,
            headers,
            degrade,
            shadowbanned,
        })
    }
}
