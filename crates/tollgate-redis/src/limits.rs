//! Per-limit counters of the sync modes (`lease`, `batched`): what each configured limit cost
//! Redis and what its leases and batches did, so an operator sees which limit a mode pays off
//! for. Keyed by the limit's id (its rule), so the number of series follows the configuration,
//! not the traffic; bounded all the same ([`MAX_LIMITS`]; beyond it, one shared entry).
//! Limits kept `exact` are not counted here (one Redis call per decision, by definition).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use tollgate_core::{CheckItem, Micros, SyncMode};

/// Limits counted one by one; further ones share the entry named [`OTHER`].
pub const MAX_LIMITS: usize = 10_000;
/// The id of the shared entry past [`MAX_LIMITS`].
pub const OTHER: &str = "other";

/// What one limit's sync mode did.
#[derive(Debug, Default)]
pub struct LimitSync {
    /// The limit's sync mode when first seen (`SyncMode::ALL` index).
    mode: AtomicU64,
    /// Requests decided on this limit.
    pub decisions: AtomicU64,
    /// Redis calls made for it (checks, lease refills, flushes that carried its counters).
    pub redis_calls: AtomicU64,
    /// Leases Redis granted.
    pub lease_grants: AtomicU64,
    /// Units granted to leases.
    pub lease_units_granted: AtomicU64,
    /// Leased units given back unspent.
    pub lease_units_returned: AtomicU64,
    /// Leased units lost unspent when their window ended.
    pub lease_units_expired: AtomicU64,
    /// Successful flushes that carried this limit's counters (one per counter).
    pub flushes: AtomicU64,
    /// Local time of the last successful flush of one of its counters (0: never).
    pub last_flush: AtomicU64,
    /// Units the fleet's count was found over the limit by when a flush merged (each unit once
    /// per counter and window).
    pub overshoot: AtomicU64,
}

impl LimitSync {
    /// The limit's sync mode.
    pub fn mode(&self) -> SyncMode {
        SyncMode::ALL
            .get(self.mode.load(Relaxed) as usize)
            .copied()
            .unwrap_or_default()
    }
}

/// The per-limit counters of one store.
#[derive(Debug, Default)]
pub struct LimitStats {
    map: RwLock<HashMap<String, Arc<LimitSync>>>,
}

impl LimitStats {
    /// The counters of the limit `rule` (created on first use).
    pub fn get(&self, rule: &str) -> Arc<LimitSync> {
        if let Some(l) = self.map.read().unwrap_or_else(|e| e.into_inner()).get(rule) {
            return l.clone();
        }
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let key = if map.len() >= MAX_LIMITS && !map.contains_key(rule) {
            OTHER
        } else {
            rule
        };
        map.entry(key.to_owned()).or_default().clone()
    }

    /// Count one request's decision on its non-exact limits: `redis` when a Redis call made it.
    pub(crate) fn decided(&self, items: &[CheckItem<'_>], redis: bool) {
        for i in items {
            let mode = i.quota.sync();
            if mode == SyncMode::Exact {
                continue;
            }
            let l = self.get(i.rule);
            let m = SyncMode::ALL.iter().position(|x| *x == mode).unwrap_or(0);
            l.mode.store(m as u64, Relaxed);
            l.decisions.fetch_add(1, Relaxed);
            if redis {
                l.redis_calls.fetch_add(1, Relaxed);
            }
        }
    }

    /// Every limit's counters, sorted by id.
    pub fn snapshot(&self) -> Vec<(String, Arc<LimitSync>)> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = map.iter().map(|(k, l)| (k.clone(), l.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// Seconds since the epoch of a local time in microseconds (for the last-flush gauge).
pub fn seconds(t: Micros) -> f64 {
    t as f64 / 1e6
}
