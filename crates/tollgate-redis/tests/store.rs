//! Store-level behaviour on real Redis: concurrency (exact admission under 64 concurrent
//! callers, time from Redis; one-item checks coalesced into batches decide as one at a time), key layout (TTLs, injection), NOSCRIPT recovery, restarts,
//! timeouts, AUTH and redaction, unsupported algorithms.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{shared_url, RedisServer};
use tollgate_core::{Algorithm, CheckItem, Micros, Period, Quota, StoreError, Unit};
use tollgate_redis::keys::counter_keys;
use tollgate_redis::{RedisOptions, RedisStore};

fn options(what: &str) -> RedisOptions {
    RedisOptions {
        prefix: support::unique_prefix(what),
        timeout: Duration::from_secs(3),
        ..RedisOptions::default()
    }
}

fn item<'a>(key: &'a str, quota: &'a Quota, cost: u64) -> CheckItem<'a> {
    CheckItem {
        cost,
        ..CheckItem::hit("r", key, quota)
    }
}

/// A plain connection to the shared server, for reading and writing keys around the store.
fn shared_connection() -> redis::Connection {
    redis::Client::open(shared_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn redis_time(url: &str) -> Micros {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    s * 1_000_000 + us
}

/// Run `attempts` checks of `quota` on one key from `tasks` concurrent tasks; count admissions.
async fn hammer(store: &RedisStore, key: &str, quota: Quota, tasks: usize, attempts: u64) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (store, next, admitted, key) = (
            store.clone(),
            next.clone(),
            admitted.clone(),
            key.to_owned(),
        );
        handles.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < attempts {
                let d = store.check(None, &[item(&key, &quota, 1)]).await.unwrap();
                if d[0].allowed {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_admit_exactly_the_limit() {
    let store = RedisStore::connect(shared_url(), options("conc"))
        .await
        .unwrap();
    // Window algorithms need the run inside one minute: start early in a minute.
    let now = redis_time(shared_url());
    let into_minute = now % 60_000_000;
    if into_minute > 30_000_000 {
        tokio::time::sleep(Duration::from_micros(60_000_000 - into_minute + 50_000)).await;
    }
    let start = redis_time(shared_url());
    let per_minute = |alg| Quota::new(1000, Unit::Minute).with_algorithm(alg);
    let log = hammer(
        &store,
        "log",
        per_minute(Algorithm::SlidingWindowLog),
        64,
        5000,
    )
    .await;
    let fixed = hammer(
        &store,
        "fixed",
        per_minute(Algorithm::FixedWindow),
        64,
        5000,
    )
    .await;
    let counter = hammer(
        &store,
        "counter",
        per_minute(Algorithm::SlidingWindowCounter),
        64,
        5000,
    )
    .await;
    // The one-item checks of the counting algorithms went to Redis in batches.
    let c = store.coalescing();
    assert!(
        c.requests == 10_000 && c.calls < c.requests,
        "{} requests in {} calls",
        c.requests,
        c.calls
    );
    let gcra = hammer(&store, "gcra", per_minute(Algorithm::Gcra), 64, 5000).await;
    let bucket_q = per_minute(Algorithm::TokenBucket).with_burst(1000);
    let bucket = hammer(&store, "bucket", bucket_q, 64, 5000).await;
    let end = redis_time(shared_url());
    assert_eq!(start / 60_000_000, end / 60_000_000, "run crossed a minute");
    assert_eq!(log, 1000, "sliding log");
    assert_eq!(fixed, 1000, "fixed window");
    assert!(
        (1..=1000).contains(&counter),
        "sliding counter admitted {counter}"
    );
    // Buckets refill one every 60 ms while the run lasts: at least the burst, never more than
    // the burst plus what the elapsed time refilled.
    let refill = (end - start) / 60_000 + 1;
    for (name, n) in [("gcra", gcra), ("token bucket", bucket)] {
        assert!(
            (1000..=1000 + refill).contains(&n),
            "{name} admitted {n}, refill bound {refill}"
        );
    }
    // With a refill slower than the run (1000/day: one every 86.4 s), exactly the burst.
    let per_day = |alg| Quota::new(1000, Unit::Day).with_algorithm(alg);
    assert_eq!(
        hammer(&store, "gcra-d", per_day(Algorithm::Gcra), 64, 5000).await,
        1000
    );
    let bq = per_day(Algorithm::TokenBucket).with_burst(1000);
    assert_eq!(hammer(&store, "bucket-d", bq, 64, 5000).await, 1000);
    let lq = per_day(Algorithm::LeakyBucket);
    assert_eq!(hammer(&store, "leaky-d", lq, 64, 5000).await, 1000);

    support::assert_every_key_has_a_ttl(shared_url(), &store.options().prefix);
    support::delete_prefix(shared_url(), &store.options().prefix);
}

#[tokio::test]
async fn every_key_has_a_ttl_and_full_counters_are_deleted() {
    let store = RedisStore::connect(shared_url(), options("ttl"))
        .await
        .unwrap();
    let algs = support::conformance::ALGORITHMS;
    let quotas: Vec<Quota> = algs
        .iter()
        .map(|&a| Quota::new(5, Unit::Hour).with_algorithm(a))
        .collect();
    for q in &quotas {
        for (key, cost) in [("a", 1), ("a", 2), ("b", 5), ("b", 1), ("c", 0)] {
            store.check(None, &[item(key, q, cost)]).await.unwrap();
        }
    }
    // a and b hold usage (the log has two keys each); c was only queried: nothing stored.
    let n = support::assert_every_key_has_a_ttl(shared_url(), &store.options().prefix);
    assert_eq!(n, 2 * (algs.len() + 1));

    // A counter that is back to full is deleted.
    // 1 per second: one request leaves 1 s of backlog (wide enough that a loaded machine does
    // not see it expire before PTTL is read).
    let short = Quota::new(1, Unit::Second).with_algorithm(Algorithm::Gcra);
    store.check(None, &[item("z", &short, 1)]).await.unwrap();
    let (zkey, _) = counter_keys(&store.options().prefix, "z", &short);
    let mut con = shared_connection();
    let ttl: i64 = redis::cmd("PTTL").arg(&zkey).query(&mut con).unwrap();
    assert!((1..=1000).contains(&ttl), "1 s of backlog: PTTL {ttl}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let exists: i64 = redis::cmd("EXISTS").arg(&zkey).query(&mut con).unwrap();
    assert_eq!(exists, 0);
    support::delete_prefix(shared_url(), &store.options().prefix);
}

#[tokio::test]
async fn hostile_counter_keys_stay_distinct_and_independent() {
    let store = RedisStore::connect(shared_url(), options("inj"))
        .await
        .unwrap();
    let prefix = store.options().prefix.clone();
    let long = "x".repeat(10 * 1024);
    let long2 = format!("{}y", "x".repeat(10 * 1024 - 1));
    let long_hashed_text = tollgate_redis::keys::escape(&"q".repeat(300));
    let values: Vec<String> = [
        "",
        "%",
        "%25",
        ":",
        "%3A",
        "a:b",
        "a%3Ab",
        "{",
        "}",
        "{x}",
        "%7Bx%7D",
        "}{",
        "a|b",
        "a\\|b",
        "a=b",
        "a\\=b",
        "a;b",
        "a\nb",
        "a%0Ab",
        "\n",
        "\r\n",
        " ",
        "%20",
        "é",
        "%C3%A9",
        "api|user=alice",
        "api|user=alice}:fixed:1m",
        "api|user=alice%7D%3Afixed%3A1m",
        "tollgate:{api}:fixed:1m",
        "\\",
        "%5C",
        "%%",
        "q",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([long.clone(), long2, long_hashed_text, "q".repeat(300)])
    .collect();
    let q = Quota::new(1, Unit::Hour).with_algorithm(Algorithm::FixedWindow);
    // Distinct Redis keys, each a single well-formed hash tag.
    let mut names: Vec<String> = values
        .iter()
        .map(|v| counter_keys(&prefix, v, &q).0)
        .collect();
    for n in &names {
        assert_eq!(n.matches('{').count(), 1, "{n}");
        assert_eq!(n.matches('}').count(), 1, "{n}");
        assert!(n.len() < 200 + prefix.len() + 20, "{} bytes", n.len());
        assert!(!n.contains('\n'));
    }
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        values.len(),
        "two counter keys share a Redis key"
    );

    // Independent counters: each admits its one request, then denies.
    for v in &values {
        let d = store.check(None, &[item(v, &q, 1)]).await.unwrap();
        assert!(d[0].allowed, "{v:?} was already consumed by another key");
    }
    for v in &values {
        let d = store.check(None, &[item(v, &q, 1)]).await.unwrap();
        assert!(!d[0].allowed, "{v:?}");
    }
    let n = support::assert_every_key_has_a_ttl(shared_url(), &prefix);
    assert_eq!(n, values.len());
    support::delete_prefix(shared_url(), &prefix);
}

#[tokio::test]
async fn function_flush_and_script_flush_are_transparent() {
    let server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url(), options("noscript"))
        .await
        .unwrap();
    let name = store.function_name().to_owned();
    let loaded = || server.cli(&["FUNCTION", "LIST", "LIBRARYNAME", &name]);
    assert!(
        !loaded().contains(&name),
        "nothing loaded before the first call"
    );
    let q = Quota::new(4, Unit::Minute).with_algorithm(Algorithm::SlidingWindowLog);
    let d = store.check(None, &[item("k", &q, 1)]).await.unwrap();
    assert_eq!(d[0].remaining, 3);
    assert!(
        loaded().contains(&name),
        "the first call loads the function"
    );
    assert!(server.cli(&["FUNCTION", "FLUSH"]).contains("OK"));
    let d = store.check(None, &[item("k", &q, 1)]).await.unwrap();
    assert_eq!(d[0].remaining, 2);
    assert!(
        loaded().contains(&name),
        "a call after FUNCTION FLUSH loads it again"
    );
    assert!(store.uses_function());

    // A user the ACL does not let call functions: the store runs the same code by EVALSHA.
    let set = server.cli(&[
        "ACL",
        "SETUSER",
        "scripts",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-fcall",
        "-function",
    ]);
    assert!(set.contains("OK"), "{set}");
    let url = format!("redis://scripts:pw@127.0.0.1:{}", server.port);
    let scripts = RedisStore::connect(&url, store.options().clone())
        .await
        .unwrap();
    let d = scripts.check(None, &[item("k", &q, 1)]).await.unwrap();
    assert_eq!(d[0].remaining, 1, "the same counter, by the script");
    assert!(!scripts.uses_function());
    assert!(server.cli(&["SCRIPT", "FLUSH"]).contains("OK"));
    assert!(server
        .cli(&["SCRIPT", "EXISTS", scripts.script_sha()])
        .contains('0'));
    let d = scripts.check(None, &[item("k", &q, 1)]).await.unwrap();
    assert_eq!(d[0].remaining, 0);
    assert!(server
        .cli(&["SCRIPT", "EXISTS", scripts.script_sha()])
        .contains('1'));
}

#[tokio::test]
async fn restart_is_an_error_then_recovers() {
    let mut server = RedisServer::start(&[]);
    let port = server.port;
    let opts = RedisOptions {
        timeout: Duration::from_millis(300),
        ..options("restart")
    };
    let store = RedisStore::connect(&server.url(), opts).await.unwrap();
    let q = Quota::new(10, Unit::Minute).with_algorithm(Algorithm::Gcra);
    assert!(store.check(None, &[item("k", &q, 1)]).await.is_ok());
    assert!(store.is_healthy());
    server.kill();
    let e = store.check(None, &[item("k", &q, 1)]).await.unwrap_err();
    assert!(e.kind().is_outage(), "{e}");
    assert!(!store.is_healthy());
    assert!(store.ping().await.is_err());
    drop(server);
    let _server = RedisServer::start_on(port, &[]);
    let mut recovered = false;
    for _ in 0..100 {
        if store.check(None, &[item("k", &q, 1)]).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "store did not reconnect");
    assert!(store.is_healthy());
    store.ping().await.unwrap();
}

#[tokio::test]
async fn slow_server_is_a_timeout_and_absent_server_is_unavailable() {
    let server = RedisServer::start(&[]);
    let opts = RedisOptions {
        timeout: Duration::from_millis(50),
        ..options("timeout")
    };
    let store = RedisStore::connect(&server.url(), opts).await.unwrap();
    let q = Quota::new(10, Unit::Minute);
    store.check(None, &[item("k", &q, 1)]).await.unwrap();
    server.cli(&["CLIENT", "PAUSE", "400", "ALL"]);
    let e = store.check(None, &[item("k", &q, 1)]).await.unwrap_err();
    assert!(matches!(e, StoreError::Timeout(50)), "{e}");
    // Once the pause is over, calls succeed again (only timeouts meanwhile).
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match store.check(None, &[item("k", &q, 1)]).await {
            Ok(_) => break,
            Err(e) => assert!(matches!(e, StoreError::Timeout(50)), "{e}"),
        }
        assert!(std::time::Instant::now() < until, "still paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Nothing listening: connect fails as unavailable.
    let dead = support::RefusedPort::new();
    let e = RedisStore::connect(&format!("redis://127.0.0.1:{}", dead.port), options("dead"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), tollgate_core::FaultKind::ConnectionRefused, "{e}");
}

#[tokio::test]
async fn auth_from_url_and_password_redacted() {
    let server = RedisServer::start(&["--requirepass", "s3cret-pw"]);
    let url = format!("redis://default:s3cret-pw@127.0.0.1:{}/0", server.port);
    let store = RedisStore::connect(&url, options("auth")).await.unwrap();
    store.ping().await.unwrap();
    let shown = format!("{store:?} {store}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("default:***@"), "{shown}");
    let wrong = format!("redis://default:nope@127.0.0.1:{}", server.port);
    let e = RedisStore::connect(&wrong, options("auth"))
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("nope"), "{e}");
}

#[tokio::test]
async fn server_time_by_default() {
    let store = RedisStore::connect(shared_url(), options("time"))
        .await
        .unwrap();
    let q = Quota::new(5, Unit::Second).with_algorithm(Algorithm::Gcra);
    let mut allowed = 0;
    let mut last = None;
    for _ in 0..6 {
        let d = store.check(None, &[item("k", &q, 1)]).await.unwrap();
        allowed += u32::from(d[0].allowed);
        last = Some(d[0]);
    }
    let last = last.unwrap();
    assert!((5..=6).contains(&allowed), "{allowed}");
    if !last.allowed {
        assert!(last.retry_after.is_some_and(|r| r > 0 && r <= 200_000));
    }
    support::delete_prefix(shared_url(), &store.options().prefix);
}

#[tokio::test]
async fn unsupported_quotas_are_rejected_with_a_reason() {
    let store = RedisStore::connect(shared_url(), options("unsup"))
        .await
        .unwrap();
    let cms = Quota::new(5, Unit::Second).with_algorithm(Algorithm::CountMinSketch);
    let e = store.check(None, &[item("k", &cms, 1)]).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Unsupported(m) if m.contains("count_min_sketch")),
        "{e}"
    );
    assert!(store.is_healthy(), "a config error is not an outage");
    let forever = Quota::new(1, Period::new(Unit::Year, 100));
    assert!(matches!(
        store.check(None, &[item("k", &forever, 1)]).await,
        Err(StoreError::Unsupported(_))
    ));
    assert!(store.check(None, &[]).await.unwrap().is_empty());
    assert!(matches!(
        RedisStore::connect("memcached://x", RedisOptions::default()).await,
        Err(StoreError::Unsupported(_))
    ));
}

#[tokio::test]
async fn lazy_connect_starts_without_redis_and_recovers() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let opts = RedisOptions {
        timeout: Duration::from_millis(300),
        ..options("lazy")
    };
    let store = RedisStore::connect_lazy(&format!("redis://127.0.0.1:{port}"), opts)
        .await
        .unwrap();
    assert!(
        !store.is_healthy(),
        "not known healthy before the first call"
    );
    let q = Quota::new(10, Unit::Minute);
    assert!(store.check(None, &[item("k", &q, 1)]).await.is_err());
    let _server = RedisServer::start_on(port, &[]);
    let mut ok = false;
    for _ in 0..100 {
        if store.check(None, &[item("k", &q, 1)]).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok && store.is_healthy());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_and_script_flush_under_concurrent_load_fail_no_call() {
    let server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url(), options("flushload"))
        .await
        .unwrap();
    let q = Quota::new(1000, Unit::Day).with_algorithm(Algorithm::SlidingWindowLog);
    let port = server.port;
    let flusher = std::thread::spawn(move || {
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(20));
            assert!(support::cli(port, &["SCRIPT", "FLUSH"]).contains("OK"));
            assert!(support::cli(port, &["FUNCTION", "FLUSH"]).contains("OK"));
        }
    });
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (store, errors, admitted) = (store.clone(), errors.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                match store.check(None, &[item("k", &q, 1)]).await {
                    Ok(d) => {
                        admitted.fetch_add(u64::from(d[0].allowed), Ordering::Relaxed);
                    }
                    Err(e) => errors.lock().unwrap().push(e.to_string()),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    flusher.join().unwrap();
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} failed calls: {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    assert_eq!(admitted.load(Ordering::Relaxed), 1000);
}

/// Regression (cluster refunds): a refund carries the time of the check it undoes. When another
/// request rolled the counter into the next window between that check and the refund, the refund
/// came off the *new* window, which the refunded request never counted in, and that window could
/// then admit more than its limit. A refund must only undo in the window the check counted in.
#[tokio::test]
async fn refund_never_comes_off_a_later_window() {
    use tollgate_redis::script::{eval, Call, Mode};
    let store = RedisStore::connect(shared_url(), options("refund-window"))
        .await
        .unwrap();
    let prefix = store.options().prefix.clone();
    let mut con = redis::Client::open(shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    const MINUTE: Micros = 60_000_000;
    let (end_of_one, start_of_next) = (10 * MINUTE - 1_000, 10 * MINUTE + 1_000);
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let quota = Quota::new(2, Unit::Minute).with_algorithm(alg);
        let key = format!("api|user=refund-{alg}");
        let first = item(&key, &quota, 1);
        let d = store.check(Some(end_of_one), &[first]).await.unwrap();
        assert!(d[0].allowed, "{alg}");
        // Another request rolls the counter into the next minute.
        let d = store.check(Some(start_of_next), &[first]).await.unwrap();
        assert!(d[0].allowed, "{alg}");
        // The first request's refund arrives, as RedisStore sends it: at the check's time.
        let keys = counter_keys(&prefix, &key, &quota);
        let call = Call {
            now: Some(end_of_one),
            reqid: "first",
            mode: Mode::Refund,
            single: false,
            grace_ms: 0,
            layout: tollgate_redis::KeyLayout::Tollgate,
            jitter_max_s: 0,
            jitter_seed: 0,
            leases: &[],
        };
        let _: redis::Value = eval(&call, &[(0, &first, &keys)])
            .query_async(&mut con)
            .await
            .unwrap();
        // The next minute still holds the one request counted in it.
        let d = store
            .check(Some(start_of_next + 1_000), &[item(&key, &quota, 0)])
            .await
            .unwrap();
        assert_eq!(
            d[0].remaining, 1,
            "{alg}: refunded a window it never counted in"
        );
    }
    support::delete_prefix(shared_url(), &prefix);
}

/// The counting algorithms' state (numbers packed in binary, see `scripts/common.lua`): within
/// a window a write rewrites the count in place and keeps the TTL set by the window's first
/// write; a write at a time before that one (the clock went back) sets the TTL again, from its
/// own time; a write in a new window writes the whole state with a new TTL. The one-item
/// function (`fast.lua`) and the general check (a two-item request) write alike.
#[tokio::test]
async fn a_window_keeps_its_ttl_unless_the_clock_went_back() {
    let store = RedisStore::connect(shared_url(), options("ttlkeep"))
        .await
        .unwrap();
    let prefix = store.options().prefix.clone();
    let mut con = shared_connection();
    let hour: Micros = 3_600_000_000;
    let minute: Micros = 60_000_000;
    let w = 1_795_000_000 * 1_000_000 / hour * hour;
    let other = Quota::new(100, Unit::Hour).with_algorithm(Algorithm::Gcra);
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let q = Quota::new(100, Unit::Hour).with_algorithm(alg);
        let (name, _) = counter_keys(&prefix, "k", &q);
        // The state's numbers (the last one t) and its PTTL.
        let state = |con: &mut redis::Connection| -> (Vec<i64>, i64) {
            let v: Vec<u8> = redis::cmd("GET").arg(&name).query(con).unwrap();
            let pttl: i64 = redis::cmd("PTTL").arg(&name).query(con).unwrap();
            (tollgate_redis::script::numbers(&v), pttl)
        };
        for multi in [false, true] {
            let _: i64 = redis::cmd("DEL").arg(&name).query(&mut con).unwrap();
            let hit = |t: Micros| {
                let store = &store;
                let q = &q;
                let other = &other;
                async move {
                    let mut items = vec![item("k", q, 1)];
                    if multi {
                        items.push(item("other", other, 1));
                    }
                    let d = store.check(Some(t), &items).await.unwrap();
                    assert!(d.iter().all(|d| d.allowed), "{alg} at {t}: {d:?}");
                }
            };
            // The window's first write, 30 minutes in: TTL up to the window's end (the sliding
            // counter: the next one's, where this count still weighs).
            hit(w + 30 * minute).await;
            let (s, ttl) = state(&mut con);
            assert_eq!(
                *s.last().unwrap() as Micros,
                w + 30 * minute,
                "{alg} {multi}: t"
            );
            let horizon = if alg == Algorithm::FixedWindow {
                30
            } else {
                90
            } * 60_000;
            assert!(
                ttl > horizon - 60_000 && ttl <= horizon,
                "{alg} {multi}: {ttl}"
            );
            // Ten minutes on: the count changes in place, t and the TTL stay.
            hit(w + 40 * minute).await;
            let (s2, ttl2) = state(&mut con);
            assert_eq!(s2[..s2.len() - 2], s[..s.len() - 2], "{alg} {multi}");
            assert_eq!(s2[s2.len() - 2], 2, "{alg} {multi}: count");
            assert_eq!(s2.last(), s.last(), "{alg} {multi}: t kept");
            assert!(ttl2 <= ttl, "{alg} {multi}: TTL kept ({ttl2} after {ttl})");
            // Twenty minutes back, still in the window: the TTL is set again from there.
            hit(w + 10 * minute).await;
            let (s3, ttl3) = state(&mut con);
            assert_eq!(
                *s3.last().unwrap() as Micros,
                w + 10 * minute,
                "{alg} {multi}: t"
            );
            assert_eq!(s3[s3.len() - 2], 3, "{alg} {multi}: count");
            assert!(ttl3 > horizon + 19 * 60_000, "{alg} {multi}: {ttl3}");
        }
    }
    support::delete_prefix(shared_url(), &prefix);
}

/// A counter key holding something no tollgate writes there (a string of another size, such as
/// an older version's text state): a clear error naming the key, not a wrong decision.
#[tokio::test]
async fn a_foreign_value_at_a_counter_key_is_an_error_naming_it() {
    let store = RedisStore::connect(shared_url(), options("foreign"))
        .await
        .unwrap();
    let prefix = store.options().prefix.clone();
    let mut con = shared_connection();
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let q = Quota::new(5, Unit::Minute).with_algorithm(alg);
        let (name, _) = counter_keys(&prefix, "k", &q);
        let _: () = redis::cmd("SET")
            .arg(&name)
            .arg("1795000000000000 3")
            .query(&mut con)
            .unwrap();
        for items in [
            vec![item("k", &q, 1)],
            vec![item("k", &q, 1), item("j", &q, 1)],
        ] {
            let e = store.check(None, &items).await.unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains(&name) && text.contains("18 bytes"),
                "{alg}: {text}"
            );
        }
    }
    support::delete_prefix(shared_url(), &prefix);
}

/// One-item checks that arrive while calls are in flight go to Redis as one batch, and the
/// batch decides them as the memory store decides the same requests one at a time in arrival
/// order (keys repeat in it, each read and written once; costs vary; a shadow limit), and
/// stores what one at a time would (the next batches decide on it), while a request whose key
/// holds a value tollgate did not write fails alone. (On a current-thread runtime the first two
/// requests of one `join_all` take the two free slots and go at once, the others all join the
/// line before its sender runs: one batch, in order.)
#[tokio::test]
async fn a_batch_decides_as_one_request_at_a_time_and_a_bad_key_fails_alone() {
    use tollgate_core::{MemoryStore, Store};
    let store = RedisStore::connect(shared_url(), options("batch"))
        .await
        .unwrap();
    let prefix = store.options().prefix.clone();
    let mut con = shared_connection();
    let now: Micros = 1_795_000_000 * 1_000_000 + 123_456;
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let mem = MemoryStore::with_seed(1000, 7, 11);
        let q = Quota::new(7, Unit::Minute).with_algorithm(alg);
        let keys: Vec<String> = (0..40).map(|i| format!("{alg}-{}", i % 3)).collect();
        // A bad key with two requests (read once, written once after its last), and two bad
        // keys with one request each, in the middle of the batch: another type, and a string
        // that is no counter state. The requests after them are still decided.
        let (bad, once, junk) = (
            format!("{alg}-bad"),
            format!("{alg}-bad-once"),
            format!("{alg}-junk"),
        );
        let name = |k: &str| counter_keys(&prefix, k, &q).0;
        let (bad_name, once_name, junk_name) = (name(&bad), name(&once), name(&junk));
        for plant in [
            redis::cmd("HSET").arg(&bad_name).arg("f").arg("v").clone(),
            redis::cmd("HSET").arg(&once_name).arg("f").arg("v").clone(),
            redis::cmd("SET").arg(&junk_name).arg("junk!").clone(),
        ] {
            let _: () = plant.query(&mut con).unwrap();
        }
        let requests: Vec<CheckItem<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let key = match i {
                    17 | 33 => bad.as_str(),
                    22 => once.as_str(),
                    26 => junk.as_str(),
                    _ => k.as_str(),
                };
                CheckItem {
                    shadow: i % 11 == 5,
                    ..item(key, &q, (i % 3) as u64)
                }
            })
            .collect();
        // Three batches: the second in the next minute (the sliding counter weighs the first
        // minute's counts), the third in the same minute as the second. Each starts from what
        // the one before stored.
        for (round, at) in [now, now + 20_000_000, now + 25_000_000]
            .into_iter()
            .enumerate()
        {
            let before = store.coalescing();
            let got = futures_util::future::join_all(
                requests
                    .iter()
                    .map(|r| store.check(Some(at), std::slice::from_ref(r))),
            )
            .await;
            let after = store.coalescing();
            assert_eq!(
                (after.calls - before.calls, after.requests - before.requests),
                (2, 40),
                "{alg}: one sent alone (nothing in flight), then one batch of 39 (the second slot \
                 opened by the long line, its sender running once all 39 wait)"
            );
            for (i, (r, got)) in requests.iter().zip(got).enumerate() {
                if i == 26 {
                    let e = got.unwrap_err();
                    assert!(e.to_string().contains("not a counter state"), "{alg}: {e}");
                    continue;
                }
                if i == 17 || i == 22 || i == 33 {
                    let e = got.unwrap_err();
                    assert!(
                        matches!(&e, StoreError::Failed { kind, .. } if *kind == tollgate_core::FaultKind::WrongType),
                        "{alg}: {e}"
                    );
                    continue;
                }
                let want = mem.check(at, std::slice::from_ref(r)).unwrap();
                assert_eq!(got.unwrap(), want, "{alg}, round {round}: request {i}");
            }
        }
        let _: () = redis::cmd("DEL")
            .arg(&bad_name)
            .arg(&once_name)
            .arg(&junk_name)
            .query(&mut con)
            .unwrap();
        support::assert_every_key_has_a_ttl(shared_url(), &prefix);
        assert!(store.is_healthy(), "one bad key is not an outage");
    }
    support::delete_prefix(shared_url(), &prefix);
}
