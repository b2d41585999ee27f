//! The deployment files checked by the tools that read them: the systemd unit by
//! `systemd-analyze verify` (and its hardening by `systemd-analyze security --offline`), the
//! Kubernetes manifests by `kubernetes-validate` against the Kubernetes JSON schemas (offline:
//! the PyPI package carries them), and what each of them feeds `tollgate` (the environment
//! file's variables, the ConfigMaps' rules) by `tollgate` itself. The container image, which runs
//! the manifests' pods, is tested in `image.rs`.
//!
//! `scripts/test.sh` installs systemd-analyze (Debian's `systemd`) when missing and
//! kubernetes-validate into a venv in `target/kubernetes-validate`;
//! `TOLLGATE_TEST_KUBERNETES_VALIDATE` may name another executable. Missing, a test fails and
//! says how to get it.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use support::kube::Manifest;
use support::{repo, temp_dir, Server};

const UNIT: &str = "packaging/systemd/tollgate.service";
const ENV_FILE: &str = "packaging/systemd/tollgate.env";
const MANIFESTS: [&str; 3] = [
    "tollgate.yaml",
    "tollgate-redis.yaml",
    "envoy-ratelimit-swap.yaml",
];

/// Whether `serve --help` (`help`) names `var` as a flag's variable (`[env: VAR=value]`, or
/// `[env: VAR]` for a hidden value).
fn is_serve_variable(help: &str, var: &str) -> bool {
    help.contains(&format!("[env: {var}=")) || help.contains(&format!("[env: {var}]"))
}

fn run(cmd: &mut Command, what: &str) -> Output {
    cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {what} ({e}): run scripts/test.sh, which installs it")
    })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The unit as installed, with the binary's path pointed at the one cargo built (verify checks
/// that ExecStart exists and is executable); nothing else is changed.
fn unit_for_verify() -> PathBuf {
    let unit = std::fs::read_to_string(repo().join(UNIT)).unwrap();
    assert!(
        unit.lines()
            .any(|l| l == "ExecStart=/usr/local/bin/tollgate serve"),
        "{UNIT}: ExecStart is not `/usr/local/bin/tollgate serve` (docs/deploy.md's install path)"
    );
    let dir = temp_dir("systemd-unit");
    let path = dir.join("tollgate.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/tollgate", env!("CARGO_BIN_EXE_tollgate")),
    )
    .unwrap();
    path
}

/// `systemd-analyze verify` accepts the unit with nothing to say (a warning fails too).
#[test]
fn systemd_unit_verifies() {
    let unit = unit_for_verify();
    let out = run(
        Command::new("systemd-analyze").arg("verify").arg(&unit),
        "systemd-analyze",
    );
    assert!(
        out.status.success() && text(&out).trim().is_empty(),
        "systemd-analyze verify {UNIT}: {}\n{}",
        out.status,
        text(&out)
    );
    let _ = std::fs::remove_dir_all(unit.parent().unwrap());
}

/// The hardening holds: systemd's own exposure score of the unit is at most 2.0 ("OK"; an
/// unhardened service scores 9.6) and the options the packaging promises are there.
#[test]
fn systemd_unit_is_hardened() {
    let unit = unit_for_verify();
    let out = run(
        Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--threshold=20", "--no-pager"])
            .arg(&unit),
        "systemd-analyze",
    );
    assert!(
        out.status.success(),
        "systemd-analyze security: exposure above 2.0:\n{}",
        text(&out)
    );
    let contents = std::fs::read_to_string(repo().join(UNIT)).unwrap();
    for line in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "EnvironmentFile=-/etc/tollgate/tollgate.env",
    ] {
        assert!(contents.lines().any(|l| l == line), "{UNIT}: no `{line}`");
    }
    let _ = std::fs::remove_dir_all(unit.parent().unwrap());
}

/// The example environment file is what `serve` reads: every variable in it is a `serve`
/// variable, and the service starts with all of them (listeners moved to free loopback ports,
/// rules to the repository's examples).
#[test]
fn systemd_environment_file_starts_serve() {
    let file = std::fs::read_to_string(repo().join(ENV_FILE)).unwrap();
    let help = String::from_utf8(support::tollgate(&["serve", "--help"]).stdout).unwrap();
    let mut env: Vec<(String, String)> = Vec::new();
    for line in file.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{ENV_FILE}: not KEY=VALUE: {line}"));
        assert!(
            is_serve_variable(&help, k),
            "{ENV_FILE}: {k} is not a `tollgate serve` variable"
        );
        env.push((k.to_string(), v.to_string()));
    }
    assert!(!env.is_empty());
    let rules = repo().join("examples/rules").display().to_string();
    for (k, v) in [
        ("TOLLGATE_HTTP_ADDR", "127.0.0.1:0".to_string()),
        ("TOLLGATE_GRPC_ADDR", "127.0.0.1:0".to_string()),
        ("TOLLGATE_RULES", rules),
    ] {
        env.retain(|(name, _)| name != k);
        env.push((k.to_string(), v));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut server = Server::start_env(&[], &env, &repo(), "systemd-env");
    let (status, _) = support::check(&server.base, "api", "user", "envfile");
    assert_eq!(status, 200, "{}", server.stderr());
    server.terminate();
    assert!(server.wait(std::time::Duration::from_secs(30)).success());
}

/// kubernetes-validate: `TOLLGATE_TEST_KUBERNETES_VALIDATE`, the venv `scripts/test.sh` makes,
/// or `kubernetes-validate` on the PATH.
fn kubernetes_validate() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_TEST_KUBERNETES_VALIDATE") {
        return PathBuf::from(p);
    }
    let venv = repo().join("target/kubernetes-validate/bin/kubernetes-validate");
    if venv.exists() {
        return venv;
    }
    if Command::new("kubernetes-validate")
        .arg("--version")
        .output()
        .is_ok()
    {
        return PathBuf::from("kubernetes-validate");
    }
    panic!(
        "kubernetes-validate is missing: run scripts/test.sh (it installs it into \
         target/kubernetes-validate), or `python3 -m venv target/kubernetes-validate && \
         target/kubernetes-validate/bin/pip install 'kubernetes-validate>=1.31,<2'`, or set \
         TOLLGATE_TEST_KUBERNETES_VALIDATE to its path"
    )
}

/// Every manifest validates, strictly (an unknown field is an error), against the schemas of
/// the newest Kubernetes the validator knows and of an older one still in wide use.
#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let validator = kubernetes_validate();
    let files: Vec<PathBuf> = MANIFESTS
        .iter()
        .map(|m| repo().join("deploy/kubernetes").join(m))
        .collect();
    let mut listed: Vec<String> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    listed.sort();
    let mut expected: Vec<String> = MANIFESTS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(
        listed, expected,
        "a manifest in deploy/kubernetes/ is not tested"
    );
    for version in [None, Some("1.29")] {
        let mut cmd = Command::new(&validator);
        cmd.args(["--strict", "--quiet"]);
        if let Some(v) = version {
            cmd.args(["--kubernetes-version", v]);
        }
        let out = run(cmd.args(&files), "kubernetes-validate");
        assert!(
            out.status.success() && !text(&out).contains("ERROR"),
            "kubernetes-validate (Kubernetes {}): {}\n{}",
            version.unwrap_or("newest"),
            out.status,
            text(&out)
        );
    }
}

/// The manifests' rules and settings are what tollgate reads: each ConfigMap's files pass
/// `tollgate validate`, every TOLLGATE_* variable is a `serve` variable, and the probes and
/// ports are the service's.
#[test]
fn kubernetes_manifests_hold_valid_rules_and_settings() {
    let help = String::from_utf8(support::tollgate(&["serve", "--help"]).stdout).unwrap();
    for name in MANIFESTS {
        let m = Manifest::load(name);
        let dir = temp_dir("manifest-rules");
        for (file, contents) in m.configmap_files() {
            std::fs::write(dir.join(file), contents).unwrap();
        }
        let out = support::tollgate(&["validate", dir.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{name}: ConfigMap rules:\n{}",
            text(&out)
        );
        for (k, _) in m.env() {
            if k.starts_with("TOLLGATE_") {
                assert!(
                    is_serve_variable(&help, &k),
                    "{name}: {k} is not a `tollgate serve` variable"
                );
            }
        }
        assert_eq!(m.container_port("http"), 8080, "{name}");
        assert_eq!(m.container_port("grpc"), 8081, "{name}");
        assert_eq!(m.probe_path("livenessProbe"), "/healthz", "{name}");
        let ready = m.probe_path("readinessProbe");
        assert!(
            ready == "/readyz" || ready == "/healthcheck",
            "{name}: {ready}"
        );
        assert!(m.read_only_root(), "{name}: root filesystem not read-only");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// docs/deploy.md (the Deploy page) says what the tests run: its image build line is the one
/// `scripts/test.sh` runs, its `podman` commands use the settings `image.rs` uses, and the
/// systemd and Kubernetes checks it names are the ones above.
#[test]
fn deploy_doc_commands_are_the_tested_ones() {
    let doc = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    let at = doc
        .find("<!-- deploy-image:")
        .expect("deploy-image marker in docs/deploy.md");
    let rest = &doc[at..];
    let start = rest.find("```sh\n").expect("sh block") + "```sh\n".len();
    let block = &rest[start..start + rest[start..].find("```").expect("end of block")];
    let joined = |s: &str| {
        s.replace("\\\n", " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let block = joined(block);
    let test_sh = joined(&std::fs::read_to_string(repo().join("scripts/test.sh")).unwrap());
    let build = "RUSTFLAGS='-C target-feature=+crt-static' cargo build --profile image --locked \
                 -p tollgate --bin tollgate --target x86_64-unknown-linux-gnu";
    assert!(block.contains(build), "docs/deploy.md: {block}");
    assert!(
        test_sh.contains(build),
        "scripts/test.sh builds the image binary otherwise"
    );
    let containerfile = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    assert!(joined(&containerfile).contains(&build.replace("RUSTFLAGS=", "RUN RUSTFLAGS=")));
    let image_rs =
        joined(&std::fs::read_to_string(repo().join("crates/tollgate/tests/image.rs")).unwrap());
    for (doc_part, test_part) in [
        (
            "podman build --build-arg BINARY=host",
            r#""build", "--build-arg", "BINARY=host","#,
        ),
        ("--network host", r#""--network", "host","#),
        ("--read-only", r#"args.push("--read-only".into())"#),
        (":/etc/tollgate/rules:ro", r#"format!("{}:{}:ro""#),
        (
            "podman kill --signal TERM",
            r#"run_podman(&["kill", "--signal", signal"#,
        ),
        (
            "curl -sf localhost:8080/readyz",
            r#"probe_path("readinessProbe")"#,
        ),
    ] {
        assert!(
            block.contains(doc_part),
            "docs/deploy.md's block lacks {doc_part:?}: {block}"
        );
        assert!(image_rs.contains(test_part), "image.rs lacks {test_part:?}");
    }
    assert_eq!(
        Manifest::load("tollgate.yaml").configmap_mount(),
        "/etc/tollgate/rules"
    );
    for named in [
        "systemd-analyze verify packaging/systemd/tollgate.service",
        "systemd-analyze security --offline=true --threshold=20",
        "kubernetes-validate --strict deploy/kubernetes/*.yaml",
        "kubectl apply -f deploy/kubernetes/tollgate.yaml",
    ] {
        assert!(
            joined(&doc).contains(named),
            "docs/deploy.md does not say {named:?}"
        );
    }
}
