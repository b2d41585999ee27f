//! Redis Sentinel: a master, its replica and two sentinels on free loopback ports. The store
//! finds the master through `redis+sentinel://`, keeps counting on it, and after
//! `SENTINEL FAILOVER` finds the promoted replica and counts there (the counter kept by
//! replication, the script loaded again on the new master).

use std::time::{Duration, Instant};
use tollgate_core::{CheckItem, Quota, Unit};
use tollgate_redis::keys::counter_keys;
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_testsupport::{runtime, unique_prefix, SentinelGroup};

#[test]
fn the_store_follows_the_master_through_a_failover() {
    let group = SentinelGroup::start();
    let rt = runtime();
    let prefix = unique_prefix("sentinel");
    let opts = RedisOptions {
        prefix: prefix.clone(),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    let store = rt
        .block_on(RedisStore::connect(&group.url(), opts))
        .expect("master found through the sentinels");
    assert!(!store.is_cluster());
    assert!(
        store.url().starts_with("redis+sentinel://"),
        "{}",
        store.url()
    );

    let quota = Quota::new(1000, Unit::Hour);
    let item = CheckItem::hit("r", "d|user=ann", &quota);
    let (key, _) = counter_keys(&prefix, item.key, &quota);
    for n in 1..=3u64 {
        let d = rt.block_on(store.check(None, &[item])).unwrap();
        assert_eq!(d[0].remaining, 1000 - n);
    }
    let old = group.master_port();
    assert!(group.server(old).cli(&["EXISTS", &key]).contains('1'));

    let new = group.failover();
    assert_ne!(old, new);
    // The first calls after the failover may fail (the old master refuses writes or the
    // connection drops) and make the store ask the sentinels again; then it counts on the
    // new master, from what replication carried over.
    let deadline = Instant::now() + Duration::from_secs(60);
    let remaining = loop {
        match rt.block_on(store.check(None, &[item])) {
            Ok(d) if group.server(new).cli(&["EXISTS", &key]).contains('1') => {
                break d[0].remaining
            }
            r => {
                assert!(
                    Instant::now() < deadline,
                    "store never reached the new master: {r:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(
        remaining <= 1000 - 4,
        "the count before the failover was kept: {remaining}"
    );
    let before: u64 = 1000 - remaining;
    let d = rt.block_on(store.check(None, &[item])).unwrap();
    assert_eq!(
        d[0].remaining,
        1000 - before - 1,
        "counted on the new master"
    );
    assert!(group.server(new).cli(&["ROLE"]).starts_with("master"));
    assert!(store.is_healthy());
}

#[test]
fn bad_sentinel_urls_are_clear_errors() {
    let rt = runtime();
    for (url, want) in [
        ("redis+sentinel://127.0.0.1:1", "no master name"),
        ("redis+sentinel://nohostport/m", "not host:port"),
        (
            "redis+sentinel://127.0.0.1:1/m?db=2",
            "unknown query parameter 'db'",
        ),
    ] {
        let e = rt
            .block_on(RedisStore::connect_lazy(url, RedisOptions::default()))
            .unwrap_err();
        assert!(e.to_string().contains(want), "{url}: {e}");
    }
    // No sentinel answers: a lazy store starts (degraded); an eager one fails, naming them.
    let url = "redis+sentinel://:pw@127.0.0.1:1/mymaster?sentinel_pass=s3cret";
    let store = rt
        .block_on(RedisStore::connect_lazy(url, RedisOptions::default()))
        .expect("lazy start while the sentinels are down");
    assert!(
        !store.url().contains("s3cret") && !store.url().contains(":pw@"),
        "{}",
        store.url()
    );
    let e = rt.block_on(store.ping()).unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let e = rt
        .block_on(RedisStore::connect(url, RedisOptions::default()))
        .unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
}
