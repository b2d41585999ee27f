//! Helpers shared by the property tests of the algorithms (each test binary uses what it needs).

#![allow(dead_code)]

use tollgate_core::Micros;

/// Largest admitted cost in any window `(t - len, t]`, over every `t` that is an admission time
/// (`adm`: the admitted `(time, cost)`s).
pub fn max_in_rolling_window(adm: &[(Micros, u64)], len: Micros) -> u64 {
    adm.iter()
        .map(|&(t, _)| {
            adm.iter()
                .filter(|&&(u, _)| u <= t && u + len > t)
                .map(|&(_, c)| c)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}
