//! A flood of distinct one-request keys mixed with real clients at their limits, against the
//! memory store at its default `max_keys`, three ways, each in a fresh child process (so that
//! resident memory is its own):
//!
//! - `baseline`: the real clients alone;
//! - `flood`: the real clients and the flood, no doorkeeper;
//! - `doorkeeper`: the same with a doorkeeper sized for the flood.
//!
//! Each prints the real clients' admitted count, a digest of their decisions (equal digests:
//! identical decisions), the keys held, evictions, the doorkeeper's figures and the resident
//! set size (`VmRSS`/`VmHWM`, Linux).
//!
//! `cargo run --release -p tollgate-core --example flood [-- <flood keys> [clients]]`

use std::process::Command;
use tollgate_core::clock::SECOND;
use tollgate_core::{CheckItem, Doorkeeper, MemoryStore, Quota, Store, Unit};

const LIMIT: u64 = 10;
/// Requests per client per window: at its limit and a little over.
const PER_WINDOW: u64 = 12;
const WINDOWS: u64 = 2;

fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn run(mode: &str, flood: u64, clients: u64) {
    let rss0 = status("VmRSS:");
    let store = MemoryStore::with_seed(tollgate_core::memory::DEFAULT_MAX_KEYS, 7, 11);
    let mut quota = Quota::new(LIMIT, Unit::Minute);
    if mode == "doorkeeper" {
        quota = quota.with_doorkeeper(Some(Doorkeeper::new(flood.max(1), 0.01).expect("valid")));
    }
    let flood = if mode == "baseline" { 0 } else { flood };
    let real = clients * PER_WINDOW * WINDOWS;
    let total = real + flood;
    let start = 1_700_000_040 * SECOND; // a minute boundary
    let span = WINDOWS * 60 * SECOND;
    let mut key = String::with_capacity(32);
    let (mut sent, mut admitted, mut digest) = (0u64, 0u64, 0xcbf2_9ce4_8422_2325u64);
    let began = std::time::Instant::now();
    for r in 0..real {
        // The flood keys due before this real request.
        // Real requests at the same instants in every mode; the flood keys due before one are
        // sent at its instant.
        let now = start + r * span / real;
        let due = (r + 1) * flood / real;
        while sent < due {
            key.clear();
            use std::fmt::Write;
            let _ = write!(key, "flood-{sent}");
            let item = CheckItem::hit("api", &key, &quota);
            let _ = store.check_one(now, &item);
            sent += 1;
        }
        key.clear();
        use std::fmt::Write;
        let _ = write!(key, "client-{}", r % clients);
        let d = store
            .check_one(now, &CheckItem::hit("api", &key, &quota))
            .expect("memory");
        admitted += u64::from(d.allowed);
        for v in [u64::from(d.allowed), d.remaining, d.reset_after] {
            digest = (digest ^ v).wrapping_mul(0x0100_0000_01b3);
        }
    }
    let secs = began.elapsed().as_secs_f64();
    let dk = store.doorkeepers();
    let (held, fill, fp, bytes) = dk.first().map_or((0, 0.0, 0.0, 0), |(_, s)| {
        (s.held_back, s.fill_ratio, s.fp_estimate, s.bytes)
    });
    println!(
        "{mode:<10} flood={flood} clients={clients} real_requests={real} admitted={admitted} \
         digest={digest:016x} keys={} evictions={} held_back={held} fill={fill:.3} fp_est={fp:.5} \
         filter_MiB={:.1} rss_MiB={:.1} (start {:.1}) hwm_MiB={:.1} checks_per_s={:.0}",
        store.len(),
        store.evictions(),
        bytes as f64 / 1048576.0,
        status("VmRSS:") as f64 / 1024.0,
        rss0 as f64 / 1024.0,
        status("VmHWM:") as f64 / 1024.0,
        total as f64 / secs,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let flood = args[3].parse().expect("flood keys");
        let clients = args[4].parse().expect("clients");
        run(&args[2], flood, clients);
        return;
    }
    let flood: u64 = args
        .get(1)
        .map_or(10_000_000, |a| a.parse().expect("flood keys"));
    let clients: u64 = args.get(2).map_or(10_000, |a| a.parse().expect("clients"));
    let exe = std::env::current_exe().expect("own path");
    for mode in ["baseline", "flood", "doorkeeper"] {
        let out = Command::new(&exe)
            .args(["--child", mode, &flood.to_string(), &clients.to_string()])
            .output()
            .expect("child runs");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
}
