//! Values printed for people rather than programs: durations as `1h 15m 45s` instead of a raw
//! millisecond count (JSON output and logs for machines keep their numbers).

/// A duration in milliseconds as people read it: `250ms`, `2.5s`, `45s`, `1h 15m 45s`,
/// `2d 3h` (zero parts are left out; whole seconds from a minute up).
pub fn human_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        let (s, tenths) = (ms / 1000, (ms % 1000) / 100);
        return if tenths == 0 {
            format!("{s}s")
        } else {
            format!("{s}.{tenths}s")
        };
    }
    let secs = ms / 1000;
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations() {
        assert_eq!(human_duration(0), "0ms");
        assert_eq!(human_duration(250), "250ms");
        assert_eq!(human_duration(1000), "1s");
        assert_eq!(human_duration(2500), "2.5s");
        assert_eq!(human_duration(60_000), "1m");
        assert_eq!(human_duration(4_544_976), "1h 15m 44s");
        assert_eq!(human_duration(4_545_000), "1h 15m 45s");
        assert_eq!(human_duration(90_061_000), "1d 1h 1m 1s");
    }
}
