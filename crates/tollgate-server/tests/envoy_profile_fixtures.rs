//! envoyproxy/ratelimit's rule files (the fixtures of `tollgate-core`, copied unchanged from
//! its repository) served under the envoy profile: the state is built exactly as `tollgate serve
//! --profile envoy` builds it (`profile::translate` of an envoy environment, then
//! `serve::build_state`), on the memory store and on the shared Redis (envoy's key layout under a
//! unique `CACHE_KEY_PREFIX`), and queried through `router(state)` with `oneshot`.
//!
//! `build_state` takes the wall clock, so every sequence that spans requests uses a DAY limit
//! (the only boundary, midnight UTC, is hours away from any CI run's few milliseconds) or
//! asserts something that holds on either side of a window boundary; `duration_until_reset` is
//! checked to be envoy's `divider - now % divider` for a `now` read around the request.
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

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use tollgate_core::quota::Unit;
use tollgate_server::profile::{reset_secs, translate};
use tollgate_server::router;
use tollgate_server::serve::{build_state, ServeConfig};
use tollgate_testsupport::{delete_prefix, unique_prefix, SHARED_URL};
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
    root: PathBuf,
    prefix: Option<String>,
}

impl Drop for Profile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
        if let Some(prefix) = &self.prefix {
            delete_prefix(SHARED_URL, prefix);
        }
    }
}

/// The fixtures copied into envoy's runtime layout (`RUNTIME_ROOT/config/`), the environment
/// translated and the state built by `build_state`.
async fn profile(store: Store, files: &[&str], extra: &[(&str, &str)]) -> Profile {
    let name = unique_prefix("envoy-profile");
    let root = std::env::temp_dir().join(&name);
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).expect("runtime dir");
    for f in files {
        let src = fixture(f);
        let file = Path::new(f).file_name().expect("file name");
        std::fs::copy(&src, dir.join(file)).expect("copy fixture");
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
            vars.insert("REDIS_URL".into(), "127.0.0.1:6379".into());
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
        Store::Memory => assert_eq!(t.config.store, "memory"),
        Store::Redis => assert!(t.config.store.starts_with("redis"), "{}", t.config.store),
    }
    let state = build_state(&t.config).await.expect("build_state");
    Profile {
        app: router(state),
        root,
        prefix,
    }
}

struct Resp {
    status: StatusCode,
    body: Value,
    text: String,
    /// Wall-clock seconds read just before and just after the request.
    before: u64,
    after: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
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
    let before = now_secs();
    let resp = p.app.clone().oneshot(req).await.expect("infallible");
    let after = now_secs();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Resp {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
        before,
        after,
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

    /// Status `i`'s `duration_until_reset` is envoy's, in whole seconds, for a `now` during
    /// the request.
    fn assert_envoy_reset(&self, i: usize, unit: Unit) {
        let ms = self.body["statuses"][i]["duration_until_reset_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no reset in {}", self.text));
        assert_eq!(ms % 1000, 0, "whole seconds: {}", self.text);
        let secs = ms / 1000;
        assert!(
            (self.before..=self.after).any(|t| reset_secs(unit, t) == secs),
            "reset {secs} s is not envoy's for now in {}..={}: {}",
            self.before,
            self.after,
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
}

#[tokio::test]
async fn profile_shadow_mode_memory() {
    shadow_mode(Store::Memory).await;
}

#[tokio::test]
async fn profile_shadow_mode_redis() {
    shadow_mode(Store::Redis).await;
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
