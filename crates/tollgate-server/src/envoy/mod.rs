//! Envoy compatibility, all in one place: what lets tollgate stand in for envoyproxy/ratelimit
//! without the rest of the service knowing.
//!
//! - [`profile`]: `--profile envoy`, envoyproxy/ratelimit's environment variables translated
//!   into tollgate's settings ([`ServeConfig`](crate::config::ServeConfig)) and this module's
//!   [`EnvoyConfig`];
//! - [`redis`]: envoy's Redis settings and key layout; [`stats`]: envoy-named statistics
//!   (statsd, a Prometheus page); `debug`: envoy's debug port;
//! - the profile's semantics as a `DecisionPolicy` (`EnvoyPolicy`: global shadow and quota
//!   mode, envoy's choice of the limit the headers describe);
//! - `/json` and `/healthcheck` on the HTTP API (`http_routes`), and on gRPC the three named
//!   headers, `dynamic_metadata` and the `ratelimit` health service (`grpc_answers`).
//!
//! The composition root (`serve`) is the only module that imports this one: the service core
//! and the transports offer hooks (`DecisionPolicy`, [`GrpcAnswers`], extra HTTP routes), and
//! this module fills them.

pub(crate) mod debug;
mod json;
mod metadata;
pub mod profile;
pub mod redis;
pub mod stats;

pub use json::{envoy_response, proto_duration};
pub(crate) use metadata::dynamic_metadata;
pub use metadata::pb_struct_json;
pub(crate) use profile::EnvoyMode;

use crate::backend::BreakerState;
use crate::grpc::{GrpcAnswers, ResponseHeaders};
use crate::http::HttpState;
use crate::model::{secs_ceil, HeaderValues};
use crate::policy::DecisionPolicy;
use crate::state::AppState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tollgate_core::limiter::{Status, Verdict};
use tollgate_core::rules::Limit;

/// The gRPC health service name envoyproxy/ratelimit reports (besides `""`).
pub(crate) const HEALTH_SERVICE: &str = "ratelimit";

/// The Envoy-compatibility settings of a service: the profile's behaviour, when it is on, and
/// the envoy-named statistics (also available without the profile, `--envoy-metrics`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct EnvoyConfig {
    /// `--profile envoy`'s behaviour, or `None` for tollgate's.
    pub mode: Option<EnvoyMode>,
    /// Envoy-named statistics exports.
    pub stats: stats::EnvoyStats,
}

impl EnvoyConfig {
    /// No profile, with these statistics exports.
    pub fn with_stats(stats: stats::EnvoyStats) -> Self {
        Self { mode: None, stats }
    }

    /// The decision policy the settings call for: `EnvoyPolicy` under the profile, `None`
    /// (tollgate's) otherwise.
    pub(crate) fn policy(&self) -> Option<Arc<dyn DecisionPolicy>> {
        self.mode
            .as_ref()
            .map(|m| Arc::new(EnvoyPolicy::new(m)) as Arc<dyn DecisionPolicy>)
    }
}

/// envoyproxy/ratelimit's semantics (see [`EnvoyMode`]).
#[derive(Debug, Default)]
pub(crate) struct EnvoyPolicy {
    quota_mode: bool,
    shadow_mode: bool,
    /// Over-limit answers turned into OK by `SHADOW_MODE`.
    shadowed: AtomicU64,
}

impl EnvoyPolicy {
    /// The policy of `mode`.
    pub(crate) fn new(mode: &EnvoyMode) -> Self {
        Self {
            quota_mode: mode.quota_mode,
            shadow_mode: mode.shadow_mode,
            shadowed: AtomicU64::new(0),
        }
    }
}

impl DecisionPolicy for EnvoyPolicy {
    /// A descriptor with no entries is answered OK with no limit, as envoyproxy/ratelimit
    /// does (it matches no rule).
    fn empty_descriptors_ok(&self) -> bool {
        true
    }

    fn quota_mode(&self) -> bool {
        self.quota_mode
    }

    fn headers(
        &self,
        verdict: &Verdict<'_>,
        allowed: bool,
        now: tollgate_core::Micros,
    ) -> Option<HeaderValues> {
        envoy_binding(verdict, self.quota_mode, allowed, now)
    }

    fn overrule_denial(&self) -> bool {
        if self.shadow_mode {
            self.shadowed.fetch_add(1, Ordering::Relaxed);
        }
        self.shadow_mode
    }

    fn expose(&self, out: &mut crate::exposition::Exposition) {
        out.single(
            "tollgate_global_shadow_mode_total",
            crate::exposition::Kind::Counter,
            "Requests answered OK instead of OVER_LIMIT by SHADOW_MODE.",
            self.shadowed.load(Ordering::Relaxed),
        );
    }
}

/// The envoy profile's rate-limit headers, chosen as envoyproxy/ratelimit chooses them: the
/// limited descriptor with the least remaining (the first of equals), except that the last
/// descriptor over its limit outside quota mode wins; the reset is the end of the unit's
/// epoch-aligned window.
fn envoy_binding(
    verdict: &tollgate_core::limiter::Verdict<'_>,
    quota_everywhere: bool,
    allowed: bool,
    now: tollgate_core::Micros,
) -> Option<HeaderValues> {
    let mut best: Option<(&Limit, u64, &tollgate_core::Decision)> = None;
    for status in &verdict.statuses {
        let Status::Limited {
            limit, decision, ..
        } = status
        else {
            continue;
        };
        if limit.quota.is_none() {
            continue;
        }
        let over = status.blocks() && !(quota_everywhere || limit.quota_mode);
        let remaining = if over {
            0
        } else {
            decision.reported_remaining()
        };
        // Once one is over, only another over one (remaining 0, not below it) replaces it.
        if over || best.is_none_or(|(_, r, _)| remaining < r) {
            best = Some((limit, remaining, decision));
        }
    }
    let (limit, remaining, decision) = best?;
    let q = limit.quota?;
    Some(HeaderValues {
        limit: q.limit(),
        remaining,
        reset_secs: profile::reset_secs(q.period().unit, now / 1_000_000),
        // Only `/v1/check` sends these two; Envoy gets the three headers above.
        retry_after_secs: if decision.allowed || allowed {
            None
        } else {
            decision.retry_after.map(|r| secs_ceil(r).max(1))
        },
        window_secs: secs_ceil(q.period().nominal()),
    })
}

/// Whether `/healthcheck` and the `ratelimit` health service report healthy, as
/// envoyproxy/ratelimit's do: not shutting down, Redis (when it is the store) has answered at
/// least once since start, and (with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`) some domain is
/// loaded. A later Redis outage does not make the service unhealthy.
#[derive(Debug)]
pub(crate) struct Health {
    state: AppState,
    needs_config: bool,
    redis_answered: AtomicBool,
}

impl Health {
    /// The health of `state` under `mode`.
    pub(crate) fn new(state: AppState, mode: &EnvoyMode) -> Arc<Self> {
        Arc::new(Self {
            state,
            needs_config: mode.healthy_needs_config,
            redis_answered: AtomicBool::new(false),
        })
    }

    /// Healthy now.
    pub(crate) fn healthy(&self) -> bool {
        let waiting_for_config = self.needs_config && self.state.rules().set.is_empty();
        // Rules from xDS: envoyproxy/ratelimit does not serve until the first configuration
        // (unless FORCE_START_WITHOUT_INITIAL_CONFIG), so health says no until then.
        let waiting_for_xds = self.state.xds().is_some_and(|x| !x.ready());
        !(self.state.shutting_down()
            || waiting_for_xds
            || waiting_for_config
            || self.waiting_for_redis())
    }

    /// Whether Redis is the store and has not answered yet (its start-up probe failed and the
    /// breaker has stayed open since); with a per-second Redis, until both have answered.
    fn waiting_for_redis(&self) -> bool {
        let backend = self.state.backend();
        let Some(g) = backend.redis() else {
            return false;
        };
        if self.redis_answered.load(Ordering::Relaxed) {
            return false;
        }
        let open = |g: &crate::backend::Guarded| g.state() == BreakerState::Open;
        if open(g) || backend.per_second().is_some_and(|p| open(p)) {
            return true;
        }
        self.redis_answered.store(true, Ordering::Relaxed);
        false
    }
}

/// The HTTP routes of Envoy compatibility: `POST /json` (always: a client of
/// envoyproxy/ratelimit's JSON endpoint works unchanged) and, under the profile, `GET
/// /healthcheck` (with `health`).
pub(crate) fn http_routes(
    mode: Option<&EnvoyMode>,
    health: Option<Arc<Health>>,
) -> axum::Router<HttpState> {
    json::routes(mode.cloned().map(Arc::new), health)
}

/// What gRPC answers carry: under the profile, envoy's three named headers (when
/// `LIMIT_RESPONSE_HEADERS_ENABLED`), `dynamic_metadata` (when `RESPONSE_DYNAMIC_METADATA`) and
/// the `ratelimit` health service; without it, tollgate's headers when `response_headers`.
pub(crate) fn grpc_answers(
    state: &AppState,
    mode: Option<&EnvoyMode>,
    health: Option<Arc<Health>>,
    response_headers: bool,
) -> GrpcAnswers {
    let Some(mode) = mode else {
        return GrpcAnswers::with_headers(if response_headers {
            ResponseHeaders::Tollgate
        } else {
            ResponseHeaders::Off
        });
    };
    let mut answers = GrpcAnswers::with_headers(match &mode.headers {
        Some(names) => ResponseHeaders::Named(names.clone()),
        None => ResponseHeaders::Off,
    });
    if mode.dynamic_metadata {
        let state = state.clone();
        answers.dynamic_metadata = Some(Arc::new(move |req, resp| {
            dynamic_metadata(req, resp, &state.rules().set)
        }));
    }
    if let Some(health) = health {
        answers.health = Some((HEALTH_SERVICE, Arc::new(move || health.healthy())));
    }
    answers
}
