//! One rate-limit request from rules to verdict, independent of the store and the transport.
//!
//! Checking is split so async stores fit without duplicating the logic: [`Plan::new`] resolves
//! each descriptor against the [`RuleSet`] (applying `replaces`), [`Plan::items`] lists the
//! counters for the store to check all-or-nothing, and [`Plan::finish`] turns the store's
//! decisions into a [`Verdict`]. [`check`] does all three with a synchronous [`Store`].

use crate::clock::Micros;
use crate::decision::Decision;
use crate::rules::{Limit, Resolution, RuleSet};
use crate::store::{CheckItem, Store, StoreError};

/// One descriptor of a request: its entries in order, and an optional cost of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// `(key, value)` entries, in order.
    pub entries: Vec<(String, String)>,
    /// This descriptor's cost; `None` uses the request's.
    pub hits: Option<u64>,
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
    },
}

/// A request resolved against the rules, ready for the store.
#[derive(Debug)]
pub struct Plan<'r> {
    resolved: Vec<Resolved<'r>>,
}

impl<'r> Plan<'r> {
    /// Resolve `descriptors` of `domain`; `hits` is the cost of descriptors without their own.
    pub fn new(rules: &'r RuleSet, domain: &str, descriptors: &[Descriptor], hits: u64) -> Self {
        let mut resolved: Vec<Resolved<'r>> = descriptors
            .iter()
            .map(|d| {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                match rules.resolve(domain, &entries) {
                    Resolution::NoMatch => Resolved::NoLimit,
                    Resolution::Unlimited(limit) => Resolved::Unlimited(limit),
                    Resolution::Limited { limit, counter_key } => Resolved::Limited {
                        limit,
                        key: counter_key,
                        cost: d.hits.unwrap_or(hits),
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
                Resolved::Limited { limit, key, cost } => limit.quota.as_ref().map(|q| CheckItem {
                    rule: &limit.id,
                    key,
                    quota: q,
                    cost: *cost,
                    shadow: limit.shadow_mode,
                }),
                _ => None,
            })
            .collect()
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
                Resolved::Limited { limit, .. } => Status::Limited {
                    limit,
                    decision: decisions.next().unwrap_or_default(),
                },
            })
            .collect();
        Verdict { statuses }
    }
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
    },
}

impl Status<'_> {
    /// Whether this descriptor blocks the request (denied and not in shadow mode).
    pub fn blocks(&self) -> bool {
        matches!(self, Status::Limited { limit, decision } if !decision.allowed && !limit.shadow_mode)
    }

    /// Denied by a shadow-mode limit: reported as OK, counted as such in metrics.
    pub fn shadowed(&self) -> bool {
        matches!(self, Status::Limited { limit, decision } if !decision.allowed && limit.shadow_mode)
    }
}

/// The answer for a whole request.
#[derive(Debug, Clone)]
pub struct Verdict<'r> {
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status<'r>>,
}

impl<'r> Verdict<'r> {
    /// Whether the request may proceed.
    pub fn allowed(&self) -> bool {
        !self.statuses.iter().any(Status::blocks)
    }

    /// The limit that governs the response headers: when denied, the blocking limit with the
    /// longest wait (a limit that can never pass counts as longest); otherwise the (non-shadow)
    /// limit with the least remaining.
    pub fn binding(&self) -> Option<(&'r Limit, Decision)> {
        let limited = self.statuses.iter().filter_map(|s| match s {
            Status::Limited { limit, decision } if !limit.shadow_mode => Some((*limit, *decision)),
            _ => None,
        });
        if self.allowed() {
            limited.min_by_key(|(_, d)| (d.remaining, std::cmp::Reverse(d.reset_after)))
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

/// Check a request against `rules` with a synchronous store.
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

    fn rules() -> RuleSet {
        RuleSet::from_sources(&[("api.yaml".into(), RULES.into())]).unwrap()
    }

    fn d(k: &str, v: &str) -> Descriptor {
        Descriptor::new([(k, v)])
    }

    const NOW: Micros = 1_000 * SECOND;

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
}
