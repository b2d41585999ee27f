//! `tollgate check`: ask a running service for a decision. Exit 0 allowed, 1 limited, 2 error.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;
use tollgate_server::client::send;
use tollgate_server::client::Method;

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

/// Send the check and print the decision.
pub fn run(
    url: &str,
    domain: &str,
    descriptors: &[String],
    hits: Option<u64>,
    raw: bool,
) -> anyhow::Result<ExitCode> {
    if descriptors.is_empty() {
        bail!("give at least one --descriptor key=value[;key2=value2]");
    }
    let parsed = descriptors
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
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
            Ok(ExitCode::from(if resp.status == 200 { 0 } else { 1 }))
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

fn print_decision(v: &Value, resp: &tollgate_server::client::HttpResponse, descriptors: &[String]) {
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
                line += &format!(", resets in {ms} ms");
            }
            if let Some(ms) = s["retry_after_ms"].as_u64() {
                line += &format!(", retry after {ms} ms");
            }
            if let Some(ms) = s["delay_ms"].as_u64() {
                line += &format!(", wait {ms} ms first");
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
}
