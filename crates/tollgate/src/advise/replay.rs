//! The traffic replayed through a rules file: `simulate`'s engine ([`Replay`]) on a manual
//! clock at each line's time, once with the rules as written and once per other algorithm
//! (each on a store of its own), counting per rule what would be denied and whom.
//!
//! A log line becomes descriptors through the domain's `http` section (the same actions
//! forward-auth and the middleware evaluate); a CSV trace line carries its own.

use super::parse::Record;
use crate::simulate::Replay;
use anyhow::bail;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use std::collections::{HashMap, HashSet};
use tollgate_core::limiter::{Descriptor, Plan};
use tollgate_core::request::RequestParts;
use tollgate_core::{Algorithm, RuleSet};

/// The algorithms a rule is compared under.
pub(crate) const COMPARED: [Algorithm; 6] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
];

/// Counts over time with a resolution that doubles (neighbouring bins merged) whenever the
/// span outgrows [`Timeline::BINS`] bins: fixed memory for any span.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub t0: Option<u64>,
    pub res_us: u64,
    pub bins: Vec<[u64; 2]>,
}

impl Timeline {
    pub(crate) const BINS: usize = 240;

    pub(crate) fn new() -> Self {
        Timeline {
            t0: None,
            res_us: 1_000_000,
            bins: Vec::new(),
        }
    }

    /// Add `v` to column `col` at time `t`.
    pub(crate) fn add(&mut self, t: u64, col: usize, v: u64) {
        let t0 = *self.t0.get_or_insert(t);
        let mut i = (t.saturating_sub(t0) / self.res_us) as usize;
        while i >= Self::BINS {
            self.res_us *= 2;
            let merged: Vec<[u64; 2]> = self
                .bins
                .chunks(2)
                .map(|c| [c.iter().map(|b| b[0]).sum(), c.iter().map(|b| b[1]).sum()])
                .collect();
            self.bins = merged;
            i = (t.saturating_sub(t0) / self.res_us) as usize;
        }
        if self.bins.len() <= i {
            self.bins.resize(i + 1, [0, 0]);
        }
        self.bins[i][col] += v;
    }
}

/// What one rule did (or would do under another algorithm).
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub denied: u64,
    /// Distinct counters (clients as the rule sees them: `domain|key=value`) denied at least
    /// once, up to the cap; `denied_clients_capped` says whether the cap was reached.
    pub denied_clients: HashSet<String>,
    pub denied_clients_capped: bool,
    /// Admitted (column 0) and denied (column 1) over time.
    pub timeline: Timeline,
}

impl Outcome {
    fn new(algorithm: Algorithm) -> Self {
        Outcome {
            algorithm,
            requests: 0,
            denied: 0,
            denied_clients: HashSet::new(),
            denied_clients_capped: false,
            timeline: Timeline::new(),
        }
    }
}

/// One rule: as written first, then under each other compared algorithm.
#[derive(Debug, Clone)]
pub(crate) struct RuleReport {
    pub id: String,
    pub outcomes: Vec<Outcome>,
}

pub(crate) struct Replayer {
    rules: RuleSet,
    /// The store of the rules as written, then one per compared algorithm.
    stores: Vec<(Option<Algorithm>, Replay)>,
    tally: Tally,
    headers: HeaderMap,
}

/// The counts per rule.
struct Tally {
    reports: Vec<RuleReport>,
    by_id: HashMap<String, usize>,
    max_clients: usize,
    unmatched: u64,
}

impl Replayer {
    pub(crate) fn new(
        rules: RuleSet,
        compare: bool,
        max_clients: usize,
        csv: bool,
    ) -> anyhow::Result<Self> {
        if !csv && !rules.domains().any(|d| d.http().is_some()) {
            bail!(
                "no domain of the rules has an `http` section: advise derives a log line's \
                 descriptors with it (see docs/gateways.md), or give a CSV trace"
            );
        }
        let mut stores = vec![(None, Replay::memory())];
        if compare {
            stores.extend(COMPARED.iter().map(|&a| (Some(a), Replay::memory())));
        }
        Ok(Replayer {
            rules,
            stores,
            tally: Tally {
                reports: Vec::new(),
                by_id: HashMap::new(),
                max_clients,
                unmatched: 0,
            },
            headers: HeaderMap::new(),
        })
    }

    /// Per rule, in the order first met.
    pub(crate) fn reports(&self) -> &[RuleReport] {
        &self.tally.reports
    }

    /// Descriptors no rule limits (under the rules as written).
    pub(crate) fn unmatched(&self) -> u64 {
        self.tally.unmatched
    }

    /// Decide `r` under every store.
    pub(crate) fn add(&mut self, r: &Record<'_>) -> anyhow::Result<()> {
        if let Some(ev) = r.event {
            let descriptors = std::slice::from_ref(&ev.descriptor);
            return decide(
                &self.rules,
                &mut self.stores,
                &mut self.tally,
                r.t_us,
                &ev.domain,
                descriptors,
                ev.hits,
            );
        }
        self.headers.clear();
        for (n, v) in r.headers() {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                self.headers.append(n, v);
            }
        }
        let parts = RequestParts {
            method: Some(r.method).filter(|m| !m.is_empty()),
            path: Some(r.path).filter(|m| !m.is_empty()),
            authority: Some(r.host).filter(|m| !m.is_empty()),
            headers: &self.headers,
            remote_address: r.ip.parse().ok(),
        };
        for d in self.rules.domains() {
            let Some(http) = d.http() else { continue };
            let descriptors: Vec<Descriptor> = http
                .descriptors(&parts)
                .into_iter()
                .map(Descriptor::from)
                .collect();
            if !descriptors.is_empty() {
                let (rules, stores, tally) = (&self.rules, &mut self.stores, &mut self.tally);
                decide(rules, stores, tally, r.t_us, &d.name, &descriptors, 1)?;
            }
        }
        Ok(())
    }
}

/// Decide one request under every store and count the outcome per rule.
fn decide(
    rules: &RuleSet,
    stores: &mut [(Option<Algorithm>, Replay)],
    t: &mut Tally,
    t_us: u64,
    domain: &str,
    descriptors: &[Descriptor],
    hits: u64,
) -> anyhow::Result<()> {
    // Planned once; each store decides the same counters (under its algorithm).
    let plan = Plan::new(rules, domain, descriptors, hits);
    let items = plan.items();
    t.unmatched += (descriptors.len() - items.len()) as u64;
    let n_stores = stores.len();
    for (s, (alg, store)) in stores.iter_mut().enumerate() {
        let decisions = store.check_as(t_us, &items, *alg)?;
        for (item, decision) in items.iter().zip(&decisions) {
            let idx = match t.by_id.get(item.rule) {
                Some(&i) => i,
                None => {
                    let mut outcomes = vec![Outcome::new(item.quota.algorithm())];
                    if n_stores > 1 {
                        outcomes.extend(COMPARED.iter().map(|&a| Outcome::new(a)));
                    }
                    t.reports.push(RuleReport {
                        id: item.rule.to_owned(),
                        outcomes,
                    });
                    t.by_id.insert(item.rule.to_owned(), t.reports.len() - 1);
                    t.reports.len() - 1
                }
            };
            let o = &mut t.reports[idx].outcomes[s];
            o.requests += item.cost;
            let denied = !decision.allowed && !item.shadow;
            o.timeline.add(t_us, usize::from(denied), item.cost);
            if denied {
                o.denied += item.cost;
                if !o.denied_clients.contains(item.key) {
                    if o.denied_clients.len() < t.max_clients {
                        o.denied_clients.insert(item.key.to_owned());
                    } else {
                        o.denied_clients_capped = true;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timelines_merge_bins_and_keep_totals() {
        let mut t = Timeline::new();
        for s in 0..1000u64 {
            t.add(s * 1_000_000, 0, 1);
            t.add(s * 1_000_000, 1, 2);
        }
        assert!(t.bins.len() <= Timeline::BINS);
        assert_eq!(t.res_us, 8_000_000);
        assert_eq!(t.bins.iter().map(|b| b[0]).sum::<u64>(), 1000);
        assert_eq!(t.bins.iter().map(|b| b[1]).sum::<u64>(), 2000);
    }
}
