//! `GET /v1/stats` (the live statistics of [`crate::stats`] as JSON) and `GET /dashboard` (a
//! page that shows them, updating itself every second), merged into the API by
//! [`super::HttpApi::service`].
//!
//! Both name clients (the keys a rule denies: user ids, addresses), so both are admin surfaces:
//! they answer only a caller presenting the admin token, and nobody when no token is configured.
//! A browser cannot add a bearer header to a page load, so the token is also accepted as the
//! password of HTTP Basic authentication (the browser asks for it; the user name is ignored):
//! it travels in a header, never in a URL, so it stays out of access logs and history.

use super::HttpState;
use crate::error::{error_body, ApiError};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The page, served as it is (no build step).
const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// What the page may do: run its own script (named by its SHA-256: no other inline script, so
/// nothing injected into the page could run) and inline style, fetch from this origin, nothing
/// else (no framing, no other origin).
static DASHBOARD_CSP: std::sync::LazyLock<HeaderValue> = std::sync::LazyLock::new(|| {
    let csp = format!(
        "default-src 'none'; script-src 'sha256-{}'; style-src 'unsafe-inline'; \
         connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'",
        script_hash(DASHBOARD_HTML)
    );
    HeaderValue::from_str(&csp).unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"))
});

/// The base64 SHA-256 of the page's one inline script (the text between `<script>` and
/// `</script>`), as a CSP `'sha256-...'` source names it.
fn script_hash(html: &str) -> String {
    use sha2::{Digest, Sha256};
    let script = html
        .split_once("<script>")
        .and_then(|(_, rest)| rest.split_once("</script>"))
        .map_or("", |(script, _)| script);
    encode_base64(&Sha256::digest(script.as_bytes()))
}

/// Standard base64, padded.
fn encode_base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                ABC[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

const NOT_CONFIGURED: &str = "the live stats name clients (personal data), so they are served \
only to the admin: start serve with --admin-token-file FILE, then send `Authorization: Bearer \
<token>` (or, from a browser, the token as the HTTP Basic password)";

/// The routes.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/v1/stats", get(v1_stats))
        .route("/dashboard", get(dashboard))
}

/// Why a call is refused.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// No admin token is configured: nobody gets the stats.
    NotConfigured,
    /// No credentials, or unreadable ones.
    Missing,
    /// Credentials that are not the admin token (`basic`: sent as HTTP Basic).
    Wrong { basic: bool },
}

impl Refusal {
    /// The error code (also the label counted in `tollgate_request_errors_total`).
    fn code(&self) -> &'static str {
        match self {
            Refusal::NotConfigured => "admin_token_not_configured",
            Refusal::Missing => "unauthenticated",
            Refusal::Wrong { .. } => "forbidden",
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let code = self.code();
        let (status, message, challenge) = match self {
            Refusal::NotConfigured => (StatusCode::FORBIDDEN, NOT_CONFIGURED, false),
            Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                "missing admin token: send `Authorization: Bearer <token>` (or the token as the \
                 HTTP Basic password)",
                true,
            ),
            // A browser asks again for a wrong Basic password; a bearer caller is told no.
            Refusal::Wrong { basic: true } => (StatusCode::UNAUTHORIZED, "wrong admin token", true),
            Refusal::Wrong { basic: false } => (StatusCode::FORBIDDEN, "wrong admin token", false),
        };
        let mut response = (status, axum::Json(error_body(code, message))).into_response();
        if challenge {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"tollgate admin\", charset=\"UTF-8\""),
            );
        }
        response
    }
}

/// The token a caller presents: a bearer token, or the password of HTTP Basic credentials.
/// `(token, basic)`; `None` when there is none or it cannot be read.
fn presented(headers: &HeaderMap) -> Option<(Vec<u8>, bool)> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = match value.iter().position(|&b| b == b' ') {
        Some(i) => (&value[..i], value[i + 1..].trim_ascii()),
        None => return None,
    };
    if scheme.eq_ignore_ascii_case(b"bearer") {
        return Some((rest.to_vec(), false));
    }
    if scheme.eq_ignore_ascii_case(b"basic") {
        let decoded = decode_base64(rest)?;
        let colon = decoded.iter().position(|&b| b == b':')?;
        return Some((decoded[colon + 1..].trim_ascii().to_vec(), true));
    }
    None
}

/// Standard base64 (padding optional); `None` for anything else. Bounded by the header's size.
fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    let text = text
        .strip_suffix(b"==")
        .or_else(|| text.strip_suffix(b"="))
        .unwrap_or(text);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in text {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Whether the caller presents the admin token (compared in constant time by the registry,
/// which holds it).
fn admin(state: &HttpState, headers: &HeaderMap) -> Result<(), Refusal> {
    let registry = state.registry.as_ref().ok_or(Refusal::NotConfigured)?;
    if !registry.writable() {
        return Err(Refusal::NotConfigured);
    }
    let (token, basic) = presented(headers).ok_or(Refusal::Missing)?;
    match registry.token_matches(&token) {
        Some(true) => Ok(()),
        Some(false) => Err(Refusal::Wrong { basic }),
        None => Err(Refusal::NotConfigured),
    }
}

/// Headers of every answer: nothing cached, nothing sniffed, no referrer.
fn private(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /v1/stats`.
async fn v1_stats(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Err(refusal) = admin(&state, &headers) {
        state.metrics().error(refusal.code());
        return private(refusal.into_response());
    }
    // Off the request path, one at a time with the other admin work: a report walks every rule.
    let app = state.app.clone();
    let report = state
        .admin_work(move || {
            let rules = app.rules();
            let now = app.now();
            let report = app
                .stats()
                .report(&rules.set, rules.generation, app.backend(), now);
            serde_json::to_vec(&report)
        })
        .await;
    match report {
        Some(Ok(body)) => private(super::json_body(StatusCode::OK, body)),
        _ => ApiError::Internal("the stats report failed (see the log)".into()).into_response(),
    }
}

/// `GET /dashboard`.
async fn dashboard(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Err(refusal) = admin(&state, &headers) {
        state.metrics().error(refusal.code());
        return private(refusal.into_response());
    }
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        DASHBOARD_HTML,
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_SECURITY_POLICY, DASHBOARD_CSP.clone());
    response
        .headers_mut()
        .insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    private(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn bearer_and_basic_credentials_are_read() {
        assert_eq!(
            presented(&auth("Bearer s3cret")),
            Some((b"s3cret".to_vec(), false))
        );
        assert_eq!(
            presented(&auth("bearer  s3cret ")),
            Some((b"s3cret".to_vec(), false))
        );
        // `admin:s3cret`
        assert_eq!(
            presented(&auth("Basic YWRtaW46czNjcmV0")),
            Some((b"s3cret".to_vec(), true))
        );
        // `:a:b` (the password holds a colon), unpadded
        assert_eq!(
            presented(&auth("basic OmE6Yg")),
            Some((b"a:b".to_vec(), true))
        );
        assert_eq!(presented(&auth("Basic !!!")), None);
        assert_eq!(presented(&auth("Basic bm9jb2xvbg==")), None);
        assert_eq!(presented(&auth("Digest x")), None);
        assert_eq!(presented(&auth("Bearer")), None);
        assert_eq!(presented(&HeaderMap::new()), None);
    }

    #[test]
    fn the_page_has_one_inline_script_and_the_policy_names_its_hash() {
        assert_eq!(DASHBOARD_HTML.matches("<script").count(), 1);
        let csp = DASHBOARD_CSP.to_str().unwrap();
        assert!(!csp.contains("script-src 'unsafe-inline'"), "{csp}");
        assert!(
            csp.contains(&format!(
                "script-src 'sha256-{}'",
                script_hash(DASHBOARD_HTML)
            )),
            "{csp}"
        );
        // The SHA-256 of "abc" (FIPS 180-2), in base64.
        assert_eq!(
            script_hash("<script>abc</script>"),
            "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
        );
    }

    #[test]
    fn base64_decodes_every_length() {
        for text in ["", "a", "ab", "abc", "abcd"] {
            let enc = encode_base64(text.as_bytes());
            assert_eq!(decode_base64(enc.as_bytes()).unwrap(), text.as_bytes());
        }
        for (text, plain) in [
            ("", ""),
            ("YQ==", "a"),
            ("YWI=", "ab"),
            ("YWJj", "abc"),
            ("YWJjZA", "abcd"),
        ] {
            assert_eq!(
                decode_base64(text.as_bytes()).unwrap(),
                plain.as_bytes(),
                "{text}"
            );
        }
    }
}
