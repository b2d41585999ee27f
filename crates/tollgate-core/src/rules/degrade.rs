//! A rule's answers beyond allow and deny: the degrade threshold (`degrade:`) and the
//! shadowban (`shadowban: true`).
//!
//! A degrade threshold lets a rule warn before it refuses: an allowed answer whose remaining
//! count is below the threshold carries a signal, so that the application can serve something
//! cheaper (a smaller page, no recommendations) while there is still room, instead of failing
//! outright a little later. The threshold is a share of the limit (`20%`) or a count (`5`).
//!
//! A shadowban rule's denials are answered as if allowed to the client, without the request
//! going through: the transports mark those denials so that a gateway or a middleware can
//! serve a fake success. The decision logic is here; how each transport answers is theirs.

use super::fields::{integer, Errors, Fields};
use super::yaml::{Kind, Node};
use crate::decision::Decision;
use crate::quota::Quota;

/// Fields of a `degrade` block.
const DEGRADE_FIELDS: &[&str] = &["below_remaining"];

/// Below how much remaining count an allowed answer carries the degrade signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DegradeThreshold {
    /// A share of the limit the decision was made against, in percent (1 to 100): the signal
    /// is on when `remaining * 100 < percent * limit`.
    Percent(u8),
    /// A count: the signal is on when `remaining < count`.
    Remaining(u64),
}

impl DegradeThreshold {
    /// Whether an allowed decision carries the signal (never a denied one): what remains after
    /// it is below the threshold.
    pub fn signals(&self, decision: &Decision) -> bool {
        decision.allowed && self.below(decision.remaining, decision.limit)
    }

    /// Whether `remaining` (of `limit`) is below the threshold.
    pub fn below(&self, remaining: u64, limit: u64) -> bool {
        match *self {
            DegradeThreshold::Percent(p) => {
                u128::from(remaining) * 100 < u128::from(p) * u128::from(limit)
            }
            DegradeThreshold::Remaining(n) => remaining < n,
        }
    }
}

impl std::fmt::Display for DegradeThreshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DegradeThreshold::Percent(p) => write!(f, "{p}%"),
            DegradeThreshold::Remaining(n) => write!(f, "{n}"),
        }
    }
}

/// Decodes `degrade: {below_remaining: 20%}` (or a count) for a rule whose quota is `quota`
/// (`None` for no quota: unlimited, or no `rate_limit`, where a threshold means nothing).
pub(super) fn decode(
    node: &Node,
    quota: Option<Option<Quota>>,
    errors: &mut Errors,
) -> Option<DegradeThreshold> {
    let fields = Fields::new(node, "`degrade`", DEGRADE_FIELDS, errors)?;
    let Some(at) = fields.get("below_remaining") else {
        errors.push((
            node.pos,
            "`degrade` is missing required field `below_remaining` (a percentage such as `20%`, or a count)"
                .to_string(),
        ));
        return None;
    };
    let threshold = match &at.kind {
        Kind::Scalar {
            text,
            quoted: false,
        } if text.ends_with('%') => {
            let digits = text.trim_end_matches('%').trim();
            match digits.parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => DegradeThreshold::Percent(p),
                _ => {
                    errors.push((
                        at.pos,
                        format!(
                            "`below_remaining` must be a whole percentage from 1% to 100%, found {text}"
                        ),
                    ));
                    return None;
                }
            }
        }
        _ => DegradeThreshold::Remaining(integer(
            at,
            "below_remaining",
            1,
            u64::from(u32::MAX),
            errors,
        )?),
    };
    match quota {
        None => {
            errors.push((
                node.pos,
                "`degrade` needs a `rate_limit` on the same descriptor".to_string(),
            ));
            None
        }
        Some(None) => {
            errors.push((
                node.pos,
                "`degrade` cannot be used with `unlimited: true` (nothing ever runs low)"
                    .to_string(),
            ));
            None
        }
        Some(Some(q)) => {
            let capacity = q.limit().max(q.burst().unwrap_or(0));
            if let DegradeThreshold::Remaining(n) = threshold {
                if n > capacity {
                    errors.push((
                        at.pos,
                        format!(
                            "`below_remaining` {n} is more than the {capacity} this limit can ever have left: every answer would degrade"
                        ),
                    ));
                    return None;
                }
            }
            Some(threshold)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decision(allowed: bool, remaining: u64, limit: u64) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            ..Decision::default()
        }
    }

    #[test]
    fn edges() {
        let p = DegradeThreshold::Percent(20);
        assert!(p.signals(&decision(true, 19, 100)));
        assert!(!p.signals(&decision(true, 20, 100)));
        assert!(!p.signals(&decision(false, 0, 100)));
        let n = DegradeThreshold::Remaining(5);
        assert!(n.signals(&decision(true, 4, 100)));
        assert!(!n.signals(&decision(true, 5, 100)));
        assert!(DegradeThreshold::Percent(100).signals(&decision(true, 99, 100)));
        assert!(!DegradeThreshold::Percent(100).signals(&decision(true, 100, 100)));
        assert!(DegradeThreshold::Percent(1).below(0, u64::MAX));
        assert!(!DegradeThreshold::Percent(1).below(u64::MAX, u64::MAX));
    }

    proptest! {
        #[test]
        fn signal_iff_allowed_and_below(allowed: bool, remaining in 0u64..10_000, limit in 0u64..10_000, p in 1u8..=100, n in 1u64..10_000) {
            let d = decision(allowed, remaining, limit);
            // Below p% of the limit: below the smallest whole count that is at least p% of it.
            let share = (u64::from(p) * limit).div_ceil(100);
            prop_assert_eq!(DegradeThreshold::Percent(p).signals(&d), allowed && remaining < share);
            prop_assert_eq!(DegradeThreshold::Remaining(n).signals(&d), allowed && remaining < n);
        }
    }
}
