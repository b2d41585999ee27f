//! `/v1/forward-auth/{domain}`: the question nginx (`auth_request`), Caddy (`forward_auth`) and
//! Traefik (`ForwardAuth`) ask before passing a request on: "may this request go through?".
//!
//! The gateway sends the original request's method, URI, host and headers (its own
//! `X-Forwarded-*` / `X-Original-*` headers alongside the client's); the domain's `http` rules
//! section turns them into descriptors ([`tollgate_core::request`]), which are decided exactly as
//! a `/v1/check` request (same validation, limits and metrics). The answer is for the gateway to
//! act on: 200 with the rate-limit headers to copy to the upstream or the client, or 429 (or the
//! status asked for by `?deny_status=`, for nginx whose `auth_request` only understands 401 and
//! 403) with `Retry-After`, the headers and the rule's message as the body.
//!
//! The client address is the TCP peer's, unless the peer is a trusted proxy
//! ([`tollgate_core::request::client_address`]): the peer of a forward-auth request is always the
//! gateway, so the gateway must be in `--trusted-proxies` for per-client limits to be per client.

use super::{add_headers, HttpState};
use crate::check::decide;
use crate::error::ApiError;
use crate::model::{CheckRequest, CheckResponse, Descriptor};
use crate::queue::decide_queued;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use tollgate_core::request::{client_address, RequestParts};

/// On every 200 answer that applied a rule: `true` when a shadow-mode rule would have limited the
/// request (it may go through, and a backend that sees it can degrade instead of refusing), else
/// `false`. Always present, because Caddy before 2.7 copies an absent header as the literal text
/// of its placeholder.
pub(crate) static SHADOW_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-shadow-limited");

/// The denying rule's `message`, on a denial, when it is printable ASCII (what nginx can copy
/// into its own 429 answer, as it cannot pass the auth response's body on).
pub(crate) static MESSAGE_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-message");

/// `true` on a denial made only by `shadowban` rules: the gateway answers the client as if the
/// request were allowed (a configured fake success) without passing it on.
pub(crate) static SHADOWBAN_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-shadowban");

/// The message of a denial by a rule without one.
const DEFAULT_MESSAGE: &str = "rate limit exceeded";

/// The forward-auth handler (any method; the body is ignored).
pub(crate) async fn forward_auth(
    State(state): State<HttpState>,
    Path(domain): Path<String>,
    req: Request,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let deny_status = match deny_status(req.uri().query()) {
        Ok(s) => s,
        Err(e) => return fail(&state, e),
    };
    let headers = req.headers();
    let rules = state.rules();
    let Some(d) = rules.set.domain(&domain) else {
        return fail(
            &state,
            ApiError::NotFound(format!(
                "unknown domain `{domain}`: no rule file defines it (see GET /v1/rules)"
            )),
        );
    };
    let Some(actions) = d.http() else {
        return fail(
            &state,
            ApiError::NotFound(format!(
                "domain `{domain}` has no `http` section: forward-auth cannot derive descriptors for it"
            )),
        );
    };
    let text = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| headers.get(*n).and_then(|v| v.to_str().ok()))
            .filter(|v| !v.is_empty())
    };
    let parts = RequestParts {
        method: text(&["x-forwarded-method", "x-original-method"]),
        path: text(&["x-forwarded-uri", "x-original-uri"]),
        authority: text(&["x-forwarded-host", "host"]),
        headers,
        remote_address: peer.map(|p| client_address(p, headers, &state.trusted_proxies)),
    };
    let descriptors: Vec<Descriptor> = actions
        .descriptors(&parts)
        .into_iter()
        .map(Descriptor::from)
        .collect();
    let wants_json = wants_json(headers);
    drop(rules);
    if descriptors.is_empty() {
        // No entry applies: nothing to limit (as Envoy does with no descriptors).
        state.metrics().request(true);
        return StatusCode::OK.into_response();
    }
    let check = CheckRequest::new(domain, descriptors);
    let decided = if state.has_queues() {
        decide_queued(&state, &check).await
    } else {
        decide(&state, &check).await
    };
    match decided {
        Ok(resp) => answer(&resp, deny_status, wants_json),
        Err(e) => e.into_response(),
    }
}

fn fail(state: &AppState, e: ApiError) -> Response {
    if !matches!(e.class(), crate::error::ErrorClass::Unavailable) {
        state.metrics().error(e.code());
    }
    e.into_response()
}

/// `?deny_status=N` (any 4xx): the status of a denial, 429 by default.
fn deny_status(query: Option<&str>) -> Result<StatusCode, ApiError> {
    let Some(v) = query
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("deny_status="))
    else {
        return Ok(StatusCode::TOO_MANY_REQUESTS);
    };
    v.parse::<u16>()
        .ok()
        .filter(|n| (400..500).contains(n))
        .and_then(|n| StatusCode::from_u16(n).ok())
        .ok_or_else(|| {
            ApiError::invalid(
                "invalid_deny_status",
                format!("`deny_status` must be a 4xx status code, got {v:?}"),
            )
        })
}

/// JSON when the client's `Accept` names JSON, else plain text.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("json"))
}

/// 200 with the rate-limit headers, or the denial.
fn answer(resp: &CheckResponse, deny_status: StatusCode, json: bool) -> Response {
    if resp.allowed {
        let mut r = StatusCode::OK.into_response();
        add_headers(r.headers_mut(), resp);
        let shadowed = resp.statuses.iter().any(|s| s.shadowed);
        r.headers_mut().insert(
            SHADOW_HEADER.clone(),
            HeaderValue::from_static(if shadowed { "true" } else { "false" }),
        );
        let degrade = match &resp.degrade {
            Some(rule) => super::degrade_value(rule),
            None => HeaderValue::from_static(""),
        };
        r.headers_mut()
            .insert(super::DEGRADE_HEADER.clone(), degrade);
        return r;
    }
    let message = resp
        .statuses
        .iter()
        .find(|s| s.code == crate::model::Code::OverLimit)
        .and_then(|s| s.message.clone())
        .unwrap_or_else(|| DEFAULT_MESSAGE.to_string());
    let retry_after = resp.headers.as_ref().and_then(|h| h.retry_after_secs);
    let (body, content_type) = if json {
        let body = serde_json::json!({
            "error": {"code": "rate_limited", "message": message, "retry_after_s": retry_after}
        });
        (body.to_string(), "application/json")
    } else {
        (format!("{message}\n"), "text/plain; charset=utf-8")
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = deny_status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    add_headers(h, resp);
    if let Ok(v) = HeaderValue::from_str(&message) {
        h.insert(MESSAGE_HEADER.clone(), v);
    }
    if resp.shadowbanned {
        h.insert(SHADOWBAN_HEADER.clone(), HeaderValue::from_static("true"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_status_values() {
        assert_eq!(deny_status(None).unwrap(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            deny_status(Some("a=1&deny_status=403")).unwrap(),
            StatusCode::FORBIDDEN
        );
        for bad in [
            "deny_status=200",
            "deny_status=x",
            "deny_status=",
            "deny_status=503",
        ] {
            assert!(deny_status(Some(bad)).is_err(), "{bad}");
        }
    }
}
