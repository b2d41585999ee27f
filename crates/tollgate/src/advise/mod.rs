//! `tollgate advise`: limits from real traffic. Reads access logs (combined, JSON lines, Envoy's
//! default format, or `simulate`'s CSV trace), measures per-client request rates for candidate
//! keys, suggests limits from their distribution, and with `--rules` replays the traffic
//! through a rules file (`simulate`'s engine) under each algorithm to show who would be denied.
//!
//! One pass over the input; memory is bounded by `--max-clients` per key (see [`stats`]), the
//! replay's stores and fixed-size timelines, whatever the input's length.

#[cfg(test)]
mod fuzz;
pub(crate) mod generate;
mod html;
mod json;
mod parse;
mod replay;
mod report;
mod stats;
pub(crate) mod svg;

pub(crate) use generate::GenerateArgs;

use anyhow::Context;
use parse::{Format, JsonFields, Parser};
use replay::Replayer;
use stats::{Group, KeySpec, Window};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use tollgate_core::RuleSet;

/// Longest line read (a longer one is malformed): no log line is near it, and memory stays
/// bounded on any input.
const MAX_LINE: usize = 64 * 1024;

/// How many malformed lines are shown with their file and line number (all are counted).
const SHOWN_MALFORMED: usize = 5;

/// Most bytes of a malformed line's description kept (it may quote the line).
const SHOWN_WHY: usize = 200;

/// `tollgate advise` flags.
#[derive(Debug, clap::Args)]
pub struct AdviseArgs {
    /// Access logs to read, in order; standard input when none or `-`.
    files: Vec<PathBuf>,
    /// The format of every input (default: detected per file from its first line).
    #[arg(long, value_enum, default_value = "auto")]
    format: Format,
    /// A candidate key: `ip`, `path` (without query), `method`, `host`, `header:NAME`, or for a
    /// CSV trace `descriptor` and `entry:KEY`; parts joined by `+` (`ip+path`). Repeat to
    /// compare keys. Default: `ip` (`descriptor` for a CSV trace).
    #[arg(long = "key")]
    keys: Vec<String>,
    /// Window lengths the per-client rates are measured over, comma-separated (`10s`, `1m`,
    /// `1h`, `1d`). The suggestion is per the first of at least one minute (else the longest);
    /// the burst check compares the shortest with it.
    #[arg(long, default_value = "1s,1m,1h", value_delimiter = ',')]
    window: Vec<Window>,
    /// Suggested limit = the 99th percentile of the clients' peaks (heavy hitters left out),
    /// plus this many percent, rounded up to a round number.
    #[arg(long, default_value_t = 50)]
    headroom: u64,
    /// Replay the traffic through these rules (file or directory) and report what each rule
    /// would deny, under its own algorithm and the others. Log lines become descriptors through
    /// each domain's `http` section.
    #[arg(long)]
    rules: Option<PathBuf>,
    /// With --rules: replay under the rules' own algorithms only.
    #[arg(long)]
    no_compare: bool,
    /// The domain name of the suggested rules.
    #[arg(long, default_value = "advised")]
    domain: String,
    /// Most distinct clients tracked exactly per key (about 150 bytes each with three windows,
    /// keys longer than 64 bytes kept as their start and a hash); requests of further clients
    /// count in the totals only, and the report says how many.
    #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    max_clients: u64,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the suggested rules of the first --key to this file (ready for --rules,
    /// `validate` and `serve`).
    #[arg(long, value_name = "FILE")]
    write_rules: Option<PathBuf>,
    /// Also write the report as one self-contained HTML page with plots.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// JSON lines: the time field (dotted path; epoch seconds or RFC 3339).
    #[arg(long, default_value = "ts")]
    time_field: String,
    /// JSON lines: the client address field; several comma-separated, the first present wins.
    #[arg(long, default_value = "request.client_ip,request.remote_ip")]
    client_field: String,
    /// JSON lines: the path (and query) field.
    #[arg(long, default_value = "request.uri")]
    path_field: String,
    /// JSON lines: the method field.
    #[arg(long, default_value = "request.method")]
    method_field: String,
    /// JSON lines: the host field.
    #[arg(long, default_value = "request.host")]
    host_field: String,
    /// JSON lines: the headers object (name to value, or to a list of values).
    #[arg(long, default_value = "request.headers")]
    header_field: String,
}

/// One input file as read.
pub(crate) struct FileSummary {
    pub name: String,
    pub format: Format,
    pub lines: u64,
}

/// Everything measured, for the report.
pub(crate) struct Measured {
    pub files: Vec<FileSummary>,
    pub lines: u64,
    pub requests: u64,
    pub malformed: u64,
    pub malformed_shown: Vec<String>,
    pub first_us: Option<u64>,
    pub last_us: Option<u64>,
    pub windows: Vec<Window>,
    pub groups: Vec<Group>,
    pub traffic: replay::Timeline,
    pub replay: Option<Replayer>,
}

pub fn run(args: &AdviseArgs) -> anyhow::Result<ExitCode> {
    let m = measure(args)?;
    let report = report::Report::build(args, &m);
    if let Some(path) = &args.html {
        std::fs::write(path, html::page(&report, &m))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(path), Some(g)) = (&args.write_rules, report.groups.first()) {
        std::fs::write(path, &g.suggestion.yaml)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report.json(&m))?;
        writeln!(out)?;
    } else {
        out.write_all(report.table(&m).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on standard error, drawn only when it is a terminal.
struct Progress {
    on: bool,
    total: u64,
    done: u64,
    drawn_at: u64,
}

impl Progress {
    fn update(&mut self, bytes: u64, lines: u64) {
        self.done += bytes;
        if !self.on || self.done - self.drawn_at < 4 << 20 {
            return;
        }
        self.drawn_at = self.done;
        let mut err = std::io::stderr().lock();
        if let Some(pct) = (self.done * 100).checked_div(self.total) {
            let pct = pct.min(100);
            let bar = "#".repeat(pct as usize / 4);
            let _ = write!(err, "\r[{bar:<25}] {pct:>3}%  {lines} lines");
        } else {
            let _ = write!(err, "\r{lines} lines");
        }
    }

    fn finish(&self) {
        if self.on && self.drawn_at > 0 {
            let _ = write!(std::io::stderr().lock(), "\r{:60}\r", "");
        }
    }
}

fn measure(args: &AdviseArgs) -> anyhow::Result<Measured> {
    let fields = JsonFields::new(
        &args.time_field,
        &args.client_field,
        &args.path_field,
        &args.method_field,
        &args.host_field,
        &args.header_field,
    );
    let inputs: Vec<Option<PathBuf>> = if args.files.is_empty() {
        vec![None]
    } else {
        args.files
            .iter()
            .map(|p| (p.as_os_str() != "-").then(|| p.clone()))
            .collect()
    };
    let mut readers = Vec::new();
    let mut total = 0;
    for input in &inputs {
        let (name, reader): (String, Box<dyn BufRead>) = match input {
            None => ("<stdin>".into(), Box::new(std::io::stdin().lock())),
            Some(p) => {
                let f = std::fs::File::open(p)
                    .with_context(|| format!("cannot open {}", p.display()))?;
                total += f.metadata().map(|m| m.len()).unwrap_or(0);
                (
                    p.display().to_string(),
                    Box::new(std::io::BufReader::with_capacity(1 << 16, f)),
                )
            }
        };
        readers.push((name, reader));
    }
    let mut progress = Progress {
        on: std::io::stderr().is_terminal(),
        total,
        done: 0,
        drawn_at: 0,
    };
    let windows = args.window.clone();
    if windows.is_empty() {
        anyhow::bail!("--window: give at least one window length");
    }
    let mut m = Measured {
        files: Vec::new(),
        lines: 0,
        requests: 0,
        malformed: 0,
        malformed_shown: Vec::new(),
        first_us: None,
        last_us: None,
        windows,
        groups: Vec::new(),
        traffic: replay::Timeline::new(),
        replay: None,
    };
    let rules = match &args.rules {
        Some(p) => Some(
            RuleSet::load(p)
                .map_err(|e| anyhow::anyhow!("invalid rules in {}:\n{e}", p.display()))?,
        ),
        None => None,
    };
    let mut rules = rules;
    let mut buf = Vec::with_capacity(1024);
    for (name, mut reader) in readers {
        let mut file = FileSummary {
            name,
            format: args.format,
            lines: 0,
        };
        let mut parser: Option<Parser> = None;
        loop {
            buf.clear();
            let (n, whole) = read_line(&mut reader, &mut buf)
                .with_context(|| format!("{}:{}: cannot read", file.name, file.lines + 1))?;
            if n == 0 {
                break;
            }
            file.lines += 1;
            m.lines += 1;
            progress.update(n as u64, m.lines);
            if !whole {
                malformed(&mut m, &file, format!("longer than {MAX_LINE} bytes"));
                continue;
            }
            let line = match std::str::from_utf8(&buf) {
                Ok(l) => l,
                Err(_) => {
                    malformed(&mut m, &file, "not UTF-8".into());
                    continue;
                }
            };
            if parser.is_none() {
                if line.trim().is_empty() {
                    continue;
                }
                if file.format == Format::Auto {
                    file.format = Format::detect(line);
                }
                if m.groups.is_empty() {
                    m.groups = groups(args, file.format)?;
                }
                if m.replay.is_none() {
                    if let Some(r) = rules.take() {
                        let csv = file.format == Format::Csv;
                        let max = args.max_clients as usize;
                        m.replay = Some(Replayer::new(r, !args.no_compare, max, csv)?);
                    }
                }
                parser = Some(Parser::new(file.format, fields.clone()));
            }
            let Some(parser) = parser.as_mut() else {
                continue;
            };
            let record = match parser.parse(line) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    malformed(&mut m, &file, e);
                    continue;
                }
            };
            let hits = record.event.map_or(1, |e| e.hits);
            m.requests += hits;
            m.first_us = Some(m.first_us.map_or(record.t_us, |f| f.min(record.t_us)));
            m.last_us = Some(m.last_us.map_or(record.t_us, |l| l.max(record.t_us)));
            m.traffic.add(record.t_us, 0, hits);
            for g in &mut m.groups {
                g.add(&record, hits, &m.windows);
            }
            if let Some(r) = &mut m.replay {
                r.add(&record)?;
            }
        }
        m.files.push(file);
    }
    progress.finish();
    if m.groups.is_empty() {
        m.groups = groups(args, Format::Auto)?;
    }
    Ok(m)
}

/// Read one line into `buf` (cleared first), keeping at most [`MAX_LINE`] bytes of it: the
/// bytes the line took in the input (0 at the end) and whether it was kept whole. The rest of
/// a longer line is read and dropped.
fn read_line(reader: &mut dyn BufRead, buf: &mut Vec<u8>) -> std::io::Result<(usize, bool)> {
    buf.clear();
    let n = std::io::Read::take(&mut *reader, MAX_LINE as u64 + 1).read_until(b'\n', buf)?;
    if buf.len() <= MAX_LINE || buf.ends_with(b"\n") {
        return Ok((n, true));
    }
    let mut total = n;
    loop {
        let chunk = reader.fill_buf()?;
        if chunk.is_empty() {
            return Ok((total, false));
        }
        let (used, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        reader.consume(used);
        total += used;
        if done {
            return Ok((total, false));
        }
    }
}

fn malformed(m: &mut Measured, file: &FileSummary, mut why: String) {
    m.malformed += 1;
    if m.malformed_shown.len() < SHOWN_MALFORMED {
        if why.len() > SHOWN_WHY {
            let mut cut = SHOWN_WHY;
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            why.truncate(cut);
            why.push('…');
        }
        m.malformed_shown
            .push(format!("{}:{}: {why}", file.name, file.lines));
    }
}

/// The key groups of `--key` (default: `ip`, or `descriptor` for a CSV trace).
fn groups(args: &AdviseArgs, format: Format) -> anyhow::Result<Vec<Group>> {
    let keys: Vec<String> = if args.keys.is_empty() {
        let default = if format == Format::Csv {
            "descriptor"
        } else {
            "ip"
        };
        vec![default.into()]
    } else {
        args.keys.clone()
    };
    keys.iter()
        .map(|k| {
            let spec: KeySpec = k.parse().map_err(|e| anyhow::anyhow!("--key {k}: {e}"))?;
            Ok(Group::new(
                spec,
                args.window.len(),
                args.max_clients as usize,
            ))
        })
        .collect()
}
