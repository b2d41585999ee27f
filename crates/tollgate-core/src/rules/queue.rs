//! A rule's `queue` option: a request the rule denies waits for capacity, up to a bound, instead
//! of being refused (the waiting itself is [`crate::queue`] and the transports').
//!
//! `queue: {max_wait: 500ms, max_length: 100}`. Both bounds are required and bounded, so that a
//! rule file cannot make a process hold unbounded waiters or hold a client for minutes: waits of
//! 1 ms to 60 s, lines of 1 to 100,000 waiters. A queue shapes denials into waits, so it has no
//! meaning on rules that never deny (`shadow_mode`, `unlimited`), nor on `quota_mode` (whose
//! denials depend on other limits) or `shadowban` (whose denials are answered as successes).

use super::fields::{integer, Errors, Fields};
use super::yaml::{Kind, Node};
use crate::clock::{Micros, SECOND};

const MILLISECOND: Micros = 1_000;

/// A waiting request's priority: 0 is served first. Requests without a tier wait at [`LOWEST`].
pub type Priority = u8;

/// The priority of a request that has no tier.
pub const LOWEST: Priority = Priority::MAX;

/// Fields of a `queue` block.
const QUEUE_FIELDS: &[&str] = &["max_wait", "max_length"];

/// Shortest `max_wait` accepted.
pub const MIN_WAIT: Micros = MILLISECOND;
/// Longest `max_wait` accepted.
pub const MAX_WAIT: Micros = 60 * SECOND;
/// Longest `max_length` accepted.
pub const MAX_LENGTH: usize = 100_000;

/// How a rule's denials wait instead of being refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuePolicy {
    /// The longest a request may wait, from its arrival ([`MIN_WAIT`] to [`MAX_WAIT`]).
    pub max_wait: Micros,
    /// The most requests that may wait for one counter (1 to [`MAX_LENGTH`]).
    pub max_length: usize,
}

impl QueuePolicy {
    /// A policy; `None` when a bound is out of range.
    pub fn new(max_wait: Micros, max_length: usize) -> Option<Self> {
        ((MIN_WAIT..=MAX_WAIT).contains(&max_wait) && (1..=MAX_LENGTH).contains(&max_length))
            .then_some(Self {
                max_wait,
                max_length,
            })
    }
}

/// What the options a queue cannot go with are set to on the same descriptor.
pub(super) struct Conflicts {
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub shadowban: bool,
    /// The descriptor has a `rate_limit`.
    pub has_rate_limit: bool,
    /// That `rate_limit` is `unlimited: true`.
    pub unlimited: bool,
}

/// Decodes `queue: {max_wait: 500ms, max_length: 100}`.
pub(super) fn decode(
    node: &Node,
    conflicts: Conflicts,
    errors: &mut Errors,
) -> Option<QueuePolicy> {
    let fields = Fields::new(node, "`queue`", QUEUE_FIELDS, errors)?;
    let mut missing = |field: &str, example: &str| {
        errors.push((
            node.pos,
            format!("`queue` is missing required field `{field}` ({example})"),
        ));
    };
    let wait_node = fields.get("max_wait");
    let length_node = fields.get("max_length");
    if wait_node.is_none() {
        missing(
            "max_wait",
            "how long a request may wait, e.g. `500ms` or `2s`",
        );
    }
    if length_node.is_none() {
        missing(
            "max_length",
            "how many requests may wait per counter, e.g. `100`",
        );
    }
    let max_wait = wait_node.and_then(|n| duration(n, "max_wait", errors));
    let max_length = length_node
        .and_then(|n| integer(n, "max_length", 1, MAX_LENGTH as u64, errors))
        .map(|n| n as usize);
    let conflict = if conflicts.shadow_mode {
        Some("`queue` cannot be combined with `shadow_mode` (a shadow-mode rule never denies)")
    } else if conflicts.quota_mode {
        Some("`queue` cannot be combined with `quota_mode` (its denials depend on the request's other limits)")
    } else if conflicts.shadowban {
        Some("`queue` cannot be combined with `shadowban` (its denials are answered as successes)")
    } else if !conflicts.has_rate_limit {
        Some("`queue` needs a `rate_limit` on the same descriptor")
    } else if conflicts.unlimited {
        Some("`queue` cannot be used with `unlimited: true` (it never denies)")
    } else {
        None
    };
    if let Some(message) = conflict {
        errors.push((node.pos, message.to_string()));
        return None;
    }
    QueuePolicy::new(max_wait?, max_length?)
}

/// `500ms`, `2s`, `1.5s`: a duration from [`MIN_WAIT`] to [`MAX_WAIT`] (1 ms to 60 s), whole
/// milliseconds; `field` names it in errors. Shared by the rules' durations (`max_wait`,
/// `flush_interval`).
pub(super) fn duration(node: &Node, field: &str, errors: &mut Errors) -> Option<Micros> {
    let text = match &node.kind {
        Kind::Scalar { text, .. } => text.trim(),
        _ => "",
    };
    let parsed = if let Some(ms) = text.strip_suffix("ms") {
        ms.trim()
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(MILLISECOND))
    } else if let Some(s) = text.strip_suffix('s') {
        seconds(s.trim())
    } else {
        None
    };
    let Some(wait) = parsed else {
        errors.push((
            node.pos,
            format!(
                "`{field}` must be a duration such as `500ms` or `2s`, found {}",
                node.describe()
            ),
        ));
        return None;
    };
    if !(MIN_WAIT..=MAX_WAIT).contains(&wait) {
        errors.push((
            node.pos,
            format!("`{field}` must be from 1ms to 60s, found {text}"),
        ));
        return None;
    }
    Some(wait)
}

/// Seconds with up to three decimals (`1`, `1.5`, `0.25`), in microseconds.
fn seconds(text: &str) -> Option<Micros> {
    let (whole, frac) = match text.split_once('.') {
        Some((_, "")) => return None,
        Some(parts) => parts,
        None => (text, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let millis: u64 = format!("{frac:0<3}").parse().ok()?;
    whole.checked_mul(SECOND)?.checked_add(millis * MILLISECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_parse() {
        assert_eq!(seconds("1"), Some(SECOND));
        assert_eq!(seconds("1.5"), Some(1_500 * MILLISECOND));
        assert_eq!(seconds("0.25"), Some(250 * MILLISECOND));
        for bad in ["", ".5", "1.", "1.2345", "-1", "x", "1e3"] {
            assert_eq!(seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn bounds() {
        assert!(QueuePolicy::new(MIN_WAIT, 1).is_some());
        assert!(QueuePolicy::new(MAX_WAIT, MAX_LENGTH).is_some());
        assert!(QueuePolicy::new(MIN_WAIT - 1, 1).is_none());
        assert!(QueuePolicy::new(MAX_WAIT + 1, 1).is_none());
        assert!(QueuePolicy::new(MIN_WAIT, 0).is_none());
        assert!(QueuePolicy::new(MIN_WAIT, MAX_LENGTH + 1).is_none());
    }
}

#[cfg(test)]
mod rule_tests {
    use crate::rules::RuleSet;

    fn load(descriptor: &str) -> Result<RuleSet, String> {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n{descriptor}");
        RuleSet::from_sources(&[("q.yaml".into(), text)]).map_err(|e| e.to_string())
    }

    #[test]
    fn decoded_and_flagged() {
        let rules = load("    rate_limit: {unit: second, requests_per_unit: 1}\n    queue: {max_wait: 1.5s, max_length: 7}\n").unwrap();
        let limit = rules.limits().next().unwrap();
        let q = limit.queue.unwrap();
        assert_eq!((q.max_wait, q.max_length), (1_500_000, 7));
        assert!(rules.has_queues());
        let plain = load("    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
        assert!(!plain.has_queues());
    }

    #[test]
    fn bad_queues_are_clear_errors_with_file_and_line() {
        let rl = "    rate_limit: {unit: second, requests_per_unit: 1}\n";
        for (extra, expected) in [
            ("    queue: {max_wait: 0ms, max_length: 1}\n", "q.yaml:5:"),
            (
                "    queue: {max_wait: 61s, max_length: 1}\n",
                "from 1ms to 60s",
            ),
            (
                "    queue: {max_wait: soon, max_length: 1}\n",
                "must be a duration",
            ),
            ("    queue: {max_wait: 1s, max_length: 0}\n", "at least 1"),
            (
                "    queue: {max_wait: 1s, max_length: 100001}\n",
                "too large",
            ),
            (
                "    queue: {max_wait: 1s}\n",
                "missing required field `max_length`",
            ),
            (
                "    queue: {max_wait: 1s, max_length: 1, fair: true}\n",
                "unknown field `fair`",
            ),
            (
                "    shadow_mode: true\n    queue: {max_wait: 1s, max_length: 1}\n",
                "cannot be combined with `shadow_mode`",
            ),
            (
                "    quota_mode: true\n    queue: {max_wait: 1s, max_length: 1}\n",
                "cannot be combined with `quota_mode`",
            ),
            (
                "    shadowban: true\n    queue: {max_wait: 1s, max_length: 1}\n",
                "cannot be combined with `shadowban`",
            ),
        ] {
            let err = load(&format!("{rl}{extra}")).unwrap_err();
            assert!(
                err.contains(expected) && err.contains("q.yaml:"),
                "{extra}: {err}"
            );
        }
        let err = load("    queue: {max_wait: 1s, max_length: 1}\n").unwrap_err();
        assert!(err.contains("needs a `rate_limit`"), "{err}");
        let err =
            load("    rate_limit: {unlimited: true}\n    queue: {max_wait: 1s, max_length: 1}\n")
                .unwrap_err();
        assert!(err.contains("`unlimited: true`"), "{err}");
    }
}
