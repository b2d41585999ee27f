//! The transport-neutral decision, one pipeline of named steps: admit a [`CheckRequest`]
//! (validate it, take the *current* rules), prepare the plan (each descriptor's rule and
//! counter), ask the store (memory, or Redis with its failure policy), conclude a verdict (a
//! value: the statuses, the answer, how a denial may wait), observe it (metrics, live
//! statistics, the decision log, shadowban counts and the trace, all in one place), and answer
//! the [`CheckResponse`]. HTTP and gRPC both await [`decide`]; the gRPC listener calls
//! [`decide_now`] first, the same steps with the memory store asked without awaiting.

use crate::backend::{Outcome, Policy};
use crate::error::ApiError;
use crate::metrics::LimitCounters;
use crate::model::{CheckRequest, CheckResponse, Code, DescriptorStatus, LimitInfo};
use crate::state::{AppState, LoadedRules, RequestLimits};
use crate::stats::{write_key, Seen};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tollgate_core::limiter::{self, Descriptor, Overrides, Plan, Status};
use tollgate_core::queue::{Attempt, Wait};
use tollgate_core::rules::Limit;
use tollgate_core::{Micros, Store, StoreError};

/// The message of a denial made by `--on-store-error deny` while Redis is unavailable.
pub const DENIED_BY_POLICY: &str =
    "rate limit store unavailable: denied by policy (--on-store-error deny); retry later";

/// Reject requests that break the size and shape limits of `state` (counted in
/// `tollgate_request_errors_total` by [`decide`]); its policy may accept descriptors with no
/// entries ([`crate::policy::DecisionPolicy::empty_descriptors_ok`]).
fn validate(state: &AppState, req: &CheckRequest) -> Result<(), ApiError> {
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

/// Whether `req` would be admitted (`Decision::admit`), without counting anything: a request that would not is
/// refused by the decision itself, and must not wait in a queue first.
pub(crate) fn acceptable(state: &AppState, req: &CheckRequest) -> bool {
    validate(state, req).is_ok() && bounded_overrides(&state.rules(), req).is_ok()
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
    Decision::new(state, req, false).run().await.0
}

/// [`decide`] without awaiting, when the backend is a store in this process (the memory store
/// answers synchronously); `None` for Redis. The gRPC listener answers a call inside the
/// connection's own poll with it, with no task and no future to move (see `grpc`).
pub(crate) fn decide_now(
    state: &AppState,
    req: &CheckRequest,
) -> Option<Result<CheckResponse, ApiError>> {
    let crate::backend::Backend::Local(store) = state.backend() else {
        return None;
    };
    Some(Decision::new(state, req, false).run_now(store.as_ref()).0)
}

/// A decision of a request that rules with a `queue` may make wait (see `queue`): the answer,
/// and when it is a denial that may wait, how ([`tollgate_core::queue::wait_for`]).
pub(crate) async fn attempt(
    state: &AppState,
    req: &CheckRequest,
) -> Attempt<Result<CheckResponse, ApiError>> {
    match Decision::new(state, req, true).run().await {
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

/// What a decision answers: the response or the refusal, and for a decision that may wait
/// (`Decision::may_wait`) a denial that may wait in a queue, how.
type Answered = (Result<CheckResponse, ApiError>, Option<Wait>);

/// What the store answered: `None` when there was nothing to ask it.
type Asked = Option<Result<Outcome, StoreError>>;

/// One request's decision, as a pipeline of named steps:
///
/// 1. `admit`: the request within bounds, and the rules to decide it with (or the refusal);
/// 2. `Admitted::prepare`: the plan (each descriptor resolved to its rule and counter) and
///    the time;
/// 3. `Prepared::ask_now` (a store in this process, synchronous) or `Prepared::ask` (any
///    backend, awaited): the store's outcome for the plan's counters;
/// 4. `conclude`: the [`Verdict`] value (the statuses, the answer, how a denial may wait), with
///    no effect on anything;
/// 5. `answer`: the verdict observed (`observe`, the one place metrics, live statistics, the
///    decision log, shadowban counts and the trace see a decision), then the answer.
///
/// `run` and `run_now` are these steps, awaited or not; every transport reaches one of them
/// through [`decide`], [`decide_now`] or `attempt`.
struct Decision<'a> {
    state: &'a AppState,
    req: &'a CheckRequest,
    started: Instant,
    /// Whether a denial may wait in a queue: the verdict then says how (`Verdict::wait`).
    may_wait: bool,
}

/// A request within bounds, with the rules it is decided by (held for the whole decision:
/// a reload in between does not change them) and the limits of its `limit` overrides.
struct Admitted {
    rules: Arc<LoadedRules>,
    overrides: Overrides,
}

/// What to ask the store: the plan and the time of the decision.
struct Prepared<'r> {
    rules: &'r LoadedRules,
    plan: Plan<'r>,
    now: Micros,
}

/// A decided request, before anyone sees it: what the store and the policy decided, and the
/// answer made of it.
struct Verdict<'r> {
    rules: &'r LoadedRules,
    /// The descriptors' statuses as the store decided them.
    decided: limiter::Verdict<'r>,
    now: Micros,
    /// Whether the limits admit the request, before a policy may overrule a denial: what the
    /// counters record.
    admitted: bool,
    /// The store was asked and failed (a failure policy decided).
    store_failed: bool,
    /// Answered by the deny cache, without asking Redis.
    from_cache: bool,
    answer: CheckResponse,
    /// A denial that may wait in a queue: how (only for `Decision::may_wait`).
    wait: Option<Wait>,
}

impl<'a> Decision<'a> {
    fn new(state: &'a AppState, req: &'a CheckRequest, may_wait: bool) -> Self {
        Self {
            state,
            req,
            started: Instant::now(),
            may_wait,
        }
    }

    /// The steps, the store asked without awaiting.
    #[inline]
    fn run_now(self, store: &dyn Store) -> Answered {
        let admitted = match self.admit() {
            Ok(admitted) => admitted,
            Err(e) => return self.answer(Err(e)),
        };
        let prepared = admitted.prepare(&self);
        let asked = prepared.ask_now(self.state, store);
        self.answer(self.conclude(prepared, asked))
    }

    /// The steps, the backend's answer awaited.
    async fn run(self) -> Answered {
        let admitted = match self.admit() {
            Ok(admitted) => admitted,
            Err(e) => return self.answer(Err(e)),
        };
        let prepared = admitted.prepare(&self);
        let asked = prepared.ask(self.state).await;
        self.answer(self.conclude(prepared, asked))
    }

    /// Step 1: the request validated and its overrides bounded, with the current rules.
    #[inline]
    fn admit(&self) -> Result<Admitted, ApiError> {
        validate(self.state, self.req)?;
        let rules = self.state.rules();
        bounded_overrides(&rules, self.req)?;
        let overrides = Overrides::new(&rules.set, &self.req.domain, &self.req.descriptors);
        Ok(Admitted { rules, overrides })
    }

    /// Step 4: the verdict of the store's outcome (a store error is the decision's error).
    #[inline]
    fn conclude<'r>(&self, prepared: Prepared<'r>, asked: Asked) -> Result<Verdict<'r>, ApiError> {
        let outcome = match asked {
            None => Outcome::store(Vec::new()),
            Some(asked) => asked?,
        };
        let Prepared { rules, plan, now } = prepared;
        let policy = self.state.policy();
        let policy_denied = outcome.degraded == Some(Policy::Deny);
        let decided = plan.finish(outcome.decisions);
        let admitted = decided.allowed_with_quota_mode(policy.quota_mode());
        let mut statuses = self.statuses(&decided, policy_denied, now);
        let mut headers = policy.headers(&decided, admitted, now);
        // A policy may answer OK where the store said over (a global shadow mode): the statuses
        // keep their codes, the counters what the store decided.
        let allowed = admitted || policy.overrule_denial();
        if allowed && !admitted {
            // An allowed answer tells no one to wait: no Retry-After, no `retry_after` anywhere.
            statuses.iter_mut().for_each(|s| s.retry_after = None);
            if let Some(h) = &mut headers {
                h.retry_after_secs = None;
            }
        }
        // A denial by the failure policy waits for nothing: the store is down.
        let wait = if self.may_wait && !allowed && !policy_denied {
            tollgate_core::queue::wait_for(&decided)
        } else {
            None
        };
        let answer = CheckResponse {
            allowed,
            statuses,
            headers,
            delay: decided.delay(),
            degrade: degrade_rule(&decided)
                .filter(|_| allowed)
                .map(|l| l.id.clone()),
            shadowbanned: !allowed && shadowbanned(&decided, policy_denied),
        };
        Ok(Verdict {
            rules,
            decided,
            now,
            admitted,
            store_failed: outcome.store_failed,
            from_cache: outcome.from_deny_cache,
            answer,
            wait,
        })
    }

    /// The descriptors' statuses as the answer reports them.
    fn statuses(
        &self,
        decided: &limiter::Verdict<'_>,
        policy_denied: bool,
        now: Micros,
    ) -> Vec<DescriptorStatus> {
        let hits = self.req.hits.unwrap_or(1);
        decided
            .statuses
            .iter()
            .zip(&self.req.descriptors)
            .map(|(status, desc)| {
                descriptor_status(status, desc.hits.unwrap_or(hits), policy_denied, now)
            })
            .collect()
    }

    /// Step 5: the decision observed, then answered.
    #[inline]
    fn answer(&self, decided: Result<Verdict<'_>, ApiError>) -> Answered {
        self.observe(&decided);
        match decided {
            Ok(verdict) => (Ok(verdict.answer), verdict.wait),
            Err(e) => (Err(e), None),
        }
    }

    /// Everything that watches decisions, from the one verdict: the error and request counters,
    /// the decision log, each descriptor's counters and live statistics, shadowban counts, the
    /// latency, and the trace.
    fn observe(&self, decided: &Result<Verdict<'_>, ApiError>) {
        let metrics = self.state.metrics();
        match decided {
            Err(e) => {
                if matches!(e, ApiError::Store(_)) {
                    metrics.store_error();
                }
                metrics.error(e.code());
            }
            Ok(verdict) => {
                if verdict.store_failed {
                    metrics.store_error();
                }
                let hits = self.req.hits.unwrap_or(1);
                let statuses = &verdict.decided.statuses;
                crate::decision_log::record(
                    &self.req.domain,
                    statuses,
                    &self.req.descriptors,
                    hits,
                );
                for (status, desc) in statuses.iter().zip(&self.req.descriptors) {
                    self.observe_status(verdict, status, desc);
                }
                if verdict.answer.shadowbanned {
                    self.count_shadowbanned(verdict);
                }
                metrics.request(verdict.answer.allowed);
                metrics.observe_latency(self.started.elapsed());
            }
        }
        if let Some(tracing) = self.state.tracing() {
            crate::otel::decided(tracing, self.req, decided.as_ref().map(|v| &v.answer));
        }
    }

    /// One descriptor's share of [`Self::observe`]: the unmatched count, or its limit's.
    #[inline]
    fn observe_status(&self, verdict: &Verdict<'_>, status: &Status<'_>, desc: &Descriptor) {
        match status {
            Status::NoLimit => self.unmatched(verdict.rules),
            Status::Unlimited(_) => {}
            Status::Limited { .. } => self.record(verdict, status, desc),
        }
    }

    /// Count a descriptor that matched no rule (an unknown domain logged once).
    fn unmatched(&self, rules: &LoadedRules) {
        let (metrics, domain) = (self.state.metrics(), &self.req.domain);
        if rules.set.domain(domain).is_some() {
            metrics.unmatched(domain, "no_rule");
        } else if metrics.unknown_domain(domain) {
            tracing::warn!(
                domain = ?domain,
                "unknown domain: answered OK with no limit (domains are \
                 case-sensitive; logged once, counted in tollgate_unmatched_total)"
            );
        }
    }

    /// Count one limited descriptor: live statistics, then its counters.
    ///
    /// An envoy_fixed_window counter (its decision carries the window's count) is counted as
    /// envoyproxy/ratelimit counts it, whatever the other descriptors decided: every hit in
    /// `total_hits`, and the hits split at the limit by [`crate::metrics::Metrics::envoy_split`]
    /// (only the hits past the limit are `over_limit`). The other algorithms are
    /// all-or-nothing: a request denied by another descriptor consumed nothing here, so its
    /// allowed descriptors count nothing, and a denied request's hits are all `over_limit`.
    fn record(&self, verdict: &Verdict<'_>, status: &Status<'_>, desc: &Descriptor) {
        let Status::Limited {
            limit, decision, ..
        } = status
        else {
            return;
        };
        if !verdict.admitted && !status.blocks() && decision.count.is_none() {
            return;
        }
        let cost = desc.hits.unwrap_or(self.req.hits.unwrap_or(1));
        self.record_live(verdict, status, desc, cost);
        let c = self.counters(verdict.rules, limit, desc);
        record_counters(&c, self.state.metrics(), status, cost, verdict.from_cache);
    }

    /// A limited descriptor in the live statistics (when they are on).
    #[inline]
    fn record_live(
        &self,
        verdict: &Verdict<'_>,
        status: &Status<'_>,
        desc: &Descriptor,
        cost: u64,
    ) {
        let stats = self.state.stats();
        let Status::Limited {
            limit, decision, ..
        } = status
        else {
            return;
        };
        if !stats.enabled() {
            return;
        }
        let seen = if decision.allowed {
            Seen::Allowed
        } else if status.shadowed() {
            Seen::ShadowDenied
        } else {
            Seen::Denied
        };
        let near = decision.allowed
            && self
                .state
                .metrics()
                .near_limit_hits(decision.limit, decision.remaining, cost)
                > 0;
        stats.record(
            &verdict.rules.stats,
            &verdict.rules.set,
            limit,
            verdict.now,
            seen,
            used_permille(decision),
            near,
            |buf| write_key(buf, &desc.entries),
        );
    }

    /// The counters of `limit` for `desc`.
    #[inline]
    fn counters<'r>(
        &self,
        rules: &'r LoadedRules,
        limit: &Limit,
        desc: &Descriptor,
    ) -> LimitCounters<'r> {
        let metrics = self.state.metrics();
        if !limit.stats.is_static() {
            // `detailed_metric` / `value_to_metric`: the request's values are in the stats key.
            let key = limit.stats.for_request(&desc.entries);
            LimitCounters::Shared(metrics.rule(&self.req.domain, &key, limit.stats.base()))
        } else {
            // The common case: pre-resolved, no lookup by strings.
            metrics.limit_counters(&rules.counters, &rules.set, limit)
        }
    }

    /// Count a shadowbanned answer's hits on each `shadowban` rule that denied it.
    fn count_shadowbanned(&self, verdict: &Verdict<'_>) {
        let hits = self.req.hits.unwrap_or(1);
        for (status, desc) in verdict.decided.statuses.iter().zip(&self.req.descriptors) {
            let Status::Limited { limit, .. } = status else {
                continue;
            };
            if status.blocks() && limit.shadowban {
                self.counters(verdict.rules, limit, desc)
                    .shadowbanned
                    .fetch_add(desc.hits.unwrap_or(hits), Relaxed);
            }
        }
    }
}

impl Admitted {
    /// Step 2: the plan for the request, and the time it is decided at.
    #[inline]
    fn prepare(&self, decision: &Decision<'_>) -> Prepared<'_> {
        let req = decision.req;
        let plan = Plan::with_overrides(
            &self.rules.set,
            &self.overrides,
            &req.domain,
            &req.descriptors,
            req.hits.unwrap_or(1),
        );
        Prepared {
            rules: &self.rules,
            plan,
            now: decision.state.now(),
        }
    }
}

impl Prepared<'_> {
    /// Step 3, synchronous: `store` (in this process) asked for the plan's counters.
    #[inline]
    fn ask_now(&self, state: &AppState, store: &dyn Store) -> Asked {
        let items = self.plan.items();
        if items.is_empty() {
            return None;
        }
        let timer = crate::otel::StoreTimer::start(state.tracing());
        let asked = store.check(self.now, &items).map(Outcome::store);
        traced_store_call(state, timer, items.len(), &asked);
        Some(asked)
    }

    /// Step 3, awaited: the state's backend asked for the plan's counters.
    async fn ask(&self, state: &AppState) -> Asked {
        let items = self.plan.items();
        if items.is_empty() {
            return None;
        }
        let timer = crate::otel::StoreTimer::start(state.tracing());
        let asked = state.backend().check(self.now, &items).await;
        traced_store_call(state, timer, items.len(), &asked);
        Some(asked)
    }
}

/// The store call as a span of its own when traced (one branch when not).
#[inline]
fn traced_store_call(
    state: &AppState,
    timer: Option<crate::otel::StoreTimer>,
    items: usize,
    asked: &Result<Outcome, StoreError>,
) {
    if let (Some(timer), Some(tracing)) = (timer, state.tracing()) {
        let store = match state.backend() {
            crate::backend::Backend::Local(_) => "memory",
            _ => "redis",
        };
        timer.end(tracing, store, items, asked);
    }
}

/// The first rule (in request order) whose `degrade` threshold the request crossed.
fn degrade_rule<'r>(decided: &limiter::Verdict<'r>) -> Option<&'r Limit> {
    decided.statuses.iter().find_map(|status| match status {
        Status::Limited {
            limit, decision, ..
        } => limit
            .degrade
            .as_ref()
            .is_some_and(|t| t.signals(decision))
            .then_some(*limit),
        _ => None,
    })
}

/// Whether only `shadowban` rules denied the request: some did, and no other rule (nor the
/// failure policy) did.
fn shadowbanned(decided: &limiter::Verdict<'_>, policy_denied: bool) -> bool {
    let blocking = || {
        decided.statuses.iter().filter_map(|s| match s {
            Status::Limited { limit, .. } if s.blocks() => Some(limit.shadowban),
            _ => None,
        })
    };
    !policy_denied && blocking().any(|banned| banned) && blocking().all(|banned| banned)
}

/// One descriptor's status as the answer reports it; `cost` is its hits.
fn descriptor_status(
    status: &Status<'_>,
    cost: u64,
    policy_denied: bool,
    now: Micros,
) -> DescriptorStatus {
    match status {
        Status::NoLimit => DescriptorStatus::new(Code::Ok, None, 0),
        Status::Unlimited(_) => DescriptorStatus {
            unlimited: true,
            ..DescriptorStatus::new(Code::Ok, None, u32::MAX as u64)
        },
        Status::Limited {
            limit, decision, ..
        } => {
            let blocks = status.blocks();
            let never = blocks && decision.never_passes();
            DescriptorStatus {
                code: if blocks { Code::OverLimit } else { Code::Ok },
                limit: limit_info(limit),
                remaining: decision.reported_remaining(),
                reset_after: Some(reset(limit, decision, now)),
                retry_after: if blocks { decision.retry_after } else { None },
                delay: (decision.allowed && decision.delay > 0).then_some(decision.delay),
                message: blocks
                    .then(|| denial_message(limit, decision, cost, never, policy_denied))
                    .flatten(),
                shadowed: status.shadowed(),
                never_passes: never,
                unlimited: false,
            }
        }
    }
}

/// The message of a descriptor that blocks the request.
fn denial_message(
    limit: &Limit,
    decision: &tollgate_core::Decision,
    cost: u64,
    never: bool,
    policy_denied: bool,
) -> Option<String> {
    if policy_denied {
        return Some(DENIED_BY_POLICY.to_owned());
    }
    if !never {
        return limit.message.clone();
    }
    Some(format!(
        "{}request cost {cost} exceeds what this limit can ever admit ({} per {}); retrying will not help",
        limit.message.as_deref().map(|m| format!("{m}: ")).unwrap_or_default(),
        decision.limit,
        period_text(limit),
    ))
}

/// Add a limited descriptor's hits to its counters `c` (see `Decision::record`).
fn record_counters(
    c: &LimitCounters,
    metrics: &crate::metrics::Metrics,
    status: &Status<'_>,
    cost: u64,
    from_cache: bool,
) {
    let Status::Limited { decision, .. } = status else {
        return;
    };
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

/// A status's `duration_until_reset` (see `Decision::reported_reset`).
fn reset(limit: &Limit, decision: &tollgate_core::Decision, now: Micros) -> u64 {
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
