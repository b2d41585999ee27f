//! Quota leases (`sync: lease`): exact global limits with local decisions.
//!
//! An instance asks Redis, in the call that decides a request, for a few more units of a
//! window's count than the request costs; Redis counts them at once (as if admitted) and the
//! instance spends them locally until they run out or the window ends. So the fleet never admits
//! more than the limit: every unit admitted anywhere was counted in Redis first, in the window it
//! is admitted in. Units an instance holds but does not spend are given back (a refund in the
//! same window) when the instance goes idle and at shutdown; those still held when the window
//! ends are lost with it (under-admission, never over-admission).
//!
//! Sizes adapt: a lease that runs out within [`QUICK`] of being taken doubles the next one (up to
//! [`MAX_WANT`]), one that lasted longer than four times that halves it, so a busy instance calls
//! Redis about every [`QUICK`] whatever its rate. Redis grants at most an eighth of what the
//! window has left (check.lua's `LEASE_SHARE`), so the last units of a window go out one
//! request at a time, decided by Redis.
//!
//! A denial Redis reports for a leased limit is answered locally for at most [`DENIED_FOR`] (or
//! until its retry time, if sooner): no Redis call per denied request, and units other instances
//! give back are found within that time.
//!
//! Only windowed algorithms can be leased (see [`SyncMode::supports`]); a request is decided
//! locally only when every item is leased and has enough units in hand, so all-or-nothing across
//! a request's limits holds as on Redis.
//!
//! A tiered limit is leased per (parent counter, tier): a grant is at most an eighth of what the
//! request's tier could still take after it (its decision's `remaining`), counted at once on the
//! tier's count and so on the parent's, which is their sum; a refund takes it off the tier's.
//! Each tier has its own lease (the map key names it), so one tier never spends another's units.
//! Granted units are admitted units of their tier, as far as the tiered step can tell: so the
//! rules' invariant, the tiers' counts or guarantees (whichever is larger) adding up to at most
//! the limit, holds with leases as without, and no grant takes any part of another tier's
//! unused guarantee or of the reserve kept above the tier (see `tiers.rs` in tollgate-core).

use crate::counter::{map_key, repeats};
use crate::limits::LimitStats;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use tollgate_core::internals::window;
use tollgate_core::rules::TierLevel;
use tollgate_core::store::Tier;
use tollgate_core::{Algorithm, CheckItem, Decision, Micros, Quota, SyncMode};

/// A lease that ran out within this long of being taken doubles the next one.
pub const QUICK: Micros = 50_000;
/// The most units one lease asks for beyond the request's cost.
pub const MAX_WANT: u64 = 100_000;
/// A denial Redis reported is answered locally for at most this long.
pub const DENIED_FOR: Micros = 250_000;
/// Units in hand unused for this long go back to Redis.
pub const IDLE: Micros = 500_000;
/// Leases kept at most (beyond it, new counters are decided by Redis, exact as ever).
const MAX_LEASES: usize = 100_000;

/// One counter's lease.
#[derive(Debug, Clone)]
struct Lease {
    /// The item's limit, counter key and quota (to give units back).
    rule: String,
    key: String,
    quota: Quota,
    /// A tiered limit's levels and the lease's tier (a refund is the tier's).
    tier: Option<(Vec<TierLevel>, u8)>,
    /// Redis' time of the last grant: inside the lease's window (a refund must name it).
    at: Micros,
    /// The start of that window (Redis time).
    start: Micros,
    /// Local time at which the lease's window ends, at the earliest: the call's start plus
    /// what Redis had left of the window when it answered (Redis answered after the call
    /// started, so the window cannot end sooner).
    expires: Micros,
    /// Units in hand.
    left: u64,
    /// What Redis reported the fleet had left after the last grant.
    remaining: u64,
    /// Local time at which the counter is full again (for `reset_after`).
    reset_at: Micros,
    /// Units to ask for beyond a request's cost.
    want: u64,
    /// Local time of the last grant and of the last local decision.
    granted_at: Micros,
    used_at: Micros,
    /// A denial answered locally until this local time (0: none), and its decision.
    denied_until: Micros,
    denial: Decision,
    /// The cost Redis denied (a smaller one may pass: it goes to Redis) and the local time at
    /// which Redis said it could pass (`None`: never), for the `retry_after` of local answers.
    denied_cost: u64,
    retry_at: Option<Micros>,
    /// Local time the denial was learned.
    denied_at: Micros,
}

/// Counters of what leases did (`tollgate_lease_*`).
#[derive(Debug, Default)]
pub struct LeaseStats {
    /// Grants received from Redis.
    pub grants: AtomicU64,
    /// Units granted.
    pub units_granted: AtomicU64,
    /// Units given back to Redis (idle, shutdown).
    pub units_returned: AtomicU64,
    /// Units lost when their window ended before they were spent.
    pub units_expired: AtomicU64,
    /// Requests decided from leases without Redis (admitted or denied).
    pub local_decisions: AtomicU64,
}

/// The leases of one store.
#[derive(Debug, Default)]
pub struct Leases {
    map: Mutex<HashMap<String, Lease>>,
    /// What the leases did.
    pub stats: LeaseStats,
}

/// Units to give back to Redis: (limit, counter key, quota, Redis time inside their window,
/// units, a tiered limit's levels and tier).
pub type Returns = Vec<(
    String,
    String,
    Quota,
    Micros,
    u64,
    Option<(Vec<TierLevel>, u8)>,
)>;

/// The item to refund `units` of a lease on `key` with: its tier's, for a tiered limit.
pub(crate) fn refund_item<'a>(
    key: &'a str,
    quota: &'a Quota,
    units: u64,
    tier: Option<&'a (Vec<TierLevel>, u8)>,
) -> CheckItem<'a> {
    CheckItem {
        cost: units,
        tier: tier.map(|(levels, index)| Tier {
            levels,
            index: *index,
        }),
        ..CheckItem::hit("", key, quota)
    }
}

/// The `limit` a decision of `item` reports: a tiered limit's is its tier's ceiling (within the
/// limit), as the tiered step reports it.
fn decision_limit(item: &CheckItem<'_>) -> u64 {
    let limit = item.quota.limit();
    match item.tier {
        Some(t) => {
            let last = t.levels.len().saturating_sub(1);
            t.levels
                .get(usize::from(t.index).min(last))
                .map_or(0, |l| l.ceiling.min(limit))
        }
        None => limit,
    }
}

fn leased(item: &CheckItem<'_>) -> bool {
    crate::counter::kept(item, SyncMode::Lease)
}

impl Leases {
    /// Decide `items` at local time `now` from the leases alone, when every item is leased and
    /// either has its cost in hand or a denial to answer; `None`: ask Redis.
    ///
    /// A query (cost 0) always goes to Redis: it reports the counter as it is (a limit of 0
    /// denies even a query), which units in hand do not tell; so does a cost above the limit
    /// (a denial that never passes; a tiered limit's: above its tier's ceiling). A remembered
    /// denial answers only a cost at least the one Redis denied (a smaller cost may pass), with
    /// Redis' retry time; on a sliding window counter or a tiered limit, only that cost.
    pub fn decide(&self, now: Micros, items: &[CheckItem<'_>]) -> Option<Vec<Decision>> {
        self.decide_with(now, items, false)
    }

    /// Admit `items` from units in hand alone (every item has its cost in hand), or `None`.
    /// For a request Redis denied while a concurrent call's grant came in.
    pub fn admit_from_hand(&self, now: Micros, items: &[CheckItem<'_>]) -> Option<Vec<Decision>> {
        self.decide_with(now, items, true)
    }

    fn decide_with(
        &self,
        now: Micros,
        items: &[CheckItem<'_>],
        only_in_hand: bool,
    ) -> Option<Vec<Decision>> {
        if items.is_empty()
            || !items
                .iter()
                .all(|i| leased(i) && i.cost > 0 && i.cost <= decision_limit(i))
            || (items.len() > 1 && repeats(items))
        {
            return None;
        }
        let keys: Vec<String> = items.iter().map(map_key).collect();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut blocked = false;
        // Units in hand come first: Redis counted them when it granted them, so spending them
        // is exact even while a denial (learned by a call that raced with the grant) is
        // remembered. Answering that denial instead would strand them until they go back idle,
        // while this instance's callers are told the limit is reached.
        let in_hand = |l: &Lease, item: &CheckItem<'_>| l.expires > now && l.left >= item.cost;
        for (item, k) in items.iter().zip(&keys) {
            let l = map.get(k)?;
            if in_hand(l, item) {
                continue;
            }
            if l.denied_until > now && !only_in_hand {
                // The sliding window counter's retry time depends on the cost, and so does a
                // tier's (whether borrowing can ever reach it): only the cost Redis denied is
                // answered with it.
                let sliding = item.quota.algorithm() == Algorithm::SlidingWindowCounter
                    || item.tier.is_some();
                // A clock gone back behind the denial: Redis decides (the memory would last
                // as long as the step back).
                if now < l.denied_at
                    || item.cost < l.denied_cost
                    || (sliding && item.cost != l.denied_cost)
                {
                    return None;
                }
                blocked |= !item.shadow;
            } else {
                return None;
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for (item, k) in items.iter().zip(&keys) {
            let l = map.get_mut(k)?;
            if !in_hand(l, item) {
                let mut d = l.denial;
                d.retry_after = l.retry_at.map(|r| r.saturating_sub(now).max(1));
                d.reset_after = l.reset_at.saturating_sub(now);
                out.push(d);
                continue;
            }
            if !blocked {
                l.left -= item.cost;
                l.used_at = now;
            }
            let limit = decision_limit(item);
            out.push(Decision {
                allowed: true,
                limit,
                // What the fleet had left at the grant, plus what this instance still holds.
                remaining: (l.remaining + l.left).min(limit),
                reset_after: l.reset_at.saturating_sub(now),
                retry_after: None,
                delay: 0,
                count: None,
            });
        }
        self.stats.local_decisions.fetch_add(1, Relaxed);
        Some(out)
    }

    /// Units to ask for beyond each item's cost, by index (0 for items not leased); `None` when
    /// nothing is leased (the call is an ordinary one).
    pub fn wants(&self, now: Micros, items: &[CheckItem<'_>]) -> Option<Vec<u64>> {
        if !items.iter().any(leased) || (items.len() > 1 && repeats(items)) {
            return None;
        }
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let full = map.len() >= MAX_LEASES;
        Some(
            items
                .iter()
                .map(|item| {
                    if !leased(item) || item.cost == 0 {
                        return 0;
                    }
                    match map.get(&map_key(item)) {
                        None if full => 0,
                        None => 1,
                        Some(l) => {
                            let since = now.saturating_sub(l.granted_at);
                            if since < QUICK {
                                (l.want * 2).min(MAX_WANT)
                            } else if since > 4 * QUICK {
                                (l.want / 2).max(1)
                            } else {
                                l.want
                            }
                        }
                    }
                })
                .collect(),
        )
    }

    /// Take Redis' answer to a call that asked for `wants`: record each leased item's grant
    /// (the `count` of its decision, cleared here) or denial. `now` is the local time the call
    /// started (what windows are mapped from: Redis answered after it) and `answered` when its
    /// answer came (what a lease's age counts from, so a far Redis's round trip does not make
    /// every lease look slow to run out); `ats` are Redis' times of each item's check.
    pub fn learn(
        &self,
        (now, answered): (Micros, Micros),
        ats: &[Micros],
        items: &[CheckItem<'_>],
        wants: &[u64],
        decisions: &mut [Decision],
        limits: &LimitStats,
    ) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (i, ((item, &want), d)) in items
            .iter()
            .zip(wants)
            .zip(decisions.iter_mut())
            .enumerate()
        {
            if !leased(item) {
                continue;
            }
            let Some(&at) = ats.get(i) else { continue };
            let granted = if want > 0 { d.count.take() } else { None };
            let k = map_key(item);
            if !map.contains_key(&k) && (map.len() >= MAX_LEASES || (want == 0 && d.allowed)) {
                continue;
            }
            let (start, end) = window(item.quota.period(), at);
            let expires = now.saturating_add(end.saturating_sub(at));
            let l = map.entry(k).or_insert_with(|| Lease {
                rule: item.rule.to_owned(),
                key: item.key.to_owned(),
                quota: *item.quota,
                tier: item.tier.map(|t| (t.levels.to_vec(), t.index)),
                at,
                start,
                expires,
                left: 0,
                remaining: 0,
                reset_at: 0,
                want: 1,
                granted_at: now,
                used_at: now,
                denied_until: 0,
                denial: *d,
                denied_cost: 0,
                retry_at: None,
                denied_at: now,
            });
            if l.left > 0 && (l.expires <= now || l.start != start) {
                // The window of the units in hand is over: they went with it.
                self.stats.units_expired.fetch_add(l.left, Relaxed);
                let per = limits.get(&l.rule);
                per.lease_units_expired.fetch_add(l.left, Relaxed);
                l.left = 0;
            }
            l.reset_at = now.saturating_add(d.reset_after);
            if !d.allowed {
                let wait = d.retry_after.unwrap_or(DENIED_FOR).min(DENIED_FOR);
                l.denied_until = now.saturating_add(wait);
                l.denial = *d;
                l.denied_cost = item.cost;
                l.denied_at = now;
                l.retry_at = d.retry_after.map(|r| now.saturating_add(r));
                continue;
            }
            l.denied_until = 0;
            if let Some(g) = granted {
                l.want = want;
                l.granted_at = answered;
                l.used_at = answered;
                l.remaining = d.remaining;
                if g > 0 {
                    l.at = at;
                    l.start = start;
                    l.expires = expires;
                    l.left += g;
                    self.stats.grants.fetch_add(1, Relaxed);
                    self.stats.units_granted.fetch_add(g, Relaxed);
                    let per = limits.get(item.rule);
                    per.lease_grants.fetch_add(1, Relaxed);
                    per.lease_units_granted.fetch_add(g, Relaxed);
                }
            }
        }
    }

    /// Units to give back: those idle since `now - IDLE` (all of them with `all`), taken out of
    /// the leases; forgets leases whose window is over.
    pub fn take_returns(&self, now: Micros, all: bool, limits: &LimitStats) -> Returns {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        map.retain(|_, l| {
            if l.expires <= now {
                self.stats.units_expired.fetch_add(l.left, Relaxed);
                if l.left > 0 {
                    let per = limits.get(&l.rule);
                    per.lease_units_expired.fetch_add(l.left, Relaxed);
                }
                return l.denied_until > now;
            }
            if l.left > 0 && (all || now.saturating_sub(l.used_at) >= IDLE) {
                out.push((
                    l.rule.clone(),
                    l.key.clone(),
                    l.quota,
                    l.at,
                    l.left,
                    l.tier.clone(),
                ));
                l.left = 0;
            }
            true
        });
        out
    }

    /// Forget what Redis denied on `items`' counters: a call that changed them (one that asked
    /// for no lease, such as a request naming a counter twice) makes a remembered denial stale.
    pub fn forget_denials(&self, items: &[CheckItem<'_>]) {
        if !items.iter().any(leased) {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for item in items.iter().filter(|i| leased(i)) {
            if let Some(l) = map.get_mut(&map_key(item)) {
                l.denied_until = 0;
            }
        }
    }

    /// Take out the units in hand of `items`' leases (those of their current window), to give
    /// back before asking Redis again: Redis counts them as used, so a request costing more than
    /// is in hand could be denied where the count without them admits it. Units of a window
    /// that is over are counted as lost with it.
    pub fn take_held(&self, now: Micros, items: &[CheckItem<'_>], limits: &LimitStats) -> Returns {
        if !items.iter().any(leased) {
            return Vec::new();
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Returns = Vec::new();
        for item in items.iter().filter(|i| leased(i)) {
            if let Some(l) = map.get_mut(&map_key(item)) {
                if l.left > 0 && l.expires <= now {
                    self.stats.units_expired.fetch_add(l.left, Relaxed);
                    let per = limits.get(&l.rule);
                    per.lease_units_expired.fetch_add(l.left, Relaxed);
                    l.left = 0;
                } else if l.left > 0 {
                    out.push((
                        l.rule.clone(),
                        l.key.clone(),
                        l.quota,
                        l.at,
                        l.left,
                        l.tier.clone(),
                    ));
                    l.left = 0;
                }
            }
        }
        out
    }

    /// Units held now, over every lease.
    pub fn held(&self) -> u64 {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values().map(|l| l.left).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Unit;

    const T0: Micros = 1_700_000_000_000_000;

    fn granted(remaining: u64, g: u64) -> Decision {
        Decision {
            allowed: true,
            limit: 1000,
            remaining,
            reset_after: 60_000_000,
            retry_after: None,
            delay: 0,
            count: Some(g),
        }
    }

    #[test]
    fn units_in_hand_decide_locally_then_run_out() {
        let q = Quota::new(1000, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Lease);
        let l = Leases::default();
        let items = [CheckItem::hit("r", "k", &q)];
        assert!(l.decide(T0, &items).is_none(), "nothing in hand");
        assert_eq!(l.wants(T0, &items), Some(vec![1]));
        let mut d = [granted(900, 3)];
        l.learn(
            (T0, T0),
            &[T0],
            &items,
            &[3],
            &mut d,
            &LimitStats::default(),
        );
        assert_eq!(d[0].count, None, "the grant is not reported to the caller");
        for _ in 0..3 {
            let d = l.decide(T0 + 1, &items).expect("decided from the lease");
            assert!(d[0].allowed && d[0].remaining <= 1000);
        }
        assert!(l.decide(T0 + 1, &items).is_none(), "spent: ask Redis");
        // Refilled quickly: the next lease is twice as large; slowly: half as large.
        assert_eq!(l.wants(T0 + 10, &items), Some(vec![6]));
        assert_eq!(l.wants(T0 + 5 * QUICK, &items), Some(vec![1]));
    }

    #[test]
    fn idle_units_go_back_and_a_new_window_drops_the_old_units() {
        let q = Quota::new(1000, Unit::Minute)
            .with_algorithm(Algorithm::SlidingWindowCounter)
            .with_sync(SyncMode::Lease);
        let l = Leases::default();
        let items = [CheckItem::hit("r", "k", &q)];
        let mut d = [granted(900, 8)];
        l.learn(
            (T0, T0),
            &[T0],
            &items,
            &[8],
            &mut d,
            &LimitStats::default(),
        );
        assert!(
            l.take_returns(T0 + 1, false, &LimitStats::default())
                .is_empty(),
            "not idle yet"
        );
        let back = l.take_returns(T0 + IDLE, false, &LimitStats::default());
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].3, back[0].4), (T0, 8));
        assert_eq!(l.held(), 0);
        // Units of a window that ended are not given back (the counter reset with it).
        let mut d = [granted(900, 5)];
        l.learn(
            (T0 + IDLE, T0 + IDLE),
            &[T0],
            &items,
            &[5],
            &mut d,
            &LimitStats::default(),
        );
        assert!(l
            .take_returns(T0 + 61_000_000, true, &LimitStats::default())
            .is_empty());
        assert_eq!(l.stats.units_expired.load(Relaxed), 5);
    }

    #[test]
    fn a_denial_is_answered_locally_for_a_short_while() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Lease);
        let l = Leases::default();
        let items = [CheckItem::hit("r", "k", &q)];
        let mut d = [Decision {
            allowed: false,
            retry_after: Some(3_000_000_000),
            count: Some(0),
            ..granted(0, 0)
        }];
        l.learn(
            (T0, T0),
            &[T0],
            &items,
            &[1],
            &mut d,
            &LimitStats::default(),
        );
        let local = l.decide(T0 + 1, &items).expect("the denial is remembered");
        assert!(!local[0].allowed);
        assert!(
            l.decide(T0 + DENIED_FOR, &items).is_none(),
            "then Redis is asked again"
        );
    }

    /// Regression: a remembered denial was answered for any request on the counter (a smaller
    /// cost that fits, a cost-0 query, a cost above the limit), for as long as the clock went
    /// back, and with `retry_after` cut to the local memory's quarter second instead of Redis'
    /// retry time, unlike `exact`.
    #[test]
    fn a_remembered_denial_answers_only_its_cost_with_redis_retry_time() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Lease);
        let l = Leases::default();
        let hit = |cost| {
            [CheckItem {
                cost,
                ..CheckItem::hit("r", "k", &q)
            }]
        };
        let mut d = [Decision {
            allowed: false,
            remaining: 2,
            retry_after: Some(3_000_000_000),
            count: Some(0),
            ..granted(2, 0)
        }];
        l.learn(
            (T0, T0),
            &[T0],
            &hit(3),
            &[1],
            &mut d,
            &LimitStats::default(),
        );
        let local = l
            .decide(T0 + 10, &hit(4))
            .expect("a larger cost is denied too");
        assert!(!local[0].allowed);
        assert_eq!(
            local[0].retry_after,
            Some(3_000_000_000 - 10),
            "Redis' retry time"
        );
        assert!(
            l.decide(T0 + 10, &hit(2)).is_none(),
            "a smaller cost may pass"
        );
        assert!(
            l.decide(T0 + 10, &hit(0)).is_none(),
            "a query goes to Redis"
        );
        assert!(
            l.decide(T0 + 10, &hit(11)).is_none(),
            "so does a cost above the limit"
        );
        assert!(l.decide(T0 - 1, &hit(4)).is_none(), "and a clock gone back");
    }

    /// Regression: a denial learned by a call that raced with another call's grant was
    /// answered before the granted units, so every local caller was turned away while the
    /// units sat in hand until they went back idle: a fleet's last burst stopped short of the
    /// limit.
    #[test]
    fn units_in_hand_are_spent_before_a_remembered_denial() {
        let q = Quota::new(100, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Lease);
        let l = Leases::default();
        let items = [CheckItem::hit("r", "k", &q)];
        let stats = LimitStats::default();
        let mut grant = [Decision {
            count: Some(2),
            ..granted(0, 0)
        }];
        l.learn((T0, T0), &[T0], &items, &[4], &mut grant, &stats);
        let mut denial = [Decision {
            allowed: false,
            retry_after: Some(3_000_000_000),
            count: Some(0),
            ..granted(0, 0)
        }];
        l.learn((T0, T0), &[T0], &items, &[4], &mut denial, &stats);
        let d = l.admit_from_hand(T0 + 1, &items).expect("a unit in hand");
        assert!(d[0].allowed);
        let d = l.decide(T0 + 1, &items).expect("decided locally");
        assert!(d[0].allowed, "the units in hand are spent first");
        assert!(l.admit_from_hand(T0 + 1, &items).is_none(), "none left");
        let d = l
            .decide(T0 + 1, &items)
            .expect("then the denial is answered");
        assert!(!d[0].allowed);
        assert_eq!(l.held(), 0);
    }

    /// Regression: a request naming a counter twice goes to Redis without leases and may
    /// consume on it; a denial remembered before it was still answered, with the old count.
    #[test]
    fn a_call_without_lease_makes_a_remembered_denial_stale() {
        let q = Quota::new(10, Unit::Hour)
            .with_algorithm(Algorithm::SlidingWindowCounter)
            .with_sync(SyncMode::Lease);
        let l = Leases::default();
        let items = [CheckItem::hit("r", "k", &q)];
        let mut d = [Decision {
            allowed: false,
            retry_after: Some(1_000_000),
            count: Some(0),
            ..granted(0, 0)
        }];
        l.learn(
            (T0, T0),
            &[T0],
            &items,
            &[1],
            &mut d,
            &LimitStats::default(),
        );
        assert!(l.decide(T0 + 1, &items).is_some(), "remembered");
        l.forget_denials(&[items[0], items[0]]);
        assert!(l.decide(T0 + 1, &items).is_none(), "Redis is asked again");
    }

    /// Each tier of a parent counter has its own lease: units granted to one tier are spent by
    /// that tier's requests only, a local decision reports the tier's ceiling as its limit, and
    /// the units go back as the tier's (a refund of the tier's count).
    #[test]
    fn a_tiered_limit_is_leased_per_tier() {
        let q = Quota::new(100, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Lease);
        let levels = [
            TierLevel::new("paid", 60, 100, 0),
            TierLevel::new("free", 10, 80, 20),
        ];
        let tier = |index| CheckItem {
            tier: Some(Tier {
                levels: &levels,
                index,
            }),
            ..CheckItem::hit("r", "k", &q)
        };
        let (paid, free, past) = ([tier(0)], [tier(1)], [tier(7)]);
        assert_ne!(map_key(&paid[0]), map_key(&free[0]));
        assert_eq!(
            map_key(&free[0]),
            map_key(&past[0]),
            "past the last level is the last level"
        );
        let l = Leases::default();
        let stats = LimitStats::default();
        assert_eq!(
            l.wants(T0, &free),
            Some(vec![1]),
            "a tiered limit is leased"
        );
        let mut d = [Decision {
            limit: 80,
            ..granted(40, 4)
        }];
        l.learn((T0, T0), &[T0], &free, &[4], &mut d, &stats);
        assert!(
            l.decide(T0 + 1, &paid).is_none(),
            "paid has nothing in hand"
        );
        let d = l.decide(T0 + 1, &free).expect("free's units in hand");
        assert_eq!((d[0].allowed, d[0].limit, d[0].remaining), (true, 80, 43));
        let d = l.decide(T0 + 1, &past).expect("the last level's units");
        assert!(d[0].allowed);
        assert_eq!(l.held(), 2);
        let back = l.take_returns(T0 + 2, true, &stats);
        assert_eq!(back.len(), 1);
        let (_, key, quota, at, units, t) = &back[0];
        assert_eq!((at, units), (&T0, &2));
        let t = t.as_ref().expect("the tier goes back with the units");
        assert_eq!((t.0.as_slice(), t.1), (&levels[..], 1));
        let item = refund_item(key, quota, *units, Some(t));
        assert_eq!(map_key(&item), map_key(&free[0]));
        assert_eq!(item.cost, 2);
    }

    #[test]
    fn a_tiered_limit_is_never_batched() {
        let q = Quota::new(100, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .with_sync(SyncMode::Batched);
        let levels = [TierLevel::new("paid", 60, 100, 0)];
        let item = CheckItem {
            tier: Some(Tier {
                levels: &levels,
                index: 0,
            }),
            ..CheckItem::hit("r", "k", &q)
        };
        assert!(!crate::counter::kept(&item, SyncMode::Batched));
        assert!(crate::counter::kept(
            &CheckItem::hit("r", "k", &q),
            SyncMode::Batched
        ));
    }

    #[test]
    fn exact_limits_and_repeated_counters_are_not_leased() {
        let exact = Quota::new(10, Unit::Hour).with_algorithm(Algorithm::FixedWindow);
        let leased = exact.with_sync(SyncMode::Lease);
        let l = Leases::default();
        assert_eq!(l.wants(T0, &[CheckItem::hit("r", "k", &exact)]), None);
        let twice = [
            CheckItem::hit("r", "k", &leased),
            CheckItem::hit("r", "k", &leased),
        ];
        assert_eq!(l.wants(T0, &twice), None);
        assert!(l.decide(T0, &twice).is_none());
    }
}
