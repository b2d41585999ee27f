//! The pieces every part of the rules decoder reads fields with: a mapping's fields checked
//! against the allowed names, strings, bounded strings, flags and integers, each recording an
//! error with its position and carrying on, and the "did you mean" hints.

use super::yaml::{Entry, Kind, Node, Pos};

/// Longest key, value or domain name accepted, in bytes.
pub(crate) const MAX_LEN: usize = 256;

/// Collects errors as `(position, message)`.
pub(crate) type Errors = Vec<(Pos, String)>;

/// The name in `known` closest to `name` (edit distance at most a third of its length, at
/// least 1; case-insensitive), for "did you mean" hints.
pub fn nearest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let name = name.to_lowercase();
    let limit = (name.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (edit_distance(&name, &k.to_lowercase()), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance (insertions, deletions, substitutions), on chars.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// A mapping's fields, checked against the allowed names. Null values count as absent.
pub(crate) struct Fields<'a> {
    entries: &'a [Entry],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(
        node: &'a Node,
        what: &str,
        allowed: &[&str],
        errors: &mut Errors,
    ) -> Option<Fields<'a>> {
        let Kind::Map(entries) = &node.kind else {
            errors.push((
                node.pos,
                format!("{what} must be a mapping, found {}", node.describe()),
            ));
            return None;
        };
        for e in entries {
            if !allowed.contains(&e.key.as_str()) {
                let hint = nearest(&e.key, allowed)
                    .map(|n| format!("did you mean `{n}`? "))
                    .unwrap_or_default();
                errors.push((
                    e.key_pos,
                    format!(
                        "unknown field `{}` in {what} ({hint}allowed: {})",
                        e.key,
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Some(Fields { entries })
    }

    /// A mapping's fields without checking their names (already checked elsewhere).
    pub(crate) fn quiet(node: &'a Node) -> Option<Fields<'a>> {
        match &node.kind {
            Kind::Map(entries) => Some(Fields { entries }),
            _ => None,
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'a Node> {
        self.entries
            .iter()
            .find(|e| e.key == name)
            .map(|e| &e.value)
            .filter(|v| !v.is_null())
    }
}

pub(crate) fn string(node: &Node, field: &str, errors: &mut Errors) -> Option<String> {
    match &node.kind {
        Kind::Scalar { text, .. } => Some(text.clone()),
        _ => {
            errors.push((
                node.pos,
                format!("`{field}` must be a string, found {}", node.describe()),
            ));
            None
        }
    }
}

pub(crate) fn bounded(s: String, node: &Node, field: &str, errors: &mut Errors) -> Option<String> {
    if s.len() > MAX_LEN {
        errors.push((
            node.pos,
            format!(
                "`{field}` is {} bytes long; at most {MAX_LEN} allowed",
                s.len()
            ),
        ));
        None
    } else {
        Some(s)
    }
}

pub(crate) fn flag(fields: &Fields<'_>, field: &str, errors: &mut Errors) -> bool {
    let Some(node) = fields.get(field) else {
        return false;
    };
    let parsed = match &node.kind {
        Kind::Scalar {
            text,
            quoted: false,
        } => parse_bool(text),
        _ => None,
    };
    parsed.unwrap_or_else(|| {
        errors.push((
            node.pos,
            format!("`{field}` must be true or false, found {}", node.describe()),
        ));
        false
    })
}

/// YAML 1.2 core booleans, plus the YAML 1.1 forms Go's yaml.v2 (used by envoyproxy/ratelimit)
/// also accepts, so that its files load unchanged.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "y" | "Y" => {
            Some(true)
        }
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "n" | "N" => {
            Some(false)
        }
        _ => None,
    }
}

/// An unsigned integer in `min..=max`: decimal (optionally `+`, `_` separators as in YAML
/// 1.1), `0x` hexadecimal or `0o` octal. Quoted strings and floats are type errors.
pub(crate) fn integer(
    node: &Node,
    field: &str,
    min: u64,
    max: u64,
    errors: &mut Errors,
) -> Option<u64> {
    // Not a plain scalar and not an integer are one error: a type error, naming what was found.
    let scalar = match &node.kind {
        Kind::Scalar {
            text,
            quoted: false,
        } => Some(text.as_str()),
        _ => None,
    };
    let value = match scalar.map(|text| (text, parse_uint(text))) {
        Some((_, Ok(v))) => v,
        Some((text, Err(IntError::Negative))) => {
            errors.push((
                node.pos,
                format!("`{field}` must not be negative, found {text}"),
            ));
            return None;
        }
        Some((text, Err(IntError::TooLarge))) => {
            errors.push((
                node.pos,
                format!("`{field}` is too large: {text} (at most {max})"),
            ));
            return None;
        }
        None | Some((_, Err(IntError::NotAnInteger))) => {
            errors.push((
                node.pos,
                format!(
                    "`{field}` must be an unsigned integer, found {}",
                    node.describe()
                ),
            ));
            return None;
        }
    };
    if value < min {
        errors.push((
            node.pos,
            format!("`{field}` must be at least {min}, found {value}"),
        ));
        None
    } else if value > max {
        errors.push((
            node.pos,
            format!("`{field}` is too large: {value} (at most {max})"),
        ));
        None
    } else {
        Some(value)
    }
}

enum IntError {
    Negative,
    TooLarge,
    NotAnInteger,
}

fn parse_uint(text: &str) -> Result<u64, IntError> {
    let t = text.strip_prefix('+').unwrap_or(text);
    if let Some(rest) = t.strip_prefix('-') {
        return if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
            if rest.bytes().all(|b| b == b'0' || b == b'_') {
                Ok(0)
            } else {
                Err(IntError::Negative)
            }
        } else {
            Err(IntError::NotAnInteger)
        };
    }
    let (digits, radix) = if let Some(h) = t.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = t.strip_prefix("0o") {
        (o, 8)
    } else {
        (t, 10)
    };
    let cleaned: String = digits.chars().filter(|&c| c != '_').collect();
    if cleaned.is_empty() || !cleaned.chars().all(|c| c.is_digit(radix)) {
        return Err(IntError::NotAnInteger);
    }
    u64::from_str_radix(&cleaned, radix).map_err(|_| IntError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_names() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            nearest("requests_per_minit", &["unit", "requests_per_unit"]),
            Some("requests_per_unit")
        );
        assert_eq!(nearest("API", &["api", "auth"]), Some("api"));
        assert_eq!(nearest("zzz", &["api", "auth"]), None);
    }

    #[test]
    fn uints() {
        assert!(matches!(parse_uint("10"), Ok(10)));
        assert!(matches!(parse_uint("+10"), Ok(10)));
        assert!(matches!(parse_uint("1_000"), Ok(1000)));
        assert!(matches!(parse_uint("0x1F"), Ok(31)));
        assert!(matches!(parse_uint("0o17"), Ok(15)));
        assert!(matches!(parse_uint("-0"), Ok(0)));
        assert!(matches!(parse_uint("-1"), Err(IntError::Negative)));
        assert!(matches!(parse_uint("1.5"), Err(IntError::NotAnInteger)));
        assert!(matches!(parse_uint("ten"), Err(IntError::NotAnInteger)));
        assert!(matches!(parse_uint(""), Err(IntError::NotAnInteger)));
        assert!(matches!(parse_uint("_"), Err(IntError::NotAnInteger)));
        assert!(matches!(
            parse_uint("99999999999999999999999"),
            Err(IntError::TooLarge)
        ));
    }

    #[test]
    fn bools() {
        assert_eq!(parse_bool("true"), Some(true));
        assert_eq!(parse_bool("Off"), Some(false));
        assert_eq!(parse_bool("1"), None);
    }
}
