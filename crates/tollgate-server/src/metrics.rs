//! The service's counters, on plain atomics: per-rule counters keyed by `(domain, rule)`, a
//! decision latency histogram, and a few service counters; written on `/metrics` through
//! [`crate::exposition`] by [`Metrics::expose`].
//!
//! Beside the counts, each configured rule's limit (`tollgate_rule_limit`, and as a rate
//! `tollgate_rule_limit_per_second`) under the same `domain` and `rule` labels, so that an alert
//! or a dashboard divides a rule's hit rate by its limit in one expression. Those rows are
//! rendered once per loaded rule set: a reload replaces them, and a removed rule's rows go.
//!
//! The request path is lock-free and allocation-free: a rule's counters are resolved once per
//! loaded rule set ([`RuleSlots`], indexed by the rule's position) and then only bumped with
//! relaxed atomic adds; the latency histogram bumps one bucket (cumulated when rendered).
//!
//! The `rule` label is the rule's stats key as envoyproxy/ratelimit names it
//! (`api.user`, `api.path_/login.ip`; see `tollgate_core::rules::StatsKey`), so dashboards keep
//! their series when a deployment moves over. Cardinality and size stay bounded whatever clients
//! send: a configured rule's own series always exist (the rule set bounds them); series named
//! by request values (`detailed_metric` / `value_to_metric` rules, and per-request limit
//! overrides, labelled by their descriptor) each have a budget of their own
//! (`MAX_PER_VALUE_SERIES`, `MAX_OVERRIDE_SERIES`), past which new ones fold into the rule's
//! configured path (the override's `<domain>|=override` id), so overrides cannot starve
//! per-value series and neither can starve a configured rule; and a label longer than
//! `MAX_LABEL_BYTES` is cut, with a visible marker and a hash of the whole value
//! (`bounded_label`) so that distinct values stay distinct series.

use crate::exposition::{Exposition, Kind};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;
use tollgate_core::limiter::QueueSpot;
use tollgate_core::queue::Dropped;
use tollgate_core::rules::{Limit, RuleSet};
use tollgate_core::Micros;

/// Counters of one `(domain, rule)` pair; all count hits (cost units), as envoyproxy/ratelimit.
#[derive(Debug, Default)]
pub struct RuleCounters {
    /// Every hit checked against the rule.
    pub total_hits: AtomicU64,
    /// Hits denied: on an envoy_fixed_window counter only the hits past the limit (envoy's
    /// split, `Metrics::envoy_split`), with the other algorithms every hit of a denied request.
    pub over_limit: AtomicU64,
    /// Hits past the near-limit threshold (`floor(limit * ratio)`, ratio 0.8 by default) and
    /// not past the limit (see `Metrics::envoy_split`).
    pub near_limit: AtomicU64,
    /// Hits of requests that stayed within the limit.
    pub within_limit: AtomicU64,
    /// Hits counted in `over_limit` of a shadow-mode rule, let through.
    pub shadow_mode: AtomicU64,
    /// Hits denied by the local deny cache, without a Redis round trip (also in `over_limit`).
    pub over_limit_with_local_cache: AtomicU64,
    /// Hits of requests denied by a `shadowban` rule and answered as shadowbanned (also in
    /// `over_limit`).
    pub shadowbanned: AtomicU64,
}

/// A request's hits on one counter, split as envoyproxy/ratelimit's statistics split them
/// ([`Metrics::envoy_split`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EnvoySplit {
    /// Hits past the limit (`over_limit`, and `shadow_mode` for a shadow-mode rule).
    pub over: u64,
    /// Hits past the near-limit threshold and not past the limit (`near_limit`).
    pub near: u64,
    /// Hits of a request that stayed within the limit (`within_limit`).
    pub within: u64,
}

/// One loaded rule set's counters, slot `i` for the `i`-th of [`RuleSet::limits`], each filled
/// on the rule's first use from the `(domain, stats key)` map (so counters survive reloads). An
/// empty table (the `Default`) is valid: every lookup then takes the map path.
#[derive(Debug, Default)]
pub(crate) struct RuleSlots(Box<[OnceLock<Arc<RuleCounters>>]>);

impl RuleSlots {
    /// One empty slot per limit of `set`.
    pub(crate) fn new(set: &RuleSet) -> Self {
        Self(set.limits().map(|_| OnceLock::new()).collect())
    }
}

/// Upper bounds (seconds) of the decision latency histogram.
const BUCKETS: [f64; 12] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.05,
];

#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// All metrics of one service instance.
#[derive(Debug, Default)]
pub struct Metrics {
    rules: RwLock<HashMap<(String, String), Arc<RuleCounters>>>,
    unmatched: RwLock<BTreeMap<(String, &'static str), u64>>,
    /// Distinct unknown domain names labelled in `unmatched` (at most [`MAX_UNKNOWN_DOMAINS`]).
    unknown_domains: AtomicUsize,
    /// Series created per [`Series`] kind named by request values (per-value, override).
    client_series: [AtomicUsize; 2],
    requests: [AtomicU64; 2],
    errors: RwLock<BTreeMap<&'static str, u64>>,
    latency: Histogram,
    store_errors: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    rules_generation: AtomicU64,
    rules_limits: AtomicU64,
    /// The last reload failed (the running rules are older than the files).
    reload_failing: std::sync::atomic::AtomicBool,
    /// The active rule set's limits as `tollgate_rule_limit` and `tollgate_rule_limit_per_second`
    /// rows, rendered when the set is loaded ([`render_limits`]): a reload replaces them whole.
    limit_rows: RwLock<Arc<str>>,
    /// `f32` bits of the near-limit ratio; 0 means the default 0.8.
    near_ratio: std::sync::atomic::AtomicU32,
    /// Connections of the HTTP listener (open, dropped, cap reached).
    pub http_connections: Arc<ConnectionMetrics>,
    /// Connections of the gRPC listener (open, dropped at shutdown, cap reached).
    pub grpc_connections: Arc<ConnectionMetrics>,
    /// The queues of rules with a `queue` option.
    pub(crate) queue: QueueMetrics,
    /// The Envoy quota server's streams and buckets.
    pub(crate) quota: Arc<QuotaMetrics>,
}

/// Bound on the series named by request values of `detailed_metric` / `value_to_metric` rules;
/// beyond it new ones fold into the rule's configured path.
pub(crate) const MAX_PER_VALUE_SERIES: usize = 4_000;

/// Bound on the series of per-request limit overrides (named by their descriptor); beyond it new
/// ones fold into the domain's override id, `<domain>|=override`.
pub(crate) const MAX_OVERRIDE_SERIES: usize = 1_000;

/// Longest `rule` label kept whole, in bytes. Longer ones keep their first bytes, then `…` and
/// 16 hex digits of a hash of the whole value.
pub(crate) const MAX_LABEL_BYTES: usize = 128;

/// What names a series, for its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    /// A configured rule's own path: always kept (the rule set bounds them).
    Configured,
    /// A configured rule's path with request values (`detailed_metric`, `value_to_metric`).
    PerValue,
    /// A per-request limit override, named by its descriptor.
    Override,
}

/// `label`, or when it is longer than [`MAX_LABEL_BYTES`] its first bytes (whole characters)
/// followed by `…` and the hash of the whole value: bounded, visibly cut, still distinct.
pub(crate) fn bounded_label(label: &str) -> Cow<'_, str> {
    use std::hash::{Hash, Hasher};
    if label.len() <= MAX_LABEL_BYTES {
        return Cow::Borrowed(label);
    }
    // The marker and hash take 3 + 16 bytes.
    let mut end = MAX_LABEL_BYTES - 19;
    while !label.is_char_boundary(end) {
        end -= 1;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    label.hash(&mut h);
    Cow::Owned(format!("{}…{:016x}", &label[..end], h.finish()))
}

/// Unknown domain names labelled one by one in `tollgate_unmatched_total`; further ones are
/// counted under the label `other` (the names are client input: the bound keeps /metrics small).
pub(crate) const MAX_UNKNOWN_DOMAINS: usize = 100;

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// The counters for `(domain, rule)`, created on first use: a configured rule's own when
    /// `rule` is `fallback`, else a per-value series ([`Metrics::series`]).
    pub fn rule(&self, domain: &str, rule: &str, fallback: &str) -> Arc<RuleCounters> {
        let kind = if rule == fallback {
            Series::Configured
        } else {
            Series::PerValue
        };
        self.series(domain, rule, fallback, kind)
    }

    /// The counters for `(domain, rule)` (the label bounded by `bounded_label`), created on
    /// first use. A series of `kind` named by request values is folded into `fallback` (a
    /// configured path, always kept) once its kind's budget is spent.
    pub fn series(
        &self,
        domain: &str,
        rule: &str,
        fallback: &str,
        kind: Series,
    ) -> Arc<RuleCounters> {
        let rule = bounded_label(rule);
        let key = (domain.to_string(), rule.into_owned());
        let read = self.rules.read().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = read.get(&key) {
            return c.clone();
        }
        drop(read);
        let budget = match kind {
            Series::Configured => None,
            Series::PerValue => Some((&self.client_series[0], MAX_PER_VALUE_SERIES)),
            Series::Override => Some((&self.client_series[1], MAX_OVERRIDE_SERIES)),
        };
        let mut write = self.rules.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = write.get(&key) {
            return c.clone();
        }
        let key = match budget {
            Some((used, max)) if used.load(Relaxed) >= max => {
                (domain.to_string(), bounded_label(fallback).into_owned())
            }
            Some((used, _)) => {
                used.fetch_add(1, Relaxed);
                key
            }
            None => key,
        };
        write.entry(key).or_default().clone()
    }

    /// The counters of `limit` (keyed by its stats key), a rule of `set` whose [`RuleSlots`] are
    /// `slots`: after the rule's first use, an index and an atomic load, no lock, no allocation.
    pub(crate) fn limit_counters<'s>(
        &self,
        slots: &'s RuleSlots,
        set: &RuleSet,
        limit: &Limit,
    ) -> LimitCounters<'s> {
        match set.index_of(limit).and_then(|i| slots.0.get(i)) {
            Some(slot) => {
                LimitCounters::Slot(slot.get_or_init(|| {
                    self.rule(&limit.domain, limit.stats.base(), limit.stats.base())
                }))
            }
            // A limit given with the request: named after the descriptor, folded into the
            // bounded rule id past the series cap.
            None => LimitCounters::Shared(self.series(
                &limit.domain,
                limit.stats.base(),
                &limit.id,
                Series::Override,
            )),
        }
    }

    /// A descriptor of a configured `domain` matched no rule (`reason` = `no_rule`); unknown
    /// domains go through [`Metrics::unknown_domain`].
    pub fn unmatched(&self, domain: &str, reason: &'static str) {
        let mut m = self.unmatched.write().unwrap_or_else(|e| e.into_inner());
        *m.entry((domain.to_string(), reason)).or_default() += 1;
    }

    /// A descriptor named a domain the rules do not have: counted under its name for the first
    /// `MAX_UNKNOWN_DOMAINS` names, then under `other`. True the first time a label is used
    /// (the caller logs that once; later occurrences only count).
    pub fn unknown_domain(&self, domain: &str) -> bool {
        const REASON: &str = "unknown_domain";
        let key = (domain.to_string(), REASON);
        if let Some(v) = self
            .unmatched
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&key)
        {
            *v += 1;
            return false;
        }
        let mut m = self.unmatched.write().unwrap_or_else(|e| e.into_inner());
        let key = if self.unknown_domains.load(Relaxed) < MAX_UNKNOWN_DOMAINS {
            if !m.contains_key(&key) {
                self.unknown_domains.fetch_add(1, Relaxed);
            }
            key
        } else {
            ("other".to_string(), REASON)
        };
        let count = m.entry(key).or_default();
        *count += 1;
        *count == 1
    }

    /// A request was answered (`allowed` = overall OK).
    pub fn request(&self, allowed: bool) {
        self.requests[usize::from(!allowed)].fetch_add(1, Relaxed);
    }

    /// A request was rejected with error `code`.
    pub fn error(&self, code: &'static str) {
        let mut m = self.errors.write().unwrap_or_else(|e| e.into_inner());
        *m.entry(code).or_default() += 1;
    }

    /// Time spent deciding one request. Bumps only the first bucket it fits (`render` adds them
    /// up into Prometheus' cumulative `le` buckets); slower than every bound: only `count`.
    pub(crate) fn observe_latency(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.latency.buckets[i].fetch_add(1, Relaxed);
        }
        self.latency.count.fetch_add(1, Relaxed);
        self.latency
            .sum_nanos
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// The store failed.
    pub fn store_error(&self) {
        self.store_errors.fetch_add(1, Relaxed);
    }

    /// A reload finished.
    pub fn reload(&self, ok: bool) {
        // Release: a reader that sees this (Acquire, in `render`) sees the rules' limit rows
        // stored before it by the swap.
        self.reload_failing
            .store(!ok, std::sync::atomic::Ordering::Release);
        if ok {
            self.reloads_ok.fetch_add(1, Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Relaxed);
        }
    }

    /// New rules are active.
    pub(crate) fn rules_loaded(&self, set: &RuleSet) {
        self.rules_generation.fetch_add(1, Relaxed);
        self.rules_limits
            .store(set.limits().count() as u64, Relaxed);
        let rows = render_limits(set);
        *self.limit_rows.write().unwrap_or_else(|e| e.into_inner()) = rows.into();
    }

    /// Successful and failed reloads so far.
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.reloads_ok.load(Relaxed),
            self.reloads_failed.load(Relaxed),
        )
    }

    /// Set the near-limit ratio (envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`, default 0.8).
    pub(crate) fn set_near_limit_ratio(&self, ratio: f32) {
        self.near_ratio.store(ratio.to_bits(), Relaxed);
    }

    /// How many of `cost` admitted hits, which left `remaining` of `limit`, count as near the
    /// limit, as envoyproxy/ratelimit counts them: the hits past `floor(limit * ratio)` (all of
    /// them if the count was already past it before this request).
    pub(crate) fn near_limit_hits(&self, limit: u64, remaining: u64, cost: u64) -> u64 {
        let after = limit.saturating_sub(remaining);
        self.envoy_split(limit, after.saturating_sub(cost), after, cost)
            .near
    }

    /// How envoyproxy/ratelimit's base limiter splits `cost` hits on a counter that went from
    /// `before` to `after` (its `limitBeforeIncrease`, `limitAfterIncrease`) against `limit`:
    ///
    /// - not over (`after <= limit`): all `cost` hits are within the limit, and the ones past
    ///   `floor(limit * ratio)` are near it too (all of them if `before` was already past it);
    /// - over: only the hits past the limit are over it (all of them if `before` was at the
    ///   limit already); the hits between `max(floor(limit * ratio), before)` and the limit are
    ///   near it; none are within it (envoy counts `within_limit` only for statuses that are OK).
    pub(crate) fn envoy_split(&self, limit: u64, before: u64, after: u64, cost: u64) -> EnvoySplit {
        let bits = self.near_ratio.load(Relaxed);
        let ratio = if bits == 0 { 0.8 } else { f32::from_bits(bits) };
        // envoy: floor(float64(float32(limit) * ratio)).
        let near_threshold = ((limit as f32) * ratio).floor() as u64;
        if after > limit {
            if before >= limit {
                EnvoySplit {
                    over: cost,
                    ..EnvoySplit::default()
                }
            } else {
                EnvoySplit {
                    over: after - limit,
                    near: limit - near_threshold.max(before),
                    within: 0,
                }
            }
        } else {
            let near = if after <= near_threshold {
                0
            } else if before >= near_threshold {
                cost
            } else {
                after - near_threshold
            };
            EnvoySplit {
                over: 0,
                near,
                within: cost,
            }
        }
    }

    /// Calls `f` with every `(domain, rule)` pair's counters, in no particular order (the
    /// envoy-named exports of the Envoy compatibility module read the same counters at flush time).
    pub(crate) fn for_each_rule(&self, mut f: impl FnMut(&str, &str, &RuleCounters)) {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        for ((domain, rule), c) in rules.iter() {
            f(domain, rule, c);
        }
    }

    /// Service-level totals so far (for the envoy-named exports).
    pub(crate) fn service_totals(&self) -> ServiceTotals {
        ServiceTotals {
            requests: self.requests.iter().map(|r| r.load(Relaxed)).sum(),
            store_errors: self.store_errors.load(Relaxed),
            rule_sets_loaded: self.rules_generation.load(Relaxed),
            reloads_failed: self.reloads_failed.load(Relaxed),
        }
    }

    /// Write the service's own families: the hit counters per rule, unmatched descriptors,
    /// answers, refusals, decision latency, store errors, reloads, the configured limits, the
    /// queues, the quota server and the connections.
    pub fn expose(&self, out: &mut Exposition) {
        self.expose_rules(out);
        let unmatched = self.unmatched.read().unwrap_or_else(|e| e.into_inner());
        let mut f = out.family(
            "tollgate_unmatched_total",
            Kind::Counter,
            "Descriptors that matched no rule (reason: unknown_domain, by domain name up to 100 names then `other`; no_rule).",
        );
        for ((domain, reason), v) in unmatched.iter() {
            f.sample(&[("domain", domain), ("reason", reason)], v);
        }
        drop(unmatched);
        let mut f = out.family(
            "tollgate_requests_total",
            Kind::Counter,
            "Requests answered, by overall code.",
        );
        for (i, code) in ["OK", "OVER_LIMIT"].iter().enumerate() {
            f.sample(&[("code", code)], self.requests[i].load(Relaxed));
        }
        let errors = self.errors.read().unwrap_or_else(|e| e.into_inner());
        let mut f = out.family(
            "tollgate_request_errors_total",
            Kind::Counter,
            "Requests rejected as invalid, by error code.",
        );
        for (code, v) in errors.iter() {
            f.sample(&[("code", code)], v);
        }
        drop(errors);
        let mut cumulative = 0;
        let buckets = BUCKETS.iter().enumerate().map(|(i, b)| {
            cumulative += self.latency.buckets[i].load(Relaxed);
            (*b, cumulative)
        });
        out.family(
            "tollgate_decision_duration_seconds",
            Kind::Histogram,
            "Time to decide one request (rules + store).",
        )
        .histogram(
            &[],
            buckets,
            self.latency.sum_nanos.load(Relaxed) as f64 / 1e9,
            self.latency.count.load(Relaxed),
        );
        out.single(
            "tollgate_store_errors_total",
            Kind::Counter,
            "Store failures.",
            self.store_errors.load(Relaxed),
        );
        out.family(
            "tollgate_rule_reloads_total",
            Kind::Counter,
            "Rule reloads by result.",
        )
        .sample(&[("result", "success")], self.reloads_ok.load(Relaxed))
        .sample(&[("result", "failure")], self.reloads_failed.load(Relaxed));
        out.single(
            "tollgate_rules_generation",
            Kind::Gauge,
            "Rule sets activated by this process.",
            self.rules_generation.load(Relaxed),
        );
        out.single(
            "tollgate_rules_limits",
            Kind::Gauge,
            "Limits in the active rule set.",
            self.rules_limits.load(Relaxed),
        );
        out.single(
            "tollgate_rules_last_reload_successful",
            Kind::Gauge,
            "Whether the last reload of the rule files succeeded (0: the running rules are older than the files).",
            u8::from(!self.reload_failing.load(std::sync::atomic::Ordering::Acquire)),
        );
        out.append(&self.limit_rows.read().unwrap_or_else(|e| e.into_inner()));
        self.queue.expose(out);
        self.quota.expose(out);
        ConnectionMetrics::expose(
            out,
            &[
                ("http", &self.http_connections),
                ("grpc", &self.grpc_connections),
            ],
        );
    }

    /// The hit counters of every `(domain, rule)`, sorted.
    fn expose_rules(&self, out: &mut Exposition) {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<&(String, String)> = rules.keys().collect();
        keys.sort();
        type Field = fn(&RuleCounters) -> &AtomicU64;
        let families: [(&str, &str, Field); 6] = [
            ("tollgate_total_hits", "Hits checked against a rule.", |c| {
                &c.total_hits
            }),
            ("tollgate_over_limit", "Hits denied by a rule.", |c| {
                &c.over_limit
            }),
            (
                "tollgate_near_limit",
                "Hits admitted past the near-limit ratio (default 0.8) of the limit.",
                |c| &c.near_limit,
            ),
            ("tollgate_within_limit", "Hits admitted by a rule.", |c| {
                &c.within_limit
            }),
            (
                "tollgate_shadow_mode",
                "Hits denied by a shadow-mode rule but let through.",
                |c| &c.shadow_mode,
            ),
            (
                "tollgate_shadowbanned",
                "Hits denied by a shadowban rule and answered as if allowed.",
                |c| &c.shadowbanned,
            ),
        ];
        for (name, help, field) in families {
            let mut f = out.family(name, Kind::Counter, help);
            for k in &keys {
                f.sample(
                    &[("domain", &k.0), ("rule", &k.1)],
                    field(&rules[*k]).load(Relaxed),
                );
            }
        }
    }
}

/// Service-level totals, see [`Metrics::service_totals`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServiceTotals {
    /// Requests answered (any overall code).
    pub requests: u64,
    /// Store failures.
    pub store_errors: u64,
    /// Rule sets activated (the one loaded at start included).
    pub rule_sets_loaded: u64,
    /// Failed reloads.
    pub reloads_failed: u64,
}

/// Why the server closed a client connection (`reason` label of
/// `tollgate_connections_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DropReason {
    /// No complete request headers within the header-read timeout.
    HeaderTimeout,
    /// A request body that did not arrive within the body-read timeout (answered 408).
    BodyTimeout,
    /// A keep-alive connection idle for longer than the idle timeout.
    IdleTimeout,
    /// Still open when the shutdown timeout ran out.
    Shutdown,
    /// A request head with a bare LF line ending (answered 400).
    MalformedHead,
}

impl DropReason {
    const ALL: [DropReason; 5] = [
        DropReason::HeaderTimeout,
        DropReason::BodyTimeout,
        DropReason::IdleTimeout,
        DropReason::Shutdown,
        DropReason::MalformedHead,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::HeaderTimeout => "header_timeout",
            DropReason::BodyTimeout => "body_timeout",
            DropReason::IdleTimeout => "idle_timeout",
            DropReason::Shutdown => "shutdown",
            DropReason::MalformedHead => "malformed_head",
        }
    }
}

/// Connection counters of one listener, shared (`Arc`) with its accept loop.
#[derive(Debug, Default)]
pub struct ConnectionMetrics {
    open: AtomicU64,
    dropped: [AtomicU64; DropReason::ALL.len()],
    cap_reached: AtomicU64,
}

impl ConnectionMetrics {
    /// A connection was accepted.
    pub fn opened(&self) {
        self.open.fetch_add(1, Relaxed);
    }

    /// A connection ended (for whatever reason).
    pub fn closed(&self) {
        self.open.fetch_sub(1, Relaxed);
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Relaxed)
    }

    /// `n` connections were closed by the server for `reason`.
    pub fn dropped(&self, reason: DropReason, n: u64) {
        self.dropped[reason as usize].fetch_add(n, Relaxed);
    }

    /// The accept loop found every connection slot taken and waited for one.
    pub(crate) fn cap_reached(&self) {
        self.cap_reached.fetch_add(1, Relaxed);
    }

    /// Write the connection metrics of `listeners` (label `listener`), each family once.
    fn expose(out: &mut Exposition, listeners: &[(&str, &ConnectionMetrics)]) {
        let mut f = out.family(
            "tollgate_connections_open",
            Kind::Gauge,
            "Client connections open now.",
        );
        for (listener, m) in listeners {
            f.sample(&[("listener", listener)], m.open());
        }
        let mut f = out.family(
            "tollgate_connections_dropped_total",
            Kind::Counter,
            "Client connections closed by the server: a timeout, a malformed request head, or still open at the shutdown deadline.",
        );
        for (listener, m) in listeners {
            for r in DropReason::ALL {
                f.sample(
                    &[("listener", listener), ("reason", r.as_str())],
                    m.dropped[r as usize].load(Relaxed),
                );
            }
        }
        let mut f = out.family(
            "tollgate_connections_cap_reached_total",
            Kind::Counter,
            "Times the accept loop waited because every connection slot was taken.",
        );
        for (listener, m) in listeners {
            f.sample(&[("listener", listener)], m.cap_reached.load(Relaxed));
        }
    }
}

/// A rule's counters: borrowed from its pre-resolved slot, or shared from the map (a rule of a
/// set without slots).
#[derive(Debug)]
pub(crate) enum LimitCounters<'s> {
    /// From [`RuleSlots`].
    Slot(&'s RuleCounters),
    /// From the `(domain, rule)` map.
    Shared(Arc<RuleCounters>),
}

impl std::ops::Deref for LimitCounters<'_> {
    type Target = RuleCounters;
    fn deref(&self) -> &RuleCounters {
        match self {
            LimitCounters::Slot(c) => c,
            LimitCounters::Shared(c) => c,
        }
    }
}

/// The memory store's families: keys held, evictions, and one row per limit with a doorkeeper
/// (requests held back, recorded in the filter only with no counter created; the current
/// generation's fill ratio; the false-positive rate that fill implies).
pub(crate) fn expose_memory(out: &mut Exposition, store: &tollgate_core::MemoryStore) {
    out.single(
        "tollgate_memory_keys",
        Kind::Gauge,
        "Keys held by the memory store.",
        store.len(),
    );
    out.single(
        "tollgate_memory_evictions_total",
        Kind::Counter,
        "Live keys evicted by the memory store to make room for new ones.",
        store.evictions(),
    );
    expose_doorkeepers(out, &store.doorkeepers());
}

fn expose_doorkeepers(
    out: &mut Exposition,
    gates: &[(std::sync::Arc<str>, tollgate_core::DoorkeeperStats)],
) {
    if gates.is_empty() {
        return;
    }
    let mut f = out.family(
        "tollgate_memory_doorkeeper_held_back_total",
        Kind::Counter,
        "Requests the memory store's doorkeeper recorded in its Bloom filter only (first requests of a key in a window: no counter created).",
    );
    for (rule, s) in gates {
        f.sample(&[("rule", rule)], s.held_back);
    }
    let mut f = out.family(
        "tollgate_memory_doorkeeper_fill_ratio",
        Kind::Gauge,
        "Share of the bits set in the doorkeeper's current generation.",
    );
    for (rule, s) in gates {
        f.sample(&[("rule", rule)], format_args!("{:.6}", s.fill_ratio));
    }
    let mut f = out.family(
        "tollgate_memory_doorkeeper_false_positive_rate",
        Kind::Gauge,
        "False-positive rate the doorkeeper's current fill implies (fill ^ hashes): the chance a key's first request in the window is counted as a second.",
    );
    for (rule, s) in gates {
        f.sample(&[("rule", rule)], format_args!("{:.6}", s.fp_estimate));
    }
}

/// The `tollgate_rule_limit` and `tollgate_rule_limit_per_second` families of `set`: one row
/// per configured rule with a quota (an `unlimited` rule has no limit to show), labelled with
/// the `domain` and `rule` of the rule's own hit counters so that the two join on
/// `(domain, rule)`. Two rules whose stats keys coincide share one hit series; they share one
/// row here too (the first in file order), so that a join never meets duplicate rows.
fn render_limits(set: &RuleSet) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut rows: Vec<(&str, String, &Limit, tollgate_core::Quota)> = Vec::new();
    for limit in set.limits() {
        let Some(quota) = limit.quota else { continue };
        let rule = bounded_label(limit.stats.base()).into_owned();
        if seen.insert((limit.domain.as_str(), rule.clone())) {
            rows.push((&limit.domain, rule, limit, quota));
        }
    }
    rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut out = Exposition::with_capacity(64 + rows.len() * 160);
    let mut f = out.family(
        "tollgate_rule_limit",
        Kind::Gauge,
        "A configured rule's limit: requests_per_unit per unit_multiplier units, with its algorithm, shadow mode and sync mode.",
    );
    for (domain, rule, limit, quota) in &rows {
        let period = quota.period();
        f.sample(
            &[
                ("domain", domain),
                ("rule", rule),
                ("unit", period.unit.as_str()),
                ("unit_multiplier", &period.multiplier.to_string()),
                ("algorithm", quota.algorithm().as_str()),
                ("shadow", if limit.shadow_mode { "true" } else { "false" }),
                ("sync", quota.sync().as_str()),
            ],
            quota.limit(),
        );
    }
    let mut f = out.family(
        "tollgate_rule_limit_per_second",
        Kind::Gauge,
        "A configured rule's limit as a rate: the limit over its period (months and years at their mean length), to compare with rate(tollgate_total_hits).",
    );
    for (domain, rule, _, quota) in &rows {
        let per_second = quota.limit() as f64 * tollgate_core::clock::SECOND as f64
            / quota.period().nominal() as f64;
        f.sample(&[("domain", domain), ("rule", rule)], per_second);
    }
    out.into_string()
}

/// Buckets of the quota server given series of their own in `tollgate_rlqs_bucket_*`; the
/// buckets past it share the series `bucket="_other"` (bucket ids are client input).
pub(crate) const MAX_QUOTA_BUCKET_SERIES: usize = 500;

/// The Envoy quota server's (RLQS) metrics: streams, reports, refused input, and per bucket
/// its clients, demand, assigned rate, the counts clients reported and the rebalances.
#[derive(Debug, Default)]
pub(crate) struct QuotaMetrics {
    rows: std::sync::Mutex<QuotaRows>,
}

#[derive(Debug, Default)]
struct QuotaRows {
    streams: u64,
    reports: u64,
    rejected: BTreeMap<&'static str, u64>,
    buckets: BTreeMap<(String, String), QuotaBucketRow>,
}

/// One bucket's series.
#[derive(Debug, Default, Clone)]
pub(crate) struct QuotaBucketRow {
    /// Clients (Envoy streams) reporting it.
    pub(crate) clients: u64,
    /// Their demand, requests per second (known demands only).
    pub(crate) demand_per_second: f64,
    /// The rate assigned to them in total, requests per second.
    pub(crate) assigned_per_second: f64,
    /// Requests the clients reported allowed.
    pub(crate) allowed: u64,
    /// Requests the clients reported denied.
    pub(crate) denied: u64,
    /// Assignments pushed to a client because the division changed.
    pub(crate) rebalances: u64,
}

impl QuotaMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, QuotaRows> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open streams now.
    pub(crate) fn set_streams(&self, n: usize) {
        self.lock().streams = n as u64;
    }

    /// A report received.
    pub(crate) fn report(&self) {
        self.lock().reports += 1;
    }

    /// Input refused or ignored, by reason.
    pub(crate) fn rejected(&self, reason: &'static str) {
        *self.lock().rejected.entry(reason).or_default() += 1;
    }

    /// Update the series of `bucket` in `domain` (labels bounded; past
    /// [`MAX_QUOTA_BUCKET_SERIES`] buckets, the shared `_other` series).
    pub(crate) fn bucket(
        &self,
        domain: &str,
        bucket: &str,
        update: impl FnOnce(&mut QuotaBucketRow),
    ) {
        let mut rows = self.lock();
        let key = (
            bounded_label(domain).into_owned(),
            bounded_label(bucket).into_owned(),
        );
        let key = if rows.buckets.contains_key(&key) || rows.buckets.len() < MAX_QUOTA_BUCKET_SERIES
        {
            key
        } else {
            (key.0, "_other".to_owned())
        };
        update(rows.buckets.entry(key).or_default());
    }

    pub(crate) fn expose(&self, out: &mut Exposition) {
        let rows = self.lock();
        out.single(
            "tollgate_rlqs_streams",
            Kind::Gauge,
            "Open quota streams (Envoy rate_limit_quota clients).",
            rows.streams,
        );
        out.single(
            "tollgate_rlqs_reports_total",
            Kind::Counter,
            "Usage reports received.",
            rows.reports,
        );
        let mut f = out.family(
            "tollgate_rlqs_rejected_total",
            Kind::Counter,
            "Quota input refused or ignored, by reason.",
        );
        for (reason, n) in &rows.rejected {
            f.sample(&[("reason", reason)], n);
        }
        type Field = fn(&QuotaBucketRow, &mut String);
        let families: [(&str, Kind, &str, Field); 6] = [
            (
                "tollgate_rlqs_bucket_clients",
                Kind::Gauge,
                "Clients reporting the bucket.",
                |r, v| write_value(v, r.clients),
            ),
            (
                "tollgate_rlqs_bucket_demand_per_second",
                Kind::Gauge,
                "The clients' reported demand (allowed + denied), per second.",
                |r, v| write_value(v, format_args!("{:.3}", r.demand_per_second)),
            ),
            (
                "tollgate_rlqs_bucket_assigned_per_second",
                Kind::Gauge,
                "The rate assigned to the clients in total, per second.",
                |r, v| write_value(v, format_args!("{:.3}", r.assigned_per_second)),
            ),
            (
                "tollgate_rlqs_bucket_allowed_total",
                Kind::Counter,
                "Requests the clients reported allowed.",
                |r, v| write_value(v, r.allowed),
            ),
            (
                "tollgate_rlqs_bucket_denied_total",
                Kind::Counter,
                "Requests the clients reported denied.",
                |r, v| write_value(v, r.denied),
            ),
            (
                "tollgate_rlqs_bucket_rebalances_total",
                Kind::Counter,
                "Assignments pushed because the division of the limit changed.",
                |r, v| write_value(v, r.rebalances),
            ),
        ];
        let mut value = String::new();
        for (name, kind, help, field) in families {
            let mut f = out.family(name, kind, help);
            for ((domain, bucket), row) in &rows.buckets {
                value.clear();
                field(row, &mut value);
                f.sample(&[("domain", domain), ("bucket", bucket)], &value);
            }
        }
    }
}

/// `value` written into `into`.
fn write_value(into: &mut String, value: impl std::fmt::Display) {
    let _ = write!(into, "{value}");
}

/// Upper bounds (seconds) of the queue wait histogram: `max_wait` is 1 ms to 60 s.
const WAIT_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// One rule's queue metrics.
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    waiting: AtomicU64,
    served: AtomicU64,
    /// By [`Dropped`] (full, timeout, gone, refused).
    dropped: [AtomicU64; 4],
    buckets: [AtomicU64; WAIT_BUCKETS.len()],
    sum_micros: AtomicU64,
}

impl QueueCounters {
    /// A request joined a line.
    pub(crate) fn joined(&self) {
        self.waiting.fetch_add(1, Relaxed);
    }

    /// A request left a line, served after waiting `waited`.
    pub(crate) fn served(&self, waited: Micros) {
        self.waiting.fetch_sub(1, Relaxed);
        self.served.fetch_add(1, Relaxed);
        let secs = waited as f64 / 1e6;
        if let Some(i) = WAIT_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.sum_micros.fetch_add(waited, Relaxed);
    }

    /// A request left a line unserved (`waited`), or was turned away from it.
    pub(crate) fn dropped(&self, why: Dropped, waited: bool) {
        if waited {
            self.waiting.fetch_sub(1, Relaxed);
        }
        self.dropped[why.index()].fetch_add(1, Relaxed);
    }
}

/// The queue metrics of every rule that queued a request, by (domain, stats key, rule id): a
/// rule set bounds them.
#[derive(Debug, Default)]
pub(crate) struct QueueMetrics {
    rules: RwLock<HashMap<(String, String, String), Arc<QueueCounters>>>,
}

impl QueueMetrics {
    /// The counters of `spot`'s rule.
    pub(crate) fn of(&self, spot: &QueueSpot<'_>) -> Arc<QueueCounters> {
        let l = spot.limit;
        let key = (l.domain.clone(), l.stats.base().to_owned(), l.id.clone());
        if let Some(c) = self
            .rules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return c.clone();
        }
        self.rules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone()
    }

    /// The queue families (nothing until a rule has queued).
    pub(crate) fn expose(&self, out: &mut Exposition) {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        if rules.is_empty() {
            return;
        }
        let mut keys: Vec<_> = rules.keys().collect();
        keys.sort();
        let rows: Vec<(_, _)> = keys
            .iter()
            .map(|k| {
                (
                    (k.0.as_str(), bounded_label(&k.1), k.2.as_str()),
                    &rules[*k],
                )
            })
            .collect();
        fn labels<'a>(
            (domain, rule, limit): &'a (&'a str, Cow<'a, str>, &'a str),
        ) -> [(&'static str, &'a str); 3] {
            [("domain", domain), ("rule", rule), ("limit", limit)]
        }
        let mut f = out.family(
            "tollgate_queue_waiting",
            Kind::Gauge,
            "Requests waiting in a rule's queues now.",
        );
        for (k, c) in &rows {
            f.sample(&labels(k), c.waiting.load(Relaxed));
        }
        let mut f = out.family(
            "tollgate_queue_served_total",
            Kind::Counter,
            "Requests served from a rule's queues after waiting.",
        );
        for (k, c) in &rows {
            f.sample(&labels(k), c.served.load(Relaxed));
        }
        let mut f = out.family(
            "tollgate_queue_dropped_total",
            Kind::Counter,
            "Requests a rule's queues turned away or that left unserved (reason: full, timeout, gone, refused).",
        );
        for (k, c) in &rows {
            let [d, r, l] = labels(k);
            for why in Dropped::ALL {
                f.sample(
                    &[d, r, l, ("reason", why.as_str())],
                    c.dropped[why.index()].load(Relaxed),
                );
            }
        }
        let mut f = out.family(
            "tollgate_queue_wait_seconds",
            Kind::Histogram,
            "How long requests served from a rule's queues waited.",
        );
        for (k, c) in &rows {
            let mut cumulative = 0;
            let buckets = WAIT_BUCKETS.iter().enumerate().map(|(i, b)| {
                cumulative += c.buckets[i].load(Relaxed);
                (*b, cumulative)
            });
            f.histogram(
                &labels(k),
                buckets,
                c.sum_micros.load(Relaxed) as f64 / 1e6,
                c.served.load(Relaxed),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Metrics {
        /// The service's families alone.
        fn render(&self) -> String {
            let mut page = Exposition::default();
            self.expose(&mut page);
            page.into_string()
        }
    }

    #[test]
    fn doorkeeper_families_render_one_row_per_limit() {
        use tollgate_core::{CheckItem, Doorkeeper, MemoryStore, Quota, Store, Unit};
        let store = MemoryStore::new(100);
        let q = Quota::new(1, Unit::Minute).with_doorkeeper(Doorkeeper::new(1000, 0.01).ok());
        for key in ["a", "b", "a"] {
            store
                .check_one(1, &CheckItem::hit("d|k=\"x\"", key, &q))
                .unwrap();
        }
        let mut page = Exposition::default();
        expose_doorkeepers(&mut page, &store.doorkeepers());
        let out = page.into_string();
        assert!(
            out.contains("tollgate_memory_doorkeeper_held_back_total{rule=\"d|k=\\\"x\\\"\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("# TYPE tollgate_memory_doorkeeper_fill_ratio gauge"));
        assert!(out.contains("tollgate_memory_doorkeeper_false_positive_rate{rule="));
        let mut none = Exposition::default();
        expose_doorkeepers(&mut none, &MemoryStore::new(1).doorkeepers());
        assert!(none.into_string().is_empty());
    }

    #[test]
    fn renders_and_escapes() {
        let m = Metrics::new();
        m.rule("d", "d|k=\"x\"", "d|k")
            .total_hits
            .fetch_add(2, Relaxed);
        m.observe_latency(Duration::from_micros(30));
        m.observe_latency(Duration::from_micros(3));
        m.observe_latency(Duration::from_secs(1));
        let text = m.render();
        assert!(text.contains("tollgate_total_hits{domain=\"d\",rule=\"d|k=\\\"x\\\"\"} 2"));
        assert!(text.contains("tollgate_decision_duration_seconds_count 3"));
        // Cumulative: each `le` bucket counts every observation at or below it.
        assert!(text.contains("le=\"0.000005\"} 1\n"));
        assert!(text.contains("le=\"0.000025\"} 1\n"));
        assert!(text.contains("le=\"0.00005\"} 2\n"));
        assert!(text.contains("le=\"0.05\"} 2\n"));
        assert!(text.contains("le=\"+Inf\"} 3\n"));
    }

    #[test]
    fn labels_are_bounded_and_stay_distinct() {
        let long = |c: char| format!("d.k_{}", c.to_string().repeat(1_000));
        let (la, lb) = (long('a'), long('b'));
        let (a, b) = (bounded_label(&la), bounded_label(&lb));
        assert!(
            a.len() <= MAX_LABEL_BYTES && b.len() <= MAX_LABEL_BYTES,
            "{a}"
        );
        assert!(a.contains('…') && a != b);
        assert_eq!(bounded_label("d.k_v"), "d.k_v");
        // Multi-byte characters are cut whole.
        assert!(bounded_label(&"é".repeat(500)).contains('…'));
    }

    #[test]
    fn overrides_cannot_spend_the_per_value_budget() {
        let m = Metrics::new();
        for i in 0..MAX_OVERRIDE_SERIES + 50 {
            m.series("d", &format!("d.o_{i}"), "d|=override", Series::Override);
        }
        for i in 0..10 {
            m.series("d", &format!("d.k_{i}"), "d.k", Series::PerValue);
        }
        m.rule("d", "d.c", "d.c");
        let mut labels = Vec::new();
        m.for_each_rule(|_, r, _| labels.push(r.to_string()));
        let overrides = labels.iter().filter(|l| l.starts_with("d.o_")).count();
        assert_eq!(overrides, MAX_OVERRIDE_SERIES);
        assert!(labels.iter().any(|l| l == "d|=override"));
        assert_eq!(labels.iter().filter(|l| l.starts_with("d.k_")).count(), 10);
        assert!(labels.iter().any(|l| l == "d.c"));
    }

    #[test]
    fn near_limit_hits_as_envoy_counts_them() {
        let m = Metrics::new();
        // limit 10, ratio 0.8: threshold 8. (remaining after, cost) -> near hits.
        for (remaining, cost, near) in [
            (3, 1, 0),
            (2, 1, 0),
            (1, 1, 1),
            (0, 1, 1),
            (0, 4, 2),
            (1, 3, 1),
        ] {
            assert_eq!(
                m.near_limit_hits(10, remaining, cost),
                near,
                "{remaining} {cost}"
            );
        }
        m.set_near_limit_ratio(0.5);
        assert_eq!(m.near_limit_hits(10, 4, 1), 1);
        assert_eq!(m.near_limit_hits(10, 5, 1), 0);
        // floor: 3 * 0.8 = 2.4 -> 2 with the default.
        m.set_near_limit_ratio(0.8);
        assert_eq!(m.near_limit_hits(3, 0, 1), 1);
        assert_eq!(m.near_limit_hits(3, 1, 1), 0);
    }

    #[test]
    fn envoy_split_is_envoys_base_limiter() {
        let m = Metrics::new();
        let split = |over, near, within| EnvoySplit { over, near, within };
        // (limit, before, after, cost) -> split, from envoyproxy/ratelimit's base_limiter_test
        // and fixed_cache_impl_test (ratio 0.8).
        for ((limit, before, after, cost), want) in [
            // TestGetResponseStatusOverLimit: 2 -> 7 of 5 (threshold 4).
            ((5, 2, 7, 1), split(2, 1, 0)),
            // TestGetResponseStatusBelowLimit: 2 -> 6 of 10 (threshold 8).
            ((10, 2, 6, 1), split(0, 0, 1)),
            // TestNearLimit, 15/hour (threshold 12): 10 -> 11, 12 -> 13, 15 -> 16.
            ((15, 10, 11, 1), split(0, 0, 1)),
            ((15, 12, 13, 1), split(0, 1, 1)),
            ((15, 15, 16, 1), split(1, 0, 0)),
            // key5..key10: hitsAddend > 1 crossing the thresholds and the limit.
            ((20, 2, 5, 3), split(0, 0, 3)),
            ((8, 5, 7, 2), split(0, 1, 2)),
            ((20, 16, 19, 3), split(0, 3, 3)),
            ((20, 19, 22, 3), split(2, 1, 0)),
            ((20, 15, 22, 7), split(2, 4, 0)),
            ((10, 27, 30, 3), split(3, 0, 0)),
            // A hitsAddend of 0 on a counter over its limit counts nothing.
            ((10, 11, 11, 0), split(0, 0, 0)),
        ] {
            assert_eq!(
                m.envoy_split(limit, before, after, cost),
                want,
                "{limit} {before} {after} {cost}"
            );
        }
        // An uncounted query (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) whose count is below
        // the cost: envoy's unsigned `after - cost` wraps, so every hit is near the limit.
        assert_eq!(
            m.envoy_split(10, 9u64.wrapping_sub(10), 9, 10),
            split(0, 10, 10)
        );
    }

    #[test]
    fn each_rule_limit_is_a_series_and_a_reload_replaces_them() {
        let load = |yaml: &str| {
            RuleSet::from_sources(&[("d.yaml".into(), yaml.into())])
                .unwrap()
                .with_defaults(tollgate_core::RuleDefaults::default())
        };
        let m = Metrics::new();
        m.rules_loaded(&load(concat!(
            "domain: d\ndescriptors:\n",
            "  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 90}\n",
            "  - key: ip\n    shadow_mode: true\n",
            "    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 10, algorithm: fixed_window, sync: lease}\n",
            "  - key: free\n    rate_limit: {unlimited: true}\n",
        )));
        let text = m.render();
        assert!(text.contains(
            "tollgate_rule_limit{domain=\"d\",rule=\"d.user\",unit=\"minute\",unit_multiplier=\"1\",algorithm=\"sliding_window_counter\",shadow=\"false\",sync=\"exact\"} 90\n"
        ), "{text}");
        assert!(text.contains(
            "tollgate_rule_limit{domain=\"d\",rule=\"d.ip\",unit=\"second\",unit_multiplier=\"4\",algorithm=\"fixed_window\",shadow=\"true\",sync=\"lease\"} 10\n"
        ), "{text}");
        assert!(text.contains("tollgate_rule_limit_per_second{domain=\"d\",rule=\"d.user\"} 1.5\n"));
        assert!(text.contains("tollgate_rule_limit_per_second{domain=\"d\",rule=\"d.ip\"} 2.5\n"));
        // An unlimited rule has no limit to show.
        assert!(!text.contains("d.free"), "{text}");
        // The labels are the hit counters' own: the series join on (domain, rule).
        m.rule("d", "d.user", "d.user");
        assert!(m
            .render()
            .contains("tollgate_total_hits{domain=\"d\",rule=\"d.user\"} 0"));

        // A reload replaces the rows: a changed limit shows its new value, a removed rule goes.
        m.rules_loaded(&load(
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 7200}\n",
        ));
        let text = m.render();
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("tollgate_rule_limit"))
            .collect();
        assert_eq!(
            rows,
            [
                "tollgate_rule_limit{domain=\"d\",rule=\"d.user\",unit=\"hour\",unit_multiplier=\"1\",algorithm=\"sliding_window_counter\",shadow=\"false\",sync=\"exact\"} 7200",
                "tollgate_rule_limit_per_second{domain=\"d\",rule=\"d.user\"} 2",
            ]
        );
    }

    #[test]
    fn rule_limit_labels_are_bounded_escaped_and_unique() {
        let long = "v".repeat(200);
        // `a` = `b_c` and `a_b` = `c` have one stats key, `d.a_b_c`, so one hit series.
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    value: \"{long}\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n  - key: q\n    value: 'a\"b'\n    rate_limit: {{unit: second, requests_per_unit: 2}}\n  - key: a\n    value: b_c\n    rate_limit: {{unit: second, requests_per_unit: 3}}\n  - key: a_b\n    value: c\n    rate_limit: {{unit: second, requests_per_unit: 4}}\n"
        );
        let set = RuleSet::from_sources(&[("d.yaml".into(), yaml)]).unwrap();
        let m = Metrics::new();
        m.rules_loaded(&set);
        let text = m.render();
        let row = text
            .lines()
            .find(|l| l.starts_with("tollgate_rule_limit{") && l.contains("d.k_"))
            .unwrap();
        let label = row
            .split("rule=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            label.len() <= MAX_LABEL_BYTES && label.contains('…'),
            "{row}"
        );
        assert!(text.contains("rule=\"d.q_a\\\"b\""), "{text}");
        let shared: Vec<&str> = text.lines().filter(|l| l.contains("d.a_b_c")).collect();
        assert_eq!(shared.len(), 2, "{text}");
        assert!(shared[0].ends_with("} 3"), "{text}");
    }

    #[test]
    fn the_last_reload_shows_as_a_gauge() {
        let m = Metrics::new();
        let gauge = |m: &Metrics| {
            m.render()
                .lines()
                .find_map(|l| l.strip_prefix("tollgate_rules_last_reload_successful "))
                .unwrap()
                .to_string()
        };
        assert_eq!(gauge(&m), "1");
        m.reload(false);
        assert_eq!(gauge(&m), "0");
        m.reload(true);
        assert_eq!(gauge(&m), "1");
    }

    #[test]
    fn pre_resolved_counters_are_the_map_counters_across_reloads() {
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let load = || RuleSet::from_sources(&[("d.yaml".into(), yaml.into())]).unwrap();
        let m = Metrics::new();
        let (old, new) = (load(), load());
        let (old_slots, new_slots) = (RuleSlots::new(&old), RuleSlots::new(&new));
        let bump = |set: &RuleSet, slots: &RuleSlots| {
            let limit = set.limits().next().unwrap();
            let c = m.limit_counters(slots, set, limit);
            assert!(matches!(c, LimitCounters::Slot(_)) == !slots.0.is_empty());
            c.total_hits.fetch_add(1, Relaxed);
        };
        bump(&old, &old_slots);
        bump(&old, &old_slots);
        bump(&new, &new_slots);
        bump(&new, &RuleSlots::default());
        // A limit looked up in a set it does not belong to takes the map path, same counters.
        let c = m.limit_counters(&old_slots, &old, new.limits().next().unwrap());
        assert!(matches!(c, LimitCounters::Shared(_)));
        assert_eq!(c.total_hits.load(Relaxed), 4);
        assert!(m
            .render()
            .contains("tollgate_total_hits{domain=\"d\",rule=\"d.k\"} 4"));
    }
}
