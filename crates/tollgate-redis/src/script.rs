//! The check script: Lua sources, argument encoding and reply decoding.
//!
//! The script is `common.lua` + one file per algorithm + the `check.lua` driver, concatenated at
//! compile time so the algorithms stay in separate, reviewable files while Redis sees one script
//! (one SHA, one `EVALSHA` per request). On `NOSCRIPT` (a restarted or flushed server) the store
//! falls back to `EVAL` with `SOURCE`, which also caches the script again (see
//! `RedisStore::run`); [`redis::Script`] is kept for its SHA.

use crate::keys::{self, CounterKeys, KeyLayout, MAX_COST};
use redis::{Script, ScriptInvocation};
use tollgate_core::{Algorithm, CheckItem, Decision, Micros, StoreError, Unit};

/// The full Lua source sent to Redis.
pub(crate) const SOURCE: &str = concat!(
    include_str!("../scripts/common.lua"),
    include_str!("../scripts/gcra.lua"),
    include_str!("../scripts/leaky_bucket.lua"),
    include_str!("../scripts/token_bucket.lua"),
    include_str!("../scripts/fixed_window.lua"),
    include_str!("../scripts/envoy_fixed_window.lua"),
    include_str!("../scripts/sliding_log.lua"),
    include_str!("../scripts/sliding_counter.lua"),
    include_str!("../scripts/check.lua"),
);

/// A new handle on the script (computes its SHA once).
pub fn script() -> Script {
    Script::new(SOURCE)
}

/// What the script does with its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Check and (all-or-nothing) consume.
    Check,
    /// Undo the given admitted items of an earlier check, then query them.
    Refund,
}

fn algorithm_code(a: Algorithm) -> u8 {
    match a {
        Algorithm::Gcra => 1,
        Algorithm::LeakyBucket => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::FixedWindow => 4,
        Algorithm::EnvoyFixedWindow => 7,
        Algorithm::SlidingWindowLog => 5,
        Algorithm::SlidingWindowCounter => 6,
        Algorithm::CountMinSketch => 0,
    }
}

fn unit_code(u: Unit) -> u8 {
    match u {
        Unit::Second => 0,
        Unit::Minute => 1,
        Unit::Hour => 2,
        Unit::Day => 3,
        Unit::Week => 4,
        Unit::Month => 5,
        Unit::Year => 6,
    }
}

/// One call's worth of arguments.
pub struct Call<'a> {
    /// Explicit time, or `None` for Redis `TIME`.
    pub now: Option<Micros>,
    /// Request id (tags sliding-log entries so a refund removes exactly them).
    pub reqid: &'a str,
    /// Check or refund.
    pub mode: Mode,
    /// Whether the whole request has exactly one item.
    pub single: bool,
    /// Extra TTL in milliseconds.
    pub grace_ms: u64,
    /// Where envoy_fixed_window counters live.
    pub layout: KeyLayout,
    /// Envoy layout: `EXPIRE` adds a jitter in `[0, jitter_max_s)` seconds (envoy's
    /// `EXPIRATION_JITTER_MAX_SECONDS`), drawn from `jitter_seed` per item.
    pub jitter_max_s: u64,
    /// Seed of this call's jitters.
    pub jitter_seed: u64,
}

/// SplitMix64: a cheap, well-mixed draw for expiry jitter (not for anything secret).
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One item of a call: its index in the request, the item, its keys.
pub(crate) type Entry<'a> = (usize, &'a CheckItem<'a>, &'a CounterKeys);

/// The keys and arguments of one call for `items` (with their index in the request and keys).
pub(crate) fn arguments(call: &Call<'_>, items: &[Entry<'_>]) -> (Vec<String>, Vec<String>) {
    let mut keys = Vec::with_capacity(items.len() + 1);
    let mut args = Vec::with_capacity(6 + 13 * items.len());
    args.extend([
        call.now.map_or(String::new(), |n| n.to_string()),
        call.reqid.to_owned(),
        match call.mode {
            Mode::Check => "c",
            Mode::Refund => "r",
        }
        .to_owned(),
        if call.single { "1" } else { "0" }.to_owned(),
        call.grace_ms.to_string(),
        items.len().to_string(),
    ]);
    for (idx, item, (main, sum)) in items {
        let q = item.quota;
        keys.push(main.clone());
        if let Some(s) = sum {
            keys.push(s.clone());
        }
        let envoy = call.layout == KeyLayout::Envoy && q.algorithm() == Algorithm::EnvoyFixedWindow;
        let jitter = if call.jitter_max_s > 0 {
            splitmix(call.jitter_seed ^ (*idx as u64)) % call.jitter_max_s
        } else {
            0
        };
        let expire = tollgate_core::internals::envoy_window_secs(q.period())
            + jitter
            + call.grace_ms.div_ceil(1000);
        let fields: [u64; 13] = [
            algorithm_code(q.algorithm()).into(),
            item.cost.min(MAX_COST),
            item.shadow.into(),
            q.limit(),
            q.capacity().max(1),
            q.emission_interval().unwrap_or(0),
            unit_code(q.period().unit).into(),
            q.period().multiplier.max(1).into(),
            q.period().nominal(),
            *idx as u64,
            item.count_denied.into(),
            envoy.into(),
            expire,
        ];
        args.extend(fields.iter().map(u64::to_string));
    }
    (keys, args)
}

/// Build the invocation for `items` (with their index in the request and their keys).
pub fn invocation<'s>(
    script: &'s Script,
    call: &Call<'_>,
    items: &[Entry<'_>],
) -> ScriptInvocation<'s> {
    let (keys, args) = arguments(call, items);
    let mut inv = script.prepare_invoke();
    for k in keys {
        inv.key(k);
    }
    for a in args {
        inv.arg(a);
    }
    inv
}

/// The `EVALSHA` command line (for `redis-cli` / `redis-benchmark`) that checks `item` once at
/// the server's time, exactly as [`crate::RedisStore::check`] would. Empty arguments are
/// written as `""`.
pub fn command_line(prefix: &str, item: &CheckItem<'_>, reqid: &str) -> String {
    let keys = keys::counter_keys(prefix, item.key, item.quota);
    let call = Call {
        now: None,
        reqid,
        mode: Mode::Check,
        single: true,
        grace_ms: 0,
        layout: KeyLayout::Tollgate,
        jitter_max_s: 0,
        jitter_seed: 0,
    };
    let (k, a) = arguments(&call, &[(0, item, &keys)]);
    let quote = |s: &String| {
        if s.is_empty() {
            "\"\"".to_owned()
        } else {
            format!("'{s}'")
        }
    };
    let mut out = format!("EVALSHA {} {}", script().get_hash(), k.len());
    for s in k.iter().chain(&a) {
        out.push(' ');
        out.push_str(&quote(s));
    }
    out
}

/// A decoded reply: the script's `now`, whether its items blocked, and one decision per item.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The instant the script used.
    pub now: Micros,
    /// Whether a non-shadow item was denied.
    pub blocked: bool,
    /// One per item, in order.
    pub decisions: Vec<Decision>,
}

/// Decode the flat integer array the script returns.
pub(crate) fn decode(v: &[i64], n: usize) -> Result<Reply, StoreError> {
    if v.len() != 2 + 7 * n {
        return Err(StoreError::Unavailable(format!(
            "unexpected script reply: {} integers for {n} items",
            v.len()
        )));
    }
    let u = |x: i64| x.max(0) as u64;
    let decisions = v[2..]
        .chunks_exact(7)
        .map(|c| Decision {
            allowed: c[0] == 1,
            limit: u(c[1]),
            remaining: u(c[2]),
            reset_after: u(c[3]),
            retry_after: (c[4] >= 0).then(|| u(c[4])),
            delay: u(c[5]),
            count: (c[6] >= 0).then(|| u(c[6])),
        })
        .collect();
    Ok(Reply {
        now: u(v[0]),
        blocked: v[1] == 1,
        decisions,
    })
}

/// Validate every item for this store.
pub(crate) fn validate(items: &[CheckItem<'_>], now: Option<Micros>) -> Result<(), StoreError> {
    if now.is_some_and(|n| n > keys::MAX_NOW) {
        return Err(StoreError::Unsupported(
            "time after 2^52 µs since the epoch".into(),
        ));
    }
    items.iter().try_for_each(|i| keys::check_quota(i.quota))
}
