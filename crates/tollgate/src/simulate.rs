//! `tollgate simulate`: replay a trace on a manual clock. Deterministic: the memory store uses a
//! fixed hash key, so even count-min-sketch collisions repeat exactly.
//!
//! With `--store redis://...` the same trace runs on Redis: every call passes the trace's time
//! (not Redis' `TIME`), under a throwaway unique key prefix whose keys are deleted afterwards, so
//! the output is identical to `--store memory` (the conformance contract of the Redis store).

use crate::trace::{ms, parse_line, HEADER};
use anyhow::{bail, Context};
use std::collections::HashSet;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use tollgate_core::limiter::{Descriptor, Plan, Status, Verdict};
use tollgate_core::memory::DEFAULT_MAX_KEYS;
use tollgate_core::rules::RuleSet;
use tollgate_core::MemoryStore;
use tollgate_core::{Algorithm, CheckItem, Decision, Quota, Store};
use tollgate_redis::store::redact;
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_server::backend::redis_unsupported;

/// The example rules shipped in the repository (relative to the working directory).
pub const DEFAULT_RULES: &str = "examples/rules";

/// `simulate --plot`: where to write the picture and which algorithms to draw.
pub struct PlotOptions<'a> {
    pub path: &'a Path,
    pub algorithms: &'a [Algorithm],
}

/// Most trace lines `--plot` holds in memory (it replays the trace once per algorithm).
const MAX_PLOT_EVENTS: usize = 1_000_000;

pub fn run(
    rules_path: &Path,
    store: &str,
    input: Option<&Path>,
    plot: Option<PlotOptions<'_>>,
) -> anyhow::Result<ExitCode> {
    if !rules_path.exists() {
        bail!(
            "rules path {} not found (relative to the working directory): set it with --rules \
             PATH or TOLLGATE_RULES",
            rules_path.display()
        );
    }
    let rules = RuleSet::load(rules_path)
        .map_err(|e| anyhow::anyhow!("invalid rules in {}:\n{e}", rules_path.display()))?;
    if plot.is_some() && store != "memory" {
        bail!("--plot replays on the memory store only (one per algorithm)");
    }
    let mut store = Replay::open(store, &rules)?;
    let reader: Box<dyn BufRead> = match input {
        None => Box::new(std::io::stdin().lock()),
        Some(p) if p == Path::new("-") => Box::new(std::io::stdin().lock()),
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
        )),
    };
    let name = input.map_or("<stdin>".to_string(), |p| p.display().to_string());
    if let Some(plot) = plot {
        let mut events = Vec::new();
        for (n, line) in reader.lines().enumerate() {
            let line = line.with_context(|| format!("{name}:{}: cannot read", n + 1))?;
            if let Some(ev) =
                parse_line(&line).map_err(|e| anyhow::anyhow!("{name}:{}: {e}", n + 1))?
            {
                if events.len() == MAX_PLOT_EVENTS {
                    bail!("{name}: --plot takes at most {MAX_PLOT_EVENTS} trace lines");
                }
                events.push(ev);
            }
        }
        return plot_algorithms(&rules, &events, &plot);
    }
    let mut out = BufWriter::new(std::io::stdout().lock());
    // The header goes out with the first decision (or at the end): an input that cannot be read
    // or parsed from its first line fails with nothing on standard output.
    let mut header = Some(HEADER);
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{name}:{}: cannot read", n + 1))?;
        let Some(ev) = parse_line(&line).map_err(|e| anyhow::anyhow!("{name}:{}: {e}", n + 1))?
        else {
            continue;
        };
        let now = ev.t_ms.saturating_mul(1000);
        let descriptors = [ev.descriptor];
        let verdict = store.decide(&rules, now, &ev.domain, &descriptors, ev.hits, None)?;
        let (remaining, retry, reset, delay) = match verdict.statuses.first() {
            Some(s @ Status::Limited { decision: d, .. }) => (
                d.remaining.to_string(),
                // As the HTTP and gRPC answers: only a denial that blocks says when to retry
                // (a shadow-mode denial is answered as allowed).
                d.retry_after
                    .filter(|_| s.blocks())
                    .map(|r| ms(r).to_string())
                    .unwrap_or_default(),
                ms(d.reset_after).to_string(),
                if d.allowed {
                    ms(d.delay).to_string()
                } else {
                    String::new()
                },
            ),
            _ => Default::default(),
        };
        if let Some(h) = header.take() {
            writeln!(out, "{h}")?;
        }
        writeln!(
            out,
            "{},{},{},{},{},{remaining},{retry},{reset},{delay}",
            ev.t_ms,
            ev.domain,
            ev.raw_descriptor,
            ev.hits,
            verdict.allowed(),
        )?;
    }
    if let Some(h) = header.take() {
        writeln!(out, "{h}")?;
    }
    out.flush()?;
    store.clean_up()?;
    Ok(ExitCode::SUCCESS)
}

/// What one algorithm admitted of a trace.
struct Admitted {
    algorithm: Algorithm,
    /// `(t_ms, hits)` of each admitted line, in trace order.
    admitted: Vec<(u64, u64)>,
    denied: u64,
    /// The period of the first limit met (the span the "most admitted" figure is over).
    period_ms: Option<u64>,
    /// Lines that met a tiered limit, admitted ones by tier (in the order tiers were first
    /// met): the plot draws these instead of the whole when there are any.
    tiers: Vec<(String, Vec<(u64, u64)>)>,
}

/// The tier of a line's first tiered limit, by its level's value.
fn tier_of(verdict: &Verdict<'_>) -> Option<String> {
    verdict.statuses.iter().find_map(|s| match s {
        Status::Limited {
            limit,
            tier: Some(t),
            ..
        } => limit
            .tiers
            .as_ref()
            .and_then(|ts| ts.levels.get(usize::from(*t)))
            .map(|l| l.value.clone()),
        _ => None,
    })
}

/// The most hits admitted within any span of `period_ms` (a rolling window over the trace).
fn most_in_period(admitted: &[(u64, u64)], period_ms: u64) -> u64 {
    let (mut best, mut sum, mut start) = (0, 0, 0);
    for &(t, hits) in admitted {
        sum += hits;
        while admitted[start].0 + period_ms <= t {
            sum -= admitted[start].1;
            start += 1;
        }
        best = best.max(sum);
    }
    best
}

/// Replay `events` under each algorithm on a fresh memory store; print a summary and write the
/// admitted-over-time picture.
fn plot_algorithms(
    rules: &RuleSet,
    events: &[crate::trace::Event],
    plot: &PlotOptions<'_>,
) -> anyhow::Result<ExitCode> {
    use crate::advise::svg::{step_chart, Series};
    let mut runs = Vec::new();
    for &algorithm in plot.algorithms {
        let mut store = Replay::memory();
        let mut run = Admitted {
            algorithm,
            admitted: Vec::new(),
            denied: 0,
            period_ms: None,
            tiers: Vec::new(),
        };
        for ev in events {
            let descriptors = std::slice::from_ref(&ev.descriptor);
            let now = ev.t_ms.saturating_mul(1000);
            let verdict = store.decide(
                rules,
                now,
                &ev.domain,
                descriptors,
                ev.hits,
                Some(algorithm),
            )?;
            if run.period_ms.is_none() {
                run.period_ms = verdict.statuses.iter().find_map(|s| match s {
                    Status::Limited { limit, .. } => limit.quota.map(|q| ms(q.period().nominal())),
                    _ => None,
                });
            }
            if let Some(tier) = tier_of(&verdict) {
                let at = match run.tiers.iter().position(|(t, _)| *t == tier) {
                    Some(i) => i,
                    None => {
                        run.tiers.push((tier, Vec::new()));
                        run.tiers.len() - 1
                    }
                };
                if verdict.allowed() {
                    run.tiers[at].1.push((ev.t_ms, ev.hits));
                }
            }
            if verdict.allowed() {
                run.admitted.push((ev.t_ms, ev.hits));
            } else {
                run.denied += ev.hits;
            }
        }
        runs.push(run);
    }
    let mut out = BufWriter::new(std::io::stdout().lock());
    writeln!(
        out,
        "{:<24} {:>9} {:>9} {:>26}",
        "algorithm", "admitted", "denied", "most admitted in a period"
    )?;
    let first = events.first().map_or(0, |e| e.t_ms);
    let last = events.last().map_or(0, |e| e.t_ms);
    let mut series = Vec::new();
    for r in &runs {
        let admitted: u64 = r.admitted.iter().map(|a| a.1).sum();
        let most = r.period_ms.map(|p| most_in_period(&r.admitted, p));
        writeln!(
            out,
            "{:<24} {admitted:>9} {:>9} {:>26}",
            r.algorithm.as_str(),
            r.denied,
            most.map_or("-".to_string(), |m| m.to_string())
        )?;
        let cumulative = |admitted: &[(u64, u64)]| {
            let mut total = 0;
            let mut points = vec![(first as f64 / 1000.0, 0.0)];
            for &(t, hits) in admitted {
                total += hits;
                points.push((t as f64 / 1000.0, total as f64));
            }
            points.push((last as f64 / 1000.0, total as f64));
            points
        };
        if r.tiers.is_empty() {
            series.push(Series {
                name: r.algorithm.as_str().to_owned(),
                points: cumulative(&r.admitted),
            });
        }
        // A tiered limit: its tiers' rows (`algorithm:tier`) and lines.
        for (tier, admitted) in &r.tiers {
            let most = r.period_ms.map(|p| most_in_period(admitted, p));
            writeln!(
                out,
                "{:<24} {:>9} {:>9} {:>26}",
                format!("{}:{tier}", r.algorithm.as_str()),
                admitted.iter().map(|a| a.1).sum::<u64>(),
                "-",
                most.map_or("-".to_string(), |m| m.to_string())
            )?;
            let name = if runs.len() == 1 {
                format!("tier {tier}")
            } else {
                format!("{} {tier}", r.algorithm.as_str())
            };
            series.push(Series {
                name,
                points: cumulative(admitted),
            });
        }
    }
    out.flush()?;
    let by = if runs.iter().any(|r| !r.tiers.is_empty()) {
        "by tier"
    } else {
        "by algorithm"
    };
    let svg = step_chart(
        &format!("Admitted requests (cumulative), {by}"),
        "seconds",
        "admitted",
        &series,
    );
    std::fs::write(plot.path, svg)
        .with_context(|| format!("cannot write {}", plot.path.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// The replay engine (shared by `simulate` and `advise`): the rules' planner over a store, on
/// the trace's clock. The store a trace is replayed on.
pub(crate) enum Replay {
    Memory(MemoryStore),
    Redis {
        runtime: tokio::runtime::Runtime,
        store: RedisStore,
        /// Every counter touched, for the clean-up.
        counters: HashSet<(String, Quota)>,
    },
}

impl Replay {
    /// A fresh memory store with the fixed hash key (runs repeat exactly).
    pub(crate) fn memory() -> Replay {
        Replay::Memory(MemoryStore::with_seed(
            DEFAULT_MAX_KEYS,
            0x746f_6c6c,
            0x6761_7465,
        ))
    }

    pub(crate) fn open(store: &str, rules: &RuleSet) -> anyhow::Result<Replay> {
        if store == "memory" {
            return Ok(Replay::memory());
        }
        if !store.starts_with("redis") {
            bail!(
                "unsupported --store '{}': expected 'memory' or a redis:// URL",
                redact(store)
            );
        }
        let problems = redis_unsupported(rules);
        if !problems.is_empty() {
            bail!(
                "rules cannot run on a Redis store:\n{}",
                problems.join("\n")
            );
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let opts = RedisOptions {
            prefix: format!("tollgate-simulate-{}-{nanos:x}", std::process::id()),
            // Trace time is unrelated to the real clock: keys must outlive the replay.
            ttl_grace: Duration::from_secs(3600),
            timeout: Duration::from_secs(5),
            ..RedisOptions::default()
        };
        let store = runtime
            .block_on(RedisStore::connect(store, opts))
            .with_context(|| format!("cannot connect to {}", redact(store)))?;
        Ok(Replay::Redis {
            runtime,
            store,
            counters: HashSet::new(),
        })
    }

    /// Decide one request of `domain` at `now` (microseconds on the trace's clock). With
    /// `algorithm`, every limit it meets runs under that algorithm instead of its own (same
    /// limit, period and, where the algorithm reads one, burst): how `advise` and `simulate
    /// --plot` show one rule under each algorithm. Each algorithm needs a store of its own.
    pub(crate) fn decide<'r>(
        &mut self,
        rules: &'r RuleSet,
        now: u64,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u64,
        algorithm: Option<Algorithm>,
    ) -> anyhow::Result<Verdict<'r>> {
        let plan = Plan::new(rules, domain, descriptors, hits);
        let items = plan.items();
        let decisions = self.check_as(now, &items, algorithm)?;
        drop(items);
        Ok(plan.finish(decisions))
    }

    /// The store's decisions on a planned request's `items` at `now`, each limit under
    /// `algorithm` when one is given (see [`Replay::decide`]).
    pub(crate) fn check_as(
        &mut self,
        now: u64,
        items: &[CheckItem<'_>],
        algorithm: Option<Algorithm>,
    ) -> anyhow::Result<Vec<Decision>> {
        match algorithm {
            None => self.check(now, items),
            Some(a) => {
                if let Some(i) = items
                    .iter()
                    .find(|i| i.tier.is_some() && !tollgate_core::rules::tiers_support(a))
                {
                    bail!(
                        "rule {} has tiers, which work with fixed_window or \
                         sliding_window_counter only, not {a}: leave {a} out of --algorithms",
                        i.rule
                    );
                }
                let quotas: Vec<Quota> = items.iter().map(|i| as_algorithm(i.quota, a)).collect();
                let swapped: Vec<CheckItem<'_>> = items
                    .iter()
                    .zip(&quotas)
                    .map(|(i, quota)| CheckItem { quota, ..*i })
                    .collect();
                self.check(now, &swapped)
            }
        }
    }

    fn check(&mut self, now: u64, items: &[CheckItem<'_>]) -> anyhow::Result<Vec<Decision>> {
        Ok(match self {
            Replay::Memory(m) => m.check(now, items)?,
            Replay::Redis {
                runtime,
                store,
                counters,
            } => {
                counters.extend(items.iter().map(|i| (i.key.to_owned(), *i.quota)));
                runtime.block_on(store.check(Some(now), items))?
            }
        })
    }

    pub(crate) fn clean_up(&self) -> anyhow::Result<()> {
        if let Replay::Redis {
            runtime,
            store,
            counters,
        } = self
        {
            runtime
                .block_on(store.delete_counters(counters.iter().map(|(k, q)| (k.as_str(), q))))
                .context("cannot delete the replay's keys")?;
        }
        Ok(())
    }
}

/// `quota` under `algorithm`: the same limit and period; the burst kept where the algorithm
/// reads one (a window algorithm has none, and a bucket without one holds `limit`).
pub(crate) fn as_algorithm(quota: &Quota, algorithm: Algorithm) -> Quota {
    let q = Quota::new(quota.limit(), quota.period()).with_algorithm(algorithm);
    if algorithm.uses_burst() && quota.algorithm().uses_burst() {
        q.with_burst(quota.burst())
    } else {
        q
    }
}
