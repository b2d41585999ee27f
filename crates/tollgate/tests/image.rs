//! The container image, built from `Containerfile` and run by a real engine (podman with runc),
//! the way the Kubernetes manifests run it: each test reads its pod spec from
//! `deploy/kubernetes/` (environment, user, read-only root, where the ConfigMap is mounted, the
//! probes) and runs the container with exactly that, the ConfigMap written in the kubelet's
//! layout (symlinks through `..data`, swapped on an update).
//!
//! The image is built from the static binary `scripts/test.sh` makes first
//! (`cargo build --profile image --target x86_64-unknown-linux-gnu`, glibc linked statically),
//! with `--build-arg BINARY=host` (docs/deploy.md, "Container image"). The engine's state lives under
//! `target/tmp/podman` (vfs storage, runc, cgroupfs: what works inside this kind of container
//! host; see `containers.conf` below), never in the user's own podman setup; containers have
//! unique names and are removed on drop. Containers share the host's network and listen on free
//! loopback ports.
//!
//! Figures (image size, start to ready, RSS) are printed (`--nocapture`), never asserted.

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::client::{HttpResponse, Method};
use support::kube::{write_configmap, Manifest};
use support::{repo, temp_dir, try_http};

/// The binary the Containerfile's `host` stage copies (relative to the repository).
const BINARY: &str = "target/x86_64-unknown-linux-gnu/image/tollgate";
const IMAGE: &str = "localhost/tollgate:test";

/// Engine settings: storage in `target/tmp/podman`, vfs (no overlay inside a container), runc
/// (crun fails here on cgroups and rlimits), cgroupfs, events to a file.
fn engine_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("podman");
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        std::fs::write(
            dir.join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\n",
        )
        .unwrap();
        dir
    })
}

/// `podman` with this test's engine settings.
fn podman(args: &[&str]) -> Command {
    let dir = engine_dir();
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", dir.join("containers.conf"))
        .env("TMPDIR", dir.join("tmp"))
        .arg("--root")
        .arg(dir.join("storage"))
        .arg("--runroot")
        .arg(dir.join("run"))
        .args(["--storage-driver", "vfs", "--runtime", "/usr/sbin/runc"])
        .args(args);
    cmd
}

/// Run `podman ARGS`; a failure (or podman missing) panics with its output.
fn run_podman(args: &[&str]) -> Output {
    let out = podman(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run podman ({e}): install the Debian packages podman and runc \
             (scripts/test.sh does when run as root)"
        )
    });
    assert!(
        out.status.success(),
        "podman {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Build the image once per test run, from the host-built static binary.
fn image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let binary = repo().join(BINARY);
        assert!(
            binary.is_file(),
            "{BINARY} is missing: run scripts/test.sh, or build it with \
             RUSTFLAGS='-C target-feature=+crt-static' cargo build --profile image --locked \
             -p tollgate --bin tollgate --target x86_64-unknown-linux-gnu"
        );
        let context = repo().display().to_string();
        run_podman(&[
            "build",
            "--build-arg",
            "BINARY=host",
            "-t",
            IMAGE,
            "-f",
            "Containerfile",
            &context,
        ]);
        // Earlier builds' images, untagged by this one, would pile up in target/.
        let _ = podman(&["image", "prune", "-f"]).output();
        let size = inspect_image("{{.Size}}");
        println!("image {IMAGE}: {size} bytes");
    });
    IMAGE
}

fn inspect_image(format: &str) -> String {
    let out = run_podman(&["image", "inspect", "-f", format, IMAGE]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A running container, removed on drop.
struct Container {
    name: String,
    base: String,
    started: Instant,
}

impl Container {
    /// `podman run -d` of the image as `manifest`'s pod spec runs it (environment, user,
    /// read-only root, the ConfigMap directory `configmap` at its mount path), with `extra_env`
    /// after the manifest's (later wins) and the listeners moved to free loopback ports.
    fn run(
        manifest: &Manifest,
        configmap: &Path,
        extra_env: &[(&str, String)],
        name: &str,
    ) -> Container {
        let image = image();
        let name = format!("tollgate-test-{name}-{}", std::process::id());
        let _ = podman(&["rm", "-f", &name]).output();
        let mount = format!("{}:{}:ro", configmap.display(), manifest.configmap_mount());
        let user = manifest.run_as();
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            "host",
            "--user",
            &user,
            "-v",
            &mount,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if manifest.read_only_root() {
            args.push("--read-only".into());
        }
        let env = manifest
            .env()
            .into_iter()
            .chain(extra_env.iter().map(|(k, v)| (k.to_string(), v.clone())));
        for (k, v) in env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.push(image.into());
        let started = Instant::now();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_podman(&args);
        Container {
            name,
            base: String::new(),
            started,
        }
    }

    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Wait until the container's `listening:` line names its HTTP address (it binds port 0,
    /// on the host's network) and `GET path` there answers 200; returns the time since
    /// `podman run`. The address is then [`Container::base`].
    fn wait_ready(&mut self, path: &str) -> Duration {
        let until = Instant::now() + Duration::from_secs(60);
        self.base = loop {
            let logs = self.logs();
            let http = logs
                .lines()
                .find_map(|l| l.strip_prefix("listening: HTTP http://"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|addr| addr.rsplit(':').next());
            if let Some(port) = http {
                break format!("http://127.0.0.1:{port}");
            }
            assert!(
                Instant::now() < until,
                "{} printed no listening line after 60 s; logs:\n{logs}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        loop {
            if let Ok(r) = get(&self.base, path) {
                if r.status == 200 {
                    return self.started.elapsed();
                }
            }
            assert!(
                Instant::now() < until,
                "{} not ready on {path} after 60 s; logs:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn inspect(&self, format: &str) -> String {
        let out = run_podman(&["inspect", "-f", format, &self.name]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Resident memory of the container's process (its `VmRSS`, read on the host), in kB.
    fn rss_kb(&self) -> u64 {
        let pid = self.inspect("{{.State.Pid}}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// `podman kill --signal SIGNAL`.
    fn signal(&self, signal: &str) {
        run_podman(&["kill", "--signal", signal, &self.name]);
    }

    /// Wait for the container to exit; its exit code.
    fn wait_exit(&self) -> i64 {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let state = self.inspect("{{.State.Status}} {{.State.ExitCode}}");
            if let Some(code) = state.strip_prefix("exited ") {
                return code.parse().unwrap();
            }
            assert!(
                Instant::now() < until,
                "{} still {state} 60 s after SIGTERM; logs:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", &self.name]).output();
    }
}

fn get(base: &str, path: &str) -> anyhow::Result<HttpResponse> {
    try_http(base, Method::GET, path, None)
}

/// One hit over `/v1/check`; the response body.
fn check(base: &str, domain: &str, entries: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    let r = try_http(
        base,
        Method::POST,
        "/v1/check",
        Some(json!({"domain": domain, "descriptors": [{"entries": entries}]})),
    )
    .expect("POST /v1/check");
    assert!(r.status == 200 || r.status == 429, "{r:?}");
    serde_json::from_str(&r.body).unwrap()
}

/// The listener settings that put tollgate on loopback ports it picks (see
/// [`Container::wait_ready`]).
fn listeners() -> Vec<(&'static str, String)> {
    vec![
        ("TOLLGATE_HTTP_ADDR", "127.0.0.1:0".to_string()),
        ("TOLLGATE_GRPC_ADDR", "127.0.0.1:0".to_string()),
    ]
}

/// The image's own settings: the entrypoint, a non-root user, the example rules, the ports.
#[test]
fn image_is_minimal_and_runs_serve_as_non_root() {
    image();
    assert_eq!(
        inspect_image("{{json .Config.Entrypoint}}"),
        r#"["/tollgate","serve"]"#
    );
    assert_eq!(inspect_image("{{.Config.User}}"), "65532:65532");
    let env = inspect_image("{{json .Config.Env}}");
    assert!(env.contains("TOLLGATE_RULES=/etc/tollgate/rules"), "{env}");
    let ports = inspect_image("{{json .Config.ExposedPorts}}");
    assert!(
        ports.contains("8080/tcp") && ports.contains("8081/tcp"),
        "{ports}"
    );
    // The binary, the rules and nothing else: one layer per COPY.
    let layers: Vec<Value> =
        serde_json::from_str(&inspect_image("{{json .RootFS.Layers}}")).unwrap();
    assert_eq!(layers.len(), 2, "{layers:?}");
}

/// deploy/kubernetes/tollgate.yaml's pod, run by podman: ready on its readiness probe, answers a
/// check with the ConfigMap's rules, reloads an updated ConfigMap (the `..data` symlink swap)
/// while running, and exits 0 on SIGTERM.
#[test]
fn image_runs_the_kubernetes_pod_reloads_the_configmap_and_stops_cleanly() {
    let manifest = Manifest::load("tollgate.yaml");
    let files = manifest.configmap_files();
    let cm = temp_dir("image-configmap");
    write_configmap(&cm, "2026_11_24_00_00_00.000000001", &files);

    let mut c = Container::run(&manifest, &cm, &listeners(), "pod");
    let ready = c.wait_ready(&manifest.probe_path("readinessProbe"));
    let base = c.base.clone();
    let rss = c.rss_kb();
    println!("start to ready: {ready:?} (podman run -d until /readyz answers 200); RSS {rss} kB");
    let live = get(&base, &manifest.probe_path("livenessProbe")).unwrap();
    assert_eq!(live.status, 200, "{live:?}");
    // The container runs as the manifest's user.
    let pid = c.inspect("{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = manifest.run_as();
    let uid = uid.split(':').next().unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(uid)),
        "{status}"
    );

    let limit = |user: &str| {
        check(&base, "api", &[("user", user)])["statuses"][0]["current_limit"]["requests_per_unit"]
            .clone()
    };
    assert_eq!(limit("alice"), 100, "the ConfigMap's rules");

    // The ConfigMap edited: the kubelet writes a new version and swaps `..data`.
    let edited: Vec<(String, String)> = files
        .iter()
        .map(|(k, v)| {
            let v2 = v.replace("requests_per_unit: 100", "requests_per_unit: 7");
            assert_ne!(&v2, v, "the test edits the user limit of {k}");
            (k.clone(), v2)
        })
        .collect();
    write_configmap(&cm, "2026_11_24_00_01_00.000000002", &edited);
    let until = Instant::now() + Duration::from_secs(60);
    while limit("bob") != 7 {
        assert!(
            Instant::now() < until,
            "ConfigMap update not picked up after 60 s; logs:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let rules: Value = serde_json::from_str(&get(&base, "/v1/rules").unwrap().body).unwrap();
    assert!(rules["last_reload_error"].is_null(), "{rules}");

    c.signal("TERM");
    let code = c.wait_exit();
    let logs = c.logs();
    assert_eq!(code, 0, "exit code after SIGTERM; logs:\n{logs}");
    assert!(
        logs.contains("SIGTERM received") && logs.contains("stopped"),
        "{logs}"
    );
    assert!(!logs.contains("panicked"), "{logs}");
    let _ = std::fs::remove_dir_all(&cm);
}

/// deploy/kubernetes/tollgate-redis.yaml's pod: the store URL from the Secret (here pointing at
/// the test Redis, by a host name resolved by the static binary), ready, counting in Redis.
#[test]
fn image_runs_the_redis_pod_with_the_url_from_the_secret() {
    let manifest = Manifest::load("tollgate-redis.yaml");
    assert!(manifest.env_from_secret("TOLLGATE_STORE"));
    let cm = temp_dir("image-configmap-redis");
    write_configmap(
        &cm,
        "2026_11_24_00_00_00.000000001",
        &manifest.configmap_files(),
    );
    let prefix = tollgate_testsupport::unique_prefix("image");
    let mut env = listeners();
    // What the user puts in the Secret; `localhost` is resolved in the container (/etc/hosts).
    env.push((
        "TOLLGATE_STORE",
        format!("redis://localhost:{}", tollgate_testsupport::shared_port()),
    ));
    env.push(("TOLLGATE_REDIS_PREFIX", prefix.clone()));
    let mut c = Container::run(&manifest, &cm, &env, "redis");
    c.wait_ready(&manifest.probe_path("readinessProbe"));
    let base = c.base.clone();
    let ready: Value = serde_json::from_str(&get(&base, "/readyz").unwrap().body).unwrap();
    assert_eq!(ready["store"], "redis", "{ready}");
    assert_eq!(ready["store_state"], "healthy", "{ready}");
    let first = check(&base, "api", &[("user", "carol")]);
    let second = check(&base, "api", &[("user", "carol")]);
    assert_eq!(first["statuses"][0]["limit_remaining"], 99, "{first}");
    assert_eq!(second["statuses"][0]["limit_remaining"], 98, "{second}");
    let keys = tollgate_testsupport::delete_prefix(tollgate_testsupport::shared_url(), &prefix);
    assert!(keys > 0, "no counter under {prefix} in Redis");
    c.signal("TERM");
    assert_eq!(c.wait_exit(), 0, "{}", c.logs());
    let _ = std::fs::remove_dir_all(&cm);
}

/// deploy/kubernetes/envoy-ratelimit-swap.yaml: an envoyproxy/ratelimit pod spec with the image
/// swapped keeps working: its variables (`TOLLGATE_PROFILE=envoy`, `PORT`, `GRPC_PORT`,
/// `RUNTIME_*`, `REDIS_*`), its ConfigMap under `RUNTIME_ROOT`, its `/healthcheck` and `/json`.
#[test]
fn image_swaps_in_for_envoy_ratelimit_keeping_its_environment() {
    let manifest = Manifest::load("envoy-ratelimit-swap.yaml");
    let env: Vec<(String, String)> = manifest.env();
    assert!(
        env.contains(&("TOLLGATE_PROFILE".into(), "envoy".into())),
        "{env:?}"
    );
    let cm = temp_dir("image-configmap-envoy");
    write_configmap(
        &cm,
        "2026_11_24_00_00_00.000000001",
        &manifest.configmap_files(),
    );
    // envoy's own variables move the listeners and point REDIS_URL at the test Redis (a host
    // name, resolved in the container); CACHE_KEY_PREFIX keeps this run's counters (envoy's key
    // layout) apart.
    let prefix = tollgate_testsupport::unique_prefix("swap");
    let extra = [
        ("HOST", "127.0.0.1".to_string()),
        ("PORT", "0".to_string()),
        ("GRPC_HOST", "127.0.0.1".to_string()),
        ("GRPC_PORT", "0".to_string()),
        (
            "REDIS_URL",
            format!("localhost:{}", tollgate_testsupport::shared_port()),
        ),
        ("CACHE_KEY_PREFIX", format!("{prefix}:")),
    ];
    let mut c = Container::run(&manifest, &cm, &extra, "envoy");
    c.wait_ready(&manifest.probe_path("readinessProbe"));
    let base = c.base.clone();
    // 2 per minute from the ConfigMap: 1 hit passes, 3 more go over (whatever the window).
    let mut statuses = Vec::new();
    for hits in [1, 3] {
        let body = json!({"domain": "rl", "hitsAddend": hits, "descriptors": [{"entries": [
            {"key": "source_cluster", "value": "proxy"},
            {"key": "destination_cluster", "value": "mock"},
        ]}]});
        let r = try_http(&base, Method::POST, "/json", Some(body)).unwrap();
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        assert_eq!(
            v["statuses"][0]["currentLimit"]["requestsPerUnit"], 2,
            "{v}"
        );
        statuses.push(r.status);
    }
    assert_eq!(statuses, [200, 429]);
    let keys = tollgate_testsupport::delete_prefix(tollgate_testsupport::shared_url(), &prefix);
    assert!(keys > 0, "no counter under {prefix}: in Redis");
    let hc = get(&base, "/healthcheck").unwrap();
    assert_eq!((hc.status, hc.body.trim()), (200, "OK"), "{hc:?}");
    c.signal("TERM");
    assert_eq!(c.wait_exit(), 0, "{}", c.logs());
    let _ = std::fs::remove_dir_all(&cm);
}
