//! docs/embedding.md's "A first service" works as written: its `Cargo.toml` block and its Rust
//! block are pasted into a new crate (the only edit: `path/to/tollgate` becomes this checkout),
//! which `cargo build --offline` must compile. The workspace's `Cargo.lock` is copied in so the
//! same versions resolve offline; the crate builds in its own target directory under `target/`
//! (kept between runs: warm builds take seconds) because the running `cargo test` holds the
//! workspace's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The fenced blocks of the section marked `<!-- embed: ... -->`: (language, text).
fn embed_blocks(page: &str) -> Vec<(String, String)> {
    let start = page
        .find("<!-- embed:")
        .expect("docs/embedding.md has the `<!-- embed: ... -->` marker");
    let section = &page[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```").filter(|l| !l.is_empty()) {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((lang.to_owned(), body.join("\n") + "\n"));
        }
    }
    blocks
}

#[test]
fn the_embed_section_compiles_in_a_new_crate() {
    let repo = repo();
    let page = std::fs::read_to_string(repo.join("docs/embedding.md")).unwrap();
    let blocks = embed_blocks(&page);
    let find = |lang: &str| {
        blocks
            .iter()
            .find(|(l, _)| l == lang)
            .unwrap_or_else(|| panic!("no ```{lang} block in the embed section"))
            .1
            .clone()
    };
    let deps = find("toml");
    assert!(deps.contains("path/to/tollgate"), "{deps}");
    let deps = deps.replace("path/to/tollgate", repo.to_str().unwrap());
    let main = find("rust");

    let dir = tollgate_testsupport::temp_dir("readme-embed");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"embed-check\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             # Not a member of the tollgate workspace.\n[workspace]\n\n{deps}"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/main.rs"), main).unwrap();
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", repo.join("target/readme-embed"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docs/embedding.md's first service does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}
