//! Throughput of the Redis store: decisions per second with 1, 16 and 64 concurrent callers
//! sharing one store (one multiplexed connection), against the ceiling of the same `FCALL`
//! prepared once and sent by 64 tasks on one connection (no store work around it).
//!
//! `cargo bench -p tollgate-redis --bench redis` runs it (5 s per level; `BENCH_SECS` to change,
//! `TOLLGATE_BENCH_REDIS` for another server than the suite's, `TOLLGATE_TEST_REDIS_URL`, else
//! redis://127.0.0.1:6379). Under `cargo test`
//! (no `--bench` argument) it makes a few calls per level so it cannot rot.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate_core::{Algorithm, CheckItem, Quota, Unit};
use tollgate_redis::{script, RedisOptions, RedisStore};

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let url = std::env::var("TOLLGATE_BENCH_REDIS")
        .unwrap_or_else(|_| tollgate_testsupport::shared_url().to_owned());
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let prefix = format!("tgbench-{}", std::process::id());
    let opts = RedisOptions {
        prefix: prefix.clone(),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    // The default algorithm, with a limit high enough that every call writes.
    let quota =
        Quota::new(1_000_000_000, Unit::Minute).with_algorithm(Algorithm::SlidingWindowCounter);
    let store = rt
        .block_on(RedisStore::connect(&url, opts))
        .unwrap_or_else(|e| panic!("bench needs Redis at {url}: {e}"));
    if !bench {
        println!("(smoke run under cargo test: a few calls per level, not a measurement)");
    }
    println!("## Redis store: decisions per second ({url}, sliding_window_counter, 1 item)");
    println!("| callers | decisions/s | mean latency |");
    println!("|---:|---:|---:|");
    let mut at64 = 0.0;
    for callers in [1usize, 16, 64] {
        let (rate, lat) = rt.block_on(run(&store, &quota, callers, secs, bench));
        println!("| {callers} | {rate:.0} | {:.0} µs |", lat * 1e6);
        if callers == 64 {
            at64 = rate;
        }
    }
    // The ceiling: the same FCALL, prepared once, sent by 64 tasks on one multiplexed
    // connection with nothing else around it (no key building, no argument packing, no reply
    // decoding): what the server and the client library give at best.
    let item = CheckItem::hit("bench", "bench|caller=shared", &quota);
    let fcall = script::fcall(store.function_name(), &prefix, &item, "bench");
    let rate = rt.block_on(ceiling(&url, fcall, secs, bench));
    println!(
        "\nceiling (the same FCALL from 64 tasks, no store around it): {rate:.0}/s\n\
         store at 64 callers: {at64:.0}/s = {:.0}% of the ceiling",
        100.0 * at64 / rate
    );
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut con)
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query(&mut con).unwrap();
    }
}

/// Decisions per second and mean latency with `callers` concurrent tasks, each on its own key.
async fn run(
    store: &RedisStore,
    quota: &Quota,
    callers: usize,
    secs: f64,
    bench: bool,
) -> (f64, f64) {
    let keys: Arc<Vec<String>> =
        Arc::new((0..callers).map(|i| format!("bench|caller={i}")).collect());
    let (store, quota) = (store.clone(), *quota);
    drive(callers, secs, bench, move |i| {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            let item = CheckItem::hit("bench", &keys[i], &quota);
            store.check(None, &[item]).await.expect("bench check");
        }
    })
    .await
}

/// Calls per second of `fcall` sent as it is by 64 tasks on one multiplexed connection.
async fn ceiling(url: &str, fcall: redis::Cmd, secs: f64, bench: bool) -> f64 {
    let con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let fcall = Arc::new(fcall);
    drive(64, secs, bench, move |_| {
        let (mut con, fcall) = (con.clone(), fcall.clone());
        async move {
            let _: Vec<u8> = fcall.query_async(&mut con).await.expect("ceiling FCALL");
        }
    })
    .await
    .0
}

/// Calls per second and mean latency of `callers` tasks, task `i` awaiting `call(i)` in a loop
/// for `secs` (a few calls each when not `bench`: under `cargo test`).
async fn drive<F, Fut>(callers: usize, secs: f64, bench: bool, call: F) -> (f64, f64)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let per_task_cap = if bench { u64::MAX } else { 20 };
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (stop, done, call) = (stop.clone(), done.clone(), call.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < per_task_cap {
                    call(i).await;
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    if bench {
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed) as f64;
    (n / elapsed, elapsed * callers as f64 / n.max(1.0))
}
