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
    let ban_delay = match shadowban_delay(req.uri().query()) {
        Ok(d) => d,
        Err(e) => return fail(&state, e),
    };
    let headers = req.headers();
    let traced = state
        .tracing()
        .map(|t| t.start(crate::otel::FORWARD_AUTH_SPAN, headers));
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
    let decided = crate::otel::in_context(traced.clone(), decide_any(&state, &check)).await;
    let resp = match decided {
        Ok(resp) => resp,
        Err(e) => return e.into_response(),
    };
    if !resp.shadowbanned {
        return answer(&resp, deny_status, wants_json);
    }
    // Shadowbanned: the client is to get a success it cannot tell from a real one, so the
    // request is decided again without its `shadowban` descriptors, as a request that went
    // through would be: it counts against the client's other limits, and the headers the
    // gateway copies into the fake success are those a real success would carry now. (Another
    // limit may deny it then: the client gets that honest denial, as a real request would.)
    let rest = CheckRequest {
        descriptors: check
            .descriptors
            .iter()
            .zip(&resp.statuses)
            .filter(|(_, s)| s.code == crate::model::Code::Ok)
            .map(|(d, _)| d.clone())
            .collect(),
        ..check
    };
    let as_served = if rest.descriptors.is_empty() {
        None
    } else {
        match crate::otel::in_context(traced, decide_any(&state, &rest)).await {
            Ok(r) if !r.allowed => return answer(&r, deny_status, wants_json),
            Ok(r) => Some(r),
            Err(e) => return e.into_response(),
        }
    };
    if let Some(delay) = ban_delay.pick() {
        tokio::time::sleep(delay).await;
    }
    shadowbanned(as_served.as_ref(), deny_status)
}

async fn decide_any(state: &AppState, check: &CheckRequest) -> Result<CheckResponse, ApiError> {
    if state.has_queues() {
        decide_queued(state, check).await
    } else {
        decide(state, check).await
    }
}

/// The answer to a shadowbanned request: the denial status the gateway turns into its fake
/// success, marked [`SHADOWBAN_HEADER`], with the rate-limit headers of `as_served` (the
/// request decided as served, without its `shadowban` descriptors; `None` when it had no
/// others): exactly what a real success would carry, and no `Retry-After`, no message.
fn shadowbanned(as_served: Option<&CheckResponse>, deny_status: StatusCode) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = deny_status;
    let h = r.headers_mut();
    if let Some(resp) = as_served {
        add_headers(h, resp);
    }
    h.insert(SHADOWBAN_HEADER.clone(), HeaderValue::from_static("true"));
    r
}

/// `?shadowban_delay=`: how long to hold a shadowbanned request's answer, so that the fake
/// success takes about as long as a real one (which the upstream serves): a duration (`80ms`,
/// `1.5s`) or a range (`40ms-120ms`, a uniformly random wait in it), at most 10 s. None by
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct BanDelay {
    min: std::time::Duration,
    max: std::time::Duration,
}

/// The longest `?shadowban_delay=`.
const MAX_BAN_DELAY: std::time::Duration = std::time::Duration::from_secs(10);

impl BanDelay {
    /// The wait for one answer, `None` for no wait.
    fn pick(self) -> Option<std::time::Duration> {
        if self.max.is_zero() {
            return None;
        }
        let span = (self.max - self.min).as_micros() as u64;
        if span == 0 {
            return Some(self.min);
        }
        // Uniform enough for a jitter, without a random number crate: a fresh SipHash key per
        // call (std's RandomState) over the current time.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Some(self.min + std::time::Duration::from_micros(h.finish() % (span + 1)))
    }
}

fn shadowban_delay(query: Option<&str>) -> Result<BanDelay, ApiError> {
    let Some(v) = query
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("shadowban_delay="))
    else {
        return Ok(BanDelay::default());
    };
    let bad = || {
        ApiError::invalid(
            "invalid_shadowban_delay",
            format!(
                "`shadowban_delay` must be a duration such as `80ms` or `1.5s`, or a range such as `40ms-120ms`, at most 10s; got {v:?}"
            ),
        )
    };
    let (lo, hi) = v.split_once('-').unwrap_or((v, v));
    let (a, b) = (
        parse_delay(lo).ok_or_else(bad)?,
        parse_delay(hi).ok_or_else(bad)?,
    );
    // A range is the durations between its two ends, in either order.
    Ok(BanDelay {
        min: a.min(b),
        max: a.max(b),
    })
}

/// `80ms`, `1.5s`, `0s`: digits with an optional fraction, at most `10s` / `10000ms`. The
/// grammar is exactly the OpenAPI document's pattern for the parameter (a whole part of one
/// digit in seconds or four in milliseconds, or the bound itself), so that every value the
/// document calls valid is accepted and every other refused.
fn parse_delay(text: &str) -> Option<std::time::Duration> {
    let (number, ms) = match text.strip_suffix("ms") {
        Some(n) => (n, true),
        None => (text.strip_suffix('s')?, false),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return None;
    }
    let (widest, bound) = if ms { (4, "10000") } else { (1, "10") };
    let at_bound = whole == bound && frac.is_none_or(|f| f.bytes().all(|b| b == b'0'));
    if whole.len() > widest && !at_bound {
        return None;
    }
    let secs = number.parse::<f64>().ok()? * if ms { 1e-3 } else { 1.0 };
    (secs.is_finite() && secs <= MAX_BAN_DELAY.as_secs_f64())
        .then(|| std::time::Duration::from_secs_f64(secs))
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
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadowban_delay_values() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        assert_eq!(shadowban_delay(None).unwrap(), BanDelay::default());
        assert_eq!(BanDelay::default().pick(), None);
        let d = shadowban_delay(Some("deny_status=403&shadowban_delay=80ms")).unwrap();
        assert_eq!(
            (d, d.pick()),
            (
                BanDelay {
                    min: ms(80),
                    max: ms(80)
                },
                Some(ms(80))
            )
        );
        let d = shadowban_delay(Some("shadowban_delay=40ms-1.5s")).unwrap();
        assert_eq!(
            d,
            BanDelay {
                min: ms(40),
                max: ms(1500)
            }
        );
        assert_eq!(
            shadowban_delay(Some("shadowban_delay=1.5s-40ms")).unwrap(),
            d,
            "a range in either order"
        );
        for edge in [
            "10s", "10.00s", "10000ms", "9.999s", "9999.9ms", "0s", "0ms",
        ] {
            assert!(
                shadowban_delay(Some(&format!("shadowban_delay={edge}"))).is_ok(),
                "{edge}"
            );
        }
        for _ in 0..100 {
            let p = d.pick().unwrap();
            assert!((ms(40)..=ms(1500)).contains(&p), "{p:?}");
        }
        for bad in [
            "1",
            "ms",
            "-1ms",
            "11s",
            "10.5s",
            "00010s",
            "10001ms",
            ".5s",
            "5.s",
            "2s-",
            "00ms-9009383.33038.74ms",
            "1e3ms",
            "nan s",
            "5m",
            "shadowban_delay=",
        ] {
            let q = format!(
                "shadowban_delay={}",
                bad.trim_start_matches("shadowban_delay=")
            );
            assert!(shadowban_delay(Some(&q)).is_err(), "{bad}");
        }
    }

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
