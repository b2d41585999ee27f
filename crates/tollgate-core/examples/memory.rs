//! Memory per key of the memory store at 1M distinct keys.
//!
//! Measured as resident set size from `/proc/self/statm` (Linux only), not with a counting
//! `#[global_allocator]`: that needs `unsafe impl GlobalAlloc`, and the workspace *forbids*
//! `unsafe_code` (a command-line `forbid` cannot be relaxed by `#[allow]` in a source file).
//! Each algorithm runs in a fresh child process so that memory freed by a previous run cannot
//! hide in the baseline. The store keeps 128-bit hashes, never the key text, so everything it
//! holds is "beyond the key bytes"; keys are formatted into one reused buffer so they add nothing.
//!
//! `cargo run --release -p tollgate-core --example memory [-- <algorithm> [keys]]`

use std::process::Command;
use tollgate_core::clock::SECOND;
use tollgate_core::{Algorithm, CheckItem, MemoryStore, Quota, Store, Unit};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn measure(alg: Algorithm, n: u64) {
    let quota = Quota::new(100, Unit::Hour).with_algorithm(alg);
    let now = 1_795_305_600 * SECOND;
    let store = MemoryStore::new(4 * n as usize);
    let mut key = String::with_capacity(32);
    let before = rss_bytes();
    for i in 0..n {
        use std::fmt::Write;
        key.clear();
        write!(
            key,
            "api|ip=10.{}.{}.{}",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        )
        .unwrap();
        if i >= 1 << 24 {
            write!(key, "#{}", i >> 24).unwrap();
        }
        let item = CheckItem {
            rule: "api",
            key: &key,
            quota: &quota,
            cost: 1,
            shadow: false,
        };
        assert!(store.check(now + i, &[item]).unwrap()[0].allowed);
    }
    let after = rss_bytes();
    assert_eq!(store.len() as u64, n);
    println!(
        "{:<24} {:>9} keys {:>8.1} MiB {:>6.1} bytes/key",
        alg.as_str(),
        n,
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / n as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(2).map_or(1_000_000, |s| s.parse().unwrap());
    if let Some(alg) = args.get(1) {
        measure(alg.parse().unwrap(), n);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for alg in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ] {
        let status = Command::new(&exe)
            .args([alg.as_str(), &n.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}
