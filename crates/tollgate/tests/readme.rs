//! README.md's distributed setup, run as written (extracted from the README, so the two cannot
//! drift): on a machine that already runs the quick start's `serve` and a Redis on 6379, the
//! block starts no second Redis, collides with no port, and both instances share one limit
//! (`limit_remaining` goes down by one per request across them). `tollgate` is the built binary,
//! first on `PATH` as after `cargo install`. Its fixed ports are replaced by free ones only when
//! something else holds them (so a busy machine cannot make this flaky).

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, port_is_free, repo};

const MARKER: &str = "<!-- distributed-setup:";

/// The ```sh block after the marker comment.
fn distributed_block() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = readme.find(MARKER).expect("marker in README.md");
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("sh block") + "```sh\n".len();
    let end = rest[start..].find("```").expect("end of block");
    rest[start..start + end].to_string()
}

/// Regression: adding examples/axum-app (a second binary in the workspace) broke the quick
/// start's `cargo run --release -- serve` ("could not determine which binary to run"). `cargo
/// run` at the root picks among the default members' binaries: there must be exactly one,
/// `tollgate`.
#[test]
fn quick_start_cargo_run_finds_the_tollgate_binary() {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let defaults = meta["workspace_default_members"].as_array().unwrap();
    let bins: Vec<&str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| defaults.contains(&p["id"]))
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(bins, ["tollgate"]);
}

#[test]
fn readme_distributed_setup_runs_as_written() {
    let mut script = distributed_block();
    assert!(
        script.contains("redis-cli -h 127.0.0.1 -p 6379 ping ||"),
        "{script}"
    );
    assert!(script.contains("--expected-instances 2"), "{script}");
    assert!(
        !script.contains("8080") && !script.contains("8081"),
        "{script}"
    );
    for port in ["9080", "9081", "9180", "9181"] {
        if !port_is_free(port.parse().unwrap()) {
            script = script.replace(port, &free_port().to_string());
        }
    }
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_tollgate")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let mut cmd = Command::new("bash");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TOLLGATE_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: whatever is left is stopped with it.
        .process_group(0)
        .spawn()
        .unwrap();
    let group = child.id();
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let status = status.unwrap_or_else(|| panic!("did not end in 60 s:\n{stdout}\n{stderr}"));
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    // The running Redis answered: no second one was started.
    assert!(stdout.starts_with("PONG\n"), "{stdout}");
    let remaining: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("\"limit_remaining\":"))
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(remaining.len(), 4, "{stdout}\n{stderr}");
    for pair in remaining.windows(2) {
        assert_eq!(
            pair[1] + 1,
            pair[0],
            "not one shared limit: {remaining:?}\n{stderr}"
        );
    }
}
