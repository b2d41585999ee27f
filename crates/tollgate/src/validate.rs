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
            for w in forgeable_tiers(&rules) {
                eprintln!("warning: {w}");
            }
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

/// Request headers the shipped gateway examples (examples/nginx, examples/caddy,
/// examples/traefik) set themselves from a source the client cannot forge, dropping whatever
/// the client sent under that name: a tier may be read from these.
pub(crate) const GATEWAY_SET_HEADERS: &[&str] = &["x-plan"];

/// One warning per tiered rule whose tier an `http` entry reads from a value the client writes
/// itself (a request header that no shipped example strips, a query parameter): the client
/// could pick its own tier.
fn forgeable_tiers(rules: &RuleSet) -> Vec<String> {
    let mut out = Vec::new();
    for d in rules.domains() {
        let Some(http) = d.http() else { continue };
        let plain = http.plain_request_values();
        for l in rules.limits_of(d) {
            let Some(t) = &l.tiers else { continue };
            for (key, source) in &plain {
                if *key != t.key || GATEWAY_SET_HEADERS.contains(&source.as_str()) {
                    continue;
                }
                let what = match source.strip_prefix('?') {
                    Some(param) => format!("query parameter `{}`", human(param)),
                    None => format!("request header `{}`", human(source)),
                };
                out.push(format!(
                    "{}: tiered rule `{}` takes its tier `{}` from {what}, which the client sends itself: a client can choose its own tier. Take the tier from something the client cannot forge: a header your gateway sets after authentication and strips from the client (the shipped nginx, Caddy and Traefik examples do so for `X-Plan`), see docs/rules.md, \"What is trusted\"",
                    d.file,
                    human(&l.id),
                    human(&t.key),
                ));
            }
        }
    }
    out
}

/// `s` with control characters escaped, for the terminal.
fn human(s: &str) -> String {
    s.chars().flat_map(char::escape_debug).collect()
}
