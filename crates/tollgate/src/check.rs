//! `tollgate check`: ask a running service for a decision. Exit 0 allowed, 1 limited, 2 error,
//! 3 (with `--strict`) allowed only because no rule matched.
//!
//! The service answers OK with no limit for an unknown domain or a descriptor no rule matches
//! (as Envoy expects), which is easy to mistake for "within the limit": `check` says which of the
//! two it was, asking `GET /v1/rules` for the known domains only in that case (the hot path's
//! response stays as it is).

use crate::client::send;
use crate::client::Method;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

use crate::human::human_duration;

/// The `/v1/check` request body (also the template of `tollgate bench`'s requests).
pub fn request_body<K: AsRef<str>, V: AsRef<str>>(
    domain: &str,
    descriptors: &[Vec<(K, V)>],
    hits: Option<u64>,
) -> Value {
    let mut body = json!({
        "domain": domain,
        "descriptors": descriptors.iter().map(|entries| json!({
            "entries": entries
                .iter()
                .map(|(k, v)| json!({"key": k.as_ref(), "value": v.as_ref()}))
                .collect::<Vec<_>>()
        })).collect::<Vec<_>>(),
    });
    if let Some(h) = hits {
        body["hits_addend"] = json!(h);
    }
    body
}

/// Parse `k=v;k2=v2` into entries.
pub fn parse_descriptor(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    text.split(';')
        .map(|pair| match pair.split_once('=') {
            Some(("", _)) => bail!("descriptor entry '{pair}' has an empty key"),
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => bail!("descriptor entry '{pair}' is not key=value"),
        })
        .collect()
}

/// Exit code of an answer that was OK only because no rule matched, under `--strict`.
const NO_RULE_MATCHED: u8 = 3;

/// A warning when an entry's value looks like several entries joined with `,` (such as
/// `plan=premium,user=alice`): entries are separated by `;`.
pub fn comma_warning(entries: &[(String, String)]) -> Option<String> {
    entries.iter().find_map(|(k, v)| {
        let (_, rest) = v.split_once(',')?;
        let (key, _) = rest.split_once('=')?;
        let looks_like_key = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_alphanumeric() || "_-.:".contains(c));
        looks_like_key.then(|| {
            format!(
                "warning: the value of `{k}` is `{v}`: entries are separated by `;`, not `,` \
                 (did you mean `{k}={}`?)",
                v.replacen(',', ";", 1)
            )
        })
    })
}

/// Send the check and print the decision.
pub fn run(
    url: &str,
    domain: &str,
    descriptors: &[String],
    hits: Option<u64>,
    raw: bool,
    strict: bool,
) -> anyhow::Result<ExitCode> {
    if descriptors.is_empty() {
        bail!("give at least one --descriptor key=value[;key2=value2]");
    }
    let parsed = descriptors
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for warning in parsed.iter().filter_map(|d| comma_warning(d)) {
        eprintln!("{warning}");
    }
    let body = request_body(domain, &parsed, hits);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let resp = runtime.block_on(send(
        url,
        Method::POST,
        "/v1/check",
        Some(body.to_string()),
        Duration::from_secs(10),
    ))?;
    let value: Value = serde_json::from_str(&resp.body)
        .with_context(|| format!("HTTP {}: not JSON: {}", resp.status, resp.body))?;
    if raw {
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    match resp.status {
        200 | 429 => {
            if !raw {
                print_decision(&value, &resp, descriptors);
            }
            if resp.status == 429 {
                return Ok(ExitCode::from(1));
            }
            if !unmatched(&value) {
                return Ok(ExitCode::SUCCESS);
            }
            // Why nothing matched: an unknown domain, or a known one without a matching rule.
            let known = runtime.block_on(known_domains(url));
            eprintln!("{}", unmatched_note(domain, known.as_deref()));
            Ok(ExitCode::from(if strict { NO_RULE_MATCHED } else { 0 }))
        }
        s => {
            let err = &value["error"];
            eprintln!(
                "error: HTTP {s}: {} ({})",
                err["message"].as_str().unwrap_or(&resp.body),
                err["code"].as_str().unwrap_or("?")
            );
            Ok(ExitCode::from(2))
        }
    }
}

/// Whether some descriptor of an OK answer matched no rule (no limit, not `unlimited`).
fn unmatched(v: &Value) -> bool {
    v["statuses"].as_array().is_some_and(|statuses| {
        statuses.iter().any(|s| {
            s["current_limit"].is_null() && s["limit_remaining"].as_u64() != Some(u32::MAX as u64)
        })
    })
}

/// The service's domain names (`GET /v1/rules`), `None` when it cannot tell.
async fn known_domains(url: &str) -> Option<Vec<String>> {
    let resp = send(url, Method::GET, "/v1/rules", None, Duration::from_secs(10))
        .await
        .ok()?;
    let v: Value = serde_json::from_str(&resp.body).ok()?;
    let domains = v["domains"].as_array()?;
    Some(
        domains
            .iter()
            .filter_map(|d| d["domain"].as_str().map(str::to_string))
            .collect(),
    )
}

/// What a descriptor matching no rule means: the domain is unknown (with the nearest known
/// names), or known with no rule for these entries.
fn unmatched_note(domain: &str, known: Option<&[String]>) -> String {
    let Some(known) = known else {
        return "note: no rule matched (the answer is OK with no limit)".to_string();
    };
    if known.iter().any(|d| d == domain) {
        return format!(
            "note: domain `{domain}` is known but no rule matched (the answer is OK with no \
             limit); see GET /v1/rules for its descriptors"
        );
    }
    if known.is_empty() {
        return format!(
            "note: domain `{domain}` is unknown: the service has no domains at all (check its \
             --rules path); the answer is OK with no limit"
        );
    }
    let names: Vec<&str> = known.iter().map(String::as_str).collect();
    let hint = tollgate_core::rules::nearest(domain, &names)
        .map(|n| format!("did you mean `{n}`? "))
        .unwrap_or_default();
    // The nearest names first (edit distance, case-insensitive), at most five.
    let lower = domain.to_lowercase();
    let mut listed = names.clone();
    listed.sort_by_key(|n| {
        (
            tollgate_core::rules::edit_distance(&lower, &n.to_lowercase()),
            *n,
        )
    });
    let more = if listed.len() > 5 { ", ..." } else { "" };
    listed.truncate(5);
    format!(
        "note: domain `{domain}` is unknown (domains are case-sensitive; {hint}nearest known: \
         {}{more}); the answer is OK with no limit",
        listed.join(", ")
    )
}

fn print_decision(v: &Value, resp: &crate::client::HttpResponse, descriptors: &[String]) {
    let overall = v["overall_code"].as_str().unwrap_or("?");
    let verdict = if resp.status == 200 {
        "allowed"
    } else {
        "limited"
    };
    println!("{overall}: {verdict} (HTTP {})", resp.status);
    if let Some(statuses) = v["statuses"].as_array() {
        for (s, d) in statuses.iter().zip(descriptors) {
            let mut line = format!("  {d}: {}", s["code"].as_str().unwrap_or("?"));
            match s["current_limit"].as_object() {
                Some(l) => {
                    let name = l
                        .get("name")
                        .and_then(Value::as_str)
                        .or_else(|| l.get("id").and_then(Value::as_str))
                        .unwrap_or("");
                    line += &format!(
                        ", limit {}/{} ({name}), remaining {}",
                        l["requests_per_unit"],
                        l["unit"].as_str().unwrap_or("?").to_lowercase(),
                        s["limit_remaining"]
                    );
                }
                None if s["limit_remaining"].as_u64() == Some(u32::MAX as u64) => {
                    line += ", unlimited"
                }
                None => line += ", no matching rule",
            }
            if let Some(ms) = s["duration_until_reset_ms"].as_u64() {
                line += &format!(", resets in {}", human_duration(ms));
            }
            if let Some(ms) = s["retry_after_ms"].as_u64() {
                line += &format!(", retry after {}", human_duration(ms));
            }
            if let Some(ms) = s["delay_ms"].as_u64() {
                line += &format!(", wait {} first", human_duration(ms));
            }
            if let Some(m) = s["message"].as_str() {
                line += &format!(": {m}");
            }
            println!("{line}");
        }
    }
    if let Some(r) = resp.header("retry-after") {
        println!("Retry-After: {r}s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_descriptors() {
        assert_eq!(
            parse_descriptor("a=1;b=").unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), String::new())]
        );
        assert!(parse_descriptor("a").is_err());
        assert!(parse_descriptor("=1").is_err());
    }

    #[test]
    fn flags_commas() {
        let d = parse_descriptor("plan=premium,user=alice").unwrap();
        let w = comma_warning(&d).unwrap();
        assert!(w.contains("`plan=premium;user=alice`"), "{w}");
        assert!(comma_warning(&parse_descriptor("tags=a,b").unwrap()).is_none());
        assert!(comma_warning(&parse_descriptor("plan=premium;user=alice").unwrap()).is_none());
    }

    #[test]
    fn unmatched_notes() {
        let known = vec!["api".to_string(), "auth".to_string()];
        let n = unmatched_note("API", Some(&known));
        assert!(
            n.contains("`API` is unknown") && n.contains("did you mean `api`?"),
            "{n}"
        );
        assert!(unmatched_note("api", Some(&known)).contains("is known but no rule matched"));
        let many: Vec<String> = ["zeta", "alpha", "users", "user", "beta", "gamma", "delta"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let n = unmatched_note("usr", Some(&many));
        assert!(n.contains("nearest known: user, users, beta,"), "{n}");
        assert!(n.ends_with(", ...); the answer is OK with no limit"), "{n}");
    }
}
