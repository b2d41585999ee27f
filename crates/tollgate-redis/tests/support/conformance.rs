//! The conformance suite: request traces replayed on [`MemoryStore`] (the reference) and on a
//! [`RedisStore`] with the same explicit times; every decision must match field for field.
//!
//! Traces are plain data ([`Trace`] = named list of [`Step`]s) produced by [`traces`] (hand
//! written edge cases for every algorithm) and [`random_trace`] (a proptest strategy), so the
//! standalone and the cluster tests replay the same suite.

#![allow(dead_code)]

use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use tollgate_core::internals::days_from_civil;
use tollgate_core::rules::TierLevel;
use tollgate_core::store::Tier;
use tollgate_core::{
    Algorithm, CheckItem, Decision, MemoryStore, Micros, Period, Quota, Store, Unit,
};
use tollgate_redis::guard::PROBE_INTERVAL;
use tollgate_redis::lease::IDLE;
use tollgate_redis::RedisStore;

pub const SECOND: Micros = 1_000_000;
pub const MINUTE: Micros = 60 * SECOND;
pub const HOUR: Micros = 60 * MINUTE;
pub const DAY: Micros = 24 * HOUR;

/// Every algorithm the Redis store implements.
pub const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
];

/// Every algorithm, envoyproxy/ratelimit's fixed window too (not all-or-nothing, so kept out of
/// [`ALGORITHMS`], which tests of all-or-nothing iterate).
pub const ALL_ALGORITHMS: [Algorithm; 7] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::EnvoyFixedWindow,
];

/// A proptest runner of `PROPTEST_CASES` cases (`default_cases` when unset), with no
/// regression file: random traces replayed against Redis.
pub fn runner(default_cases: u32) -> proptest::test_runner::TestRunner {
    proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(default_cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

/// `y-m-d` at `secs` past midnight UTC.
pub fn at(y: i64, m: u32, d: u32, secs: u64) -> Micros {
    days_from_civil(y, m, d) as u64 * DAY + secs * SECOND
}

/// One counter of one request.
#[derive(Debug, Clone)]
pub struct Req {
    pub key: String,
    pub quota: Quota,
    pub cost: u64,
    pub shadow: bool,
    /// [`CheckItem::count_denied`].
    pub count_denied: bool,
    /// A tiered limit's levels and the request's tier ([`CheckItem::tier`]).
    pub tier: Option<(Vec<TierLevel>, u8)>,
}

/// One request at time `t`.
#[derive(Debug, Clone)]
pub struct Step {
    pub t: Micros,
    pub reqs: Vec<Req>,
}

/// A named sequence of requests.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: String,
    pub steps: Vec<Step>,
}

fn req(key: &str, quota: Quota, cost: u64) -> Req {
    Req {
        key: key.to_owned(),
        quota,
        cost,
        shadow: false,
        count_denied: false,
        tier: None,
    }
}

fn counting(mut r: Req) -> Req {
    r.count_denied = true;
    r
}

fn shadow(mut r: Req) -> Req {
    r.shadow = true;
    r
}

/// Single-key trace: each `(t, cost)` is one request on key `k`.
fn single(name: String, quota: Quota, times: &[(Micros, u64)]) -> Trace {
    Trace {
        name,
        steps: times
            .iter()
            .map(|&(t, cost)| Step {
                t,
                reqs: vec![req("k", quota, cost)],
            })
            .collect(),
    }
}

/// Cumulative offsets `(dt, cost)` from `t0` into absolute `(t, cost)`.
fn walk(t0: Micros, deltas: &[(i64, u64)]) -> Vec<(Micros, u64)> {
    let mut t = t0 as i64;
    deltas
        .iter()
        .map(|&(dt, c)| {
            t += dt;
            (t as Micros, c)
        })
        .collect()
}

/// The hand-written suite.
pub fn traces() -> Vec<Trace> {
    let t0 = at(2026, 11, 22, 4 * 3600 + 17 * 60) + 123_457;
    let s = SECOND as i64;
    let basic: Vec<(i64, u64)> = vec![
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 0),
        (1, 1),
        (99_999, 1),
        (100_000, 1),
        (1, 2),
        (250_000, 0),
        (250_000, 3),
        (400_000, 1),
        (s, 5),
        (0, 6),
        (0, 1),
        (10 * s, 0),
        (3 * 86_400 * s, 1),
        (59 * s, 4),
        (s / 3, 2),
        (2 * s, 1),
        (40 * s, 3),
    ];
    let backwards: Vec<(i64, u64)> = vec![
        (0, 2),
        (10 * s, 3),
        (-5 * s, 1),
        (4 * s, 2),
        (-8 * s, 1),
        (70 * s, 1),
        (-9 * s, 2),
        (-60 * s, 1),
        (0, 3),
        (120 * s, 0),
        (-3600 * s, 1),
        (1, 1),
    ];
    let mut out = Vec::new();
    for alg in ALL_ALGORITHMS {
        let q = |limit: u64, period: Period| Quota::new(limit, period).with_algorithm(alg);
        let quotas = [
            ("5/s", q(5, Unit::Second.into())),
            ("3/15min", q(3, Period::new(Unit::Minute, 15))),
            ("10/h burst 3", q(10, Unit::Hour.into()).with_burst(3)),
            ("10/min burst 20", q(10, Unit::Minute.into()).with_burst(20)),
            ("7/min", q(7, Unit::Minute.into())),
            ("1/s", q(1, Unit::Second.into())),
        ];
        for (qn, quota) in quotas {
            out.push(single(
                format!("basic {alg} {qn}"),
                quota,
                &walk(t0, &basic),
            ));
            out.push(single(
                format!("backwards {alg} {qn}"),
                quota,
                &walk(t0, &backwards),
            ));
        }
        let five = q(5, Unit::Second.into());
        out.push(single(
            format!("cost 0 {alg}"),
            five,
            &walk(
                t0,
                &[(0, 0), (0, 0), (1, 3), (0, 0), (10, 0), (s, 0), (0, 0)],
            ),
        ));
        out.push(single(
            format!("cost above capacity {alg}"),
            five,
            &walk(
                t0,
                &[
                    (0, 6),
                    (0, u64::MAX),
                    (0, 2),
                    (0, 6),
                    (0, 5),
                    (1, 4),
                    (s, 5),
                    (0, 100),
                ],
            ),
        ));
        out.push(single(
            format!("limit 0 {alg}"),
            q(0, Unit::Minute.into()),
            &walk(t0, &[(0, 0), (0, 1), (s, 0), (0, 5)]),
        ));
        out.push(single(
            format!("long gaps {alg}"),
            q(3, Unit::Day.into()),
            &walk(
                t0,
                &[
                    (0, 2),
                    (0, 1),
                    (0, 1),
                    (365 * 86_400 * s, 3),
                    (1, 1),
                    (30 * 365 * 86_400 * s, 2),
                    (86_400 * s - 1, 1),
                    (2, 3),
                ],
            ),
        ));
        // Calendar windows: day, week (Sunday -> Monday), month (incl. a leap February), year.
        let cal = [
            ("day", Period::from(Unit::Day), at(2026, 11, 23, 0)),
            ("2 days", Period::new(Unit::Day, 2), at(2026, 11, 23, 0)),
            ("week", Period::from(Unit::Week), at(2026, 11, 23, 0)),
            ("month", Period::from(Unit::Month), at(2026, 12, 1, 0)),
            ("leap month", Period::from(Unit::Month), at(2028, 3, 1, 0)),
            ("feb", Period::from(Unit::Month), at(2028, 2, 1, 0)),
            ("3 months", Period::new(Unit::Month, 3), at(2027, 1, 1, 0)),
            ("year", Period::from(Unit::Year), at(2027, 1, 1, 0)),
        ];
        for (cn, period, boundary) in cal {
            let quota = q(4, period);
            let b = boundary as i64;
            let times: Vec<(Micros, u64)> = [
                (b - 3 * 86_400 * s, 2),
                (b - 1, 1),
                (b - 1, 2),
                (b, 1),
                (b, 2),
                (b + 1, 2),
                (b + 1, 0),
                (b + 43_200 * s, 1),
                (b + 86_400 * s - 1, 1),
                (b + 86_400 * s, 3),
                (b + 8 * 86_400 * s, 2),
                (b + 29 * 86_400 * s, 4),
                (b + 31 * 86_400 * s, 1),
                (b - 1, 1),
            ]
            .iter()
            .map(|&(t, c)| (t as Micros, c))
            .collect();
            out.push(single(format!("calendar {cn} {alg}"), quota, &times));
        }
        // Big numbers: products above 2^53 in the sliding counter, long spans in buckets.
        let big = if alg.uses_burst() {
            q(4_000_000_000, Unit::Day.into())
        } else {
            q(4_000_000_000, Period::new(Unit::Year, 30))
        };
        out.push(single(
            format!("big numbers {alg}"),
            big,
            &walk(
                at(2031, 7, 9, 11),
                &[
                    (0, 3_999_999_999),
                    (1, 2),
                    (s, 1),
                    (400 * 86_400 * s, 123_456_789),
                    (7 * 365 * 86_400 * s, 3_000_000_000),
                    (29 * 365 * 86_400 * s, 2_000_000_000),
                    (12_345, 2_500_000_000),
                    (s, 0),
                ],
            ),
        ));
        out.push(single(
            format!("big burst {alg}"),
            q(1, Unit::Year.into()).with_burst(60),
            &walk(
                t0,
                &[
                    (0, 30),
                    (0, 31),
                    (0, 30),
                    (86_400 * s, 1),
                    (40 * 86_400 * s, 1),
                ],
            ),
        ));

        // Multi-item requests.
        let wide = q(10, Unit::Minute.into());
        let narrow = q(1, Unit::Minute.into());
        let three = q(3, Unit::Minute.into());
        let multi = |name: &str, steps: Vec<(i64, Vec<Req>)>| {
            let mut t = t0 as i64;
            Trace {
                name: format!("{name} {alg}"),
                steps: steps
                    .into_iter()
                    .map(|(dt, reqs)| {
                        t += dt;
                        Step {
                            t: t as Micros,
                            reqs,
                        }
                    })
                    .collect(),
            }
        };
        out.push(multi(
            "all-or-nothing",
            vec![
                (0, vec![req("a", wide, 1), req("b", narrow, 1)]),
                (1, vec![req("a", wide, 1), req("b", narrow, 1)]),
                (1, vec![req("a", wide, 0)]),
                (
                    1,
                    vec![req("a", wide, 3), req("b", narrow, 0), req("c", three, 4)],
                ),
                (1, vec![req("c", three, 3), req("a", wide, 9)]),
                (1, vec![req("c", three, 0), req("a", wide, 0)]),
                (
                    61 * s,
                    vec![req("a", wide, 2), req("b", narrow, 1), req("c", three, 1)],
                ),
                (
                    0,
                    vec![req("a", wide, 2), req("b", narrow, 1), req("c", three, 1)],
                ),
            ],
        ));
        out.push(multi(
            "shadow",
            vec![
                (0, vec![shadow(req("s", narrow, 1)), req("r", three, 1)]),
                (1, vec![shadow(req("s", narrow, 1)), req("r", three, 1)]),
                (1, vec![shadow(req("s", narrow, 1)), req("r", three, 1)]),
                (1, vec![shadow(req("s", narrow, 1)), req("r", three, 1)]),
                (1, vec![shadow(req("s", narrow, 0)), req("r", three, 0)]),
                (1, vec![shadow(req("s", narrow, 1))]),
                (
                    1,
                    vec![
                        shadow(req("s2", three, 2)),
                        req("x", narrow, 1),
                        req("x", narrow, 1),
                    ],
                ),
                (1, vec![req("s2", three, 0)]),
            ],
        ));
        out.push(multi(
            "repeated keys",
            vec![
                (0, vec![req("k", three, 2), req("k", three, 2)]),
                (1, vec![req("k", three, 0)]),
                (
                    1,
                    vec![req("k", three, 1), req("k", three, 1), req("k", three, 1)],
                ),
                (1, vec![req("k", three, 0), req("k", three, 1)]),
                (61 * s, vec![shadow(req("k", three, 2)), req("k", three, 2)]),
                (1, vec![req("k", three, 2), shadow(req("k", three, 2))]),
                (1, vec![req("k", three, 1)]),
                (
                    1,
                    vec![
                        req("j", three, 1),
                        req("k", three, 0),
                        req("j", three, 2),
                        req("j", three, 0),
                    ],
                ),
                (-30 * s, vec![req("j", three, 1), req("j", three, 1)]),
            ],
        ));
    }
    out.extend(long_log_traces(t0));
    out.extend(envoy_traces(t0));
    // Mixed algorithms in one request.
    let mixed: Vec<Req> = ALL_ALGORITHMS
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            req(
                &format!("m{i}"),
                Quota::new(3, Unit::Minute).with_algorithm(a),
                1,
            )
        })
        .collect();
    let mut steps: Vec<Step> = (0..5)
        .map(|i| Step {
            t: t0 + i * SECOND,
            reqs: mixed.clone(),
        })
        .collect();
    steps.push(Step {
        t: t0 + 10 * SECOND,
        reqs: mixed
            .iter()
            .map(|r| Req {
                cost: 0,
                ..r.clone()
            })
            .collect(),
    });
    out.push(Trace {
        name: "mixed algorithms".into(),
        steps,
    });
    // Wall-clock steps (Redis `TIME` follows them): a day forward and back, a year back and
    // forward, single items (the state is written whatever the outcome) and requests blocked by
    // another item or with a denied shadow item (only the clamp is written).
    let day = 86_400 * s;
    let jumps: Vec<(i64, u64)> = vec![
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (day, 1),
        (0, 1),
        (-day, 1),
        (0, 1),
        (s, 1),
        (2 * s, 1),
        (-365 * day, 1),
        (0, 1),
        (30 * s, 1),
        (365 * day, 1),
        (-40 * s, 2),
        (3600 * s, 1),
        (-7 * day, 0),
        (0, 1),
    ];
    for alg in ALL_ALGORITHMS {
        let q = |limit: u64, unit: Unit| Quota::new(limit, unit).with_algorithm(alg);
        for (qn, quota) in [
            ("1/s", q(1, Unit::Second)),
            ("3/min", q(3, Unit::Minute)),
            ("4/day burst 2", q(4, Unit::Day).with_burst(2)),
        ] {
            out.push(single(
                format!("clock jumps {alg} {qn}"),
                quota,
                &walk(t0, &jumps),
            ));
        }
        let (a, b) = (q(2, Unit::Minute), q(1, Unit::Hour));
        let both = |ca: u64, cb: u64| vec![req("a", a, ca), req("b", b, cb)];
        let steps = walk(t0, &jumps)
            .into_iter()
            .enumerate()
            .map(|(i, (t, c))| Step {
                t,
                reqs: match i % 3 {
                    0 => both(c, c),
                    1 => vec![req("a", a, c), shadow(req("b", b, c))],
                    _ => both(c, 0),
                },
            })
            .collect();
        out.push(Trace {
            name: format!("clock jumps blocked {alg}"),
            steps,
        });
    }
    out
}

/// Sliding logs of hundreds of entries: costs above 1, expiry in the middle of the log (more
/// expired entries than one call prunes in Redis), time stepping back behind what was pruned,
/// clock jumps forward and back (entries from the future are clamped), and cross-slot refunds
/// of a long log's entries (on a cluster).
fn long_log_traces(t0: Micros) -> Vec<Trace> {
    let log =
        |limit: u64| Quota::new(limit, Unit::Minute).with_algorithm(Algorithm::SlidingWindowLog);
    let ms = 1_000;
    let mut out = Vec::new();
    let q = log(600);
    let mut t: Vec<(Micros, u64)> = (0..500).map(|i| (t0 + i * 10 * ms, 1)).collect();
    t.extend((0..20).map(|i| (t0 + 30 * SECOND + i * ms, 3)));
    t.extend([
        (t0 + 45 * SECOND, 50),
        (t0 + 45 * SECOND, 40),
        (t0 + 45 * SECOND, 1),
        // 251 entries expire: more than one call prunes.
        (t0 + 62_500 * ms, 5),
        (t0 + 62_500 * ms, 300),
        (t0 + 62_500 * ms, 0),
        // Back behind what was pruned, then forward again.
        (t0 + 61_500 * ms, 0),
        (t0 + 61_500 * ms, 2),
        (t0 + 63 * SECOND, 0),
        (t0 + 64 * SECOND, 100),
        (t0 + 66 * SECOND, 0),
        (t0 + 80 * SECOND, 200),
        (t0 + 89_999 * ms, 0),
        (t0 + 90 * SECOND, 7),
        (t0 + 90_001 * ms, 0),
        (t0 + 95 * SECOND, 1),
    ]);
    // Refill, then let everything but the newest expire while steps walk through it.
    t.extend((0..300).map(|i| (t0 + 100 * SECOND + i * 100 * ms, 1 + i % 3)));
    t.extend((0..40).map(|i| (t0 + 160 * SECOND + i * 700 * ms, i % 4)));
    out.push(single("long log expiring in the middle".into(), q, &t));

    // Clock jumps: a day forward (quota used there), back (still used, but waits at most a
    // period), a year back, forward again.
    let q = log(200);
    let day = DAY;
    let mut t: Vec<(Micros, u64)> = (0..150).map(|i| (t0 + i * ms, 1)).collect();
    t.extend((0..60).map(|i| (t0 + day + i * ms, 1 + i % 2)));
    t.extend([
        (t0 + day + SECOND, 1),
        (t0 + 5 * SECOND, 1),
        (t0 + 5 * SECOND, 0),
    ]);
    t.extend((0..10).map(|i| (t0 + 6 * SECOND + i * SECOND, 1)));
    t.extend([
        (t0 + 65 * SECOND, 0),
        (t0 + 65 * SECOND, 150),
        (t0 - 365 * day, 0),
        (t0 - 365 * day, 10),
        (t0 - 365 * day + 30 * SECOND, 200),
        (t0 - 365 * day + 61 * SECOND, 30),
        (t0 + day + 2 * SECOND, 0),
        (t0 + day + 2 * SECOND, 180),
        (t0 + 10 * SECOND, 25),
        (t0 + 10 * SECOND + 61 * SECOND, 0),
        (t0 + 10 * SECOND + 61 * SECOND, 200),
    ]);
    out.push(single("long log clock jumps".into(), q, &t));

    // Multi-item requests on a long log: a denial elsewhere blocks (on a cluster: refunds) the
    // log's entries, in the middle of a long log and with later entries around it.
    let narrow = Quota::new(1, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
    let q = log(400);
    let mut steps: Vec<Step> = (0..250)
        .map(|i| Step {
            t: t0 + i * 20 * ms,
            reqs: vec![req("log", q, 1 + i % 2)],
        })
        .collect();
    for i in 0..6 {
        steps.push(Step {
            t: t0 + 10 * SECOND + i * ms,
            reqs: vec![req("log", q, 3), req("gate", narrow, 1)],
        });
        steps.push(Step {
            t: t0 + 10 * SECOND + i * ms,
            reqs: vec![req("log", q, 2), req("log", q, 1)],
        });
    }
    // A query then a hit on a key with no log yet, in one request.
    steps.push(Step {
        t: t0 + 11 * SECOND,
        reqs: vec![req("fresh", q, 0), req("fresh", q, 2), req("fresh", q, 0)],
    });
    for i in 0..8 {
        steps.push(Step {
            t: t0 + 60 * SECOND + i * 800 * ms,
            reqs: vec![req("log", q, 4), req("gate", narrow, 0)],
        });
    }
    out.push(Trace {
        name: "long log refunds".into(),
        steps,
    });

    // Capped pruning leaves a horizon; the clock steps back behind it and one request logs two
    // entries on the key: both stay counted.
    let q = log(100);
    let mut steps: Vec<Step> = (0..80)
        .map(|i| Step {
            t: t0 + i * 100 * ms,
            reqs: vec![req("k", q, 1)],
        })
        .collect();
    for (t, costs) in [
        (t0 + 130 * SECOND, vec![1]),
        (t0 + 40 * SECOND, vec![2, 1]),
        (t0 + 40 * SECOND + 1, vec![1]),
        (t0 + 41 * SECOND, vec![0]),
        (t0 + 100 * SECOND, vec![0, 3]),
    ] {
        steps.push(Step {
            t,
            reqs: costs.into_iter().map(|c| req("k", q, c)).collect(),
        });
    }
    out.push(Trace {
        name: "long log horizon and repeated key".into(),
        steps,
    });
    out
}

/// envoyproxy/ratelimit's counting: denied hits count on the denied descriptor, and on the
/// others unless they stop counting (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`); a denied
/// shadow item stops them too; a multi-key request with a tollgate algorithm in it.
fn envoy_traces(t0: Micros) -> Vec<Trace> {
    let envoy = |limit: u64, unit: Unit| {
        Quota::new(limit, unit).with_algorithm(Algorithm::EnvoyFixedWindow)
    };
    let (wide, narrow) = (envoy(5, Unit::Minute), envoy(2, Unit::Minute));
    let fw = Quota::new(2, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
    let mut out = Vec::new();
    for (name, count) in [
        ("envoy counts denied hits", true),
        ("envoy stops counting", false),
    ] {
        let pair = |cw: u64, cn: u64| {
            let (mut a, mut b) = (req("wide", wide, cw), req("narrow", narrow, cn));
            a.count_denied = count;
            b.count_denied = count;
            vec![a, b]
        };
        let mut steps: Vec<Step> = (0..4)
            .map(|i| Step {
                t: t0 + i * SECOND,
                reqs: pair(1, 1),
            })
            .collect();
        steps.push(Step {
            t: t0 + 5 * SECOND,
            reqs: pair(0, 0),
        });
        steps.push(Step {
            t: t0 + 6 * SECOND,
            reqs: vec![
                shadow(req("narrow", narrow, 1)),
                counting(req("wide", wide, 1)),
            ],
        });
        steps.push(Step {
            t: t0 + 7 * SECOND,
            reqs: vec![shadow(req("narrow", narrow, 1)), req("wide", wide, 2)],
        });
        steps.push(Step {
            t: t0 + 8 * SECOND,
            reqs: vec![req("fw", fw, 1), req("wide", wide, 1), req("fw", fw, 2)],
        });
        steps.push(Step {
            t: t0 + 70 * SECOND,
            reqs: pair(3, 1),
        });
        steps.push(Step {
            t: t0 + 71 * SECOND,
            reqs: pair(9, 0),
        });
        out.push(Trace {
            name: name.into(),
            steps,
        });
    }
    // A month is 30 days, a year 365: windows cross calendar boundaries.
    let month = envoy(2, Unit::Month);
    let times: Vec<(Micros, u64)> = (0..8).map(|i| (t0 + i * 5 * DAY, 1)).collect();
    out.push(single("envoy 30-day month".into(), month, &times));
    out
}

/// A random trace for `alg`: two quotas, 1-3 items per request over two keys, time moving by
/// small and large steps, and sometimes backwards when `backwards` is set.
pub fn random_trace(alg: Algorithm, backwards: bool) -> impl Strategy<Value = Trace> {
    let unit = prop_oneof![
        Just(Unit::Second),
        Just(Unit::Minute),
        Just(Unit::Hour),
        Just(Unit::Day),
        Just(Unit::Week),
        Just(Unit::Month),
        Just(Unit::Year),
    ];
    let quota = (0u64..12, unit, 1u32..4, proptest::option::of(0u64..15)).prop_map(
        move |(limit, unit, mult, burst)| {
            let q = Quota::new(limit, Period::new(unit, mult)).with_algorithm(alg);
            match burst {
                Some(b) => q.with_burst(b),
                None => q,
            }
        },
    );
    let dt = prop_oneof![
        3 => Just(0i64),
        3 => 1i64..2_000,
        4 => 1i64..(2 * DAY as i64),
        2 => -(HOUR as i64)..0,
        1 => -(30 * DAY as i64)..0,
        1 => 0i64..(400 * DAY as i64),
    ];
    let item = (
        0usize..2,
        0u64..15,
        proptest::bool::weighted(0.2),
        proptest::bool::ANY,
    );
    let step = (dt, proptest::collection::vec(item, 1..4));
    (
        [quota.clone(), quota],
        proptest::collection::vec(step, 1..30),
        0u64..(40 * DAY),
    )
        .prop_map(move |(quotas, steps, start)| {
            let mut t = at(2026, 1, 1, 0) + start;
            let steps = steps
                .into_iter()
                .map(|(dt, items)| {
                    let dt = if backwards { dt } else { dt.max(0) };
                    t = (t as i64 + dt) as Micros;
                    Step {
                        t,
                        reqs: items
                            .into_iter()
                            .map(|(k, cost, sh, cd)| Req {
                                key: ["a", "b"][k].to_owned(),
                                quota: quotas[k],
                                cost,
                                shadow: sh,
                                count_denied: cd,
                                tier: None,
                            })
                            .collect(),
                    }
                })
                .collect();
            Trace {
                name: format!("random {alg}"),
                steps,
            }
        })
}

/// Replay `trace` on a fresh [`MemoryStore`] and on `redis` (keys made unique per replay), and
/// panic at the first decision that differs.
pub async fn replay(redis: &RedisStore, trace: &Trace) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let ns = format!("{}#{}", trace.name, RUN.fetch_add(1, Ordering::Relaxed));
    let mem = MemoryStore::with_seed(10_000, 7, 11);
    for (i, step) in trace.steps.iter().enumerate() {
        let keys: Vec<String> = step
            .reqs
            .iter()
            .map(|r| format!("{ns}|{}", r.key))
            .collect();
        let items: Vec<CheckItem<'_>> = step
            .reqs
            .iter()
            .zip(&keys)
            .map(|(r, k)| CheckItem {
                rule: "r",
                key: k,
                quota: &r.quota,
                cost: r.cost,
                shadow: r.shadow,
                count_denied: r.count_denied,
                tier: r.tier.as_ref().map(|(levels, index)| Tier {
                    levels,
                    index: *index,
                }),
            })
            .collect();
        let mut expected: Vec<Decision> = mem.check(step.t, &items).unwrap();
        let mut got = redis
            .check(Some(step.t), &items)
            .await
            .unwrap_or_else(|e| panic!("{}: step {i} at {}: store error {e}", trace.name, step.t));
        // An envoy window's count past u32::MAX (only after costs no request can carry: the
        // service bounds them) is saturated differently: the memory store keeps counts in 32
        // bits, the scripts clamp a cost to MAX_COST. Past every limit either way; every other
        // field agrees.
        for d in got.iter_mut().chain(expected.iter_mut()) {
            if d.count.is_some_and(|c| c > u64::from(u32::MAX)) {
                d.count = Some(u64::from(u32::MAX));
            }
        }
        assert_eq!(
            got, expected,
            "{}: step {i} at t={} requests {:?}\n(left: redis, right: memory)",
            trace.name, step.t, step.reqs
        );
    }
}

/// The algorithms `sync: lease` applies to.
pub const LEASABLE: [Algorithm; 2] = [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter];

/// Whether every counter of `trace` uses a leasable algorithm.
pub fn leasable(trace: &Trace) -> bool {
    trace
        .steps
        .iter()
        .flat_map(|s| &s.reqs)
        .all(|r| LEASABLE.contains(&r.quota.algorithm()))
}

/// Replay `trace` on a fresh [`MemoryStore`] with its quotas as written (`exact`) and on
/// `guarded` (one instance, deciding at the trace's times) with every quota `sync: lease`, and
/// panic at the first decision that differs in what a lease must keep. The replay ends early
/// at a documented edge effect after which the counts differ (docs/distributed.md, "One
/// instance"): units lost with their window, a shadow limit denied in a request that consumed.
pub async fn replay_leased(guarded: &tollgate_redis::Guarded, trace: &Trace) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let ns = format!(
        "{}#lease{}",
        trace.name,
        RUN.fetch_add(1, Ordering::Relaxed)
    );
    let mem = MemoryStore::with_seed(10_000, 7, 11);
    let expired = || {
        guarded
            .lease_stats()
            .0
            .units_expired
            .load(Ordering::Relaxed)
    };
    let expired_before = expired();
    let mut latest = 0;
    let mut previous: Option<Micros> = None;
    for (i, step) in trace.steps.iter().enumerate() {
        // Units unused for `IDLE` go back (the probe's work, done here at the trace's time).
        if let Some(p) =
            previous.filter(|&p| step.t >= p + IDLE + PROBE_INTERVAL.as_micros() as Micros)
        {
            guarded.return_leases(p + IDLE).await;
        }
        previous = Some(step.t);
        // Units still in hand when their window ended were lost with it (under-admission): from
        // there on the counts differ, as documented.
        if expired() > expired_before {
            return;
        }
        let behind = step.t < latest;
        latest = latest.max(step.t);
        let keys: Vec<String> = step
            .reqs
            .iter()
            .map(|r| format!("{ns}|{}", r.key))
            .collect();
        let leased: Vec<Quota> = step
            .reqs
            .iter()
            .map(|r| r.quota.with_sync(tollgate_core::SyncMode::Lease))
            .collect();
        let exact: Vec<CheckItem<'_>> = step
            .reqs
            .iter()
            .zip(&keys)
            .map(|(r, k)| CheckItem {
                rule: "r",
                key: k,
                quota: &r.quota,
                cost: r.cost,
                shadow: r.shadow,
                count_denied: r.count_denied,
                tier: r.tier.as_ref().map(|(levels, index)| Tier {
                    levels,
                    index: *index,
                }),
            })
            .collect();
        let lease: Vec<CheckItem<'_>> = exact
            .iter()
            .zip(&leased)
            .map(|(e, quota)| CheckItem { quota, ..*e })
            .collect();
        let expected: Vec<Decision> = mem.check(step.t, &exact).unwrap();
        let got = guarded
            .check(step.t, &lease)
            .await
            .unwrap_or_else(|e| panic!("{}: step {i} at {}: store error {e}", trace.name, step.t));
        assert!(got.degraded.is_none(), "{}: step {i}: degraded", trace.name);
        let got = got.decisions;
        let same = got.len() == expected.len()
            && got
                .iter()
                .zip(&expected)
                .all(|(g, e)| lease_agrees(g, e, behind));
        // A shadow limit of a request the other limits admit (so it consumed): the units in
        // hand count as used, and it may report a denial the count without them would not.
        // (The other decisions on the same counter in that request follow from it.)
        let consumed = !tollgate_core::store::blocks(&lease, &got)
            && lease.iter().zip(&got).any(|(i, d)| d.allowed && i.cost > 0);
        if !same && consumed && lease.iter().any(|i| i.shadow) {
            return;
        }
        assert!(
            same,
            "{}: step {i} at t={} requests {:?}\nleased: {got:?}\nexact:  {expected:?}",
            trace.name, step.t, step.reqs
        );
    }
}

/// What a leased decision must share with the exact one (docs/distributed.md, "One instance"):
/// everything but `remaining` and `reset_after`, which count the units held in the lease as
/// used; and, with the clock `behind` a time seen before, only whether there is a
/// `retry_after` (a denial answered from memory counts its retry time on from the local clock,
/// where Redis counts from the later window it clamps to).
pub fn lease_agrees(leased: &Decision, exact: &Decision, behind: bool) -> bool {
    let retry_after = match (behind, leased.retry_after, exact.retry_after) {
        (true, Some(_), Some(e)) => Some(e),
        (_, l, _) => l,
    };
    Decision {
        remaining: exact.remaining,
        reset_after: exact.reset_after,
        retry_after,
        ..*leased
    } == *exact
}

/// The algorithms tiers work with.
pub const TIERED: [Algorithm; 2] = [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter];

/// Paid and free sharing 100: paid guaranteed 60, free 10 with a ceiling of 80 and a reserve
/// of 20 (docs/rules.md's example).
pub fn paid_free() -> Vec<TierLevel> {
    vec![
        TierLevel::new("paid", 60, 100, 0),
        TierLevel::new("free", 10, 80, 20),
    ]
}

/// A request of `cost` on the tiered counter `key` in tier `tier` of `levels`.
pub fn tiered(key: &str, quota: Quota, levels: &[TierLevel], tier: u8, cost: u64) -> Req {
    Req {
        tier: Some((levels.to_vec(), tier)),
        ..req(key, quota, cost)
    }
}

/// Hand-written traces of tiered limits, for each algorithm tiers work with: overload by paid
/// and free (interleaved, both far above the limit), free alone, windows rolling, the clock
/// going back, a tier past the last level, costs above the ceiling or what borrowing can
/// reach, queries, two tiers of one parent in one request, a blocking other limit, a shadowed
/// tiered item.
pub fn tiered_traces() -> Vec<Trace> {
    let t0 = at(2026, 11, 22, 4 * 3600 + 17 * 60) + 123_457;
    let mut out = Vec::new();
    let pf = paid_free();
    let three = vec![
        TierLevel::new("gold", 4, 10, 0),
        TierLevel::new("silver", 2, 6, 2),
        TierLevel::new("bronze", 0, 3, 3),
    ];
    for alg in TIERED {
        let q = Quota::new(100, Unit::Second).with_algorithm(alg);
        let small = Quota::new(10, Period::new(Unit::Minute, 1)).with_algorithm(alg);
        // Overload: each instant offers paid 3 and free 3, over five windows two apart (a
        // sliding window's previous one is empty).
        let mut steps = Vec::new();
        for w in 0..5u64 {
            for i in 0..40u64 {
                let t = t0 + 2 * w * SECOND + i * 20_000;
                for (tier, cost) in [(0u8, 1u64), (1, 1), (0, 2), (1, 2)] {
                    steps.push(Step {
                        t,
                        reqs: vec![tiered("api", q, &pf, tier, cost)],
                    });
                }
            }
        }
        out.push(Trace {
            name: format!("{alg} tiers overload"),
            steps,
        });
        // Free alone, then paid, then the next windows (partly weighted under the sliding
        // counter), then queries, oversized costs and a tier past the last level.
        let mut steps = Vec::new();
        let mut t = t0;
        for (tier, cost, dt) in [
            (1u8, 5u64, 0u64),
            (1, 7, 1_000),
            (1, 9, 1_000),
            (1, 1, 1_000),
            (0, 50, 1_000),
            (0, 30, 1_000),
            (0, 20, 1_000),
            (1, 0, 1_000),
            (0, 0, 1_000),
            (1, 81, 1_000),
            (1, 91, 1_000),
            (0, 101, 1_000),
            (7, 3, 1_000),
            (1, 4, 700_000),
            (0, 40, 300_000),
            (1, 10, 250_000),
            (1, 10, 250_000),
            (0, 60, 500_000),
            (1, 30, 3_000_000),
        ] {
            t += dt;
            steps.push(Step {
                t,
                reqs: vec![tiered("api", q, &pf, tier, cost)],
            });
        }
        out.push(Trace {
            name: format!("{alg} tiers free then paid"),
            steps,
        });
        // Three levels on a minute window; the clock goes back within and beyond a window.
        let mut steps = Vec::new();
        let mut t = t0 as i64;
        for (tier, cost, dt) in [
            (2u8, 1u64, 0i64),
            (2, 1, 1),
            (2, 1, 1),
            (2, 1, 1),
            (1, 2, 1),
            (1, 2, 1),
            (1, 2, 1),
            (0, 3, 1),
            (0, 3, 1),
            (0, 3, 1),
            (1, 1, 61 * SECOND as i64),
            (0, 5, -30 * SECOND as i64),
            (2, 1, -45 * SECOND as i64),
            (0, 1, 2 * MINUTE as i64),
            (1, 1, -10 * MINUTE as i64),
            (2, 2, 20 * SECOND as i64),
            (2, 1, 30 * MINUTE as i64),
        ] {
            t += dt;
            steps.push(Step {
                t: t as Micros,
                reqs: vec![tiered("three", small, &three, tier, cost)],
            });
        }
        out.push(Trace {
            name: format!("{alg} tiers three levels, clock back"),
            steps,
        });
        // Several items per request: two tiers of one parent, another limit that blocks (then
        // nothing is consumed), a shadowed tiered item.
        let other = Quota::new(3, Unit::Second).with_algorithm(Algorithm::FixedWindow);
        let mut steps = Vec::new();
        for i in 0..12u64 {
            let t = t0 + i * 100_000;
            steps.push(Step {
                t,
                reqs: vec![
                    tiered("api", q, &pf, 0, 20),
                    tiered("api", q, &pf, 1, 5),
                    req("other", other, 1),
                ],
            });
            steps.push(Step {
                t,
                reqs: vec![Req {
                    shadow: true,
                    ..tiered("api", q, &pf, 1, 15)
                }],
            });
            steps.push(Step {
                t,
                reqs: vec![
                    Req {
                        shadow: true,
                        ..tiered("api", q, &pf, 1, 30)
                    },
                    tiered("api", q, &pf, 0, 1),
                ],
            });
        }
        out.push(Trace {
            name: format!("{alg} tiers in multi-item requests"),
            steps,
        });
    }
    out
}

/// A random trace of tiered limits under `alg`: random levels (the rules' constraints kept),
/// requests of 1-3 items over one or two tiered counters and an untiered one, in random tiers
/// (some past the last level), time moving as in [`random_trace`].
pub fn random_tiered_trace(alg: Algorithm, backwards: bool) -> impl Strategy<Value = Trace> {
    let levels = (1u64..40, 1usize..5).prop_flat_map(|(limit, n)| {
        let level = (0u64..=limit, 0u64..=limit, 0u64..=limit);
        (Just(limit), proptest::collection::vec(level, n)).prop_map(|(limit, raw)| {
            let total: u64 = raw.iter().map(|(g, _, _)| *g).sum::<u64>().max(1);
            let levels: Vec<TierLevel> = raw
                .iter()
                .enumerate()
                .map(|(i, (g, c, r))| {
                    let g = if total > limit { g * limit / total } else { *g };
                    let r = if i == 0 { 0 } else { *r };
                    TierLevel::new(format!("t{i}"), g, (*c).max(g), r)
                })
                .collect();
            (limit, levels)
        })
    });
    let unit = prop_oneof![Just(Unit::Second), Just(Unit::Minute), Just(Unit::Hour)];
    let dt = prop_oneof![
        3 => Just(0i64),
        3 => 1i64..200_000,
        3 => 1i64..(2 * HOUR as i64),
        if backwards { 1 } else { 0 } => -(HOUR as i64)..0,
    ];
    let item = (0usize..3, 0u8..6, 0u64..15, proptest::bool::weighted(0.15));
    let step = (dt, proptest::collection::vec(item, 1..4));
    (
        levels,
        unit,
        1u32..3,
        proptest::collection::vec(step, 1..40),
        0u64..(40 * DAY),
    )
        .prop_map(move |((limit, levels), unit, mult, steps, start)| {
            let q = Quota::new(limit, Period::new(unit, mult)).with_algorithm(alg);
            let other = Quota::new(limit, Period::new(unit, mult)).with_algorithm(alg);
            let mut t = at(2026, 1, 1, 0) + start;
            let steps = steps
                .into_iter()
                .map(|(dt, items)| {
                    t = (t as i64 + dt) as Micros;
                    Step {
                        t,
                        reqs: items
                            .into_iter()
                            .map(|(k, tier, cost, sh)| {
                                let r = match k {
                                    0 | 1 => tiered(["a", "b"][k], q, &levels, tier, cost),
                                    _ => req("c", other, cost),
                                };
                                Req { shadow: sh, ..r }
                            })
                            .collect(),
                    }
                })
                .collect();
            Trace {
                name: format!("random tiered {alg}"),
                steps,
            }
        })
}
