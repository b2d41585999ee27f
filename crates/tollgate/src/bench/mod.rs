//! `tollgate bench`: a load generator for tollgate or any Envoy RLS server,
//! and the hidden `tollgate bench-ceiling` servers it is compared with.
//!
//! One file per concern: [`target`] (URLs and clients), [`workload`] (descriptor templates, key
//! space, distribution), [`run`](mod@run) (closed and open loop drivers), [`report`] (HdrHistogram
//! summary, text and JSON), [`ceiling`] (bare axum / tonic servers: the most any service could
//! do on this machine with the same stack).

pub mod ceiling;
pub mod report;
pub mod run;
pub mod target;
pub mod workload;

use anyhow::{bail, Context};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// `tollgate bench` flags.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// `http://host:port` (POST /v1/check), `grpc://host:port` (Envoy RLS v3 ShouldRateLimit),
    /// or `http://host:port/path` (GET that path with the `--header`s, e.g. forward-auth's
    /// `/v1/forward-auth/web`, or a gateway in front of an API; 2xx allowed, 429 denied).
    target: String,
    /// GET targets: a request header `Name: value`; `{key}` in the value is replaced by a key
    /// number drawn per request (as in `--descriptor`). Repeat for several.
    #[arg(long = "header")]
    headers: Vec<String>,
    /// Path targets: POST this JSON body instead of a GET (`{key}` replaced per request), e.g.
    /// another limiter's check API for a side-by-side run.
    #[arg(long)]
    body: Option<String>,
    /// HTTP connections (one request in flight each) or concurrent gRPC calls.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured time, e.g. `10s`, `500ms`, `2m`.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Unmeasured time at the same load before it.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    warmup: Duration,
    /// Open loop: send this many requests per second on a fixed schedule (latency counts from
    /// when each request was due). Without it: closed loop, as fast as answers come.
    #[arg(long)]
    rate: Option<f64>,
    /// The rules domain.
    #[arg(long, default_value = "api")]
    domain: String,
    /// A descriptor `key=value[;key2=value2]`; `{key}` anywhere is replaced by a key number
    /// drawn per request. Repeat for several descriptors.
    #[arg(long = "descriptor", default_value = "user=user_{key}")]
    descriptors: Vec<String>,
    /// Size of the key space `{key}` is drawn from (0..N).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// How keys are drawn: `uniform`, `zipf:S` (S > 0, e.g. zipf:1.1), or `sequential` (every
    /// key in turn from `--seed` on: N requests touch N distinct keys).
    #[arg(long, default_value = "uniform")]
    distribution: workload::Distribution,
    /// Cost of each request (default: the server's default, 1).
    #[arg(long)]
    hits: Option<u64>,
    /// Per-request timeout; a timeout counts as an error.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    timeout: Duration,
    /// Seed of the key stream (each worker draws from its own sequence derived from it).
    /// Default: a new random seed per run, printed in the report so a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    json: bool,
}

/// A seed that differs from run to run: std's per-process random hash keys (no dependency),
/// mixed with the time.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Parse `10s`, `500ms`, `250us`, `2m`, `1h`, `1.5s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("'{text}' has no unit (use us, ms, s, m or h, e.g. 10s)"))?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' does not start with a number"))?;
    let secs = match unit {
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{text}' (use us, ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("'{text}': {e}"))
}

/// Run the benchmark and print the report. Exit 0 when it ran (whatever the errors: they are
/// in the report), an error when it could not start.
pub fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let target = args
        .target
        .parse::<target::Target>()?
        .with_headers(&args.headers)?
        .with_body(args.body.as_deref())?;
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if args.duration.is_zero() {
        bail!("--duration must be more than 0");
    }
    if let Some(r) = args.rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--rate must be a positive number of requests per second");
        }
    }
    let workload = Arc::new(workload::Workload::new(
        &args.domain,
        &args.descriptors,
        args.hits,
        args.keys,
        args.distribution,
    )?);
    let plan = run::Plan {
        concurrency: args.concurrency,
        duration: args.duration,
        warmup: args.warmup,
        rate: args.rate,
        timeout: args.timeout,
        progress: !args.json && std::io::stderr().is_terminal(),
        seed: args.seed.unwrap_or_else(random_seed),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tollgate-bench")
        .build()?;
    let report = runtime
        .block_on(run::run(&target, &args.target, workload, &plan))
        .with_context(|| format!("benchmark of {} failed", args.target))?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["10", "s", "ten s", "1x", "-1s", "1..2s", ""] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
