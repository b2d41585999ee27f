//! The transport-neutral decision: validate a [`CheckRequest`], resolve it with the *current*
//! rules, check the backend (memory, or Redis with its failure policy), record metrics, and build
//! a [`CheckResponse`]. HTTP and gRPC both await [`decide`]; the gRPC listener calls
//! [`decide_now`] first, which with the memory store answers without awaiting.

use crate::backend::{Outcome, Policy};
use crate::error::ApiError;
use crate::metrics::LimitCounters;
use crate::model::{CheckRequest, CheckResponse, Code, DescriptorStatus, HeaderValues, LimitInfo};
use crate::state::{AppState, LoadedRules, RequestLimits};
use crate::stats::{write_key, Seen};
use std::sync::Arc;
use std::time::Instant;
use tollgate_core::limiter::{Overrides, Plan, Status};
use tollgate_core::queue::{Attempt, Wait};
use tollgate_core::rules::Limit;

/// The message of a denial made by `--on-store-error deny` while Redis is unavailable.
pub const DENIED_BY_POLICY: &str =
    "rate limit store unavailable: denied by policy (--on-store-error deny); retry later";

/// Reject requests that break the size and shape limits (counted in
/// `tollgate_request_errors_total` by [`decide`]).
pub fn validate(limits: &RequestLimits, req: &CheckRequest) -> Result<(), ApiError> {
    validate_shape(limits, req, false)
}

/// [`validate`] for `state`, whose policy may accept descriptors with no entries
/// ([`crate::policy::DecisionPolicy::empty_descriptors_ok`]).
fn validate_in(state: &AppState, req: &CheckRequest) -> Result<(), ApiError> {
    validate_shape(state.limits(), req, state.policy().empty_descriptors_ok())
}

fn validate_shape(
    limits: &RequestLimits,
    req: &CheckRequest,
    empty_descriptors_ok: bool,
) -> Result<(), ApiError> {
    if req.domain.is_empty() {
        return Err(ApiError::invalid(
            "invalid_domain",
            "`domain` must not be empty",
        ));
    }
    check_length(
        &req.domain,
        limits.max_domain_bytes,
        "invalid_domain",
        format_args!("`domain`"),
    )?;
    if req.descriptors.is_empty() {
        return Err(ApiError::invalid(
            "no_descriptors",
            "`descriptors` must contain at least one descriptor",
        ));
    }
    if req.descriptors.len() > limits.max_descriptors {
        return Err(ApiError::too_many_descriptors(limits.max_descriptors));
    }
    if let Some(h) = req.hits {
        check_hits(limits, h, format_args!("hits_addend"))?;
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() && !empty_descriptors_ok {
            return Err(ApiError::invalid(
                "invalid_descriptor",
                format!(
                    "descriptors[{i}] has no entries: expected \
                     {{\"entries\":[{{\"key\":\"user\",\"value\":\"alice\"}}]}} \
                     (key/value pairs go inside `entries`)"
                ),
            ));
        }
        if d.entries.len() > limits.max_entries {
            return Err(ApiError::too_many_entries(i, limits.max_entries));
        }
        for (j, (k, v)) in d.entries.iter().enumerate() {
            if k.is_empty() {
                return Err(ApiError::invalid(
                    "invalid_entry",
                    format!("descriptors[{i}].entries[{j}].key must not be empty"),
                ));
            }
            check_length(
                k,
                limits.max_key_bytes,
                "key_too_long",
                format_args!("descriptors[{i}].entries[{j}].key"),
            )?;
            check_length(
                v,
                limits.max_value_bytes,
                "value_too_long",
                format_args!("descriptors[{i}].entries[{j}].value"),
            )?;
        }
        if let Some(h) = d.hits {
            check_hits(limits, h, format_args!("descriptors[{i}].hits_addend"))?;
        }
        // As in rule files (and Envoy's uint32): larger quotas are refused, not clamped.
        if let Some(l) = d
            .limit
            .filter(|l| l.requests_per_unit > u64::from(u32::MAX))
        {
            return Err(ApiError::invalid(
                "invalid_limit",
                format!(
                    "descriptors[{i}].limit.requests_per_unit is {}, more than the maximum {}",
                    l.requests_per_unit,
                    u32::MAX
                ),
            ));
        }
    }
    Ok(())
}

/// The rules to decide `req` with, once `req` passed [`validate`] and its overrides are within
/// bounds; the refusal (counted in `tollgate_request_errors_total`) otherwise.
fn admitted(state: &AppState, req: &CheckRequest) -> Result<Arc<LoadedRules>, ApiError> {
    let checked = validate_in(state, req).and_then(|()| {
        let rules = state.rules();
        bounded_overrides(&rules, req).map(|()| rules)
    });
    checked.inspect_err(|e| state.metrics().error(e.code()))
}

/// Whether `req` would pass [`admitted`], without counting anything: a request that would not is
/// refused by the decision itself, and must not wait in a queue first.
pub(crate) fn acceptable(state: &AppState, req: &CheckRequest) -> bool {
    validate_in(state, req).is_ok() && bounded_overrides(&state.rules(), req).is_ok()
}

/// Refuse a `limit` override that asks more than the store would hold for it (see
/// [`Overrides::too_large`]): a client must not choose how much memory one key takes.
fn bounded_overrides(rules: &LoadedRules, req: &CheckRequest) -> Result<(), ApiError> {
    match Overrides::too_large(&rules.set, &req.descriptors) {
        None => Ok(()),
        Some((i, n)) => Err(ApiError::invalid(
            "invalid_limit",
            format!(
                "descriptors[{i}].limit.requests_per_unit is {n}, more than the maximum {} \
                 for a sliding_window_log override",
                tollgate_core::limiter::MAX_LOG_OVERRIDE
            ),
        )),
    }
}

/// `s` within `max` characters (see [`too_long`]); else `code`, the message naming `field`.
/// The name is formatted on the error path only.
fn check_length(
    s: &str,
    max: usize,
    code: &'static str,
    field: std::fmt::Arguments<'_>,
) -> Result<(), ApiError> {
    match too_long(s, max) {
        None => Ok(()),
        Some(n) => Err(ApiError::invalid(
            code,
            format!("{field} is {n} characters, more than the maximum {max}"),
        )),
    }
}

/// `s`'s length in characters (Unicode scalar values) when it is more than `max`. Characters,
/// as JSON Schema's `maxLength` counts them, so the OpenAPI document states the limit exactly;
/// the bytes are at most 4x (and the body is capped anyway). Counted only when the byte length
/// is over `max` (no character has fewer than one byte).
fn too_long(s: &str, max: usize) -> Option<usize> {
    if s.len() <= max {
        return None;
    }
    Some(s.chars().count()).filter(|&n| n > max)
}

fn check_hits(
    limits: &RequestLimits,
    hits: u64,
    field: std::fmt::Arguments<'_>,
) -> Result<(), ApiError> {
    if hits > limits.max_hits {
        return Err(ApiError::invalid(
            "invalid_hits",
            format!(
                "`{field}` is {hits}, more than the maximum {}",
                limits.max_hits
            ),
        ));
    }
    Ok(())
}

/// The decision of `$req` by `$state`: admitted, planned, the store asked (when there is anything
/// to ask it) with `$ask`, an expression of the time `$now` and the items to check `$items`,
/// then concluded. A macro rather than a function for the two ways the store is asked: awaited
/// by [`decide`], answered at once by [`decide_now`].
macro_rules! decide_with {
    ($state:ident, $req:ident, |$now:ident, $items:ident| $ask:expr) => {
        decide_with!($state, $req, None, |$now, $items| $ask)
    };
    ($state:ident, $req:ident, $wait:expr, |$now:ident, $items:ident| $ask:expr) => {{
        let decided = decide_with!(@untraced $state, $req, $wait, |$now, $items| $ask);
        if let Some(tracing) = $state.tracing() {
            crate::otel::decided(tracing, $req, &decided);
        }
        decided
    }};
    (@untraced $state:ident, $req:ident, $wait:expr, |$now:ident, $items:ident| $ask:expr) => {{
        let started = Instant::now();
        match admitted($state, $req) {
            Err(e) => Err(e),
            Ok(rules) => {
                let (domain, descriptors) = (&$req.domain, &$req.descriptors);
                let overrides = Overrides::new(&rules.set, domain, descriptors);
                let hits = $req.hits.unwrap_or(1);
                let plan = Plan::with_overrides(&rules.set, &overrides, domain, descriptors, hits);
                let $now = $state.now();
                let $items = plan.items();
                let outcome = if $items.is_empty() {
                    None
                } else {
                    // The store call as a span of its own when traced (one branch when not).
                    let traced = crate::otel::StoreTimer::start($state.tracing());
                    let asked = $ask;
                    if let (Some(timer), Some(tracing)) = (traced, $state.tracing()) {
                        timer.end(tracing, store_name($state), $items.len(), &asked);
                    }
                    Some(asked)
                };
                drop($items);
                conclude($state, $req, &rules, plan, $now, outcome, started, $wait)
            }
        }
    }};
}

/// The store a traced store call went to.
fn store_name(state: &AppState) -> &'static str {
    match state.backend() {
        crate::backend::Backend::Local(_) => "memory",
        _ => "redis",
    }
}

/// Decide a request with the state's current rules, store and clock.
///
/// Errors: [`ApiError::Invalid`] for requests breaking [`RequestLimits`] (see `validate`),
/// [`ApiError::Store`] when the store fails and no failure policy applies (a Redis outage is
/// not an error: the `--on-store-error` policy decides). An unknown domain or a descriptor matching no rule
/// is not an error: it is OK with no limit (counted in `tollgate_unmatched_total`).
pub async fn decide(state: &AppState, req: &CheckRequest) -> Result<CheckResponse, ApiError> {
    if let Some(decided) = decide_now(state, req) {
        return decided;
    }
    decide_with!(state, req, |now, items| {
        state.backend().check(now, &items).await
    })
}

/// [`decide`] without awaiting, when the backend is a store in this process (the memory store
/// answers synchronously); `None` for Redis. The gRPC listener answers a call inside the
/// connection's own poll with it, with no task and no future to move (see `grpc`).
pub fn decide_now(state: &AppState, req: &CheckRequest) -> Option<Result<CheckResponse, ApiError>> {
    let crate::backend::Backend::Local(store) = state.backend() else {
        return None;
    };
    Some(decide_with!(state, req, |now, items| {
        store.check(now, &items).map(Outcome::store)
    }))
}

/// A decision of a request that rules with a `queue` may make wait (see `queue`): the answer,
/// and when it is a denial that may wait, how ([`tollgate_core::queue::wait_for`]).
pub(crate) async fn attempt(
    state: &AppState,
    req: &CheckRequest,
) -> Attempt<Result<CheckResponse, ApiError>> {
    let mut wait = None;
    let decided = match state.backend() {
        crate::backend::Backend::Local(store) => {
            decide_with!(state, req, Some(&mut wait), |now, items| {
                store.check(now, &items).map(Outcome::store)
            })
        }
        backend => decide_with!(state, req, Some(&mut wait), |now, items| {
            backend.check(now, &items).await
        }),
    };
    match (decided, wait) {
        (Ok(answer), Some(wait)) if !answer.allowed => Attempt::Denied {
            answer: Ok(answer),
            wait,
        },
        (decided, _) => {
            let allowed = decided.as_ref().is_ok_and(|r| r.allowed);
            Attempt::Done(decided, allowed)
        }
    }
}

/// The rest of a decision once the store answered (`None`: nothing to ask it): metrics, the
/// statuses, the headers; and, when `wait` is given, whether a denial may wait in a queue.
#[allow(clippy::too_many_arguments)]
fn conclude(
    state: &AppState,
    req: &CheckRequest,
    rules: &LoadedRules,
    plan: Plan<'_>,
    now: tollgate_core::Micros,
    outcome: Option<Result<Outcome, tollgate_core::StoreError>>,
    started: Instant,
    wait: Option<&mut Option<Wait>>,
) -> Result<CheckResponse, ApiError> {
    let metrics = state.metrics();
    let hits = req.hits.unwrap_or(1);
    let (decisions, degraded, from_cache) = match outcome {
        None => (Vec::new(), None, false),
        Some(Ok(o)) => {
            if o.store_failed {
                metrics.store_error();
            }
            (o.decisions, o.degraded, o.from_deny_cache)
        }
        Some(Err(e)) => {
            metrics.store_error();
            metrics.error("store_unavailable");
            return Err(e.into());
        }
    };
    let policy_denied = degraded == Some(Policy::Deny);
    let verdict = plan.finish(decisions);
    crate::decision_log::record(&req.domain, &verdict.statuses, &req.descriptors, hits);
    let policy = state.policy();
    let allowed = verdict.allowed_with_quota_mode(policy.quota_mode());
    // The first rule whose `degrade` threshold the request crossed; whether any rule that
    // denied is a `shadowban` rule, and whether any other one denied.
    let mut degrade: Option<&Limit> = None;
    let (mut banned, mut denied_plainly) = (false, policy_denied);

    let statuses: Vec<DescriptorStatus> = verdict
        .statuses
        .iter()
        .zip(&req.descriptors)
        .map(|(status, desc)| {
            let cost = desc.hits.unwrap_or(hits);
            match status {
                Status::NoLimit => {
                    if rules.set.domain(&req.domain).is_some() {
                        metrics.unmatched(&req.domain, "no_rule");
                    } else {
                        if metrics.unknown_domain(&req.domain) {
                            tracing::warn!(
                                domain = ?req.domain,
                                "unknown domain: answered OK with no limit (domains are \
                                 case-sensitive; logged once, counted in tollgate_unmatched_total)"
                            );
                        }
                    }
                    DescriptorStatus::new(Code::Ok, None, 0)
                }
                Status::Unlimited(_) => DescriptorStatus {
                    unlimited: true,
                    ..DescriptorStatus::new(Code::Ok, None, u32::MAX as u64)
                },
                Status::Limited { limit, decision, .. } => {
                    let blocks = status.blocks();
                    let shadowed = status.shadowed();
                    let never = blocks && decision.never_passes();
                    if let Some(t) = &limit.degrade {
                        if degrade.is_none() && t.signals(decision) {
                            degrade = Some(limit);
                        }
                    }
                    if blocks {
                        if limit.shadowban {
                            banned = true;
                        } else {
                            denied_plainly = true;
                        }
                    }
                    record(state, rules, &req.domain, limit, desc, cost, status, allowed, from_cache, now);
                    let message = if blocks && policy_denied {
                        Some(DENIED_BY_POLICY.to_owned())
                    } else if blocks {
                        match (&limit.message, never) {
                            (m, false) => m.clone(),
                            (m, true) => Some(format!(
                                "{}request cost {cost} exceeds what this limit can ever admit ({} per {}); retrying will not help",
                                m.as_deref().map(|m| format!("{m}: ")).unwrap_or_default(),
                                decision.limit,
                                period_text(limit),
                            )),
                        }
                    } else {
                        None
                    };
                    DescriptorStatus {
                        code: if blocks { Code::OverLimit } else { Code::Ok },
                        limit: limit_info(limit),
                        remaining: decision.reported_remaining(),
                        reset_after: Some(reset(limit, decision, now)),
                        retry_after: if blocks { decision.retry_after } else { None },
                        delay: (decision.allowed && decision.delay > 0).then_some(decision.delay),
                        message,
                        shadowed,
                        never_passes: never,
                        unlimited: false,
                    }
                }
            }
        })
        .collect();

    let headers = policy.headers(&verdict, allowed, now);
    // A policy may answer OK where the store said over (a global shadow mode): the statuses keep
    // their codes, the counters what the store decided.
    let (allowed, statuses, headers) = if !allowed && policy.overrule_denial() {
        // An allowed answer tells no one to wait: no Retry-After, no `retry_after` anywhere.
        let mut statuses = statuses;
        for s in &mut statuses {
            s.retry_after = None;
        }
        let headers = headers.map(|h| HeaderValues {
            retry_after_secs: None,
            ..h
        });
        (true, statuses, headers)
    } else {
        (allowed, statuses, headers)
    };
    if let Some(wait) = wait {
        // A denial by the failure policy waits for nothing: the store is down.
        if !allowed && !policy_denied {
            *wait = tollgate_core::queue::wait_for(&verdict);
        }
    }
    let shadowbanned = !allowed && banned && !denied_plainly;
    if shadowbanned {
        count_shadowbanned(state, rules, req, &verdict, hits);
    }
    let response = CheckResponse {
        allowed,
        statuses,
        headers,
        delay: verdict.delay(),
        degrade: degrade.filter(|_| allowed).map(|l| l.id.clone()),
        shadowbanned,
    };
    metrics.request(allowed);
    metrics.observe_latency(started.elapsed());
    Ok(response)
}

/// Count a shadowbanned answer's hits on each `shadowban` rule that denied it.
fn count_shadowbanned(
    state: &AppState,
    rules: &LoadedRules,
    req: &CheckRequest,
    verdict: &tollgate_core::limiter::Verdict<'_>,
    hits: u64,
) {
    let metrics = state.metrics();
    for (status, desc) in verdict.statuses.iter().zip(&req.descriptors) {
        let Status::Limited { limit, .. } = status else {
            continue;
        };
        if !(status.blocks() && limit.shadowban) {
            continue;
        }
        let cost = desc.hits.unwrap_or(hits);
        let c = if !limit.stats.is_static() {
            let key = limit.stats.for_request(&desc.entries);
            LimitCounters::Shared(metrics.rule(&req.domain, &key, limit.stats.base()))
        } else {
            metrics.limit_counters(&rules.counters, &rules.set, limit)
        };
        c.shadowbanned
            .fetch_add(cost, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A status's `duration_until_reset` (see `Decision::reported_reset`).
fn reset(limit: &Limit, decision: &tollgate_core::Decision, now: tollgate_core::Micros) -> u64 {
    limit.quota.map_or(decision.reset_after, |q| {
        decision.reported_reset(q.period(), now)
    })
}

fn period_text(limit: &Limit) -> String {
    match limit.quota {
        Some(q) if q.period().multiplier > 1 => {
            format!("{} {}s", q.period().multiplier, q.period().unit)
        }
        Some(q) => q.period().unit.to_string(),
        None => "period".into(),
    }
}

/// The limit as reported to clients (`None` for `unlimited`).
pub(crate) fn limit_info(limit: &Limit) -> Option<LimitInfo> {
    limit.quota.map(|q| LimitInfo {
        id: limit.id.clone(),
        name: limit.name.clone(),
        requests_per_unit: q.limit(),
        unit: q.period().unit,
        unit_multiplier: q.period().multiplier,
        algorithm: q.algorithm(),
    })
}

/// How much of its limit a counter has used after a decision, in thousandths (a denial: all of
/// it).
fn used_permille(decision: &tollgate_core::Decision) -> u32 {
    if !decision.allowed {
        return 1000;
    }
    if decision.limit == 0 {
        return 0;
    }
    let used = decision.limit.saturating_sub(decision.remaining);
    (used.saturating_mul(1000) / decision.limit).min(1000) as u32
}

/// Count one limited descriptor.
///
/// An envoy_fixed_window counter (its decision carries the window's count) is counted as
/// envoyproxy/ratelimit counts it, whatever the other descriptors decided: every hit in
/// `total_hits`, and the hits split at the limit by [`crate::metrics::Metrics::envoy_split`]
/// (only the hits past the limit are `over_limit`). The other algorithms are all-or-nothing: a
/// request denied by another descriptor consumed nothing here, so its allowed descriptors count
/// nothing, and a denied request's hits are all `over_limit`.
#[allow(clippy::too_many_arguments)]
fn record(
    state: &AppState,
    rules: &LoadedRules,
    domain: &str,
    limit: &Limit,
    desc: &tollgate_core::limiter::Descriptor,
    cost: u64,
    status: &Status<'_>,
    allowed: bool,
    from_cache: bool,
    now: tollgate_core::Micros,
) {
    let Status::Limited { decision, .. } = status else {
        return;
    };
    let blocks = status.blocks();
    if !allowed && !blocks && decision.count.is_none() {
        return;
    }
    let metrics = state.metrics();
    let stats = state.stats();
    if stats.enabled() {
        let seen = if decision.allowed {
            Seen::Allowed
        } else if status.shadowed() {
            Seen::ShadowDenied
        } else {
            Seen::Denied
        };
        let near = decision.allowed
            && metrics.near_limit_hits(decision.limit, decision.remaining, cost) > 0;
        stats.record(
            &rules.stats,
            &rules.set,
            limit,
            now,
            seen,
            used_permille(decision),
            near,
            |buf| write_key(buf, &desc.entries),
        );
    }
    let c = if !limit.stats.is_static() {
        // `detailed_metric` / `value_to_metric`: the request's values are in the stats key.
        let key = limit.stats.for_request(&desc.entries);
        LimitCounters::Shared(metrics.rule(domain, &key, limit.stats.base()))
    } else {
        // The common case: pre-resolved, no lookup by strings.
        metrics.limit_counters(&rules.counters, &rules.set, limit)
    };
    use std::sync::atomic::Ordering::Relaxed;
    c.total_hits.fetch_add(cost, Relaxed);
    let add = |counter: &std::sync::atomic::AtomicU64, n: u64| {
        if n > 0 {
            counter.fetch_add(n, Relaxed);
        }
    };
    if let Some(after) = decision.count {
        // envoy's `limitAfterIncrease - hitsAddend`, in its unsigned arithmetic: it wraps only
        // for a counter this request did not increment (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT),
        // and then counts as envoy counts it.
        let split = metrics.envoy_split(decision.limit, after.wrapping_sub(cost), after, cost);
        add(&c.over_limit, split.over);
        add(&c.near_limit, split.near);
        add(&c.within_limit, split.within);
        if status.shadowed() {
            add(&c.shadow_mode, split.over);
        }
    } else if !decision.allowed {
        c.over_limit.fetch_add(cost, Relaxed);
        if from_cache {
            c.over_limit_with_local_cache.fetch_add(cost, Relaxed);
        }
        if status.shadowed() {
            c.shadow_mode.fetch_add(cost, Relaxed);
        }
    } else {
        c.within_limit.fetch_add(cost, Relaxed);
        add(
            &c.near_limit,
            metrics.near_limit_hits(decision.limit, decision.remaining, cost),
        );
    }
}
