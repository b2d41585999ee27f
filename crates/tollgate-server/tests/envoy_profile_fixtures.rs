//! envoyproxy/ratelimit's rule files (the fixtures of `tollgate-core`, copied unchanged from
//! its repository) served under the envoy profile: the state is built exactly as `tollgate serve
//! --profile envoy` builds it (`profile::translate` of an envoy environment, then
//! `serve::build_state`), on the memory store and on the shared Redis (envoy's key layout under a
//! unique `CACHE_KEY_PREFIX`), and queried through `router(state)` with `oneshot`.
//!
//! The state is built with a `ManualClock` (`serve::build_state_with_clock`): the memory store
//! steps at its time and the Redis scripts are given it (instead of Redis `TIME`), so every
//! sequence is exact on both stores, window boundaries included, and `duration_until_reset` is
//! checked to be envoy's `divider - now % divider` for the clock's `now`.
//!
//! Behaviours checked, each on memory and on Redis (envoy's expectation in brackets):
//!
//! | # | behaviour | source |
//! |---|---|---|
//! | 1 | hits 21 on a fresh 20/minute rule with no `algorithm`: OVER_LIMIT, `limit_remaining` 0 | base_limiter.go |
//! | 2 | its `duration_until_reset` is whole seconds, `60 - now % 60` (envoy's fixed window) | base_limiter.go (CalculateReset) |
//! | 3 | hits 30 on a 30/minute value override: OK, `limit_remaining` 0 | TestOverLimitWithLocalCache (at the limit) |
//! | 4 | a denied descriptor's hits are counted: the next single hit on it is still OVER_LIMIT | fixed_cache_impl.go (INCRBY before the check) |
//! | 5 | the other descriptor of the denied request counted the hits too (25/day: 9 left, then 8) | same, every descriptor |
//! | 6 | DAY `duration_until_reset` is `86400 - now % 86400` | CalculateReset |
//! | 7 | `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when a key would go over, only the keys going over are incremented (its `getHitsAddend`); the others keep their count | settings.go, TestOverLimitWithStopCacheKeyIncrement |
//! | 8 | shadow-mode rule over its limit: HTTP 200, code OK, `limit_remaining` 0 | base_limiter.go (shadow) |
//! | 9 | `SHADOW_MODE=true`: a request over a 1/hour limit is answered OK overall | service.go (global shadow) |
//! | 10 | `unlimited: true`: any number of hits is OK | TestUnlimited |
//! | 11 | a value override with no rate limit whitelists the value | basic_config.yaml (key2/value3) |
//! | 12 | `replaces`: the replaced 5/second limit no longer applies (6 hits OK), the replacing 10/second one does (11 hits over) | README example 7 |
//! | 13 | a per-second limit exhausted late in second N is OVER_LIMIT; at the start of N+1 its window is fresh | CalculateReset, cache keys per window |
//! | 14 | MINUTE, HOUR, DAY likewise at their boundary; `duration_until_reset` 1 s in the window's last second, the whole unit at its start | same |
//! | 15 | WEEK: 7-day windows from the epoch (Thursdays): reset 604800 s at 2026-01-01, fresh on Jan 8 (not Monday Jan 5) | UnitToDivider |
//! | 16 | MONTH: 30-day windows from the epoch: reset 518400 s at 2026-01-01, fresh on Jan 7 (not Feb 1) | UnitToDivider |
//! | 17 | YEAR: 365-day windows from the epoch: reset 30326400 s at 2026-01-01, fresh on 2026-12-18 | UnitToDivider |
//! | 18 | `duration_until_reset` mid-window in whole seconds, `divider - now % divider` (18, 1338, 37338 s at 13:37:42.7) | CalculateReset |
//! | 19 | statistics of TestNearLimit (15/hour: 10 -> 11 within; 12 -> 13 near; 15 -> 16 one over) | fixed_cache_impl_test |
//! | 20 | key5: 20/s, 2 -> 5 by 3: 3 within | same |
//! | 21 | key6: 8/s, 5 -> 7 by 2: 1 near, 2 within | same |
//! | 22 | key7: 20/s, 16 -> 19 by 3: 3 near, 3 within | same |
//! | 23 | key8: 20/s, 19 -> 22 by 3: OVER_LIMIT, 2 over, 1 near, 0 within | same |
//! | 24 | key9: 20/s, 15 -> 22 by 7: 2 over, 4 near | same |
//! | 25 | key10: 10/s, 27 -> 30 by 3: 3 over | same |
//! | 26 | shadow-mode rule: answered OK, its hits past the limit in over_limit and shadow_mode (TestOverLimitWithLocalCacheShadowRule's steps; crossing by 3) | same, base_limiter_test |
//! | 27 | local cache (`LOCAL_CACHE_SIZE_IN_BYTES`): a hit denied without Redis counts in over_limit and over_limit_with_local_cache (Redis only) | TestOverLimitWithLocalCache |
//! | 28 | statistics with `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (a key left at 13 still counts 2 within, 1 near) | TestOverLimitWithStopCacheKeyIncrement |
//! | 29 | every descriptor of a denied request is counted in the statistics (key5: 1 over, 3 near; subkey5: 16 within) | GenerateCacheKeys, GetResponseDescriptorStatus |
//! | 30 | a descriptor with no entries is OK with no limit (not INVALID_ARGUMENT); next to it, a limited descriptor still decides | service.go (no limit found for an empty descriptor) |

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::clock::{Clock, Micros, SECOND};
use tollgate_core::quota::Unit;
use tollgate_core::ManualClock;
use tollgate_server::envoy::profile::{reset_secs, translate};
use tollgate_server::envoy::stats::envoy_counters;
use tollgate_server::serve::{build_state_with_clock, ServeConfig};
use tollgate_server::AppState;
use tollgate_testsupport::{delete_prefix, shared_url, unique_prefix};
use tower::ServiceExt;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tollgate-core/tests/fixtures/envoy-ratelimit")
        .join(rel)
}

#[derive(Clone, Copy)]
enum Store {
    Memory,
    Redis,
}

/// A service built as `--profile envoy` builds it; removes its runtime folder and Redis keys
/// when dropped.
struct Profile {
    app: Router,
    state: AppState,
    clock: Arc<ManualClock>,
    root: PathBuf,
    prefix: Option<String>,
}

/// 2026-01-01T00:00:00Z, a Thursday (so also the start of one of envoy's epoch-aligned weeks),
/// plus a quarter of a second.
const T0: Micros = 1_767_225_600 * SECOND + 250_000;

impl Drop for Profile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
        if let Some(prefix) = &self.prefix {
            delete_prefix(shared_url(), prefix);
        }
    }
}

/// The fixtures copied into envoy's runtime layout (`RUNTIME_ROOT/config/`), the environment
/// translated and the state built as `serve` builds it, at [`T0`] on a manual clock.
async fn profile(store: Store, files: &[&str], extra: &[(&str, &str)]) -> Profile {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let name = Path::new(f).file_name().expect("file name");
            let text = std::fs::read_to_string(fixture(f)).expect("read fixture");
            (name.to_string_lossy().into_owned(), text)
        })
        .collect();
    profile_of(store, &files, extra).await
}

/// [`profile`] with rule files given as `(name, contents)`.
async fn profile_of(store: Store, files: &[(String, String)], extra: &[(&str, &str)]) -> Profile {
    let name = unique_prefix("envoy-profile");
    let root = std::env::temp_dir().join(&name);
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).expect("runtime dir");
    for (file, text) in files {
        std::fs::write(dir.join(file), text).expect("write rules");
    }
    let mut vars: BTreeMap<String, String> = [
        ("RUNTIME_ROOT", root.display().to_string()),
        ("USE_STATSD", "false".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let prefix = match store {
        Store::Memory => None,
        Store::Redis => {
            vars.insert("REDIS_SOCKET_TYPE".into(), "tcp".into());
            vars.insert(
                "REDIS_URL".into(),
                tollgate_testsupport::shared_addr().into(),
            );
            vars.insert("CACHE_KEY_PREFIX".into(), format!("{name}:"));
            Some(name)
        }
    };
    for (k, v) in extra {
        vars.insert((*k).to_owned(), (*v).to_owned());
    }
    let t = translate(&vars, ServeConfig::default()).expect("translate");
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    match store {
        Store::Memory => assert_eq!(t.config.store.url, "memory"),
        Store::Redis => assert!(
            t.config.store.url.starts_with("redis"),
            "{}",
            t.config.store.url
        ),
    }
    let clock = Arc::new(ManualClock::new(T0));
    let state = build_state_with_clock(&t.config, &t.envoy, clock.clone())
        .await
        .expect("build_state");
    Profile {
        app: tollgate_server::serve::http_api(&state, t.envoy.mode.as_ref()).router(),
        state,
        clock,
        root,
        prefix,
    }
}

struct Resp {
    status: StatusCode,
    body: Value,
    text: String,
    /// The clock's second during the request.
    now: u64,
}

impl Profile {
    /// Set the clock.
    fn at(&self, now: Micros) {
        self.clock.set(now);
    }

    /// The envoy-named counter `name` (`ratelimit.service.rate_limit.<stats key>.<stat>`).
    fn stat(&self, name: &str) -> u64 {
        envoy_counters(self.state.metrics())
            .into_iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| v)
    }

    /// The per-rule stats of `key` (the stats key): total_hits, over_limit, near_limit,
    /// within_limit, shadow_mode, over_limit_with_local_cache.
    fn stats(&self, key: &str) -> [u64; 6] {
        [
            "total_hits",
            "over_limit",
            "near_limit",
            "within_limit",
            "shadow_mode",
            "over_limit_with_local_cache",
        ]
        .map(|s| self.stat(&format!("ratelimit.service.rate_limit.{key}.{s}")))
    }
}

async fn check(p: &Profile, domain: &str, descriptors: &[&[(&str, &str)]], hits: u64) -> Resp {
    let body = json!({
        "domain": domain,
        "hits_addend": hits,
        "descriptors": descriptors.iter().map(|d| json!({
            "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()
        })).collect::<Vec<_>>()
    });
    let req = Request::post("/v1/check")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let now = p.clock.now() / SECOND;
    let resp = p.app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Resp {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
        now,
    }
}

impl Resp {
    fn code(&self, i: usize) -> &str {
        self.body["statuses"][i]["code"].as_str().unwrap_or("?")
    }

    fn remaining(&self, i: usize) -> u64 {
        self.body["statuses"][i]["limit_remaining"]
            .as_u64()
            .unwrap_or(u64::MAX)
    }

    /// Status `i`'s `duration_until_reset` in seconds (whole seconds, as envoy's).
    fn reset(&self, i: usize) -> u64 {
        let ms = self.body["statuses"][i]["duration_until_reset_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no reset in {}", self.text));
        assert_eq!(ms % 1000, 0, "whole seconds: {}", self.text);
        ms / 1000
    }

    /// Status `i`'s `duration_until_reset` is envoy's `divider - now % divider` for the
    /// clock's `now`.
    fn assert_envoy_reset(&self, i: usize, unit: Unit) {
        assert_eq!(
            self.reset(i),
            reset_secs(unit, self.now),
            "not envoy's reset at {}: {}",
            self.now,
            self.text
        );
    }
}

async fn over_limit(store: Store) {
    let p = profile(store, &["config/basic_config.yaml"], &[]).await;
    // key2: 20/minute, no algorithm: envoy's fixed window.
    let r = check(&p, "test-domain", &[&[("key2", "a")]], 21).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.code(0), "OVER_LIMIT", "{}", r.text);
    assert_eq!(r.remaining(0), 0, "{}", r.text);
    r.assert_envoy_reset(0, Unit::Minute);
    // key2/value2: 30/minute; exactly at the limit is OK with nothing left.
    let r = check(&p, "test-domain", &[&[("key2", "value2")]], 30).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.code(0), "OK", "{}", r.text);
    assert_eq!(r.remaining(0), 0, "{}", r.text);
    r.assert_envoy_reset(0, Unit::Minute);
}

#[tokio::test]
async fn profile_over_limit_memory() {
    over_limit(Store::Memory).await;
}

#[tokio::test]
async fn profile_over_limit_redis() {
    over_limit(Store::Redis).await;
}

const KEY5: &[(&str, &str)] = &[("key5", "value5")];
const SUBKEY5: &[(&str, &str)] = &[("key5", "value5"), ("subkey5", "subvalue5")];

async fn denied_hits_counted(store: Store) {
    let p = profile(store, &["config/basic_config.yaml"], &[]).await;
    // key5/value5: 15/day; key5/value5/subkey5/subvalue5: 25/day.
    let r = check(&p, "test-domain", &[KEY5, SUBKEY5], 16).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!((r.code(0), r.remaining(0)), ("OVER_LIMIT", 0), "{}", r.text);
    assert_eq!((r.code(1), r.remaining(1)), ("OK", 9), "{}", r.text);
    r.assert_envoy_reset(0, Unit::Day);
    r.assert_envoy_reset(1, Unit::Day);
    // The 16 denied hits were counted on key5 (17 > 15) ...
    let r = check(&p, "test-domain", &[KEY5], 1).await;
    assert_eq!((r.code(0), r.remaining(0)), ("OVER_LIMIT", 0), "{}", r.text);
    // ... and on subkey5 (16 + 1 of 25).
    let r = check(&p, "test-domain", &[SUBKEY5], 1).await;
    assert_eq!((r.code(0), r.remaining(0)), ("OK", 8), "{}", r.text);
    // The statistics count both descriptors of the denied request as envoy does: on key5
    // (0 -> 16 of 15, near threshold 12) 1 hit over and 3 near, none within; on subkey5 the
    // 16 hits within. Then key5's single hit is over, subkey5's within.
    assert_eq!(p.stats("test-domain.key5_value5"), [17, 2, 3, 0, 0, 0]);
    assert_eq!(
        p.stats("test-domain.key5_value5.subkey5_subvalue5"),
        [17, 0, 0, 17, 0, 0]
    );
}

#[tokio::test]
async fn profile_denied_hits_counted_memory() {
    denied_hits_counted(Store::Memory).await;
}

#[tokio::test]
async fn profile_denied_hits_counted_redis() {
    denied_hits_counted(Store::Redis).await;
}

async fn stop_increment(store: Store) {
    let p = profile(
        store,
        &["config/basic_config.yaml"],
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    )
    .await;
    // key5: 15/day, key5+subkey5: 25/day. 10 hits each: both within their limits.
    let r = check(&p, "test-domain", &[KEY5, SUBKEY5], 10).await;
    assert_eq!((r.code(0), r.remaining(0)), ("OK", 5), "{}", r.text);
    assert_eq!((r.code(1), r.remaining(1)), ("OK", 15), "{}", r.text);
    // 10 more: key5 goes over (20 > 15). envoyproxy/ratelimit's getHitsAddend with the setting:
    // when some key would go over, only the keys going over are incremented.
    let r = check(&p, "test-domain", &[KEY5, SUBKEY5], 10).await;
    assert_eq!((r.code(0), r.remaining(0)), ("OVER_LIMIT", 0), "{}", r.text);
    // Queries (0 hits): subkey5 kept its 10, key5 counted the denied 10.
    let r = check(&p, "test-domain", &[SUBKEY5], 0).await;
    assert_eq!((r.code(0), r.remaining(0)), ("OK", 15), "{}", r.text);
    let r = check(&p, "test-domain", &[KEY5], 0).await;
    assert_eq!((r.code(0), r.remaining(0)), ("OVER_LIMIT", 0), "{}", r.text);
    r.assert_envoy_reset(0, Unit::Day);
}

#[tokio::test]
async fn profile_stop_increment_memory() {
    stop_increment(Store::Memory).await;
}

#[tokio::test]
async fn profile_stop_increment_redis() {
    stop_increment(Store::Redis).await;
}

async fn shadow_mode(store: Store) {
    let p = profile(store, &["config/shadowmode_config.yaml"], &[]).await;
    // key2: 20/minute in shadow mode.
    let r = check(&p, "test-domain", &[&[("key2", "a")]], 21).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((r.code(0), r.remaining(0)), ("OK", 0), "{}", r.text);
    drop(p);
    let p = profile(
        store,
        &["config/basic_config.yaml"],
        &[("SHADOW_MODE", "true")],
    )
    .await;
    // key3: 1/hour, two hits: over, but answered OK under the global shadow mode.
    let r = check(&p, "test-domain", &[&[("key3", "a")]], 2).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["overall_code"], "OK", "{}", r.text);
    assert_eq!(r.remaining(0), 0, "{}", r.text);
    // An allowed answer tells no one to wait.
    assert!(
        r.body["statuses"][0]["retry_after_ms"].is_null(),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn profile_shadow_mode_memory() {
    shadow_mode(Store::Memory).await;
}

#[tokio::test]
async fn profile_shadow_mode_redis() {
    shadow_mode(Store::Redis).await;
}

async fn empty_descriptor(store: Store) {
    let p = profile(store, &["config/basic_config.yaml"], &[]).await;
    let r = check(&p, "test-domain", &[&[]], 1).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.code(0), "OK", "{}", r.text);
    assert!(
        r.body["statuses"][0]["current_limit"].is_null(),
        "{}",
        r.text
    );
    // key3: 1/hour; the empty descriptor beside it changes nothing.
    let r = check(&p, "test-domain", &[&[], &[("key3", "e")]], 2).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!((r.code(0), r.code(1)), ("OK", "OVER_LIMIT"), "{}", r.text);
}

#[tokio::test]
async fn profile_empty_descriptor_memory() {
    empty_descriptor(Store::Memory).await;
}

#[tokio::test]
async fn profile_empty_descriptor_redis() {
    empty_descriptor(Store::Redis).await;
}

async fn unlimited(store: Store) {
    let p = profile(store, &["config/basic_config.yaml"], &[]).await;
    for entries in [&[("key6", "a")][..], &[("key2", "value3")][..]] {
        for _ in 0..3 {
            let r = check(&p, "test-domain", &[entries], 1_000_000).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            assert_eq!(r.code(0), "OK", "{}", r.text);
        }
    }
}

#[tokio::test]
async fn profile_unlimited_memory() {
    unlimited(Store::Memory).await;
}

#[tokio::test]
async fn profile_unlimited_redis() {
    unlimited(Store::Redis).await;
}

async fn replaces(store: Store) {
    let p = profile(store, &["readme/example7.yaml"], &[]).await;
    let d1: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let d2: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    // specific_limit (5/second) is replaced by the 10/second limit: 6 hits pass.
    let r = check(&p, "example7", &[d1, d2], 6).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["overall_code"], "OK", "{}", r.text);
    // 11 hits exceed the replacing limit whichever second this lands in (fresh or 6 + 11).
    let r = check(&p, "example7", &[d1, d2], 11).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.body["overall_code"], "OVER_LIMIT", "{}", r.text);
    assert_eq!((r.code(1), r.remaining(1)), ("OVER_LIMIT", 0), "{}", r.text);
}

#[tokio::test]
async fn profile_replaces_memory() {
    replaces(Store::Memory).await;
}

#[tokio::test]
async fn profile_replaces_redis() {
    replaces(Store::Redis).await;
}

// ---------------------------------------------------------------------------------------------
// Window boundaries, on the manual clock.

/// One 3-per-unit limit per unit, named after it, no `algorithm`: envoy's fixed window.
fn unit_rules() -> Vec<(String, String)> {
    let mut yaml = String::from("domain: windows\ndescriptors:\n");
    for unit in Unit::ALL {
        yaml.push_str(&format!(
            "  - key: unit\n    value: {unit}\n    rate_limit: {{unit: {unit}, requests_per_unit: 3}}\n"
        ));
    }
    vec![("windows.yaml".to_owned(), yaml)]
}

/// envoy's window length of `unit` in seconds (its `UnitToDivider`), written out.
fn divider(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        Unit::Week => 7 * 86_400,
        Unit::Month => 30 * 86_400,
        Unit::Year => 365 * 86_400,
    }
}

async fn window_boundaries(store: Store) {
    let p = profile_of(store, &unit_rules(), &[]).await;
    let unit_entry = |unit: Unit| vec![("unit", unit.to_string())];
    let hit = |unit: Unit, hits: u64| {
        let entries = unit_entry(unit);
        let p = &p;
        async move {
            let e: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (*k, v.as_str())).collect();
            check(p, "windows", &[&e], hits).await
        }
    };
    let t0 = T0 / SECOND;
    // At T0 (2026-01-01T00:00:00.25Z), one hit each; `duration_until_reset` is the end of
    // envoy's epoch-aligned window in whole seconds: a minute, hour and day start at midnight;
    // the week (7 days from Thursday 1970-01-01) starts today, a Thursday; the "month" (30 days)
    // started on 2025-12-08 and ends on 2026-01-07, the "year" (365 days) started on 2025-12-18
    // and ends on 2026-12-18. Calendar periods would end on Monday 2026-01-05, 2026-02-01 and
    // 2027-01-01.
    for (unit, reset) in [
        (Unit::Second, 1),
        (Unit::Minute, 60),
        (Unit::Hour, 3_600),
        (Unit::Day, 86_400),
        (Unit::Week, 604_800),
        (Unit::Month, 518_400),
        (Unit::Year, 30_326_400),
    ] {
        let r = hit(unit, 1).await;
        assert_eq!((r.code(0), r.remaining(0)), ("OK", 2), "{unit}: {}", r.text);
        assert_eq!(r.reset(0), reset, "{unit}: {}", r.text);
        r.assert_envoy_reset(0, unit);
    }
    // In the window's last second, 2 more hits exhaust each limit and a third is denied; at
    // the boundary the window is fresh: all 3 hits pass (a sliding window would still deny).
    // By window end: second, minute, hour, day, month (Jan 7), week (Jan 8), year (Dec 18).
    let mut units = Unit::ALL.to_vec();
    units.sort_by_key(|&u| t0 - t0 % divider(u) + divider(u));
    for unit in units {
        let end = t0 - t0 % divider(unit) + divider(unit);
        p.at((end - 1) * SECOND + 900_000);
        let r = hit(unit, 2).await;
        assert_eq!((r.code(0), r.remaining(0)), ("OK", 0), "{unit}: {}", r.text);
        assert_eq!(r.reset(0), 1, "{unit}: {}", r.text);
        let r = hit(unit, 1).await;
        assert_eq!(
            r.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{unit}: {}",
            r.text
        );
        assert_eq!((r.code(0), r.remaining(0)), ("OVER_LIMIT", 0), "{unit}");
        assert_eq!(r.reset(0), 1, "{unit}: {}", r.text);
        p.at(end * SECOND);
        let r = hit(unit, 3).await;
        assert_eq!(r.status, StatusCode::OK, "{unit}: {}", r.text);
        assert_eq!((r.code(0), r.remaining(0)), ("OK", 0), "{unit}: {}", r.text);
        assert_eq!(r.reset(0), divider(unit), "{unit}: {}", r.text);
    }
    // The ends are envoy's dates, not calendar ones.
    let end = |unit: Unit| t0 - t0 % divider(unit) + divider(unit);
    assert_eq!(end(Unit::Week), t0 + 7 * 86_400, "Thursday 2026-01-08");
    assert_eq!(end(Unit::Month), t0 + 6 * 86_400, "2026-01-07");
    assert_eq!(end(Unit::Year), t0 + 351 * 86_400, "2026-12-18");
}

#[tokio::test]
async fn profile_window_boundaries_memory() {
    window_boundaries(Store::Memory).await;
}

#[tokio::test]
async fn profile_window_boundaries_redis() {
    window_boundaries(Store::Redis).await;
}

/// A MINUTE/HOUR/DAY limit's `duration_until_reset` at 13:37:42.7 is envoy's whole-second
/// `divider - now % divider` (18 s, 1338 s, 37338 s: rounded up from the exact time left).
async fn resets_mid_window(store: Store) {
    let p = profile_of(store, &unit_rules(), &[]).await;
    p.at(T0 - 250_000 + (13 * 3_600 + 37 * 60 + 42) * SECOND + 700_000);
    for (unit, reset) in [(Unit::Minute, 18), (Unit::Hour, 1_338), (Unit::Day, 37_338)] {
        let v = unit.to_string();
        let r = check(&p, "windows", &[&[("unit", v.as_str())]], 1).await;
        assert_eq!(r.reset(0), reset, "{unit}: {}", r.text);
        r.assert_envoy_reset(0, unit);
    }
}

#[tokio::test]
async fn profile_resets_mid_window_memory() {
    resets_mid_window(Store::Memory).await;
}

#[tokio::test]
async fn profile_resets_mid_window_redis() {
    resets_mid_window(Store::Redis).await;
}

// ---------------------------------------------------------------------------------------------
// Statistics, as envoyproxy/ratelimit's base limiter counts them.

const STATS_RULES: &str = "domain: stats
descriptors:
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: shadow4
    value: value4
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key6
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: key7
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key8
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key9
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key10
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: stop5
    value: value5
    rate_limit: {unit: hour, requests_per_unit: 14}
  - key: shadow8
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 20}
";

/// One step of envoy's tests: the counter is brought to `before` by a priming request, then a
/// request of `hits` is checked; its code and the increase of the stats of `key` (total_hits,
/// over_limit, near_limit, within_limit, shadow_mode, over_limit_with_local_cache) are envoy's.
async fn step(p: &Profile, key: &str, value: &str, prime: u64, hits: u64) -> (String, [u64; 6]) {
    let (codes, deltas) = step_all(p, &[(key, value)], prime, hits).await;
    (codes[0].clone(), deltas[0])
}

/// [`step`] with one descriptor per `(key, value)` in each request.
async fn step_all(
    p: &Profile,
    descriptors: &[(&str, &str)],
    prime: u64,
    hits: u64,
) -> (Vec<String>, Vec<[u64; 6]>) {
    let entries: Vec<[(&str, &str); 1]> = descriptors.iter().map(|d| [*d]).collect();
    let request: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
    if prime > 0 {
        check(p, "stats", &request, prime).await;
    }
    let keys: Vec<String> = descriptors
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                format!("stats.{k}")
            } else {
                format!("stats.{k}_{v}")
            }
        })
        .collect();
    let before: Vec<[u64; 6]> = keys.iter().map(|k| p.stats(k)).collect();
    let r = check(p, "stats", &request, hits).await;
    let deltas = keys
        .iter()
        .zip(before)
        .map(|(k, b)| {
            let a = p.stats(k);
            std::array::from_fn(|i| a[i] - b[i])
        })
        .collect();
    let codes = (0..descriptors.len())
        .map(|i| r.code(i).to_owned())
        .collect();
    (codes, deltas)
}

async fn stats_as_envoy(store: Store) {
    let p = profile_of(
        store,
        &[("stats.yaml".to_owned(), STATS_RULES.to_owned())],
        &[],
    )
    .await;
    // envoyproxy/ratelimit's TestNearLimit, 15/hour (near threshold floor(15 * 0.8) = 12):
    // 10 -> 11 within; 12 -> 13 within and near; 15 -> 16 one hit over, nothing near.
    let ok = "OK".to_owned();
    let over = "OVER_LIMIT".to_owned();
    assert_eq!(
        step(&p, "key4", "value4", 10, 1).await,
        (ok.clone(), [1, 0, 0, 1, 0, 0])
    );
    assert_eq!(
        step(&p, "key4", "value4", 1, 1).await,
        (ok.clone(), [1, 0, 1, 1, 0, 0])
    );
    assert_eq!(
        step(&p, "key4", "value4", 2, 1).await,
        (over.clone(), [1, 1, 0, 0, 0, 0])
    );
    // Its key5..key10, hitsAddend > 1 on per-second limits (all at T0's second).
    // key5 20/s, 2 -> 5: within.
    assert_eq!(
        step(&p, "key5", "", 2, 3).await,
        (ok.clone(), [3, 0, 0, 3, 0, 0])
    );
    // key6 8/s (threshold 6), 5 -> 7: 1 of the 2 hits near.
    assert_eq!(
        step(&p, "key6", "", 5, 2).await,
        (ok.clone(), [2, 0, 1, 2, 0, 0])
    );
    // key7 20/s (threshold 16), 16 -> 19: all 3 near.
    assert_eq!(
        step(&p, "key7", "", 16, 3).await,
        (ok.clone(), [3, 0, 3, 3, 0, 0])
    );
    // key8, 19 -> 22: crossing the limit, 2 hits over, 1 near, none within.
    assert_eq!(
        step(&p, "key8", "", 19, 3).await,
        (over.clone(), [3, 2, 1, 0, 0, 0])
    );
    // key9, 15 -> 22 (7 hits): 2 over, 4 near (16..20).
    assert_eq!(
        step(&p, "key9", "", 15, 7).await,
        (over.clone(), [7, 2, 4, 0, 0, 0])
    );
    // key10 10/s, 27 -> 30: already over, all 3 over.
    assert_eq!(
        step(&p, "key10", "", 27, 3).await,
        (over.clone(), [3, 3, 0, 0, 0, 0])
    );
    // A shadow-mode rule (TestOverLimitWithLocalCacheShadowRule's sequence, and crossing with
    // hitsAddend 3): answered OK, the hits past the limit counted in over_limit and shadow_mode.
    assert_eq!(
        step(&p, "shadow4", "value4", 10, 1).await,
        (ok.clone(), [1, 0, 0, 1, 0, 0])
    );
    assert_eq!(
        step(&p, "shadow4", "value4", 1, 1).await,
        (ok.clone(), [1, 0, 1, 1, 0, 0])
    );
    assert_eq!(
        step(&p, "shadow4", "value4", 2, 1).await,
        (ok.clone(), [1, 1, 0, 0, 1, 0])
    );
    assert_eq!(
        step(&p, "shadow8", "", 19, 3).await,
        (ok.clone(), [3, 2, 1, 0, 2, 0])
    );
}

#[tokio::test]
async fn profile_stats_as_envoy_memory() {
    stats_as_envoy(Store::Memory).await;
}

#[tokio::test]
async fn profile_stats_as_envoy_redis() {
    stats_as_envoy(Store::Redis).await;
}

/// envoy's TestOverLimitWithLocalCache: once a key is over, the local cache
/// (`LOCAL_CACHE_SIZE_IN_BYTES`, tollgate's deny cache) answers the next hit without Redis; it
/// counts in over_limit and over_limit_with_local_cache.
#[tokio::test]
async fn profile_stats_over_limit_with_local_cache_redis() {
    let p = profile_of(
        Store::Redis,
        &[("stats.yaml".to_owned(), STATS_RULES.to_owned())],
        &[("LOCAL_CACHE_SIZE_IN_BYTES", "1000000")],
    )
    .await;
    let over = "OVER_LIMIT".to_owned();
    assert_eq!(step(&p, "key4", "value4", 15, 1).await.0, over);
    assert_eq!(
        step(&p, "key4", "value4", 0, 1).await,
        (over, [1, 1, 0, 0, 0, 1])
    );
}

/// envoy's TestOverLimitWithStopCacheKeyIncrement: 15/hour and 14/hour limits in one request,
/// both at 10. With the setting, when a key would go over only the keys going over are
/// incremented; a key left alone still counts the request's hits within its limit (envoy's
/// unincremented `INCRBY 0`).
async fn stats_stop_increment(store: Store) {
    let p = profile_of(
        store,
        &[("stats.yaml".to_owned(), STATS_RULES.to_owned())],
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    )
    .await;
    let both = [("key4", "value4"), ("stop5", "value5")];
    let ok = "OK".to_owned();
    let over = "OVER_LIMIT".to_owned();
    // 10 -> 11 on both: within.
    let (codes, d) = step_all(&p, &both, 10, 1).await;
    assert_eq!(codes, [ok.clone(), ok.clone()]);
    assert_eq!(d, [[1, 0, 0, 1, 0, 0], [1, 0, 0, 1, 0, 0]]);
    // 11 -> 13: key4 (threshold 12) 1 near, stop5 (threshold 11) 2 near.
    let (codes, d) = step_all(&p, &both, 0, 2).await;
    assert_eq!(codes, [ok.clone(), ok.clone()]);
    assert_eq!(d, [[2, 0, 1, 2, 0, 0], [2, 0, 2, 2, 0, 0]]);
    // 13 + 2: stop5 goes over (15 > 14) and alone is incremented: 1 over, 1 near; key4 stays
    // at 13 (OK, 2 left) and counts 2 within, 1 of them near (envoy's 11 -> 13).
    let (codes, d) = step_all(&p, &both, 0, 2).await;
    assert_eq!(codes, [ok.clone(), over]);
    assert_eq!(d, [[2, 0, 1, 2, 0, 0], [2, 1, 1, 0, 0, 0]]);
}

#[tokio::test]
async fn profile_stats_stop_increment_memory() {
    stats_stop_increment(Store::Memory).await;
}

#[tokio::test]
async fn profile_stats_stop_increment_redis() {
    stats_stop_increment(Store::Redis).await;
}

// ---------------------------------------------------------------------------------------------
// Differences that remain under the profile (docs/migrating-from-envoy-ratelimit.md).

fn translated(vars: &[(&str, &str)]) -> tollgate_server::envoy::profile::Translation {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    translate(&vars, ServeConfig::default()).expect("translate")
}

#[test]
fn differences_store_settings() {
    // No REDIS_* variable: the memory store, not envoy's nutcracker socket.
    assert_eq!(translated(&[]).config.store.url, "memory");
    // REDIS_TIMEOUT unset: tollgate's 50 ms, not envoy's 10 s.
    let t = translated(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", tollgate_testsupport::shared_addr()),
    ]);
    assert_eq!(t.config.store.timeout, Duration::from_millis(50));
    assert_eq!(t.config.store.key_layout, tollgate_redis::KeyLayout::Envoy);
    // A Redis Cluster keeps tollgate's key layout (not shared with envoy's pods), said once.
    let t = translated(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_URL", "127.0.0.1:7000,127.0.0.1:7001"),
        ("CACHE_KEY_PREFIX", "rl:"),
    ]);
    assert!(
        t.config.store.url.contains("+cluster"),
        "{}",
        t.config.store.url
    );
    assert_eq!(
        t.config.store.key_layout,
        tollgate_redis::KeyLayout::Tollgate
    );
    assert!(
        t.warnings.iter().any(|w| w.starts_with("CACHE_KEY_PREFIX")),
        "{:?}",
        t.warnings
    );
}

#[tokio::test]
async fn differences_stats_not_produced() {
    let p = profile(
        Store::Memory,
        &["config/basic_config.yaml"],
        &[("SHADOW_MODE", "true")],
    )
    .await;
    // An unknown domain and a request answered OK by the global shadow mode: envoy would count
    // `domain_not_found` and `global_shadow_mode`; tollgate has no such envoy-named stat.
    check(&p, "no-such-domain", &[&[("key", "v")]], 1).await;
    let r = check(&p, "test-domain", &[&[("key3", "a")]], 2).await;
    assert_eq!(r.body["overall_code"], "OK", "{}", r.text);
    let names: Vec<String> = envoy_counters(p.state.metrics())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for absent in [
        "domain_not_found",
        "global_shadow_mode",
        "service_error",
        "response_time",
    ] {
        assert!(
            !names.iter().any(|n| n.contains(absent)),
            "{absent}: {names:?}"
        );
    }
    // EXTRA_TAGS go on statsd names only; the Prometheus page has the mapping's labels.
    let page = tollgate_server::envoy::stats::render_prometheus(p.state.metrics());
    assert!(
        page.contains(
            "ratelimit_service_rate_limit_over_limit{domain=\"test-domain\",key1=\"key3\"} 1\n"
        ),
        "{page}"
    );
}

#[tokio::test]
async fn differences_extra_tags_not_on_prometheus() {
    let t = translated(&[
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("EXTRA_TAGS", "az:eu"),
    ]);
    // Prometheus on, and nothing carries the tags to it (statsd would append `.__az=eu`).
    assert!(t.envoy.stats.prometheus.is_some());
    assert!(t.envoy.stats.statsd.is_none());
    let p = profile(
        Store::Memory,
        &["config/basic_config.yaml"],
        &[("EXTRA_TAGS", "az:eu")],
    )
    .await;
    check(&p, "test-domain", &[&[("key3", "a")]], 1).await;
    let page = tollgate_server::envoy::stats::render_prometheus(p.state.metrics());
    assert!(
        page.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"test-domain\",key1=\"key3\"} 1\n"
        ),
        "{page}"
    );
    assert!(!page.contains("az"), "{page}");
}
