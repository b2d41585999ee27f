//! Test support: the redis-server process helpers (shared crate) and the conformance suite.

#![allow(dead_code, unused_imports)]

pub use tollgate_testsupport::*;

pub mod conformance;

/// Wait until `done` has counted `n` more (calls of a test's load), within a minute.
pub fn wait_for_more(done: &std::sync::atomic::AtomicU64, n: u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let target = done.load(Relaxed) + n;
    wait_for(
        std::time::Duration::from_secs(60),
        "calls to complete",
        || done.load(Relaxed) >= target,
    );
}

/// Stop a test's load (`stop` set, every caller task joined) and assert it met no error.
pub fn stop_load(
    rt: &tokio::runtime::Runtime,
    stop: &std::sync::atomic::AtomicBool,
    callers: Vec<tokio::task::JoinHandle<()>>,
    errors: &std::sync::Mutex<Vec<String>>,
) {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in callers {
        rt.block_on(c).unwrap();
    }
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        errors.first()
    );
}
