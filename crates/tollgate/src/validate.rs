//! `tollgate validate PATH [--store URL]`: load the rules exactly as the service would and report
//! every error (a dangling symlink or an unreadable rule file is one, with its path), plus the
//! limits the chosen store cannot serve (the same check `serve` makes at start).

use std::path::Path;
use std::process::ExitCode;
use tollgate_core::rules::RuleSet;
use tollgate_redis::store::redact;
use tollgate_server::serve::{store_rule_problems, store_supported};

/// Exit 0 when `path` holds valid rules `store` can serve, else print each error and exit 1
/// (2 for an unsupported `store`).
pub fn run(path: &Path, store: &str) -> ExitCode {
    if !store_supported(store) {
        eprintln!(
            "error: unsupported --store '{}': expected 'memory', redis://, rediss://, redis+cluster:// or rediss+cluster://",
            redact(store)
        );
        return ExitCode::from(2);
    }
    match RuleSet::load(path) {
        Ok(rules) => {
            let problems = store_rule_problems(store, &rules);
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("{p}");
                }
                eprintln!(
                    "{} error(s): these rules cannot run on --store {}",
                    problems.len(),
                    redact(store)
                );
                return ExitCode::from(1);
            }
            let domains = rules.domains().count();
            let limits = rules.limits().count();
            println!(
                "{}: ok ({domains} domain(s), {limits} limit(s))",
                path.display()
            );
            if domains == 0 {
                eprintln!(
                    "warning: {}: no domains: `tollgate serve` would limit no request",
                    path.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            if !path.exists() {
                eprintln!("(the path is relative to the working directory)");
            }
            eprintln!("{} error(s)", errors.0.len());
            ExitCode::from(1)
        }
    }
}
