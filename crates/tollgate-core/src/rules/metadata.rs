//! A descriptor's `metadata`: an arbitrary map that envoyproxy/ratelimit hands back to Envoy as
//! dynamic metadata (when enabled). Kept as a small JSON-like value so that the core needs no
//! serialisation crate; transports convert it to what they speak (a protobuf `Struct`, JSON).
//!
//! Scalars are typed the way Go's YAML decoder (used by envoyproxy/ratelimit) types them:
//! unquoted `true`/`yes`/`on`... are booleans, `~`/`null`/nothing is null, integers and floats
//! are numbers (protobuf `Struct` numbers are doubles), anything else or quoted is a string.

use super::fields::Errors;
use super::yaml::{Kind, Node};
use std::collections::BTreeMap;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `null`, `~` or nothing.
    Null,
    /// A boolean.
    Bool(bool),
    /// A number (always finite: `.inf` and `.nan` are rejected when loading).
    Number(f64),
    /// A string.
    String(String),
    /// A list.
    List(Vec<MetaValue>),
    /// A map, keys sorted.
    Map(BTreeMap<String, MetaValue>),
}

// Numbers are finite (checked when decoding), so equality is reflexive.
impl Eq for MetaValue {}

/// Decodes the `metadata` field: it must be a mapping. `None` (with an error recorded) when a
/// value cannot be represented.
pub(crate) fn decode(node: &Node, errors: &mut Errors) -> Option<BTreeMap<String, MetaValue>> {
    match &node.kind {
        Kind::Map(_) => match value(node, errors)? {
            MetaValue::Map(m) => Some(m),
            _ => None,
        },
        _ => {
            errors.push((
                node.pos,
                format!("`metadata` must be a mapping, found {}", node.describe()),
            ));
            None
        }
    }
}

fn value(node: &Node, errors: &mut Errors) -> Option<MetaValue> {
    Some(match &node.kind {
        Kind::Scalar { text, quoted: true } => MetaValue::String(text.clone()),
        Kind::Scalar { text, .. } => {
            if node.is_null() {
                MetaValue::Null
            } else if let Some(b) = super::fields::parse_bool(text) {
                MetaValue::Bool(b)
            } else if let Some(n) = number(text) {
                if !n.is_finite() {
                    errors.push((
                        node.pos,
                        format!("`metadata` value {text} is not a finite number"),
                    ));
                    return None;
                }
                MetaValue::Number(n)
            } else {
                MetaValue::String(text.clone())
            }
        }
        Kind::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for i in items {
                out.push(value(i, errors)?);
            }
            MetaValue::List(out)
        }
        Kind::Map(entries) => {
            let mut out = BTreeMap::new();
            for e in entries {
                out.insert(e.key.clone(), value(&e.value, errors)?);
            }
            MetaValue::Map(out)
        }
    })
}

/// A YAML 1.1 number (`10`, `-3`, `0x1F`, `1.5`, `1e3`, `.inf`, `.nan`), as a double.
fn number(text: &str) -> Option<f64> {
    let t = text.replace('_', "");
    let (neg, digits) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(&t)),
    };
    let sign = if neg { -1.0 } else { 1.0 };
    if let Some(h) = digits.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok().map(|v| sign * v as f64);
    }
    if let Some(o) = digits.strip_prefix("0o") {
        return u64::from_str_radix(o, 8).ok().map(|v| sign * v as f64);
    }
    match digits {
        ".inf" | ".Inf" | ".INF" => return Some(sign * f64::INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    let numeric = !digits.is_empty()
        && digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && digits
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    if !numeric {
        return None;
    }
    digits.parse::<f64>().ok().map(|v| sign * v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(number("10"), Some(10.0));
        assert_eq!(number("-2.5"), Some(-2.5));
        assert_eq!(number("0x10"), Some(16.0));
        assert_eq!(number("1e3"), Some(1000.0));
        assert_eq!(number("service_1"), None);
        assert_eq!(number("1.2.3"), None);
        assert_eq!(number("e5"), None);
        assert!(number(".inf").is_some_and(f64::is_infinite));
    }
}
