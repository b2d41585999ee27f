//! The service's side of queueing (rules with a `queue` option, see docs/rules.md): the driver
//! that [`tollgate_core::queue::serve`] runs for forward-auth and `/v1/check` requests (Tokio
//! timers on the state's clock, the service's decision), and the queue metrics.
//!
//! The ordering, the bounds and the waiting logic are core's; this is only what the service
//! plugs into them. gRPC (Envoy's RLS) never queues: Envoy's call to a rate limit service has a
//! short timeout, and a wait there would turn into Envoy's failure mode rather than a 429.

use crate::check::{acceptable, attempt, decide, limit_info};
use crate::error::ApiError;
use crate::model::{CheckRequest, CheckResponse, Code, DescriptorStatus, HeaderValues};
use crate::state::AppState;
use tollgate_core::limiter::{Overrides, Plan, QueueSpot};
use tollgate_core::queue::{Attempt, Driver, Dropped};
use tollgate_core::Micros;

/// The answer of a decision.
type Decided = Result<CheckResponse, ApiError>;

/// Decide `req` as [`crate::check::decide`] does, except that a denial by rules with a `queue`
/// waits for capacity as they allow ([`tollgate_core::queue::serve`]). With no such rule in the
/// active rules (one relaxed load), it is [`crate::check::decide`].
pub(crate) async fn decide_queued(state: &AppState, req: &CheckRequest) -> Decided {
    if !state.has_queues() {
        return decide(state, req).await;
    }
    // Boxed: the waiting's larger future is built only where a rule may queue, so that the
    // future of every other request stays the size of `decide`'s.
    Box::pin(queued(state, req)).await
}

/// [`decide_queued`] once the active rules have a queue.
async fn queued(state: &AppState, req: &CheckRequest) -> Decided {
    if !acceptable(state, req) {
        return decide(state, req).await;
    }
    let rules = state.rules();
    let overrides = Overrides::new(&rules.set, &req.domain, &req.descriptors);
    let plan = Plan::with_overrides(
        &rules.set,
        &overrides,
        &req.domain,
        &req.descriptors,
        req.hits.unwrap_or(1),
    );
    let spots = plan.queue_spots();
    if spots.is_empty() {
        return decide(state, req).await;
    }
    let driver = Queued { state, req };
    tollgate_core::queue::serve(state.queue(), &driver, &spots).await
}

/// One request that may wait: what core's `serve` drives.
struct Queued<'a> {
    state: &'a AppState,
    req: &'a CheckRequest,
}

impl Driver for Queued<'_> {
    type Answer = Decided;

    fn now(&self) -> Micros {
        self.state.now()
    }

    async fn sleep_until(&self, at: Micros) {
        let now = self.now();
        if at > now {
            tokio::time::sleep(std::time::Duration::from_micros(at - now)).await;
        }
    }

    async fn decide(&self) -> Attempt<Decided> {
        attempt(self.state, self.req).await
    }

    async fn refusal(&self, spot: &QueueSpot<'_>, why: Dropped) -> Decided {
        Ok(refusal(self.req, spot, why))
    }

    fn joined(&self, spot: &QueueSpot<'_>) {
        self.state.metrics().queue.of(spot).joined();
    }

    fn served(&self, spot: &QueueSpot<'_>, waited: Micros) {
        self.state.metrics().queue.of(spot).served(waited);
    }

    fn dropped(&self, spot: &QueueSpot<'_>, why: Dropped, waited: bool) {
        self.state.metrics().queue.of(spot).dropped(why, waited);
    }
}

/// The denial of a request that waited behind others and never decided: its line was full or
/// its deadline came. No store was asked (asking would consume what the waiters ahead of it
/// wait for), so the headers say what the rule says: its limit, nothing remaining, and to retry
/// after the rule's `max_wait`.
fn refusal(req: &CheckRequest, spot: &QueueSpot<'_>, why: Dropped) -> CheckResponse {
    let limit = spot.limit;
    let wait_secs = tollgate_core::headers::secs_ceil(spot.policy.max_wait).max(1);
    let reason = match why {
        Dropped::Full => "queue full",
        _ => "queue wait exceeded",
    };
    let message = match &limit.message {
        Some(m) => format!("{m} ({reason})"),
        None => format!("rate limit exceeded ({reason})"),
    };
    let statuses = (0..req.descriptors.len())
        .map(|i| {
            if i == spot.descriptor {
                DescriptorStatus {
                    limit: limit_info(limit),
                    retry_after: Some(spot.policy.max_wait),
                    message: Some(message.clone()),
                    ..DescriptorStatus::new(Code::OverLimit, None, 0)
                }
            } else {
                DescriptorStatus::new(Code::Ok, None, 0)
            }
        })
        .collect();
    let headers = limit.quota.map(|q| HeaderValues {
        limit: q.limit(),
        remaining: 0,
        reset_secs: wait_secs,
        retry_after_secs: Some(wait_secs),
        window_secs: tollgate_core::headers::secs_ceil(q.period().nominal()),
    });
    CheckResponse {
        allowed: false,
        statuses,
        headers,
        delay: 0,
        degrade: None,
        shadowbanned: false,
    }
}
