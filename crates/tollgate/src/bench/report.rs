//! What `tollgate bench` measured and how it is printed: per-worker [`Stats`] (counts and an
//! HdrHistogram of latencies) merged into one [`Report`], rendered as text or JSON.
//!
//! Nothing is dropped: every request that was sent ends up as allowed, denied or an error (a
//! timeout is an error of kind `timeout`), so `requests == allowed + denied + errors` always
//! holds, and every request's latency, errors included, is in the histogram.

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// HTTP 200 / RLS `OK`.
    Allowed,
    /// HTTP 429 / RLS `OVER_LIMIT`.
    Denied,
    /// Anything else, by kind (`timeout`, `connect`, `http_503`, `grpc_unavailable`, ...).
    Error(String),
}

/// Counts and latencies of one worker (merged at the end, so no sharing while running).
#[derive(Debug, Clone)]
pub struct Stats {
    /// Allowed answers.
    pub allowed: u64,
    /// Denied answers.
    pub denied: u64,
    /// Errors by kind, timeouts included.
    pub errors: BTreeMap<String, u64>,
    /// Latency of every request in nanoseconds.
    pub latency: Histogram<u64>,
}

/// Largest latency the histogram tracks exactly (larger values are clamped to it).
const MAX_TRACKED: Duration = Duration::from_secs(3600);

impl Default for Stats {
    fn default() -> Self {
        Self {
            allowed: 0,
            denied: 0,
            errors: BTreeMap::new(),
            // 3 significant digits: 0.1% resolution, a few hundred KiB per worker.
            latency: Histogram::new_with_bounds(1, MAX_TRACKED.as_nanos() as u64, 3)
                .expect("valid histogram bounds"),
        }
    }
}

impl Stats {
    /// Count one finished request.
    pub fn record(&mut self, outcome: Outcome, latency: Duration) {
        match outcome {
            Outcome::Allowed => self.allowed += 1,
            Outcome::Denied => self.denied += 1,
            Outcome::Error(kind) => *self.errors.entry(kind).or_default() += 1,
        }
        let ns = (latency.as_nanos() as u64).clamp(1, MAX_TRACKED.as_nanos() as u64);
        self.latency.saturating_record(ns);
    }

    /// Requests recorded.
    pub fn requests(&self) -> u64 {
        self.allowed + self.denied + self.errors.values().sum::<u64>()
    }

    /// Add `other` into `self`.
    pub fn merge(&mut self, other: &Stats) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        self.latency
            .add(&other.latency)
            .expect("histograms with the same bounds merge");
    }
}

/// The settings a run was made with (echoed in the report).
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The target URL.
    pub target: String,
    /// Connections (HTTP) or in-flight requests (gRPC).
    pub concurrency: usize,
    /// Open loop: requests per second asked for; `None` for closed loop.
    pub rate: Option<f64>,
    /// Measured time (warm-up excluded).
    pub duration: Duration,
    /// The key stream's seed (`--seed`).
    pub seed: u64,
    /// Wall time of the whole run, warm-up included.
    pub elapsed: Duration,
    /// CPU time the generator process used over the whole run (warm-up included); `None` where
    /// it cannot be read.
    pub generator_cpu: Option<Duration>,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The settings.
    pub info: RunInfo,
    /// Everything recorded after the warm-up.
    pub stats: Stats,
    /// Open loop: requests of the schedule never sent because every connection was busy until
    /// one timeout past the end (the target could not keep up). Always 0 in closed loop.
    pub not_sent: u64,
}

/// Percentiles reported, as (JSON name, quantile).
const PERCENTILES: [(&str, f64); 4] = [
    ("p50", 0.50),
    ("p90", 0.90),
    ("p99", 0.99),
    ("p99_9", 0.999),
];

impl Report {
    /// Requests per second over the measured time.
    pub fn throughput(&self) -> f64 {
        self.stats.requests() as f64 / self.info.duration.as_secs_f64().max(1e-9)
    }

    /// Open loop: whether the schedule was kept (everything sent, at least 95% of the rate).
    pub fn kept_up(&self) -> bool {
        match self.info.rate {
            None => true,
            Some(rate) => self.not_sent == 0 && self.throughput() >= 0.95 * rate,
        }
    }

    /// The generator's CPU time over the run's wall time (1.0 = one CPU busy all along).
    pub fn generator_cpu_share(&self) -> Option<f64> {
        let cpu = self.info.generator_cpu?;
        Some(cpu.as_secs_f64() / self.info.elapsed.as_secs_f64().max(1e-9))
    }

    fn errors(&self) -> u64 {
        self.stats.errors.values().sum()
    }

    fn timeouts(&self) -> u64 {
        self.stats.errors.get("timeout").copied().unwrap_or(0)
    }

    fn latency_us(&self, q: f64) -> f64 {
        self.stats.latency.value_at_quantile(q) as f64 / 1000.0
    }

    /// The machine-readable report (`--json`). Latencies in microseconds.
    pub fn to_json(&self) -> Value {
        let mut latency = serde_json::Map::new();
        let h = &self.stats.latency;
        let empty = h.is_empty();
        for (name, q) in PERCENTILES {
            latency.insert(
                name.into(),
                json!(if empty { 0.0 } else { self.latency_us(q) }),
            );
        }
        latency.insert("max".into(), json!(h.max() as f64 / 1000.0));
        latency.insert(
            "mean".into(),
            json!(if empty { 0.0 } else { h.mean() / 1000.0 }),
        );
        json!({
            "target": self.info.target,
            "mode": if self.info.rate.is_some() { "open" } else { "closed" },
            "concurrency": self.info.concurrency,
            "rate": self.info.rate,
            "duration_s": self.info.duration.as_secs_f64(),
            "requests": self.stats.requests(),
            "allowed": self.stats.allowed,
            "denied": self.stats.denied,
            "errors": self.errors(),
            "timeouts": self.timeouts(),
            "errors_by_kind": self.stats.errors,
            "not_sent": self.not_sent,
            "kept_up": self.kept_up(),
            "throughput_rps": self.throughput(),
            "latency_us": latency,
            "seed": self.info.seed,
            "generator_cpu_s": self.info.generator_cpu.map(|c| c.as_secs_f64()),
            "generator_cpu_share": self.generator_cpu_share(),
        })
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let i = &self.info;
        let mode = match i.rate {
            Some(r) => format!("open loop at {r} req/s"),
            None => "closed loop".into(),
        };
        let mut out = format!(
            "target {}: {mode}, concurrency {}, {:.1} s measured\n",
            i.target,
            i.concurrency,
            i.duration.as_secs_f64()
        );
        out += &format!(
            "requests  {} ({:.0} req/s)\n",
            self.stats.requests(),
            self.throughput()
        );
        out += &format!(
            "allowed   {}\ndenied    {}\nerrors    {} (timeouts {})\n",
            self.stats.allowed,
            self.stats.denied,
            self.errors(),
            self.timeouts()
        );
        for (kind, n) in &self.stats.errors {
            out += &format!("  {kind}: {n}\n");
        }
        if !self.stats.latency.is_empty() {
            out += "latency  ";
            for (name, q) in PERCENTILES {
                out += &format!(" {}={}", name.replace('_', "."), fmt_us(self.latency_us(q)));
            }
            out += &format!(
                " max={}\n",
                fmt_us(self.stats.latency.max() as f64 / 1000.0)
            );
        }
        out += &format!("seed      {}\n", i.seed);
        if let (Some(cpu), Some(share)) = (i.generator_cpu, self.generator_cpu_share()) {
            out += &format!(
                "generator CPU {:.2} s ({:.0}% of one CPU over {:.1} s)\n",
                cpu.as_secs_f64(),
                100.0 * share,
                i.elapsed.as_secs_f64()
            );
        }
        if let (Some(rate), false) = (i.rate, self.kept_up()) {
            out += &format!(
                "WARNING: the target (or this load generator) could not keep up with {rate} req/s: \
                 {:.0} req/s done, {} scheduled requests never sent; latencies include the queueing\n",
                self.throughput(),
                self.not_sent
            );
        }
        out
    }
}

/// Microseconds as `850us` or `1.25ms`.
fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else {
        format!("{:.2}ms", us / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rate: Option<f64>, not_sent: u64) -> Report {
        let mut a = Stats::default();
        let mut b = Stats::default();
        for i in 1..=99u64 {
            a.record(Outcome::Allowed, Duration::from_micros(i * 10));
        }
        b.record(Outcome::Denied, Duration::from_millis(5));
        b.record(Outcome::Error("timeout".into()), Duration::from_secs(1));
        b.record(Outcome::Error("http_503".into()), Duration::from_micros(1));
        a.merge(&b);
        Report {
            info: RunInfo {
                target: "http://127.0.0.1:1".into(),
                concurrency: 4,
                rate,
                duration: Duration::from_secs(2),
                seed: 42,
                elapsed: Duration::from_secs(3),
                generator_cpu: Some(Duration::from_millis(1500)),
            },
            stats: a,
            not_sent,
        }
    }

    #[test]
    fn json_counts_everything() {
        let r = report(None, 0);
        let j = r.to_json();
        assert_eq!(j["requests"], 102);
        assert_eq!(j["allowed"], 99);
        assert_eq!(j["denied"], 1);
        assert_eq!(j["errors"], 2);
        assert_eq!(j["timeouts"], 1);
        assert_eq!(j["errors_by_kind"]["http_503"], 1);
        assert_eq!(j["mode"], "closed");
        assert_eq!(j["throughput_rps"], 51.0);
        assert_eq!(j["kept_up"], true);
        assert_eq!(j["seed"], 42);
        assert_eq!(j["generator_cpu_s"], 1.5);
        assert_eq!(j["generator_cpu_share"], 0.5);
        let lat = &j["latency_us"];
        // 99 of 102 samples are 10us..990us: p50 is about 500us, max the 1 s timeout.
        let p50 = lat["p50"].as_f64().unwrap();
        assert!((490.0..=520.0).contains(&p50), "{p50}");
        let max = lat["max"].as_f64().unwrap();
        assert!((999_000.0..=1_001_000.0).contains(&max), "{max}");
        assert!(lat["p90"].as_f64() <= lat["p99"].as_f64());
        assert!(lat["p99"].as_f64() <= lat["p99_9"].as_f64());
    }

    #[test]
    fn text_shows_counts_errors_and_percentiles() {
        let t = report(None, 0).to_text();
        assert!(t.contains("closed loop, concurrency 4"), "{t}");
        assert!(t.contains("requests  102 (51 req/s)"), "{t}");
        assert!(t.contains("errors    2 (timeouts 1)"), "{t}");
        assert!(t.contains("  http_503: 1"), "{t}");
        assert!(t.contains("p99.9="), "{t}");
        assert!(!t.contains("WARNING"), "{t}");
        assert!(t.contains("seed      42"), "{t}");
        assert!(t.contains("generator CPU 1.50 s (50% of one CPU"), "{t}");
    }

    #[test]
    fn open_loop_that_fell_behind_says_so() {
        let r = report(Some(1000.0), 7);
        assert!(!r.kept_up());
        assert_eq!(r.to_json()["not_sent"], 7);
        assert!(r.to_text().contains("could not keep up with 1000 req/s"));
        // 51 req/s done of 50 asked, nothing unsent: kept up.
        assert!(report(Some(50.0), 0).kept_up());
    }

    #[test]
    fn empty_report_renders() {
        let r = Report {
            info: RunInfo {
                target: "grpc://x:1".into(),
                concurrency: 1,
                rate: None,
                duration: Duration::from_secs(1),
                seed: 7,
                elapsed: Duration::from_secs(1),
                generator_cpu: None,
            },
            stats: Stats::default(),
            not_sent: 0,
        };
        assert_eq!(r.to_json()["requests"], 0);
        assert_eq!(r.to_json()["latency_us"]["p99"], 0.0);
        assert!(!r.to_text().contains("latency"));
    }

    #[test]
    fn formats_microseconds() {
        assert_eq!(fmt_us(850.4), "850us");
        assert_eq!(fmt_us(1250.0), "1.25ms");
    }
}
