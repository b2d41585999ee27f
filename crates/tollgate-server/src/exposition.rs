//! The one writer of `/metrics`: the Prometheus text exposition format (version 0.0.4).
//!
//! Every subsystem that exports series (the decision counters, the stores, the registry, xDS,
//! the quota server, traces, a decision policy) writes them through an [`Exposition`]: a family
//! is opened with its name, type and help, then its samples are written with their labels.
//! Label values are escaped here and nowhere else (`\`, `"` and newline, as the format asks),
//! so a client-controlled value (a domain, a descriptor value in a stats key, a bucket id)
//! cannot break a line or forge a series.
//!
//! Why not a metrics crate: the series' names and types are a public contract (dashboards, alert
//! rules, and envoyproxy/ratelimit's names with counters that do not end in `_total`), and the
//! counters are plain atomics resolved once per rule set so that a decision never looks a
//! series up. A registry crate would rename those counters or write OpenMetrics instead of this
//! format, and would add a lookup per decision; this module only writes text at scrape time.

use std::fmt::{Display, Write as _};

/// A metric family's type, as its `# TYPE` line states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// A value that only grows.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count ([`Family::histogram`]).
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A `/metrics` page being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty page with room for `bytes`.
    pub fn with_capacity(bytes: usize) -> Self {
        Exposition {
            out: String::with_capacity(bytes),
        }
    }

    /// Open a family: its `# HELP` and `# TYPE` lines; write its samples with the returned
    /// [`Family`]. `name` and `help` are the exporter's own text, not escaped.
    pub fn family<'a>(&'a mut self, name: &'a str, kind: Kind, help: &str) -> Family<'a> {
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.as_str()
        );
        Family {
            out: &mut self.out,
            name,
        }
    }

    /// A family of one sample without labels.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) {
        self.family(name, kind, help).sample(&[], value);
    }

    /// Append text an [`Exposition`] wrote earlier ([`Exposition::into_string`]), e.g. rows kept
    /// from the last rule reload.
    pub(crate) fn append(&mut self, written: &str) {
        self.out.push_str(written);
    }

    /// The page.
    pub fn into_string(self) -> String {
        self.out
    }
}

/// The samples of one family ([`Exposition::family`]).
#[derive(Debug)]
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl Family<'_> {
    /// One sample: `name{labels} value` (no braces without labels).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        self.line("", labels, None, value);
        self
    }

    /// A histogram's series under `labels`: one `_bucket` per `(upper bound, count at or below
    /// it)` (cumulative, ascending), the `+Inf` bucket holding `count`, then `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        labels: &[(&str, &str)],
        buckets: impl IntoIterator<Item = (f64, u64)>,
        sum: f64,
        count: u64,
    ) -> &mut Self {
        let mut le = String::new();
        for (bound, n) in buckets {
            le.clear();
            let _ = write!(le, "{bound}");
            self.line("_bucket", labels, Some(&le), n);
        }
        self.line("_bucket", labels, Some("+Inf"), count);
        self.line("_sum", labels, None, sum);
        self.line("_count", labels, None, count);
        self
    }

    fn line(
        &mut self,
        suffix: &str,
        labels: &[(&str, &str)],
        le: Option<&str>,
        value: impl Display,
    ) {
        let out = &mut *self.out;
        out.push_str(self.name);
        out.push_str(suffix);
        let le = le.map(|v| ("le", v));
        let mut all = labels.iter().copied().chain(le).peekable();
        if all.peek().is_some() {
            out.push('{');
            for (i, (name, value)) in all.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(name);
                out.push_str("=\"");
                escape_into(out, value);
                out.push('"');
            }
            out.push('}');
        }
        let _ = writeln!(out, " {value}");
    }
}

/// Append `value` escaped as a label value: `\` and `"` get a backslash, a newline is `\n`.
fn escape_into(out: &mut String, value: &str) {
    if !value.contains(['\\', '"', '\n']) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_in_the_text_format() {
        let mut page = Exposition::default();
        page.family("t_hits", Kind::Counter, "Hits.")
            .sample(&[("domain", "a"), ("rule", "b")], 3)
            .sample(&[], 4);
        page.family("t_wait_seconds", Kind::Histogram, "Waits.")
            .histogram(&[("rule", "r")], [(0.5, 1), (1.0, 2)], 1.25, 3);
        page.single("t_up", Kind::Gauge, "Up.", 1);
        assert_eq!(
            page.into_string(),
            "# HELP t_hits Hits.\n# TYPE t_hits counter\n\
             t_hits{domain=\"a\",rule=\"b\"} 3\nt_hits 4\n\
             # HELP t_wait_seconds Waits.\n# TYPE t_wait_seconds histogram\n\
             t_wait_seconds_bucket{rule=\"r\",le=\"0.5\"} 1\n\
             t_wait_seconds_bucket{rule=\"r\",le=\"1\"} 2\n\
             t_wait_seconds_bucket{rule=\"r\",le=\"+Inf\"} 3\n\
             t_wait_seconds_sum{rule=\"r\"} 1.25\nt_wait_seconds_count{rule=\"r\"} 3\n\
             # HELP t_up Up.\n# TYPE t_up gauge\nt_up 1\n"
        );
    }

    #[test]
    fn a_label_value_cannot_end_its_line_or_its_quotes() {
        let mut page = Exposition::default();
        page.family("t", Kind::Gauge, "T.")
            .sample(&[("v", "a\"} 9\nforged{x=\"\\")], 1);
        let text = page.into_string();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            text.ends_with("t{v=\"a\\\"} 9\\nforged{x=\\\"\\\\\"} 1\n"),
            "{text}"
        );
    }
}
