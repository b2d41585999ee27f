//! The check script: Lua sources, argument encoding and reply decoding.
//!
//! The code is `common.lua` + one file per algorithm + the `check.lua` driver, concatenated at
//! compile time so the algorithms stay in separate, reviewable files while Redis sees one piece
//! of code. It ends in the function `check`, which Redis runs in one of two forms:
//!
//! - a **Redis Function** ([`library`], `FUNCTION LOAD` once, then `FCALL`; Redis 7+, Valkey):
//!   the helpers are defined when the library loads, so a call runs only the decision;
//! - an **`EVAL` script** (`SOURCE`, `EVALSHA`; older servers, or where the ACL forbids
//!   `FUNCTION`): the body redefines every helper on each call, which costs Redis more.
//!
//! The store tries the function first and falls back by itself (see `RedisStore::run`). Both
//! forms take the same arguments: the numbers packed in one binary string, decoded by Lua's
//! `struct` library, and return one packed string: an argument or reply field per number cost
//! Redis an object, a parse and a conversion each.
//!
//! The library also holds `fast.lua`: for the most common request, one fixed window or sliding
//! window counter and no lease, the function `<name>_fast` runs the same algorithm code without
//! `check`'s item list and bookkeeping, for a batch of such requests in one call
//! ([`fast_item`], [`fast_command`], `decode_fast`; the store's coalescing fills the batches).
//! The script form has no such function: there `check` answers those requests too.

use crate::keys::{self, CounterKeys, KeyLayout, MAX_COST};
use redis::Script;
use tollgate_core::{Algorithm, CheckItem, Decision, Micros, StoreError, Unit};

macro_rules! lua_body {
    () => {
        concat!(
            include_str!("../scripts/common.lua"),
            include_str!("../scripts/gcra.lua"),
            include_str!("../scripts/leaky_bucket.lua"),
            include_str!("../scripts/token_bucket.lua"),
            include_str!("../scripts/fixed_window.lua"),
            include_str!("../scripts/envoy_fixed_window.lua"),
            include_str!("../scripts/sliding_log.lua"),
            include_str!("../scripts/sliding_counter.lua"),
            include_str!("../scripts/tiers.lua"),
            include_str!("../scripts/check.lua"),
        )
    };
}

/// The `EVAL` form of the script: the body, then a call of `check`.
pub(crate) const SOURCE: &str = concat!(lua_body!(), "return check(KEYS, ARGV)\n");

/// A new handle on the `EVAL` form of the script (computes its SHA once).
pub fn script() -> Script {
    Script::new(SOURCE)
}

/// The name of the Redis Function (and of its library) for this version of the code:
/// `tollgate_` and the first 16 hex digits of the script's SHA1, so instances running different
/// versions against one Redis each call their own.
pub fn function_name(sha: &str) -> String {
    format!("tollgate_{}", &sha[..16.min(sha.len())])
}

/// The name of this version's library and check function ([`function_name`]), from the SHA1 of
/// all the code the library holds (the `EVAL` form and `fast.lua`).
pub fn library_name() -> String {
    const ALL: &str = concat!(
        lua_body!(),
        "return check(KEYS, ARGV)\n",
        include_str!("../scripts/fast.lua")
    );
    function_name(Script::new(ALL).get_hash())
}

/// The library that `FUNCTION LOAD` takes: the body, registering `check` as `name`, and the
/// batched one-item check of `fast.lua` as [`fast_function`]`(name)`, which may touch keys of
/// several slots of one cluster node (`allow-cross-slot-keys`: a cluster batch groups requests
/// by node, see [`FastKeys::OnNode`]).
pub fn library(name: &str) -> String {
    format!(
        "#!lua name={name}\n{}{}redis.register_function('{name}', check)\n\
         redis.register_function{{function_name='{fast}', callback=fast_many, \
         flags={{'allow-cross-slot-keys'}}}}\n",
        lua_body!(),
        include_str!("../scripts/fast.lua"),
        fast = fast_function(name),
    )
}

/// The name of the batched one-item check (`scripts/fast.lua`) in the library `name`.
pub fn fast_function(name: &str) -> String {
    format!("{name}_fast")
}

/// What the script does with its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Check and (all-or-nothing) consume.
    Check,
    /// Undo the given admitted items of an earlier check, then query them.
    Refund,
}

pub(crate) fn algorithm_code(a: Algorithm) -> u8 {
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
    /// Lease units wanted beyond the cost, by index in the request (empty: none; see
    /// check.lua). Only for fixed_window and sliding_window_counter items.
    pub leases: &'a [u64],
}

/// SplitMix64: a cheap, well-mixed draw for expiry jitter (not for anything secret).
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `EXPIRE` seconds of an envoy-layout counter (item `idx` of the request): envoy's window, its
/// jitter in `[0, jitter_max_s)` drawn from the call's seed, and the grace.
pub(crate) fn envoy_expire(call: &Call<'_>, idx: usize, q: &tollgate_core::Quota) -> u64 {
    let jitter = if call.jitter_max_s > 0 {
        splitmix(call.jitter_seed ^ (idx as u64)) % call.jitter_max_s
    } else {
        0
    };
    tollgate_core::internals::envoy_window_secs(q.period()) + jitter + call.grace_ms.div_ceil(1000)
}

/// One item of a call: its index in the request, the item, its keys.
pub type Entry<'a> = (usize, &'a CheckItem<'a>, &'a CounterKeys);

/// Bytes of the packed header and of each packed item (check.lua's `'<ddBBH'`, `'<BBBBBddddddddd'`).
const HEADER_LEN: usize = 8 + 8 + 1 + 1 + 2;
const ITEM_LEN: usize = 5 + 8 * 9;

/// A number as check.lua reads it: a little-endian double. Every number sent is an integer
/// below 2^53 (keys.rs bounds the quotas, times and costs), which a double holds exactly.
fn put(buf: &mut Vec<u8>, x: u64) {
    buf.extend_from_slice(&(x as f64).to_le_bytes());
}

/// The keys and the two arguments (the packed numbers, the request id) of one call for `items`
/// (with their index in the request and keys).
pub(crate) fn arguments(call: &Call<'_>, items: &[Entry<'_>]) -> (Vec<String>, Vec<u8>) {
    let mut keys = Vec::with_capacity(items.len() + 1);
    let mut packed = Vec::with_capacity(HEADER_LEN + ITEM_LEN * items.len());
    match call.now {
        Some(n) => put(&mut packed, n),
        None => packed.extend_from_slice(&(-1f64).to_le_bytes()),
    }
    put(&mut packed, call.grace_ms);
    packed.push(match call.mode {
        Mode::Check => 0,
        Mode::Refund => 1,
    });
    packed.push(call.single.into());
    // At most 64 descriptors of at most 16 entries reach a store (tollgate-core's limits).
    packed.extend_from_slice(&(items.len().min(u16::MAX as usize) as u16).to_le_bytes());
    for (idx, item, (main, sum)) in items {
        let q = item.quota;
        keys.push(main.clone());
        if let Some(s) = sum {
            keys.push(s.clone());
        }
        let envoy = call.layout == KeyLayout::Envoy && q.algorithm() == Algorithm::EnvoyFixedWindow;
        let expire = envoy_expire(call, *idx, q);
        packed.extend_from_slice(&[
            item.tier.map_or(algorithm_code(q.algorithm()), |_| TIERED),
            item.shadow.into(),
            unit_code(q.period().unit),
            item.count_denied.into(),
            envoy.into(),
        ]);
        for x in [
            item.cost.min(MAX_COST),
            q.limit(),
            q.capacity().max(1),
            q.emission_interval().unwrap_or(0),
            q.period().multiplier.max(1).into(),
            q.period().nominal(),
            *idx as u64,
            expire,
            call.leases.get(*idx).copied().unwrap_or(0),
        ] {
            put(&mut packed, x);
        }
        if let Some(t) = item.tier {
            put_tiers(&mut packed, &t, q);
        }
    }
    (keys, packed)
}

/// check.lua's algorithm code of a tiered item (tiers.lua), whatever its window algorithm.
const TIERED: u8 = 8;

/// A tiered item's tier table, after its fixed fields (tiers.lua's `tiers_unpack`): levels,
/// tier, sliding (one byte each), then guaranteed, ceiling and reserve per level. Levels are
/// at most [`tollgate_core::rules::MAX_TIER_LEVELS`] ([`validate`]).
fn put_tiers(packed: &mut Vec<u8>, t: &tollgate_core::store::Tier<'_>, q: &tollgate_core::Quota) {
    let n = t.levels.len().min(tollgate_core::rules::MAX_TIER_LEVELS);
    packed.extend_from_slice(&[
        n as u8,
        t.index,
        (q.algorithm() == Algorithm::SlidingWindowCounter).into(),
    ]);
    for l in &t.levels[..n] {
        for x in [l.guaranteed, l.ceiling, l.reserve] {
            put(packed, x.min(keys::MAX_COUNT));
        }
    }
}

/// The `EVAL` of the script for `items` (with their index in the request and their keys), as
/// the store sends it where functions are unavailable: for tests that drive the script itself.
pub fn eval(call: &Call<'_>, items: &[Entry<'_>]) -> redis::Cmd {
    let (keys, packed) = arguments(call, items);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SOURCE)
        .arg(keys.len())
        .arg(&keys)
        .arg(packed)
        .arg(call.reqid);
    cmd
}

/// The `FCALL` of the Redis Function `name` (or of its one-item form, `scripts/fast.lua`, for
/// a fixed window or a sliding window counter) that checks `item` once at the server's time, exactly as
/// [`crate::RedisStore::check`] would for one caller (a benchmark's ceiling: the same call with no
/// store around it). The library must be loaded ([`library`]).
pub fn fcall(name: &str, prefix: &str, item: &CheckItem<'_>, reqid: &str) -> redis::Cmd {
    let keys = keys::item_keys(KeyLayout::Tollgate, prefix, item);
    let call = Call {
        now: None,
        reqid,
        mode: Mode::Check,
        single: true,
        grace_ms: 0,
        layout: KeyLayout::Tollgate,
        jitter_max_s: 0,
        jitter_seed: 0,
        leases: &[],
    };
    let entries = [(0, item, &keys)];
    if let Some(fast) = fast_item(&call, &entries) {
        return fast_command(
            &fast_function(name),
            &fast_header(None, 0),
            [(keys.0.as_str(), &fast)],
            FastKeys::Declared,
        );
    }
    let (k, packed) = arguments(&call, &entries);
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(name).arg(k.len()).arg(&k).arg(packed).arg(reqid);
    cmd
}

/// Bytes of a batch's header for fast.lua (`'<dd'`: now, grace) and of each request in it
/// (`'<ddddBB'`, then its key's place, added by [`fast_command`]).
const FAST_HEADER_LEN: usize = 2 * 8;
const FAST_ITEM_LEN: usize = 4 * 8 + 2;

/// One request as fast.lua reads it (see [`fast_item`]).
pub type FastItem = [u8; FAST_ITEM_LEN];
/// A batch's header: the time (or Redis `TIME`) and the TTL grace every request in it shares.
pub type FastHeader = [u8; FAST_HEADER_LEN];

/// The header of a batch of requests at `now` (`None`: Redis `TIME`) with a TTL grace of
/// `grace_ms`.
pub fn fast_header(now: Option<Micros>, grace_ms: u64) -> FastHeader {
    let mut h = [0u8; FAST_HEADER_LEN];
    let now = now.map_or(-1.0, |n| n as f64);
    h[..8].copy_from_slice(&now.to_le_bytes());
    h[8..].copy_from_slice(&(grace_ms as f64).to_le_bytes());
    h
}

/// The packed request for fast.lua, when the call is one that it answers as `check` would: a
/// check of a one-item request whose item is a fixed window or a sliding window counter, not
/// tiered (a tiered limit's state lives under its own key, decided by tiers.lua), asking for no
/// lease.
pub fn fast_item(call: &Call<'_>, items: &[Entry<'_>]) -> Option<FastItem> {
    let [(idx, item, _)] = items else {
        return None;
    };
    let q = item.quota;
    let alg = match q.algorithm() {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter if item.tier.is_none() => {
            algorithm_code(q.algorithm())
        }
        _ => return None,
    };
    if call.mode != Mode::Check || !call.single || call.leases.get(*idx).is_some_and(|&l| l > 0) {
        return None;
    }
    let mut packed = [0u8; FAST_ITEM_LEN];
    for (i, x) in [
        item.cost.min(MAX_COST),
        q.limit(),
        q.period().nominal(),
        q.period().multiplier.max(1).into(),
    ]
    .into_iter()
    .enumerate()
    {
        packed[8 * i..8 * i + 8].copy_from_slice(&(x as f64).to_le_bytes());
    }
    packed[32] = unit_code(q.period().unit);
    packed[33] = alg;
    Some(packed)
}

/// fast.lua's flags on a request's algorithm byte: its key has further requests in the batch
/// (`MORE`), or this is the last of several (`LAST`). Such a key is read and written once.
const MORE: u8 = 16;
const LAST: u8 = 32;

/// How a batch's keys go in its `FCALL` ([`fast_command`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastKeys {
    /// Every key declared (a single server, or keys of one slot).
    Declared,
    /// For keys spanning several slots of one Redis Cluster node: the first key alone is
    /// declared (a cluster routes the call by it, and refuses declared keys of several slots),
    /// and every key follows the packed requests.
    OnNode,
}

/// The `FCALL` of fast.lua's function `function` for a batch of requests (their counter keys
/// and packed requests, in order) sharing `header`, its keys passed as `how` says. Each distinct
/// key is sent once; each request names its key's place among them, and requests on a key that
/// repeats in the batch are flagged.
pub fn fast_command<'a>(
    function: &str,
    header: &FastHeader,
    requests: impl IntoIterator<Item = (&'a str, &'a FastItem)>,
    how: FastKeys,
) -> redis::Cmd {
    let (keys, packed) = fast_arguments(header, requests);
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function);
    match how {
        FastKeys::Declared => cmd.arg(keys.len()).arg(&keys).arg(packed),
        FastKeys::OnNode => cmd
            .arg(1)
            .arg(keys.first().copied().unwrap_or(""))
            .arg(packed)
            .arg(&keys),
    };
    cmd
}

/// A batch's distinct keys, in order, and its packed header and requests (see [`fast_command`]).
fn fast_arguments<'a>(
    header: &FastHeader,
    requests: impl IntoIterator<Item = (&'a str, &'a FastItem)>,
) -> (Vec<&'a str>, Vec<u8>) {
    let requests: Vec<_> = requests.into_iter().collect();
    let n = requests.len();
    // Per distinct key: its place in KEYS and the last request on it so far.
    let mut keys: std::collections::HashMap<&str, (u16, usize)> =
        std::collections::HashMap::with_capacity(n);
    let mut order: Vec<&str> = Vec::with_capacity(n);
    let mut place = vec![0u16; n];
    let mut flags = vec![0u8; n];
    for (i, (key, _)) in requests.iter().enumerate() {
        match keys.get_mut(key) {
            Some((k, last)) => {
                flags[*last] = MORE;
                flags[i] = LAST;
                *last = i;
                place[i] = *k;
            }
            None => {
                order.push(key);
                let k = order.len().min(u16::MAX as usize) as u16;
                keys.insert(key, (k, i));
                place[i] = k;
            }
        }
    }
    let mut packed = Vec::with_capacity(FAST_HEADER_LEN + (FAST_ITEM_LEN + 2) * n);
    packed.extend_from_slice(header);
    for (((_, item), flag), k) in requests.into_iter().zip(flags).zip(place) {
        packed.extend_from_slice(&item[..FAST_ITEM_LEN - 1]);
        packed.push(item[FAST_ITEM_LEN - 1] + flag);
        packed.extend_from_slice(&k.to_le_bytes());
    }
    (order, packed)
}

/// One request's answer in a fast.lua reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastAnswer {
    /// Admitted.
    pub allowed: bool,
    /// Units left after it.
    pub remaining: u64,
    /// Until the counter is full again, µs.
    pub reset_after: u64,
    /// When denied: until a retry can succeed, µs.
    pub retry_after: Option<u64>,
}

impl FastAnswer {
    /// The store's reply for a request of the one item `item` answered so at `now`.
    pub(crate) fn reply(self, now: Micros, item: &CheckItem<'_>) -> Reply {
        Reply {
            now,
            blocked: !self.allowed && !item.shadow,
            decisions: vec![Decision {
                allowed: self.allowed,
                limit: item.quota.limit(),
                remaining: self.remaining,
                reset_after: self.reset_after,
                retry_after: self.retry_after,
                delay: 0,
                count: None,
            }],
        }
    }
}

/// A fast.lua reply for `n` requests: the batch's time and, per request, its answer or the
/// error Redis raised for it alone (a key holding a value tollgate did not write, a refused
/// write).
pub type FastReply = (Micros, Vec<Result<FastAnswer, String>>);

/// Decode a fast.lua reply for `n` requests (see fast.lua).
pub fn decode_fast(v: redis::Value, n: usize) -> Result<FastReply, StoreError> {
    let bad = |what: String| {
        StoreError::Unavailable(format!("unexpected one-item function reply: {what}"))
    };
    let (packed, mut errors) = match v {
        redis::Value::BulkString(b) => (b, Vec::new()),
        redis::Value::Array(a) => {
            let mut it = a.into_iter();
            let Some(redis::Value::BulkString(b)) = it.next() else {
                return Err(bad("an array without the packed answers".into()));
            };
            let errors = it
                .map(|e| match e {
                    redis::Value::BulkString(m) => String::from_utf8_lossy(&m).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect();
            (b, errors)
        }
        other => return Err(bad(format!("{other:?}"))),
    };
    if packed.len() != 8 * (1 + 4 * n) {
        return Err(bad(format!("{} bytes for {n} requests", packed.len())));
    }
    let v = numbers(&packed);
    let u = |x: i64| x.max(0) as u64;
    errors.reverse();
    let answers = v[1..]
        .chunks_exact(4)
        .map(|c| {
            if c[0] < 0 {
                return Err(errors
                    .pop()
                    .unwrap_or_else(|| "the one-item function failed".into()));
            }
            Ok(FastAnswer {
                allowed: c[0] == 1,
                remaining: u(c[1]),
                reset_after: u(c[2]),
                retry_after: (c[3] >= 0).then(|| u(c[3])),
            })
        })
        .collect();
    Ok((u(v[0]), answers))
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

/// The numbers of a packed reply, in order (`now`, `blocked`, then 7 per item; see check.lua):
/// for tests that drive the script itself.
pub fn numbers(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            f64::from_le_bytes(b) as i64
        })
        .collect()
}

/// Decode the packed reply (`'<d'` per number, see check.lua).
pub(crate) fn decode(bytes: &[u8], n: usize) -> Result<Reply, StoreError> {
    if bytes.len() != 8 * (2 + 7 * n) {
        return Err(StoreError::Unavailable(format!(
            "unexpected script reply: {} bytes for {n} items",
            bytes.len()
        )));
    }
    let v = numbers(bytes);
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
    items.iter().try_for_each(|i| {
        keys::check_quota(i.quota)?;
        match i.tier {
            Some(t)
                if !matches!(
                    i.quota.algorithm(),
                    Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
                ) || t.levels.is_empty()
                    || t.levels.len() > tollgate_core::rules::MAX_TIER_LEVELS =>
            {
                Err(StoreError::Unsupported(format!(
                    "tiers of 1 to {} levels over fixed_window or sliding_window_counter (found {} levels over {})",
                    tollgate_core::rules::MAX_TIER_LEVELS,
                    t.levels.len(),
                    i.quota.algorithm()
                )))
            }
            _ => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch names each distinct key once; each request carries its key's place and the flag
    /// of a key that repeats (more to come, or the last of several).
    #[test]
    fn a_batch_sends_each_key_once_and_flags_repeats() {
        let keys: Vec<String> = ["a", "b", "a", "c", "a"].map(String::from).to_vec();
        let mut item = [0u8; FAST_ITEM_LEN];
        item[FAST_ITEM_LEN - 1] = 6;
        let cmd = fast_command(
            "f",
            &fast_header(None, 0),
            keys.iter().map(|k| (&**k, &item)),
            FastKeys::Declared,
        );
        let args = args_of(&cmd);
        assert_eq!(args[..6], [&b"FCALL"[..], b"f", b"3", b"a", b"b", b"c"]);
        let packed = &args[6];
        assert_eq!(packed.len(), FAST_HEADER_LEN + 5 * (FAST_ITEM_LEN + 2));
        let tail: Vec<(u8, u16)> = packed[FAST_HEADER_LEN..]
            .chunks_exact(FAST_ITEM_LEN + 2)
            .map(|r| {
                (
                    r[FAST_ITEM_LEN - 1],
                    u16::from_le_bytes([r[FAST_ITEM_LEN], r[FAST_ITEM_LEN + 1]]),
                )
            })
            .collect();
        assert_eq!(
            tail,
            [(6 + MORE, 1), (6, 2), (6 + MORE, 1), (6, 3), (6 + LAST, 1)]
        );
        // On a cluster node: the first key alone declared, every key after the same requests.
        let on_node = args_of(&fast_command(
            "f",
            &fast_header(None, 0),
            keys.iter().map(|k| (&**k, &item)),
            FastKeys::OnNode,
        ));
        assert_eq!(on_node[..4], [&b"FCALL"[..], b"f", b"1", b"a"]);
        assert_eq!(on_node[4], *packed);
        assert_eq!(on_node[5..], [&b"a"[..], b"b", b"c"]);
    }

    fn args_of(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }
}
