//! The [`Store`] trait: where counters live and how one request's counters are checked together.
//!
//! A store applies algorithm steps atomically per key and **all-or-nothing per request**: when any
//! non-shadow item is denied, no item consumes anything, and the other items report what they
//! have left without consuming (a cost-0 query). Shadow-mode items are evaluated and counted when
//! they pass, but never block the request.

use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Quota;

/// One counter to check as part of a request.
#[derive(Debug, Clone, Copy)]
pub struct CheckItem<'a> {
    /// Identity of the limit (rule) this counter belongs to; counters of one count-min-sketch
    /// limit share that limit's sketch.
    pub rule: &'a str,
    /// The counter key (`domain|k=v|...`, escaped).
    pub key: &'a str,
    /// The quota.
    pub quota: &'a Quota,
    /// Cost of this request against this counter (0 = query).
    pub cost: u64,
    /// Counted, never blocks the other items (shadow mode, and quota mode, whose limits block
    /// only all together: decided by the caller from the decisions).
    pub shadow: bool,
}

impl<'a> CheckItem<'a> {
    /// One hit (cost 1, not shadowed) on `key` under `rule`'s `quota`; other costs and shadow
    /// mode by struct update: `CheckItem { cost: 5, ..CheckItem::hit(rule, key, quota) }`.
    pub fn hit(rule: &'a str, key: &'a str, quota: &'a Quota) -> Self {
        CheckItem {
            rule,
            key,
            quota,
            cost: 1,
            shadow: false,
        }
    }
}

/// A store could not decide (only remote stores fail; the memory store never does).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend did not answer in time.
    #[error("store timed out after {0} ms")]
    Timeout(u64),
    /// The backend is unreachable or answered with an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The request cannot be served by this store (e.g. an algorithm it does not support).
    #[error("unsupported by this store: {0}")]
    Unsupported(String),
}

/// A place counters live.
pub trait Store: Send + Sync {
    /// Check and (all-or-nothing) consume `items` at `now`. Returns one decision per item, in order.
    fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Vec<Decision>, StoreError>;

    /// Check one counter: the common case, which stores may serve without allocating.
    fn check_one(&self, now: Micros, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        self.check(now, std::slice::from_ref(item))?
            .pop()
            .ok_or_else(|| StoreError::Unavailable("store returned no decision".into()))
    }
}

/// Whether a set of decisions blocks the request: any denied non-shadow item.
pub fn blocks(items: &[CheckItem<'_>], decisions: &[Decision]) -> bool {
    items
        .iter()
        .zip(decisions)
        .any(|(i, d)| !i.shadow && !d.allowed)
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Vec<Decision>, StoreError> {
        (**self).check(now, items)
    }
    fn check_one(&self, now: Micros, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        (**self).check_one(now, item)
    }
}
