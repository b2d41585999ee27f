//! docs/architecture.md stays true to the code: every module path it names in backticks
//! (`check::decide`, `rules::RuleSet::load`, `tollgate_core::store::Store`) is a module of the
//! workspace whose source has each named item, and every file or folder it names exists. A
//! rename that leaves the page behind fails here.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `src` folders of the workspace's crates, with the crate's name as Rust spells it.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let src = dir.join("src");
        if src.is_dir() {
            let name = dir.file_name().unwrap().to_string_lossy().replace('-', "_");
            out.push((name, src));
        }
    }
    out
}

/// Every `.rs` file below `dir` (or `dir` itself when it is a file).
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_owned());
    } else if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() || p.extension().is_some_and(|x| x == "rs") {
                rust_files(&p, out);
            }
        }
    }
}

/// The module `name` anywhere below `root`: `name.rs` or a folder `name/`.
fn find_module(root: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if stem == name {
                out.push(p.clone());
            }
            find_module(&p, name, out);
        } else if stem == name && p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The child module `name` of a module at `at` (a file `m.rs` or a folder `m/`).
fn child_module(at: &Path, name: &str) -> Option<PathBuf> {
    let dir = if at.is_dir() {
        at.to_owned()
    } else {
        at.with_extension("")
    };
    [dir.join(format!("{name}.rs")), dir.join(name)]
        .into_iter()
        .find(|p| p.exists())
}

fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// Whether `name` is a crate of `Cargo.lock` from outside the workspace (`serde_json`): its
/// paths are that crate's business, not this page's.
fn is_dependency(name: &str) -> bool {
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    lock.lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .any(|n| n.trim_end_matches('"').replace('-', "_") == name)
        && !crate_sources().iter().any(|(n, _)| n == name)
}

/// Whether the module path `path` (`a::b::Item`) names a module of the workspace whose
/// source holds every item after the module part.
fn resolves(path: &str) -> Result<(), String> {
    let segments: Vec<&str> = path.split("::").collect();
    let sources = crate_sources();
    let (starts, rest): (Vec<PathBuf>, &[&str]) =
        match sources.iter().find(|(name, _)| name == segments[0]) {
            Some((_, src)) => (vec![src.clone()], &segments[1..]),
            None => {
                let mut found = Vec::new();
                for (_, src) in &sources {
                    find_module(src, segments[0], &mut found);
                }
                (found, &segments[1..])
            }
        };
    if starts.is_empty() {
        return Err(format!("no module `{}` in any crate", segments[0]));
    }
    let mut why = String::new();
    for start in starts {
        let mut at = start;
        let mut items = rest;
        while let Some((first, more)) = items.split_first() {
            match child_module(&at, first) {
                Some(child) => {
                    at = child;
                    items = more;
                }
                None => break,
            }
        }
        let mut files = Vec::new();
        rust_files(&at, &mut files);
        let text: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default())
            .collect();
        match items.iter().find(|item| !has_word(&text, item)) {
            None => return Ok(()),
            Some(missing) => why = format!("`{missing}` is not in {}", at.display()),
        }
    }
    Err(why)
}

/// The spans between backticks of a Markdown page, fenced blocks left out.
fn code_spans(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        out.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
    }
    out
}

/// The leading module path of a span: `check::decide(&AppState, ...)` -> `check::decide`.
fn module_path(span: &str) -> Option<&str> {
    let first = span.chars().next()?;
    if !(first.is_ascii_lowercase() || first == '_') {
        return None;
    }
    let end = span
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(span.len());
    let path = span[..end].trim_end_matches(':');
    // `crate::a::b` and `super::x` are the page explaining paths, not naming a module.
    let relative = ["crate::", "super::", "self::"]
        .iter()
        .any(|p| path.starts_with(p));
    (path.contains("::") && !path.contains(":::") && !relative).then_some(path)
}

/// A span that names a file or folder of the repository: `tests/grpc_inline.rs`,
/// `crates/tollgate-redis/scripts/`.
fn file_path(span: &str) -> Option<&str> {
    let looks = span.contains('/')
        && !span.contains(' ')
        && !span.starts_with('/')
        && !span.contains("://")
        && (span.ends_with('/')
            || [".rs", ".lua", ".py", ".sh", ".md", ".yaml", ".json"]
                .iter()
                .any(|x| span.ends_with(x)));
    looks.then_some(span)
}

fn file_exists(path: &str) -> bool {
    let root = repo();
    if root.join(path).exists() || root.join("crates").join(path).exists() {
        return true;
    }
    // `tests/x.rs` of some crate, or `algorithm/mod.rs` in some crate's `src`.
    crate_sources()
        .iter()
        .any(|(_, src)| src.join(path).exists() || src.parent().unwrap().join(path).exists())
}

#[test]
fn every_module_and_file_the_architecture_page_names_exists() {
    let page = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let spans = code_spans(&page);
    let mut checked = 0;
    let mut wrong = Vec::new();
    for span in &spans {
        if let Some(path) = module_path(span) {
            if is_dependency(path.split("::").next().unwrap()) {
                continue;
            }
            checked += 1;
            if let Err(why) = resolves(path) {
                wrong.push(format!("`{path}`: {why}"));
            }
        } else if let Some(path) = file_path(span) {
            checked += 1;
            if !file_exists(path) {
                wrong.push(format!("`{path}`: no such file or folder"));
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} names checked: the page's parsing broke"
    );
    assert!(
        wrong.is_empty(),
        "docs/architecture.md names what the code does not have:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_name_that_is_gone_is_reported() {
    assert!(resolves("check::decide").is_ok());
    assert!(resolves("tollgate_core::store::Store").is_ok());
    assert!(resolves("check::no_such_function_here").is_err());
    assert!(resolves("no_such_module::decide").is_err());
    assert_eq!(
        module_path("check::decide(&AppState)"),
        Some("check::decide")
    );
    assert_eq!(module_path("Sketch::check"), None);
    assert!(!file_exists("tests/no_such_test.rs"));
    assert!(is_dependency("serde_json") && !is_dependency("tollgate_core"));
}
