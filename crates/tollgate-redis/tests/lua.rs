//! The Lua helpers on their own, run by the real Redis (EVAL) against their Rust originals:
//! exact `floor(a·b/c)` beyond 2^53 (`muldiv`), `idiv`, and the epoch/calendar windows.

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
