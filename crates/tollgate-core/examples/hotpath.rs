//! A fixed-iteration loop over one keyed check, for `valgrind --tool=callgrind` instruction
//! counts: repeatable on a noisy shared machine where criterion's wall-clock figures drift ±30 %.
//!
//! `hotpath <who> <keys> <load> <iters>` with `who` = `gcra` (tollgate's `MemoryStore`, GCRA) or
//! `governor` (governor's keyed `DashMap` limiter on its `FakeRelativeClock`, the equal-work
//! baseline of `benches/core.rs`), `keys` = `single` or `100k`, `load` = `admit` or `deny`.
//! The workloads are the bench's. Setup (key generation, one warm-up pass over the keys) costs the
//! same at any `iters`, so instructions per check = (Ir at 2N - Ir at N) / N:
//!
//! ```sh
//! cargo build --release -p tollgate-core --example hotpath
//! for n in 200000 400000; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/examples/hotpath gcra single admit $n 2>&1 | grep 'Collected'; done
//! ```

#[path = "../benches/support/mod.rs"]
mod support;
use governor::clock::FakeRelativeClock;
use governor::RateLimiter;
use std::hint::black_box;
use support::{check, gcra_quota, governor_quota, Governor, BASE};
use tollgate_core::MemoryStore;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [who, keys, load, iters] = args.as_slice() else {
        eprintln!("usage: hotpath gcra|governor single|100k admit|deny <iters>");
        std::process::exit(2);
    };
    let iters: usize = iters.parse().expect("iters is a number");
    let n = if keys == "single" { 1 } else { 100_000 };
    let keys = support::keys(n);
    let admit = load == "admit";
    // Warm-up pass over every key, then `iters` checks cycling through the keys.
    let order = (0..keys.len()).chain((0..iters).map(|i| i % keys.len()));
    let mut allowed = 0u64;
    match who.as_str() {
        "gcra" => {
            let q = gcra_quota(admit);
            let store = MemoryStore::with_seed(1 << 22, 1, 2);
            for (now, i) in (BASE..).zip(order) {
                allowed += u64::from(black_box(check(&store, &q, &keys[i], now)));
            }
        }
        "governor" => {
            let lim: Governor<FakeRelativeClock> = RateLimiter::dashmap_with_clock(
                governor_quota(admit),
                FakeRelativeClock::default(),
            );
            for i in order {
                allowed += u64::from(black_box(lim.check_key(&keys[i])).is_ok());
            }
        }
        other => panic!("unknown limiter {other}"),
    }
    println!("allowed {allowed}");
}
