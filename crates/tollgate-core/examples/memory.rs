//! Memory per key of the memory store at 1M distinct keys, two ways:
//!
//! - **live heap bytes**, from a counting `#[global_allocator]` that wraps the system allocator
//!   (the workspace denies `unsafe_code`; this file is the one justified exception: a
//!   `GlobalAlloc` impl is unsafe by definition, and it only forwards to `System` and counts);
//! - **resident set size** from `/proc/self/statm` (Linux only), which also shows what the
//!   allocator keeps after the hash tables grew (freed old tables it does not return to the OS).
//!
//! Each algorithm runs in a fresh child process so that memory freed by a previous run cannot
//! hide in the baseline. The store keeps 128-bit hashes, never the key text, so everything it
//! holds is "beyond the key bytes"; keys are formatted into one reused buffer so they add nothing.
//!
//! `cargo run --release -p tollgate-core --example memory [-- <algorithm> [keys]]`
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use tollgate_core::clock::SECOND;
use tollgate_core::{Algorithm, CheckItem, MemoryStore, Quota, Store, Unit};

/// Forwards to the system allocator and tracks live bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counter
// is a relaxed atomic that no allocation depends on.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

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
    let live_before = LIVE.load(Ordering::Relaxed);
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
        let item = CheckItem::hit("api", &key, &quota);
        assert!(store.check(now + i, &[item]).unwrap()[0].allowed);
    }
    let after = rss_bytes();
    let live = (LIVE.load(Ordering::Relaxed) - live_before) as f64;
    assert_eq!(store.len() as u64, n);
    println!(
        "{:<24} {:>9} keys  live heap {:>6.1} MiB = {:>6.1} bytes/key   RSS {:>6.1} MiB = {:>6.1} bytes/key",
        alg.as_str(),
        n,
        live / (1 << 20) as f64,
        live / n as f64,
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
