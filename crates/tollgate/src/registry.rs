//! `tollgate rules apply|get|list|history|rollback|delete`: the rule registry of a running
//! service (`/v1/domains`), from the command line. Every subcommand, reads too, sends the admin
//! token of `--token-file`: the service answers the registry only to the admin.
//!
//! Exit codes as `check`'s: 0 done; 1 the service refused (invalid rules, a domain owned by a
//! file, a stale version, a cap, an unknown domain); 2 an error (no answer, no or wrong admin
//! token, a server error, a file that cannot be read).
//!
//! `apply` reads every file first and validates it locally (the same parser as the service),
//! so a directory is registered completely or not at all when a file is broken; then it puts
//! each domain and prints what changed, limit by limit (`--dry-run`: what would change).

use crate::client::{send_with, HttpResponse, Method};
use anyhow::{bail, Context};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tollgate_core::rules::{LoadOptions, RuleSet};

/// `tollgate rules` subcommands.
#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RulesCommand {
    /// Register the domains of rule files (create or replace each), showing what changes.
    Apply {
        /// A rules file, or a directory of them (`*.yaml`, `*.yml`); repeatable.
        #[arg(short = 'f', long = "file", required = true)]
        files: Vec<PathBuf>,
        /// Validate and show what would change; store nothing.
        #[arg(long)]
        dry_run: bool,
        /// The domain to register a single file under when the file names none (a
        /// service-registration JSON body: `{"field": ..., "rate": {...}}`).
        #[arg(long)]
        domain: Option<String>,
        #[command(flatten)]
        service: Service,
    },
    /// Print the rules of a domain (registered, or defined by a file) as YAML.
    Get {
        /// The domain.
        domain: String,
        /// Print the service's JSON answer (version, source, rules) instead.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        service: Service,
    },
    /// List the domains with their source (file or registry), version and last change.
    List {
        /// Print the service's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        service: Service,
    },
    /// The versions of a registered domain kept for rollback, newest (current) first.
    History {
        /// The domain.
        domain: String,
        /// Print the service's JSON answer (every version with its rules).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        service: Service,
    },
    /// Make an old version of a registered domain current again (as a new version), showing
    /// what changes; refused if the domain changes meanwhile.
    Rollback {
        /// The domain.
        domain: String,
        /// The version to go back to (see `rules history`).
        version: u64,
        /// Show what would change; store nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        service: Service,
    },
    /// Unregister a domain.
    Delete {
        /// The domain.
        domain: String,
        /// Delete only if the domain is still at this version.
        #[arg(long)]
        if_match: Option<u64>,
        #[command(flatten)]
        service: Service,
    },
}

/// Where the service is and how to authenticate.
#[derive(Debug, clap::Args)]
struct Service {
    /// Base URL of the service's HTTP API.
    #[arg(long, env = "TOLLGATE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// File holding the admin token, sent by every command: the service answers reads of the
    /// registry, like writes, only to the admin.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

impl Service {
    /// The `Authorization` header value, when a token file is given.
    fn authorization(&self) -> anyhow::Result<Option<String>> {
        self.token_file
            .as_deref()
            .map(|p| tollgate_server::registry::read_token(p).map(|t| format!("Bearer {t}")))
            .transpose()
    }
}

/// Run a `tollgate rules` subcommand.
pub fn run(args: RulesArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.command {
        RulesCommand::Apply {
            files,
            dry_run,
            domain,
            service,
        } => runtime.block_on(apply(&files, dry_run, domain.as_deref(), &service)),
        RulesCommand::Get {
            domain,
            json,
            service,
        } => runtime.block_on(get(&domain, json, &service)),
        RulesCommand::List { json, service } => runtime.block_on(list(json, &service)),
        RulesCommand::History {
            domain,
            json,
            service,
        } => runtime.block_on(history(&domain, json, &service)),
        RulesCommand::Rollback {
            domain,
            version,
            dry_run,
            service,
        } => runtime.block_on(rollback(&domain, version, dry_run, &service)),
        RulesCommand::Delete {
            domain,
            if_match,
            service,
        } => runtime.block_on(delete(&domain, if_match, &service)),
    }
}

async fn call(
    service: &Service,
    method: Method,
    path: &str,
    body: Option<(&str, String)>,
    if_match: Option<String>,
) -> anyhow::Result<HttpResponse> {
    let auth = service.authorization()?;
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    if let Some(v) = &if_match {
        headers.push(("if-match", v));
    }
    send_with(
        &service.url,
        method,
        path,
        body,
        &headers,
        Duration::from_secs(30),
    )
    .await
}

/// `PUT /v1/domains/{domain}` of `rules` (`?dry_run=true` when `dry_run`), only over version
/// `if_match` when given.
async fn put_rules(
    service: &Service,
    domain: &str,
    rules: String,
    dry_run: bool,
    if_match: Option<u64>,
) -> anyhow::Result<HttpResponse> {
    let path = format!(
        "/v1/domains/{domain}{}",
        if dry_run { "?dry_run=true" } else { "" }
    );
    call(
        service,
        Method::PUT,
        &path,
        Some(("application/yaml", rules)),
        if_match.map(|v| format!("\"{v}\"")),
    )
    .await
}

/// The exit code and printed message of a refusal (`file` names the body in positions).
fn refused(resp: &HttpResponse, file: &str, service: &Service) -> ExitCode {
    let v: Value = serde_json::from_str(&resp.body).unwrap_or(Value::Null);
    let code = v["error"]["code"].as_str().unwrap_or("?");
    match v["problems"].as_array() {
        Some(problems) => {
            for p in problems {
                eprintln!(
                    "{file}:{}:{}: {}",
                    p["line"],
                    p["column"],
                    p["message"].as_str().unwrap_or("")
                );
            }
        }
        None => eprintln!(
            "error: HTTP {}: {} ({code})",
            resp.status,
            v["error"]["message"].as_str().unwrap_or(&resp.body)
        ),
    }
    if resp.status == 401 && service.token_file.is_none() {
        eprintln!(
            "the service needs the admin token for registry reads and writes alike: pass \
             --token-file <file> (or set TOLLGATE_ADMIN_TOKEN_FILE)"
        );
    }
    match resp.status {
        400 | 404 | 409 | 412 | 413 => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}

/// The rule files of `path` as `(name, text)`.
fn sources(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let (files, errors) = tollgate_core::rules::read_sources(path, LoadOptions::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(e) = errors.first() {
        bail!("{e}");
    }
    if files.is_empty() {
        bail!("{}: no rule files (*.yaml, *.yml)", path.display());
    }
    Ok(files)
}

async fn apply(
    paths: &[PathBuf],
    dry_run: bool,
    domain: Option<&str>,
    service: &Service,
) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            files.extend(sources(p)?);
        } else {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            files.push((p.display().to_string(), text));
        }
    }
    if domain.is_some() && files.len() != 1 {
        bail!("--domain goes with a single file");
    }
    // Validate everything before changing anything.
    let mut work = Vec::new();
    let mut invalid = 0;
    for (name, text) in files {
        let target = match domain {
            Some(d) => d.to_string(),
            None => match RuleSet::from_sources(&[(name.clone(), text.clone())]) {
                Ok(set) => match set.domains().next() {
                    Some(d) => d.name.clone(),
                    None => {
                        eprintln!("{name}: no domain");
                        invalid += 1;
                        continue;
                    }
                },
                Err(errors) => {
                    for e in &errors {
                        eprintln!("{e}");
                    }
                    invalid += 1;
                    continue;
                }
            },
        };
        work.push((name, target, text));
    }
    if invalid > 0 {
        eprintln!("{invalid} file(s) with errors: nothing applied");
        return Ok(ExitCode::from(1));
    }
    let mut worst = ExitCode::SUCCESS;
    for (name, target, text) in work {
        let resp = put_rules(service, &target, text, dry_run, None).await?;
        if !(200..300).contains(&resp.status) {
            let code = refused(&resp, &name, service);
            if code == ExitCode::from(2) {
                return Ok(code);
            }
            worst = code;
            continue;
        }
        let v: Value = serde_json::from_str(&resp.body)
            .with_context(|| format!("HTTP {}: not JSON: {}", resp.status, resp.body))?;
        print_outcome(&name, &v);
    }
    Ok(worst)
}

/// `checkout (rules/checkout.yaml): created, version 4` and the changes, one limit a line.
fn print_outcome(name: &str, v: &Value) {
    let domain = v["domain"].as_str().unwrap_or("?");
    let dry = v["dry_run"].as_bool().unwrap_or(false);
    let what = match (dry, v["created"].as_bool().unwrap_or(false)) {
        (true, true) => "would be created".to_string(),
        (true, false) => format!("would replace version {}", v["previous_version"]),
        (false, true) => format!("created, version {}", v["version"]),
        (false, false) => format!("version {} -> {}", v["previous_version"], v["version"]),
    };
    println!("{domain} ({name}): {what}");
    let c = &v["changes"];
    for (sign, key) in [("+", "added"), ("-", "removed")] {
        for line in c[key].as_array().into_iter().flatten() {
            println!("  {sign} {}", line.as_str().unwrap_or(""));
        }
    }
    for ch in c["changed"].as_array().into_iter().flatten() {
        println!(
            "  ~ {}: {} -> {}",
            ch["id"].as_str().unwrap_or(""),
            ch["from"].as_str().unwrap_or(""),
            ch["to"].as_str().unwrap_or("")
        );
    }
    let unchanged = c["unchanged"].as_u64().unwrap_or(0);
    if unchanged > 0 {
        println!("  = {unchanged} limit(s) unchanged (their counters keep their state)");
    }
}

async fn get(domain: &str, json: bool, service: &Service) -> anyhow::Result<ExitCode> {
    let resp = call(
        service,
        Method::GET,
        &format!("/v1/domains/{domain}"),
        None,
        None,
    )
    .await?;
    if resp.status != 200 {
        return Ok(refused(&resp, "body", service));
    }
    let v: Value = serde_json::from_str(&resp.body).context("not JSON")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    match v["source"].as_str() {
        Some("file") => eprintln!(
            "# {domain}: defined by the file {}",
            v["file"].as_str().unwrap_or("?")
        ),
        _ => eprintln!(
            "# {domain}: registered, version {} (by {})",
            v["version"],
            v["updated_by"].as_str().unwrap_or("?")
        ),
    }
    print!("{}", as_yaml(v["rules"].as_str().unwrap_or("")));
    Ok(ExitCode::SUCCESS)
}

/// Rules text as YAML: YAML as it is (its comments kept), JSON (a JSON body is stored as sent)
/// written out as block YAML; ends with a newline.
fn as_yaml(rules: &str) -> String {
    let mut out = match serde_json::from_str::<Value>(rules) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) => {
            let mut out = String::new();
            yaml_block(&v, 0, &mut out);
            out
        }
        _ => rules.to_string(),
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// `v` (an object or an array) as block YAML indented by `indent`, one entry a line. Strings
/// are written as JSON strings, which YAML reads as double-quoted scalars, so nothing in them
/// can change their meaning.
fn yaml_block(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let scalar = |v: &Value| match v {
        Value::Object(m) if m.is_empty() => Some("{}".to_string()),
        Value::Array(a) if a.is_empty() => Some("[]".to_string()),
        Value::Object(_) | Value::Array(_) => None,
        other => Some(other.to_string()),
    };
    match v {
        Value::Object(m) => {
            // A rules file's order: the name first, nested descriptors last.
            let rank = |k: &str| match k {
                "domain" => 0,
                "key" => 1,
                "value" => 2,
                "descriptors" => 4,
                _ => 3,
            };
            let mut entries: Vec<_> = m.iter().collect();
            entries.sort_by_key(|(k, _)| rank(k));
            for (k, item) in entries {
                let key = if k
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                    && !k.is_empty()
                {
                    k.clone()
                } else {
                    Value::String(k.clone()).to_string()
                };
                match scalar(item) {
                    Some(s) => out.push_str(&format!("{pad}{key}: {s}\n")),
                    None => {
                        out.push_str(&format!("{pad}{key}:\n"));
                        yaml_block(item, indent + 2, out);
                    }
                }
            }
        }
        Value::Array(a) => {
            for item in a {
                match scalar(item) {
                    Some(s) => out.push_str(&format!("{pad}- {s}\n")),
                    None => {
                        // The item's first line goes after the dash, the rest under it.
                        let mut inner = String::new();
                        yaml_block(item, indent + 2, &mut inner);
                        let first = inner.get(indent + 2..).unwrap_or("");
                        out.push_str(&format!("{pad}- {first}"));
                    }
                }
            }
        }
        other => out.push_str(&format!("{pad}{other}\n")),
    }
}

async fn list(json: bool, service: &Service) -> anyhow::Result<ExitCode> {
    // Every page (`next_after`), put together as one answer.
    let mut all: Option<Value> = None;
    let mut path = "/v1/domains".to_string();
    loop {
        let resp = call(service, Method::GET, &path, None, None).await?;
        if resp.status != 200 {
            return Ok(refused(&resp, "body", service));
        }
        let mut page: Value = serde_json::from_str(&resp.body).context("not JSON")?;
        let next = page["next_after"].as_str().map(str::to_string);
        match &mut all {
            None => all = Some(page),
            Some(all) => {
                if let (Some(into), Some(more)) = (
                    all["domains"].as_array_mut(),
                    page["domains"].as_array_mut(),
                ) {
                    into.append(more);
                }
            }
        }
        match next {
            Some(after) => path = format!("/v1/domains?after={after}"),
            None => break,
        }
    }
    let mut v = all.unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.remove("next_after");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<32} {:<9} {:>8}  SOURCE", "DOMAIN", "OWNER", "VERSION");
    for d in v["domains"].as_array().into_iter().flatten() {
        let version = d["version"]
            .as_u64()
            .map_or("-".to_string(), |n| n.to_string());
        let source = match (d["file"].as_str(), d["hidden_by"].as_str()) {
            (Some(f), _) => f.to_string(),
            (None, Some(f)) => format!("hidden by {f}"),
            (None, None) => format!("by {}", d["updated_by"].as_str().unwrap_or("?")),
        };
        println!(
            "{:<32} {:<9} {:>8}  {source}",
            d["domain"].as_str().unwrap_or("?"),
            d["source"].as_str().unwrap_or("?"),
            version
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `GET /v1/domains/{domain}/history`: the answer, or the exit code of a refusal.
async fn fetch_history(domain: &str, service: &Service) -> anyhow::Result<Result<Value, ExitCode>> {
    let resp = call(
        service,
        Method::GET,
        &format!("/v1/domains/{domain}/history"),
        None,
        None,
    )
    .await?;
    if resp.status != 200 {
        return Ok(Err(refused(&resp, "body", service)));
    }
    Ok(Ok(serde_json::from_str(&resp.body).context("not JSON")?))
}

async fn history(domain: &str, json: bool, service: &Service) -> anyhow::Result<ExitCode> {
    let v = match fetch_history(domain, service).await? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    println!(
        "{:>8}  {:<18} {:<7} {:>6}  BY",
        "VERSION", "UPDATED", "", "LIMITS"
    );
    for (i, ver) in v["versions"].as_array().into_iter().flatten().enumerate() {
        let rules = ver["rules"].as_str().unwrap_or("");
        let limits = RuleSet::from_sources(&[(domain.to_string(), rules.to_string())])
            .map_or("?".to_string(), |set| set.limits().count().to_string());
        let age = ver["updated_at_ms"].as_u64().map_or("?".to_string(), |at| {
            format!(
                "{} ago",
                crate::human::human_duration(now_ms.saturating_sub(at))
            )
        });
        println!(
            "{:>8}  {:<18} {:<7} {:>6}  {}",
            ver["version"],
            age,
            if i == 0 { "current" } else { "" },
            limits,
            ver["updated_by"].as_str().unwrap_or("?")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn rollback(
    domain: &str,
    version: u64,
    dry_run: bool,
    service: &Service,
) -> anyhow::Result<ExitCode> {
    let v = match fetch_history(domain, service).await? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    let versions = v["versions"].as_array().cloned().unwrap_or_default();
    let current = versions.first().and_then(|c| c["version"].as_u64());
    let Some(target) = versions
        .iter()
        .find(|x| x["version"].as_u64() == Some(version))
    else {
        let kept: Vec<String> = versions.iter().map(|x| x["version"].to_string()).collect();
        eprintln!(
            "error: {domain} has no version {version} in its history (kept: {})",
            kept.join(", ")
        );
        return Ok(ExitCode::from(1));
    };
    if current == Some(version) {
        println!("{domain}: already at version {version}");
        return Ok(ExitCode::SUCCESS);
    }
    let rules = target["rules"].as_str().unwrap_or("").to_string();
    // Only over the version looked at: a change made meanwhile is not rolled over.
    let resp = put_rules(service, domain, rules, dry_run, current).await?;
    if !(200..300).contains(&resp.status) {
        return Ok(refused(&resp, "body", service));
    }
    let out: Value = serde_json::from_str(&resp.body).context("not JSON")?;
    print_outcome(&format!("rollback to version {version}"), &out);
    Ok(ExitCode::SUCCESS)
}

async fn delete(
    domain: &str,
    if_match: Option<u64>,
    service: &Service,
) -> anyhow::Result<ExitCode> {
    let resp = call(
        service,
        Method::DELETE,
        &format!("/v1/domains/{domain}"),
        None,
        if_match.map(|v| format!("\"{v}\"")),
    )
    .await?;
    if resp.status != 200 {
        return Ok(refused(&resp, "body", service));
    }
    let v: Value = serde_json::from_str(&resp.body).context("not JSON")?;
    println!("{domain}: deleted (was version {})", v["deleted_version"]);
    Ok(ExitCode::SUCCESS)
}
