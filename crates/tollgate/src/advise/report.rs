//! The advice, computed once from what was measured and rendered as a terminal table or JSON
//! (the HTML page adds plots, in [`super::html`]).

use super::replay::COMPARED;
use super::stats::{
    human_at_least, percentile, Group, Part, BURST_MIN, BURST_RATIO, HEAVY_FAIR, HEAVY_SHARE,
    SMALL_SAMPLE,
};
use super::{AdviseArgs, Measured};
use crate::human::escaped;
use serde_json::{json, Value};
use std::fmt::Write;

/// How many clients are named in a list (busiest, over the limit, bursty).
const NAMED: usize = 5;

pub(crate) struct WindowStats {
    pub name: String,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
}

pub(crate) struct Bursty {
    pub short: String,
    pub count: usize,
    pub largest: u32,
    pub examples: Vec<(String, u32)>,
}

/// The heavy hitters of a key: named apart, and left out of the percentile.
pub(crate) struct Heavy {
    /// Their keys and requests, most first (at most [`NAMED`]).
    pub named: Vec<(String, u64)>,
    pub count: usize,
    pub requests: u64,
    /// Their share of the requests tracked per client, in percent.
    pub percent: f64,
}

pub(crate) struct Suggestion {
    pub window: String,
    pub window_index: usize,
    /// The 99th percentile of the peaks of the clients other than the heavy hitters.
    pub p99: u32,
    /// How many clients that percentile is over.
    pub sample: usize,
    pub heavy: Option<Heavy>,
    pub limit: u64,
    pub clients_over: usize,
    pub requests_over: u64,
    pub over: Vec<String>,
    pub bursty: Option<Bursty>,
    pub algorithm: &'static str,
    pub burst: Option<u64>,
    pub yaml: String,
}

pub(crate) struct GroupReport {
    pub key: String,
    pub clients: usize,
    pub requests: u64,
    pub untracked: u64,
    pub windows: Vec<WindowStats>,
    pub top: Vec<(String, u64, Vec<u32>)>,
    pub suggestion: Suggestion,
}

pub(crate) struct Report {
    pub headroom: u64,
    pub max_clients: u64,
    pub groups: Vec<GroupReport>,
    pub rules_path: Option<String>,
}

/// `(unit, multiplier)` of a window for a rules file.
fn unit_of(us: u64) -> (&'static str, u64) {
    let s = us / 1_000_000;
    for (name, len) in [("day", 86_400), ("hour", 3600), ("minute", 60)] {
        if s % len == 0 {
            return (name, s / len);
        }
    }
    ("second", s)
}

/// A descriptor key for a header name: lower case, `-` as `_`.
fn snake(h: &str) -> String {
    h.to_ascii_lowercase().replace('-', "_")
}

/// The rules file suggested for one key: its `http` section (how a request yields the key) and
/// the descriptors (one level per part) with the limit on the last.
fn yaml(
    domain: &str,
    g: &Group,
    limit: u64,
    unit: (&str, u64),
    algorithm: &str,
    burst: Option<u64>,
) -> String {
    let mut actions = Vec::new();
    let mut keys = Vec::new();
    for p in &g.spec.parts {
        let (action, key) = match p {
            Part::Ip => (
                "{remote_address: {}}".to_string(),
                "remote_address".to_string(),
            ),
            Part::Path => (
                "{request_headers: {header_name: ':path', descriptor_key: path}}".into(),
                "path".into(),
            ),
            Part::Method => (
                "{request_headers: {header_name: ':method', descriptor_key: method}}".into(),
                "method".into(),
            ),
            Part::Host => (
                "{request_headers: {header_name: ':authority', descriptor_key: host}}".into(),
                "host".into(),
            ),
            Part::Header(h) => (
                format!(
                    "{{request_headers: {{header_name: {}, descriptor_key: {}}}}}",
                    h.to_ascii_lowercase(),
                    snake(h)
                ),
                snake(h),
            ),
            Part::Entry(k) => (String::new(), k.clone()),
            Part::Descriptor => (String::new(), "descriptor".into()),
        };
        if !action.is_empty() {
            actions.push(action);
        }
        keys.push(key);
    }
    let mut y = format!("domain: {domain}\n");
    if !actions.is_empty() {
        let _ = writeln!(y, "http:\n  - actions: [{}]", actions.join(", "));
    }
    y.push_str("descriptors:\n");
    let mut indent = String::from("  ");
    for (i, k) in keys.iter().enumerate() {
        let _ = writeln!(y, "{indent}- key: {k}");
        if i + 1 < keys.len() {
            let _ = writeln!(y, "{indent}  descriptors:");
            indent.push_str("    ");
        }
    }
    let mut rl = format!("unit: {}, requests_per_unit: {limit}", unit.0);
    if unit.1 != 1 {
        let _ = write!(rl, ", unit_multiplier: {}", unit.1);
    }
    if algorithm != "sliding_window_counter" {
        let _ = write!(rl, ", algorithm: {algorithm}");
    }
    if let Some(b) = burst {
        let _ = write!(rl, ", burst: {b}");
    }
    let _ = writeln!(y, "{indent}  rate_limit: {{{rl}}}");
    y
}

impl Report {
    pub(crate) fn build(args: &AdviseArgs, m: &Measured) -> Report {
        let windows = &m.windows;
        // The suggestion's window: the first of at least a minute, else the longest.
        let primary = windows
            .iter()
            .position(|w| w.us >= 60_000_000)
            .unwrap_or_else(|| {
                (0..windows.len())
                    .max_by_key(|&i| windows[i].us)
                    .unwrap_or(0)
            });
        let short = (0..windows.len())
            .min_by_key(|&i| windows[i].us)
            .filter(|&i| windows[i].us < windows[primary].us);
        let groups = m
            .groups
            .iter()
            .map(|g| {
                let stats: Vec<WindowStats> = windows
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let peaks = g.peaks(i);
                        WindowStats {
                            name: w.name.clone(),
                            p50: percentile(&peaks, 50),
                            p90: percentile(&peaks, 90),
                            p99: percentile(&peaks, 99),
                            max: peaks.last().copied().unwrap_or(0),
                        }
                    })
                    .collect();
                let heavy = g.heavy();
                let skip: Vec<u32> = heavy.iter().map(|h| h.2).collect();
                let sample_peaks = g.peaks_without(primary, &skip);
                let p99 = percentile(&sample_peaks, 99);
                let heavy = (!heavy.is_empty()).then(|| {
                    let requests: u64 = heavy.iter().map(|h| h.1).sum();
                    Heavy {
                        count: heavy.len(),
                        requests,
                        percent: requests as f64 * 100.0 / g.tracked().max(1) as f64,
                        named: heavy.into_iter().take(NAMED).map(|h| (h.0, h.1)).collect(),
                    }
                });
                let limit = human_at_least(f64::from(p99) * (100 + args.headroom) as f64 / 100.0);
                let (over, clients_over, requests_over) = g.over(primary, limit, NAMED);
                let bursty = short.and_then(|s| {
                    let (examples, count, largest) = g.bursty(
                        (s, windows[s].us),
                        (primary, windows[primary].us),
                        limit,
                        NAMED,
                    );
                    (count > 0).then(|| Bursty {
                        short: windows[s].name.clone(),
                        count,
                        largest,
                        examples,
                    })
                });
                let (algorithm, burst) = match &bursty {
                    Some(b) => (
                        "token_bucket",
                        Some(
                            human_at_least(
                                f64::from(b.largest) * (100 + args.headroom) as f64 / 100.0,
                            )
                            .min(limit),
                        ),
                    ),
                    None => ("sliding_window_counter", None),
                };
                let unit = unit_of(windows[primary].us);
                GroupReport {
                    key: g.spec.name.clone(),
                    clients: g.clients(),
                    requests: g.total,
                    untracked: g.untracked,
                    top: g.top(NAMED),
                    suggestion: Suggestion {
                        window: windows[primary].name.clone(),
                        window_index: primary,
                        p99,
                        sample: sample_peaks.len(),
                        heavy,
                        limit,
                        clients_over,
                        requests_over,
                        over,
                        yaml: yaml(&args.domain, g, limit, unit, algorithm, burst),
                        bursty,
                        algorithm,
                        burst,
                    },
                    windows: stats,
                }
            })
            .collect();
        Report {
            headroom: args.headroom,
            max_clients: args.max_clients,
            groups,
            rules_path: args.rules.as_ref().map(|p| p.display().to_string()),
        }
    }

    pub(crate) fn table_into(&self, m: &Measured, out: &mut String) {
        let files: Vec<String> = m
            .files
            .iter()
            .map(|f| {
                format!(
                    "{} ({}, {} lines)",
                    escaped(&f.name),
                    f.format.name(),
                    f.lines
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "read {} lines, {} requests, over {}: {}",
            m.lines,
            m.requests,
            span(m),
            files.join(", ")
        );
        if m.malformed > 0 {
            let _ = writeln!(out, "malformed lines: {} (skipped)", m.malformed);
            for l in &m.malformed_shown {
                let _ = writeln!(out, "  {}", escaped(l));
            }
        }
        for g in &self.groups {
            let _ = writeln!(
                out,
                "\nkey {}: {} clients, {} requests",
                escaped(&g.key),
                g.clients,
                g.requests
            );
            if g.untracked > 0 {
                let _ = writeln!(
                    out,
                    "  more than {} clients: the requests of later ones ({}) are in the totals only",
                    self.max_clients, g.untracked
                );
            }
            let _ = writeln!(out, "  per-client peak requests in a window:");
            let _ = writeln!(
                out,
                "  {:<8} {:>10} {:>10} {:>10} {:>10}",
                "window", "p50", "p90", "p99", "max"
            );
            for w in &g.windows {
                let _ = writeln!(
                    out,
                    "  {:<8} {:>10} {:>10} {:>10} {:>10}",
                    w.name, w.p50, w.p90, w.p99, w.max
                );
            }
            let _ = writeln!(out, "  busiest:");
            for (k, n, peaks) in &g.top {
                let peaks: Vec<String> = peaks
                    .iter()
                    .zip(&g.windows)
                    .map(|(p, w)| format!("{p}/{}", w.name))
                    .collect();
                let _ = writeln!(
                    out,
                    "    {:<32} {n:>10} requests, peaks {}",
                    escaped(k),
                    peaks.join(" ")
                );
            }
            let s = &g.suggestion;
            if let Some(h) = &s.heavy {
                let names: Vec<String> = h
                    .named
                    .iter()
                    .map(|(k, n)| format!("{} ({n})", escaped(k)))
                    .collect();
                let _ = writeln!(
                    out,
                    "  heavy hitters: {} client(s) send {:.0} % of requests ({} of {}): {}",
                    h.count,
                    h.percent,
                    h.requests,
                    g.requests - g.untracked,
                    names.join(", ")
                );
                let _ = writeln!(
                    out,
                    "    (each sends at least {HEAVY_SHARE} % of requests and {HEAVY_FAIR}x an even \
                     share): left out of the percentile below, so that they do not set their own limit"
                );
            }
            let whose = if s.heavy.is_some() {
                format!("the other {} clients' peaks", s.sample)
            } else {
                "the clients' peaks".to_string()
            };
            let _ = writeln!(
                out,
                "  suggested limit: {} per {} (p99 of {whose}, {}, plus {}%, rounded up)",
                s.limit, s.window, s.p99, self.headroom
            );
            let _ = writeln!(
                out,
                "    would deny {} client(s) over it ({} of their requests in all){}",
                s.clients_over,
                s.requests_over,
                if s.over.is_empty() {
                    String::new()
                } else {
                    let over: Vec<_> = s.over.iter().map(|k| escaped(k)).collect();
                    format!(": {}", over.join(", "))
                }
            );
            if s.sample < SMALL_SAMPLE {
                let _ = writeln!(
                    out,
                    "    a small sample: {} client(s), fewer than {SMALL_SAMPLE}, so their 99th \
                     percentile is the busiest one's peak; take the limit as a first guess and \
                     check it with --rules",
                    s.sample
                );
            }
            if let Some(b) = &s.bursty {
                let names: Vec<String> = b
                    .examples
                    .iter()
                    .map(|(k, n)| format!("{} ({n})", escaped(k)))
                    .collect();
                let _ = writeln!(
                    out,
                    "  bursty: {} client(s) within the limit peak at up to {} requests in {}, at least {}x \
                     their average over their busiest {} (criterion: >= {} requests in {} and >= {}x that \
                     average): {}",
                    b.count, b.largest, b.short, BURST_RATIO, s.window, BURST_MIN, b.short, BURST_RATIO,
                    names.join(", ")
                );
                let _ = writeln!(
                    out,
                    "    a token bucket (or gcra) with burst {} fits better than a window: it admits \
                     these bursts and refills at the limit's rate",
                    s.burst.unwrap_or(0)
                );
            }
            let _ = writeln!(out, "  suggested rules:");
            for l in s.yaml.lines() {
                let _ = writeln!(out, "    {l}");
            }
        }
        if let Some(r) = &m.replay {
            let _ = writeln!(
                out,
                "\nreplay through {}: denied requests / distinct clients denied, per algorithm",
                escaped(self.rules_path.as_deref().unwrap_or("the rules"))
            );
            if r.unmatched() > 0 {
                let _ = writeln!(out, "  descriptors no rule limits: {}", r.unmatched());
            }
            for rule in r.reports() {
                let own = &rule.outcomes[0];
                let _ = writeln!(
                    out,
                    "  rule {} ({}): {} requests, denied {} from {} client(s){}",
                    rule.id,
                    own.algorithm,
                    own.requests,
                    own.denied,
                    own.denied_clients.len(),
                    if own.denied_clients_capped {
                        " (at least)"
                    } else {
                        ""
                    }
                );
                for o in rule.outcomes.iter().skip(1) {
                    let _ = writeln!(
                        out,
                        "    as {:<24} denied {:>10} from {:>6} client(s)",
                        o.algorithm.as_str(),
                        o.denied,
                        o.denied_clients.len()
                    );
                }
            }
        }
    }

    pub(crate) fn table(&self, m: &Measured) -> String {
        let mut out = String::new();
        self.table_into(m, &mut out);
        out
    }

    pub(crate) fn json(&self, m: &Measured) -> Value {
        let groups: Vec<Value> = self
            .groups
            .iter()
            .map(|g| {
                let s = &g.suggestion;
                json!({
                    "key": g.key,
                    "clients": g.clients,
                    "requests": g.requests,
                    "untracked_requests": g.untracked,
                    "windows": g.windows.iter().map(|w| json!({
                        "window": w.name, "p50": w.p50, "p90": w.p90, "p99": w.p99, "max": w.max,
                    })).collect::<Vec<_>>(),
                    "busiest": g.top.iter().map(|(k, n, p)| json!({"client": k, "requests": n, "peaks": p})).collect::<Vec<_>>(),
                    "suggestion": {
                        "window": s.window,
                        "p99": s.p99,
                        "p99_over_clients": s.sample,
                        "small_sample": s.sample < SMALL_SAMPLE,
                        "heavy_hitters": s.heavy.as_ref().map(|h| json!({
                            "clients": h.count,
                            "requests": h.requests,
                            "percent": (h.percent * 10.0).round() / 10.0,
                            "criterion": format!(">= {HEAVY_SHARE} % of requests and >= {HEAVY_FAIR}x an even share; left out of the percentile"),
                            "named": h.named.iter().map(|(k, n)| json!({"client": k, "requests": n})).collect::<Vec<_>>(),
                        })),
                        "headroom_percent": self.headroom,
                        "limit": s.limit,
                        "clients_over": s.clients_over,
                        "requests_of_clients_over": s.requests_over,
                        "over": s.over,
                        "bursty": s.bursty.as_ref().map(|b| json!({
                            "clients": b.count,
                            "largest": b.largest,
                            "short_window": b.short,
                            "criterion": format!(">= {BURST_MIN} requests in {} and >= {BURST_RATIO}x the client's average rate over its busiest {}", b.short, s.window),
                            "examples": b.examples.iter().map(|(k, n)| json!({"client": k, "peak": n})).collect::<Vec<_>>(),
                        })),
                        "algorithm": s.algorithm,
                        "burst": s.burst,
                        "yaml": s.yaml,
                    },
                })
            })
            .collect();
        let rules = m.replay.as_ref().map(|r| {
            json!({
                "path": self.rules_path,
                "unmatched_descriptors": r.unmatched(),
                "rules": r.reports().iter().map(|rule| json!({
                    "rule": rule.id,
                    "outcomes": rule.outcomes.iter().enumerate().map(|(i, o)| json!({
                        "algorithm": o.algorithm.as_str(),
                        "as_written": i == 0,
                        "requests": o.requests,
                        "denied": o.denied,
                        "denied_clients": o.denied_clients.len(),
                        "denied_clients_capped": o.denied_clients_capped,
                        "denied_clients_first": first_sorted(&o.denied_clients),
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        });
        json!({
            "lines": m.lines,
            "requests": m.requests,
            "first_us": m.first_us,
            "last_us": m.last_us,
            "files": m.files.iter().map(|f| json!({"name": f.name, "format": f.format.name(), "lines": f.lines})).collect::<Vec<_>>(),
            "malformed": {"count": m.malformed, "first": m.malformed_shown},
            "max_clients": self.max_clients,
            "keys": groups,
            "replay": rules,
            "compared_algorithms": COMPARED.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
        })
    }
}

/// The first few of a set, sorted (a stable sample to show).
fn first_sorted(set: &std::collections::HashSet<String>) -> Vec<&str> {
    let mut v: Vec<&str> = set.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.truncate(NAMED);
    v
}

/// The input's time span, as a duration.
pub(crate) fn span(m: &Measured) -> String {
    let us = match (m.first_us, m.last_us) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    let s = us / 1_000_000;
    if s >= 3600 {
        format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}.{:03}s", s, us / 1000 % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_of_windows() {
        assert_eq!(unit_of(60_000_000), ("minute", 1));
        assert_eq!(unit_of(10_000_000), ("second", 10));
        assert_eq!(unit_of(7_200_000_000), ("hour", 2));
        assert_eq!(unit_of(86_400_000_000), ("day", 1));
    }
}
