//! What the layer does beyond passing and refusing, for a rules file's `degrade` and
//! `shadowban` options: the [`Degraded`] extension a handler reads to serve a cheaper answer,
//! and the configured response a shadowbanned client is answered with.
//!
//! Both are decided by the rules (`docs/rules.md`); a request they do not touch takes the
//! layer's usual path, with nothing added.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

/// The header an allowed response past a `degrade` threshold carries: the rule's id.
pub(crate) static DEGRADE_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-degrade");

/// Set on a request (as an extension) that a rule allowed below its `degrade` threshold: the
/// handler may serve a cheaper answer while there is still room.
///
/// In axum, a handler takes `Option<axum::Extension<Degraded>>`; with any service, the
/// request's extensions hold it:
///
/// ```
/// use tollgate_tower::Degraded;
///
/// fn page<B>(request: &http::Request<B>) -> &'static str {
///     match request.extensions().get::<Degraded>() {
///         Some(_) => "the short page",
///         None => "the full page",
///     }
/// }
/// # let _ = page::<()>;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Degraded {
    rule: String,
}

impl Degraded {
    pub(crate) fn new(rule: String) -> Self {
        Self { rule }
    }

    /// The id of the rule whose threshold was crossed (`domain|key`, as in `tollgate rules`).
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// The [`Self::rule`] as a header value: bytes outside printable ASCII, and `%`,
    /// percent-encoded.
    pub(crate) fn header_value(&self) -> HeaderValue {
        let plain = |b: u8| (b.is_ascii_graphic() && b != b'%') || b == b' ';
        let mut out = String::with_capacity(self.rule.len());
        for b in self.rule.bytes() {
            if plain(b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static("1"))
    }
}

/// The response a shadowbanned request gets ([`crate::Builder::shadowban_response`]).
pub(crate) struct FakeResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl FakeResponse {
    pub(crate) fn of(response: Response<String>) -> Self {
        let (parts, body) = response.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The default: `200 OK`, empty.
    pub(crate) fn empty() -> Self {
        Self {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: String::new(),
        }
    }

    pub(crate) fn to_response<B: crate::ResponseBody>(&self) -> Response<B> {
        let mut r = Response::new(B::from_text(self.body.clone()));
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers.clone();
        r
    }
}
