//! Names the git commit the binary is built from, for `tollgate --version`: sets
//! `TOLLGATE_VERSION` to `0.1.0 (commit 0123456789ab)`, or to the bare package version when the
//! commit is unknown (a source tarball, a container build that copies no `.git`, no `git`
//! installed, a repository git refuses to read). `TOLLGATE_GIT_COMMIT` set by the builder wins
//! (for builds from a tree without `.git` that still know their commit).
//!
//! Also sets `TOLLGATE_OPT_LEVEL` to the profile's optimisation level, so that `serve` can say
//! when it runs unoptimised (the quick start's profile) and is no measure of its speed.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TOLLGATE_GIT_COMMIT");
    let commit = match std::env::var("TOLLGATE_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => Some(c.trim().to_owned()),
        _ => git_commit(),
    };
    let version = env!("CARGO_PKG_VERSION");
    let version = match commit {
        Some(c) => format!("{version} (commit {c})"),
        None => version.to_owned(),
    };
    println!("cargo:rustc-env=TOLLGATE_VERSION={version}");
    let opt = std::env::var("OPT_LEVEL").unwrap_or_default();
    println!("cargo:rustc-env=TOLLGATE_OPT_LEVEL={opt}");
}

/// The short hash of `HEAD`, and the files whose change moves it (rebuilds watch them), or
/// `None` when git cannot tell.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD itself, the branch it points to, and packed refs (where a branch lives after `git gc`).
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.extend(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

/// `git ARGS` in this package's directory: its trimmed output, `None` on any failure.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}
