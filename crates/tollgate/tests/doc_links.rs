//! Every relative link of the repository's Markdown pages (README.md, BENCHMARKS.md,
//! docs/*.md, ...) leads somewhere: the file exists and, when the link names a section
//! (`page.md#section`), the page has a heading with that anchor, as GitHub makes anchors. A
//! renamed section or a moved page fails here instead of leaving a reader at a dead link.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The Markdown pages checked: the top-level ones and docs/.
fn pages() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [repo(), repo().join("docs")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// GitHub's anchor of a heading: lower case, every character but letters, digits, spaces,
/// hyphens and underscores dropped, spaces made hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (`#`...`######` outside fenced blocks), with GitHub's
/// `-1`, `-2` suffixes for repeats, and any explicit `<a id="...">`.
fn anchors(page: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let text = rest.trim_start_matches('#');
            if text.starts_with(' ') {
                let base = slug(text);
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
        }
        for part in line.split("<a id=\"").skip(1) {
            if let Some(id) = part.split('"').next() {
                out.insert(id.to_owned());
            }
        }
    }
    out
}

/// The targets of a page's inline links `[text](target)` outside fenced blocks and code spans.
fn links(page: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in page.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold examples, not links.
        let text: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        for part in text.split("](").skip(1) {
            if let Some(end) = part.find(')') {
                out.push((n + 1, part[..end].to_owned()));
            }
        }
    }
    out
}

/// What is wrong with `target`, a link of the page at `from`, or `None` when it leads somewhere.
fn broken(from: &Path, target: &str) -> Option<String> {
    let target = target.split_whitespace().next().unwrap_or("");
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let path = if file.is_empty() {
        from.to_owned()
    } else {
        from.parent().unwrap().join(file)
    };
    if !path.exists() {
        return Some(format!("no file {}", path.display()));
    }
    let anchor = anchor?;
    if path.extension().is_none_or(|x| x != "md") {
        return None;
    }
    let page = std::fs::read_to_string(&path).unwrap();
    (!anchors(&page).contains(anchor)).then(|| format!("no section #{anchor} in {file}"))
}

#[test]
fn every_relative_link_of_the_markdown_pages_leads_somewhere() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page_path in pages() {
        let page = std::fs::read_to_string(&page_path).unwrap();
        let name = page_path
            .strip_prefix(repo())
            .unwrap()
            .display()
            .to_string();
        for (line, target) in links(&page) {
            checked += 1;
            if let Some(why) = broken(&page_path, &target) {
                wrong.push(format!("{name}:{line}: ({target}): {why}"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: the parsing broke"
    );
    assert!(
        wrong.is_empty(),
        "{} broken links:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        slug("Live statistics (`/dashboard`, `/v1/stats`)"),
        "live-statistics-dashboard-v1stats"
    );
    assert_eq!(
        slug("CI from a fresh clone (`.ci/run`)"),
        "ci-from-a-fresh-clone-cirun"
    );
    assert_eq!(
        slug("The quick start's profile"),
        "the-quick-starts-profile"
    );
    let page = "# A\n## A\n```\n# not a heading\n```\n### B: c\n";
    let a = anchors(page);
    assert!(a.contains("a") && a.contains("a-1") && a.contains("b-c"));
    assert!(!a.contains("not-a-heading"));
    assert_eq!(
        links("see [x](a.md#b) and `[y](c.md)`"),
        [(1, "a.md#b".to_owned())]
    );
}
