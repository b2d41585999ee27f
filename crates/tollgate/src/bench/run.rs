//! The drivers of `tollgate bench`: closed loop (each worker sends its next request as soon as
//! the previous one is answered) and open loop (a fixed arrival schedule, `--rate`).
//!
//! Open loop follows wrk2's rule against coordinated omission: request `i` is due at
//! `start + i / rate`, and when every connection was busy at that time (the target fell behind)
//! its latency counts from when it was *due*, not from when it could be sent. A worker that was
//! idle and merely woke up late measures from the actual send: that delay is the generator's,
//! not the target's. Requests are spaced finer than tokio's millisecond timer (see
//! [`wait_until`]), so the target sees the schedule rather than one burst per millisecond. Requests due before the end
//! but still unsent one `--timeout` after it are counted as `not_sent`, never silently dropped.
//!
//! Keys are drawn from a stream seeded per run (`--seed`, random by default), so successive runs
//! do not replay the same keys into a server that kept its counters; the seed is in the report.
//! The report also gives the generator's own CPU time over the run: when it nears one CPU per
//! generator core, the generator, not the target, is what bounds the throughput.
//!
//! Each worker owns its client, its key sampler and its [`Stats`]; they are merged at the end,
//! so the only shared state while running is an atomic ticket counter (open loop) and the
//! progress counter.

use super::report::{Outcome, Report, RunInfo, Stats};
use super::target::{Client, Target};
use super::workload::{KeySampler, Workload};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Workers: HTTP connections, or in-flight gRPC calls.
    pub concurrency: usize,
    /// Measured time.
    pub duration: Duration,
    /// Unmeasured time before it (same load).
    pub warmup: Duration,
    /// Open loop: requests per second; `None`: closed loop.
    pub rate: Option<f64>,
    /// Per-request timeout (counted as an error of kind `timeout`).
    pub timeout: Duration,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Seed of the key stream; worker `i` draws from a sequence derived from it and `i`.
    pub seed: u64,
}

/// Shared clock of a run.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

/// Counters shared by the workers while running.
#[derive(Debug, Default)]
struct Shared {
    /// Open loop: the next ticket of the schedule.
    next_ticket: AtomicU64,
    /// Requests recorded so far (for the progress bar).
    recorded: AtomicU64,
    /// Open loop: measured tickets never sent.
    not_sent: AtomicU64,
}

/// Run `workload` against `target` as `plan` says.
pub async fn run(
    target: &Target,
    target_url: &str,
    workload: Arc<Workload>,
    plan: &Plan,
) -> anyhow::Result<Report> {
    let clients = target.connect(plan.concurrency).await?;
    let cpu_before = process_cpu();
    let now = Instant::now();
    let window = Window {
        start: now,
        measure_from: now + plan.warmup,
        end: now + plan.warmup + plan.duration,
    };
    let shared = Arc::new(Shared::default());
    let progress = plan
        .progress
        .then(|| tokio::spawn(progress_bar(window, shared.clone())));
    let mut tasks = Vec::with_capacity(clients.len());
    for (i, client) in clients.into_iter().enumerate() {
        let worker = Worker {
            client,
            keys: workload.sampler(plan.seed, i, plan.concurrency),
            workload: workload.clone(),
            stats: Stats::default(),
            timeout: plan.timeout,
            window,
            shared: shared.clone(),
        };
        tasks.push(match plan.rate {
            None => tokio::spawn(worker.closed_loop()),
            Some(rate) => tokio::spawn(worker.open_loop(rate)),
        });
    }
    let mut stats = Stats::default();
    for t in tasks {
        stats.merge(&t.await?);
    }
    let finished = Instant::now();
    let generator_cpu = cpu_before
        .zip(process_cpu())
        .map(|(before, after)| after.saturating_sub(before));
    if let Some(p) = progress {
        p.abort();
        let _ = p.await;
        eprint!("\r\x1b[K");
    }
    Ok(Report {
        info: RunInfo {
            target: target_url.to_string(),
            concurrency: plan.concurrency,
            rate: plan.rate,
            // Requests started before the end may finish after it: count their time too.
            duration: finished.max(window.end) - window.measure_from,
            seed: plan.seed,
            elapsed: finished - window.start,
            generator_cpu,
        },
        stats,
        not_sent: shared.not_sent.load(Ordering::Relaxed),
    })
}

/// One connection's (or in-flight call's) loop: its client, keys and statistics.
struct Worker {
    client: Client,
    workload: Arc<Workload>,
    keys: KeySampler,
    stats: Stats,
    timeout: Duration,
    window: Window,
    shared: Arc<Shared>,
}

impl Worker {
    /// Send one request (bounded by the timeout); when `measured`, record its latency counted
    /// from `from`.
    async fn send(&mut self, measured: bool, from: Instant) {
        let key = self.keys.next_key();
        let outcome =
            match tokio::time::timeout(self.timeout, self.client.call(&self.workload, key)).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    self.client.reset();
                    Outcome::Error("timeout".into())
                }
            };
        if measured {
            self.stats.record(outcome, from.elapsed());
            self.shared.recorded.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn closed_loop(mut self) -> Stats {
        loop {
            let sent = Instant::now();
            if sent >= self.window.end {
                return self.stats;
            }
            self.send(sent >= self.window.measure_from, sent).await;
        }
    }

    async fn open_loop(mut self, rate: f64) -> Stats {
        let w = self.window;
        loop {
            let ticket = self.shared.next_ticket.fetch_add(1, Ordering::Relaxed);
            let due = w.start + Duration::from_secs_f64(ticket as f64 / rate);
            if due >= w.end {
                return self.stats;
            }
            let picked = Instant::now();
            if picked >= w.end + self.timeout {
                // Every connection was busy until well after the schedule ended (a request sent
                // now would count as timed out anyway): this one is never sent.
                if due >= w.measure_from {
                    self.shared.not_sent.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            let from = if picked < due {
                wait_until(due).await;
                Instant::now()
            } else {
                due
            };
            self.send(due >= w.measure_from, from).await;
        }
    }
}

/// CPU time (user + system) this process has used so far: `utime` + `stime` of
/// `/proc/self/stat`, in clock ticks of 1/100 s (Linux's `USER_HZ`, fixed at 100 for user
/// space). `None` where there is no `/proc` (the report then leaves the generator's CPU out).
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; fields after it are plain numbers.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // field 14 (utime) is the 12th after ')'
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Sleep on tokio's timer (millisecond granularity) until shortly before `due`, then yield until
/// it. Sleeping all the way would release each millisecond's requests as one burst, and the
/// target's queueing behind that burst would be measured as its latency; yielding costs
/// generator CPU (it has its own core in `scripts/bench.sh`) but spaces requests as scheduled.
async fn wait_until(due: Instant) {
    const TIMER_SLACK: Duration = Duration::from_micros(1200);
    if let Some(early) = due.checked_sub(TIMER_SLACK) {
        if Instant::now() < early {
            tokio::time::sleep_until(early).await;
        }
    }
    while Instant::now() < due {
        tokio::task::yield_now().await;
    }
}

/// Draw `[=====     ] 4.0/10.0 s  123456 req  30864 req/s` on stderr until aborted.
async fn progress_bar(w: Window, shared: Arc<Shared>) {
    const WIDTH: usize = 30;
    let total = (w.end - w.start).as_secs_f64();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let elapsed = (now - w.start).as_secs_f64().min(total);
        let filled = ((elapsed / total.max(1e-9)) * WIDTH as f64) as usize;
        let n = shared.recorded.load(Ordering::Relaxed);
        let measured = now.saturating_duration_since(w.measure_from).as_secs_f64();
        let phase = if now < w.measure_from { " warm-up" } else { "" };
        let rate = if measured > 0.0 {
            n as f64 / measured
        } else {
            0.0
        };
        eprint!(
            "\r[{}{}] {elapsed:.1}/{total:.1} s  {n} req  {rate:.0} req/s{phase}\x1b[K",
            "=".repeat(filled.min(WIDTH)),
            " ".repeat(WIDTH - filled.min(WIDTH)),
        );
        let _ = std::io::stderr().flush();
    }
}
