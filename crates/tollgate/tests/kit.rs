//! What people expect of a command-line tool, checked on the real binary: `--version` names the
//! git commit it was built from, `tollgate completions SHELL` prints scripts the shells accept
//! and that complete subcommands and flags, `tollgate man` prints manual pages that render.
//! bash, zsh, fish and groff are needed (scripts/test.sh installs them).

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use support::{repo, temp_dir, tollgate};

/// The output of a successful `tollgate ARGS`, as text.
fn stdout_of(args: &[&str]) -> String {
    let out = tollgate(args);
    assert!(
        out.status.success(),
        "tollgate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Run `program ARGS` (a tool the test needs), failing with how to get it when it is missing.
fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("{program} is needed by this test ({e}): run scripts/test.sh, which installs it")
        })
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn version_names_the_git_commit() {
    let version = stdout_of(&["--version"]);
    let expected_version = format!("tollgate {}", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&expected_version), "{version}");
    // The build reads the commit with git; the test asks git the same question. (A build from a
    // tree without .git prints the bare version instead: nothing to compare with here.)
    let head = run(
        "git",
        &["-C", repo().to_str().unwrap(), "rev-parse", "HEAD"],
    );
    assert_ok("git rev-parse HEAD", &head);
    let head = String::from_utf8(head.stdout).unwrap();
    let short = &head.trim()[..12];
    assert_eq!(
        version.trim(),
        format!("{expected_version} (commit {short})"),
        "--version must name the commit the binary was built from"
    );
}

/// Source the bash script and ask its completion function, as bash does on TAB, for `words`
/// (the last one being completed); the candidates offered.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_LINE=\"${{COMP_WORDS[*]}}\"\n\
         COMP_POINT=${{#COMP_LINE}}\n_tollgate tollgate \"${{COMP_WORDS[COMP_CWORD]}}\" \
         \"${{COMP_WORDS[COMP_CWORD-1]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        quoted.join(" "),
        words.len() - 1
    );
    let out = run("bash", &["-c", &program]);
    assert_ok("bash completion", &out);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completions_parse_and_offer_subcommands_and_flags() {
    let dir = temp_dir("kit-bash");
    let script = dir.join("tollgate.bash");
    std::fs::write(&script, stdout_of(&["completions", "bash"])).unwrap();
    assert_ok("bash -n", &run("bash", &["-n", script.to_str().unwrap()]));

    assert_eq!(bash_complete(&script, &["tollgate", "ser"]), ["serve"]);
    let flags = bash_complete(&script, &["tollgate", "serve", "--redis-pre"]);
    assert_eq!(flags, ["--redis-prefix"]);
    let subcommands = bash_complete(&script, &["tollgate", ""]);
    for expected in [
        "serve",
        "check",
        "validate",
        "rules",
        "advise",
        "completions",
        "man",
    ] {
        assert!(
            subcommands.iter().any(|s| s == expected),
            "{expected} not offered: {subcommands:?}"
        );
    }
}

#[test]
fn zsh_and_fish_completions_parse() {
    let dir = temp_dir("kit-shells");
    for (shell, file) in [("zsh", "_tollgate"), ("fish", "tollgate.fish")] {
        let script = dir.join(file);
        std::fs::write(&script, stdout_of(&["completions", shell])).unwrap();
        assert_ok(
            &format!("{shell} -n"),
            &run(shell, &["-n", script.to_str().unwrap()]),
        );
    }
    // fish can list what it would offer without a terminal.
    let fish = run(
        "fish",
        &[
            "-c",
            &format!(
                "source '{}'; complete -C 'tollgate ser'",
                dir.join("tollgate.fish").display()
            ),
        ],
    );
    assert_ok("fish complete -C", &fish);
    let offered = String::from_utf8(fish.stdout).unwrap();
    assert!(offered.starts_with("serve\t"), "{offered}");
}

/// groff renders `page` with every warning on (except line-adjustment notes on long synopses):
/// the rendered text, or a failure naming the warnings.
fn render(page: &Path) -> String {
    let out = run(
        "groff",
        &[
            "-man",
            "-Tutf8",
            "-ww",
            "-Wbreak",
            // Plain text: no overstriking for bold and underline.
            "-P-b",
            "-P-u",
            page.to_str().unwrap(),
        ],
    );
    assert_ok(&format!("groff {}", page.display()), &out);
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(warnings.is_empty(), "{}: {warnings}", page.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn man_pages_render() {
    let dir = temp_dir("kit-man");
    let page = dir.join("printed.1");
    std::fs::write(&page, stdout_of(&["man"])).unwrap();
    let text = render(&page);
    for section in ["NAME", "SYNOPSIS", "SUBCOMMANDS", "tollgate-serve(1)"] {
        assert!(text.contains(section), "no {section} in:\n{text}");
    }

    let pages = dir.join("man1");
    std::fs::create_dir_all(&pages).unwrap();
    stdout_of(&["man", "--dir", pages.to_str().unwrap()]);
    for name in [
        "tollgate.1",
        "tollgate-serve.1",
        "tollgate-rules-apply.1",
        "tollgate-advise.1",
    ] {
        assert!(pages.join(name).exists(), "{name} not written");
    }
    // Every flag of serve is on its page, with the variable that also sets it.
    let serve = render(&pages.join("tollgate-serve.1"));
    for expected in [
        "--redis-prefix",
        "TOLLGATE_REDIS_PREFIX",
        "--trusted-proxies",
    ] {
        assert!(
            serve.contains(expected),
            "no {expected} in tollgate-serve(1)"
        );
    }
    // And man itself reads it.
    let man = run("man", &["-l", pages.join("tollgate.1").to_str().unwrap()]);
    assert_ok("man -l", &man);
}
