//! The sliding-log script's Redis layout on real Redis: bounded pruning per call (a long run of
//! expired entries goes in steps while every decision stays the memory store's), refunds of an
//! entry with later entries behind it, logs written by the previous layout, and clock steps
//! (`retry_after`/`reset_after` within the period, no fresh quota after a step back).

mod support;

use proptest::prelude::*;
use std::time::Duration;
use support::conformance::{replay, runner, Req, Step, Trace};
use support::shared_url;
use tollgate_core::{Algorithm, CheckItem, Decision, MemoryStore, Micros, Quota, Store, Unit};
use tollgate_redis::keys::counter_keys;
use tollgate_redis::script::{eval, numbers, Call, Mode};
use tollgate_redis::{RedisOptions, RedisStore};

const SECOND: Micros = 1_000_000;
const MINUTE: Micros = 60 * SECOND;
const DAY: Micros = 86_400 * SECOND;
/// 2026-11-22T00:00:00Z.
const T0: Micros = 1_795_305_600 * SECOND;
/// The most expired entries one call removes from the set (`LOG_PRUNE` in sliding_log.lua).
const PRUNE_CAP: u64 = 16;

fn options(what: &str) -> RedisOptions {
    RedisOptions {
        prefix: support::unique_prefix(what),
        ttl_grace: Duration::from_secs(120),
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    }
}

/// A store on the shared Redis under a fresh prefix for `what`.
async fn store(what: &str) -> RedisStore {
    RedisStore::connect(shared_url(), options(what))
        .await
        .unwrap()
}

fn log(limit: u64, unit: Unit) -> Quota {
    Quota::new(limit, unit).with_algorithm(Algorithm::SlidingWindowLog)
}

fn item<'a>(key: &'a str, quota: &'a Quota, cost: u64) -> CheckItem<'a> {
    CheckItem {
        cost,
        ..CheckItem::hit("r", key, quota)
    }
}

fn con() -> redis::Connection {
    redis::Client::open(shared_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn zcard(key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query(&mut con()).unwrap()
}

/// Check `cost` on both stores at `now`; they must agree. Returns the decision.
async fn both(
    redis: &RedisStore,
    mem: &MemoryStore,
    key: &str,
    q: &Quota,
    now: Micros,
    cost: u64,
) -> Decision {
    let it = [item(key, q, cost)];
    let want = mem.check(now, &it).unwrap();
    let got = redis.check(Some(now), &it).await.unwrap();
    assert_eq!(
        got, want,
        "at {now} cost {cost} (left: redis, right: memory)"
    );
    got[0]
}

/// A log of 1000 entries (1000/day) of which 999 expire at once: each later call removes at
/// most the cap from the set, the horizon hides the rest, and decisions (also after the clock
/// steps back behind what was pruned) stay exactly the memory store's. The previous script
/// removed every expired entry in the first call (fetching and parsing each one twice).
#[tokio::test]
async fn pruning_is_capped_per_call_and_decisions_stay_exact() {
    let store = store("slog-prune").await;
    let mem = MemoryStore::with_seed(10_000, 7, 11);
    let q = log(1000, Unit::Day);
    let key = "api|user=long";
    let (set, _) = counter_keys(&store.options().prefix, key, &q);
    for i in 0..999 {
        let d = both(&store, &mem, key, &q, T0 + i, 1).await;
        assert!(d.allowed);
    }
    let d = both(&store, &mem, key, &q, T0 + DAY / 2, 1).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = both(&store, &mem, key, &q, T0 + DAY / 2 + 1, 1).await;
    assert!(!d.allowed);
    assert_eq!(zcard(&set), 1000);

    // 999 entries expired; every call prunes at most the cap and still decides right.
    let mut now = T0 + DAY + 1_000;
    let mut card = zcard(&set);
    let mut live = 1;
    let mut calls = 0;
    while card > live {
        let d = both(&store, &mem, key, &q, now, 1).await;
        assert!(d.allowed, "{d:?}");
        live += 1;
        calls += 1;
        let after = zcard(&set);
        // The call logged one entry and removed `card + 1 - after`.
        let removed = card + 1 - after;
        assert!(
            removed <= PRUNE_CAP,
            "one call removed {removed} entries (cap {PRUNE_CAP})"
        );
        card = after;
        now += SECOND;
        if calls == 10 {
            // Back behind the pruned entries: they stay gone (a query and a hit); the entries
            // now in the future are clamped.
            both(&store, &mem, key, &q, T0 + DAY / 4, 0).await;
            assert!(both(&store, &mem, key, &q, T0 + DAY / 4, 2).await.allowed);
            live += 1;
            card = zcard(&set);
        }
    }
    assert!(calls >= 10, "the cap never applied");
    let d = both(&store, &mem, key, &q, now, 0).await;
    assert!(d.allowed);
    support::delete_prefix(shared_url(), &store.options().prefix);
}

/// A refunded entry in the middle of the log (entries logged after it): the refund removes it
/// and the later entries keep their costs, including when they expire one by one.
#[tokio::test]
async fn refund_in_the_middle_keeps_later_costs() {
    let store = store("slog-refund").await;
    let prefix = store.options().prefix.clone();
    let con = redis::Client::open(shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let q = log(20, Unit::Minute);
    let key = "api|user=refund";
    let keys = counter_keys(&prefix, key, &q);
    let run = |now: Micros, reqid: &'static str, mode: Mode, cost: u64| {
        let it = item(key, &q, cost);
        let call = Call {
            now: Some(now),
            reqid,
            mode,
            single: true,
            grace_ms: 120_000,
            layout: tollgate_redis::KeyLayout::Tollgate,
            jitter_max_s: 0,
            jitter_seed: 0,
            leases: &[],
        };
        let cmd = eval(&call, &[(0, &it, &keys)]);
        let mut con = con.clone();
        async move {
            let v = numbers(&cmd.query_async::<Vec<u8>>(&mut con).await.unwrap());
            (v[2] == 1, v[4] as u64, v[6])
        }
    };
    assert_eq!(run(T0, "a", Mode::Check, 4).await, (true, 16, -1));
    assert_eq!(run(T0 + 1, "b", Mode::Check, 5).await, (true, 11, -1));
    assert_eq!(run(T0 + 2, "c", Mode::Check, 3).await, (true, 8, -1));
    assert_eq!(run(T0 + 3, "d", Mode::Check, 2).await, (true, 6, -1));
    // Refund b (at its own time): 5 back.
    let (_, remaining, _) = run(T0 + 1, "b", Mode::Refund, 5).await;
    assert_eq!(remaining, 11);
    assert_eq!(zcard(&keys.0), 3);
    // 9 + 12 is 1 over the limit: freed when a (4) leaves.
    assert_eq!(
        run(T0 + 10, "e", Mode::Check, 12).await,
        (false, 11, (MINUTE - 10) as i64)
    );
    // a leaves: 5 in the log (c 3, d 2).
    assert_eq!(run(T0 + MINUTE, "f", Mode::Check, 0).await, (true, 15, -1));
    // c leaves (b, refunded, frees nothing): only d's 2.
    assert_eq!(
        run(T0 + MINUTE + 2, "g", Mode::Check, 0).await,
        (true, 18, -1)
    );
    assert_eq!(
        run(T0 + MINUTE + 3, "h", Mode::Check, 0).await,
        (true, 20, -1)
    );
    support::delete_prefix(shared_url(), &prefix);
}

/// A log written by the previous layout (member "<time>:<cost>:<id>:<index>", sum key = the plain
/// sum) is read as it was: nothing is forgotten on upgrade.
#[tokio::test]
async fn previous_layout_is_read() {
    let store = store("slog-upgrade").await;
    let q = log(10, Unit::Minute);
    let key = "api|user=old";
    let (set, sum) = counter_keys(&store.options().prefix, key, &q);
    let sum = sum.unwrap();
    let mut c = con();
    for (t, cost, id) in [
        (T0, 3, "x"),
        (T0 + SECOND, 4, "y"),
        (T0 + 2 * SECOND, 2, "z"),
    ] {
        let _: () = redis::cmd("ZADD")
            .arg(&set)
            .arg(t)
            .arg(format!("{t}:{cost}:{id}:0"))
            .query(&mut c)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(&sum)
        .arg("9")
        .arg("EX")
        .arg(600)
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(&set)
        .arg(600)
        .query(&mut c)
        .unwrap();
    let d = store
        .check(Some(T0 + 3 * SECOND), &[item(key, &q, 2)])
        .await
        .unwrap();
    assert_eq!((d[0].allowed, d[0].remaining), (false, 1));
    assert_eq!(d[0].retry_after, Some(MINUTE - 3 * SECOND));
    let d = store
        .check(Some(T0 + MINUTE), &[item(key, &q, 2)])
        .await
        .unwrap();
    assert_eq!((d[0].allowed, d[0].remaining), (true, 2));
    let d = store
        .check(Some(T0 + MINUTE + SECOND), &[item(key, &q, 0)])
        .await
        .unwrap();
    assert_eq!(d[0].remaining, 6);
    support::assert_every_key_has_a_ttl(shared_url(), &store.options().prefix);
    support::delete_prefix(shared_url(), &store.options().prefix);
}

/// Running totals near 2^52 (a log that never emptied through ~2^52 of admitted cost) are
/// renumbered from zero before they could leave the range where doubles are exact.
#[tokio::test]
async fn running_totals_are_renumbered_before_2_pow_52() {
    let store = store("slog-rebase").await;
    let q = log(20, Unit::Minute);
    let key = "api|user=busy";
    let (set, sum) = counter_keys(&store.options().prefix, key, &q);
    let mut c = con();
    let big: u64 = (1 << 52) + 1_000;
    for (t, cum, cost, id) in [(T0, big, 3, "x"), (T0 + SECOND, big + 5, 5, "y")] {
        let _: () = redis::cmd("ZADD")
            .arg(&set)
            .arg(t)
            .arg(format!("{cum:016}:{cost}:{id}:0"))
            .query(&mut c)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(sum.unwrap())
        .arg("v2:-9007199254740992")
        .arg("EX")
        .arg(600)
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(&set)
        .arg(600)
        .query(&mut c)
        .unwrap();
    let check = |t: Micros, cost: u64| {
        let (store, q) = (store.clone(), q);
        async move { store.check(Some(t), &[item(key, &q, cost)]).await.unwrap()[0] }
    };
    let d = check(T0 + 2 * SECOND, 2).await;
    assert_eq!((d.allowed, d.remaining), (true, 10));
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(&set)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    let cums: Vec<u64> = members
        .iter()
        .map(|m| m.split(':').next().unwrap().parse().unwrap())
        .collect();
    assert!(cums.iter().all(|&n| n < 1 << 40), "{members:?}");
    // x (3) leaves; y (5) and the new 2 remain.
    let d = check(T0 + MINUTE, 0).await;
    assert_eq!(d.remaining, 13);
    let d = check(T0 + MINUTE + SECOND, 11).await;
    assert_eq!((d.allowed, d.remaining), (true, 7));
    support::delete_prefix(shared_url(), &store.options().prefix);
}

/// Clock steps on both stores: quota used after a day's jump forward stays used after the
/// jump back (no fresh quota), but is waited on for at most the period; after a year back,
/// `retry_after` and `reset_after` stay within the period (they were a year: unbounded).
#[tokio::test]
async fn clock_steps_keep_retry_within_the_period() {
    let store = store("slog-clock").await;
    let mem = MemoryStore::with_seed(10_000, 7, 11);
    let q = log(3, Unit::Minute);
    let key = "api|user=jump";
    // A day ahead: the quota is used.
    for i in 0..3 {
        assert!(both(&store, &mem, key, &q, T0 + DAY + i, 1).await.allowed);
    }
    let d = both(&store, &mem, key, &q, T0 + DAY + 5, 1).await;
    assert!(!d.allowed);
    // Back to T0: still used, and the wait is at most a minute, not a day.
    let d = both(&store, &mem, key, &q, T0, 1).await;
    assert!(
        !d.allowed,
        "re-admitted after the clock stepped back: {d:?}"
    );
    assert_eq!(d.retry_after, Some(MINUTE));
    assert_eq!(d.reset_after, MINUTE);
    // A year back: bounded as well.
    let d = both(&store, &mem, key, &q, T0 - 365 * DAY, 1).await;
    assert!(!d.allowed);
    assert!(
        d.retry_after.unwrap() <= MINUTE && d.reset_after <= MINUTE,
        "{d:?}"
    );
    // A period after that, the quota is back.
    let d = both(&store, &mem, key, &q, T0 - 365 * DAY + MINUTE, 1).await;
    assert!(d.allowed, "{d:?}");
    support::delete_prefix(shared_url(), &store.options().prefix);
}

/// Random long logs (limits in the hundreds, hundreds of requests, costs up to 4, a key repeated
/// in one request, the clock stepping back by up to two periods): so many entries expire between
/// some steps that pruning is capped, and Redis still decides exactly as the memory store.
#[test]
fn random_long_logs_match_memory_store() {
    let rt = support::runtime();
    let store = rt
        .block_on(RedisStore::connect(shared_url(), options("slog-random")))
        .unwrap();
    let strategy = (
        50u64..400,
        prop::collection::vec(
            (
                prop_oneof![
                    4 => Just(0i64),
                    8 => 0i64..300_000,
                    1 => (MINUTE as i64)..(2 * MINUTE as i64),
                    1 => -(2 * MINUTE as i64)..0,
                ],
                0u64..5,
                prop::bool::weighted(0.1),
            ),
            200..400,
        ),
    )
        .prop_map(|(limit, steps)| {
            let q = log(limit, Unit::Minute);
            let mut t = T0 as i64;
            let req = |cost| Req {
                key: "k".into(),
                quota: q,
                cost,
                shadow: false,
                count_denied: false,
                tier: None,
            };
            Trace {
                name: format!("random long log {limit}/min"),
                steps: steps
                    .into_iter()
                    .map(|(dt, cost, twice)| {
                        t += dt;
                        let mut reqs = vec![req(cost)];
                        if twice {
                            reqs.push(req(cost / 2));
                        }
                        Step {
                            t: t as Micros,
                            reqs,
                        }
                    })
                    .collect(),
            }
        });
    let mut runner = runner(16);
    runner
        .run(&strategy, |trace| {
            rt.block_on(replay(&store, &trace));
            Ok(())
        })
        .unwrap();
    support::delete_prefix(shared_url(), &store.options().prefix);
}
