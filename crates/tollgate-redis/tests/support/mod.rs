//! Test support: the redis-server process helpers (shared crate) and the conformance suite.

#![allow(dead_code, unused_imports)]

pub use tollgate_testsupport::*;

pub mod conformance;

/// Sends `sig` (`-STOP`, `-CONT`, `-KILL`) to process `pid` (a test's own redis-server).
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}
