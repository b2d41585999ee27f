//! Aligned windows: where the window containing an instant starts and ends.
//!
//! Fixed-window and sliding-window-counter limits count per window. Windows of seconds, minutes
//! and hours align to the Unix epoch (a 15-minute window starts at :00, :15, :30, :45 UTC); days,
//! weeks (starting Monday), months and years align to UTC calendar boundaries, so "10 per day"
//! resets at midnight UTC and "3 per month" on the 1st. Multipliers count from the epoch
//! (2-day windows start on even days since 1970-01-01).
//!
//! Calendar arithmetic is Howard Hinnant's `days_from_civil` / `civil_from_days`: exact, no
//! tables, no time-zone database.

use crate::clock::{Micros, SECOND};
use crate::quota::{Period, Unit};

const DAY: Micros = 86_400 * SECOND;

/// The half-open window `[start, end)` of `period` that contains `now`.
pub fn window(period: Period, now: Micros) -> (Micros, Micros) {
    let m = u64::from(period.multiplier.max(1));
    match period.unit {
        Unit::Second | Unit::Minute | Unit::Hour => {
            let len = period.unit.nominal() * m;
            let start = now - now % len;
            (start, start + len)
        }
        Unit::Day => {
            let len = DAY * m;
            let start = now - now % len;
            (start, start + len)
        }
        Unit::Week => {
            // 1970-01-01 was a Thursday; Monday 1969-12-29 is day -3.
            let day = (now / DAY) as i64 + 3;
            let week = day.div_euclid(7);
            let first = week - week.rem_euclid(m as i64);
            let start_day = first * 7 - 3;
            let end_day = start_day + 7 * m as i64;
            (day_start(start_day), day_start(end_day))
        }
        Unit::Month => {
            let (y, mo, _) = civil_from_days((now / DAY) as i64);
            let index = (y - 1970) * 12 + (mo as i64 - 1);
            let first = index - index.rem_euclid(m as i64);
            (month_start(first), month_start(first + m as i64))
        }
        Unit::Year => {
            let (y, _, _) = civil_from_days((now / DAY) as i64);
            let index = y - 1970;
            let first = index - index.rem_euclid(m as i64);
            (
                month_start(first * 12),
                month_start((first + m as i64) * 12),
            )
        }
    }
}

/// The window just before the one starting at `start`.
pub fn previous_start(period: Period, start: Micros) -> Micros {
    if start == 0 {
        return 0;
    }
    window(period, start - 1).0
}

fn day_start(day: i64) -> Micros {
    (day.max(0) as u64) * DAY
}

/// Start of month number `index` counted from January 1970.
fn month_start(index: i64) -> Micros {
    let y = 1970 + index.div_euclid(12);
    let m = index.rem_euclid(12) as u32 + 1;
    day_start(days_from_civil(y, m, 1))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date (year, month, day) of a day number since 1970-01-01.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(y: i64, m: u32, d: u32, secs: u64) -> Micros {
        day_start(days_from_civil(y, m, d)) + secs * SECOND
    }

    #[test]
    fn civil_round_trip() {
        for z in [-1000, 0, 1, 59, 60, 365, 11_016, 19_000, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }

    #[test]
    fn epoch_aligned_units() {
        let now = at(2026, 11, 22, 3_600 * 4 + 60 * 17 + 42) + 123;
        assert_eq!(
            window(Unit::Minute.into(), now).0,
            at(2026, 11, 22, 3_600 * 4 + 60 * 17)
        );
        let (s, e) = window(Period::new(Unit::Minute, 15), now);
        assert_eq!(
            (s, e),
            (
                at(2026, 11, 22, 3_600 * 4 + 900),
                at(2026, 11, 22, 3_600 * 4 + 1_800)
            )
        );
        assert_eq!(
            window(Unit::Second.into(), 2_500_000),
            (2_000_000, 3_000_000)
        );
    }

    #[test]
    fn calendar_units() {
        let now = at(2026, 11, 22, 12 * 3_600);
        let feb = at(2024, 2, 10, 0);
        // (unit, instant, its window's start and end as (year, month, day))
        let cases = [
            (Unit::Day, now, (2026, 11, 22), (2026, 11, 23)),
            // 2026-11-22 is a Sunday: its week started Monday 2026-11-16.
            (Unit::Week, now, (2026, 11, 16), (2026, 11, 23)),
            (Unit::Month, now, (2026, 11, 1), (2026, 12, 1)),
            (Unit::Year, now, (2026, 1, 1), (2027, 1, 1)),
            (Unit::Month, feb, (2024, 2, 1), (2024, 3, 1)),
        ];
        for (unit, instant, (sy, sm, sd), (ey, em, ed)) in cases {
            assert_eq!(
                window(unit.into(), instant),
                (at(sy, sm, sd, 0), at(ey, em, ed, 0)),
                "{unit} at {instant}"
            );
        }
        // A Monday starts its own week.
        let monday = at(2026, 11, 16, 0);
        assert_eq!(window(Unit::Week.into(), monday).0, monday);
    }

    #[test]
    fn previous_windows() {
        let now = at(2026, 3, 15, 0);
        let (s, _) = window(Unit::Month.into(), now);
        assert_eq!(previous_start(Unit::Month.into(), s), at(2026, 2, 1, 0));
        assert_eq!(
            previous_start(Unit::Year.into(), at(2026, 1, 1, 0)),
            at(2025, 1, 1, 0)
        );
    }

    #[test]
    fn every_window_contains_now() {
        for unit in Unit::ALL {
            for mult in [1, 2, 3, 7] {
                for now in [
                    0,
                    1,
                    59 * SECOND,
                    1_764_000_000 * SECOND + 17,
                    4_000_000_000 * SECOND,
                ] {
                    let (s, e) = window(Period::new(unit, mult), now);
                    assert!(s <= now && now < e, "{unit} x{mult} at {now}: [{s}, {e})");
                }
            }
        }
    }
}
