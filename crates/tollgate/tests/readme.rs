//! The shell blocks of README.md and docs/*.md, run as written. Each block carries an HTML
//! comment on the line before it saying how it is run (`<!-- run -->`, `<!-- run: server -->`
//! next to the quick start's `serve`, `<!-- run: serve -->` for a foreground service, a named
//! test's marker, or `<!-- not run: REASON -->`), optionally followed by `| stdout has: TEXT`
//! for what its output must show; an unmarked block fails the run.
//!
//! docs/operations.md's two-instance Redis setup, run as written (extracted from the page, so
//! the two cannot drift; the suite's Redis, `TOLLGATE_TEST_REDIS_URL`, in place of the one on
//! 6379): on a machine that already runs the quick start's `serve` and a Redis, the
//! block starts no second Redis, collides with no port, and both instances share one limit
//! (`limit_remaining` goes down by one per request across them). `tollgate` is the built binary,
//! first on `PATH` as after `cargo install`. Its fixed ports are replaced by free ones only when
//! something else holds them (so a busy machine cannot make this flaky).
//!
//! A block that starts `tollgate serve` in the background is run once more with its HTTP port
//! held by another serve: it must stop there, with its serve's reason, and send the other
//! server nothing.

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use support::{on_free_ports, port_is_free, repo};
use tollgate_testsupport::{free_port, shared_port};

const MARKER: &str = "<!-- distributed-setup:";

/// The ```sh block after the marker comment.
fn distributed_block() -> String {
    let page = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let at = page.find(MARKER).expect("marker in docs/operations.md");
    let rest = &page[at..];
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

/// The quick start's first command builds with a profile of its own: it must exist (a
/// misspelt or removed profile fails the first command of a new user).
#[test]
fn quick_start_profile_is_defined() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("cargo run "))
        .expect("the quick start's cargo run line");
    let profile = line
        .split_whitespace()
        .skip_while(|w| *w != "--profile")
        .nth(1)
        .expect("the quick start names its profile");
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("[profile.{profile}]")),
        "README's quick start builds with --profile {profile}, which Cargo.toml does not define"
    );
}

#[test]
fn readme_distributed_setup_runs_as_written() {
    let script = distributed_block();
    assert!(
        script.contains("redis-cli -h 127.0.0.1 -p 6379 ping ||"),
        "{script}"
    );
    assert!(script.contains("--expected-instances 2"), "{script}");
    assert!(
        !script.contains("8080") && !script.contains("8081"),
        "{script}"
    );
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_tollgate")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    // The suite's Redis (scripts/test.sh starts its own) plays the one on 6379.
    let script = script.replace("6379", &shared_port().to_string());
    // The documented ports where free; all moved when one was lost to another process (the
    // script's services cannot bind port 0 and say where they are).
    let mut documented = true;
    let (status, stdout, stderr) =
        on_free_ports("the docs' distributed setup", |moved: [u16; 4]| {
            let mut script = script.clone();
            for (port, to) in ["9080", "9081", "9180", "9181"].into_iter().zip(moved) {
                if !documented || !port_is_free(port.parse().unwrap()) {
                    script = script.replace(port, &to.to_string());
                }
            }
            documented = false;
            let mut cmd = Command::new("bash");
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("TOLLGATE_") {
                    cmd.env_remove(k);
                }
            }
            let mut child = cmd
                .arg("-e")
                .arg("-c")
                .arg(&script)
                .env("PATH", &path)
                .current_dir(repo())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                // Its own process group: whatever is left is stopped with it.
                .process_group(0)
                .spawn()
                .unwrap();
            let status = wait_then_stop(&mut child, Duration::from_secs(60));
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            let lost = !status.is_some_and(|s| s.success()) && stderr.contains("in use");
            (!lost).then_some((status, stdout, stderr))
        });
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

// ---------------------------------------------------------------------------------------------
// Every shell block of README.md and docs/*.md
// ---------------------------------------------------------------------------------------------

/// The languages of a block a reader would paste into a shell.
const SHELL: &[&str] = &["sh", "bash", "shell", "console"];

/// Ports the blocks use as the quick start does; replaced by free ones only when taken.
const FIXED_PORTS: [u16; 3] = [8080, 8081, 6070];

/// How a shell block is run, from the HTML comment on the line before it.
#[derive(Debug, Clone, PartialEq)]
enum How {
    /// `<!-- run -->`: as written, on its own; it must end, with status 0.
    Run,
    /// `<!-- run: server -->`: the same, while the quick start's `tollgate serve` runs. A block
    /// of `$ command` lines followed by their output runs its commands only.
    WithServer,
    /// `<!-- run: serve -->`: starts a service in the foreground; it must print its
    /// `listening:` line, then it is stopped.
    Serve,
    /// `<!-- not run: REASON -->`.
    NotRun(String),
    /// `<!-- NAME: crates/.../tests/X.rs ... -->`: run by that test, which finds the block by
    /// its marker.
    ByTest { marker: String, test: String },
}

struct Block {
    file: String,
    line: usize,
    how: Option<How>,
    /// `| stdout has: TEXT` after the mode: what the block's output must contain.
    expect: Vec<String>,
    text: String,
}

/// The shell blocks of `text` (a Markdown file called `file`), with the comment before each.
fn shell_blocks(file: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or(lines.len());
        i = end + 1;
        if !SHELL.contains(&lang.trim()) {
            continue;
        }
        let marker = start.checked_sub(1).map_or("", |p| lines[p].trim());
        blocks.push(Block {
            file: file.to_owned(),
            line: start + 1,
            how: parse_marker(marker),
            expect: expectations(marker),
            text: lines[start + 1..end].join("\n") + "\n",
        });
    }
    blocks
}

/// The comment's text, without what follows a ` | ` (the expectations).
fn comment(line: &str) -> Option<&str> {
    let inner = line.strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    Some(inner.split(" | ").next().unwrap_or(inner).trim())
}

/// The `| stdout has: TEXT` parts of a marker.
fn expectations(line: &str) -> Vec<String> {
    let Some(inner) = line
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
    else {
        return Vec::new();
    };
    inner
        .split(" | ")
        .skip(1)
        .filter_map(|part| part.trim().strip_prefix("stdout has:"))
        .map(|text| text.trim().to_owned())
        .collect()
}

fn parse_marker(line: &str) -> Option<How> {
    let inner = comment(line)?;
    if inner == "run" {
        return Some(How::Run);
    }
    if let Some(mode) = inner.strip_prefix("run:") {
        return match mode.trim() {
            "server" => Some(How::WithServer),
            "serve" => Some(How::Serve),
            _ => None,
        };
    }
    if let Some(reason) = inner.strip_prefix("not run:") {
        return Some(How::NotRun(reason.trim().to_owned()));
    }
    let (marker, rest) = inner.split_once(':')?;
    let test = rest.split_whitespace().next()?;
    (test.starts_with("crates/") && test.contains("/tests/")).then(|| How::ByTest {
        marker: marker.trim().to_owned(),
        test: test.to_owned(),
    })
}

/// The environment of a block: the built `tollgate` first on `PATH` (as after `cargo install`),
/// no `TOLLGATE_*` from the caller, and, when a fixed port had to move, settings that follow it.
struct Env {
    path: String,
    ports: Vec<(u16, u16)>,
}

impl Env {
    /// The fixed ports where free, else the `moved` ones (every one with `all`).
    fn new(moved: [u16; 3], all: bool) -> Env {
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_tollgate")).parent().unwrap();
        let ports = FIXED_PORTS
            .iter()
            .zip(moved)
            .map(|(&p, to)| (p, if !all && port_is_free(p) { p } else { to }))
            .collect();
        Env {
            path: format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
            ports,
        }
    }

    fn port(&self, fixed: u16) -> u16 {
        self.ports.iter().find(|(f, _)| *f == fixed).unwrap().1
    }

    /// `text` with every moved port replaced, and the suite's Redis (`TOLLGATE_TEST_REDIS_URL`,
    /// scripts/test.sh's own) in place of the one on 6379 a block names.
    fn script(&self, text: &str) -> String {
        let mut s = text.replace("127.0.0.1:6379", &format!("127.0.0.1:{}", shared_port()));
        for (fixed, port) in &self.ports {
            if fixed != port {
                s = s.replace(&fixed.to_string(), &port.to_string());
            }
        }
        s
    }

    fn vars(&self) -> Vec<(String, String)> {
        let (http, grpc, debug) = (self.port(8080), self.port(8081), self.port(6070));
        let mut v = vec![("PATH".to_owned(), self.path.clone())];
        if (http, grpc, debug) != (8080, 8081, 6070) {
            for (k, val) in [
                ("TOLLGATE_HTTP_ADDR", format!("0.0.0.0:{http}")),
                ("TOLLGATE_GRPC_ADDR", format!("0.0.0.0:{grpc}")),
                ("TOLLGATE_URL", format!("http://127.0.0.1:{http}")),
                ("PORT", http.to_string()),
                ("GRPC_PORT", grpc.to_string()),
                ("DEBUG_PORT", debug.to_string()),
            ] {
                v.push((k.to_owned(), val));
            }
        }
        v
    }

    fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("bash");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TOLLGATE_") {
                cmd.env_remove(k);
            }
        }
        cmd.arg("-e")
            .arg("-c")
            .arg(script)
            .envs(self.vars())
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: whatever it leaves running is stopped with it.
            .process_group(0);
        cmd
    }
}

/// Ports the standalone blocks bind besides the fixed ones (the gateway walk-through's nginx
/// and stand-in API).
const BLOCK_PORTS: &[u16] = &[8000, 9000];

/// Wait until the ports a standalone block binds are free again: the services of the block
/// before may still be closing their listeners.
fn wait_for_free_ports(env: &Env) {
    let ports: Vec<u16> = env
        .ports
        .iter()
        .map(|(_, p)| *p)
        .chain(BLOCK_PORTS.iter().copied())
        .collect();
    let until = Instant::now() + Duration::from_secs(30);
    while let Some(p) = ports.iter().find(|p| !port_is_free(**p)) {
        assert!(Instant::now() < until, "port {p} stays taken");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_group(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

/// Wait for `child` (the leader of its own process group) at most `limit`, then stop whatever
/// of its group is left; its status if it ended in time.
fn wait_then_stop(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    kill_group(child.id());
    status
}

/// Run `script` to its end (at most `limit`); `Err` with its output unless it exits 0 and its
/// standard output holds each of `expect`.
fn run_to_end(env: &Env, script: &str, limit: Duration, expect: &[String]) -> Result<(), String> {
    let mut child = env.command(script).spawn().unwrap();
    let status = wait_then_stop(&mut child, limit);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match status {
        Some(s) if s.success() => match expect
            .iter()
            .find(|e| !String::from_utf8_lossy(&out.stdout).contains(e.as_str()))
        {
            None => Ok(()),
            Some(e) => Err(format!("no `{e}` in its output\n{text}")),
        },
        Some(s) => Err(format!("{s}\n{text}")),
        None => Err(format!("did not end within {limit:?}\n{text}")),
    }
}

/// Start `script` (a foreground service), wait for its `listening:` line, stop it.
fn run_until_listening(env: &Env, script: &str) -> Result<(), String> {
    use std::io::{BufRead, BufReader};
    let mut child = env.command(script).spawn().unwrap();
    let group = child.id();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let until = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let listening = loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("listening:") => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    kill_group(group);
    let out = child.wait_with_output().unwrap();
    if listening {
        Ok(())
    } else {
        Err(format!(
            "no listening line\nstdout:\n{}\nstderr:\n{}",
            seen.join("\n"),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The commands of a `$ command` / output transcript, or the whole block.
fn commands(text: &str) -> String {
    if !text.lines().any(|l| l.starts_with("$ ")) {
        return text.to_owned();
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("$ "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The quick start's `tollgate serve` (repository root, default rules and ports).
fn quick_start_server(env: &Env) -> Result<support::Server, String> {
    let vars = env.vars();
    let vars: Vec<(&str, &str)> = vars
        .iter()
        .filter(|(k, _)| k != "PATH")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    support::Server::launch_under(&[], &["serve"], &vars, &repo(), "doc-blocks-quick-start")
        .map_err(|e| format!("the quick start's serve: {e}"))
}

/// Run a block marked `run`, `run: server` or `run: serve` in `env` (`server`: the quick-start
/// server of the file, started for the first `run: server` block, stopped before a block that
/// starts its own services).
fn run_block(
    env: &Env,
    server: &mut Option<support::Server>,
    how: &How,
    block: &Block,
) -> Result<(), String> {
    let script = env.script(&block.text);
    match how {
        How::WithServer => {
            if server.is_none() {
                *server = Some(quick_start_server(env)?);
            }
            run_to_end(
                env,
                &commands(&script),
                Duration::from_secs(120),
                &block.expect,
            )
        }
        How::Run => {
            *server = None;
            wait_for_free_ports(env);
            run_to_end(env, &script, Duration::from_secs(120), &block.expect)
        }
        How::Serve => {
            *server = None;
            wait_for_free_ports(env);
            run_until_listening(env, &script)
        }
        How::NotRun(_) | How::ByTest { .. } => unreachable!("not run here"),
    }
}

/// Every shell block that README.md and docs/*.md show is run as written (or run by the test
/// its marker names, or marked not run with a reason): a snippet that breaks fails here. An
/// unmarked shell block fails too, so a new one cannot slip in untested.
#[test]
fn every_shell_block_in_the_docs_runs_as_written() {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);

    let mut env = Env::new(std::array::from_fn(|_| free_port()), false);
    let mut failures = Vec::new();
    let (mut ran, mut not_run) = (0, 0);
    for path in &files {
        let name = path
            .strip_prefix(repo())
            .unwrap_or(path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(path).unwrap();
        // One quick-start server per file, for its `run: server` blocks; stopped before a block
        // that starts its own services.
        let mut server: Option<support::Server> = None;
        for block in shell_blocks(&name, &text) {
            let at = format!("{}:{}", block.file, block.line);
            let result = match &block.how {
                None => Err(
                    "unmarked shell block: put `<!-- run -->`, `<!-- run: server -->`, \
                     `<!-- run: serve -->` or `<!-- not run: REASON -->` on the line before it"
                        .to_owned(),
                ),
                Some(How::NotRun(reason)) if reason.is_empty() => {
                    Err("`not run` needs a reason".to_owned())
                }
                Some(How::NotRun(_)) => {
                    not_run += 1;
                    Ok(())
                }
                Some(How::ByTest { marker, test }) => {
                    let test_text = std::fs::read_to_string(repo().join(test)).unwrap_or_default();
                    if test_text.contains(&format!("<!-- {marker}:")) {
                        Ok(())
                    } else {
                        Err(format!("{test} does not look for `<!-- {marker}:`"))
                    }
                }
                Some(how) => {
                    ran += 1;
                    match run_block(&env, &mut server, how, &block) {
                        // A port lost to another process meanwhile: the block again, with
                        // every port moved.
                        Err(e) if e.contains("in use") => on_free_ports(&at, |moved| {
                            env = Env::new(moved, true);
                            server = None;
                            match run_block(&env, &mut server, how, &block) {
                                Err(e) if e.contains("in use") => None,
                                result => Some(result),
                            }
                        }),
                        result => result,
                    }
                }
            };
            if let Err(e) = result {
                failures.push(format!("{at}:\n{}\n=> {e}", block.text));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the docs' shell blocks failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        ran >= 10,
        "only {ran} blocks ran ({not_run} marked not run)"
    );
}

#[test]
fn doc_block_markers_parse() {
    assert_eq!(parse_marker("<!-- run -->"), Some(How::Run));
    assert_eq!(parse_marker("<!-- run: server -->"), Some(How::WithServer));
    assert_eq!(parse_marker("<!-- run: serve -->"), Some(How::Serve));
    assert_eq!(
        parse_marker("<!-- not run: needs a cluster -->"),
        Some(How::NotRun("needs a cluster".into()))
    );
    assert_eq!(
        parse_marker("<!-- embed: crates/tollgate-tower/tests/readme.rs builds it -->"),
        Some(How::ByTest {
            marker: "embed".into(),
            test: "crates/tollgate-tower/tests/readme.rs".into()
        })
    );
    assert_eq!(parse_marker("<!-- run: sometimes -->"), None);
    let marker = "<!-- run | stdout has: 200 429 | stdout has: spoofed: 429 -->";
    assert_eq!(parse_marker(marker), Some(How::Run));
    assert_eq!(expectations(marker), ["200 429", "spoofed: 429"]);
    assert_eq!(parse_marker("some text"), None);
    let blocks = shell_blocks(
        "x.md",
        "<!-- run -->\n```sh\necho a\n```\n\n```yaml\na: 1\n```\n```sh\necho b\n```\n",
    );
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].how, Some(How::Run));
    assert_eq!(blocks[0].text, "echo a\n");
    assert_eq!(blocks[1].how, None);
}

/// Regression: the migration guide said both that envoy's debug port (6070) has no tollgate
/// counterpart and that `/rlconfig` and `/stats` are served there (they are), and the swap
/// manifest's comment repeated the first. The guide and the manifest keep the port.
#[test]
fn the_migration_guide_and_swap_manifest_keep_the_debug_port() {
    let guide =
        std::fs::read_to_string(repo().join("docs/migrating-from-envoy-ratelimit.md")).unwrap();
    assert!(
        !guide.contains("no tollgate counterpart"),
        "docs/migrating-from-envoy-ratelimit.md"
    );
    assert!(guide.contains("/rlconfig"));
    let manifest =
        std::fs::read_to_string(repo().join("deploy/kubernetes/envoy-ratelimit-swap.yaml"))
            .unwrap();
    assert!(manifest.contains("containerPort: 6070"), "{manifest}");
    assert!(!manifest.contains("debug port 6070 is gone"), "{manifest}");
}

/// Regression: docs/distributed.md said `GET /v1/rules` shows each limit's sync mode; without
/// the admin token it is a summary listing no limit. The page says where the mode shows for
/// whom, and the service does as it says.
#[test]
fn the_distributed_guide_says_who_sees_each_limits_sync_mode() {
    let page = std::fs::read_to_string(repo().join("docs/distributed.md")).unwrap();
    let intro = page.split("\n\n").nth(1).expect("the opening paragraph");
    assert!(intro.contains("GET /v1/rules"), "{intro}");
    assert!(
        intro.contains("with the admin token") && intro.contains("summary"),
        "docs/distributed.md's opening paragraph promises each limit's mode in GET /v1/rules \
         without saying it needs the admin token:\n{intro}"
    );
    assert!(intro.contains("tollgate_rule_limit"), "{intro}");

    use support::client::Method;
    let server = support::serve_rules(
        &repo().join("examples/rules").display().to_string(),
        &[],
        "sync-mode-summary",
    );
    let rules: serde_json::Value =
        serde_json::from_str(&support::http(&server.base, Method::GET, "/v1/rules", None).body)
            .unwrap();
    assert_eq!(rules["detail"], "summary", "{rules}");
    assert!(!rules.to_string().contains("\"sync\""), "{rules}");
    let metrics = support::http(&server.base, Method::GET, "/metrics", None).body;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_rule_limit{") && l.contains("sync=\"exact\"")),
        "{metrics}"
    );
}

/// Every port a docs block may name, moved together when a block is run on other ports.
const DOC_PORTS: [u16; 9] = [8080, 8081, 6070, 9080, 9081, 9180, 9181, 8000, 9000];

/// The requests a `tollgate serve` answered (decisions and refused requests alike), from its
/// `/metrics`.
fn requests_answered(base: &str) -> u64 {
    support::http(base, support::client::Method::GET, "/metrics", None)
        .body
        .lines()
        .filter(|l| {
            l.starts_with("tollgate_requests_total{")
                || l.starts_with("tollgate_request_errors_total{")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Regression: with the quick start's `serve` still on 8080, docs/dashboard.md's block printed
/// `Address already in use`, its readiness wait succeeded against the old server, and every
/// check went to that one. Each block that starts `tollgate serve` in the background is run
/// here with its HTTP port held by another `tollgate serve`: it must stop with an error (its
/// serve's own reason on stderr) and send that other server nothing.
#[test]
fn a_block_whose_server_cannot_start_stops_there() {
    let mut files = vec![repo().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "md") {
            files.push(p);
        }
    }
    files.sort();
    let holder = support::Server::start(
        &["--http-addr", "0.0.0.0:0", "--grpc-addr", "off"],
        &repo(),
        "doc-blocks-port-holder",
    );
    let held = holder.port();
    let mut tried = Vec::new();
    let mut failures = Vec::new();
    for path in &files {
        let name = path
            .strip_prefix(repo())
            .unwrap_or(path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(path).unwrap();
        for block in shell_blocks(&name, &text) {
            // A `tollgate serve` sent to the background (`&`, not `&&`), over continued lines.
            let joined = block.text.replace("\\\n", " ");
            let background = joined.lines().any(|l| {
                l.contains("tollgate serve") && l.replace("&&", "").replace(">&", "").contains('&')
            });
            if !background || matches!(block.how, Some(How::NotRun(_))) {
                continue;
            }
            // Its HTTP port: the first of the ports a block's serve takes.
            let Some(http) = [8080u16, 9080]
                .into_iter()
                .filter_map(|p| block.text.find(&p.to_string()).map(|at| (at, p)))
                .min()
                .map(|(_, p)| p)
            else {
                continue;
            };
            let at = format!("{}:{}", block.file, block.line);
            tried.push(at.clone());
            let mut moved: Vec<(u16, u16)> = DOC_PORTS
                .iter()
                .map(|&p| (p, if p == http { held } else { free_port() }))
                .collect();
            moved.push((6379, shared_port()));
            let mut script = commands(&block.text);
            for (from, to) in &moved {
                script = script.replace(&from.to_string(), &to.to_string());
            }
            let to = |p: u16| moved.iter().find(|(f, _)| *f == p).unwrap().1;
            let env = Env {
                path: Env::new([0; 3], false).path,
                ports: vec![(8080, to(8080)), (8081, to(8081)), (6070, to(6070))],
            };
            let before = requests_answered(&holder.base);
            let mut child = env.command(&script).spawn().unwrap();
            let status = wait_then_stop(&mut child, Duration::from_secs(60));
            let out = child.wait_with_output().unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            let sent = requests_answered(&holder.base) - before;
            let why = match status {
                None => Some("did not stop within 60 s".to_owned()),
                Some(s) if s.success() => Some("ended with status 0".to_owned()),
                Some(_) if sent > 0 => Some(format!(
                    "sent {sent} request(s) to the server already on its port"
                )),
                Some(_) if !stderr.contains("in use") => {
                    Some("did not show its serve's reason (address in use)".to_owned())
                }
                Some(_) => None,
            };
            if let Some(why) = why {
                failures.push(format!("{at}: {why}\nstdout:\n{stdout}\nstderr:\n{stderr}"));
            }
        }
    }
    eprintln!("blocks run with their port held: {tried:?}");
    assert!(
        tried.len() >= 4,
        "only {} blocks start a server in the background: {tried:?}",
        tried.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} blocks went on with another server on their port:\n\n{}",
        failures.len(),
        tried.len(),
        failures.join("\n\n")
    );
}
