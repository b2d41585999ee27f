//! Shared counters with envoyproxy/ratelimit on one Redis: with the envoy key layout, counters
//! written the way envoy writes them (its cache key, `INCRBY` then `EXPIRE`, here by hand) are
//! the ones tollgate counts in, and what tollgate writes is what an envoy-style `INCRBY` reads,
//! so the two enforce one limit.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::{envoy_incr, runtime, shared_url};
use tollgate_core::rules::counter_key;
use tollgate_core::{Algorithm, CheckItem, Micros, Quota, Unit};
use tollgate_redis::{KeyLayout, RedisOptions, RedisStore};

const SECOND: Micros = 1_000_000;

fn con() -> redis::Connection {
    redis::Client::open(shared_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[test]
fn envoy_and_tollgate_share_one_counter() {
    let rt = runtime();
    let prefix = format!("{}:", support::unique_prefix("envoykeys"));
    let opts = RedisOptions {
        prefix: prefix.clone(),
        key_layout: KeyLayout::Envoy,
        expiration_jitter: Duration::from_secs(5),
        timeout: Duration::from_secs(3),
        ..RedisOptions::default()
    };
    let store = rt
        .block_on(RedisStore::connect(shared_url(), opts))
        .unwrap();
    let quota = Quota::new(5, Unit::Minute).with_algorithm(Algorithm::EnvoyFixedWindow);
    let key = counter_key("users", &[("user", "alice"), ("path", "/a_b")]);
    // Early in a real minute, so the key's window is the one envoy would use now.
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let start_s = real / 60 * 60;
    let now = (start_s + 1) * SECOND;
    let envoy_key = format!("{prefix}users_user_alice_path_/a_b_{start_s}");
    let check = |cost: u64| {
        let item = CheckItem {
            cost,
            ..CheckItem::hit("users|user|path", &key, &quota)
        };
        rt.block_on(store.check(Some(now), &[item])).unwrap()[0]
    };
    let mut c = con();

    // envoy counted 3: tollgate sees them.
    assert_eq!(envoy_incr(&mut c, &envoy_key, 3, 60), 3);
    let d = check(1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1, "3 from envoy + 1 from tollgate of 5");
    assert_eq!(d.reset_after, 59 * SECOND);
    // tollgate's hit is in envoy's key, with envoy's expiry (window + jitter below 5 s).
    let ttl: i64 = redis::cmd("TTL").arg(&envoy_key).query(&mut c).unwrap();
    assert!((55..=65).contains(&ttl), "ttl {ttl}");
    assert_eq!(
        envoy_incr(&mut c, &envoy_key, 1, 60),
        5,
        "envoy reads 4, adds 1"
    );
    // Over the limit together; tollgate counts its denied hit like envoy.
    let d = check(1);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(
        envoy_incr(&mut c, &envoy_key, 1, 60),
        7,
        "over for envoy too"
    );
    let raw: String = redis::cmd("GET").arg(&envoy_key).query(&mut c).unwrap();
    assert_eq!(raw, "7", "a plain integer, as envoy keeps it");
    // A pure query neither counts nor fails.
    assert!(!check(0).allowed);
    // The next window is another key: fresh for both.
    let next = format!("{prefix}users_user_alice_path_/a_b_{}", start_s + 60);
    let item = CheckItem::hit("users|user|path", &key, &quota);
    let d = rt
        .block_on(store.check(Some(now + 60 * SECOND), &[item]))
        .unwrap()[0];
    assert!(d.allowed && d.remaining == 4);
    assert_eq!(envoy_incr(&mut c, &next, 1, 60), 2);
    let _: () = redis::cmd("DEL")
        .arg(&envoy_key)
        .arg(&next)
        .query(&mut c)
        .unwrap();
}

#[test]
fn envoy_layout_is_refused_on_a_cluster_and_keeps_other_algorithms_in_tollgates_keys() {
    let rt = runtime();
    let opts = RedisOptions {
        key_layout: KeyLayout::Envoy,
        prefix: String::new(),
        ..RedisOptions::default()
    };
    let e = rt
        .block_on(RedisStore::connect_lazy(
            "redis+cluster://127.0.0.1:1",
            opts.clone(),
        ))
        .unwrap_err();
    assert!(e.to_string().contains("standalone"), "{e}");
    let q = Quota::new(5, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
    let keys = tollgate_redis::keys::counter_keys_in(KeyLayout::Envoy, "p", "d|k=v", &q);
    assert_eq!(keys.0, "p:{d|k=v}:fixed2:1m");
}
