//! The registry's HTTP endpoints (`/v1/domains...`), merged into the API by
//! [`super::service`]. Handlers return [`RegistryError`]; its `IntoResponse` is the one
//! place errors become responses (and each is counted in `tollgate_request_errors_total`).
//!
//! Reads and writes alike need the admin token: a domain's rules name client keys, so its text
//! and history are admin surfaces like the full `GET /v1/rules` listing. The
//! `ETag` of a registered domain is its version (`"7"`); `If-Match` takes it (or `*`).

use super::HttpState;
use crate::registry::error::RegistryError;
use crate::registry::storage::Expect;
use crate::registry::Registry;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;

/// The registry's routes.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/v1/domains", get(list))
        .route(
            "/v1/domains/{domain}",
            get(get_domain).put(put_domain).delete(delete_domain),
        )
        .route("/v1/domains/{domain}/history", get(history))
}

/// The response of `result`, counting an error.
fn respond(state: &HttpState, result: Result<Response, RegistryError>) -> Response {
    result.unwrap_or_else(|e| {
        if !status(&e).is_server_error() {
            state.metrics().error(e.code());
        }
        e.into_response()
    })
}

fn registry(state: &HttpState) -> Result<&Arc<Registry>, RegistryError> {
    state.registry.as_ref().ok_or(RegistryError::WritesOff(
        "the registry is off (start serve with --admin-token-file, and --registry-dir or a Redis --store)",
    ))
}

/// The registry, for a call whose bearer token is the admin token (401/403 otherwise).
fn authorized(state: &HttpState, headers: &HeaderMap) -> Result<Arc<Registry>, RegistryError> {
    let registry = registry(state)?;
    registry.authorize(
        headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    )?;
    Ok(registry.clone())
}

fn domain_of(path: Result<Path<String>, PathRejection>) -> Result<String, RegistryError> {
    match path {
        Ok(Path(d)) => Ok(d),
        Err(e) => Err(RegistryError::InvalidDomain(e.body_text())),
    }
}

/// What every `/v1/domains/{domain}` handler starts with: the admin token checked first (a
/// call without it is refused before its path is looked at), then the path's domain. A refusal
/// is answered, and counted, as [`respond`] does.
struct DomainCall {
    registry: Arc<Registry>,
    domain: String,
}

impl FromRequestParts<HttpState> for DomainCall {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &HttpState) -> Result<Self, Response> {
        let call = async {
            let registry = authorized(state, &parts.headers)?;
            let domain = domain_of(Path::from_request_parts(parts, state).await)?;
            Ok(DomainCall { registry, domain })
        };
        call.await.map_err(|e| respond(state, Err(e)))
    }
}

fn etag(version: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// `If-Match`: absent, `*`, or one version (`"7"`, `W/"7"` or `7`).
fn expectation(headers: &HeaderMap) -> Result<Expect, RegistryError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(Expect::Any);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(Expect::Exists);
    }
    let bare = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
    match bare.parse::<u64>() {
        Ok(v) if v > 0 => Ok(Expect::Version(v)),
        _ => Err(RegistryError::InvalidPrecondition(text.to_string())),
    }
}

/// `?dry_run=true`: whether to validate only. Other parameters are ignored.
fn dry_run(query: Option<&str>) -> Result<bool, RegistryError> {
    for pair in query.unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
        if k == "dry_run" {
            return match v {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(RegistryError::InvalidBody(format!(
                    "dry_run must be true or false, not `{v}`"
                ))),
            };
        }
    }
    Ok(false)
}

/// YAML, JSON, plain text or none.
fn check_type(headers: &HeaderMap) -> Result<(), RegistryError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = ct.to_str().unwrap_or("");
    let mime = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let ok = matches!(
        mime.as_str(),
        "application/json"
            | "application/yaml"
            | "application/x-yaml"
            | "text/yaml"
            | "text/x-yaml"
            | "text/plain"
    ) || (mime.starts_with("application/")
        && (mime.ends_with("+json") || mime.ends_with("+yaml")));
    if ok {
        Ok(())
    } else {
        Err(RegistryError::UnsupportedMediaType(text.to_string()))
    }
}

/// The caller's address for the audit log (the forwarded one when the peer is a trusted proxy).
fn caller(state: &HttpState, req: &Request) -> String {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| {
            tollgate_core::request::client_address(peer.ip(), req.headers(), &state.trusted_proxies)
                .to_string()
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// When a rules file was last modified (ms since the epoch), if it can be told.
fn modified_ms(file: &str) -> Option<u64> {
    let t = std::fs::metadata(file).ok()?.modified().ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

async fn list(State(state): State<HttpState>, req: Request) -> Response {
    if let Err(e) = authorized(&state, req.headers()) {
        return respond(&state, Err(e));
    }
    let query = match super::RulesQuery::parse(req.uri().query()) {
        Ok(q) => q,
        Err(message) => return respond(&state, Err(RegistryError::InvalidQuery(message))),
    };
    let rules = state.rules();
    let snapshot = state.registry.as_ref().map(|r| r.snapshot());
    let mut domains: Vec<Value> = Vec::new();
    for d in rules.set.domains() {
        if crate::registry::is_registered_source(&d.file) {
            let v = snapshot
                .as_ref()
                .and_then(|s| s.domains.get(&d.name))
                .and_then(|e| e.current());
            domains.push(json!({
                "domain": d.name,
                "source": "registry",
                "file": null,
                "version": v.map(|v| v.version),
                "updated_at_ms": v.map(|v| v.updated_at_ms),
                "updated_by": v.map(|v| v.updated_by.as_str()),
                "hidden_by": null,
            }));
        } else {
            domains.push(json!({
                "domain": d.name,
                "source": "file",
                "file": d.file,
                "version": null,
                "updated_at_ms": modified_ms(&d.file),
                "updated_by": null,
                "hidden_by": null,
            }));
        }
    }
    // Registered domains a rules file hides.
    if let Some(s) = &snapshot {
        for (name, e) in &s.domains {
            let Some(d) = rules.set.domain(name) else {
                continue;
            };
            if crate::registry::is_registered_source(&d.file) {
                continue;
            }
            let v = e.current();
            domains.push(json!({
                "domain": name,
                "source": "registry",
                "file": null,
                "version": v.map(|v| v.version),
                "updated_at_ms": v.map(|v| v.updated_at_ms),
                "updated_by": v.map(|v| v.updated_by.as_str()),
                "hidden_by": d.file,
            }));
        }
    }
    // A page: by name, after `?after=`, at most `?limit=` domains.
    domains.sort_by(|a, b| a["domain"].as_str().cmp(&b["domain"].as_str()));
    let total = domains.len();
    let mut page: Vec<Value> = domains
        .into_iter()
        .filter(|d| {
            query.domain.as_deref().is_none_or(|n| d["domain"] == n)
                && query
                    .after
                    .as_deref()
                    .is_none_or(|a| d["domain"].as_str().is_some_and(|n| n > a))
        })
        .collect();
    let more = page.len() > query.limit;
    page.truncate(query.limit);
    let next_after = page.last().filter(|_| more).map(|d| d["domain"].clone());
    let registry = state.registry.as_ref().map(|r| {
        json!({
            "storage": r.storage_kind(),
            "revision": r.snapshot().revision,
            "writable": r.writable(),
        })
    });
    axum::Json(json!({
        "registry": registry,
        "domain_count": total,
        "domains": page,
        "next_after": next_after,
    }))
    .into_response()
}

async fn get_domain(State(state): State<HttpState>, call: DomainCall) -> Response {
    let domain = call.domain;
    let result = (|| {
        let rules = state.rules();
        let file = rules
            .set
            .domain(&domain)
            .filter(|d| !crate::registry::is_registered_source(&d.file));
        if let Some(d) = file {
            let text = rules
                .file_sources
                .iter()
                .find(|(name, _)| *name == d.file)
                .map(|(_, text)| text.as_str());
            return Ok(axum::Json(json!({
                "domain": domain,
                "source": "file",
                "file": d.file,
                "version": null,
                "updated_at_ms": modified_ms(&d.file),
                "updated_by": null,
                "rules": text,
            }))
            .into_response());
        }
        let snapshot = state.registry.as_ref().map(|r| r.snapshot());
        let entry = snapshot.as_ref().and_then(|s| s.domains.get(&domain));
        let Some(v) = entry.and_then(|e| e.current()) else {
            return Err(RegistryError::NotFound(domain));
        };
        let mut response = axum::Json(json!({
            "domain": domain,
            "source": "registry",
            "file": null,
            "version": v.version,
            "updated_at_ms": v.updated_at_ms,
            "updated_by": v.updated_by,
            "rules": v.rules,
        }))
        .into_response();
        response.headers_mut().insert(header::ETAG, etag(v.version));
        Ok(response)
    })();
    respond(&state, result)
}

async fn history(State(state): State<HttpState>, call: DomainCall) -> Response {
    let domain = call.domain;
    let result = (|| {
        let snapshot = state.registry.as_ref().map(|r| r.snapshot());
        let Some(entry) = snapshot.as_ref().and_then(|s| s.domains.get(&domain)) else {
            return Err(RegistryError::NotFound(domain));
        };
        Ok(axum::Json(json!({"domain": domain, "versions": entry.versions})).into_response())
    })();
    respond(&state, result)
}

async fn put_domain(State(state): State<HttpState>, call: DomainCall, req: Request) -> Response {
    let DomainCall { registry, domain } = call;
    let result = async {
        check_type(req.headers())?;
        let expect = expectation(req.headers())?;
        let dry = dry_run(req.uri().query())?;
        let who = caller(&state, &req);
        let body = super::read_body(&state, req, registry.config().max_body_bytes).await?;
        let text = std::str::from_utf8(&body)
            .map_err(|e| RegistryError::InvalidBody(format!("the body is not UTF-8: {e}")))?;
        let outcome = registry
            .put(&state, &domain, text, expect, dry, &who)
            .await?;
        let status = if outcome.created && !outcome.dry_run {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let mut response = (status, axum::Json(&outcome)).into_response();
        if let Some(v) = outcome.version {
            response.headers_mut().insert(header::ETAG, etag(v));
        }
        Ok(response)
    }
    .await;
    respond(&state, result)
}

async fn delete_domain(State(state): State<HttpState>, call: DomainCall, req: Request) -> Response {
    let DomainCall { registry, domain } = call;
    let result = async {
        let expect = expectation(req.headers())?;
        let who = caller(&state, &req);
        drop(req);
        let (old, revision) = registry.delete(&state, &domain, expect, &who).await?;
        Ok(axum::Json(json!({
            "domain": domain,
            "deleted_version": old,
            "revision": revision,
        }))
        .into_response())
    }
    .await;
    respond(&state, result)
}

// Registry errors as responses: the one place they become HTTP answers (the body is the
// service's error shape; invalid rules add `problems`, one `{line, column, message}` each).

/// The HTTP status of a registry error.
pub(crate) fn status(e: &RegistryError) -> StatusCode {
    use RegistryError as E;
    match e {
        E::Request(e) => super::error_status(e),
        E::WritesOff(_) | E::WrongToken => StatusCode::FORBIDDEN,
        E::Unauthenticated => StatusCode::UNAUTHORIZED,
        E::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        E::InvalidDomain(_)
        | E::InvalidRules(_)
        | E::InvalidBody(_)
        | E::InvalidQuery(_)
        | E::DomainMismatch { .. }
        | E::Unsupported(_)
        | E::InvalidPrecondition(_) => StatusCode::BAD_REQUEST,
        E::NotFound(_) => StatusCode::NOT_FOUND,
        E::FileOwned { .. } | E::TooManyDomains { .. } => StatusCode::CONFLICT,
        E::Stale { .. } => StatusCode::PRECONDITION_FAILED,
        E::TooManyDescriptors { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        E::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        if let RegistryError::Request(e) = self {
            return e.into_response();
        }
        let status = status(&self);
        if status.is_server_error() {
            tracing::error!(code = self.code(), error = %self, "registry request failed");
        } else {
            tracing::debug!(code = self.code(), error = %self, "registry request refused");
        }
        let mut body = crate::error::error_body(self.code(), &self.to_string());
        if let RegistryError::InvalidRules(errors) = &self {
            body["problems"] = errors
                .iter()
                .map(|e| serde_json::json!({"line": e.line, "column": e.column, "message": e.message}))
                .collect();
        }
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tollgate registry\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_and_dry_run() {
        let mut h = HeaderMap::new();
        assert_eq!(expectation(&h).unwrap(), Expect::Any);
        for (v, want) in [
            ("\"7\"", Expect::Version(7)),
            ("W/\"7\"", Expect::Version(7)),
            ("7", Expect::Version(7)),
            ("*", Expect::Exists),
        ] {
            h.insert(header::IF_MATCH, HeaderValue::from_static(v));
            assert_eq!(expectation(&h).unwrap(), want, "{v}");
        }
        h.insert(header::IF_MATCH, HeaderValue::from_static("\"x\""));
        assert_eq!(status(&expectation(&h).unwrap_err()), 400);
        assert!(dry_run(Some("dry_run=true")).unwrap());
        assert!(dry_run(Some("a=b&dry_run")).unwrap());
        assert!(!dry_run(None).unwrap());
        assert!(dry_run(Some("dry_run=maybe")).is_err());
    }
}
