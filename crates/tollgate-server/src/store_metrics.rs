//! The Redis stores' families on `/metrics`: each breaker's state and transitions, what the
//! failure policy decided, errors by kind, a Cluster's masters one by one, leases, batched
//! counts, coalesced calls, folds after an outage, the deny cache, and what each `lease` or
//! `batched` limit did.
//!
//! A backend with one Redis writes its series without a `store` label; with a second Redis
//! for per-second limits, that store's series carry `store="per_second"`.

use crate::backend::{Backend, Policy};
use crate::exposition::{Exposition, Kind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tollgate_core::rules::RuleSet;
use tollgate_core::FaultKind;
use tollgate_redis::guard::{BreakerState, Guarded, NodeStats};
use tollgate_redis::limits::LimitSync;

/// One store of a backend: its `store` label (none for the main one) and the store.
type Store<'a> = (Option<&'a str>, &'a Guarded);

/// A family's name and help, and how to read its value from a store.
type Reading<'a> = (&'a str, &'a str, &'a dyn Fn(&Guarded) -> u64);

/// A family's name and help, and how to read its value from a master's stats.
type NodeReading = (&'static str, &'static str, fn(&NodeStats) -> u64);

/// Write the families of `backend`'s Redis stores (nothing for the memory store). `rules`
/// names each limit's series by its stats key (the hit counters' `rule` label) beside its id.
pub(crate) fn expose(out: &mut Exposition, backend: &Backend, rules: &RuleSet) {
    match backend {
        Backend::Local(_) => {}
        Backend::Redis(g) => expose_stores(out, &[(None, g.as_ref())], rules),
        Backend::RedisSplit(main, per_second) => expose_stores(
            out,
            &[
                (None, main.as_ref()),
                (Some("per_second"), per_second.as_ref()),
            ],
            rules,
        ),
    }
}

fn expose_stores(out: &mut Exposition, stores: &[Store<'_>], rules: &RuleSet) {
    expose_breakers(out, stores);
    expose_nodes(out, stores);
    expose_counters(out, stores);
    expose_batches(out, stores);
    expose_limits(out, stores, rules);
    expose_deny_cache(out, stores);
}

/// `labels` with the store's label first, when it has one.
fn with_store<'a>(
    store: Option<&'a str>,
    labels: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    store
        .map(|s| ("store", s))
        .into_iter()
        .chain(labels.iter().copied())
        .collect()
}

/// A family with one series per store and value of a label: `label`, and each store's rows
/// `(label value, reading)`.
fn per_value(
    out: &mut Exposition,
    (name, kind, help): (&str, Kind, &str),
    stores: &[Store<'_>],
    label: &str,
    rows: impl Fn(&Guarded) -> Vec<(&'static str, u64)>,
) {
    let mut f = out.family(name, kind, help);
    for (store, g) in stores {
        for (value, n) in rows(g) {
            f.sample(&with_store(*store, &[(label, value)]), n);
        }
    }
}

/// The breaker, the failure policy and the errors of each store.
fn expose_breakers(out: &mut Exposition, stores: &[Store<'_>]) {
    per_value(
        out,
        (
            "tollgate_store_state",
            Kind::Gauge,
            "Redis store breaker state (1 = current).",
        ),
        stores,
        "state",
        |g| {
            let state = g.state();
            BreakerState::ALL
                .map(|s| (s.as_str(), u64::from(s == state)))
                .to_vec()
        },
    );
    per_value(
        out,
        (
            "tollgate_store_breaker_transitions_total",
            Kind::Counter,
            "Breaker transitions, by new state.",
        ),
        stores,
        "to",
        |g| {
            BreakerState::ALL
                .map(|s| (s.as_str(), g.transitions(s)))
                .to_vec()
        },
    );
    per_value(
        out,
        (
            "tollgate_degraded_decisions_total",
            Kind::Counter,
            "Requests decided by the failure policy instead of Redis.",
        ),
        stores,
        "policy",
        |g| {
            Policy::ALL
                .map(|p| (p.as_str(), g.degraded_decisions(p)))
                .to_vec()
        },
    );
    per_value(
        out,
        (
            "tollgate_redis_errors_total",
            Kind::Counter,
            "Redis store errors, by kind (timeout and connection kinds may open the breaker; the others fail one request).",
        ),
        stores,
        "kind",
        |g| FaultKind::ALL.map(|k| (k.as_str(), g.errors(k))).to_vec(),
    );
}

/// A Redis Cluster's per-master series (`node="host:port"`, at most
/// [`tollgate_redis::guard::NODES_MAX`] masters per store): which master's breaker is open,
/// and what the failure policy decided and folded back for its keys. Nothing for a single
/// server or Sentinel (the store-wide series say it all).
fn expose_nodes(out: &mut Exposition, stores: &[Store<'_>]) {
    let nodes: Vec<(Option<&str>, NodeStats)> = stores
        .iter()
        .flat_map(|(store, g)| g.node_stats().into_iter().map(move |n| (*store, n)))
        .collect();
    if nodes.is_empty() {
        return;
    }
    // A node's address comes from CLUSTER SLOTS: the writer escapes it like any label value.
    let labels = |store: Option<&str>, n: &NodeStats| -> Vec<(&str, String)> {
        store
            .map(|s| ("store", s.to_owned()))
            .into_iter()
            .chain([("node", n.node.clone())])
            .collect()
    };
    let per_state = |out: &mut Exposition,
                     (name, kind, help),
                     value: fn(&NodeStats, BreakerState) -> u64,
                     label| {
        let mut f = out.family(name, kind, help);
        for (store, n) in &nodes {
            let base = labels(*store, n);
            for s in BreakerState::ALL {
                let mut l: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
                l.push((label, s.as_str()));
                f.sample(&l, value(n, s));
            }
        }
    };
    per_state(
        out,
        (
            "tollgate_store_node_state",
            Kind::Gauge,
            "Breaker state of each Redis Cluster master (1 = current).",
        ),
        |n, s| u64::from(s == n.state),
        "state",
    );
    per_state(
        out,
        (
            "tollgate_store_node_breaker_transitions_total",
            Kind::Counter,
            "Breaker transitions of each Redis Cluster master, by new state.",
        ),
        |n, s| n.transitions[s as usize],
        "to",
    );
    let plain: [NodeReading; 3] = [
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
    for (name, help, value) in plain {
        let mut f = out.family(name, Kind::Counter, help);
        for (store, n) in &nodes {
            let l = labels(*store, n);
            let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
            f.sample(&l, value(n));
        }
    }
}

/// A family with one unlabelled series per store (`store` for the second one).
fn per_store(
    out: &mut Exposition,
    (name, kind, help): (&str, Kind, &str),
    stores: &[Store<'_>],
    value: impl Fn(&Guarded) -> u64,
) {
    let mut f = out.family(name, kind, help);
    for (store, g) in stores {
        f.sample(&with_store(*store, &[]), value(g));
    }
}

/// Leases, coalesced calls, slow calls and folds of each store.
fn expose_counters(out: &mut Exposition, stores: &[Store<'_>]) {
    let lease = |g: &Guarded, f: fn(&tollgate_redis::lease::LeaseStats) -> &AtomicU64| {
        f(g.lease_stats().0).load(Relaxed)
    };
    let counters: [Reading<'_>; 12] = [
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
    for (name, help, value) in counters {
        per_store(out, (name, Kind::Counter, help), stores, value);
    }
    per_store(
        out,
        (
            "tollgate_lease_units_held",
            Kind::Gauge,
            "Leased units this instance holds unspent.",
        ),
        stores,
        |g| g.lease_stats().1,
    );
}

/// The per-store counters of `sync: batched` limits.
fn expose_batches(out: &mut Exposition, stores: &[Store<'_>]) {
    let load = |g: &Guarded, f: fn(&tollgate_redis::batch::BatchStats) -> &AtomicU64| {
        f(g.batch_stats().0).load(Relaxed)
    };
    let series: [(Kind, Reading<'_>); 5] = [
        (
            Kind::Counter,
            (
                "tollgate_batch_flushes_total",
                "Flushes of batched counts that Redis applied (sync: batched).",
                &|g| load(g, |s| &s.flushes),
            ),
        ),
        (
            Kind::Counter,
            (
                "tollgate_batch_flush_failures_total",
                "Flushes that failed (their counts are sent again, counted once).",
                &|g| load(g, |s| &s.flush_failures),
            ),
        ),
        (
            Kind::Counter,
            (
                "tollgate_batch_local_decisions_total",
                "Requests decided from batched counts without a Redis call.",
                &|g| load(g, |s| &s.local_decisions),
            ),
        ),
        (
            Kind::Gauge,
            (
                "tollgate_batch_counters",
                "Counters of batched limits this instance tracks.",
                &|g| g.batch_stats().1 as u64,
            ),
        ),
        (
            Kind::Gauge,
            (
                "tollgate_batch_units_unconfirmed",
                "Units admitted locally that Redis has not confirmed yet.",
                &|g| g.batch_stats().2,
            ),
        ),
    ];
    for (kind, (name, help, value)) in series {
        per_store(out, (name, kind, help), stores, value);
    }
}

/// The deny cache of the stores that have one (`--local-deny-cache`).
fn expose_deny_cache(out: &mut Exposition, stores: &[Store<'_>]) {
    let cached: Vec<_> = stores
        .iter()
        .filter_map(|(s, g)| g.deny_cache_stats().map(|c| (*s, c)))
        .collect();
    if cached.is_empty() {
        return;
    }
    let mut f = out.family(
        "tollgate_deny_cache_hits_total",
        Kind::Counter,
        "Requests denied from the local deny cache.",
    );
    for (s, c) in &cached {
        f.sample(&with_store(*s, &[]), c.0);
    }
    let mut f = out.family(
        "tollgate_deny_cache_entries",
        Kind::Gauge,
        "Keys in the local deny cache.",
    );
    for (s, c) in &cached {
        f.sample(&with_store(*s, &[]), c.1);
    }
}

/// What each `lease` or `batched` limit did, labelled by domain and rule (the limit's id), so
/// the series follow the configured limits, not the traffic.
fn expose_limits(out: &mut Exposition, stores: &[Store<'_>], rules: &RuleSet) {
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
    type Field = fn(&LimitSync) -> &AtomicU64;
    // (name, type, help, labelled with the limit's mode, reading)
    let families: [(&str, Kind, &str, bool, Field); 9] = [
        (
            "tollgate_sync_decisions_total",
            Kind::Counter,
            "Requests decided on a lease or batched limit.",
            true,
            |l| &l.decisions,
        ),
        (
            "tollgate_sync_redis_calls_total",
            Kind::Counter,
            "Redis calls made for a lease or batched limit (checks, refills, give-backs, flushes); over tollgate_sync_decisions_total: calls per decision.",
            true,
            |l| &l.redis_calls,
        ),
        (
            "tollgate_sync_lease_grants_total",
            Kind::Counter,
            "Leases Redis granted for the limit.",
            false,
            |l| &l.lease_grants,
        ),
        (
            "tollgate_sync_lease_units_granted_total",
            Kind::Counter,
            "Units leased for the limit.",
            false,
            |l| &l.lease_units_granted,
        ),
        (
            "tollgate_sync_lease_units_returned_total",
            Kind::Counter,
            "Leased units given back unspent.",
            false,
            |l| &l.lease_units_returned,
        ),
        (
            "tollgate_sync_lease_units_expired_total",
            Kind::Counter,
            "Leased units lost unspent when their window ended.",
            false,
            |l| &l.lease_units_expired,
        ),
        (
            "tollgate_sync_flushes_total",
            Kind::Counter,
            "Batched counters of the limit flushed to Redis (one per counter and flush).",
            false,
            |l| &l.flushes,
        ),
        (
            "tollgate_sync_overshoot_units_total",
            Kind::Counter,
            "Units the fleet's count was over the limit by, as this instance's flushes found it (batched; each unit once per counter and window).",
            false,
            |l| &l.overshoot,
        ),
        (
            "tollgate_sync_last_flush_timestamp_seconds",
            Kind::Gauge,
            "When a batched counter of the limit was last flushed (seconds since the epoch; 0: never). time() minus it is the flush lag.",
            false,
            |l| &l.last_flush,
        ),
    ];
    for (name, kind, help, with_mode, field) in families {
        let mut f = out.family(name, kind, help);
        for (store, limits) in &snapshots {
            for (id, l) in limits {
                let domain = id.split('|').next().unwrap_or(id);
                let rule = crate::metrics::bounded_label(
                    stats_keys.get(id.as_str()).copied().unwrap_or(id),
                );
                let mut labels = with_store(
                    *store,
                    &[("domain", domain), ("rule", &rule), ("limit", id)],
                );
                if with_mode {
                    labels.push(("mode", l.mode().as_str()));
                }
                let v = field(l).load(Relaxed);
                if name.ends_with("_seconds") {
                    f.sample(&labels, tollgate_redis::limits::seconds(v));
                } else {
                    f.sample(&labels, v);
                }
            }
        }
    }
}
