//! The service-registration shape: what a service sends when it registers its limits with a
//! shared rate limiter, one rule or a list of them:
//!
//! ```json
//! {"field": "user_id", "rate": {"requests_per_unit": 5, "unit": "minute"},
//!  "request_rejection_message": "retry-with-exponential-backoff"}
//! ```
//!
//! `rate` may also name an `algorithm`, a `sync` mode (`exact`, `lease`, `batched`) and a batched
//! limit's `flush_interval`, as a rule file's `rate_limit` does:
//!
//! ```json
//! {"field": "tenant", "rate": {"requests_per_unit": 10000, "unit": "second",
//!  "algorithm": "fixed_window", "sync": "lease"}}
//! ```
//!
//! Each rule becomes one top-level descriptor of the domain: `key` is the field (each value of
//! it gets its own counter, as a descriptor without `value` does), `rate_limit` the rate, and
//! `message` the rejection message. The converted rules are what the registry stores (and what
//! `GET /v1/domains/{domain}` shows), so they validate, diff and roll back like any rules body.
//!
//! Decoding is strict (serde with `deny_unknown_fields`): a misspelt field is an error naming
//! it, with its line and column in the body, never silently ignored.

use super::error::RegistryError;
use serde::Deserialize;
use serde_json::{json, Value};

/// One rule in the service-registration shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceRule {
    field: String,
    rate: Rate,
    #[serde(default)]
    request_rejection_message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rate {
    requests_per_unit: u64,
    unit: String,
    /// `algorithm`, `sync` and `flush_interval` of the rule (validated with the rest of the
    /// converted rules).
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    sync: Option<String>,
    #[serde(default)]
    flush_interval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(ServiceRule),
    Many(Vec<ServiceRule>),
}

/// Whether `body` is in the service-registration shape: a JSON object with a `field` key, or a
/// JSON list of anything (a rules body is never a list). Anything else is read as rules.
pub(crate) fn is_service_shape(body: &str) -> bool {
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(o)) => o.contains_key("field"),
        Ok(Value::Array(_)) => true,
        _ => false,
    }
}

/// The rules text (JSON, which the YAML rules reader reads) of `domain` for a body in the
/// service-registration shape.
pub(crate) fn to_rules(domain: &str, body: &str) -> Result<String, RegistryError> {
    let rules = match serde_json::from_str::<Value>(body) {
        Ok(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                serde_json::from_value::<ServiceRule>(item).map_err(|e| {
                    RegistryError::InvalidBody(format!("service registration, rule {i}: {e}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => match serde_json::from_str::<OneOrMany>(body) {
            Ok(OneOrMany::One(r)) => vec![r],
            Ok(OneOrMany::Many(r)) => r,
            Err(_) => {
                // The untagged enum's error says nothing useful: decode as one rule for the
                // precise message (field name, line, column).
                let e = serde_json::from_str::<ServiceRule>(body).err().map_or_else(
                    || "not a service registration".to_string(),
                    |e| e.to_string(),
                );
                return Err(RegistryError::InvalidBody(format!(
                    "service registration: {e}"
                )));
            }
        },
    };
    if rules.is_empty() {
        return Err(RegistryError::InvalidBody(
            "service registration: the list is empty (send at least one rule)".into(),
        ));
    }
    let descriptors: Vec<Value> = rules
        .into_iter()
        .map(|r| {
            let mut d = json!({
                "key": r.field,
                "rate_limit": {"unit": r.rate.unit, "requests_per_unit": r.rate.requests_per_unit},
            });
            if let Some(a) = r.rate.algorithm {
                d["rate_limit"]["algorithm"] = Value::String(a);
            }
            if let Some(m) = r.rate.sync {
                d["rate_limit"]["sync"] = Value::String(m);
            }
            if let Some(f) = r.rate.flush_interval {
                d["rate_limit"]["flush_interval"] = Value::String(f);
            }
            if let Some(m) = r.request_rejection_message {
                d["message"] = Value::String(m);
            }
            d
        })
        .collect();
    let rules = json!({"domain": domain, "descriptors": descriptors});
    serde_json::to_string_pretty(&rules).map_err(|e| RegistryError::InvalidBody(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::rules::{Resolution, RuleSet};

    #[test]
    fn one_rule_and_a_list_become_descriptors() {
        let one = r#"{"field": "user_id", "rate": {"requests_per_unit": 5, "unit": "minute"}, "request_rejection_message": "retry-with-exponential-backoff"}"#;
        assert!(is_service_shape(one));
        let text = to_rules("svc", one).unwrap();
        let set = RuleSet::from_sources(&[("body".into(), text)]).unwrap();
        match set.resolve("svc", &[("user_id", "alice")]) {
            Resolution::Limited {
                limit, counter_key, ..
            } => {
                assert_eq!(limit.quota.unwrap().limit(), 5);
                assert_eq!(
                    limit.message.as_deref(),
                    Some("retry-with-exponential-backoff")
                );
                assert_eq!(counter_key, "svc|user_id=alice");
            }
            other => panic!("{other:?}"),
        }
        let list = format!("[{one}, {{\"field\": \"ip\", \"rate\": {{\"requests_per_unit\": 9, \"unit\": \"second\"}}}}]");
        let set =
            RuleSet::from_sources(&[("body".into(), to_rules("svc", &list).unwrap())]).unwrap();
        assert_eq!(set.limits().count(), 2);
    }

    #[test]
    fn a_batched_rate_keeps_its_flush_interval() {
        let body = r#"{"field": "u", "rate": {"requests_per_unit": 5, "unit": "second", "algorithm": "fixed_window", "sync": "batched", "flush_interval": "20ms"}}"#;
        let set =
            RuleSet::from_sources(&[("body".into(), to_rules("svc", body).unwrap())]).unwrap();
        let q = set.limits().next().and_then(|l| l.quota).unwrap();
        assert_eq!(
            q.flush_interval(),
            Some(std::time::Duration::from_millis(20))
        );
    }

    #[test]
    fn mistakes_are_named() {
        let e = to_rules(
            "svc",
            r#"{"field": "u", "rate": {"requests_per_unit": 5, "unit": "minute"}, "mesage": "x"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `mesage`"), "{e}");
        let e = to_rules("svc", "[]").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = to_rules("svc", r#"[{"field": "u"}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rule 0") && e.contains("rate"), "{e}");
        assert!(!is_service_shape("domain: x\n"));
        assert!(!is_service_shape(r#"{"domain": "x"}"#));
    }
}
