//! The Lua helpers on their own, run by the real Redis (EVAL) against their Rust originals:
//! exact `floor(a·b/c)` beyond 2^53 (`muldiv`), `idiv`, the epoch/calendar windows, and the
//! tiered step (`tiers.lua`) on arbitrary states against `algorithm/tiers.rs`.

mod support;

use proptest::prelude::*;
use tollgate_core::internals::{previous_start, window};
use tollgate_core::{Micros, Period, Unit};

const COMMON: &str = include_str!("../scripts/common.lua");

fn eval(body: &str, args: &[u64]) -> Vec<i64> {
    let mut con = redis::Client::open(support::shared_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(format!("{COMMON}\nbind()\n{body}")).arg(0);
    for a in args {
        cmd.arg(a.to_string());
    }
    cmd.query(&mut con).unwrap()
}

const UNITS: [Unit; 7] = Unit::ALL;

fn unit_code(u: Unit) -> u64 {
    UNITS.iter().position(|&x| x == u).unwrap() as u64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn muldiv_is_exact(
        batch in proptest::collection::vec(
            (0u64..(1 << 53), 0u64..(1 << 53), 1u64..(1 << 53)), 32)
    ) {
        // Keep quotients below 2^53, as the scripts guarantee.
        let cases: Vec<(u64, u64, u64)> = batch
            .into_iter()
            .map(|(a, b, c)| {
                let q = u128::from(a) * u128::from(b) / u128::from(c);
                if q >= 1 << 53 { (a >> 20, b >> 20, c) } else { (a, b, c) }
            })
            .filter(|&(a, b, c)| u128::from(a) * u128::from(b) / u128::from(c) < 1 << 53)
            .collect();
        let args: Vec<u64> = cases.iter().flat_map(|&(a, b, c)| [a, b, c]).collect();
        let got = eval(
            "local out = {}
             for i = 1, #ARGV, 3 do
               local q, r = muldiv(tonumber(ARGV[i]), tonumber(ARGV[i+1]), tonumber(ARGV[i+2]))
               out[#out+1] = q; out[#out+1] = r
               out[#out+1] = idiv(tonumber(ARGV[i+2]), (tonumber(ARGV[i]) % 1000) + 1)
             end
             return out",
            &args,
        );
        for (i, &(a, b, c)) in cases.iter().enumerate() {
            let p = u128::from(a) * u128::from(b);
            prop_assert_eq!(got[3 * i] as u128, p / u128::from(c), "q of {} {} {}", a, b, c);
            prop_assert_eq!(got[3 * i + 1] as u128, p % u128::from(c), "r of {} {} {}", a, b, c);
            prop_assert_eq!(got[3 * i + 2] as u64, c / (a % 1000 + 1));
        }
    }

    #[test]
    fn windows_match_rust(
        batch in proptest::collection::vec(
            (0usize..7, 1u32..13, 0u64..(4_000_000_000u64 * 1_000_000)), 32)
    ) {
        let args: Vec<u64> = batch
            .iter()
            .flat_map(|&(u, m, now)| {
                let p = Period::new(UNITS[u], m);
                [unit_code(UNITS[u]), u64::from(m), p.nominal(), now]
            })
            .collect();
        let got = eval(
            "local out = {}
             for i = 1, #ARGV, 4 do
               local p = { unit = tonumber(ARGV[i]), mult = tonumber(ARGV[i+1]),
                           len = tonumber(ARGV[i+2]) }
               local s, e = window(p, tonumber(ARGV[i+3]))
               out[#out+1] = s; out[#out+1] = e; out[#out+1] = previous_start(p, s)
             end
             return out",
            &args,
        );
        for (i, &(u, m, now)) in batch.iter().enumerate() {
            let p = Period::new(UNITS[u], m);
            let (s, e): (Micros, Micros) = window(p, now);
            prop_assert_eq!((got[3 * i] as u64, got[3 * i + 1] as u64), (s, e), "{} x{} at {}", UNITS[u], m, now);
            prop_assert_eq!(got[3 * i + 2] as u64, previous_start(p, s));
        }
    }
}

/// The scripts the tiered step needs: the sliding window counter's helpers, then its own.
const TIERS: &str = concat!(
    include_str!("../scripts/sliding_counter.lua"),
    include_str!("../scripts/tiers.lua")
);

/// One tiered case: quota (limit, unit index, multiplier, sliding), levels, state (start
/// offset in windows from now's, per-tier prev and cur), now, cost, tier.
type TierCase = (
    (u64, usize, u32, bool),
    Vec<(u64, u64, u64)>,
    Option<(i64, Vec<(u64, u64)>)>,
    Micros,
    u64,
    u8,
);

fn tier_case() -> impl Strategy<Value = TierCase> {
    (
        (0u64..60, 0usize..3, 1u32..3, proptest::bool::ANY),
        proptest::collection::vec((0u64..70, 0u64..70, 0u64..70), 1..5),
        proptest::option::of((
            -3i64..3,
            proptest::collection::vec((0u64..70, 0u64..70), 1..5),
        )),
        1_700_000_000_000_000u64..1_800_000_000_000_000,
        0u64..80,
        0u8..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary levels (the rules' constraints not kept) and states (of another number of
    /// tiers too, or ahead of the clock): the Lua step decides and leaves what the Rust one does.
    #[test]
    fn tiered_step_matches_rust(batch in proptest::collection::vec(tier_case(), 16)) {
        use tollgate_core::internals::tiers::{step, Tiered};
        use tollgate_core::rules::TierLevel;
        use tollgate_core::{Algorithm, Quota};
        let mut args: Vec<u64> = Vec::new();
        let mut want = Vec::new();
        for ((limit, u, m, sliding), levels, state, now, cost, tier) in &batch {
            let alg = if *sliding { Algorithm::SlidingWindowCounter } else { Algorithm::FixedWindow };
            let p = Period::new(UNITS[*u], *m);
            let quota = Quota::new(*limit, p).with_algorithm(alg);
            let lv: Vec<TierLevel> = levels.iter().map(|&(g, c, r)| TierLevel::new("", g, c, r)).collect();
            let st = state.as_ref().map(|(off, counts)| {
                let (ws, _) = window(p, *now);
                let start = if *off >= 0 {
                    (0..*off).fold(ws, |s, _| window(p, s).1)
                } else {
                    (0..-off).fold(ws, |s, _| previous_start(p, s))
                };
                Tiered { start, prev: counts.iter().map(|c| c.0).collect(), cur: counts.iter().map(|c| c.1).collect() }
            });
            let (d, next) = step(st.clone(), *now, *cost, &quota, &lv, *tier);
            want.push((d, next));
            args.extend([unit_code(UNITS[*u]), u64::from(*m), p.nominal(), *limit, u64::from(*sliding), u64::from(*tier), *now, *cost]);
            args.push(lv.len() as u64);
            for l in &lv { args.extend([l.guaranteed, l.ceiling, l.reserve]); }
            match &st {
                None => args.push(0),
                Some(s) => {
                    args.extend([1, s.start, s.cur.len() as u64]);
                    for (a, b) in s.prev.iter().zip(&s.cur) { args.extend([*a, *b]); }
                }
            }
        }
        let body = format!("{TIERS}
             local out = {{}}
             local i = 1
             local function nx() local v = tonumber(ARGV[i]); i = i + 1; return v end
             while i <= #ARGV do
               local p = {{ unit = nx(), mult = nx(), len = nx(), limit = nx() }}
               p.sliding = nx() == 1
               p.tier = nx()
               local now, cost = nx(), nx()
               p.levels = {{}}
               for l = 1, nx() do p.levels[l] = {{ nx(), nx(), nx() }} end
               local st = nil
               if nx() == 1 then
                 st = {{ start = nx(), prev = {{}}, cur = {{}} }}
                 for l = 1, nx() do st.prev[l] = nx(); st.cur[l] = nx() end
               end
               local d, keep = tr_step(st, now, cost, p)
               local a = 0
               if d.allowed then a = 1 end
               out[#out+1] = a; out[#out+1] = d.limit; out[#out+1] = d.remaining
               out[#out+1] = d.reset; out[#out+1] = d.retry or -1
               if keep == nil then out[#out+1] = '' else out[#out+1] = tr_encode(keep) end
             end
             return out");
        let mut con = redis::Client::open(support::shared_url()).unwrap().get_connection().unwrap();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(format!("{COMMON}\nbind()\n{body}")).arg(0);
        for a in &args { cmd.arg(a.to_string()); }
        let got: Vec<redis::Value> = cmd.query(&mut con).unwrap();
        let int = |v: &redis::Value| match v { redis::Value::Int(i) => *i, other => panic!("{other:?}") };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("{other:?}"),
        };
        for (i, (d, next)) in want.iter().enumerate() {
            let g = &got[6 * i..6 * i + 6];
            let retry = int(&g[4]);
            prop_assert_eq!(
                (int(&g[0]) == 1, int(&g[1]) as u64, int(&g[2]) as u64, int(&g[3]) as u64, (retry >= 0).then_some(retry as u64)),
                (d.allowed, d.limit, d.remaining, d.reset_after, d.retry_after),
                "case {:?}", batch[i]
            );
            let encoded = next.as_ref().map(|s| {
                let mut out = s.start.to_string();
                for (a, b) in s.prev.iter().zip(&s.cur) { out.push_str(&format!(" {a} {b}")); }
                out
            }).unwrap_or_default();
            prop_assert_eq!(text(&g[5]), encoded, "case {:?}", batch[i]);
        }
    }
}
