//! `tollgate rules apply|get|list|delete`: the rule registry of a running service
//! (`/v1/domains`), from the command line.
//!
//! Exit codes as `check`'s: 0 done; 1 the service refused (invalid rules, a domain owned by a
//! file, a stale version, a cap, an unknown domain); 2 an error (no answer, no or wrong admin
//! token, a server error, a file that cannot be read).
//!
//! `apply` reads every file first and validates it locally (the same parser as the service),
//! so a directory is registered completely or not at all when a file is broken; then it puts
//! each domain and prints what changed, limit by limit (`--dry-run`: what would change).

use anyhow::{bail, Context};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tollgate_core::rules::{LoadOptions, RuleSet};
use tollgate_server::client::{send_with, HttpResponse, Method};

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
    /// Print the rules of a domain (registered, or defined by a file).
    Get {
        /// The domain.
        domain: String,
        /// Print the service's JSON answer (version, source, rules).
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
    /// File holding the admin token (needed by apply and delete).
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
        eprintln!("(give the admin token with --token-file or TOLLGATE_ADMIN_TOKEN_FILE)");
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
        let path = format!(
            "/v1/domains/{target}{}",
            if dry_run { "?dry_run=true" } else { "" }
        );
        let resp = call(
            service,
            Method::PUT,
            &path,
            Some(("application/yaml", text)),
            None,
        )
        .await?;
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
    let rules = v["rules"].as_str().unwrap_or("");
    print!("{rules}");
    if !rules.ends_with('\n') {
        println!();
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(json: bool, service: &Service) -> anyhow::Result<ExitCode> {
    let resp = call(service, Method::GET, "/v1/domains", None, None).await?;
    if resp.status != 200 {
        return Ok(refused(&resp, "body", service));
    }
    let v: Value = serde_json::from_str(&resp.body).context("not JSON")?;
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
