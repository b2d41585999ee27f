//! A rule's stats key: the name envoyproxy/ratelimit gives a rule's counters
//! (`domain.key_value.key`), so that per-rule metrics keep their names when a deployment moves
//! over, whatever the metrics' format (Prometheus label, statsd name).
//!
//! envoyproxy/ratelimit builds the key while it walks a request down the descriptor tree. The
//! walk's shape is fixed for a given rule (the node at each level is the rule's ancestor, and
//! how it matched follows from the node: exact value, wildcard, or key only), so the key is
//! compiled once per rule into one part per level. Only the parts that print a request value
//! are filled in per request, and most rules have none: their key is one static string.
//!
//! Per level, as envoyproxy/ratelimit composes them:
//! - exact value: `key_value`; key only: `key`; wildcard: `key_pattern` (the `*` kept);
//! - `value_to_metric` on a key-only or wildcard level: `key_<request value>` (`key` when the
//!   value is empty), except a wildcard with `share_threshold`, which keeps its pattern;
//! - `detailed_metric` on the rule: every level is `key_<request value>` (underscore even for
//!   an empty value), unless some level has `share_threshold` under a wildcard: then those
//!   levels keep their pattern and the others are `key_<value>` (`key` when empty).

use std::borrow::Cow;

/// How one descriptor level appears in a stats key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Always this text (`key`, `key_value`, `key_pattern`).
    Fixed(Box<str>),
    /// `key_<request value>`, or `key` when the value is empty.
    Value(Box<str>),
    /// `key_<request value>`, the underscore kept for an empty value (`detailed_metric`).
    Detailed(Box<str>),
}

/// One level of a rule's path, as the stats key needs it.
#[derive(Debug, Clone)]
pub(crate) struct StatsLevel {
    pub key: String,
    /// The configured value (a pattern when `wildcard`); `None` for a key-only level.
    pub value: Option<String>,
    pub wildcard: bool,
    /// `share_threshold: true` on a wildcard level.
    pub share: bool,
    pub value_to_metric: bool,
}

/// A rule's envoyproxy/ratelimit stats key (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsKey {
    /// The configured path (envoyproxy/ratelimit's `FullKey`), and the key itself when static.
    base: String,
    /// The domain, and one part per level when some part prints a request value.
    dynamic: Option<(Box<str>, Box<[Part]>)>,
}

impl StatsKey {
    /// The key of a rule reached through `levels` (root first) in `domain`; `detailed` is the
    /// rule's `detailed_metric`.
    pub(crate) fn compile(domain: &str, levels: &[StatsLevel], detailed: bool) -> StatsKey {
        let configured = |l: &StatsLevel| -> Box<str> {
            match &l.value {
                Some(v) => format!("{}_{v}", l.key).into(),
                None => l.key.as_str().into(),
            }
        };
        let mut base = domain.to_string();
        for l in levels {
            base.push('.');
            base.push_str(&configured(l));
        }
        let any_share = levels.iter().any(|l| l.share);
        let parts: Vec<Part> = levels
            .iter()
            .map(|l| {
                let key: Box<str> = l.key.as_str().into();
                if detailed {
                    if l.share {
                        Part::Fixed(configured(l))
                    } else if any_share {
                        Part::Value(key)
                    } else {
                        Part::Detailed(key)
                    }
                } else if l.value_to_metric && !l.share && (l.wildcard || l.value.is_none()) {
                    Part::Value(key)
                } else {
                    Part::Fixed(configured(l))
                }
            })
            .collect();
        let dynamic = parts
            .iter()
            .any(|p| !matches!(p, Part::Fixed(_)))
            .then(|| (Box::from(domain), parts.into_boxed_slice()));
        StatsKey { base, dynamic }
    }

    /// The key of a limit given with the request (envoyproxy/ratelimit names its counters after
    /// the request's descriptor: `domain.key_value.key`, `key` alone for an empty value).
    pub fn of_descriptor<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> StatsKey {
        let mut base = domain.to_string();
        for (k, v) in entries {
            push_value(&mut base, k, v);
        }
        StatsKey {
            base,
            dynamic: None,
        }
    }

    /// The configured path (`domain.key_value.key`, patterns kept): the key itself when
    /// [`StatsKey::is_static`], else the bounded name to fold request values into.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether the key is the same for every request (no level prints a request value).
    pub fn is_static(&self) -> bool {
        self.dynamic.is_none()
    }

    /// The key for a request descriptor that resolved to this rule (its entries in order).
    /// Borrowed, no allocation, when static.
    pub fn for_request<'s, K: AsRef<str>, V: AsRef<str>>(
        &'s self,
        entries: &[(K, V)],
    ) -> Cow<'s, str> {
        let Some((domain, parts)) = &self.dynamic else {
            return Cow::Borrowed(&self.base);
        };
        let mut out = String::with_capacity(self.base.len() + 32);
        out.push_str(domain);
        for (part, (_, v)) in parts.iter().zip(entries) {
            let v = v.as_ref();
            match part {
                Part::Fixed(text) => {
                    out.push('.');
                    out.push_str(text);
                }
                Part::Value(key) => push_value(&mut out, key, v),
                Part::Detailed(key) => {
                    out.push('.');
                    out.push_str(key);
                    out.push('_');
                    out.push_str(v);
                }
            }
        }
        Cow::Owned(out)
    }
}

/// Appends `.key_value`, or `.key` when `value` is empty.
fn push_value(out: &mut String, key: &str, value: &str) {
    out.push('.');
    out.push_str(key);
    if !value.is_empty() {
        out.push('_');
        out.push_str(value);
    }
}
