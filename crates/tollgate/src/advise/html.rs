//! `advise --html`: the report as one self-contained page (inline SVG and CSS, no script, no
//! external asset), written as well-formed XML so any XML parser can read it.

use super::replay::Timeline;
use super::report::Report;
use super::svg::{bar_chart, esc, step_chart, Series};
use super::Measured;
use std::fmt::Write;

const STYLE: &str = "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;\
color:#222}h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc}\
pre{background:#f6f6f6;padding:.8em;overflow-x:auto}table{border-collapse:collapse}\
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th:first-child,td:first-child{text-align:left}\
figure{margin:1em 0}";

/// The x axis of a timeline: its unit's name and length in microseconds, from its span.
fn time_unit(t: &Timeline) -> (&'static str, f64) {
    let span = t.res_us as f64 * t.bins.len() as f64;
    if span > 2.0 * 3600e6 {
        ("hours", 3600e6)
    } else if span > 600e6 {
        ("minutes", 60e6)
    } else {
        ("seconds", 1e6)
    }
}

/// Column `col` of a timeline as a series of counts per second (so any resolution reads the
/// same), over the unit's time.
fn rate_series(name: &str, t: &Timeline, col: usize, unit: f64) -> Series {
    let per_s = 1e6 / t.res_us as f64;
    let mut points: Vec<(f64, f64)> = t
        .bins
        .iter()
        .enumerate()
        .map(|(i, b)| (i as f64 * t.res_us as f64 / unit, b[col] as f64 * per_s))
        .collect();
    if let Some(&(x, y)) = points.last() {
        points.push((x + t.res_us as f64 / unit, y));
    }
    Series {
        name: name.to_owned(),
        points,
    }
}

/// Log-2 classes of peaks: `1`, `2`, `3-4`, `5-8`, ... and how many clients fall in each.
fn histogram(peaks: &[u32]) -> (Vec<String>, Vec<f64>) {
    let max = peaks.last().copied().unwrap_or(0);
    let mut cats = Vec::new();
    let mut counts = Vec::new();
    let mut lo = 1u64;
    let mut hi = 1u64;
    loop {
        let n = peaks
            .iter()
            .filter(|&&p| u64::from(p) >= lo && u64::from(p) <= hi)
            .count();
        cats.push(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        });
        counts.push(n as f64);
        if hi >= u64::from(max) {
            break;
        }
        lo = hi + 1;
        hi *= 2;
    }
    (cats, counts)
}

pub(crate) fn page(report: &Report, m: &Measured) -> String {
    let mut p = String::new();
    let _ = write!(
        p,
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\
         <meta charset=\"utf-8\"/><title>tollgate advise</title><style>{STYLE}</style></head>\n<body>\n\
         <h1>tollgate advise</h1>\n<p>{} requests in {} lines over {}; {} malformed.</p>\n",
        m.requests,
        m.lines,
        super::report::span(m),
        m.malformed
    );
    let (unit_name, unit) = time_unit(&m.traffic);
    let _ = write!(
        p,
        "<h2>Traffic</h2>\n<figure id=\"traffic\">{}</figure>\n",
        step_chart(
            "Requests per second",
            &format!("{unit_name} since the first request"),
            "requests/s",
            &[rate_series("requests", &m.traffic, 0, unit)],
        )
    );
    for (g, gm) in report.groups.iter().zip(&m.groups) {
        let s = &g.suggestion;
        let (cats, counts) = histogram(&gm.peaks(s.window_index));
        let _ = write!(
            p,
            "<h2>Key {}</h2>\n<p>{} clients, {} requests. Suggested: <b>{} per {}</b> (p99 {} plus {}%); \
             it would deny {} client(s).{}</p>\n<figure class=\"distribution\">{}</figure>\n\
             <table><tr><th>window</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>\n",
            esc(&g.key),
            g.clients,
            g.requests,
            s.limit,
            esc(&s.window),
            s.p99,
            report.headroom,
            s.clients_over,
            {
                let mut notes = String::new();
                if let Some(h) = &s.heavy {
                    let names: Vec<String> = h.named.iter().map(|(k, _)| esc(k)).collect();
                    let _ = write!(
                        notes,
                        " Heavy hitters (left out of the p99): {} client(s) send {:.0} % of \
                         requests: {}.",
                        h.count,
                        h.percent,
                        names.join(", ")
                    );
                }
                if s.sample < super::stats::SMALL_SAMPLE {
                    let _ = write!(
                        notes,
                        " A small sample ({} clients): the p99 is the busiest one's peak; \
                         take the limit as a first guess.",
                        s.sample
                    );
                }
                if let Some(b) = &s.bursty {
                    let _ = write!(
                        notes,
                        " Bursty: {} client(s) peak at up to {} requests in {}: a token bucket \
                         with burst {} fits better than a window.",
                        b.count,
                        b.largest,
                        esc(&b.short),
                        s.burst.unwrap_or(0)
                    );
                }
                notes
            },
            bar_chart(
                &format!("Clients by peak requests per {}", s.window),
                &format!("peak requests in one {}", s.window),
                "clients",
                &cats,
                &[("clients".to_owned(), counts)],
            )
        );
        for w in &g.windows {
            let _ = writeln!(
                p,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&w.name),
                w.p50,
                w.p90,
                w.p99,
                w.max
            );
        }
        let _ = write!(p, "</table>\n<pre>{}</pre>\n", esc(&s.yaml));
    }
    if let Some(r) = &m.replay {
        let _ = writeln!(
            p,
            "<h2>Replay through {}</h2>",
            esc(report.rules_path.as_deref().unwrap_or("the rules"))
        );
        for rule in r.reports() {
            let own = &rule.outcomes[0];
            let (unit_name, unit) = time_unit(&own.timeline);
            let _ = writeln!(
                p,
                "<figure class=\"rule\">{}</figure>",
                step_chart(
                    &format!(
                        "{} ({}): admitted and denied per second",
                        rule.id, own.algorithm
                    ),
                    &format!("{unit_name} since the rule's first request"),
                    "requests/s",
                    &[
                        rate_series("admitted", &own.timeline, 0, unit),
                        rate_series("denied", &own.timeline, 1, unit),
                    ],
                )
            );
        }
        if r.reports().first().is_some_and(|x| x.outcomes.len() > 1) {
            let cats: Vec<String> = r.reports().iter().map(|x| x.id.clone()).collect();
            let series: Vec<(String, Vec<f64>)> = r.reports()[0]
                .outcomes
                .iter()
                .enumerate()
                .skip(1)
                .map(|(i, o)| {
                    (
                        o.algorithm.as_str().to_owned(),
                        r.reports()
                            .iter()
                            .map(|x| x.outcomes[i].denied as f64)
                            .collect(),
                    )
                })
                .collect();
            let _ = writeln!(
                p,
                "<figure id=\"algorithms\">{}</figure>",
                bar_chart(
                    "Denied requests per rule, by algorithm",
                    "rule",
                    "denied requests",
                    &cats,
                    &series
                )
            );
        }
        p.push_str("<table><tr><th>rule</th><th>algorithm</th><th>requests</th><th>denied</th><th>clients denied</th></tr>\n");
        for rule in r.reports() {
            for (i, o) in rule.outcomes.iter().enumerate() {
                let _ = writeln!(
                    p,
                    "<tr><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&rule.id),
                    o.algorithm,
                    if i == 0 { " (as written)" } else { "" },
                    o.requests,
                    o.denied,
                    o.denied_clients.len()
                );
            }
        }
        p.push_str("</table>\n");
    }
    let _ = write!(
        p,
        "<h2>Report</h2>\n<pre>{}</pre>\n</body>\n</html>\n",
        esc(&report.table(m))
    );
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_classes_double() {
        let (cats, counts) = histogram(&[1, 1, 2, 3, 9]);
        assert_eq!(cats, ["1", "2", "3-4", "5-8", "9-16"]);
        assert_eq!(counts, [2.0, 1.0, 1.0, 0.0, 1.0]);
    }
}
