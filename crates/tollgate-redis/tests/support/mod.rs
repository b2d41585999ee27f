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

/// A cluster node's id (`CLUSTER MYID`).
pub fn node_id(n: &RedisServer) -> String {
    n.cli(&["CLUSTER", "MYID"]).trim().to_string()
}

/// Move `slot` with its keys from `src` to `dst` as `redis-cli --cluster reshard` does: the
/// target imports, the source migrates, the keys move, then every master is told the new
/// owner, the target first (see cluster.rs). One key per `MIGRATE`: a sliding log's two keys
/// are apart for a moment, as with any batch size once a slot holds enough keys.
pub fn migrate(masters: &[&RedisServer], slot: u16, src: &RedisServer, dst: &RedisServer) {
    let s = slot.to_string();
    let (src_id, dst_id) = (node_id(src), node_id(dst));
    let ok = dst.cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]);
    assert!(ok.contains("OK"), "{ok}");
    let ok = src.cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]);
    assert!(ok.contains("OK"), "{ok}");
    let port = dst.port.to_string();
    loop {
        let keys: Vec<String> = src
            .cli(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        if keys.is_empty() {
            break;
        }
        for k in &keys {
            let out = src.cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", k]);
            assert!(out.contains("OK") || out.contains("NOKEY"), "{out}");
        }
    }
    let mut order = vec![dst, src];
    order.extend(
        masters
            .iter()
            .copied()
            .filter(|n| n.port != src.port && n.port != dst.port),
    );
    for n in order {
        let ok = n.cli(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        assert!(ok.contains("OK"), "{ok}");
    }
}

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
