//! What the local sync modes (`lease`, `batched`) key their per-counter state by, and which
//! requests they keep: one definition for both, so that the two agree with each other and with
//! the Redis key of the counter (the key, the algorithm and the period).

use tollgate_core::{CheckItem, SyncMode};

/// Whether `item` is kept in `mode` (its limit asks for it and its algorithm supports it).
pub(crate) fn kept(item: &CheckItem<'_>, mode: SyncMode) -> bool {
    // Tiered limits are always decided in Redis (their rules refuse the other modes).
    item.quota.sync() == mode && mode.supports(item.quota.algorithm()) && item.tier.is_none()
}

/// The map key of an item's counter: the key, the algorithm and the period (as Redis' key).
pub(crate) fn map_key(item: &CheckItem<'_>) -> String {
    let p = item.quota.period();
    format!(
        "{}\u{0}{}\u{0}{}\u{0}{}",
        item.key,
        item.quota.algorithm(),
        p.unit,
        p.multiplier
    )
}

/// Whether some item's counter comes twice in `items`. Such a request goes to Redis as `exact`:
/// the script would grant or merge on one item and overwrite it with the other's state.
pub(crate) fn repeats(items: &[CheckItem<'_>]) -> bool {
    items.iter().enumerate().any(|(i, a)| {
        items[..i]
            .iter()
            .any(|b| b.key == a.key && b.quota.algorithm() == a.quota.algorithm())
    })
}
