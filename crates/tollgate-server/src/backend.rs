//! Where decisions are made: a [`Backend`] is either a store in this process (the memory store,
//! called synchronously: no extra `await`, no extra allocation) or Redis guarded by a failure
//! policy and a circuit breaker ([`Guarded`], from `tollgate_redis::guard`, where the breaker,
//! the policies and the deny cache are described; the in-process middleware uses the same one).
//! Here: the choice between the two, and how the guard is reported (`/readyz`, `/metrics`).

use std::fmt::Write as _;
use std::sync::Arc;
use tollgate_core::rules::RuleSet;
use tollgate_core::{CheckItem, FaultKind, Micros, Store, StoreError};
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
}

impl Backend {
    /// Check and consume `items` at `now` (the service clock; Redis uses its own `TIME`).
    pub async fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Outcome, StoreError> {
        match self {
            Backend::Local(store) => store.check(now, items).map(Outcome::store),
            Backend::Redis(g) => g.check(now, items).await,
        }
    }

    /// Rules this backend cannot serve, as `file:line: message` (empty when all are fine).
    pub fn unsupported(&self, set: &RuleSet) -> Vec<String> {
        match self {
            Backend::Local(_) => Vec::new(),
            Backend::Redis(_) => redis_unsupported(set),
        }
    }

    /// The Redis backend, if that is what this is.
    pub fn redis(&self) -> Option<&Arc<Guarded>> {
        match self {
            Backend::Redis(g) => Some(g),
            Backend::Local(_) => None,
        }
    }
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

/// The Redis backend's Prometheus metrics (breaker, degraded decisions, errors, deny cache).
pub fn render_metrics(g: &Guarded, out: &mut String) {
    let state = g.state();
    family(
        out,
        ("tollgate_store_state", "gauge"),
        "Redis store breaker state (1 = current).",
        "state",
        BreakerState::ALL.map(|s| (s.as_str(), u64::from(s == state))),
    );
    family(
        out,
        ("tollgate_store_breaker_transitions_total", "counter"),
        "Breaker transitions, by new state.",
        "to",
        BreakerState::ALL.map(|s| (s.as_str(), g.transitions(s))),
    );
    family(
        out,
        ("tollgate_degraded_decisions_total", "counter"),
        "Requests decided by the failure policy instead of Redis.",
        "policy",
        Policy::ALL.map(|p| (p.as_str(), g.degraded_decisions(p))),
    );
    family(
        out,
        ("tollgate_redis_errors_total", "counter"),
        "Redis store errors, by kind (timeout and connection kinds may open the breaker; the others fail one request).",
        "kind",
        FaultKind::ALL.map(|k| (k.as_str(), g.errors(k))),
    );
    let _ = writeln!(
        out,
        "# HELP tollgate_redis_slow_calls_total Redis calls slower than the per-call timeout (waited for while Redis answers others).\n# TYPE tollgate_redis_slow_calls_total counter\ntollgate_redis_slow_calls_total {}",
        g.slow_calls()
    );
    if let Some((hits, len)) = g.deny_cache_stats() {
        let _ = writeln!(
            out,
            "# HELP tollgate_deny_cache_hits_total Requests denied from the local deny cache.\n# TYPE tollgate_deny_cache_hits_total counter\ntollgate_deny_cache_hits_total {}\n# HELP tollgate_deny_cache_entries Keys in the local deny cache.\n# TYPE tollgate_deny_cache_entries gauge\ntollgate_deny_cache_entries {}",
            hits,
            len
        );
    }
}

/// One labelled metric family: its `# HELP` and `# TYPE` lines, then `name{label="v"} n` per row.
fn family<const N: usize>(
    out: &mut String,
    (name, kind): (&str, &str),
    help: &str,
    label: &str,
    rows: [(&str, u64); N],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (value, n) in rows {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
    }
}
