//! The HTTP API (DESIGN.md section 5): [`router`] builds the axum `Router`; no sockets here, so
//! tests drive it with `tower::ServiceExt::oneshot`.
//!
//! Request bodies are parsed by hand from a `serde_json::Value` so every mistake gets its own
//! error code and status (never a 500). Unknown fields are ignored for forward compatibility.

use crate::check::decide;
use crate::error::{error_body, ApiError};
use crate::model::{ms_ceil, CheckRequest, CheckResponse, Descriptor, DescriptorStatus};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use std::any::Any;
use tower_http::catch_panic::CatchPanicLayer;

/// The OpenAPI document served at `/openapi.json` (also checked in as `docs/openapi.json`).
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// The HTTP API: `/v1/check`, `/json`, `/v1/rules`, `/healthz`, `/readyz`, `/metrics`,
/// `/openapi.json`. JSON 404/405 for anything else; panics become a JSON 500.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/check", post(v1_check))
        .route("/json", post(envoy_json))
        .route("/v1/rules", get(v1_rules))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(CatchPanicLayer::custom(panic_response))
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("panic");
    tracing::error!(panic = detail, "handler panicked");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        axum::Json(error_body("internal", "internal error")),
    )
        .into_response()
}

async fn not_found() -> Response {
    ApiError::NotFound("no such endpoint: see GET /openapi.json".into()).into_response()
}

async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(error_body(
            "method_not_allowed",
            "method not allowed on this endpoint",
        )),
    )
        .into_response()
}

/// Read the body as JSON, enforcing the size limit and (when `strict_type`) the content type.
async fn read_json(state: &AppState, req: Request, strict_type: bool) -> Result<Value, ApiError> {
    if strict_type {
        check_content_type(req.headers())?;
    }
    let limit = state.limits().max_body_bytes;
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(ApiError::PayloadTooLarge { limit });
        }
    }
    let bytes: Bytes = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|e| {
            // The only errors are the length limit and a broken connection.
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            {
                ApiError::PayloadTooLarge { limit }
            } else {
                ApiError::invalid("invalid_body", format!("cannot read body: {e}"))
            }
        })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid("invalid_json", format!("body is not valid JSON: {e}")))
}

/// JSON only; a missing content type is accepted (as envoyproxy/ratelimit does).
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = ct.to_str().unwrap_or("");
    let mime = text.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
    {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(text.to_string()))
    }
}

fn fail(state: &AppState, e: ApiError) -> Response {
    if !matches!(e.class(), crate::error::ErrorClass::Unavailable) {
        state.metrics().error(e.code());
    }
    e.into_response()
}

// ---------------------------------------------------------------------------------------------
// POST /v1/check

async fn v1_check(State(state): State<AppState>, req: Request) -> Response {
    let result = async {
        let body = read_json(&state, req, true).await?;
        parse_request(&body, Dialect::Native)
    }
    .await;
    let check = match result {
        Ok(c) => c,
        Err(e) => return fail(&state, e),
    };
    match decide(&state, &check) {
        Ok(resp) => native_response(&resp),
        Err(e) => e.into_response(),
    }
}

/// The `/v1/check` response: 200 / 429, JSON body and rate-limit headers.
pub fn native_response(resp: &CheckResponse) -> Response {
    let body = json!({
        "overall_code": resp.code().as_str(),
        "statuses": resp.statuses.iter().map(native_status).collect::<Vec<_>>(),
        "delay_ms": (resp.delay > 0).then(|| ms_ceil(resp.delay)),
    });
    let status = if resp.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut response = (status, axum::Json(body)).into_response();
    add_headers(response.headers_mut(), resp);
    response
}

/// Add the rate-limit headers of `resp` (nothing when no limit applied).
pub fn add_headers(headers: &mut HeaderMap, resp: &CheckResponse) {
    if let Some(h) = &resp.headers {
        for (name, value) in h.pairs() {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        }
    }
}

fn native_status(s: &DescriptorStatus) -> Value {
    json!({
        "code": s.code.as_str(),
        "current_limit": s.limit.as_ref().map(|l| json!({
            "name": l.name,
            "id": l.id,
            "requests_per_unit": l.requests_per_unit,
            "unit": l.unit.as_proto_str(),
            "unit_multiplier": l.unit_multiplier,
            "algorithm": l.algorithm.as_str(),
        })),
        "limit_remaining": s.remaining,
        "duration_until_reset_ms": s.reset_after.map(ms_ceil),
        "retry_after_ms": s.retry_after.map(ms_ceil),
        "delay_ms": s.delay.map(ms_ceil),
        "message": s.message,
        "shadow_mode": s.shadowed,
    })
}

// ---------------------------------------------------------------------------------------------
// POST /json (envoyproxy/ratelimit compatible)

async fn envoy_json(State(state): State<AppState>, req: Request) -> Response {
    let result = async {
        // Any content type: envoyproxy/ratelimit's clients (`curl --data`) send none or a form type.
        let body = read_json(&state, req, false).await?;
        parse_request(&body, Dialect::ProtoJson)
    }
    .await;
    let check = match result {
        Ok(c) => c,
        Err(e) => return fail(&state, e),
    };
    match decide(&state, &check) {
        Ok(resp) => envoy_response(&resp),
        Err(e) => e.into_response(),
    }
}

/// The `/json` response: protojson `RateLimitResponse` (default values omitted), 200 / 429.
pub fn envoy_response(resp: &CheckResponse) -> Response {
    let statuses: Vec<Value> = resp
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), json!(s.code.as_str()));
            if let Some(l) = &s.limit {
                let mut cl = Map::new();
                if let Some(n) = &l.name {
                    if !n.is_empty() {
                        cl.insert("name".into(), json!(n));
                    }
                }
                let rpu = l.requests_per_unit.min(u32::MAX as u64);
                if rpu != 0 {
                    cl.insert("requestsPerUnit".into(), json!(rpu));
                }
                cl.insert("unit".into(), json!(l.unit.as_proto_str()));
                m.insert("currentLimit".into(), Value::Object(cl));
            }
            let remaining = s.remaining.min(u32::MAX as u64);
            if remaining != 0 {
                m.insert("limitRemaining".into(), json!(remaining));
            }
            if let Some(r) = s.reset_after {
                m.insert("durationUntilReset".into(), json!(proto_duration(r)));
            }
            Value::Object(m)
        })
        .collect();
    let mut body = Map::new();
    body.insert("overallCode".into(), json!(resp.code().as_str()));
    if !statuses.is_empty() {
        body.insert("statuses".into(), Value::Array(statuses));
    }
    let status = if resp.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    (status, axum::Json(Value::Object(body))).into_response()
}

/// A protojson `google.protobuf.Duration`: `"54s"`, `"1.500s"`, `"0.000250s"`.
pub fn proto_duration(us: u64) -> String {
    let (s, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        format!("{s}s")
    } else if frac % 1000 == 0 {
        format!("{s}.{:03}s", frac / 1000)
    } else {
        format!("{s}.{frac:06}s")
    }
}

// ---------------------------------------------------------------------------------------------
// Request parsing

/// Which JSON spelling a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `/v1/check`: snake_case, integers as JSON numbers, `hits_addend: 0` is a pure query.
    Native,
    /// `/json`: protojson `RateLimitRequest`; camelCase or snake_case names, 64-bit integers
    /// may be strings, request `hitsAddend` 0 or absent means 1 (as Envoy).
    ProtoJson,
}

fn field<'v>(obj: &'v Map<String, Value>, snake: &str, camel: &str, d: Dialect) -> Option<&'v Value> {
    match obj.get(snake) {
        Some(v) if !v.is_null() => Some(v),
        _ if d == Dialect::ProtoJson && camel != snake => obj.get(camel).filter(|v| !v.is_null()),
        _ => None,
    }
}

fn hits_value(v: &Value, what: &str, d: Dialect) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::invalid(
            "invalid_hits",
            format!("`{what}` must be a non-negative integer, got {v}"),
        )
    };
    match v {
        Value::Number(n) => n.as_u64().ok_or_else(bad),
        Value::String(s) if d == Dialect::ProtoJson => s.parse::<u64>().map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// Parse a check request body (see [`Dialect`]). Does not apply size limits beyond the body
/// limit: [`crate::check::validate`] does.
pub fn parse_request(body: &Value, d: Dialect) -> Result<CheckRequest, ApiError> {
    let invalid = |m: String| ApiError::invalid("invalid_request", m);
    let obj = body
        .as_object()
        .ok_or_else(|| invalid("the body must be a JSON object".into()))?;
    let domain = match field(obj, "domain", "domain", d) {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(invalid(format!("`domain` must be a string, got {other}"))),
    };
    let hits = match field(obj, "hits_addend", "hitsAddend", d) {
        None => None,
        Some(v) => {
            let h = hits_value(v, "hits_addend", d)?;
            if d == Dialect::ProtoJson && h == 0 {
                None
            } else {
                Some(h)
            }
        }
    };
    let list = match field(obj, "descriptors", "descriptors", d) {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(other) => {
            return Err(invalid(format!(
                "`descriptors` must be an array, got {other}"
            )))
        }
    };
    let mut descriptors = Vec::with_capacity(list.len().min(64));
    for (i, dv) in list.iter().enumerate() {
        let dobj = dv
            .as_object()
            .ok_or_else(|| invalid(format!("descriptors[{i}] must be an object")))?;
        let entries = match field(dobj, "entries", "entries", d) {
            None => &[][..],
            Some(Value::Array(a)) => a.as_slice(),
            Some(_) => return Err(invalid(format!("descriptors[{i}].entries must be an array"))),
        };
        let mut out = Vec::with_capacity(entries.len().min(16));
        for (j, ev) in entries.iter().enumerate() {
            let eobj = ev.as_object().ok_or_else(|| {
                invalid(format!("descriptors[{i}].entries[{j}] must be an object"))
            })?;
            let key = match eobj.get("key") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => {
                    return Err(ApiError::invalid(
                        "invalid_entry",
                        format!("descriptors[{i}].entries[{j}].key is missing"),
                    ))
                }
                Some(_) => {
                    return Err(invalid(format!(
                        "descriptors[{i}].entries[{j}].key must be a string"
                    )))
                }
            };
            let value = match eobj.get("value") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => String::new(),
                Some(_) => {
                    return Err(invalid(format!(
                        "descriptors[{i}].entries[{j}].value must be a string"
                    )))
                }
            };
            out.push((key, value));
        }
        let dhits = match field(dobj, "hits_addend", "hitsAddend", d) {
            None => None,
            Some(v) => Some(hits_value(v, &format!("descriptors[{i}].hits_addend"), d)?),
        };
        descriptors.push(Descriptor {
            entries: out,
            hits: dhits,
        });
    }
    Ok(CheckRequest {
        domain,
        descriptors,
        hits,
    })
}

// ---------------------------------------------------------------------------------------------
// Introspection and health

async fn v1_rules(State(state): State<AppState>) -> Response {
    axum::Json(rules_json(&state)).into_response()
}

/// The body of `GET /v1/rules`.
pub fn rules_json(state: &AppState) -> Value {
    let rules = state.rules();
    let domains: Vec<Value> = rules
        .set
        .domains()
        .map(|d| {
            let limits: Vec<Value> = rules
                .set
                .limits()
                .filter(|l| l.domain == d.name)
                .map(|l| {
                    json!({
                        "id": l.id,
                        "name": l.name,
                        "quota": l.quota.map(|q| json!({
                            "requests_per_unit": q.limit,
                            "unit": q.period.unit.as_str(),
                            "unit_multiplier": q.period.multiplier,
                            "burst": q.burst,
                        })),
                        "unlimited": l.is_unlimited(),
                        "algorithm": l.quota.map(|q| q.algorithm.as_str()),
                        "shadow_mode": l.shadow_mode,
                        "message": l.message,
                        "replaces": l.replaces,
                        "detailed_metric": l.detailed_metric || l.value_to_metric,
                        "source": format!("{}:{}", l.file, l.line),
                    })
                })
                .collect();
            json!({"domain": d.name, "file": d.file, "limits": limits})
        })
        .collect();
    let error = state.last_reload_error().map(|e| {
        json!({"at_ms": e.at / 1000, "errors": e.errors})
    });
    json!({
        "version": rules.hash,
        "generation": rules.generation,
        "loaded_at_ms": rules.loaded_at / 1000,
        "path": state.rules_path().map(|p| p.display().to_string()),
        "domains": domains,
        "last_reload_error": error,
    })
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.store().check(state.now(), &[]) {
        Ok(_) => axum::Json(json!({"status": "ready"})).into_response(),
        Err(e) => {
            state.metrics().store_error();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(error_body("store_unavailable", &e.to_string())),
            )
                .into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut extra = Vec::new();
    if let Some(m) = state.memory_store() {
        extra.push((
            "tollgate_memory_keys",
            "Keys held by the memory store.",
            m.len() as u64,
        ));
    }
    let text = state.metrics().render(&extra);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        Body::from(text),
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        OPENAPI_JSON,
    )
        .into_response()
}
