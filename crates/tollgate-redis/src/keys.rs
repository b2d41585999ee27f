//! Redis key layout and the limits that keep the Lua arithmetic exact.
//!
//! A counter's keys are `<prefix>:{<escaped counter key>}:<algorithm>:<period>[:sum]`:
//!
//! - **Hash tag.** The braces make Redis Cluster hash only the escaped counter key, so every key
//!   of one counter (the sliding log has two) lives in one slot and one script can touch them.
//! - **Escaping is injective and keeps keys readable.** Printable ASCII stays as is, except `{`,
//!   `}` (they would end or start the hash tag), `:` (the suffix separator), `%` (the escape
//!   character itself), `\` and space; those, control characters (newlines) and non-ASCII bytes
//!   become `%XX`. Because `%` is always escaped, two different counter keys can never escape
//!   to the same text, and no value can close the hash tag or forge a suffix. `|`, `=` and `;`
//!   stay literal: they are already escaped upstream by the rules module, and percent-escaping
//!   alone is enough for injectivity. The empty key becomes a lone `%` (an empty hash tag would
//!   make Redis hash the whole key name, splitting a counter's keys across slots).
//! - **Long keys are hashed.** An escaped key longer than `MAX_READABLE` bytes is replaced by
//!   its first 64 bytes, `%%`, and the hex of the first 128 bits of its SHA-256. `%%` never occurs
//!   in a plain escaped key, so hashed and plain keys cannot collide, and finding two counter keys
//!   with the same hashed form means a SHA-256 collision on 128 bits.
//! - **Algorithm and period in the suffix**: a rule that changes algorithm or period starts from
//!   fresh counters (as the memory store does), while a changed limit keeps them.
//! - **The state's format in the suffix too**: the fixed window and the sliding window counter
//!   are `fixed2` and `counter2`, their state numbers packed in binary (`scripts/common.lua`),
//!   where earlier versions kept text under `fixed` and `counter`. Neither version reads the
//!   other's keys: during a rolling upgrade each counts apart, and the old keys expire with
//!   their windows.
//!
//! [`check_quota`] rejects the few quotas whose state could leave the range where Lua's doubles
//! are exact integers (below 2^53); see `scripts/common.lua`.

use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use tollgate_core::{Algorithm, Micros, Quota, StoreError, Unit};

/// Escaped keys longer than this are hashed.
pub(crate) const MAX_READABLE: usize = 200;

/// Largest supported period length: 2^50 µs (about 35 years).
pub(crate) const MAX_PERIOD: Micros = 1 << 50;
/// Largest supported bucket span `burst × period / limit`: 2^51 µs (about 71 years).
pub(crate) const MAX_SPAN: Micros = 1 << 51;
/// Largest supported limit and burst.
pub(crate) const MAX_COUNT: u64 = 1 << 52;
/// Latest supported instant: 2^52 µs after the epoch (the year 2112). With the bounds above,
/// every timestamp the scripts compute stays below 2^53.
pub(crate) const MAX_NOW: Micros = 1 << 52;
/// Costs are clamped to this before they reach Lua: a cost above any supported limit is denied
/// the same way whatever its exact value.
pub const MAX_COST: u64 = 1 << 53;

fn keep_literal(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':' | b'%' | b'\\')
}

/// The escaped form of a counter key, as used inside the hash tag.
pub fn escape(key: &str) -> String {
    if key.is_empty() {
        return "%".to_owned();
    }
    let mut out = String::with_capacity(key.len() + 8);
    for &b in key.as_bytes() {
        if out.len() > MAX_READABLE {
            break;
        }
        if keep_literal(b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out.len() <= MAX_READABLE {
        return out;
    }
    out.truncate(64);
    let digest = Sha256::digest(key.as_bytes());
    out.push_str("%%");
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Short name of an algorithm in key suffixes.
pub(crate) fn algorithm_tag(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Gcra => "gcra",
        Algorithm::LeakyBucket => "leaky",
        Algorithm::TokenBucket => "token",
        Algorithm::FixedWindow => "fixed2",
        Algorithm::EnvoyFixedWindow => "envoy",
        Algorithm::SlidingWindowLog => "log",
        Algorithm::SlidingWindowCounter => "counter2",
        Algorithm::CountMinSketch => "cms",
    }
}

fn unit_tag(u: Unit) -> &'static str {
    match u {
        Unit::Second => "s",
        Unit::Minute => "m",
        Unit::Hour => "h",
        Unit::Day => "d",
        Unit::Week => "w",
        Unit::Month => "mo",
        Unit::Year => "y",
    }
}

/// The Redis keys of one counter: the main key and, for a sliding log, its `:sum` key (which
/// holds the log's pruning horizon, see `scripts/sliding_log.lua`).
pub type CounterKeys = (String, Option<String>);

/// The Redis keys of one counter: one, or two for a sliding log (the set, then its `:sum` key).
pub fn counter_keys(prefix: &str, key: &str, quota: &Quota) -> CounterKeys {
    let main = format!(
        "{prefix}:{{{}}}:{}:{}{}",
        escape(key),
        algorithm_tag(quota.algorithm()),
        quota.period().multiplier,
        unit_tag(quota.period().unit)
    );
    let sum = (quota.algorithm() == Algorithm::SlidingWindowLog).then(|| format!("{main}:sum"));
    (main, sum)
}

/// The Redis keys of `item`'s counter under `layout` ([`counter_keys_in`]); a tiered item's
/// state (every tier of the parent counter, see `scripts/tiers.lua`) has its own key, with a
/// `:tiers` suffix, in the same slot.
pub fn item_keys(
    layout: KeyLayout,
    prefix: &str,
    item: &tollgate_core::CheckItem<'_>,
) -> CounterKeys {
    let (main, aux) = counter_keys_in(layout, prefix, item.key, item.quota);
    match item.tier {
        Some(_) => (format!("{main}:tiers"), aux),
        None => (main, aux),
    }
}

/// Where a Redis store keeps [`Algorithm::EnvoyFixedWindow`] counters (the other algorithms
/// always use tollgate's layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyLayout {
    /// `<prefix>:{<counter key>}:envoy:<period>`, like every other counter.
    #[default]
    Tollgate,
    /// envoyproxy/ratelimit's: `<prefix><domain>_<key>_<value>_..._<window start>` holding an
    /// integer, incremented with `INCRBY` and given `EXPIRE <window + jitter>`, so that
    /// envoyproxy/ratelimit and tollgate instances on one Redis share their counters. The prefix
    /// is used as is (envoy's `CACHE_KEY_PREFIX`, empty by default). Standalone Redis only: the
    /// keys carry no hash tag and the window start is appended inside the script.
    Envoy,
}

impl std::str::FromStr for KeyLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tollgate" => Ok(KeyLayout::Tollgate),
            "envoy" => Ok(KeyLayout::Envoy),
            _ => Err(format!(
                "unknown Redis key layout '{s}' (expected tollgate or envoy)"
            )),
        }
    }
}

/// envoyproxy/ratelimit's cache key for the counter key `key` (`domain|k=v|...`, escaped as
/// the rules module escapes it), without the window start the script appends:
/// `<prefix><domain>_<k1>_<v1>_<k2>_<v2>_`.
pub(crate) fn envoy_base_key(prefix: &str, key: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + key.len() + 8);
    out.push_str(prefix);
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            '|' | '=' => out.push('_'),
            c => out.push(c),
        }
    }
    out.push('_');
    out
}

/// The keys of one counter under `layout` (see [`KeyLayout`] and [`counter_keys`]).
pub fn counter_keys_in(layout: KeyLayout, prefix: &str, key: &str, quota: &Quota) -> CounterKeys {
    if layout == KeyLayout::Envoy && quota.algorithm() == Algorithm::EnvoyFixedWindow {
        (envoy_base_key(prefix, key), None)
    } else {
        counter_keys(prefix, key, quota)
    }
}

/// Whether a key prefix is usable (no hash-tag braces, not empty).
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty() && !prefix.contains(['{', '}'])
}

/// Reject what the Redis store cannot compute exactly (or at all).
pub fn check_quota(quota: &Quota) -> Result<(), StoreError> {
    let unsupported = |why: String| Err(StoreError::Unsupported(why));
    if quota.algorithm() == Algorithm::CountMinSketch {
        return unsupported(
            "the count_min_sketch algorithm keeps its sketch in process memory and is only \
             available with the memory store; use sliding_window_counter with Redis"
                .into(),
        );
    }
    if quota.period().nominal() > MAX_PERIOD {
        return unsupported(format!(
            "period {} is longer than the Redis store supports (2^50 µs, about 35 years)",
            quota.period()
        ));
    }
    if quota.limit() > MAX_COUNT || quota.capacity() > MAX_COUNT {
        return unsupported("limit or burst above 2^52".into());
    }
    if quota.algorithm().uses_burst() {
        if let Some(t) = quota.emission_interval() {
            let span = t.checked_mul(quota.capacity().max(1));
            if span.is_none_or(|s| s > MAX_SPAN) {
                return unsupported(format!(
                    "burst × period / limit is above 2^51 µs (about 71 years) for {} with limit {}",
                    quota.algorithm(),
                    quota.limit()
                ));
            }
        }
    }
    Ok(())
}

/// CRC16 (XModem), as Redis Cluster uses for key slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key name (hash tag aware).
pub fn slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let close = b[open + 1..].iter().position(|&c| c == b'}')?;
        (close > 0).then(|| &b[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(b)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Period, Unit};

    #[test]
    fn readable_and_injective() {
        assert_eq!(escape("api|user=alice"), "api|user=alice");
        assert_eq!(escape("a:b{c}d%e\nf g"), "a%3Ab%7Bc%7Dd%25e%0Af%20g");
        assert_eq!(escape(""), "%");
        assert_ne!(escape("%3A"), escape(":"));
        assert_ne!(escape("é"), escape("%C3%A9"));
    }

    #[test]
    fn long_keys_are_hashed_and_distinct() {
        let a = "x".repeat(10_000);
        let b = format!("{}y", "x".repeat(9_999));
        let (ea, eb) = (escape(&a), escape(&b));
        assert!(ea.len() < 110 && ea.contains("%%"), "{ea}");
        assert_ne!(ea, eb);
        assert_eq!(escape(&"z".repeat(200)).len(), 200);
    }

    #[test]
    fn slots_follow_hash_tags() {
        // Values from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        let q = Quota::new(5, Period::new(Unit::Minute, 15))
            .with_algorithm(Algorithm::SlidingWindowLog);
        let (k, s) = counter_keys("tg", "api|ip=1.2.3.4", &q);
        assert_eq!(k, "tg:{api|ip=1.2.3.4}:log:15m");
        assert_eq!(slot(&k), slot(&s.unwrap()));
    }

    #[test]
    fn envoy_keys_are_envoys_cache_keys() {
        // envoyproxy/ratelimit's cache_key.go: `<prefix><domain>_<key>_<value>_..._<start>`.
        assert_eq!(
            envoy_base_key("", "domain|key2=value2|subkey2=subvalue2"),
            "domain_key2_value2_subkey2_subvalue2_"
        );
        assert_eq!(envoy_base_key("p:", r"d|k\=x=v\|w"), "p:d_k=x_v|w_");
        let q = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::EnvoyFixedWindow);
        assert_eq!(
            counter_keys_in(KeyLayout::Envoy, "", "d|k=v", &q),
            ("d_k_v_".to_owned(), None)
        );
        let fw = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
        assert_eq!(
            counter_keys_in(KeyLayout::Envoy, "tg", "d|k=v", &fw).0,
            "tg:{d|k=v}:fixed2:1m"
        );
    }

    #[test]
    fn quota_bounds() {
        let ok = Quota::new(100, Unit::Year).with_algorithm(Algorithm::Gcra);
        assert!(check_quota(&ok).is_ok());
        let huge_burst = Quota::new(1, Unit::Year)
            .with_algorithm(Algorithm::Gcra)
            .with_burst(1000);
        assert!(check_quota(&huge_burst).is_err());
        let cms = Quota::new(1, Unit::Second).with_algorithm(Algorithm::CountMinSketch);
        assert!(matches!(
            check_quota(&cms),
            Err(StoreError::Unsupported(m)) if m.contains("count_min_sketch")
        ));
        assert!(check_quota(&Quota::new(1, Period::new(Unit::Year, 40))).is_err());
    }
}
