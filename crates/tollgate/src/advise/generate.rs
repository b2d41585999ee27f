//! `tollgate generate-log`: a synthetic combined access log with known answers, for trying
//! `advise`, its tests and its benchmark. One hour of traffic from 2026-01-01T00:00:00Z:
//!
//! - ordinary clients (one per 500 lines, at least 20) loading pages: 1 to 6 requests within
//!   the same second, at random times;
//! - one abuser, `203.0.113.66`, sending a tenth of all lines at a steady rate;
//! - one bursty client, `198.51.100.7`, sending 60 requests within one second every ten
//!   minutes (6 bursts) and nothing else.
//!
//! Deterministic for a given `--seed`.

use std::io::Write;

/// The planted abuser's address.
pub(crate) const ABUSER: &str = "203.0.113.66";
/// The planted bursty client's address.
pub(crate) const BURSTY: &str = "198.51.100.7";

/// `tollgate generate-log` flags.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// How many lines.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    lines: u64,
    /// The random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// splitmix64: small, fast, good enough for synthetic traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PATHS: [&str; 8] = [
    "/",
    "/api/items",
    "/api/items/42",
    "/api/search?q=rust",
    "/static/app.js",
    "/static/app.css",
    "/api/cart",
    "/login",
];
const AGENTS: [&str; 3] = [
    "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
    "Mozilla/5.0 (Macintosh) Safari/605.1.15",
    "curl/8.5.0",
];
const HOUR_MS: u64 = 3_600_000;

/// Who sent a request: an ordinary client's number, or a planted one.
#[derive(Clone, Copy)]
enum Who {
    Client(u32),
    Abuser,
    Bursty,
}

pub fn run(args: &GenerateArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut rng = Rng(args.seed);
    let n = args.lines;
    let mut events: Vec<(u32, Who, u8)> = Vec::with_capacity(n as usize);
    for minute in [5u64, 15, 25, 35, 45, 55] {
        let second = minute * 60_000 + rng.below(60) * 1000;
        for _ in 0..60 {
            events.push((
                (second + rng.below(1000)) as u32,
                Who::Bursty,
                rng.below(8) as u8,
            ));
        }
    }
    for _ in 0..n / 10 {
        events.push((rng.below(HOUR_MS) as u32, Who::Abuser, rng.below(8) as u8));
    }
    let clients = (n / 500).max(20);
    while (events.len() as u64) < n {
        let client = rng.below(clients) as u32;
        let second = rng.below(HOUR_MS / 1000) * 1000;
        let size = (1 + rng.below(6)).min(n - events.len() as u64);
        for _ in 0..size {
            events.push((
                (second + rng.below(1000)) as u32,
                Who::Client(client),
                rng.below(8) as u8,
            ));
        }
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut stamp = String::new();
    let mut stamp_s = u64::MAX;
    let mut ip = String::new();
    for (t_ms, who, path) in events {
        let s = u64::from(t_ms) / 1000;
        if s != stamp_s {
            stamp_s = s;
            stamp = format!("01/Jan/2026:00:{:02}:{:02} +0000", s / 60, s % 60);
        }
        ip.clear();
        match who {
            Who::Client(c) => {
                use std::fmt::Write as _;
                let _ = write!(ip, "10.{}.{}.{}", c >> 16, (c >> 8) & 255, c & 255);
            }
            Who::Abuser => ip.push_str(ABUSER),
            Who::Bursty => ip.push_str(BURSTY),
        }
        let agent = match who {
            Who::Client(c) => AGENTS[c as usize % 2],
            _ => AGENTS[2],
        };
        writeln!(
            out,
            "{ip} - - [{stamp}] \"GET {} HTTP/1.1\" 200 {} \"-\" \"{agent}\"",
            PATHS[path as usize],
            200 + u32::from(path) * 97
        )?;
    }
    out.flush()?;
    Ok(std::process::ExitCode::SUCCESS)
}
