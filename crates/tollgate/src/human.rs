//! Values printed for people rather than programs: durations as `1h 15m 45s` instead of a raw
//! millisecond count (JSON output and logs for machines keep their numbers), and text from
//! elsewhere (log lines, client keys, paths) escaped for a terminal.

use std::borrow::Cow;

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

/// `s` as [`Escaping`] writes it: safe to print on a terminal or in a text log line, whoever
/// wrote it (borrowed when nothing needed escaping).
pub fn escaped(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    let _ = std::fmt::Write::write_str(&mut Escaping(&mut out), s);
    Cow::Owned(out)
}

/// A writer that escapes what [`needs_escape`] names as it passes it on: `\n`, `\r`, `\t`,
/// the rest as `\u{1b}`.
pub struct Escaping<'a, W: std::fmt::Write>(pub &'a mut W);

impl<W: std::fmt::Write> std::fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut run = 0;
        for (i, c) in s.char_indices() {
            let escaped = match c {
                '\n' => "\\n",
                '\r' => "\\r",
                '\t' => "\\t",
                c if needs_escape(c) => "",
                _ => continue,
            };
            self.0.write_str(&s[run..i])?;
            if escaped.is_empty() {
                std::fmt::Write::write_fmt(self.0, format_args!("\\u{{{:x}}}", c as u32))?;
            } else {
                self.0.write_str(escaped)?;
            }
            run = i + c.len_utf8();
        }
        self.0.write_str(&s[run..])
    }
}

/// Control characters (C0, DEL, C1), the line and paragraph separators and the bidirectional
/// embeddings, overrides and isolates: what can break a line or change how a terminal shows it.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::{escaped, human_duration};

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

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escaped("user=alice é/ü"), "user=alice é/ü");
        assert!(matches!(escaped("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            escaped("a\nb\r\t\x1b]0;t\x07\u{9b}2J\u{7f}\u{202e}x"),
            "a\\nb\\r\\t\\u{1b}]0;t\\u{7}\\u{9b}2J\\u{7f}\\u{202e}x"
        );
    }
}
