//! The compiled descriptor tree of one domain, and request resolution against it.
//!
//! Resolution is on the hot path of every request, so it never scans the rules: each level of
//! the tree maps a key to its candidates (one hash lookup), then the value to an exact node
//! (a second lookup), falling back to the key's few wildcard patterns in file order, then to its
//! key-only node. That is envoyproxy/ratelimit's precedence: exact value, then wildcard, then
//! key only. The only allocation is the counter key string. Nodes live in one arena per domain
//! and refer to limits by index, so the tree has no reference cycles and no lifetimes.

use super::decode::DescriptorSpec;
use super::stats::{StatsKey, StatsLevel};
use super::Limit;
use std::collections::HashMap;

/// Index of a node in [`Tree::nodes`].
type NodeId = usize;

/// A domain's descriptor tree.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tree {
    root: Level,
    nodes: Vec<Node>,
}

/// The descriptors at one depth under one parent.
#[derive(Debug, Clone, Default)]
struct Level {
    keys: HashMap<String, KeyEntry>,
}

/// Everything at one level for one descriptor key.
#[derive(Debug, Clone, Default)]
struct KeyEntry {
    exact: HashMap<String, NodeId>,
    wildcards: Vec<(Pattern, NodeId)>,
    key_only: Option<NodeId>,
}

#[derive(Debug, Clone)]
struct Node {
    /// Index into the rule set's limits.
    limit: Option<usize>,
    /// For a wildcard node with `share_threshold: true`: the pattern, used in the counter key
    /// in place of the request's value so that every matching value shares one counter.
    shared_value: Option<Box<str>>,
    /// For a tiered rule: the key of the request entry after this node's that names the tier.
    tiers_key: Option<Box<str>>,
    children: Level,
}

/// What resolving a request descriptor found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found<'e> {
    /// No node at the request's depth, or it has no `rate_limit`.
    Nothing,
    /// The limit at index `limit`, the counter key, and for a tiered rule the value of the
    /// request's tier entry (`None` when it has none).
    Limit {
        limit: usize,
        counter_key: String,
        tier: Option<&'e str>,
    },
}

impl Tree {
    /// The same tree with every limit index moved by `offset` (its limits copied to another
    /// rule set at another position: [`super::RuleSet::merged`]).
    pub(crate) fn shifted(&self, offset: isize) -> Tree {
        let mut tree = self.clone();
        for node in &mut tree.nodes {
            node.limit = node.limit.map(|i| i.wrapping_add_signed(offset));
        }
        tree
    }

    /// How many descriptor nodes the tree has.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Builds the tree for `domain`, appending its limits to `limits` (in file order, depth
    /// first).
    pub(crate) fn build(
        domain: &str,
        file: &str,
        descriptors: Vec<DescriptorSpec>,
        limits: &mut Vec<Limit>,
    ) -> Tree {
        let mut tree = Tree::default();
        let mut id = String::new();
        escape_into(&mut id, domain);
        let root = tree.level(domain, file, &id, &mut Vec::new(), descriptors, limits);
        tree.root = root;
        tree
    }

    fn level(
        &mut self,
        domain: &str,
        file: &str,
        parent_id: &str,
        path: &mut Vec<StatsLevel>,
        descriptors: Vec<DescriptorSpec>,
        limits: &mut Vec<Limit>,
    ) -> Level {
        let mut level = Level::default();
        for d in descriptors {
            let file = d.file.as_deref().unwrap_or(file);
            let wildcard = d.value.as_deref().is_some_and(|v| v.contains('*'));
            path.push(StatsLevel {
                key: d.key.clone(),
                value: d.value.clone(),
                wildcard,
                share: wildcard && d.share_threshold,
                value_to_metric: d.value_to_metric,
            });
            let mut id = String::with_capacity(parent_id.len() + d.key.len() + 16);
            id.push_str(parent_id);
            id.push('|');
            escape_into(&mut id, &d.key);
            if let Some(v) = &d.value {
                id.push('=');
                escape_into(&mut id, v);
            }
            let limit = d.rate_limit.map(|rl| {
                limits.push(Limit {
                    id: id.clone(),
                    domain: domain.to_string(),
                    name: rl.name,
                    quota: rl.quota,
                    shadow_mode: d.shadow_mode,
                    message: d.message.clone(),
                    replaces: rl.replaces,
                    detailed_metric: d.detailed_metric,
                    value_to_metric: d.value_to_metric,
                    share_threshold: d.share_threshold,
                    quota_mode: d.quota_mode,
                    algorithm_named: rl.algorithm_named,
                    sync_named: rl.sync_named,
                    count_denied_hits: false,
                    metadata: d.metadata.clone(),
                    degrade: d.degrade,
                    shadowban: d.shadowban,
                    queue: d.queue,
                    tiers: d.tiers.clone(),
                    stats: StatsKey::compile(domain, path, d.detailed_metric),
                    file: file.to_string(),
                    line: d.pos.line,
                });
                limits.len() - 1
            });
            let children = self.level(domain, file, &id, path, d.children, limits);
            path.pop();
            let pattern = d
                .value
                .as_deref()
                .filter(|v| v.contains('*'))
                .map(Pattern::new);
            let shared_value = match (&pattern, d.share_threshold) {
                (Some(_), true) => d.value.as_deref().map(Box::from),
                _ => None,
            };
            let node_id = self.nodes.len();
            self.nodes.push(Node {
                limit,
                shared_value,
                tiers_key: d.tiers.map(|t| t.key.into_boxed_str()),
                children,
            });
            let entry = level.keys.entry(d.key).or_default();
            // Duplicates were rejected by the decoder; first definition wins regardless.
            match (pattern, d.value) {
                (Some(p), _) => entry.wildcards.push((p, node_id)),
                (None, Some(v)) => {
                    entry.exact.entry(v).or_insert(node_id);
                }
                (None, None) => {
                    entry.key_only.get_or_insert(node_id);
                }
            }
        }
        level
    }

    /// Resolves one request descriptor: the node at depth `entries.len()` reached by matching
    /// each entry in turn.
    ///
    /// A tiered node is also reached one entry short: when the last entry's key is the node's
    /// tier key, the node before it is the rule, and that entry names the tier (the decoder
    /// refuses a nested descriptor with that key, so this never hides one).
    pub(crate) fn resolve<'e>(&self, domain: &str, entries: &[(&str, &'e str)]) -> Found<'e> {
        if entries.is_empty() {
            return Found::Nothing;
        }
        let mut level = &self.root;
        // Remember the nodes along the path to build the key only on success.
        let mut path: [NodeId; super::decode::MAX_DEPTH] = [0; super::decode::MAX_DEPTH];
        if entries.len() > path.len() {
            return Found::Nothing;
        }
        let mut depth = entries.len();
        let mut tier = None;
        for (i, (k, v)) in entries.iter().enumerate() {
            if i + 1 == entries.len() && i > 0 {
                let parent = &self.nodes[path[i - 1]];
                if parent.tiers_key.as_deref() == Some(*k) {
                    depth = i;
                    tier = Some(*v);
                    break;
                }
            }
            let Some(entry) = level.keys.get(*k) else {
                return Found::Nothing;
            };
            let found = entry
                .exact
                .get(*v)
                .copied()
                .or_else(|| {
                    entry
                        .wildcards
                        .iter()
                        .find(|(p, _)| p.matches(v))
                        .map(|(_, id)| *id)
                })
                .or(entry.key_only);
            let Some(id) = found else {
                return Found::Nothing;
            };
            path[i] = id;
            level = &self.nodes[id].children;
        }
        let last = &self.nodes[path[depth - 1]];
        let Some(limit) = last.limit else {
            return Found::Nothing;
        };
        let key = counter_key(
            domain,
            entries[..depth]
                .iter()
                .zip(path.iter())
                .map(|((k, v), id)| {
                    let value = self.nodes[*id].shared_value.as_deref().unwrap_or(v);
                    (*k, value)
                }),
        );
        Found::Limit {
            limit,
            counter_key: key,
            tier,
        }
    }
}

impl Tree {
    /// The order in which `entries` (a set of key/value pairs, with no order of its own: a
    /// quota bucket's id) make a descriptor of this tree that has a limit: positions into
    /// `entries`, outermost first. Depth first: at each level, the unused entries whose key the
    /// level has are tried in the order given, each matched as [`Tree::resolve`] matches a
    /// value (exact, wildcard, key only), and the first order that uses every entry and ends
    /// on a node with a limit wins. `None` when there is none.
    pub(crate) fn order(&self, entries: &[(&str, &str)]) -> Option<Vec<usize>> {
        if entries.is_empty() || entries.len() > super::decode::MAX_DEPTH {
            return None;
        }
        let mut path = Vec::with_capacity(entries.len());
        self.order_from(&self.root, entries, &mut path)
            .then_some(path)
    }

    fn order_from(&self, level: &Level, entries: &[(&str, &str)], path: &mut Vec<usize>) -> bool {
        for (i, (k, v)) in entries.iter().enumerate() {
            if path.contains(&i) {
                continue;
            }
            let Some(entry) = level.keys.get(*k) else {
                continue;
            };
            let found = entry
                .exact
                .get(*v)
                .copied()
                .or_else(|| {
                    entry
                        .wildcards
                        .iter()
                        .find(|(p, _)| p.matches(v))
                        .map(|(_, id)| *id)
                })
                .or(entry.key_only);
            let Some(id) = found else {
                continue;
            };
            path.push(i);
            let node = &self.nodes[id];
            if path.len() == entries.len() {
                if node.limit.is_some() {
                    return true;
                }
            } else if self.order_from(&node.children, entries, path) {
                return true;
            }
            path.pop();
        }
        false
    }
}

/// The counter key `domain|k1=v1|k2=v2`, each part escaped with [`escape_into`].
pub(crate) fn counter_key<'a>(
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)> + Clone,
) -> String {
    let len = entries
        .clone()
        .map(|(k, v)| k.len() + v.len() + 2)
        .sum::<usize>();
    let mut key = String::with_capacity(domain.len() + len + 8);
    escape_into(&mut key, domain);
    for (k, v) in entries {
        key.push('|');
        escape_into(&mut key, k);
        key.push('=');
        escape_into(&mut key, v);
    }
    key
}

/// Appends `s`, prefixing each `\`, `|` and `=` with a backslash, so that the separators of a
/// counter key or rule id can never come from user input.
pub(crate) fn escape_into(out: &mut String, s: &str) {
    // The common case (no separator in the text) is one copy.
    if !s.bytes().any(|b| matches!(b, b'\\' | b'|' | b'=')) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        if matches!(c, '\\' | '|' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// A value pattern where `*` matches any run of characters, including none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern {
    /// The literal pieces between the stars; `parts.len()` = number of stars + 1.
    parts: Vec<String>,
}

impl Pattern {
    /// Compiles `pattern`.
    pub(crate) fn new(pattern: &str) -> Self {
        Pattern {
            parts: pattern.split('*').map(str::to_string).collect(),
        }
    }

    /// Whether `value` matches: it starts with the first piece, ends with the last, and holds
    /// the middle pieces in order in between (leftmost matching is optimal for `*`-only globs).
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(x) => x,
            None => return value.is_empty(),
        };
        let Some(mut remaining) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            // No star at all: exact.
            return remaining.is_empty();
        };
        for part in middle {
            match remaining.find(part.as_str()) {
                Some(at) => remaining = &remaining[at + part.len()..],
                None => return false,
            }
        }
        remaining.len() >= last.len() && remaining.ends_with(last.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "anything", true),
            ("value*", "value", true),
            ("value*", "value_1", true),
            ("value*", "valu", false),
            ("*end", "the end", true),
            ("*end", "end", true),
            ("*end", "ending", false),
            ("/api/*/items", "/api/1/items", true),
            ("/api/*/items", "/api//items", true),
            ("/api/*/items", "/api/1/item", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("**", "x", true),
            ("a*b", "ab", true),
            ("ab*ba", "aba", false),
            ("ab*ba", "abba", true),
            ("*x*", "yyy", false),
            ("*x*", "yxy", true),
            ("é*ü", "éaü", true),
        ];
        for (p, v, want) in cases {
            assert_eq!(Pattern::new(p).matches(v), *want, "{p:?} vs {v:?}");
        }
    }

    #[test]
    fn escaping() {
        let mut s = String::new();
        escape_into(&mut s, r"a|b=c\d");
        assert_eq!(s, r"a\|b\=c\\d");
    }
}
