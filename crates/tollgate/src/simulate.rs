//! `tollgate simulate`: replay a trace on a manual clock. Deterministic: the memory store uses a
//! fixed hash key, so even count-min-sketch collisions repeat exactly.

use crate::trace::{ms, parse_line, HEADER};
use anyhow::{bail, Context};
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;
use tollgate_core::limiter::{check, Status};
use tollgate_core::memory::DEFAULT_MAX_KEYS;
use tollgate_core::rules::RuleSet;
use tollgate_core::MemoryStore;

/// The example rules shipped in the repository (relative to the working directory).
pub const DEFAULT_RULES: &str = "examples/rules";

pub fn run(rules_path: &Path, store: &str, input: Option<&Path>) -> anyhow::Result<ExitCode> {
    let rules = RuleSet::load(rules_path)
        .map_err(|e| anyhow::anyhow!("invalid rules in {}:\n{e}", rules_path.display()))?;
    if store != "memory" {
        bail!("unsupported --store '{store}': this build supports 'memory'");
    }
    let store = MemoryStore::with_seed(DEFAULT_MAX_KEYS, 0x746f_6c6c, 0x6761_7465);
    let reader: Box<dyn BufRead> = match input {
        None => Box::new(std::io::stdin().lock()),
        Some(p) if p == Path::new("-") => Box::new(std::io::stdin().lock()),
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
        )),
    };
    let name = input.map_or("<stdin>".to_string(), |p| p.display().to_string());
    let mut out = BufWriter::new(std::io::stdout().lock());
    writeln!(out, "{HEADER}")?;
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{name}:{}: cannot read", n + 1))?;
        let Some(ev) = parse_line(&line).map_err(|e| anyhow::anyhow!("{name}:{}: {e}", n + 1))?
        else {
            continue;
        };
        let now = ev.t_ms.saturating_mul(1000);
        let verdict = check(&rules, &store, now, &ev.domain, &[ev.descriptor], ev.hits)?;
        let (remaining, retry, reset, delay) = match verdict.statuses.first() {
            Some(Status::Limited { decision: d, .. }) => (
                d.remaining.to_string(),
                d.retry_after.map(|r| ms(r).to_string()).unwrap_or_default(),
                ms(d.reset_after).to_string(),
                if d.allowed {
                    ms(d.delay).to_string()
                } else {
                    String::new()
                },
            ),
            _ => Default::default(),
        };
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
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
