//! Turns a marked YAML tree into a validated rule specification.
//!
//! This is where envoyproxy/ratelimit's format (plus tollgate's extensions) is checked field by
//! field. It is hand-written rather than derived (serde) for two reasons: every error must
//! carry the line and column of the node at fault, and decoding must continue after an error so
//! that one run reports every problem of a file. Each helper therefore records the error and
//! returns `None`, and the caller carries on with what it could read.

use super::fields::{bounded, flag, integer, string, Errors, Fields, MAX_LEN};
use super::metadata::MetaValue;
use super::yaml::{Kind, Node, Pos};
use crate::quota::{Algorithm, Doorkeeper, Period, Quota, SketchSize, SyncMode, Unit, MAX_PERIOD};
use std::collections::BTreeMap;

/// Deepest descriptor nesting accepted (a request descriptor has at most this many entries).
pub(crate) const MAX_DEPTH: usize = 16;
/// Largest sketch width accepted (counters per row).
const MAX_SKETCH_WIDTH: u64 = 1 << 24;
/// Largest sketch depth accepted (rows).
const MAX_SKETCH_DEPTH: u64 = 16;

const ROOT_FIELDS: &[&str] = &["domain", "descriptors", "http"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
    "message",
    "degrade",
    "shadowban",
    "queue",
    "tiers",
];
const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "unit_multiplier",
    "algorithm",
    "burst",
    "sketch_width",
    "sketch_depth",
    "doorkeeper",
    "sync",
    "flush_interval",
];
const DOORKEEPER_FIELDS: &[&str] = &["expected_keys", "fp_rate"];
const REPLACES_FIELDS: &[&str] = &["name"];

/// One file's domain, validated.
#[derive(Debug)]
pub(crate) struct DomainSpec {
    pub name: String,
    pub name_pos: Pos,
    pub descriptors: Vec<DescriptorSpec>,
    /// The `http` section (request -> descriptors), when present.
    pub http: Option<crate::request::HttpActions>,
}

/// One descriptor (a node of the tree), validated.
#[derive(Debug)]
pub(crate) struct DescriptorSpec {
    pub key: String,
    /// `None` for a key-only descriptor (absent, null or empty `value`, as in Envoy).
    pub value: Option<String>,
    pub pos: Pos,
    pub rate_limit: Option<RateLimitSpec>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub quota_mode: bool,
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    pub message: Option<String>,
    pub degrade: Option<super::degrade::DegradeThreshold>,
    pub shadowban: bool,
    pub queue: Option<super::queue::QueuePolicy>,
    pub tiers: Option<super::tiers::Tiers>,
    pub children: Vec<DescriptorSpec>,
    /// The file it comes from when not its domain's file (a domain merged from several files).
    pub file: Option<String>,
}

/// A `rate_limit` block, validated.
#[derive(Debug)]
pub(crate) struct RateLimitSpec {
    pub name: Option<String>,
    /// `None` = unlimited.
    pub quota: Option<Quota>,
    pub replaces: Vec<String>,
    /// The rule names an `algorithm` (otherwise the rule set's default applies).
    pub algorithm_named: bool,
    /// The rule names a `sync` mode (otherwise the rule set's default applies).
    pub sync_named: bool,
}

/// Decodes a whole file. `root` is `None` for an empty document. Returns `None` when the
/// domain cannot be built; `errors` then says why (it may also hold errors when `Some`).
pub(crate) fn decode_file(root: Option<&Node>, errors: &mut Errors) -> Option<DomainSpec> {
    let Some(root) = root else {
        errors.push((
            Pos { line: 1, column: 1 },
            "missing required field `domain` (the file is empty)".to_string(),
        ));
        return None;
    };
    let fields = Fields::new(root, "the top level", ROOT_FIELDS, errors)?;
    let domain = match fields.get("domain") {
        None => {
            errors.push((root.pos, "missing required field `domain`".to_string()));
            None
        }
        Some(node) => string(node, "domain", errors).and_then(|s| {
            if s.is_empty() {
                errors.push((node.pos, "`domain` must not be empty".to_string()));
                None
            } else if s.len() > MAX_LEN {
                errors.push((
                    node.pos,
                    format!(
                        "`domain` is {} bytes long; at most {MAX_LEN} allowed",
                        s.len()
                    ),
                ));
                None
            } else {
                Some((s, node.pos))
            }
        }),
    };
    let descriptors = match fields.get("descriptors") {
        None => Vec::new(),
        Some(node) => descriptor_list(node, 1, errors),
    };
    let http = fields
        .get("http")
        .map(|node| super::http::decode(node, errors));
    let (name, name_pos) = domain?;
    Some(DomainSpec {
        name,
        name_pos,
        descriptors,
        http,
    })
}

fn descriptor_list(node: &Node, depth: usize, errors: &mut Errors) -> Vec<DescriptorSpec> {
    let Kind::Seq(items) = &node.kind else {
        errors.push((
            node.pos,
            format!("`descriptors` must be a list, found {}", node.describe()),
        ));
        return Vec::new();
    };
    if depth > MAX_DEPTH {
        errors.push((
            node.pos,
            format!("descriptors nested more than {MAX_DEPTH} levels deep"),
        ));
        return Vec::new();
    }
    let mut out: Vec<DescriptorSpec> = Vec::with_capacity(items.len());
    for item in items {
        let Some(d) = descriptor(item, depth, errors) else {
            continue;
        };
        let duplicate = out.iter().find(|o| o.key == d.key && o.value == d.value);
        if let Some(first) = duplicate {
            let what = match &d.value {
                Some(v) => format!("key `{}` and value `{v}`", d.key),
                None => format!("key `{}` and no value", d.key),
            };
            errors.push((
                d.pos,
                format!(
                    "duplicate descriptor: {what} already defined at line {} at this level",
                    first.pos.line
                ),
            ));
            continue;
        }
        out.push(d);
    }
    out
}

fn descriptor(node: &Node, depth: usize, errors: &mut Errors) -> Option<DescriptorSpec> {
    let fields = Fields::new(node, "a descriptor", DESCRIPTOR_FIELDS, errors)?;
    let key = match fields.get("key") {
        None => {
            errors.push((
                node.pos,
                "descriptor is missing required field `key`".to_string(),
            ));
            None
        }
        Some(k) => string(k, "key", errors).and_then(|s| {
            if s.is_empty() {
                errors.push((k.pos, "`key` must not be empty".to_string()));
                None
            } else {
                bounded(s, k, "key", errors)
            }
        }),
    };
    let value = match fields.get("value") {
        None => None,
        Some(v) => string(v, "value", errors)
            .filter(|s| !s.is_empty())
            .and_then(|s| bounded(s, v, "value", errors)),
    };
    let rate_limit = fields.get("rate_limit").and_then(|n| rate_limit(n, errors));
    let shadow_mode = flag(&fields, "shadow_mode", errors);
    let detailed_metric = flag(&fields, "detailed_metric", errors);
    let value_to_metric = flag(&fields, "value_to_metric", errors);
    let share_threshold = flag(&fields, "share_threshold", errors);
    // As envoyproxy/ratelimit: sharing a threshold needs a wildcard to share it among (it checks
    // `key_value`, so a `*` in the key passes too).
    if share_threshold {
        if let (Some(n), Some(k)) = (fields.get("share_threshold"), &key) {
            let composite = match &value {
                Some(v) => format!("{k}_{v}"),
                None => k.clone(),
            };
            if !composite.contains('*') {
                errors.push((
                    n.pos,
                    format!(
                        "`share_threshold` can only be used with wildcard values (containing `*`), but found key `{composite}`"
                    ),
                ));
            }
        }
    }
    let quota_mode = flag(&fields, "quota_mode", errors);
    let metadata = fields
        .get("metadata")
        .and_then(|n| super::metadata::decode(n, errors));
    let message = fields
        .get("message")
        .and_then(|n| string(n, "message", errors));
    // What the rule's quota is, for the options that need one: `None` without a `rate_limit`
    // (or with one that did not decode, already reported), `Some(None)` for `unlimited: true`.
    let has_rate_limit = fields.get("rate_limit").is_some();
    let quota = rate_limit.as_ref().map(|rl| rl.quota);
    let degrade = fields.get("degrade").and_then(|n| {
        if has_rate_limit && quota.is_none() {
            return None;
        }
        super::degrade::decode(n, quota, errors)
    });
    let shadowban = flag(&fields, "shadowban", errors);
    if shadowban {
        if let Some(n) = fields.get("shadowban") {
            if shadow_mode {
                errors.push((
                    n.pos,
                    "`shadowban` cannot be combined with `shadow_mode` (a shadow-mode rule never denies)".to_string(),
                ));
            } else if !has_rate_limit {
                errors.push((
                    n.pos,
                    "`shadowban` needs a `rate_limit` on the same descriptor".to_string(),
                ));
            } else if quota == Some(None) {
                errors.push((
                    n.pos,
                    "`shadowban` cannot be used with `unlimited: true` (it never denies)"
                        .to_string(),
                ));
            }
        }
    }
    let queue = fields.get("queue").and_then(|n| {
        if has_rate_limit && quota.is_none() {
            return None;
        }
        let conflicts = super::queue::Conflicts {
            shadow_mode,
            quota_mode,
            shadowban,
            has_rate_limit,
            unlimited: quota == Some(None),
        };
        super::queue::decode(n, conflicts, errors)
    });
    let children = match fields.get("descriptors") {
        None => Vec::new(),
        Some(n) => descriptor_list(n, depth + 1, errors),
    };
    let tiers = fields.get("tiers").and_then(|n| {
        if has_rate_limit && quota.is_none() {
            return None;
        }
        let named = |field: &str| {
            fields
                .get("rate_limit")
                .and_then(Fields::quiet)
                .and_then(|f| f.get(field))
        };
        let cx = super::tiers::Context {
            rule: key.as_deref().unwrap_or("?"),
            quota,
            algorithm: named("algorithm"),
            sync: named("sync"),
            children: children.iter().map(|c| (c.key.as_str(), c.pos)).collect(),
        };
        super::tiers::decode(n, cx, errors)
    });
    Some(DescriptorSpec {
        degrade,
        shadowban,
        queue,
        tiers,
        file: None,
        key: key?,
        value,
        pos: node.pos,
        rate_limit,
        shadow_mode,
        detailed_metric,
        value_to_metric,
        share_threshold,
        quota_mode,
        metadata,
        message,
        children,
    })
}

/// A descriptor's `rate_limit`: `unlimited: true`, or a quota read field by field, each field
/// checked against the others it depends on, then the quota bounded.
fn rate_limit(node: &Node, errors: &mut Errors) -> Option<RateLimitSpec> {
    let fields = Fields::new(node, "rate_limit", RATE_LIMIT_FIELDS, errors)?;
    let before = errors.len();
    let name = fields.get("name").and_then(|n| string(n, "name", errors));
    let replaces = match fields.get("replaces") {
        None => Vec::new(),
        Some(n) => replaces(n, name.as_deref(), errors),
    };
    if flag(&fields, "unlimited", errors) {
        only_unlimited(&fields, errors);
        return (errors.len() == before).then_some(RateLimitSpec {
            name,
            quota: None,
            replaces,
            algorithm_named: false,
            sync_named: false,
        });
    }
    let unit = required(node, &fields, "unit", " (or set `unlimited: true`)", errors)
        .and_then(|n| parsed::<Unit>(n, "unit", errors));
    let limit = required(node, &fields, "requests_per_unit", "", errors)
        .and_then(|n| integer(n, "requests_per_unit", 0, u64::from(u32::MAX), errors));
    let multiplier = fields
        .get("unit_multiplier")
        .map(|n| integer(n, "unit_multiplier", 1, u64::from(u32::MAX), errors))
        .unwrap_or(Some(1));
    let algorithm = match fields.get("algorithm") {
        None => Some(Algorithm::default()),
        Some(n) => parsed::<Algorithm>(n, "algorithm", errors),
    };
    let sync = match fields.get("sync") {
        None => Some(SyncMode::Exact),
        Some(n) => parsed::<SyncMode>(n, "sync", errors),
    };
    check_sync(&fields, sync, algorithm, errors);
    let flush = flush_interval(&fields, sync, errors);
    let burst = burst(&fields, algorithm, errors);
    let sketch = sketch_size(&fields, algorithm, errors);
    let door = fields
        .get("doorkeeper")
        .and_then(|n| doorkeeper(n, algorithm, errors));
    if errors.len() != before {
        return None;
    }
    let (Some(unit), Some(limit), Some(multiplier), Some(algorithm), Some(sync)) =
        (unit, limit, multiplier, algorithm, sync)
    else {
        return None;
    };
    let multiplier = u32::try_from(multiplier).unwrap_or(u32::MAX);
    let quota = Quota::new(limit, Period::new(unit, multiplier))
        .with_burst(burst.and_then(|(_, b)| b))
        .with_algorithm(algorithm)
        .with_sketch(sketch)
        .with_doorkeeper(door)
        .with_sync(sync)
        .with_flush_interval(flush.flatten().map(std::time::Duration::from_micros));
    bounded_quota(node, &fields, &quota, burst, errors)?;
    Some(RateLimitSpec {
        name,
        quota: Some(quota),
        replaces,
        algorithm_named: fields.get("algorithm").is_some(),
        sync_named: fields.get("sync").is_some(),
    })
}

/// `unlimited: true` with a field of a quota: an error for each such field (`sync` alone is
/// allowed: it says nothing of a quota).
fn only_unlimited(fields: &Fields<'_>, errors: &mut Errors) {
    const NOT_QUOTA: &[&str] = &["unlimited", "name", "replaces", "sync"];
    for &field in RATE_LIMIT_FIELDS.iter().filter(|f| !NOT_QUOTA.contains(f)) {
        if let Some(n) = fields.get(field) {
            errors.push((
                n.pos,
                format!("`unlimited: true` cannot be combined with `{field}`"),
            ));
        }
    }
}

/// The required `field` of `rate_limit` (at `node`); its absence an error, `hint` appended.
fn required<'a>(
    node: &Node,
    fields: &Fields<'a>,
    field: &str,
    hint: &str,
    errors: &mut Errors,
) -> Option<&'a Node> {
    let found = fields.get(field);
    if found.is_none() {
        errors.push((
            node.pos,
            format!("rate_limit is missing required field `{field}`{hint}"),
        ));
    }
    found
}

/// The string `field` at `n` read as a `T` (`invalid `field`: …` when it is none).
fn parsed<T>(n: &Node, field: &str, errors: &mut Errors) -> Option<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    string(n, field, errors).and_then(|s| match s.parse::<T>() {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push((n.pos, format!("invalid `{field}`: {e}")));
            None
        }
    })
}

/// A `sync` mode named with an algorithm it cannot pace. A default algorithm is checked when
/// the defaults are applied (`RuleSet::unleasable`).
fn check_sync(
    fields: &Fields<'_>,
    sync: Option<SyncMode>,
    algorithm: Option<Algorithm>,
    errors: &mut Errors,
) {
    if let (Some(n), Some(m), Some(a)) = (fields.get("sync"), sync, algorithm) {
        if fields.get("algorithm").is_some() && !m.supports(a) {
            errors.push((
                n.pos,
                format!(
                    "`sync: {m}` needs algorithm fixed_window or sliding_window_counter, not {a} \
                     ({})",
                    why_windowed(m)
                ),
            ));
        }
    }
}

/// `flush_interval` (`Some(None)` when it is invalid). It paces batches: a rule naming another
/// mode is wrong whatever the defaults; one naming none is checked once the default mode is
/// known (`RuleSet::unleasable`).
fn flush_interval(
    fields: &Fields<'_>,
    sync: Option<SyncMode>,
    errors: &mut Errors,
) -> Option<Option<u64>> {
    fields.get("flush_interval").map(|n| {
        let d = super::queue::duration(n, "flush_interval", errors);
        if let Some(m) = sync.filter(|&m| fields.get("sync").is_some() && m != SyncMode::Batched) {
            errors.push((
                n.pos,
                format!(
                    "`flush_interval` applies only to `sync: batched` (how often its counts are \
                     sent to the store); this limit is `sync: {m}`"
                ),
            ));
        }
        d
    })
}

/// `burst`, with its node, for an algorithm that uses one.
fn burst<'a>(
    fields: &Fields<'a>,
    algorithm: Option<Algorithm>,
    errors: &mut Errors,
) -> Option<(&'a Node, Option<u64>)> {
    let burst = fields
        .get("burst")
        // At most u32::MAX like `requests_per_unit`: the memory store keeps counts in 32 bits.
        .map(|n| (n, integer(n, "burst", 1, u64::from(u32::MAX), errors)));
    if let (Some((n, _)), Some(a)) = (burst, algorithm) {
        if !a.uses_burst() {
            errors.push((
                n.pos,
                format!(
                    "`burst` has no effect with algorithm {a}: only token_bucket, leaky_bucket and gcra use it"
                ),
            ));
        }
    }
    burst
}

/// `sketch_width` and `sketch_depth`, for the count-min sketch.
fn sketch_size(
    fields: &Fields<'_>,
    algorithm: Option<Algorithm>,
    errors: &mut Errors,
) -> SketchSize {
    let mut sketch = SketchSize::default();
    for (field, max) in [
        ("sketch_width", MAX_SKETCH_WIDTH),
        ("sketch_depth", MAX_SKETCH_DEPTH),
    ] {
        let Some(n) = fields.get(field) else { continue };
        if let Some(a) = algorithm {
            if a != Algorithm::CountMinSketch {
                errors.push((
                    n.pos,
                    format!("`{field}` only applies to algorithm count_min_sketch, not {a}"),
                ));
            }
        }
        if let Some(v) = integer(n, field, 1, max, errors) {
            // In range 1..=max, both below u32::MAX.
            let v = u32::try_from(v).unwrap_or(u32::MAX);
            if field == "sketch_width" {
                sketch.width = v;
            } else {
                sketch.depth = v;
            }
        }
    }
    sketch
}

/// Bounds that keep the algorithms' arithmetic exact (see `MAX_PERIOD`; `nominal` saturates):
/// `None` (and the error) when `quota`'s period or the time its burst takes to fill is longer.
fn bounded_quota(
    node: &Node,
    fields: &Fields<'_>,
    quota: &Quota,
    burst: Option<(&Node, Option<u64>)>,
    errors: &mut Errors,
) -> Option<()> {
    if quota.period().nominal() > MAX_PERIOD {
        let at = fields.get("unit_multiplier").map_or(node.pos, |n| n.pos);
        errors.push((
            at,
            format!(
                "a period of {} is longer than the longest supported (100 years)",
                quota.period()
            ),
        ));
        return None;
    }
    if let (Some((n, Some(b))), Some(t)) = (burst, quota.emission_interval()) {
        if u128::from(b) * u128::from(t) > u128::from(MAX_PERIOD) {
            errors.push((
                n.pos,
                format!(
                    "`burst` {b} at {} per {} takes longer than 100 years to fill: use a smaller burst",
                    quota.limit(),
                    quota.period()
                ),
            ));
            return None;
        }
    }
    Some(())
}

/// `doorkeeper: {expected_keys, fp_rate}` (both required) for a windowed algorithm.
fn doorkeeper(
    node: &Node,
    algorithm: Option<Algorithm>,
    errors: &mut Errors,
) -> Option<Doorkeeper> {
    let fields = Fields::new(node, "doorkeeper", DOORKEEPER_FIELDS, errors)?;
    if let Some(a) = algorithm.filter(|a| !a.takes_doorkeeper()) {
        errors.push((
            node.pos,
            format!(
                "`doorkeeper` needs algorithm fixed_window, sliding_window_counter or \
                 count_min_sketch, not {a} (only a windowed counter's state after one request \
                 is known from the filter's bits)"
            ),
        ));
    }
    let keys = match fields.get("expected_keys") {
        None => {
            errors.push((
                node.pos,
                "doorkeeper is missing required field `expected_keys`".to_string(),
            ));
            None
        }
        Some(n) => integer(n, "expected_keys", 1, Doorkeeper::MAX_EXPECTED_KEYS, errors),
    };
    let rate = match fields.get("fp_rate") {
        None => {
            errors.push((
                node.pos,
                "doorkeeper is missing required field `fp_rate` (e.g. 0.01)".to_string(),
            ));
            None
        }
        Some(n) => {
            let parsed = match &n.kind {
                Kind::Scalar {
                    text,
                    quoted: false,
                } => text.parse::<f64>().ok(),
                _ => None,
            };
            match parsed {
                Some(r) if (Doorkeeper::MIN_FP_RATE..=Doorkeeper::MAX_FP_RATE).contains(&r) => {
                    Some(r)
                }
                _ => {
                    errors.push((
                        n.pos,
                        format!(
                            "`fp_rate` must be a number between {} and {}, found {}",
                            Doorkeeper::MIN_FP_RATE,
                            Doorkeeper::MAX_FP_RATE,
                            n.describe()
                        ),
                    ));
                    None
                }
            }
        }
    };
    Doorkeeper::new(keys?, rate?).ok()
}

fn replaces(node: &Node, own_name: Option<&str>, errors: &mut Errors) -> Vec<String> {
    let Kind::Seq(items) = &node.kind else {
        errors.push((
            node.pos,
            format!(
                "`replaces` must be a list of `- name: ...` entries, found {}",
                node.describe()
            ),
        ));
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items {
        let Some(fields) = Fields::new(item, "a replaces entry", REPLACES_FIELDS, errors) else {
            continue;
        };
        let Some(n) = fields.get("name") else {
            errors.push((
                item.pos,
                "`replaces` entry is missing required field `name`".to_string(),
            ));
            continue;
        };
        let Some(name) = string(n, "name", errors) else {
            continue;
        };
        if name.is_empty() {
            errors.push((n.pos, "`replaces` entry has an empty `name`".to_string()));
        } else if Some(name.as_str()) == own_name {
            errors.push((
                n.pos,
                format!("`replaces` must not name the rate limit itself (`{name}`)"),
            ));
        } else {
            out.push(name);
        }
    }
    out
}

/// Why a sync mode needs a windowed algorithm, for the error naming a rule that asks otherwise.
fn why_windowed(m: SyncMode) -> &'static str {
    match m {
        SyncMode::Batched => "a batch is a count added to one window's count",
        _ => "a lease is a share of one window's count",
    }
}
