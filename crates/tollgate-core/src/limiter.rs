//! One rate-limit request from rules to verdict, independent of the store and the transport.
//!
//! Checking is split so async stores fit without duplicating the logic: [`Plan::new`] resolves
//! each descriptor against the [`RuleSet`] (applying `replaces`), [`Plan::items`] lists the
//! counters for the store to check all-or-nothing, and [`Plan::finish`] turns the store's
//! decisions into a [`Verdict`]. [`check`] does all three with a synchronous [`Store`].
//!
//! A descriptor may carry a [`LimitOverride`] (Envoy's per-request `RateLimitDescriptor.limit`).
//! Statuses borrow their [`Limit`] for the plan's lifetime, so the limits that overrides stand
//! for are built up front into an [`Overrides`] the caller keeps alive next to the rules; that
//! keeps [`Status`] a cheap `Copy` value and the common no-override path allocation-free.

use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Quota, Unit};
use crate::rules::{counter_key, Limit, Resolution, RuleSet, StatsKey};
use crate::store::{CheckItem, Store, StoreError, Tier};

/// One descriptor of a request: its entries in order, and an optional cost of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// `(key, value)` entries, in order.
    pub entries: Vec<(String, String)>,
    /// This descriptor's cost; `None` uses the request's.
    pub hits: Option<u64>,
    /// A limit given with the request in place of the configured rule.
    pub limit: Option<LimitOverride>,
}

impl From<Vec<(String, String)>> for Descriptor {
    /// A descriptor of these entries, at the request's cost and with the configured rule (as
    /// the descriptors that [`HttpActions`](crate::request::HttpActions) derives from an HTTP request).
    fn from(entries: Vec<(String, String)>) -> Self {
        Descriptor {
            entries,
            hits: None,
            limit: None,
        }
    }
}

/// A per-request limit (Envoy's `RateLimitDescriptor.limit`), as envoyproxy/ratelimit applies
/// it: when the domain is known, it replaces whatever rule the descriptor matches (or adds a
/// limit where none matches), never in shadow mode. Its counter is the descriptor's own
/// (`domain|key=value|...` with the request's values) under the rule set's default algorithm, so the same
/// override on the same descriptor from any instance shares one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit; 0 denies everything.
    pub requests_per_unit: u64,
    /// The unit.
    pub unit: Unit,
}

/// Last part of the rule id shared by every override limit of a domain, `<domain>|=override`:
/// rule keys are never empty, so no configured rule's id has a part that starts with `=`. It
/// carries no request values, so it is also the bounded metric name that an override's stats
/// key (the descriptor's, as envoyproxy/ratelimit names it) folds into past the series cap.
const OVERRIDE_ID: &str = "=override";

/// Most requests per unit a [`LimitOverride`] may ask when the overrides of its rule set are
/// sliding window logs ([`Overrides::too_large`]). A log's memory grows with its limit (an
/// entry per admission time in the window): with this bound a key that requests choose holds
/// at most this many entries, whatever a client asks.
pub const MAX_LOG_OVERRIDE: u64 = 10_000;

/// The limits that the [`LimitOverride`]s of one request stand for, one slot per descriptor.
/// Build it with [`Overrides::new`] and keep it alive as long as the [`Plan`].
#[derive(Debug, Default)]
pub struct Overrides(Vec<Option<Limit>>);

impl Overrides {
    /// The override limits of `descriptors` in `domain`; empty (no allocation) when no descriptor
    /// has one or the domain is unknown to `rules` (unknown domains get no limit, as without).
    pub fn new(rules: &RuleSet, domain: &str, descriptors: &[Descriptor]) -> Self {
        if descriptors.iter().all(|d| d.limit.is_none()) {
            return Self::default();
        }
        let Some(d) = rules.domain(domain) else {
            return Self::default();
        };
        Self(
            descriptors
                .iter()
                .map(|desc| {
                    desc.limit.map(|o| {
                        let quota = Quota::new(o.requests_per_unit, o.unit)
                            .with_algorithm(rules.defaults().algorithm());
                        Limit::new(format!("{}|{OVERRIDE_ID}", d.name), &d.name, Some(quota))
                            .with_count_denied_hits(rules.defaults().count_denied_hits)
                            .with_stats(StatsKey::of_descriptor(
                                &d.name,
                                desc.entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                            ))
                            .with_source("(request)", 0)
                    })
                })
                .collect(),
        )
    }

    /// The first descriptor (index and override) whose override asks more than a request may
    /// ask of the algorithm overrides use in `rules`: [`MAX_LOG_OVERRIDE`] for the sliding
    /// window log, no bound for the others (their state does not grow with the limit).
    pub fn too_large(rules: &RuleSet, descriptors: &[Descriptor]) -> Option<(usize, u64)> {
        if rules.defaults().algorithm() != crate::quota::Algorithm::SlidingWindowLog {
            return None;
        }
        descriptors.iter().enumerate().find_map(|(i, d)| {
            d.limit
                .filter(|l| l.requests_per_unit > MAX_LOG_OVERRIDE)
                .map(|l| (i, l.requests_per_unit))
        })
    }

    fn get(&self, i: usize) -> Option<&Limit> {
        self.0.get(i).and_then(Option::as_ref)
    }
}

impl Descriptor {
    /// A descriptor from `(key, value)` pairs.
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            hits: None,
            limit: None,
        }
    }
}

/// How one descriptor was resolved.
#[derive(Debug, Clone)]
enum Resolved<'r> {
    NoLimit,
    Unlimited(&'r Limit),
    Limited {
        limit: &'r Limit,
        key: String,
        cost: u64,
        tier: Option<u8>,
    },
}

/// A request resolved against the rules, ready for the store.
#[derive(Debug)]
pub struct Plan<'r> {
    resolved: Vec<Resolved<'r>>,
}

impl<'r> Plan<'r> {
    /// Resolve `descriptors` of `domain`; `hits` is the cost of descriptors without their own.
    /// Descriptors' [`LimitOverride`]s are ignored: use [`Plan::with_overrides`] to apply them.
    pub fn new(rules: &'r RuleSet, domain: &str, descriptors: &[Descriptor], hits: u64) -> Self {
        static NONE: Overrides = Overrides(Vec::new());
        Self::with_overrides(rules, &NONE, domain, descriptors, hits)
    }

    /// Like [`Plan::new`], with the limits of `overrides` (built by [`Overrides::new`] from the
    /// same descriptors) in place of the rules for the descriptors that carry one.
    pub fn with_overrides(
        rules: &'r RuleSet,
        overrides: &'r Overrides,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u64,
    ) -> Self {
        let mut resolved: Vec<Resolved<'r>> = descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                if let Some(limit) = overrides.get(i) {
                    return Resolved::Limited {
                        limit,
                        key: counter_key(&limit.domain, &entries),
                        cost: d.hits.unwrap_or(hits),
                        tier: None,
                    };
                }
                match rules.resolve(domain, &entries) {
                    Resolution::NoMatch => Resolved::NoLimit,
                    Resolution::Unlimited(limit) => Resolved::Unlimited(limit),
                    Resolution::Limited {
                        limit,
                        counter_key,
                        tier,
                    } => Resolved::Limited {
                        limit,
                        key: counter_key,
                        cost: d.hits.unwrap_or(hits),
                        tier,
                    },
                }
            })
            .collect();
        // `replaces`: a matched limit removes the limits it names from this request.
        let replaced: Vec<&str> = resolved
            .iter()
            .filter_map(|r| match r {
                Resolved::Unlimited(l) | Resolved::Limited { limit: l, .. } => Some(l),
                Resolved::NoLimit => None,
            })
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        if !replaced.is_empty() {
            for r in &mut resolved {
                let name = match r {
                    Resolved::Unlimited(l) | Resolved::Limited { limit: l, .. } => {
                        l.name.as_deref()
                    }
                    Resolved::NoLimit => None,
                };
                if name.is_some_and(|n| replaced.contains(&n)) {
                    *r = Resolved::NoLimit;
                }
            }
        }
        Self { resolved }
    }

    /// The counters to check, in descriptor order (descriptors without a quota are skipped).
    pub fn items(&self) -> Vec<CheckItem<'_>> {
        self.resolved
            .iter()
            .filter_map(|r| match r {
                Resolved::Limited {
                    limit,
                    key,
                    cost,
                    tier,
                } => limit.quota.as_ref().map(|q| CheckItem {
                    rule: &limit.id,
                    key,
                    quota: q,
                    cost: *cost,
                    // A quota-mode limit that is over does not block the request by itself, so
                    // it must not stop the other counters from counting it either.
                    shadow: limit.shadow_mode || limit.quota_mode,
                    count_denied: limit.count_denied_hits,
                    tier: limit.tiers.as_ref().zip(*tier).map(|(t, index)| Tier {
                        levels: &t.levels,
                        index,
                    }),
                }),
                _ => None,
            })
            .collect()
    }

    /// The counters of this request whose rule has a `queue`, in descriptor order: where the
    /// request waits when they deny it, and where it must wait behind others before deciding.
    /// Empty (no allocation) when the rule set has no queue.
    ///
    /// A request that needs no wait has no spot there: a counter it costs nothing (a query,
    /// `hits_addend: 0`) is skipped, and a request that can never pass (its cost above what a
    /// limit ever admits) has none at all. Both are answered at once, not behind the line.
    pub fn queue_spots(&self) -> Vec<QueueSpot<'r>> {
        let mut spots = Vec::new();
        for (descriptor, r) in self.resolved.iter().enumerate() {
            let Resolved::Limited {
                limit,
                key,
                tier,
                cost,
            } = r
            else {
                continue;
            };
            let blocks = !(limit.shadow_mode || limit.quota_mode);
            if blocks
                && limit
                    .quota
                    .as_ref()
                    .is_some_and(|q| *cost > q.limit().max(q.capacity()))
            {
                return Vec::new();
            }
            let Some(policy) = limit.queue.filter(|_| *cost > 0) else {
                continue;
            };
            spots.push(QueueSpot {
                descriptor,
                limit,
                counter_key: key.clone(),
                policy,
                priority: tier.unwrap_or(crate::rules::LOWEST),
            });
        }
        spots
    }

    /// Combine the store's decisions (one per [`Plan::items`] entry, in order) into a verdict.
    pub fn finish(self, decisions: Vec<Decision>) -> Verdict<'r> {
        let mut decisions = decisions.into_iter();
        let statuses = self
            .resolved
            .into_iter()
            .map(|r| match r {
                Resolved::NoLimit => Status::NoLimit,
                Resolved::Unlimited(l) => Status::Unlimited(l),
                Resolved::Limited { limit, .. } if limit.quota.is_none() => {
                    Status::Unlimited(limit)
                }
                Resolved::Limited { limit, tier, .. } => Status::Limited {
                    limit,
                    decision: decisions.next().unwrap_or_default(),
                    tier,
                },
            })
            .collect();
        Verdict { statuses }
    }
}

/// A counter whose rule has a `queue` ([`Plan::queue_spots`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct QueueSpot<'r> {
    /// The descriptor's index in the request.
    pub descriptor: usize,
    /// The rule.
    pub limit: &'r Limit,
    /// The counter.
    pub counter_key: String,
    /// The rule's queue.
    pub policy: crate::rules::QueuePolicy,
    /// The request's priority on this counter: its tier, [`crate::rules::LOWEST`] without one.
    pub priority: crate::rules::Priority,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, Copy)]
pub enum Status<'r> {
    /// No rule applies: allowed, no limit to report.
    NoLimit,
    /// An `unlimited` rule applies: allowed.
    Unlimited(&'r Limit),
    /// A limit applies.
    Limited {
        /// The rule.
        limit: &'r Limit,
        /// The store's decision for it.
        decision: Decision,
        /// A tiered rule ([`Limit::tiers`]): the request's tier, 0 the highest priority.
        /// `None` for a rule without tiers.
        tier: Option<u8>,
    },
}

impl Status<'_> {
    /// Whether this descriptor is over its limit and reported OVER_LIMIT (denied, not in shadow
    /// mode). It blocks the request, except in quota mode (see [`Verdict::allowed`]).
    pub fn blocks(&self) -> bool {
        matches!(self, Status::Limited { limit, decision, .. } if !decision.allowed && !limit.shadow_mode)
    }

    /// Denied by a shadow-mode limit: reported as OK, counted as such in metrics.
    pub fn shadowed(&self) -> bool {
        matches!(self, Status::Limited { limit, decision, .. } if !decision.allowed && limit.shadow_mode)
    }
}

/// The answer for a whole request.
#[derive(Debug, Clone)]
pub struct Verdict<'r> {
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status<'r>>,
}

impl<'r> Verdict<'r> {
    /// Whether the request may proceed: no limit blocks it, except that limits in `quota_mode`
    /// block only together, as in envoyproxy/ratelimit: the request is denied when a limit not
    /// in quota mode is over, or when it has quota-mode limits and every one of them is over.
    pub fn allowed(&self) -> bool {
        self.allowed_with_quota_mode(false)
    }

    /// [`Verdict::allowed`], with every descriptor in quota mode when `everywhere` (envoyproxy/
    /// ratelimit's global `QUOTA_MODE`: then descriptors without a limit count as passed quota
    /// descriptors, unlimited ones not at all).
    pub fn allowed_with_quota_mode(&self, everywhere: bool) -> bool {
        let (mut quota, mut quota_over) = (0usize, 0usize);
        for s in &self.statuses {
            let in_quota_mode = match s {
                Status::Limited { limit, .. } => everywhere || limit.quota_mode,
                Status::NoLimit => everywhere,
                Status::Unlimited(_) => false,
            };
            match (s.blocks(), in_quota_mode) {
                (true, false) => return false,
                (true, true) => {
                    quota += 1;
                    quota_over += 1;
                }
                (false, true) => quota += 1,
                (false, false) => {}
            }
        }
        quota == 0 || quota_over < quota
    }

    /// The limit that governs the response headers: when denied, the blocking limit with the
    /// longest wait (a limit that can never pass counts as longest); otherwise the (non-shadow)
    /// limit with the least remaining. A `shadowban` limit never governs them: its limit is
    /// never advertised, so that a shadowbanned client's fake success carries what a real one
    /// does (`None` when only `shadowban` limits denied).
    pub fn binding(&self) -> Option<(&'r Limit, Decision)> {
        let limited = self.statuses.iter().filter_map(|s| match s {
            Status::Limited {
                limit, decision, ..
            } if !limit.shadow_mode && !limit.shadowban => Some((*limit, *decision)),
            _ => None,
        });
        if self.allowed() {
            limited.min_by_key(|(_, d)| (d.reported_remaining(), std::cmp::Reverse(d.reset_after)))
        } else {
            limited
                .filter(|(_, d)| !d.allowed)
                .max_by_key(|(_, d)| d.retry_after.map_or(u64::MAX, |r| r))
        }
    }

    /// Longest admitted `delay` (leaky bucket) over all descriptors.
    pub fn delay(&self) -> Micros {
        self.statuses
            .iter()
            .filter_map(|s| match s {
                Status::Limited { decision, .. } if decision.allowed => Some(decision.delay),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
}

/// How a denied request may wait ([`wait_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The descriptor (its index in the request) whose line to wait in: the first that denied.
    pub descriptor: usize,
    /// How long from now until the store may admit it: the longest wait of the limits that
    /// denied it.
    pub retry_after: Micros,
    /// The most it may wait in all, from when it arrived: the smallest `max_wait` of the limits
    /// that denied it.
    pub max_wait: Micros,
    /// The smallest `max_length` of the limits that denied it.
    pub max_length: usize,
}

/// Whether a denied request may wait rather than be refused, and how: every limit that denied
/// it has a `queue`, and each of them can pass it later. `None` for an allowed request, a
/// denial by a limit without `queue`, or one that can never pass. The caller also refuses a
/// denial made because the store was unavailable, and a wait longer than [`Wait::max_wait`].
pub fn wait_for(verdict: &Verdict<'_>) -> Option<Wait> {
    let mut wait: Option<Wait> = None;
    for (i, s) in verdict.statuses.iter().enumerate() {
        if !s.blocks() {
            continue;
        }
        let Status::Limited {
            limit, decision, ..
        } = s
        else {
            return None;
        };
        let policy = limit.queue?;
        let retry = decision.retry_after?;
        let w = wait.get_or_insert(Wait {
            descriptor: i,
            retry_after: 0,
            max_wait: Micros::MAX,
            max_length: usize::MAX,
        });
        w.retry_after = w.retry_after.max(retry);
        w.max_wait = w.max_wait.min(policy.max_wait);
        w.max_length = w.max_length.min(policy.max_length);
    }
    wait
}

/// Check a request against `rules` with a synchronous store ([`LimitOverride`]s are not
/// applied here: use [`Plan::with_overrides`]).
pub fn check<'r>(
    rules: &'r RuleSet,
    store: &dyn Store,
    now: Micros,
    domain: &str,
    descriptors: &[Descriptor],
    hits: u64,
) -> Result<Verdict<'r>, StoreError> {
    let plan = Plan::new(rules, domain, descriptors, hits);
    let items = plan.items();
    let decisions = match items.as_slice() {
        [] => Vec::new(),
        [one] => vec![store.check_one(now, one)?],
        many => store.check(now, many)?,
    };
    debug_assert_eq!(decisions.len(), items.len());
    drop(items);
    Ok(plan.finish(decisions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;
    use crate::MemoryStore;

    const RULES: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window, name: per_user}
    message: slow down
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, replaces: [{name: per_user}]}
  - key: client
    value: internal
    rate_limit: {unlimited: true}
"#;

    #[test]
    fn tiers_reach_the_store_and_the_status() {
        let rules = RuleSet::from_sources(&[(
            "t.yaml".to_string(),
            "domain: api\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}\n    tiers: {key: plan, levels: [{value: paid, guaranteed: 6}, {value: free, guaranteed: 2}]}\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 10}\n".to_string(),
        )])
        .unwrap();
        let descriptors = [
            Descriptor::new([("api", "x"), ("plan", "paid")]),
            Descriptor::new([("api", "x")]),
            Descriptor::new([("user", "u")]),
        ];
        let plan = Plan::new(&rules, "api", &descriptors, 1);
        let items = plan.items();
        let tiers: Vec<Option<u8>> = items.iter().map(|i| i.tier.map(|t| t.index)).collect();
        assert_eq!(tiers, [Some(0), Some(1), None]);
        assert_eq!(items[0].key, "api|api=x");
        assert_eq!(items[1].key, "api|api=x");
        assert_eq!(items[0].tier.map(|t| t.levels.len()), Some(2));
        let verdict = check(&rules, &MemoryStore::default(), 0, "api", &descriptors, 1).unwrap();
        let tiers: Vec<Option<u8>> = verdict
            .statuses
            .iter()
            .map(|s| match s {
                Status::Limited { tier, .. } => *tier,
                _ => panic!("{s:?}"),
            })
            .collect();
        assert_eq!(tiers, [Some(0), Some(1), None]);
    }

    fn rules() -> RuleSet {
        RuleSet::from_sources(&[("api.yaml".into(), RULES.into())]).unwrap()
    }

    fn d(k: &str, v: &str) -> Descriptor {
        Descriptor::new([(k, v)])
    }

    const NOW: Micros = 1_000 * SECOND;

    /// Runs one request with overrides applied; returns (allowed, remaining per descriptor).
    fn check_overridden(
        rules: &RuleSet,
        store: &MemoryStore,
        domain: &str,
        descriptors: &[Descriptor],
    ) -> (bool, Vec<Option<u64>>) {
        let overrides = Overrides::new(rules, domain, descriptors);
        let plan = Plan::with_overrides(rules, &overrides, domain, descriptors, 1);
        let decisions = store.check(NOW, &plan.items()).unwrap();
        let v = plan.finish(decisions);
        let remaining = v
            .statuses
            .iter()
            .map(|s| match s {
                Status::Limited { decision, .. } => Some(decision.remaining),
                _ => None,
            })
            .collect();
        (v.allowed(), remaining)
    }

    #[test]
    fn limit_override_replaces_the_rule_and_adds_limits_in_known_domains_only() {
        let (rules, store) = (rules(), MemoryStore::default());
        let over = |k: &str, v: &str, n: u64| Descriptor {
            limit: Some(LimitOverride {
                requests_per_unit: n,
                unit: Unit::Second,
            }),
            ..d(k, v)
        };
        // The rule says 3/minute; the override 5/second wins.
        let seen: Vec<_> = (0..6)
            .map(|_| check_overridden(&rules, &store, "api", &[over("user", "dave", 5)]))
            .collect();
        assert_eq!(seen[4], (true, vec![Some(0)]));
        assert_eq!(seen[5], (false, vec![Some(0)]));
        // The configured counter was not touched.
        let v = check(&rules, &store, NOW, "api", &[d("user", "dave")], 0).unwrap();
        assert!(
            matches!(v.statuses[0], Status::Limited { decision, .. } if decision.remaining == 3)
        );
        // A descriptor no rule matches is limited by its override; `unlimited` is overridden too.
        assert_eq!(
            check_overridden(&rules, &store, "api", &[over("nothing", "x", 1)]),
            (true, vec![Some(0)])
        );
        assert_eq!(
            check_overridden(&rules, &store, "api", &[over("client", "internal", 0)]),
            (false, vec![Some(0)])
        );
        // Unknown domain: no limit, as without the override. Without `with_overrides`: ignored.
        assert_eq!(
            check_overridden(&rules, &store, "nope", &[over("user", "x", 0)]),
            (true, vec![None])
        );
        let v = check(
            &rules,
            &store,
            NOW,
            "api",
            &[over("client", "internal", 0)],
            1,
        )
        .unwrap();
        assert!(v.allowed());
    }

    #[test]
    fn three_per_minute_then_over_limit() {
        let (rules, store) = (rules(), MemoryStore::default());
        let mut remaining = vec![];
        for _ in 0..4 {
            let v = check(&rules, &store, NOW, "api", &[d("user", "alice")], 1).unwrap();
            let (limit, dec) = v.binding().unwrap();
            assert_eq!(limit.message.as_deref(), Some("slow down"));
            remaining.push((v.allowed(), dec.remaining));
        }
        assert_eq!(
            remaining,
            [(true, 2), (true, 1), (true, 0), (false, 0)],
            "OK, OK, OK, OVER_LIMIT"
        );
    }

    #[test]
    fn denial_by_one_descriptor_consumes_from_none() {
        let (rules, store) = (rules(), MemoryStore::default());
        let both = [d("user", "bob"), d("user", "carol")];
        check(&rules, &store, NOW, "api", &[d("user", "carol")], 3).unwrap();
        let v = check(&rules, &store, NOW, "api", &both, 1).unwrap();
        assert!(!v.allowed());
        let v = check(&rules, &store, NOW, "api", &[d("user", "bob")], 0).unwrap();
        match v.statuses[0] {
            Status::Limited { decision, .. } => assert_eq!(decision.remaining, 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shadow_mode_never_blocks() {
        let (rules, store) = (rules(), MemoryStore::default());
        for i in 0..3 {
            let v = check(&rules, &store, NOW, "api", &[d("tenant", "t1")], 1).unwrap();
            assert!(v.allowed());
            assert_eq!(v.statuses[0].shadowed(), i > 0);
            assert!(v.binding().is_none(), "shadow limits do not drive headers");
        }
    }

    #[test]
    fn replaces_drops_the_named_limit() {
        let (rules, store) = (rules(), MemoryStore::default());
        check(&rules, &store, NOW, "api", &[d("user", "dave")], 3).unwrap();
        // Alone, dave is over his per_user limit; with the vip descriptor it is replaced.
        let v = check(
            &rules,
            &store,
            NOW,
            "api",
            &[d("user", "dave"), d("vip", "dave")],
            1,
        )
        .unwrap();
        assert!(v.allowed());
        assert!(matches!(v.statuses[0], Status::NoLimit));
        assert!(matches!(v.statuses[1], Status::Limited { .. }));
    }

    #[test]
    fn unlimited_and_unmatched_are_allowed_without_state() {
        let (rules, store) = (rules(), MemoryStore::default());
        let v = check(
            &rules,
            &store,
            NOW,
            "api",
            &[d("client", "internal"), d("nope", "x")],
            1_000_000,
        )
        .unwrap();
        assert!(v.allowed());
        assert!(matches!(v.statuses[0], Status::Unlimited(_)));
        assert!(matches!(v.statuses[1], Status::NoLimit));
        let v = check(&rules, &store, NOW, "other-domain", &[d("user", "x")], 1).unwrap();
        assert!(v.allowed() && matches!(v.statuses[0], Status::NoLimit));
        assert!(store.is_empty());
    }

    #[test]
    fn per_descriptor_hits_override_request_hits() {
        let (rules, store) = (rules(), MemoryStore::default());
        let mut heavy = d("user", "erin");
        heavy.hits = Some(3);
        let v = check(&rules, &store, NOW, "api", &[heavy, d("user", "frank")], 1).unwrap();
        let rem: Vec<u64> = v
            .statuses
            .iter()
            .map(|s| match s {
                Status::Limited { decision, .. } => decision.remaining,
                _ => 99,
            })
            .collect();
        assert_eq!(rem, [0, 2]);
    }

    #[test]
    fn binding_picks_longest_retry_when_denied() {
        let (rules, store) = (rules(), MemoryStore::default());
        let v = check(&rules, &store, NOW, "api", &[d("user", "gus")], 4).unwrap();
        assert!(!v.allowed());
        let (_, dec) = v.binding().unwrap();
        assert!(dec.never_passes(), "cost 4 > limit 3 can never pass");
    }

    #[test]
    fn binding_over_several_descriptors_is_longest_retry_or_least_remaining() {
        let rules = RuleSet::from_sources(&[(
            "w.yaml".into(),
            "domain: w\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: gcra}\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: gcra}\n  - key: e\n    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: gcra}\n"
                .into(),
        )])
        .unwrap();
        let store = MemoryStore::default();
        let run = |ds: &[Descriptor]| check(&rules, &store, NOW, "w", ds, 1).unwrap();
        assert!(run(&[d("a", "x")]).allowed());
        assert!(run(&[d("b", "x")]).allowed());
        // a blocks for 1 s, b for an hour, c would pass: the binding limit is b, whatever the
        // order of the descriptors.
        for ds in [
            [d("a", "x"), d("b", "x"), d("c", "x")],
            [d("c", "x"), d("b", "x"), d("a", "x")],
        ] {
            let v = run(&ds);
            assert!(!v.allowed());
            let (limit, dec) = v.binding().unwrap();
            let q = limit.quota.unwrap();
            assert_eq!((q.limit(), q.period().unit), (1, Unit::Hour), "b binds");
            assert_eq!(dec.retry_after, Some(3_600 * SECOND));
        }
        // Allowed: the limit with the least remaining (e: 1 of 2 left; c: 4 of 5).
        let v = run(&[d("c", "y"), d("e", "y")]);
        assert!(v.allowed());
        let (limit, dec) = v.binding().unwrap();
        assert_eq!(
            (limit.quota.unwrap().limit(), dec.remaining),
            (2, 1),
            "e binds"
        );
    }
}
