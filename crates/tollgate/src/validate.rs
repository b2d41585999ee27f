//! `tollgate validate PATH`: load the rules exactly as the service would and report every error
//! (a dangling symlink or an unreadable rule file is one, with its path).

use std::path::Path;
use std::process::ExitCode;
use tollgate_core::rules::RuleSet;

/// Exit 0 when `path` holds valid rules, else print each error and exit 1.
pub fn run(path: &Path) -> ExitCode {
    match RuleSet::load(path) {
        Ok(rules) => {
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
            eprintln!("{} error(s)", errors.0.len());
            ExitCode::from(1)
        }
    }
}
