//! What the local sync modes (`lease`, `batched`) key their per-counter state by, and which
//! requests they keep: one definition for both, so that the two agree with each other and with
//! the Redis key of the counter (the key, the algorithm and the period).

use tollgate_core::{CheckItem, SyncMode};

/// Whether `item` is kept in `mode` (its limit asks for it and its algorithm supports it).
pub(crate) fn kept(item: &CheckItem<'_>, mode: SyncMode) -> bool {
    // A tiered limit can be leased (a grant is counted on the tier and the parent at once, in
    // the one step that decides both) but not batched: batched counts are late, and a tier's
    // guarantee needs the other tiers' counts as they are (its rules refuse `batched`).
    item.quota.sync() == mode
        && mode.supports(item.quota.algorithm())
        && (item.tier.is_none() || mode == SyncMode::Lease)
}

/// The map key of an item's counter: the key, the algorithm and the period (as Redis' key),
/// and for a tiered limit the request's tier: each tier of a parent counter has its own lease,
/// so one tier never spends units granted to another.
pub(crate) fn map_key(item: &CheckItem<'_>) -> String {
    let p = item.quota.period();
    let mut k = format!(
        "{}\u{0}{}\u{0}{}\u{0}{}",
        item.key,
        item.quota.algorithm(),
        p.unit,
        p.multiplier
    );
    if let Some(t) = item.tier {
        // Past the last level is the last level (as the step decides it).
        let last = t.levels.len().saturating_sub(1);
        k.push_str(&format!("\u{0}tier{}", usize::from(t.index).min(last)));
    }
    k
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
