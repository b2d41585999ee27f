//! Priority tiers sharing one limit (`tiers:` on a descriptor): the rule part, decoding and
//! validation.
//!
//! A tiered rule's `rate_limit` is a capacity shared by its tiers (say `plan=paid` and
//! `plan=free`). Each tier is guaranteed a share of it, may borrow what the others leave unused
//! up to an optional ceiling, and borrows only while more than its reserve remains (kept for the
//! tiers above it). The request descriptor's entry right after the tiered descriptor's names
//! the tier; it is not part of the counter key, so all the tiers of one parent counter share one
//! store key and are decided in one atomic step (`algorithm::tiers`).
//!
//! What is checked here keeps the step's invariant reachable: the guarantees add up to at most
//! the limit, so every tier's unused guarantee can always be kept free for it.

use super::fields::{bounded, integer, string, Errors, Fields};
use super::yaml::{Kind, Node, Pos};
use crate::quota::{Algorithm, Quota, SyncMode};

/// Most levels a `tiers` block may have: a tier index fits in a `u8`, and a parent counter's
/// state holds one count per level.
pub const MAX_LEVELS: usize = 16;

const TIERS_FIELDS: &[&str] = &["key", "levels"];
const LEVEL_FIELDS: &[&str] = &["value", "guaranteed", "ceiling", "reserve"];

/// A rule's tiers: which request entry names the tier, and the levels, highest priority first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tiers {
    /// The key of the request descriptor's entry (right after the tiered descriptor's entries)
    /// whose value names the tier.
    pub key: String,
    /// The levels, highest priority first (index 0). A request whose tier entry is missing or
    /// names no level is in the last one.
    pub levels: Vec<TierLevel>,
}

/// One level of a [`Tiers`] block. Counts are in the units of the rule's limit (requests, or
/// hits, per window).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierLevel {
    /// The tier entry's value that selects this level.
    pub value: String,
    /// Always available to this tier.
    pub guaranteed: u64,
    /// Never more than this for this tier (the rule's limit when the file sets none).
    pub ceiling: u64,
    /// Beyond its guarantee, this tier borrows only while more than this would remain of the
    /// parent's unreserved capacity (0 when the file sets none).
    pub reserve: u64,
}

impl TierLevel {
    /// A level for `value` with `guaranteed`, `ceiling` and `reserve` (see the fields).
    pub fn new(value: impl Into<String>, guaranteed: u64, ceiling: u64, reserve: u64) -> Self {
        TierLevel {
            value: value.into(),
            guaranteed,
            ceiling,
            reserve,
        }
    }
}

impl Tiers {
    /// Tiers selected by the entry `key`, with `levels` highest priority first, for callers that
    /// build limits in code ([`super::Limit::with_tiers`]). Not validated here: rule files are
    /// (docs/rules.md says what must hold), and a step over levels that break it still never
    /// admits more than the parent's limit.
    pub fn new(key: impl Into<String>, levels: Vec<TierLevel>) -> Self {
        Tiers {
            key: key.into(),
            levels,
        }
    }

    /// The index of the level a request is in: the one whose value is `value`, else (no tier
    /// entry, or an unlisted value) the last, lowest-priority one.
    pub fn index_of(&self, value: Option<&str>) -> u8 {
        let last = self.levels.len().saturating_sub(1);
        let i = value
            .and_then(|v| self.levels.iter().position(|l| l.value == v))
            .unwrap_or(last);
        u8::try_from(i).unwrap_or(u8::MAX)
    }
}

/// Whether tiers can be kept with `algorithm`: the step compares counts per aligned window.
pub const fn supports(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
    )
}

/// What a tiered descriptor brings to the decoding of its `tiers` block.
pub(super) struct Context<'a> {
    /// The descriptor's key, to name the rule in messages.
    pub rule: &'a str,
    /// The rule's quota: `None` without a `rate_limit`, `Some(None)` for `unlimited: true`.
    pub quota: Option<Option<Quota>>,
    /// The `algorithm` and `sync` nodes of the `rate_limit`, when named.
    pub algorithm: Option<&'a Node>,
    pub sync: Option<&'a Node>,
    /// The keys (with their positions) of the descriptor's nested descriptors.
    pub children: Vec<(&'a str, Pos)>,
}

/// Decodes `tiers: {key: ..., levels: [...]}`, recording every problem with its position.
pub(super) fn decode(node: &Node, cx: Context<'_>, errors: &mut Errors) -> Option<Tiers> {
    let fields = Fields::new(node, "`tiers`", TIERS_FIELDS, errors)?;
    let before = errors.len();
    let key = match fields.get("key") {
        None => {
            errors.push((
                node.pos,
                "`tiers` is missing required field `key` (the request entry that names the tier)"
                    .to_string(),
            ));
            None
        }
        Some(k) => string(k, "key", errors).and_then(|s| {
            if s.is_empty() {
                errors.push((k.pos, "`tiers.key` must not be empty".to_string()));
                None
            } else {
                bounded(s, k, "key", errors)
            }
        }),
    };
    if let (Some(key), Some(n)) = (&key, fields.get("key")) {
        if key == cx.rule {
            errors.push((
                n.pos,
                format!(
                    "`tiers.key` `{key}` is the tiered descriptor's own key: the tier is named by the request entry after `{key}`, which needs a key of its own (`plan`, `tier`)"
                ),
            ));
        }
    }
    if let Some(key) = &key {
        for (child, pos) in &cx.children {
            if child == key {
                errors.push((
                    *pos,
                    format!(
                        "a descriptor nested under tiered rule `{}` has key `{key}`, which its `tiers.key` uses to name the tier: rename one of them",
                        cx.rule
                    ),
                ));
            }
        }
    }
    let levels = match fields.get("levels") {
        None => {
            errors.push((
                node.pos,
                "`tiers` is missing required field `levels` (a list, highest priority first)"
                    .to_string(),
            ));
            None
        }
        Some(n) => levels(n, errors),
    };
    let quota = match cx.quota {
        None => {
            errors.push((
                node.pos,
                "`tiers` needs a `rate_limit` on the same descriptor (the capacity the tiers share)"
                    .to_string(),
            ));
            None
        }
        Some(None) => {
            errors.push((
                node.pos,
                "`tiers` cannot be used with `unlimited: true` (there is no capacity to share)"
                    .to_string(),
            ));
            None
        }
        Some(Some(q)) => Some(q),
    };
    if let (Some(n), Some(q)) = (cx.algorithm, quota) {
        if !supports(q.algorithm()) {
            errors.push((
                n.pos,
                format!(
                    "tiered rule `{}` needs algorithm fixed_window or sliding_window_counter, not {} (tiers compare counts per window)",
                    cx.rule,
                    q.algorithm()
                ),
            ));
        }
    }
    if let (Some(n), Some(q)) = (cx.sync, quota) {
        match q.sync() {
            // A lease is per (parent counter, tier), its units counted on both when granted.
            SyncMode::Exact | SyncMode::Lease => {}
            SyncMode::Batched => errors.push((
                n.pos,
                format!(
                    "tiered rule `{}` cannot use `sync: batched`: batched counts are approximate and late, so they cannot keep a tier's guarantee (use `sync: exact` or `sync: lease`)",
                    cx.rule
                ),
            )),
        }
    }
    let (key, levels, quota) = (key?, levels?, quota?);
    let limit = quota.limit();
    let sum: u128 = levels.iter().map(|(l, _)| u128::from(l.guaranteed)).sum();
    if sum > u128::from(limit) {
        errors.push((
            node.pos,
            format!(
                "the tiers of `{}` guarantee {sum} in all, more than its limit of {limit}: the guarantees must add up to at most the limit",
                cx.rule
            ),
        ));
    }
    let mut out = Vec::with_capacity(levels.len());
    for (level, at) in levels {
        let ceiling = level.ceiling.unwrap_or(limit);
        if ceiling > limit {
            errors.push((
                at.ceiling,
                format!(
                    "tier `{}`: `ceiling` {ceiling} is more than the limit of {limit}",
                    level.value
                ),
            ));
        } else if level.guaranteed > ceiling {
            errors.push((
                at.ceiling,
                format!(
                    "tier `{}`: `ceiling` {ceiling} is below its `guaranteed` {}",
                    level.value, level.guaranteed
                ),
            ));
        }
        if level.reserve > limit {
            errors.push((
                at.reserve,
                format!(
                    "tier `{}`: `reserve` {} is more than the limit of {limit}",
                    level.value, level.reserve
                ),
            ));
        } else if at.first && level.reserve > 0 {
            errors.push((
                at.reserve,
                format!(
                    "tier `{}` is the first (highest priority) level: a `reserve` keeps capacity for the levels above, and there are none",
                    level.value
                ),
            ));
        }
        out.push(TierLevel {
            value: level.value,
            guaranteed: level.guaranteed,
            ceiling,
            reserve: level.reserve,
        });
    }
    (errors.len() == before).then_some(Tiers { key, levels: out })
}

/// A level as read, before the rule's limit fills in its defaults.
struct Raw {
    value: String,
    guaranteed: u64,
    ceiling: Option<u64>,
    reserve: u64,
}

/// Where a level's fields are, for the messages that need the rule's limit.
struct At {
    ceiling: Pos,
    reserve: Pos,
    /// The first level of the list (the highest priority).
    first: bool,
}

fn levels(node: &Node, errors: &mut Errors) -> Option<Vec<(Raw, At)>> {
    let Kind::Seq(items) = &node.kind else {
        errors.push((
            node.pos,
            format!(
                "`levels` must be a list of levels (highest priority first), found {}",
                node.describe()
            ),
        ));
        return None;
    };
    if items.is_empty() || items.len() > MAX_LEVELS {
        errors.push((
            node.pos,
            format!(
                "`levels` has {} entries; a tiered rule has 1 to {MAX_LEVELS}",
                items.len()
            ),
        ));
        return None;
    }
    let mut out: Vec<(Raw, At)> = Vec::with_capacity(items.len());
    let mut seen: Vec<(String, usize)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(fields) = Fields::new(item, "a tier level", LEVEL_FIELDS, errors) else {
            continue;
        };
        let value = match fields.get("value") {
            None => {
                errors.push((
                    item.pos,
                    "tier level is missing required field `value` (the tier entry's value that selects it)"
                        .to_string(),
                ));
                None
            }
            Some(v) => string(v, "value", errors).and_then(|s| {
                if s.is_empty() {
                    errors.push((v.pos, "a tier's `value` must not be empty".to_string()));
                    None
                } else {
                    bounded(s, v, "value", errors)
                }
            }),
        };
        if let (Some(v), Some(n)) = (&value, fields.get("value")) {
            if let Some((_, line)) = seen.iter().find(|(s, _)| s == v) {
                errors.push((
                    n.pos,
                    format!("duplicate tier value `{v}`: already a level at line {line}"),
                ));
            } else {
                seen.push((v.clone(), n.pos.line));
            }
        }
        let max = u64::from(u32::MAX);
        let guaranteed = match fields.get("guaranteed") {
            None => {
                errors.push((
                    item.pos,
                    "tier level is missing required field `guaranteed` (0 for none)".to_string(),
                ));
                None
            }
            Some(n) => integer(n, "guaranteed", 0, max, errors),
        };
        let ceiling = fields
            .get("ceiling")
            .map(|n| integer(n, "ceiling", 0, max, errors));
        let reserve = fields
            .get("reserve")
            .map(|n| integer(n, "reserve", 0, max, errors));
        let at = At {
            ceiling: fields.get("ceiling").map_or(item.pos, |n| n.pos),
            reserve: fields.get("reserve").map_or(item.pos, |n| n.pos),
            first: i == 0,
        };
        let (Some(value), Some(guaranteed), Some(ceiling), Some(reserve)) = (
            value,
            guaranteed,
            ceiling.map_or(Some(None), |c| c.map(Some)),
            reserve.unwrap_or(Some(0)),
        ) else {
            continue;
        };
        out.push((
            Raw {
                value,
                guaranteed,
                ceiling,
                reserve,
            },
            at,
        ));
    }
    // The readable levels, even when others were not: the checks against the rule's limit
    // still run on them, so every error of the file is reported (the caller keeps no tiers
    // when any error was recorded).
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels(spec: &[(&str, u64)]) -> Tiers {
        Tiers::new(
            "plan",
            spec.iter()
                .map(|(v, g)| TierLevel::new(*v, *g, 100, 0))
                .collect(),
        )
    }

    #[test]
    fn unknown_and_missing_tiers_are_the_last_level() {
        let t = levels(&[("paid", 60), ("free", 10), ("trial", 0)]);
        assert_eq!(t.index_of(Some("paid")), 0);
        assert_eq!(t.index_of(Some("free")), 1);
        assert_eq!(t.index_of(Some("trial")), 2);
        assert_eq!(t.index_of(Some("gold")), 2);
        assert_eq!(t.index_of(None), 2);
    }
}
