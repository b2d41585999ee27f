//! Decodes a domain's `http` section (Envoy route `rate_limits` actions) into
//! [`HttpActions`], with an error at the line and column of every problem (unknown action or
//! field, bad regex, bad mask length, missing field) and decoding carried on past each one.

use super::fields::{bounded, flag, integer, string, Errors, Fields};
use super::yaml::{Kind, Node};
use crate::request::{
    Action, HeaderMatcher, HttpActions, MatchRule, QueryMatcher, RateLimitEntry, StringMatch,
    StringMatchKind,
};

/// Most entries in an `http` section (each can yield one descriptor per request).
const MAX_ENTRIES: usize = 64;
/// Most actions in one entry (each adds one entry to a descriptor).
const MAX_ACTIONS: usize = 16;
/// Largest compiled regex accepted, in bytes (the `regex` crate's size limit).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

const ENTRY_FIELDS: &[&str] = &["actions"];
const ACTIONS: &[&str] = &[
    "remote_address",
    "masked_remote_address",
    "request_headers",
    "generic_key",
    "header_value_match",
    "query_parameters",
    "query_parameter_value_match",
];
const NO_FIELDS: &[&str] = &[];
const MASK_FIELDS: &[&str] = &["v4_prefix_mask_len", "v6_prefix_mask_len"];
const REQUEST_HEADERS_FIELDS: &[&str] = &["header_name", "descriptor_key", "skip_if_absent"];
const GENERIC_KEY_FIELDS: &[&str] = &["descriptor_value", "descriptor_key"];
const HEADER_VALUE_MATCH_FIELDS: &[&str] = &[
    "descriptor_value",
    "descriptor_key",
    "expect_match",
    "headers",
];
const QUERY_PARAMETERS_FIELDS: &[&str] =
    &["query_parameter_name", "descriptor_key", "skip_if_absent"];
const QUERY_VALUE_MATCH_FIELDS: &[&str] = &[
    "descriptor_value",
    "descriptor_key",
    "expect_match",
    "query_parameters",
];
const HEADER_MATCHER_FIELDS: &[&str] = &[
    "name",
    "exact_match",
    "prefix_match",
    "suffix_match",
    "contains_match",
    "safe_regex_match",
    "present_match",
    "string_match",
    "invert_match",
];
const QUERY_MATCHER_FIELDS: &[&str] = &["name", "string_match", "present_match"];
const STRING_MATCH_FIELDS: &[&str] = &[
    "exact",
    "prefix",
    "suffix",
    "contains",
    "safe_regex",
    "ignore_case",
];
const SAFE_REGEX_FIELDS: &[&str] = &["regex", "google_re2"];
/// The pseudo-headers a header name may be, besides real header names.
const PSEUDO_HEADERS: &[&str] = &[":method", ":path", ":authority"];

/// Decodes the `http` list. Entries with errors are dropped (the errors say why).
pub(super) fn decode(node: &Node, errors: &mut Errors) -> HttpActions {
    let Kind::Seq(items) = &node.kind else {
        errors.push((
            node.pos,
            format!(
                "`http` must be a list of `- actions: [...]` entries, found {}",
                node.describe()
            ),
        ));
        return HttpActions::default();
    };
    if items.len() > MAX_ENTRIES {
        errors.push((
            node.pos,
            format!(
                "`http` has {} entries; at most {MAX_ENTRIES} allowed",
                items.len()
            ),
        ));
        return HttpActions::default();
    }
    let entries = items.iter().filter_map(|i| entry(i, errors)).collect();
    HttpActions { entries }
}

fn entry(node: &Node, errors: &mut Errors) -> Option<RateLimitEntry> {
    let fields = Fields::new(node, "an `http` entry", ENTRY_FIELDS, errors)?;
    let Some(list) = fields.get("actions") else {
        errors.push((
            node.pos,
            "`http` entry is missing required field `actions`".to_string(),
        ));
        return None;
    };
    let Kind::Seq(items) = &list.kind else {
        errors.push((
            list.pos,
            format!("`actions` must be a list, found {}", list.describe()),
        ));
        return None;
    };
    if items.is_empty() {
        errors.push((list.pos, "`actions` must not be empty".to_string()));
        return None;
    }
    if items.len() > MAX_ACTIONS {
        errors.push((
            list.pos,
            format!(
                "`actions` has {} actions; at most {MAX_ACTIONS} allowed",
                items.len()
            ),
        ));
        return None;
    }
    let before = errors.len();
    let actions: Vec<Action> = items.iter().filter_map(|a| action(a, errors)).collect();
    (errors.len() == before).then_some(RateLimitEntry { actions })
}

fn action(node: &Node, errors: &mut Errors) -> Option<Action> {
    let Kind::Map(entries) = &node.kind else {
        errors.push((
            node.pos,
            format!(
                "an action must be a mapping with one of: {}; found {}",
                ACTIONS.join(", "),
                node.describe()
            ),
        ));
        return None;
    };
    let [e] = entries.as_slice() else {
        errors.push((
            node.pos,
            format!(
                "an action must have exactly one of: {}; found {} fields",
                ACTIONS.join(", "),
                entries.len()
            ),
        ));
        return None;
    };
    let what = format!("`{}`", e.key);
    let body = &e.value;
    // `remote_address: {}` and `remote_address:` (null) are the same.
    let empty = Node::empty_map(body.pos);
    let body = if body.is_null() { &empty } else { body };
    match e.key.as_str() {
        "remote_address" => {
            Fields::new(body, &what, NO_FIELDS, errors)?;
            Some(Action::RemoteAddress)
        }
        "masked_remote_address" => {
            let f = Fields::new(body, &what, MASK_FIELDS, errors)?;
            let v4 = f.get("v4_prefix_mask_len").map_or(Some(32), |n| {
                integer(n, "v4_prefix_mask_len", 0, 32, errors)
            });
            let v6 = f.get("v6_prefix_mask_len").map_or(Some(128), |n| {
                integer(n, "v6_prefix_mask_len", 0, 128, errors)
            });
            // In range, so they fit.
            Some(Action::MaskedRemoteAddress {
                v4: u8::try_from(v4?).unwrap_or(32),
                v6: u8::try_from(v6?).unwrap_or(128),
            })
        }
        "request_headers" => {
            let f = Fields::new(body, &what, REQUEST_HEADERS_FIELDS, errors)?;
            let header_name = header_name(&f, body, "header_name", errors);
            let descriptor_key = key(&f, body, None, errors);
            let skip_if_absent = flag(&f, "skip_if_absent", errors);
            Some(Action::RequestHeaders {
                header_name: header_name?,
                descriptor_key: descriptor_key?,
                skip_if_absent,
            })
        }
        "generic_key" => {
            let f = Fields::new(body, &what, GENERIC_KEY_FIELDS, errors)?;
            let descriptor_value = value(&f, body, errors);
            let descriptor_key = key(&f, body, Some("generic_key"), errors);
            Some(Action::GenericKey {
                descriptor_key: descriptor_key?,
                descriptor_value: descriptor_value?,
            })
        }
        "header_value_match" => {
            let f = Fields::new(body, &what, HEADER_VALUE_MATCH_FIELDS, errors)?;
            let descriptor_value = value(&f, body, errors);
            let descriptor_key = key(&f, body, Some("header_match"), errors);
            let expect_match = expect_match(&f, errors);
            let headers = list(&f, body, "headers", errors, header_matcher);
            Some(Action::HeaderValueMatch {
                descriptor_key: descriptor_key?,
                descriptor_value: descriptor_value?,
                expect_match,
                headers: headers?,
            })
        }
        "query_parameters" => {
            let f = Fields::new(body, &what, QUERY_PARAMETERS_FIELDS, errors)?;
            let name = required_string(&f, body, "query_parameter_name", errors);
            let descriptor_key = key(&f, body, None, errors);
            let skip_if_absent = flag(&f, "skip_if_absent", errors);
            Some(Action::QueryParameters {
                name: name?,
                descriptor_key: descriptor_key?,
                skip_if_absent,
            })
        }
        "query_parameter_value_match" => {
            let f = Fields::new(body, &what, QUERY_VALUE_MATCH_FIELDS, errors)?;
            let descriptor_value = value(&f, body, errors);
            let descriptor_key = key(&f, body, Some("query_match"), errors);
            let expect_match = expect_match(&f, errors);
            let params = list(&f, body, "query_parameters", errors, query_matcher);
            Some(Action::QueryParameterValueMatch {
                descriptor_key: descriptor_key?,
                descriptor_value: descriptor_value?,
                expect_match,
                params: params?,
            })
        }
        "source_cluster"
        | "destination_cluster"
        | "metadata"
        | "dynamic_metadata"
        | "extension"
        | "masked_remote_address_v2" => {
            errors.push((
                e.key_pos,
                format!(
                    "action `{}` does not apply to tollgate (no Envoy cluster or metadata here); supported: {}",
                    e.key,
                    ACTIONS.join(", ")
                ),
            ));
            None
        }
        other => {
            errors.push((
                e.key_pos,
                format!(
                    "unknown action `{other}` (supported: {})",
                    ACTIONS.join(", ")
                ),
            ));
            None
        }
    }
}

fn expect_match(f: &Fields<'_>, errors: &mut Errors) -> bool {
    if f.get("expect_match").is_some() {
        flag(f, "expect_match", errors)
    } else {
        true
    }
}

/// A required non-empty string of at most `MAX_LEN` bytes.
fn required_string(f: &Fields<'_>, at: &Node, field: &str, errors: &mut Errors) -> Option<String> {
    let Some(n) = f.get(field) else {
        errors.push((at.pos, format!("missing required field `{field}`")));
        return None;
    };
    let s = string(n, field, errors)?;
    if s.is_empty() {
        errors.push((n.pos, format!("`{field}` must not be empty")));
        return None;
    }
    bounded(s, n, field, errors)
}

/// `descriptor_key`: required when `default` is `None`.
fn key(f: &Fields<'_>, at: &Node, default: Option<&str>, errors: &mut Errors) -> Option<String> {
    match (f.get("descriptor_key"), default) {
        (None, Some(d)) => Some(d.to_string()),
        _ => required_string(f, at, "descriptor_key", errors),
    }
}

fn value(f: &Fields<'_>, at: &Node, errors: &mut Errors) -> Option<String> {
    required_string(f, at, "descriptor_value", errors)
}

/// A header name, lower-cased: a valid HTTP header name or `:method`, `:path`, `:authority`.
fn header_name(f: &Fields<'_>, at: &Node, field: &str, errors: &mut Errors) -> Option<String> {
    let name = required_string(f, at, field, errors)?.to_ascii_lowercase();
    let pos = f.get(field).map_or(at.pos, |n| n.pos);
    if name.starts_with(':') {
        if PSEUDO_HEADERS.contains(&name.as_str()) {
            return Some(name);
        }
        errors.push((
            pos,
            format!(
                "unknown pseudo-header `{name}` (supported: {})",
                PSEUDO_HEADERS.join(", ")
            ),
        ));
        return None;
    }
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        errors.push((
            pos,
            format!("`{field}` `{name}` is not a valid header name"),
        ));
        return None;
    }
    Some(name)
}

/// A non-empty list of matchers under `field`.
fn list<T>(
    f: &Fields<'_>,
    at: &Node,
    field: &str,
    errors: &mut Errors,
    one: fn(&Node, &mut Errors) -> Option<T>,
) -> Option<Vec<T>> {
    let Some(n) = f.get(field) else {
        errors.push((at.pos, format!("missing required field `{field}`")));
        return None;
    };
    let Kind::Seq(items) = &n.kind else {
        errors.push((
            n.pos,
            format!("`{field}` must be a list, found {}", n.describe()),
        ));
        return None;
    };
    if items.is_empty() {
        errors.push((n.pos, format!("`{field}` must not be empty")));
        return None;
    }
    let before = errors.len();
    let out: Vec<T> = items.iter().filter_map(|i| one(i, errors)).collect();
    (errors.len() == before).then_some(out)
}

fn header_matcher(node: &Node, errors: &mut Errors) -> Option<HeaderMatcher> {
    let f = Fields::new(node, "a header matcher", HEADER_MATCHER_FIELDS, errors)?;
    let name = header_name(&f, node, "name", errors);
    let invert = flag(&f, "invert_match", errors);
    let legacy = |field: &str, make: fn(String) -> StringMatchKind, errors: &mut Errors| {
        f.get(field).map(|n| {
            string(n, field, errors).map(|s| {
                MatchRule::String(StringMatch {
                    kind: make(s),
                    ignore_case: false,
                })
            })
        })
    };
    let mut rules: Vec<Option<MatchRule>> = Vec::new();
    rules.extend(legacy("exact_match", StringMatchKind::Exact, errors));
    rules.extend(legacy("prefix_match", StringMatchKind::Prefix, errors));
    rules.extend(legacy("suffix_match", StringMatchKind::Suffix, errors));
    rules.extend(legacy("contains_match", StringMatchKind::Contains, errors));
    if let Some(n) = f.get("safe_regex_match") {
        rules.push(safe_regex(n, errors).map(|r| {
            MatchRule::String(StringMatch {
                kind: StringMatchKind::Regex(r),
                ignore_case: false,
            })
        }));
    }
    if f.get("present_match").is_some() {
        rules.push(Some(MatchRule::Present(flag(&f, "present_match", errors))));
    }
    if let Some(n) = f.get("string_match") {
        rules.push(string_match(n, errors).map(MatchRule::String));
    }
    let rule = one_rule(node, rules, "a header matcher", errors)?;
    Some(HeaderMatcher {
        name: name?,
        rule,
        invert,
    })
}

fn query_matcher(node: &Node, errors: &mut Errors) -> Option<QueryMatcher> {
    let f = Fields::new(
        node,
        "a query parameter matcher",
        QUERY_MATCHER_FIELDS,
        errors,
    )?;
    let name = required_string(&f, node, "name", errors);
    let mut rules = Vec::new();
    if f.get("present_match").is_some() {
        rules.push(Some(MatchRule::Present(flag(&f, "present_match", errors))));
    }
    if let Some(n) = f.get("string_match") {
        rules.push(string_match(n, errors).map(MatchRule::String));
    }
    let rule = one_rule(node, rules, "a query parameter matcher", errors)?;
    Some(QueryMatcher { name: name?, rule })
}

/// At most one way of matching; none means "present" (as in Envoy).
fn one_rule(
    node: &Node,
    rules: Vec<Option<MatchRule>>,
    what: &str,
    errors: &mut Errors,
) -> Option<MatchRule> {
    match rules.len() {
        0 => Some(MatchRule::Present(true)),
        1 => rules.into_iter().next().flatten(),
        _ => {
            errors.push((
                node.pos,
                format!(
                    "{what} must have only one way of matching, found {}",
                    rules.len()
                ),
            ));
            None
        }
    }
}

fn string_match(node: &Node, errors: &mut Errors) -> Option<StringMatch> {
    let f = Fields::new(node, "`string_match`", STRING_MATCH_FIELDS, errors)?;
    let ignore_case = flag(&f, "ignore_case", errors);
    let mut kinds: Vec<Option<StringMatchKind>> = Vec::new();
    for (field, make) in [
        (
            "exact",
            StringMatchKind::Exact as fn(String) -> StringMatchKind,
        ),
        ("prefix", StringMatchKind::Prefix),
        ("suffix", StringMatchKind::Suffix),
        ("contains", StringMatchKind::Contains),
    ] {
        if let Some(n) = f.get(field) {
            kinds.push(string(n, field, errors).map(make));
        }
    }
    if let Some(n) = f.get("safe_regex") {
        if ignore_case {
            errors.push((
                n.pos,
                "`ignore_case` has no effect on `safe_regex`: use `(?i)` in the regex".to_string(),
            ));
        }
        kinds.push(safe_regex(n, errors).map(StringMatchKind::Regex));
    }
    match kinds.len() {
        1 => kinds
            .into_iter()
            .next()
            .flatten()
            .map(|kind| StringMatch { kind, ignore_case }),
        n => {
            errors.push((
                node.pos,
                format!(
                    "`string_match` must have exactly one of exact, prefix, suffix, contains, safe_regex; found {n}"
                ),
            ));
            None
        }
    }
}

/// `safe_regex: {regex: ...}`, compiled to match the whole value (RE2's full match, as Envoy).
fn safe_regex(node: &Node, errors: &mut Errors) -> Option<regex::Regex> {
    let f = Fields::new(node, "`safe_regex`", SAFE_REGEX_FIELDS, errors)?;
    let Some(n) = f.get("regex") else {
        errors.push((node.pos, "missing required field `regex`".to_string()));
        return None;
    };
    let text = string(n, "regex", errors)?;
    match regex::RegexBuilder::new(&format!("^(?:{text})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            let why = e.to_string();
            let why = why.lines().last().unwrap_or("").trim().to_string();
            errors.push((n.pos, format!("invalid `regex` {text:?}: {why}")));
            None
        }
    }
}

#[cfg(test)]
mod tests;
