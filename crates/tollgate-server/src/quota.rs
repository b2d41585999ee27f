//! The quota server behind Envoy's Rate Limit Quota Service (RLQS), with no transport in it:
//! streams of usage reports in, quota assignments out, configured by the same rules as the
//! rate-limit service.
//!
//! A client (one Envoy, one stream) reports, every few seconds, how many requests of each
//! bucket it allowed and denied. A bucket (a map of strings) is a descriptor of the stream's
//! domain: its entries are put in the order of the domain's descriptor tree
//! ([`tollgate_core::RuleSet::resolve_unordered`]) and the rule found decides:
//!
//! - no rule (or an unknown domain): ALLOW_ALL ([`NO_RULE`]);
//! - an `unlimited` rule, or a `shadow_mode` rule: ALLOW_ALL (a shadow-mode bucket's demand and
//!   shares are still computed and exported, never enforced);
//! - a rule with a limit: the limit is divided between the clients reporting the bucket by
//!   their demand, max-min fair ([`tollgate_core::shares`]), each share a token bucket. A share
//!   of 0 is DENY_ALL.
//!
//! Every report is answered with the reporter's assignments of the buckets it reported (which
//! renews their time to live); a report that lowers another client's share, or raises it by
//! more than [`REBALANCE_FRACTION`], pushes that client its new assignment at once, so the
//! shares sent never add up to more than the limit. A stream that ends gives its share back to
//! the others at once.
//!
//! Everything is bounded: streams ([`Bounds::streams`]), buckets in all and per stream, the
//! entries of a bucket id and their sizes. Input past a bound, or malformed, is ignored and
//! counted in `tollgate_rlqs_rejected_total{reason}`; a report with no domain, or one over
//! [`Bounds::entry_bytes`], ends its stream (INVALID_ARGUMENT).

use crate::metrics::QuotaMetrics;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tollgate_core::shares::{Demands, TokenBucketShare};
use tollgate_core::{Micros, Resolution, RuleSet};

/// What a bucket with no rule gets: every request allowed.
pub(crate) const NO_RULE: Assignment = Assignment::AllowAll;

/// Envoy reports every 5 s, whatever its `reporting_interval` says (measured on Envoy 1.40).
pub(crate) const REPORT_INTERVAL_SECS: u64 = 5;

/// The time to live of an assignment, whole seconds: three reports. A client that loses its
/// stream keeps its assignment this long, then applies its `expired_assignment_behavior`.
pub(crate) const ASSIGNMENT_TTL_SECS: u64 = 3 * REPORT_INTERVAL_SECS;

/// A client that has not reported a bucket for this long (µs) no longer counts in its division.
const STALE_AFTER: Micros = ASSIGNMENT_TTL_SECS * 1_000_000;

/// A share that grows by no more than this fraction (from more than 0) is not sent: the client
/// keeps the token bucket it holds. A share that falls is always sent.
pub(crate) const REBALANCE_FRACTION: f64 = 0.1;

/// The bounds of the quota server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Open streams (more are refused with RESOURCE_EXHAUSTED).
    pub streams: usize,
    /// Buckets tracked in all (new buckets past it are ignored: their clients keep their
    /// `no_assignment_behavior`).
    pub buckets: usize,
    /// Buckets one stream may report.
    pub buckets_per_stream: usize,
    /// Entries of a bucket id.
    pub entries: usize,
    /// Bytes of a bucket id's key or value, and of a report's domain.
    pub entry_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            streams: 1_024,
            buckets: 10_000,
            buckets_per_stream: 1_000,
            entries: 8,
            entry_bytes: 256,
        }
    }
}

/// What one client is told to do with one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Assignment {
    /// Allow every request.
    AllowAll,
    /// Deny every request.
    DenyAll,
    /// A token bucket.
    TokenBucket(TokenBucketShare),
}

/// One assignment to send: the bucket id, the assignment, its time to live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuotaAction {
    /// The domain.
    pub domain: String,
    /// The bucket id, as the client sent it.
    pub bucket: BTreeMap<String, String>,
    /// The assignment.
    pub assignment: Assignment,
    /// Its time to live, whole seconds.
    pub ttl_secs: u64,
}

/// What a stream is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Push {
    /// Assignments.
    Actions(Vec<QuotaAction>),
    /// The stream ends with INVALID_ARGUMENT and this message.
    Invalid(String),
    /// The stream ends with OUT_OF_RANGE and this message (a report over the size limit).
    TooLarge(String),
}

/// One usage report of one bucket, as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Usage {
    /// The bucket id.
    pub bucket: BTreeMap<String, String>,
    /// Requests allowed since the previous report.
    pub allowed: u64,
    /// Requests denied since the previous report.
    pub denied: u64,
}

/// Why a stream cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuotaError {
    /// [`Bounds::streams`] streams are open.
    #[error("too many quota streams are open (at most {0})")]
    TooManyStreams(usize),
    /// A report with an empty domain.
    #[error("a usage report must name its domain")]
    NoDomain,
    /// A report whose domain is longer than [`Bounds::entry_bytes`].
    #[error("the domain of a usage report is longer than {0} bytes")]
    DomainTooLong(usize),
}

/// A stream's id.
pub(crate) type StreamId = u64;

type BucketKey = (String, BTreeMap<String, String>);

/// Assignments to send, by stream, in three waves: `first` (other clients' shares that fall),
/// then `own` (the reporter's answer), then `later` (other clients' shares that grow), so that
/// the shares sent never add up to more than the limit.
#[derive(Debug, Default)]
struct Pushes {
    first: HashMap<StreamId, Vec<QuotaAction>>,
    own: HashMap<StreamId, Vec<QuotaAction>>,
    later: HashMap<StreamId, Vec<QuotaAction>>,
}

/// How a bucket is limited, from the rules of one generation.
#[derive(Debug, Clone, PartialEq)]
enum Policy {
    /// No rule, an unlimited rule: ALLOW_ALL.
    Allow,
    /// A limit divided between the clients; `shadow`: computed, never enforced.
    Divide {
        limit: u64,
        period: Micros,
        shadow: bool,
    },
}

#[derive(Debug)]
struct Bucket {
    generation: u64,
    policy: Policy,
    demands: Demands<StreamId>,
    /// The share (requests per period) last sent to each client.
    sent: HashMap<StreamId, u64>,
    /// The metrics label: `k=v` entries in key order, comma-separated.
    label: String,
}

#[derive(Debug)]
struct Stream {
    tx: mpsc::Sender<Push>,
    buckets: HashSet<BucketKey>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: StreamId,
    streams: HashMap<StreamId, Stream>,
    buckets: HashMap<BucketKey, Bucket>,
}

/// The quota server's state: its streams and buckets.
#[derive(Debug)]
pub(crate) struct Quotas {
    inner: Mutex<Inner>,
    bounds: Bounds,
    metrics: Arc<QuotaMetrics>,
}

impl Quotas {
    /// A quota server within `bounds`, exporting to `metrics`.
    pub(crate) fn new(bounds: Bounds, metrics: Arc<QuotaMetrics>) -> Self {
        Quotas {
            inner: Mutex::new(Inner::default()),
            bounds,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open a stream whose pushes go to `tx`.
    pub(crate) fn open(&self, tx: mpsc::Sender<Push>) -> Result<StreamId, QuotaError> {
        let mut inner = self.lock();
        if inner.streams.len() >= self.bounds.streams {
            self.metrics.rejected("too_many_streams");
            return Err(QuotaError::TooManyStreams(self.bounds.streams));
        }
        inner.next_id += 1;
        let id = inner.next_id;
        inner.streams.insert(
            id,
            Stream {
                tx,
                buckets: HashSet::new(),
            },
        );
        let n = inner.streams.len();
        self.metrics.set_streams(n);
        tracing::debug!(stream = id, streams = n, "quota stream opened");
        Ok(id)
    }

    /// The stream ended: its buckets are divided again between the other clients, who are
    /// pushed their new shares.
    pub(crate) fn close(&self, id: StreamId) {
        let mut inner = self.lock();
        let Some(stream) = inner.streams.remove(&id) else {
            return;
        };
        let n = inner.streams.len();
        self.metrics.set_streams(n);
        tracing::debug!(stream = id, streams = n, "quota stream closed");
        let mut pushes = Pushes::default();
        for key in stream.buckets {
            let Some(bucket) = inner.buckets.get_mut(&key) else {
                continue;
            };
            bucket.demands.remove(&id);
            bucket.sent.remove(&id);
            if bucket.demands.is_empty() {
                inner.buckets.remove(&key);
                self.metrics.bucket(&key.0, &bucket_label_of(&key), |r| {
                    r.clients = 0;
                    r.demand_per_second = 0.0;
                    r.assigned_per_second = 0.0;
                });
                continue;
            }
            self.divide(&key, bucket, None, &mut pushes);
        }
        send(&inner, pushes);
    }

    /// One report of stream `id` in `domain`: the demands it brings are taken, the buckets it
    /// names divided again, and the reporter answered on its stream; other clients whose share
    /// moved are pushed theirs (those whose share falls before those whose share grows).
    pub(crate) fn report(
        &self,
        id: StreamId,
        domain: &str,
        usages: Vec<Usage>,
        rules: &RuleSet,
        generation: u64,
        now: Micros,
    ) -> Result<(), QuotaError> {
        if domain.is_empty() {
            self.metrics.rejected("no_domain");
            return Err(QuotaError::NoDomain);
        }
        if domain.len() > self.bounds.entry_bytes {
            self.metrics.rejected("domain_size");
            return Err(QuotaError::DomainTooLong(self.bounds.entry_bytes));
        }
        self.metrics.report();
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut pushes = Pushes::default();
        let mut seen: HashSet<BucketKey> = HashSet::new();
        for usage in usages {
            if let Some(reason) = self.invalid(&usage.bucket) {
                self.metrics.rejected(reason);
                continue;
            }
            let key: BucketKey = (domain.to_owned(), usage.bucket);
            if !seen.insert(key.clone()) {
                self.metrics.rejected("duplicate_bucket");
                continue;
            }
            let Some(stream) = inner.streams.get_mut(&id) else {
                break;
            };
            if !stream.buckets.contains(&key) {
                if stream.buckets.len() >= self.bounds.buckets_per_stream {
                    self.metrics.rejected("buckets_per_stream");
                    continue;
                }
                if !inner.buckets.contains_key(&key) && inner.buckets.len() >= self.bounds.buckets {
                    self.metrics.rejected("buckets");
                    continue;
                }
                stream.buckets.insert(key.clone());
            }
            let bucket = inner
                .buckets
                .entry(key.clone())
                .or_insert_with(|| new_bucket(&key, rules, generation));
            if bucket.generation != generation {
                let fresh = new_bucket(&key, rules, generation);
                bucket.generation = generation;
                bucket.policy = fresh.policy;
                bucket.label = fresh.label;
            }
            let period = match bucket.policy {
                Policy::Divide { period, .. } => period,
                Policy::Allow => 1_000_000,
            };
            bucket
                .demands
                .report(&id, now, usage.allowed.saturating_add(usage.denied), period);
            let label = bucket.label.clone();
            self.metrics.bucket(domain, &label, |r| {
                r.allowed = r.allowed.saturating_add(usage.allowed);
                r.denied = r.denied.saturating_add(usage.denied);
            });
            // Clients gone quiet on this bucket (their stream still open) no longer count.
            for stale in stale_clients(bucket, now) {
                bucket.demands.remove(&stale);
                bucket.sent.remove(&stale);
                if let Some(s) = inner.streams.get_mut(&stale) {
                    s.buckets.remove(&key);
                }
            }
            self.divide(&key, bucket, Some(id), &mut pushes);
        }
        send(inner, pushes);
        Ok(())
    }

    /// Why `bucket` is not a valid bucket id, if it is not.
    fn invalid(&self, bucket: &BTreeMap<String, String>) -> Option<&'static str> {
        if bucket.is_empty() {
            return Some("empty_bucket_id");
        }
        if bucket.len() > self.bounds.entries {
            return Some("bucket_id_entries");
        }
        let b = self.bounds.entry_bytes;
        if bucket
            .iter()
            .any(|(k, v)| k.is_empty() || v.is_empty() || k.len() > b || v.len() > b)
        {
            return Some("bucket_id_entry_size");
        }
        None
    }

    /// Divide `bucket` again: `reporter`'s assignment is always added to `pushes` (its report
    /// is answered, renewing the time to live); another client's only when its share falls, or
    /// grows by more than [`REBALANCE_FRACTION`].
    fn divide(
        &self,
        key: &BucketKey,
        bucket: &mut Bucket,
        reporter: Option<StreamId>,
        pushes: &mut Pushes,
    ) {
        let (limit, period, shadow) = match bucket.policy {
            Policy::Allow => {
                if let Some(r) = reporter {
                    pushes.own.entry(r).or_default().push(action(key, NO_RULE));
                }
                self.metrics.bucket(&key.0, &bucket.label, |r| {
                    r.clients = bucket.demands.len() as u64;
                });
                return;
            }
            Policy::Divide {
                limit,
                period,
                shadow,
            } => (limit, period, shadow),
        };
        let shares = bucket.demands.shares(limit);
        let mut rebalanced = 0u64;
        for (client, share) in &shares {
            // A share that falls is always sent (the shares sent never add up to more than the
            // limit); one that grows only by more than the fraction (or from 0), so small moves
            // do not replace the token bucket a client holds at every report.
            let previous = bucket.sent.get(client).copied();
            let sent = match previous {
                Some(p) if *share > p && p > 0 => {
                    if (*share - p) as f64 > REBALANCE_FRACTION * p as f64 {
                        *share
                    } else {
                        p
                    }
                }
                _ => *share,
            };
            let moved = previous != Some(sent);
            let own = Some(*client) == reporter;
            if !own && !moved {
                continue;
            }
            bucket.sent.insert(*client, sent);
            if moved && !own && previous.is_some() {
                rebalanced += 1;
            }
            let assignment = if shadow {
                Assignment::AllowAll
            } else {
                match TokenBucketShare::of(sent, period) {
                    Some(b) => Assignment::TokenBucket(b),
                    None => Assignment::DenyAll,
                }
            };
            let wave = if own {
                &mut pushes.own
            } else if previous.is_some_and(|p| sent > p) {
                &mut pushes.later
            } else {
                &mut pushes.first
            };
            wave.entry(*client)
                .or_default()
                .push(action(key, assignment));
        }
        let per_second = |v: u64| v as f64 * 1e6 / period.max(1) as f64;
        let assigned: u64 = bucket.sent.values().sum();
        let demand = bucket.demands.total_demand();
        let clients = bucket.demands.len() as u64;
        self.metrics.bucket(&key.0, &bucket.label, |r| {
            r.clients = clients;
            r.demand_per_second = per_second(demand);
            r.assigned_per_second = per_second(assigned);
            r.rebalances += rebalanced;
        });
    }

    /// Each client's share of a bucket (requests per the rule's period): `None` when no client
    /// reports it.
    #[cfg(test)]
    pub(crate) fn shares(
        &self,
        domain: &str,
        bucket: &BTreeMap<String, String>,
    ) -> Option<Vec<(StreamId, u64)>> {
        let inner = self.lock();
        let b = inner.buckets.get(&(domain.to_owned(), bucket.clone()))?;
        let mut v: Vec<(StreamId, u64)> = b.sent.iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable();
        Some(v)
    }
}

/// The clients of `bucket` that have not reported it for [`STALE_AFTER`].
fn stale_clients(bucket: &Bucket, now: Micros) -> Vec<StreamId> {
    bucket.demands.quiet_since(now.saturating_sub(STALE_AFTER))
}

/// Send each stream its pushes, wave by wave. A stream whose queue is full misses them and
/// gets its assignments with its next report.
fn send(inner: &Inner, pushes: Pushes) {
    for wave in [pushes.first, pushes.own, pushes.later] {
        for (id, actions) in wave {
            if actions.is_empty() {
                continue;
            }
            let Some(s) = inner.streams.get(&id) else {
                continue;
            };
            let domain = actions
                .first()
                .map(|a| a.domain.clone())
                .unwrap_or_default();
            let log = tracing::enabled!(tracing::Level::DEBUG).then(|| actions.clone());
            if s.tx.try_send(Push::Actions(actions)).is_ok() {
                if let Some(actions) = log {
                    log_actions(id, &domain, &actions);
                }
            }
        }
    }
}

/// Log (debug) each assignment sent to stream `id`: `quota assignment stream=.. bucket=..
/// assignment=token_bucket max_tokens=.. tokens_per_fill=.. fill_interval_secs=..`.
fn log_actions(id: StreamId, domain: &str, actions: &[QuotaAction]) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    for a in actions {
        let bucket = bucket_label_of(&(String::new(), a.bucket.clone()));
        let assignment = match a.assignment {
            Assignment::AllowAll => "allow_all".to_owned(),
            Assignment::DenyAll => "deny_all".to_owned(),
            Assignment::TokenBucket(b) => format!(
                "token_bucket max_tokens={} tokens_per_fill={} fill_interval_secs={}",
                b.max_tokens, b.tokens_per_fill, b.fill_interval_secs
            ),
        };
        tracing::debug!(
            stream = id,
            domain = %domain.escape_debug(),
            bucket = %bucket.escape_debug(),
            "quota assignment {assignment}"
        );
    }
}

fn action(key: &BucketKey, assignment: Assignment) -> QuotaAction {
    QuotaAction {
        domain: key.0.clone(),
        bucket: key.1.clone(),
        assignment,
        ttl_secs: ASSIGNMENT_TTL_SECS,
    }
}

/// The metrics label of a bucket id: its entries in key order, `k=v` comma-separated.
fn bucket_label_of(key: &BucketKey) -> String {
    let mut out = String::new();
    for (i, (k, v)) in key.1.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// A new bucket, its policy from `rules`.
fn new_bucket(key: &BucketKey, rules: &RuleSet, generation: u64) -> Bucket {
    let entries: Vec<(&str, &str)> = key
        .1
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (_, resolution) = rules.resolve_unordered(&key.0, &entries);
    let policy = match resolution {
        Resolution::Limited { limit, .. } => match &limit.quota {
            Some(q) => Policy::Divide {
                limit: q.limit(),
                period: q.period().nominal(),
                shadow: limit.shadow_mode,
            },
            None => Policy::Allow,
        },
        _ => Policy::Allow,
    };
    Bucket {
        generation,
        policy,
        demands: Demands::new(),
        sent: HashMap::new(),
        label: bucket_label_of(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Micros = 1_000_000;

    fn rules() -> RuleSet {
        RuleSet::from_sources(&[(
            "q.yaml".into(),
            "domain: q\ndescriptors:\n  - key: tenant\n    value: acme\n    descriptors:\n      - key: method\n        rate_limit: {unit: second, requests_per_unit: 40}\n  - key: tier\n    value: open\n    rate_limit: {unlimited: true}\n  - key: tier\n    value: none\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: tier\n    value: shadow\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
                .into(),
        )])
        .unwrap()
    }

    fn bucket(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn usage(entries: &[(&str, &str)], allowed: u64, denied: u64) -> Usage {
        Usage {
            bucket: bucket(entries),
            allowed,
            denied,
        }
    }

    fn quotas(bounds: Bounds) -> (Quotas, Arc<QuotaMetrics>) {
        let metrics = Arc::new(QuotaMetrics::default());
        (Quotas::new(bounds, Arc::clone(&metrics)), metrics)
    }

    /// Every assignment queued for a stream, latest last.
    fn drain(rx: &mut mpsc::Receiver<Push>) -> Vec<QuotaAction> {
        let mut out = Vec::new();
        while let Ok(Push::Actions(a)) = rx.try_recv() {
            out.extend(a);
        }
        out
    }

    fn share(actions: &[QuotaAction]) -> Option<u32> {
        actions.iter().rev().find_map(|a| match a.assignment {
            Assignment::TokenBucket(b) => Some(b.tokens_per_fill),
            Assignment::DenyAll => Some(0),
            Assignment::AllowAll => None,
        })
    }

    const ACME: &[(&str, &str)] = &[("method", "get"), ("tenant", "acme")];

    #[test]
    fn the_rules_give_blanket_rules_and_token_buckets() {
        let (q, _) = quotas(Bounds::default());
        let (tx, mut rx) = mpsc::channel(16);
        let id = q.open(tx).unwrap();
        let r = rules();
        let usages = vec![
            usage(&[("tier", "open")], 1, 0),
            usage(&[("tier", "none")], 1, 0),
            usage(&[("tier", "shadow")], 1, 0),
            usage(&[("tier", "other")], 1, 0),
            usage(ACME, 1, 0),
        ];
        q.report(id, "q", usages, &r, 1, SEC).unwrap();
        let got: Vec<(String, Assignment)> = drain(&mut rx)
            .into_iter()
            .map(|a| (bucket_label_of(&(String::new(), a.bucket)), a.assignment))
            .collect();
        let tb = TokenBucketShare::of(40, SEC).unwrap();
        assert_eq!(
            got,
            vec![
                ("tier=open".to_owned(), Assignment::AllowAll),
                ("tier=none".to_owned(), Assignment::DenyAll),
                ("tier=shadow".to_owned(), Assignment::AllowAll),
                ("tier=other".to_owned(), NO_RULE),
                (
                    "method=get,tenant=acme".to_owned(),
                    Assignment::TokenBucket(tb)
                ),
            ]
        );
        // An unknown domain: no rule.
        q.report(id, "elsewhere", vec![usage(ACME, 1, 0)], &r, 1, SEC)
            .unwrap();
        assert_eq!(drain(&mut rx)[0].assignment, NO_RULE);
    }

    #[test]
    fn shares_follow_demand_and_come_back_when_a_stream_ends() {
        let (q, metrics) = quotas(Bounds::default());
        let r = rules();
        let (tx_a, mut rx_a) = mpsc::channel(16);
        let (tx_b, mut rx_b) = mpsc::channel(16);
        let a = q.open(tx_a).unwrap();
        let b = q.open(tx_b).unwrap();
        q.report(a, "q", vec![usage(ACME, 1, 0)], &r, 1, 0).unwrap();
        assert_eq!(share(&drain(&mut rx_a)), Some(40));
        // A newcomer gets an equal share at once; A's falls and is pushed.
        q.report(b, "q", vec![usage(ACME, 1, 0)], &r, 1, SEC)
            .unwrap();
        assert_eq!(share(&drain(&mut rx_b)), Some(20));
        assert_eq!(share(&drain(&mut rx_a)), Some(20));
        // Demands measured: A 100/s, B 5/s over 5 s. B gets its demand, A the rest.
        q.report(a, "q", vec![usage(ACME, 400, 100)], &r, 1, 5 * SEC)
            .unwrap();
        q.report(b, "q", vec![usage(ACME, 20, 0)], &r, 1, 5 * SEC)
            .unwrap();
        let (sa, sb) = (share(&drain(&mut rx_a)), share(&drain(&mut rx_b)));
        assert_eq!((sa, sb), (Some(35), Some(5)));
        assert_eq!(q.shares("q", &bucket(ACME)).unwrap(), vec![(a, 35), (b, 5)]);
        // B leaves: A gets the whole limit, pushed.
        q.close(b);
        assert_eq!(share(&drain(&mut rx_a)), Some(40));
        let mut page = crate::exposition::Exposition::default();
        metrics.expose(&mut page);
        let text = page.into_string();
        assert!(text.contains(
            "tollgate_rlqs_bucket_clients{domain=\"q\",bucket=\"method=get,tenant=acme\"} 1"
        ));
        assert!(text.contains(
            "tollgate_rlqs_bucket_denied_total{domain=\"q\",bucket=\"method=get,tenant=acme\"} 100"
        ));
    }

    #[test]
    fn malformed_and_excess_input_is_ignored_and_counted() {
        let bounds = Bounds {
            streams: 2,
            buckets: 3,
            buckets_per_stream: 2,
            entries: 2,
            entry_bytes: 8,
        };
        let (q, metrics) = quotas(bounds);
        let r = rules();
        let (tx, mut rx) = mpsc::channel(16);
        let id = q.open(tx.clone()).unwrap();
        assert_eq!(
            q.report(id, "", vec![usage(ACME, 1, 0)], &r, 1, SEC),
            Err(QuotaError::NoDomain)
        );
        assert_eq!(
            q.report(id, "123456789", vec![usage(ACME, 1, 0)], &r, 1, SEC),
            Err(QuotaError::DomainTooLong(8))
        );
        let usages = vec![
            usage(&[], 1, 0),
            usage(&[("a", "1"), ("b", "2"), ("c", "3")], 1, 0),
            usage(&[("a", "")], 1, 0),
            usage(&[("a", "123456789")], 1, 0),
            usage(&[("tier", "open")], 1, 0),
            usage(&[("tier", "open")], 1, 0),
            usage(&[("tier", "x")], 1, 0),
            usage(&[("tier", "y")], 1, 0),
        ];
        q.report(id, "q", usages, &r, 1, SEC).unwrap();
        assert_eq!(drain(&mut rx).len(), 2);
        // The second stream fills the last bucket of all; the third is refused.
        let (tx2, mut rx2) = mpsc::channel(16);
        let id2 = q.open(tx2).unwrap();
        q.report(
            id2,
            "q",
            vec![usage(&[("tier", "z")], 1, 0), usage(&[("tier", "w")], 1, 0)],
            &r,
            1,
            SEC,
        )
        .unwrap();
        assert_eq!(drain(&mut rx2).len(), 1);
        assert_eq!(q.open(tx), Err(QuotaError::TooManyStreams(2)));
        let mut page = crate::exposition::Exposition::default();
        metrics.expose(&mut page);
        let out = page.into_string();
        for (reason, n) in [
            ("no_domain", 1),
            ("domain_size", 1),
            ("empty_bucket_id", 1),
            ("bucket_id_entries", 1),
            ("bucket_id_entry_size", 2),
            ("duplicate_bucket", 1),
            ("buckets_per_stream", 1),
            ("buckets", 1),
            ("too_many_streams", 1),
        ] {
            let line = format!("tollgate_rlqs_rejected_total{{reason=\"{reason}\"}} {n}\n");
            assert!(out.contains(&line), "{line} in\n{out}");
        }
    }

    #[test]
    fn a_rules_reload_applies_to_the_next_report() {
        let (q, _) = quotas(Bounds::default());
        let (tx, mut rx) = mpsc::channel(16);
        let id = q.open(tx).unwrap();
        q.report(id, "q", vec![usage(ACME, 1, 0)], &rules(), 1, SEC)
            .unwrap();
        assert_eq!(share(&drain(&mut rx)), Some(40));
        let none =
            RuleSet::from_sources(&[("q.yaml".into(), "domain: q\ndescriptors: []\n".into())]);
        let none = none.unwrap_or_default();
        q.report(id, "q", vec![usage(ACME, 1, 0)], &none, 2, 2 * SEC)
            .unwrap();
        assert_eq!(drain(&mut rx)[0].assignment, NO_RULE);
    }
}
