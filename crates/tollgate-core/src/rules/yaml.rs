//! A small YAML tree that remembers where every node came from.
//!
//! `yaml_rust2::Yaml` drops source positions, and rule errors must point at the offending line
//! and column, so the tree is built here from the parser's marked events. Building it
//! iteratively (an explicit stack, not recursion) with a nesting cap and a node budget means no
//! input can overflow the stack or blow up memory through alias expansion ("billion laughs").
//! Scalars keep their raw text and whether they were quoted: typing (`10` is an integer, `"10"`
//! is a string) is the decoder's job, where the field name is known for the error message.
//! Duplicate map keys, which YAML forbids but many parsers silently accept (last one wins), are
//! reported instead of dropped.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Deepest nesting of collections accepted. Legitimate rule files need about 2 per descriptor
/// level (a list, then a map) plus a few: 16 descriptor levels stay well below this.
const MAX_NESTING: usize = 64;

/// Most nodes a document may expand to, aliases included.
const MAX_NODES: usize = 1_000_000;

/// Most nodes that aliases may add in total. Each alias copies its anchor's subtree, so this is
/// what bounds the memory a small text can ask for: without it a few kilobytes of nested
/// aliases build up to [`MAX_NODES`] (about 100 MB) before being refused. Rule files use
/// aliases for a shared `rate_limit` block or two, a handful of nodes each.
const MAX_ALIAS_NODES: usize = 16_384;

/// A position in the source: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

impl From<&Marker> for Pos {
    fn from(m: &Marker) -> Self {
        // yaml-rust2 lines are 1-based, columns 0-based.
        Pos {
            line: m.line(),
            column: m.col() + 1,
        }
    }
}

/// A YAML node with its position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub pos: Pos,
    pub kind: Kind,
    /// Number of nodes in this subtree (for the alias-expansion budget).
    weight: usize,
}

/// What a node holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// A scalar: its text and whether it was quoted or a block scalar (then it is always a
    /// string, never a number, boolean or null).
    Scalar { text: String, quoted: bool },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order; keys are unique.
    Map(Vec<Entry>),
}

/// One mapping entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub key: String,
    pub key_pos: Pos,
    pub value: Node,
}

impl Node {
    /// Whether this is the YAML null (`~`, `null`, or nothing at all).
    pub(crate) fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, quoted: false }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// An empty mapping at `pos` (what a null action body such as `remote_address:` stands for).
    pub(crate) fn empty_map(pos: Pos) -> Node {
        Node {
            pos,
            kind: Kind::Map(Vec::new()),
            weight: 1,
        }
    }

    /// A short description of the node's type for "expected X, found Y" messages.
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            Kind::Seq(_) => "a list".to_string(),
            Kind::Map(_) => "a mapping".to_string(),
            Kind::Scalar { .. } if self.is_null() => "null".to_string(),
            Kind::Scalar { text, quoted: true } => format!("string {text:?}"),
            Kind::Scalar {
                text,
                quoted: false,
            } => format!("`{}`", truncate(text, 40)),
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A problem found while building the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub pos: Pos,
    pub message: String,
}

/// The result of parsing one document: the root (None for an empty document, or when the
/// YAML itself is broken) and the problems found.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub root: Option<Node>,
    pub errors: Vec<YamlError>,
}

enum Frame {
    Seq {
        pos: Pos,
        anchor: usize,
        items: Vec<Node>,
        weight: usize,
    },
    Map {
        pos: Pos,
        anchor: usize,
        entries: Vec<Entry>,
        weight: usize,
        /// Where the first key starts: a block mapping's start event is only emitted at its
        /// first `:`, so this is where the mapping really begins.
        first_key: Option<Pos>,
        /// The key read, waiting for its value; `None` in the key is a key that was rejected
        /// (duplicate or not a scalar): its value is parsed and dropped.
        pending: Option<Option<(String, Pos)>>,
    },
}

struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    root: Option<Node>,
    errors: Vec<YamlError>,
    nodes: usize,
    /// Nodes added by aliases so far.
    alias_nodes: usize,
}

impl Builder {
    fn finish_node(&mut self, node: Node, anchor: usize) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(node.weight);
        if self.nodes > MAX_NODES {
            return Err(YamlError {
                pos: node.pos,
                message: format!(
                    "document too large (more than {MAX_NODES} nodes after expanding aliases)"
                ),
            });
        }
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, weight, .. }) => {
                *weight = weight.saturating_add(node.weight);
                items.push(node);
            }
            Some(Frame::Map {
                entries,
                pending,
                weight,
                first_key,
                ..
            }) => {
                *weight = weight.saturating_add(node.weight);
                match pending.take() {
                    Some(Some((key, key_pos))) => entries.push(Entry {
                        key,
                        key_pos,
                        value: node,
                    }),
                    Some(None) => {}
                    None => {
                        // This node is a key.
                        if first_key.is_none() {
                            *first_key = Some(node.pos);
                        }
                        let key = match node.kind {
                            Kind::Scalar { text, .. } => {
                                if entries.iter().any(|e| e.key == text) {
                                    self.errors.push(YamlError {
                                        pos: node.pos,
                                        message: format!("duplicate key `{text}` in mapping"),
                                    });
                                    None
                                } else {
                                    Some((text, node.pos))
                                }
                            }
                            _ => {
                                self.errors.push(YamlError {
                                    pos: node.pos,
                                    message:
                                        "mapping keys must be plain strings, not lists or mappings"
                                            .to_string(),
                                });
                                None
                            }
                        };
                        *pending = Some(key);
                    }
                }
            }
        }
        Ok(())
    }

    fn push_frame(&mut self, frame: Frame, pos: Pos) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_NESTING {
            return Err(YamlError {
                pos,
                message: format!("YAML nested more than {MAX_NESTING} levels deep"),
            });
        }
        self.stack.push(frame);
        Ok(())
    }
}

/// Parses one YAML document into a marked tree.
pub(crate) fn parse(text: &str) -> Parsed {
    let mut b = Builder {
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        errors: Vec::new(),
        nodes: 0,
        alias_nodes: 0,
    };
    match run(&mut b, text) {
        Ok(()) => Parsed {
            root: b.root,
            errors: b.errors,
        },
        Err(e) => {
            b.errors.push(e);
            Parsed {
                root: None,
                errors: b.errors,
            }
        }
    }
}

/// A scanner error, placed where the problem was found as libyaml (and so Go's YAML parser, and
/// envoyproxy/ratelimit) places it. yaml-rust2 marks the start of the token it was scanning;
/// when the problem is the end of the text ("found unexpected end of stream", an unterminated
/// quote for instance) the error is at the end of the text, and names where the token began.
fn scan_error(text: &str, e: &yaml_rust2::ScanError) -> YamlError {
    let start = Pos::from(e.marker());
    if e.info().contains("unexpected end of stream") {
        let last = text.rsplit('\n').next().unwrap_or_default();
        return YamlError {
            pos: Pos {
                line: text.matches('\n').count() + 1,
                column: last.chars().count() + 1,
            },
            message: format!(
                "invalid YAML: {} (it began at line {}, column {})",
                e.info(),
                start.line,
                start.column
            ),
        };
    }
    YamlError {
        pos: start,
        message: format!("invalid YAML: {}", e.info()),
    }
}

fn run(b: &mut Builder, text: &str) -> Result<(), YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut documents = 0usize;
    // Where a second document began: it may only be empty (a trailing `---`, which
    // envoyproxy/ratelimit's reader ignores, as it reads the first document only).
    let mut extra: Option<Pos> = None;
    loop {
        let (event, mark) = parser.next_token().map_err(|e| scan_error(text, &e))?;
        let pos = Pos::from(&mark);
        if let Some(at) = extra {
            match event {
                Event::StreamEnd => return Ok(()),
                Event::Nothing | Event::DocumentStart | Event::DocumentEnd => continue,
                Event::Scalar(ref t, TScalarStyle::Plain, 0, None) if t.is_empty() || t == "~" => {
                    continue
                }
                _ => {
                    return Err(YamlError {
                        pos: at,
                        message: "a rule file holds one YAML document (one domain); found a second `---` document"
                            .to_string(),
                    })
                }
            }
        }
        match event {
            Event::StreamEnd => return Ok(()),
            Event::Nothing | Event::StreamStart | Event::DocumentEnd => {}
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    extra = Some(pos);
                }
            }
            Event::Alias(id) => {
                let weight = b.anchors.get(&id).map_or(0, |n| n.weight);
                b.alias_nodes = b.alias_nodes.saturating_add(weight);
                if b.alias_nodes > MAX_ALIAS_NODES {
                    return Err(YamlError {
                        pos,
                        message: format!(
                            "document too large (aliases expand to more than {MAX_ALIAS_NODES} nodes)"
                        ),
                    });
                }
                let node = b.anchors.get(&id).cloned().ok_or_else(|| YamlError {
                    pos,
                    message: "alias refers to an unknown anchor".to_string(),
                })?;
                let node = Node { pos, ..node };
                b.finish_node(node, 0)?;
            }
            Event::Scalar(text, style, anchor, tag) => {
                let is_str_tag = tag.as_ref().is_some_and(|t| t.suffix == "str");
                let quoted = is_str_tag || !matches!(style, TScalarStyle::Plain);
                let node = Node {
                    pos,
                    kind: Kind::Scalar { text, quoted },
                    weight: 1,
                };
                b.finish_node(node, anchor)?;
            }
            Event::SequenceStart(anchor, _) => b.push_frame(
                Frame::Seq {
                    pos,
                    anchor,
                    items: Vec::new(),
                    weight: 1,
                },
                pos,
            )?,
            Event::MappingStart(anchor, _) => b.push_frame(
                Frame::Map {
                    pos,
                    anchor,
                    entries: Vec::new(),
                    weight: 1,
                    first_key: None,
                    pending: None,
                },
                pos,
            )?,
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match b.stack.pop() {
                    Some(Frame::Seq {
                        pos,
                        anchor,
                        items,
                        weight,
                    }) => (
                        Node {
                            pos,
                            kind: Kind::Seq(items),
                            weight,
                        },
                        anchor,
                    ),
                    Some(Frame::Map {
                        pos,
                        anchor,
                        entries,
                        weight,
                        first_key,
                        ..
                    }) => (
                        Node {
                            pos: match first_key {
                                Some(k) if (k.line, k.column) < (pos.line, pos.column) => k,
                                _ => pos,
                            },
                            kind: Kind::Map(entries),
                            weight,
                        },
                        anchor,
                    ),
                    None => {
                        return Err(YamlError {
                            pos,
                            message: "invalid YAML: unbalanced collection end".to_string(),
                        })
                    }
                };
                b.finish_node(node, anchor)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(node: &Node) -> &[Entry] {
        match &node.kind {
            Kind::Map(e) => e,
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn positions_are_one_based() {
        let p = parse("domain: api\ndescriptors:\n  - key: user\n    value: \"x\"\n");
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let root = p.root.expect("root");
        assert_eq!(root.pos, Pos { line: 1, column: 1 });
        let entries = map(&root);
        assert_eq!(entries[0].key, "domain");
        assert_eq!(entries[0].value.pos, Pos { line: 1, column: 9 });
        let Kind::Seq(items) = &entries[1].value.kind else {
            panic!("not a seq")
        };
        let d = map(&items[0]);
        assert_eq!(d[0].key_pos, Pos { line: 3, column: 5 });
        assert_eq!(items[0].pos, Pos { line: 3, column: 5 });
        assert_eq!(
            d[1].value.kind,
            Kind::Scalar {
                text: "x".into(),
                quoted: true
            }
        );
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let p = parse("a: 1\nb: 2\na: 3\n");
        assert_eq!(p.errors.len(), 1);
        assert_eq!(p.errors[0].pos, Pos { line: 3, column: 1 });
        assert!(p.errors[0].message.contains("duplicate key `a`"));
        // The first value is kept.
        let root = p.root.expect("root");
        assert_eq!(map(&root).len(), 2);
    }

    #[test]
    fn syntax_error_has_position() {
        let p = parse("a: [1, 2\nb: 3\n");
        assert!(p.root.is_none());
        assert_eq!(p.errors.len(), 1);
        assert!(p.errors[0].message.starts_with("invalid YAML"));
        assert!(p.errors[0].pos.line >= 1);
    }

    #[test]
    fn deep_nesting_is_rejected_not_overflowed() {
        // Flow collections: the scanner's own limit.
        let p = parse(&"[".repeat(100_000));
        assert!(p.root.is_none());
        assert!(
            p.errors[0].message.contains("recursion limit"),
            "{:?}",
            p.errors
        );
        // Block collections: ours.
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&" ".repeat(i));
            text.push_str("a:\n");
        }
        let p = parse(&text);
        assert!(p.root.is_none());
        assert!(
            p.errors[0].message.contains("nested more than 64"),
            "{:?}",
            p.errors
        );
    }

    #[test]
    fn alias_bombs_are_capped() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let p = parse(&text);
        assert!(p.root.is_none());
        assert!(p.errors[0].message.contains("too large"), "{:?}", p.errors);
    }

    #[test]
    fn aliases_expand() {
        let p = parse("base: &b {unit: second}\nother: *b\n");
        assert!(p.errors.is_empty());
        let root = p.root.expect("root");
        let e = map(&root);
        assert_eq!(map(&e[1].value)[0].key, "unit");
        assert_eq!(e[1].value.pos.line, 2);
    }

    #[test]
    fn second_document_is_rejected() {
        let p = parse("a: 1\n---\nb: 2\n");
        assert!(p.errors[0].message.contains("one YAML document"));
        assert_eq!(p.errors[0].pos.line, 2);
    }

    #[test]
    fn a_trailing_empty_document_is_ignored() {
        for text in [
            "a: 1\n---\n",
            "a: 1\n---\n...\n",
            "a: 1\n--- ~\n",
            "a: 1\n---\n---\n# end\n",
        ] {
            let p = parse(text);
            assert!(p.errors.is_empty(), "{text:?}: {:?}", p.errors);
            assert_eq!(map(&p.root.expect("root"))[0].key, "a", "{text:?}");
        }
        for text in [
            "a: 1\n---\nb: 2\n",
            "a: 1\n---\n---\n- x\n",
            "a: 1\n--- x\n",
        ] {
            let p = parse(text);
            assert!(
                p.errors[0].message.contains("one YAML document"),
                "{text:?}: {:?}",
                p.errors
            );
            assert!(p.errors[0].pos.line >= 2, "{text:?}");
        }
    }

    #[test]
    fn empty_document_has_no_root() {
        let p = parse("# nothing\n");
        assert!(p.errors.is_empty());
        assert!(p.root.is_none());
    }

    #[test]
    fn nulls() {
        let p = parse("a:\nb: ~\nc: null\nd: \"\"\n");
        let root = p.root.expect("root");
        let e = map(&root);
        assert!(e[0].value.is_null());
        assert!(e[1].value.is_null());
        assert!(e[2].value.is_null());
        assert!(!e[3].value.is_null());
    }
}
