//! Priority tiers sharing one limit: one pure step over a parent counter and its tiers' counts.
//!
//! A tiered limit (docs/rules.md, "Tiers") keeps, under one key, one count per tier in the
//! windows of its algorithm (fixed window, or sliding window counter: the previous window's
//! count and the current one's per tier). The parent's count is the algorithm's count of the
//! tiers' sums, so one state and one step decide parent and tier together, atomically wherever
//! the store steps one key atomically.
//!
//! With limit `L`, level `u` guaranteed `g_u`, ceiling `c_u`, reserve `r_u`, counts `C_u` and
//! parent count `P`, a request of cost `n` in tier `t` is:
//! 1. denied if `C_t + n > c_t` (the ceiling);
//! 2. denied if `P + n > L` (the parent);
//! 3. allowed if `C_t + n <= g_t` (within the guarantee);
//! 4. else (borrowing) allowed iff `P + n + S_t + r_t <= L`, where
//!    `S_t = sum over u != t of max(0, g_u - C_u)` is the other tiers' unused guarantees.
//!
//! **Invariant**: `I = sum over u of max(C_u, g_u) <= L` after every step, so the parent is
//! never over its limit and every tier's unused guarantee is always there for it. Proof:
//! - at first every count is 0 and `I = sum g_u <= L` (the rules refuse more);
//! - time only lowers counts (a fixed window drops to 0; a sliding window's weighted previous
//!   count decays and, at a window boundary, the current count becomes the previous one at full
//!   weight), and `max(C_u, g_u)` does not rise when `C_u` falls;
//! - a denial or a query changes nothing;
//! - case 3 raises `C_t` to at most `g_t`: `max(C_t, g_t)` stays `g_t`;
//! - case 4 leaves `C_t + n > g_t`, so `I' = C_t + n + sum_{u != t} max(C_u, g_u)
//!   = C_t + n + sum_{u != t} C_u + S_t <= P + n + S_t <= L - r_t`, because the parent's count
//!   is at least the sum of the tiers' (the same weighted sum, rounded down once instead of
//!   once per tier: `floor(sum) >= sum of floors`).
//!
//! The proptest in this module's tests checks it on random schedules.
//!
//! The decision speaks for the request's tier: `limit` is the tier's ceiling, `remaining` how
//! many more units the tier could take now (the least of what each rule leaves it).
//! `reset_after` is the parent's (when the whole state is back to empty). A denial's
//! `retry_after` is the algorithm's for the constraint that binds: the latest of the ceiling's
//! and the parent's, and the sooner of the guarantee's and the borrowing rule's (that rule's
//! limit taken as it stands: other tiers' counts decaying can make it later under the sliding
//! window counter). `None` when the request can never pass: its cost is above the ceiling, or
//! above both the guarantee and what borrowing can ever reach (`L - sum_{u != t} g_u - r_t`).
//!
//! Time steps are handled as in the algorithm's own step: a state in the next window is decided
//! as at that window's start, one further ahead is clamped to the next window ([`clamp`]).

use super::sliding_counter::{decide, weighted};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};
use crate::rules::TierLevel;
use crate::window::{previous_start, window};

/// A tiered limit's state: the counts of each tier (in level order) in the window starting at
/// `start` (`cur`) and in the one before (`prev`, always zero under a fixed window).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tiered {
    /// Start of the current window.
    pub start: Micros,
    /// Each tier's count in the previous window.
    pub prev: Vec<u64>,
    /// Each tier's count in the current window.
    pub cur: Vec<u64>,
}

/// `state` with a start beyond the window after `now`'s clamped to that next window; `None`
/// when it is not that far ahead.
pub fn clamp(state: &Tiered, now: Micros, quota: &Quota) -> Option<Tiered> {
    if state.start <= now {
        return None;
    }
    let next = window(quota.period(), now).1;
    (state.start > next).then(|| Tiered {
        start: next,
        ..state.clone()
    })
}

/// The state as seen at `now` for `levels` tiers: windows rolled forward (a fixed window keeps
/// no previous count), a state of another number of tiers read as empty (the rule changed),
/// and a state ahead of `now` decided at its window's start. Returns (now, start, end, state).
fn roll(
    state: Option<Tiered>,
    now: Micros,
    quota: &Quota,
    levels: usize,
) -> (Micros, Micros, Micros, Tiered) {
    let period = quota.period();
    let sliding = quota.algorithm() == Algorithm::SlidingWindowCounter;
    let (ws, we) = window(period, now);
    let empty = |start| Tiered {
        start,
        prev: vec![0; levels],
        cur: vec![0; levels],
    };
    let Some(mut s) = state.filter(|s| s.prev.len() == levels && s.cur.len() == levels) else {
        return (now, ws, we, empty(ws));
    };
    if !sliding {
        s.prev.iter_mut().for_each(|p| *p = 0);
    }
    if s.start == ws {
        (now, ws, we, s)
    } else if s.start > ws {
        let at = s.start.min(we);
        let (ws, we) = window(period, at);
        s.start = ws;
        (at, ws, we, s)
    } else if sliding && s.start == previous_start(period, ws) {
        let cur = std::mem::replace(&mut s.cur, vec![0; levels]);
        s.prev = cur;
        s.start = ws;
        (now, ws, we, s)
    } else {
        (now, ws, we, empty(ws))
    }
}

/// The counts at `now` (within `[start, end)`): each tier's, and the parent's.
fn counts(s: &Tiered, now: Micros, start: Micros, end: Micros, sliding: bool) -> (Vec<u64>, u64) {
    let w = |prev: u64| {
        if sliding {
            weighted(prev, now, start, end)
        } else {
            0
        }
    };
    let tiers = s.prev.iter().zip(&s.cur).map(|(p, c)| w(*p) + c).collect();
    let parent = w(s.prev.iter().sum()) + s.cur.iter().sum::<u64>();
    (tiers, parent)
}

/// The most tier `t` could take now: the least that the ceiling, the parent and the better of
/// the guarantee and borrowing leave it.
fn room(levels: &[TierLevel], t: usize, limit: u64, c: &[u64], parent: u64) -> u64 {
    let lv = &levels[t];
    let others: u64 = c
        .iter()
        .zip(levels)
        .enumerate()
        .filter(|(u, _)| *u != t)
        .map(|(_, (cu, l))| l.guaranteed.saturating_sub(*cu))
        .sum();
    let ceiling = lv.ceiling.min(limit).saturating_sub(c[t]);
    let free = limit.saturating_sub(parent);
    let guaranteed = lv.guaranteed.saturating_sub(c[t]);
    let borrow = limit
        .saturating_sub(parent)
        .saturating_sub(others)
        .saturating_sub(lv.reserve);
    ceiling.min(free).min(guaranteed.max(borrow))
}

/// One step for a request of cost `cost` in tier `tier` of `levels`. `state` is `None` when
/// nothing is counted; the returned state is `None` when it is back to that. A tier index past
/// the last level is the last level.
pub fn step(
    state: Option<Tiered>,
    now: Micros,
    cost: u64,
    quota: &Quota,
    levels: &[TierLevel],
    tier: u8,
) -> (Decision, Option<Tiered>) {
    let sliding = quota.algorithm() == Algorithm::SlidingWindowCounter;
    if levels.is_empty() {
        let d = Decision {
            limit: 0,
            retry_after: None,
            ..Decision::default()
        };
        return (d, state);
    }
    let t = usize::from(tier).min(levels.len() - 1);
    let (now, start, end, mut s) = roll(state, now, quota, levels.len());
    let limit = quota.limit();
    let lv = &levels[t];
    let ceiling = lv.ceiling.min(limit);
    let (c, parent) = counts(&s, now, start, end, sliding);
    let room_before = room(levels, t, limit, &c, parent);
    let allowed = cost <= room_before;
    if allowed {
        s.cur[t] += cost;
    }
    let next_end = window(quota.period(), end).1;
    let (prev_sum, cur_sum) = (s.prev.iter().sum::<u64>(), s.cur.iter().sum::<u64>());
    let reset_after = if cur_sum > 0 {
        if sliding {
            next_end - now
        } else {
            end - now
        }
    } else if prev_sum > 0 {
        end - now
    } else {
        0
    };
    let mut d = Decision {
        allowed,
        limit: ceiling,
        remaining: if allowed {
            room_before - cost
        } else {
            room_before
        },
        reset_after,
        retry_after: None,
        delay: 0,
        count: None,
    };
    if !allowed {
        let others_guaranteed: u64 = levels
            .iter()
            .enumerate()
            .filter(|(u, _)| *u != t)
            .map(|(_, l)| l.guaranteed)
            .sum();
        let reach = limit
            .saturating_sub(others_guaranteed)
            .saturating_sub(lv.reserve)
            .max(lv.guaranteed.min(ceiling));
        if cost <= ceiling && cost <= reach {
            let (prev_t, cur_t) = (s.prev[t], s.cur[t]);
            // When a counter of `prev`/`cur` under `cap` admits `cost` (`None`: now; `MAX`:
            // never, as far as this counter goes).
            let wait = |cap: u64, prev: u64, cur: u64| -> Micros {
                if sliding {
                    let d = decide(quota.period(), cap, now, start, end, prev, cur, cost);
                    if d.allowed {
                        0
                    } else {
                        d.retry_after.unwrap_or(Micros::MAX)
                    }
                } else if cur + cost <= cap {
                    0
                } else if cost <= cap {
                    end - now
                } else {
                    Micros::MAX
                }
            };
            let others: u64 = c
                .iter()
                .zip(levels)
                .enumerate()
                .filter(|(u, _)| *u != t)
                .map(|(_, (cu, l))| l.guaranteed.saturating_sub(*cu))
                .sum();
            let borrow_cap = limit.saturating_sub(others).saturating_sub(lv.reserve);
            let binding = wait(ceiling, prev_t, cur_t).max(wait(limit, prev_sum, cur_sum));
            let either =
                wait(lv.guaranteed, prev_t, cur_t).min(wait(borrow_cap, prev_sum, cur_sum));
            let at = binding.max(either);
            // The request can pass at the latest once the window is empty again: bounded by
            // the algorithm's reset (two windows for the sliding counter).
            let bound = if sliding { next_end - now } else { end - now };
            d.retry_after = Some(at.min(bound).max(1));
        }
    }
    let empty = s.prev.iter().chain(&s.cur).all(|n| *n == 0);
    (d, (!empty).then_some(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;
    use crate::quota::Unit;
    use proptest::prelude::*;

    const T0: Micros = 1_700_000_000 * SECOND;

    fn paid_free() -> Vec<TierLevel> {
        vec![
            TierLevel::new("paid", 60, 100, 0),
            TierLevel::new("free", 10, 80, 20),
        ]
    }

    fn q(alg: Algorithm) -> Quota {
        Quota::new(100, Unit::Second).with_algorithm(alg)
    }

    /// Runs `hits` (tier, cost) at `now`, returning the admitted cost per tier.
    fn run(
        state: &mut Option<Tiered>,
        now: Micros,
        quota: &Quota,
        levels: &[TierLevel],
        hits: &[(u8, u64)],
    ) -> Vec<u64> {
        let mut admitted = vec![0; levels.len()];
        for &(t, n) in hits {
            let (d, next) = step(state.take(), now, n, quota, levels, t);
            *state = next;
            if d.allowed {
                admitted[usize::from(t)] += n;
            }
        }
        admitted
    }

    #[test]
    fn worked_example() {
        let levels = paid_free();
        let quota = q(Algorithm::FixedWindow);
        let mut s = None;
        // Free alone: up to its ceiling of 80? No: it borrows only while more than its reserve
        // of 20 and paid's unused 60 remain: 10 guaranteed + (100 - 60 - 20 - 10) = 20.
        assert_eq!(run(&mut s, T0, &quota, &levels, &[(1, 1); 100]), [0, 20]);
        // Paid still has its 60 and borrows up to the limit.
        assert_eq!(run(&mut s, T0, &quota, &levels, &[(0, 1); 100]), [80, 0]);
        let (d, _) = step(s.clone(), T0, 0, &quota, &levels, 0);
        assert_eq!((d.allowed, d.remaining, d.limit), (true, 0, 100));
        let (d, _) = step(s.clone(), T0, 1, &quota, &levels, 1);
        assert_eq!((d.allowed, d.remaining, d.limit), (false, 0, 80));
        assert_eq!(d.retry_after, Some(SECOND));
        // The next window starts afresh.
        let (d, s2) = step(s, T0 + SECOND, 1, &quota, &levels, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 19);
        assert_eq!(s2.map(|s| s.cur), Some(vec![0, 1]));
    }

    #[test]
    fn ceiling_and_never() {
        let levels = vec![
            TierLevel::new("a", 10, 100, 0),
            TierLevel::new("b", 0, 30, 0),
        ];
        let quota = q(Algorithm::FixedWindow);
        let mut s = None;
        assert_eq!(run(&mut s, T0, &quota, &levels, &[(1, 1); 50]), [0, 30]);
        let (d, _) = step(None, T0, 31, &quota, &levels, 1);
        assert_eq!((d.allowed, d.retry_after), (false, None));
        // Above what borrowing can ever reach (100 - 10 guaranteed to a) and its guarantee.
        let levels = vec![
            TierLevel::new("a", 10, 100, 0),
            TierLevel::new("b", 0, 100, 0),
        ];
        let (d, _) = step(None, T0, 91, &quota, &levels, 1);
        assert_eq!((d.allowed, d.retry_after), (false, None));
        let (d, _) = step(None, T0, 90, &quota, &levels, 1);
        assert!(d.allowed);
    }

    #[test]
    fn sliding_counts_decay_for_parent_and_tiers() {
        let levels = paid_free();
        let quota = q(Algorithm::SlidingWindowCounter);
        let mut s = None;
        // Paid alone leaves free its guarantee of 10.
        assert_eq!(run(&mut s, T0, &quota, &levels, &[(0, 1); 100]), [90, 0]);
        // Half way through the next window the previous 90 weigh 45 (paid's count and the
        // parent's), so free may borrow while 45 + n + (60 - 45) + 20 <= 100: 20.
        let half = T0 + SECOND + SECOND / 2;
        assert_eq!(run(&mut s, half, &quota, &levels, &[(1, 1); 100]), [0, 20]);
        let (d, _) = step(s.clone(), half, 1, &quota, &levels, 1);
        assert!(!d.allowed);
        assert!(d.retry_after.is_some_and(|r| r > 0 && r <= 2 * SECOND));
    }

    #[test]
    fn clock_back_and_clamp() {
        let levels = paid_free();
        let quota = q(Algorithm::FixedWindow);
        let (_, s) = step(None, T0 + SECOND, 5, &quota, &levels, 0);
        // Half a second earlier: decided in the state's window, as at its start.
        let (d, s) = step(s, T0 + SECOND / 2, 1, &quota, &levels, 0);
        assert!(d.allowed);
        assert_eq!(
            s.as_ref().map(|s| (s.start, s.cur[0])),
            Some((T0 + SECOND, 6))
        );
        let far = Tiered {
            start: T0 + 100 * SECOND,
            prev: vec![0, 0],
            cur: vec![3, 0],
        };
        let c = clamp(&far, T0, &quota).expect("clamped");
        assert_eq!(c.start, T0 + SECOND);
        assert_eq!(clamp(&c, T0, &quota), None);
    }

    fn levels_strategy() -> impl Strategy<Value = (u64, Vec<TierLevel>)> {
        (1u64..200, 1usize..5).prop_flat_map(|(limit, n)| {
            let level = (0u64..=limit, 0u64..=limit, 0u64..=limit);
            (Just(limit), prop::collection::vec(level, n)).prop_map(|(limit, raw)| {
                // Guarantees scaled down to add up to at most the limit; ceilings at least
                // the guarantee; no reserve on the first level (what the rules enforce).
                let total: u64 = raw.iter().map(|(g, _, _)| *g).sum::<u64>().max(1);
                let levels = raw
                    .iter()
                    .enumerate()
                    .map(|(i, (g, c, r))| {
                        let g = if total > limit { g * limit / total } else { *g };
                        let r = if i == 0 { 0 } else { *r };
                        TierLevel::new(format!("t{i}"), g, (*c).max(g), r)
                    })
                    .collect();
                (limit, levels)
            })
        })
    }

    proptest! {
        #[test]
        fn invariant_holds(
            (limit, levels) in levels_strategy(),
            sliding: bool,
            hits in prop::collection::vec((0u8..6, 0u64..40, 0u64..300_000), 1..200),
        ) {
            let alg = if sliding { Algorithm::SlidingWindowCounter } else { Algorithm::FixedWindow };
            let quota = Quota::new(limit, Unit::Second).with_algorithm(alg);
            let mut state = None;
            let mut now = T0;
            for (t, n, dt) in hits {
                now += dt;
                let before = state.clone();
                let (d, next) = step(state.take(), now, n, &quota, &levels, t);
                if !d.allowed {
                    // A denial consumes nothing (the state may only roll).
                    let (_, q) = step(before, now, 0, &quota, &levels, t);
                    prop_assert_eq!(&next, &q);
                }
                let tier = usize::from(t).min(levels.len() - 1);
                prop_assert_eq!(d.limit, levels[tier].ceiling);
                if let Some(s) = &next {
                    let (now, start, end, s) = roll(Some(s.clone()), now, &quota, levels.len());
                    let (c, parent) = counts(&s, now, start, end, sliding);
                    let held: u64 = c.iter().zip(&levels).map(|(cu, l)| (*cu).max(l.guaranteed)).sum();
                    prop_assert!(held <= limit, "sum max(C, g) = {} > {}", held, limit);
                    prop_assert!(parent <= limit);
                    for (cu, l) in c.iter().zip(&levels) {
                        prop_assert!(*cu <= l.ceiling);
                    }
                    // Remaining is exactly what the tier can still take.
                    let (q, _) = step(Some(s.clone()), now, d.remaining, &quota, &levels, t);
                    prop_assert!(q.allowed || d.remaining == 0);
                    let (q, _) = step(Some(s), now, d.remaining + 1, &quota, &levels, t);
                    prop_assert!(!q.allowed);
                }
                state = next;
            }
        }
    }
}
