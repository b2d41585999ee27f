//! Where decisions are made: a [`Backend`] is either a store in this process (the memory store,
//! called synchronously: no extra `await`, no extra allocation) or Redis guarded by a failure
//! policy and a circuit breaker ([`Guarded`], from `tollgate_redis::guard`, where the breaker,
//! the policies and the deny cache are described; the in-process middleware uses the same one).
//! Here: the choice between the two, and how the guard is reported (`/readyz`, `/metrics`).
//!
//! With a second Redis for per-second limits ([`Backend::RedisSplit`], envoyproxy/ratelimit's
//! `REDIS_PERSECOND`), each Redis has its own breaker and applies the failure policy to its own
//! counters only, so an outage of one leaves the other's limits exact. A request's counters are
//! split between the two and checked concurrently; when one Redis blocks the request, what the
//! other admitted is given back ([`Guarded::refund`]), so the request stays all-or-nothing
//! as on one store (except for counters a failure policy decided: the local fallback's counts
//! are not given back).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
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

/// The metrics of a backend's Redis stores (Prometheus text format), one family at a time: the
/// main store's series without a `store` label, a second store's with a
/// `store="per_second"` label first. `rules` names each limit's series by its stats key (the
/// hit counters' `rule` label) beside its id.
pub(crate) fn render_backend_metrics(out: &mut String, backend: &Backend, rules: &RuleSet) {
    match backend {
        Backend::Local(_) => {}
        Backend::Redis(g) => render_stores(out, &[(None, g.as_ref())], rules),
        Backend::RedisSplit(main, per_second) => render_stores(
            out,
            &[
                (None, main.as_ref()),
                (Some("per_second"), per_second.as_ref()),
            ],
            rules,
        ),
    }
}

/// A plain counter of every store: its name, help text and reading.
type Counter<'a> = (&'a str, &'a str, &'a dyn Fn(&Guarded) -> u64);

fn render_stores(out: &mut String, stores: &[(Option<&str>, &Guarded)], rules: &RuleSet) {
    let rows = |label: &str, f: &dyn Fn(&Guarded) -> Vec<(&'static str, u64)>| {
        let mut rows = Vec::new();
        for (store, g) in stores {
            let tag = store.map_or(String::new(), |s| format!("store=\"{s}\","));
            for (value, n) in f(g) {
                rows.push((format!("{tag}{label}=\"{value}\""), n));
            }
        }
        rows
    };
    family(
        out,
        ("tollgate_store_state", "gauge"),
        "Redis store breaker state (1 = current).",
        rows("state", &|g| {
            let state = g.state();
            BreakerState::ALL
                .map(|s| (s.as_str(), u64::from(s == state)))
                .to_vec()
        }),
    );
    family(
        out,
        ("tollgate_store_breaker_transitions_total", "counter"),
        "Breaker transitions, by new state.",
        rows("to", &|g| {
            BreakerState::ALL
                .map(|s| (s.as_str(), g.transitions(s)))
                .to_vec()
        }),
    );
    family(
        out,
        ("tollgate_degraded_decisions_total", "counter"),
        "Requests decided by the failure policy instead of Redis.",
        rows("policy", &|g| {
            Policy::ALL
                .map(|p| (p.as_str(), g.degraded_decisions(p)))
                .to_vec()
        }),
    );
    family(
        out,
        ("tollgate_redis_errors_total", "counter"),
        "Redis store errors, by kind (timeout and connection kinds may open the breaker; the others fail one request).",
        rows("kind", &|g| {
            FaultKind::ALL.map(|k| (k.as_str(), g.errors(k))).to_vec()
        }),
    );
    render_nodes(out, stores);
    let plain = |g: &Guarded, store: &Option<&str>, f: &dyn Fn(&Guarded) -> u64| {
        let labels = store.map_or(String::new(), |s| format!("{{store=\"{s}\"}}"));
        (labels, f(g))
    };
    let lease = |g: &Guarded, f: fn(&tollgate_redis::lease::LeaseStats) -> &AtomicU64| {
        f(g.lease_stats().0).load(Relaxed)
    };
    let counters: [Counter<'_>; 12] = [
        (
            "tollgate_lease_grants_total",
            "Leases (shares of a window's count) Redis granted to this instance (sync: lease).",
            &|g| lease(g, |s| &s.grants),
        ),
        (
            "tollgate_lease_units_granted_total",
            "Units Redis granted to this instance's leases.",
            &|g| lease(g, |s| &s.units_granted),
        ),
        (
            "tollgate_lease_units_returned_total",
            "Leased units given back to Redis unspent (idle, shutdown).",
            &|g| lease(g, |s| &s.units_returned),
        ),
        (
            "tollgate_lease_units_expired_total",
            "Leased units lost unspent when their window ended.",
            &|g| lease(g, |s| &s.units_expired),
        ),
        (
            "tollgate_lease_local_decisions_total",
            "Requests decided from leases without a Redis call.",
            &|g| lease(g, |s| &s.local_decisions),
        ),
        (
            "tollgate_lease_refill_waits_total",
            "Requests that waited for another request's lease refill (one call per leased counter in flight) instead of calling Redis.",
            &|g| g.refill_waits(),
        ),
        (
            "tollgate_redis_batched_calls_total",
            "Calls of the batched one-item check (one-item checks that arrived while others were in flight go together).",
            &|g| g.store().coalescing().calls,
        ),
        (
            "tollgate_redis_batched_requests_total",
            "One-item checks decided by batched calls; over tollgate_redis_batched_calls_total: checks per call.",
            &|g| g.store().coalescing().requests,
        ),
        (
            "tollgate_redis_slow_calls_total",
            "Redis calls slower than the per-call timeout (waited for while Redis answers others).",
            &|g| g.slow_calls(),
        ),
        (
            "tollgate_store_folded_keys_total",
            "Keys whose local admissions during an outage were folded into Redis when it answered again.",
            &|g| g.folded().0,
        ),
        (
            "tollgate_store_folded_cost_total",
            "Hits admitted locally during an outage and folded into Redis when it answered again.",
            &|g| g.folded().1,
        ),
        (
            "tollgate_store_restored_units_total",
            "Units a fold restored to counters a restarted Redis had lost.",
            &|g| g.restored(),
        ),
    ];
    for (name, help, f) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (store, g) in stores {
            let (labels, n) = plain(g, store, f);
            let _ = writeln!(out, "{name}{labels} {n}");
        }
    }
    let name = "tollgate_lease_units_held";
    let _ = writeln!(
        out,
        "# HELP {name} Leased units this instance holds unspent.\n# TYPE {name} gauge"
    );
    for (store, g) in stores {
        let (labels, n) = plain(g, store, &|g| g.lease_stats().1);
        let _ = writeln!(out, "{name}{labels} {n}");
    }
    render_batches(out, stores);
    render_limits(out, stores, rules);
    let cached: Vec<_> = stores
        .iter()
        .filter_map(|(s, g)| g.deny_cache_stats().map(|c| (s, c)))
        .collect();
    if !cached.is_empty() {
        let tag = |s: &Option<&str>| s.map_or(String::new(), |s| format!("{{store=\"{s}\"}}"));
        let _ = writeln!(
            out,
            "# HELP tollgate_deny_cache_hits_total Requests denied from the local deny cache.\n# TYPE tollgate_deny_cache_hits_total counter"
        );
        for (s, c) in &cached {
            let _ = writeln!(out, "tollgate_deny_cache_hits_total{} {}", tag(s), c.0);
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_deny_cache_entries Keys in the local deny cache.\n# TYPE tollgate_deny_cache_entries gauge"
        );
        for (s, c) in &cached {
            let _ = writeln!(out, "tollgate_deny_cache_entries{} {}", tag(s), c.1);
        }
    }
}

/// A per-master counter: its name, help text and reading.
type NodeCounter<'a> = (
    &'a str,
    &'a str,
    fn(&tollgate_redis::guard::NodeStats) -> u64,
);

/// A Redis Cluster's per-master series (`node="host:port"`, at most
/// [`tollgate_redis::guard::NODES_MAX`] masters per store): which master's breaker is open,
/// and what the failure policy decided and folded back for its keys. Nothing for a single
/// server or Sentinel (the store-wide series say it all).
fn render_nodes(out: &mut String, stores: &[(Option<&str>, &Guarded)]) {
    let nodes: Vec<(String, tollgate_redis::guard::NodeStats)> = stores
        .iter()
        .flat_map(|(store, g)| {
            let tag = store.map_or(String::new(), |s| format!("store=\"{s}\","));
            g.node_stats().into_iter().map(move |n| {
                // An address from CLUSTER SLOTS: escaped all the same.
                let node = n.node.replace('\\', "\\\\").replace('"', "\\\"");
                (format!("{tag}node=\"{node}\""), n)
            })
        })
        .collect();
    if nodes.is_empty() {
        return;
    }
    let per = |f: &dyn Fn(&tollgate_redis::guard::NodeStats) -> Vec<(String, u64)>| {
        nodes
            .iter()
            .flat_map(|(labels, n)| {
                f(n).into_iter()
                    .map(move |(extra, v)| (format!("{labels}{extra}"), v))
            })
            .collect::<Vec<_>>()
    };
    family(
        out,
        ("tollgate_store_node_state", "gauge"),
        "Breaker state of each Redis Cluster master (1 = current).",
        per(&|n| {
            BreakerState::ALL
                .map(|s| {
                    (
                        format!(",state=\"{}\"", s.as_str()),
                        u64::from(s == n.state),
                    )
                })
                .to_vec()
        }),
    );
    family(
        out,
        ("tollgate_store_node_breaker_transitions_total", "counter"),
        "Breaker transitions of each Redis Cluster master, by new state.",
        per(&|n| {
            BreakerState::ALL
                .map(|s| (format!(",to=\"{}\"", s.as_str()), n.transitions[s as usize]))
                .to_vec()
        }),
    );
    let plain: [NodeCounter<'_>; 3] = [
        (
            "tollgate_store_node_degraded_decisions_total",
            "Requests on a Redis Cluster master's keys decided by the failure policy.",
            |n| n.degraded,
        ),
        (
            "tollgate_store_node_folded_keys_total",
            "Keys whose local admissions were folded into a Redis Cluster master when it answered again.",
            |n| n.folded_keys,
        ),
        (
            "tollgate_store_node_folded_cost_total",
            "Hits admitted locally and folded into a Redis Cluster master when it answered again.",
            |n| n.folded_cost,
        ),
    ];
    for (name, help, f) in plain {
        family(
            out,
            (name, "counter"),
            help,
            per(&|n| vec![(String::new(), f(n))]),
        );
    }
}

/// The per-store counters of `sync: batched` limits.
fn render_batches(out: &mut String, stores: &[(Option<&str>, &Guarded)]) {
    let load = |g: &Guarded, f: fn(&tollgate_redis::batch::BatchStats) -> &AtomicU64| {
        f(g.batch_stats().0).load(Relaxed)
    };
    // (name, type, help, reading)
    type Series<'a> = (&'a str, &'a str, &'a str, &'a dyn Fn(&Guarded) -> u64);
    let series: [Series<'_>; 5] = [
        (
            "tollgate_batch_flushes_total",
            "counter",
            "Flushes of batched counts that Redis applied (sync: batched).",
            &|g| load(g, |s| &s.flushes),
        ),
        (
            "tollgate_batch_flush_failures_total",
            "counter",
            "Flushes that failed (their counts are sent again, counted once).",
            &|g| load(g, |s| &s.flush_failures),
        ),
        (
            "tollgate_batch_local_decisions_total",
            "counter",
            "Requests decided from batched counts without a Redis call.",
            &|g| load(g, |s| &s.local_decisions),
        ),
        (
            "tollgate_batch_counters",
            "gauge",
            "Counters of batched limits this instance tracks.",
            &|g| g.batch_stats().1 as u64,
        ),
        (
            "tollgate_batch_units_unconfirmed",
            "gauge",
            "Units admitted locally that Redis has not confirmed yet.",
            &|g| g.batch_stats().2,
        ),
    ];
    for (name, kind, help, f) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (store, g) in stores {
            let labels = store.map_or(String::new(), |s| format!("{{store=\"{s}\"}}"));
            let _ = writeln!(out, "{name}{labels} {}", f(g));
        }
    }
}

/// Escape a label value (`\`, `"`, newline).
fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What each `lease` or `batched` limit did, labelled by domain and rule (the limit's id), so
/// the series follow the configured limits, not the traffic.
fn render_limits(out: &mut String, stores: &[(Option<&str>, &Guarded)], rules: &RuleSet) {
    use tollgate_redis::limits::LimitSync;
    let snapshots: Vec<_> = stores
        .iter()
        .map(|(s, g)| (*s, g.limit_stats().snapshot()))
        .collect();
    // The hit counters name a rule by its stats key: the same `rule` label here lets a query
    // join the two; `limit` (the id) keeps two limits with one stats key apart.
    let stats_keys: HashMap<&str, &str> = rules
        .limits()
        .map(|l| (l.id.as_str(), l.stats.base()))
        .collect();
    let labels = |store: Option<&str>, id: &str, l: &LimitSync, mode: bool| {
        let domain = id.split('|').next().unwrap_or(id);
        let rule = stats_keys.get(id).copied().unwrap_or(id);
        let mut t = store.map_or(String::new(), |s| format!("store=\"{s}\","));
        let _ = write!(
            t,
            "domain=\"{}\",rule=\"{}\",limit=\"{}\"",
            escape_label(domain),
            escape_label(&crate::metrics::bounded_label(rule)),
            escape_label(id)
        );
        if mode {
            let _ = write!(t, ",mode=\"{}\"", l.mode());
        }
        t
    };
    type Field = fn(&LimitSync) -> &AtomicU64;
    let families: [(&str, &str, &str, bool, Field); 9] = [
        (
            "tollgate_sync_decisions_total",
            "counter",
            "Requests decided on a lease or batched limit.",
            true,
            |l| &l.decisions,
        ),
        (
            "tollgate_sync_redis_calls_total",
            "counter",
            "Redis calls made for a lease or batched limit (checks, refills, give-backs, flushes); over tollgate_sync_decisions_total: calls per decision.",
            true,
            |l| &l.redis_calls,
        ),
        (
            "tollgate_sync_lease_grants_total",
            "counter",
            "Leases Redis granted for the limit.",
            false,
            |l| &l.lease_grants,
        ),
        (
            "tollgate_sync_lease_units_granted_total",
            "counter",
            "Units leased for the limit.",
            false,
            |l| &l.lease_units_granted,
        ),
        (
            "tollgate_sync_lease_units_returned_total",
            "counter",
            "Leased units given back unspent.",
            false,
            |l| &l.lease_units_returned,
        ),
        (
            "tollgate_sync_lease_units_expired_total",
            "counter",
            "Leased units lost unspent when their window ended.",
            false,
            |l| &l.lease_units_expired,
        ),
        (
            "tollgate_sync_flushes_total",
            "counter",
            "Batched counters of the limit flushed to Redis (one per counter and flush).",
            false,
            |l| &l.flushes,
        ),
        (
            "tollgate_sync_overshoot_units_total",
            "counter",
            "Units the fleet's count was over the limit by, as this instance's flushes found it (batched; each unit once per counter and window).",
            false,
            |l| &l.overshoot,
        ),
        (
            "tollgate_sync_last_flush_timestamp_seconds",
            "gauge",
            "When a batched counter of the limit was last flushed (seconds since the epoch; 0: never). time() minus it is the flush lag.",
            false,
            |l| &l.last_flush,
        ),
    ];
    for (name, kind, help, mode, field) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (store, limits) in &snapshots {
            for (rule, l) in limits {
                let v = field(l).load(Relaxed);
                let labels = labels(*store, rule, l, mode);
                if name.ends_with("_seconds") {
                    let _ = writeln!(
                        out,
                        "{name}{{{labels}}} {}",
                        tollgate_redis::limits::seconds(v)
                    );
                } else {
                    let _ = writeln!(out, "{name}{{{labels}}} {v}");
                }
            }
        }
    }
}

/// One labelled metric family: its `# HELP` and `# TYPE` lines, then `name{labels} n` per row.
fn family(out: &mut String, (name, kind): (&str, &str), help: &str, rows: Vec<(String, u64)>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, n) in rows {
        let _ = writeln!(out, "{name}{{{labels}}} {n}");
    }
}
