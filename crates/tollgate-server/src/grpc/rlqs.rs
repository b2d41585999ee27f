//! Envoy's Rate Limit Quota Service on the gRPC listener:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`, protobuf
//! to and from the quota server ([`crate::quota`]), which decides.
//!
//! One task per stream reads the reports; the responses (each report's answer and the
//! assignments pushed when other clients move the division) go out through one bounded queue,
//! which the quota server fills.
//! A report that is not valid protobuf ends the stream with INVALID_ARGUMENT (counted as
//! `invalid_protobuf`); one larger than `--max-body-bytes` ends it with OUT_OF_RANGE
//! (`message_too_large`).
//! When the stream ends, either way, its shares go back to the other clients.

use crate::quota::{Assignment, Push, QuotaAction, Quotas, Usage};
use crate::state::AppState;
use futures_util::Stream;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tollgate_proto::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use tollgate_proto::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use tollgate_proto::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    BucketAction as Action, QuotaAssignmentAction,
};
use tollgate_proto::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use tollgate_proto::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use tollgate_proto::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tollgate_proto::pb::google::protobuf::{Duration, UInt32Value};

/// Responses queued for one stream before pushes to it are dropped (it gets its assignments
/// again with its next report).
const QUEUE: usize = 16;

/// The quota service over the shared state's rules.
#[derive(Debug)]
pub(super) struct QuotaGrpc {
    state: AppState,
    quotas: Arc<Quotas>,
}

impl QuotaGrpc {
    pub(super) fn new(state: AppState, quotas: Arc<Quotas>) -> Self {
        QuotaGrpc { state, quotas }
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaGrpc {
    type ResponseStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let (tx, rx) = mpsc::channel::<Push>(QUEUE);
        let id = self
            .quotas
            .open(tx.clone())
            .map_err(|e| tonic::Status::resource_exhausted(e.to_string()))?;
        let mut inbound = request.into_inner();
        let quotas = Arc::clone(&self.quotas);
        let state = self.state.clone();
        tokio::spawn(async move {
            // Closes the stream in the quota server however this task ends (a panic included).
            let _close = Close(Arc::clone(&quotas), id);
            loop {
                let message = tokio::select! {
                    m = inbound.message() => m,
                    () = tx.closed() => break,
                };
                let reports = match message {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(status) => {
                        // tonic's prost codec reports a message that does not decode as
                        // INTERNAL: the client's fault, answered INVALID_ARGUMENT. A message
                        // over the size limit is OUT_OF_RANGE; anything else (the client reset
                        // the stream) has nobody to answer.
                        let message = status.message().to_owned();
                        let end = match status.code() {
                            tonic::Code::Internal if message.contains("decode") => {
                                state.metrics().quota.rejected("invalid_protobuf");
                                Some(Push::Invalid(message))
                            }
                            tonic::Code::OutOfRange => {
                                state.metrics().quota.rejected("message_too_large");
                                Some(Push::TooLarge(message))
                            }
                            _ => None,
                        };
                        if let Some(end) = end {
                            let _ = tx.send(end).await;
                        }
                        break;
                    }
                };
                let usages = reports
                    .bucket_quota_usages
                    .into_iter()
                    .map(|u| Usage {
                        bucket: u.bucket_id.map(|b| b.bucket).unwrap_or_default(),
                        allowed: u.num_requests_allowed,
                        denied: u.num_requests_denied,
                    })
                    .collect();
                let rules = state.rules();
                let answer = quotas.report(
                    id,
                    &reports.domain,
                    usages,
                    &rules.set,
                    rules.generation,
                    state.now(),
                );
                if let Err(e) = answer {
                    let _ = tx.send(Push::Invalid(e.to_string())).await;
                    break;
                }
            }
        });
        let responses = futures_util::stream::unfold((rx, false), |(mut rx, done)| async move {
            if done {
                return None;
            }
            match rx.recv().await? {
                Push::Actions(actions) => Some((Ok(response(actions)), (rx, false))),
                Push::Invalid(message) => {
                    Some((Err(tonic::Status::invalid_argument(message)), (rx, true)))
                }
                Push::TooLarge(message) => {
                    Some((Err(tonic::Status::out_of_range(message)), (rx, true)))
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(responses)))
    }
}

/// Closes its stream in the quota server when dropped.
struct Close(Arc<Quotas>, crate::quota::StreamId);

impl Drop for Close {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}

/// The protobuf response of `actions`.
fn response(actions: Vec<QuotaAction>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: actions
            .into_iter()
            .map(|a| BucketAction {
                bucket_id: Some(BucketId { bucket: a.bucket }),
                bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: Some(Duration {
                        seconds: i64::try_from(a.ttl_secs).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                    rate_limit_strategy: Some(strategy(a.assignment)),
                })),
            })
            .collect(),
    }
}

fn strategy(assignment: Assignment) -> RateLimitStrategy {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket(b) => Strategy::TokenBucket(TokenBucket {
            max_tokens: b.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: b.tokens_per_fill,
            }),
            fill_interval: Some(Duration {
                seconds: i64::try_from(b.fill_interval_secs).unwrap_or(i64::MAX),
                nanos: 0,
            }),
        }),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}
