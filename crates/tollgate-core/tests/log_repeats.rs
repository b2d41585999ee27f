//! The memory store's sliding-window logs in multi-item requests (a counter named several
//! times, shadow items, blocked requests, clock steps) decide exactly as the plain per-item
//! evaluation does: each item stepping a copy of the state the items before it left, the
//! request's states kept only when nothing blocks. The store steps a log in place instead of
//! copying it per item; this holds it to the copying model.

use proptest::prelude::*;
use std::collections::HashMap;
use tollgate_core::clock::SECOND;
use tollgate_core::internals::{self, State};
use tollgate_core::{
    Algorithm, CheckItem, Decision, MemoryStore, Micros, Period, Quota, Store, Unit,
};

/// 2026-11-22T00:00:00Z.
const BASE: Micros = 1_795_305_600 * SECOND;

/// One item: key index, quota index, cost, shadow.
type Item = (usize, usize, u64, bool);

/// The plain model: per-item copies, committed in order when nothing blocks (a request of one
/// item keeps its step's result).
fn model(
    states: &mut HashMap<usize, State>,
    quotas: &[Quota],
    now: Micros,
    items: &[Item],
) -> Vec<Decision> {
    if let [(k, q, cost, _)] = *items {
        // One item: stepped in place, the result (clamped even when denied) kept.
        let (d, next) = internals::step(states.remove(&k), now, cost, &quotas[q]);
        if let Some(s) = next {
            states.insert(k, s);
        }
        return vec![d];
    }
    let mut pending: Vec<(usize, Option<State>)> = Vec::new();
    let mut ds = Vec::new();
    for &(k, q, cost, _) in items {
        let current = match pending.iter().rev().find(|(pk, _)| *pk == k) {
            Some((_, s)) => s.clone(),
            None => states.get(&k).cloned(),
        };
        let (d, next) = internals::step(current, now, cost, &quotas[q]);
        pending.push((k, next));
        ds.push(d);
    }
    let blocked = items.iter().zip(&ds).any(|(i, d)| !i.3 && !d.allowed);
    for (i, &(k, q, cost, _)) in items.iter().enumerate() {
        if ds[i].allowed && cost > 0 && blocked {
            ds[i] = internals::step(states.get(&k).cloned(), now, 0, &quotas[q]).0;
        }
    }
    for (i, &(k, q, _, _)) in items.iter().enumerate() {
        if ds[i].allowed && !blocked {
            match pending[i].1.clone() {
                Some(s) => states.insert(k, s),
                None => states.remove(&k),
            };
        } else if let Some(s) = states.get(&k) {
            if let Some(c) = internals::clamp(s, now, &quotas[q]) {
                match internals::step(Some(c), now, 0, &quotas[q]).1 {
                    Some(s) => states.insert(k, s),
                    None => states.remove(&k),
                };
            }
        }
    }
    ds
}

fn trace() -> impl Strategy<Value = (Vec<Quota>, Vec<(i64, Vec<Item>)>)> {
    let quotas = prop::collection::vec(0u64..8, 2).prop_map(|ls| {
        ls.into_iter()
            .map(|l| {
                Quota::new(l, Period::new(Unit::Minute, 1))
                    .with_algorithm(Algorithm::SlidingWindowLog)
            })
            .collect::<Vec<_>>()
    });
    let step = (
        prop_oneof![
            4 => 0i64..20,
            2 => 0i64..90,
            1 => -90i64..0,
        ],
        prop::collection::vec(
            (0usize..2, 0usize..2, 0u64..5, prop::bool::weighted(0.2)),
            1..5,
        ),
    );
    (quotas, prop::collection::vec(step, 1..40))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn repeated_log_counters_decide_as_per_item_copies((quotas, steps) in trace()) {
        let store = MemoryStore::with_seed(1_000, 7, 11);
        let mut states = HashMap::new();
        let keys = ["a", "b"];
        let mut t = BASE as i64;
        for (dt, items) in steps {
            t += dt * SECOND as i64;
            let now = t as Micros;
            let check: Vec<CheckItem<'_>> = items
                .iter()
                .map(|&(k, q, cost, shadow)| CheckItem {
                    cost,
                    shadow,
                    ..CheckItem::hit("r", keys[k], &quotas[q])
                })
                .collect();
            let got = store.check(now, &check).unwrap();
            let want = model(&mut states, &quotas, now, &items);
            prop_assert_eq!(got, want, "at {} items {:?}", now, items);
        }
    }
}
