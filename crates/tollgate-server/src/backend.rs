//! Where decisions are made: a [`Backend`] is either a store in this process (the memory store,
//! called synchronously: no extra `await`, no extra allocation) or Redis guarded by a failure
//! policy and a circuit breaker ([`Guarded`], from `tollgate_redis::guard`, where the breaker,
//! the policies and the deny cache are described; the in-process middleware uses the same one).
//! Here: the choice between the two, and how the guard is reported (`/readyz`; its `/metrics`
//! families are written by `store_metrics`).
//!
//! With a second Redis for per-second limits ([`Backend::RedisSplit`], envoyproxy/ratelimit's
//! `REDIS_PERSECOND`), each Redis has its own breaker and applies the failure policy to its own
//! counters only, so an outage of one leaves the other's limits exact. A request's counters are
//! split between the two and checked concurrently; when one Redis blocks the request, what the
//! other admitted is given back ([`Guarded::refund`]), so the request stays all-or-nothing
//! as on one store (except for counters a failure policy decided: the local fallback's counts
//! are not given back).

use std::sync::Arc;
use tollgate_core::rules::RuleSet;
use tollgate_core::store::{blocks, consumes};
use tollgate_core::{CheckItem, Decision, FaultKind, Micros, Store, StoreError, Unit};
pub use tollgate_redis::guard::{
    unsupported as redis_unsupported, BreakerState, Guarded, Outcome, Policy, RedisSettings,
    FAILURES_TO_OPEN, PROBE_INTERVAL, TIMEOUTS_OPEN_AFTER,
};

/// Where counters live.
#[derive(Clone)]
pub enum Backend {
    /// A store in this process (the memory store, or one supplied by an embedder or a test).
    Local(Arc<dyn Store>),
    /// Redis behind the failure policy and breaker.
    Redis(Arc<Guarded>),
    /// Two Redis, each behind its own breaker: the counters of limits whose unit is second on
    /// the second (`--redis-per-second-url`), the others on the first.
    RedisSplit(Arc<Guarded>, Arc<Guarded>),
}

/// A Redis check, boxed (see [`Backend::check`]).
type BoxedCheck<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome, StoreError>> + Send + 'a>>;

impl Backend {
    /// Check and consume `items` at `now` (the service clock; Redis uses its own `TIME`).
    pub async fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Outcome, StoreError> {
        match self {
            Backend::Local(store) => store.check(now, items).map(Outcome::store),
            // Boxed: the Redis futures are kilobytes, and every caller's future (each request's,
            // moved around by hyper) would be that size even when the store is memory.
            Backend::Redis(g) => {
                let check: BoxedCheck<'_> = Box::pin(g.check(now, items));
                check.await
            }
            Backend::RedisSplit(main, per_second) => {
                let check: BoxedCheck<'_> = Box::pin(check_split(main, per_second, now, items));
                check.await
            }
        }
    }

    /// Rules this backend cannot serve, as `file:line: message` (empty when all are fine).
    pub fn unsupported(&self, set: &RuleSet) -> Vec<String> {
        match self {
            Backend::Local(_) => Vec::new(),
            Backend::Redis(_) | Backend::RedisSplit(..) => redis_unsupported(set),
        }
    }

    /// The (main) Redis backend, if that is what this is.
    pub fn redis(&self) -> Option<&Arc<Guarded>> {
        match self {
            Backend::Redis(g) | Backend::RedisSplit(g, _) => Some(g),
            Backend::Local(_) => None,
        }
    }

    /// The Redis of per-second limits, when there is a second one.
    pub fn per_second(&self) -> Option<&Arc<Guarded>> {
        match self {
            Backend::RedisSplit(_, g) => Some(g),
            _ => None,
        }
    }
}

/// Whether `item`'s counter lives on the per-second Redis: its limit's unit is second
/// (whatever its multiplier), as envoyproxy/ratelimit routes to `REDIS_PERSECOND_URL`.
pub(crate) fn is_per_second(item: &CheckItem<'_>) -> bool {
    item.quota.period().unit == Unit::Second
}

/// One request over two Redis: both parts concurrently, then the admitted items of a part that
/// consumed give back what the whole request must not keep (see the module docs).
async fn check_split(
    main: &Guarded,
    per_second: &Guarded,
    now: Micros,
    items: &[CheckItem<'_>],
) -> Result<Outcome, StoreError> {
    let (ps_idx, main_idx): (Vec<usize>, Vec<usize>) =
        (0..items.len()).partition(|&i| is_per_second(&items[i]));
    if ps_idx.is_empty() {
        return main.check(now, items).await;
    }
    if main_idx.is_empty() {
        return per_second.check(now, items).await;
    }
    let part = |idx: &[usize]| idx.iter().map(|&i| items[i]).collect::<Vec<_>>();
    let (a, b) = (part(&main_idx), part(&ps_idx));
    let (ra, rb) = tokio::join!(main.check(now, &a), per_second.check(now, &b));
    let (oa, ob) = (ra?, rb?);
    let mut decisions = vec![Decision::default(); items.len()];
    for (idx, o) in [(&main_idx, &oa), (&ps_idx, &ob)] {
        for (&i, d) in idx.iter().zip(&o.decisions) {
            decisions[i] = *d;
        }
    }
    let any_denied = decisions.iter().any(|d| !d.allowed);
    let blocked = blocks(items, &decisions);
    for (g, idx, sub, o) in [(main, &main_idx, &a, &oa), (per_second, &ps_idx, &b, &ob)] {
        // Decided by the policy or the deny cache: nothing in Redis to give back.
        let Some(receipt) = &o.receipt else { continue };
        let (part_denied, part_blocked) = (
            o.decisions.iter().any(|d| !d.allowed),
            blocks(sub, &o.decisions),
        );
        let undo: Vec<usize> = (0..sub.len())
            .filter(|&j| {
                let (it, d) = (&sub[j], &o.decisions[j]);
                d.allowed
                    && it.cost > 0
                    && consumes(it, d, part_denied, part_blocked)
                    && !consumes(it, d, any_denied, blocked)
            })
            .collect();
        if undo.is_empty() {
            continue;
        }
        if let Some(ds) = g.refund(now, receipt, sub, &undo).await {
            for (&j, d) in undo.iter().zip(ds) {
                decisions[idx[j]] = d;
            }
        }
    }
    Ok(Outcome {
        decisions,
        degraded: oa.degraded.or(ob.degraded),
        store_failed: oa.store_failed || ob.store_failed,
        from_deny_cache: oa.from_deny_cache || ob.from_deny_cache,
        receipt: None,
    })
}

/// The store's condition for `/readyz` and `/v1/rules`: `store_condition` (`ok`, or the kind
/// of the failure going on) and `store_error` (the last failure: kind, message, time; null
/// when none happened).
pub fn report(g: &Guarded) -> serde_json::Value {
    let last = g.store().last_error().map(
        |e| serde_json::json!({"kind": e.kind.as_str(), "message": e.message, "at_ms": e.at_ms}),
    );
    serde_json::json!({
        "store_condition": g.condition().map_or("ok", FaultKind::as_str),
        "store_error": last,
    })
}
