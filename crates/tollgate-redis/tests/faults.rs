//! Redis faults as the store reports them, on private `redis-server` processes: each failure is
//! a typed error with a message for humans (never a timeout for a refused connection), a
//! configuration the server rejects (wrong password, no such database) fails at start, a
//! failure of one key or of writes leaves the store healthy, and the probe is a write.

mod support;

use std::time::Duration;
use support::{signal, RedisServer};
use tollgate_core::{Algorithm, CheckItem, FaultKind, Quota, StoreError, Unit};
use tollgate_redis::keys::counter_keys;
use tollgate_redis::{RedisOptions, RedisStore};

fn options(what: &str) -> RedisOptions {
    RedisOptions {
        prefix: support::unique_prefix(what),
        timeout: Duration::from_secs(3),
        ..RedisOptions::default()
    }
}

fn kind(e: &StoreError) -> FaultKind {
    e.kind()
}

#[tokio::test]
async fn wrong_password_and_missing_db_fail_at_start_with_clear_errors() {
    let server = RedisServer::start(&["--requirepass", "s3cret-pw"]);
    let url = format!("redis://:wrong-pw@127.0.0.1:{}", server.port);
    let e = RedisStore::connect_lazy(&url, options("auth"))
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::AuthFailed, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("rejected the credentials"), "{msg}");
    assert!(!msg.contains("wrong-pw"), "the password leaked: {msg}");
    // No password at all where one is required: the same, clear error.
    let e = RedisStore::connect_lazy(&server.url(), options("noauth"))
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::AuthFailed, "{e}");

    let open = RedisServer::start(&[]);
    let e = RedisStore::connect_lazy(&format!("{}/99", open.url()), options("db"))
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::NoSuchDb, "{e}");
    assert!(e.to_string().contains("no database 99"), "{e}");
    // The same at a non-lazy connect.
    let e = RedisStore::connect(&format!("{}/99", open.url()), options("db"))
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::NoSuchDb, "{e}");
}

#[tokio::test]
async fn redis_down_at_start_is_refused_not_a_timeout() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("redis://127.0.0.1:{dead}");
    // Down is not a configuration error: a lazy store starts (and reports why it cannot work).
    let store = RedisStore::connect_lazy(&url, options("down"))
        .await
        .unwrap();
    assert!(!store.is_healthy());
    let q = Quota::new(10, Unit::Minute);
    let e = store
        .check(None, &[CheckItem::hit("r", "k", &q)])
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("connection refused"), "{e}");
    let last = store.last_error().unwrap();
    assert_eq!(last.kind, FaultKind::ConnectionRefused);
    assert!(!last.message.contains("timed out"), "{}", last.message);
}

#[tokio::test]
async fn wrongtype_is_a_fault_of_one_key_and_oom_of_writes() {
    let server = RedisServer::start(&[]);
    let opts = options("faults");
    let prefix = opts.prefix.clone();
    let store = RedisStore::connect(&server.url(), opts).await.unwrap();
    let q = Quota::new(10, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
    store
        .check(None, &[CheckItem::hit("r", "good", &q)])
        .await
        .unwrap();
    // Something else wrote a hash where a counter lives.
    let (main, _) = counter_keys(&prefix, "bad", &q);
    server.cli(&["DEL", &main]);
    server.cli(&["HSET", &main, "f", "v"]);
    let e = store
        .check(None, &[CheckItem::hit("r", "bad", &q)])
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::WrongType, "{e}");
    assert!(!kind(&e).is_outage());
    assert!(store.is_healthy(), "one bad key is not an outage");
    assert!(store
        .check(None, &[CheckItem::hit("r", "good", &q)])
        .await
        .is_ok());
    assert_eq!(store.last_error().unwrap().kind, FaultKind::WrongType);

    // Out of memory with noeviction: PING answers, writes do not.
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let e = store
        .check(None, &[CheckItem::hit("r", "fresh", &q)])
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FaultKind::OutOfMemory, "{e}");
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert!(store.is_healthy(), "Redis answers: not an outage");
    store.ping().await.unwrap();
    let e = store.probe().await.unwrap_err();
    assert_eq!(kind(&e), FaultKind::OutOfMemory, "the probe writes: {e}");
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    store.probe().await.unwrap();
    let ttl: i64 = server
        .cli(&["PTTL", &format!("{prefix}:probe")])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0, "the probe key has a TTL: {ttl}");
}

/// Polls `cond` until it holds (generous deadline: an event, not a timing).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One-item checks wait for the call in flight and go together when it returns; a call that
/// does not come back soon (a Redis far away, or here one frozen) must not hold them for its
/// whole round trip: after a millisecond a waiting request opens the second call. Then, both
/// calls out, the next requests wait for either, and each gets its own answer when Redis wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_does_not_come_back_opens_the_second_one() {
    let server = RedisServer::start(&[]);
    let opts = RedisOptions {
        timeout: Duration::from_secs(30),
        ..options("second-slot")
    };
    let store = RedisStore::connect(&server.url(), opts).await.unwrap();
    let q = Quota::new(100, Unit::Hour).with_algorithm(Algorithm::SlidingWindowCounter);
    // The function loaded and the connection up before the freeze.
    store
        .check(None, &[CheckItem::hit("d", "warm", &q)])
        .await
        .unwrap();
    let base = store.coalescing();
    signal(server.pid(), "-STOP");
    let spawn = |key: &'static str| {
        let (store, q) = (store.clone(), q);
        tokio::spawn(async move { store.check(None, &[CheckItem::hit("d", key, &q)]).await })
    };
    let calls = || store.coalescing().calls - base.calls;
    // Nothing in flight: the first goes at once, alone.
    let a = spawn("a");
    until("the first call sent", || calls() == 1).await;
    // The second waits for it, then opens the second call (Redis is frozen: it never returns).
    let b = spawn("b");
    until("the second call sent while the first is out", || {
        calls() == 2
    })
    .await;
    // Both out: the next ones wait for either (or, if Redis is back first, go as usual).
    let (c, d) = (spawn("c"), spawn("d"));
    signal(server.pid(), "-CONT");
    for t in [a, b, c, d] {
        let got = t.await.unwrap().expect("decided once Redis is back");
        assert!(got[0].allowed && got[0].remaining < 100, "{got:?}");
    }
    let after = store.coalescing();
    assert_eq!(after.requests - base.requests, 4);
    assert!(after.calls - base.calls <= 4);
}
