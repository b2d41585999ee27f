//! [`Key`]: what an in-code limit counts by (the client address, a header, anything a closure
//! reads from the request), and where a request's peer address is found.
//!
//! A key becomes one descriptor entry `(name, value)`, named like the rules file's `http`
//! actions (`remote_address` for addresses), so an in-code limit and a rules file (or the
//! remote service's rules) count the same request under the same counter key: that text key
//! (`tower|remote_address=10.0.3.231`) is what a shared store (one given to
//! [`Builder::store`](crate::Builder::store), Redis) and a remote service see.
//!
//! The layer's own memory store (the default) is read by nobody else and holds one limit's
//! counters, so there a key names its counter in binary ([`Key::with_bytes`]): an address as its
//! 4 or 16 octets, a header's value as its raw bytes, a closure's value as its UTF-8 bytes, the
//! global key as no bytes. Formatting an address as text cost more than the check itself. Each
//! encoding is injective (addresses: the lengths tell IPv4 from IPv6), and the store keeps
//! binary keys apart from text keys by construction (`MemoryStore::check_binary`). Both spaces
//! decide the same way who shares a counter: one per address, whatever the port; an
//! IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack socket reports for an IPv4
//! client) counts as the IPv4 address it is. A header value that is not UTF-8 is the one
//! difference: the text key replaces its invalid bytes (so two such values may share a
//! counter), the binary key keeps them.

use http::request::Parts;
use std::fmt;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tollgate_core::request::{canonical, client_address, Cidr};
use tollgate_core::rules::push_escaped;

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// What an in-code limit counts requests by: each distinct value has its own counter.
///
/// ```
/// use tollgate_tower::Key;
///
/// let per_ip = Key::peer_ip();
/// let per_client_behind_proxies = Key::forwarded_ip();
/// let per_api_key = Key::header("x-api-key");
/// let per_tenant = Key::from_fn("tenant", |req| {
///     req.uri.path().strip_prefix("/t/")?.split('/').next().map(str::to_owned)
/// });
/// let everyone = Key::global();
/// # let _ = (per_ip, per_client_behind_proxies, per_api_key, per_tenant, everyone);
/// ```
#[derive(Clone)]
pub struct Key(pub(crate) Kind);

#[derive(Clone)]
pub(crate) enum Kind {
    Peer,
    Forwarded,
    Header(http::HeaderName),
    Global,
    Fn(&'static str, Arc<KeyFn>),
    BadHeader(String),
}

impl Key {
    /// The TCP peer's address (`remote_address`). The server must record it: axum's
    /// `into_make_service_with_connect_info::<SocketAddr>()`, tonic's `TcpConnectInfo` (always
    /// there over TCP), or a `SocketAddr` request extension. A request without one is answered
    /// with a 500 that says so: a limit that silently stopped limiting would be worse.
    pub fn peer_ip() -> Self {
        Key(Kind::Peer)
    }

    /// The client's address behind trusted proxies (`remote_address`): the peer's, unless the
    /// peer is one of [`Builder::trusted_proxies`](crate::Builder::trusted_proxies); then the
    /// right-most untrusted hop of `X-Forwarded-For` (or `X-Real-IP`), so a client cannot
    /// choose its own counter. Needs the peer address as [`Key::peer_ip`] does.
    pub fn forwarded_ip() -> Self {
        Key(Kind::Forwarded)
    }

    /// The first value of header `name` (descriptor key: the header name in lower case). A
    /// request without the header is not limited by this key. An invalid header name is
    /// reported by [`Builder::build`](crate::Builder::build).
    pub fn header(name: &str) -> Self {
        match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => Key(Kind::Header(n)),
            // Reported by build(): no panic, and the builder stays a chain of calls.
            Err(_) => Key(Kind::BadHeader(name.to_owned())),
        }
    }

    /// One counter for every request (descriptor `generic_key=global`).
    pub fn global() -> Self {
        Key(Kind::Global)
    }

    /// Whatever `f` returns for the request's head (descriptor key `name`); `None` leaves the
    /// request unlimited by this key.
    pub fn from_fn(
        name: &'static str,
        f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Key(Kind::Fn(name, Arc::new(f)))
    }

    /// Whether the key reads the request's [`Parts`] (a closure key).
    pub(crate) fn needs_parts(&self) -> bool {
        matches!(self.0, Kind::Fn(..))
    }

    /// The descriptor key this key's values go under; empty for an invalid header name.
    pub(crate) fn name(&self) -> &str {
        match &self.0 {
            Kind::Peer | Kind::Forwarded => "remote_address",
            Kind::Header(h) => h.as_str(),
            Kind::Global => "generic_key",
            Kind::Fn(name, _) => name,
            Kind::BadHeader(_) => "",
        }
    }

    /// Append the key's value for a request to `out`, escaped for a counter key when `escape`
    /// ([`push_escaped`]): `Ok(false)` when the request is not limited by this key, `Err` when
    /// the server did not record the peer address. Written in place: this runs per request.
    pub(crate) fn write_value(
        &self,
        req: &Head<'_>,
        trusted: &[Cidr],
        out: &mut String,
        escape: bool,
    ) -> Result<bool, Missing> {
        let push = |out: &mut String, s: &str| {
            if escape {
                push_escaped(out, s)
            } else {
                out.push_str(s)
            }
        };
        match &self.0 {
            Kind::Peer => push_ip(out, canonical(peer(req).ok_or(Missing)?)),
            Kind::Forwarded => push_ip(
                out,
                client_address(peer(req).ok_or(Missing)?, req.headers, trusted),
            ),
            Kind::Header(h) => match req.headers.get(h) {
                Some(v) => push(out, &String::from_utf8_lossy(v.as_bytes())),
                None => return Ok(false),
            },
            Kind::Global => push(out, "global"),
            Kind::Fn(_, f) => match req.parts.and_then(|p| f(p)) {
                Some(v) => push(out, &v),
                None => return Ok(false),
            },
            Kind::BadHeader(_) => return Ok(false),
        }
        Ok(true)
    }
}

impl Key {
    /// Call `f` with the key's value for a request as a binary counter key (see the module
    /// docs): `Ok(None)` when the request is not limited by this key, `Err` when the server did
    /// not record the peer address. Nothing is formatted or allocated.
    #[inline(always)]
    pub(crate) fn with_bytes<R>(
        &self,
        req: &Head<'_>,
        trusted: &[Cidr],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, Missing> {
        let ip = match &self.0 {
            Kind::Peer => canonical(peer(req).ok_or(Missing)?),
            Kind::Forwarded => client_address(peer(req).ok_or(Missing)?, req.headers, trusted),
            Kind::Header(h) => return Ok(req.headers.get(h).map(|v| f(v.as_bytes()))),
            Kind::Global => return Ok(Some(f(b""))),
            Kind::Fn(_, g) => return Ok(req.parts.and_then(|p| g(p)).map(|v| f(v.as_bytes()))),
            Kind::BadHeader(_) => return Ok(None),
        };
        Ok(Some(match ip {
            IpAddr::V4(v4) => f(&v4.octets()),
            IpAddr::V6(v6) => f(&v6.octets()),
        }))
    }
}

/// An address as `Display` writes it (no separator to escape); IPv4 digit by digit, as the
/// formatting machinery costs more than the rate-limit check itself.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            out.reserve(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.name())
    }
}

/// What keys and rules read of a request, borrowed from it: the request is not taken apart
/// unless a closure key needs its [`Parts`].
pub(crate) struct Head<'a> {
    pub(crate) method: &'a http::Method,
    pub(crate) uri: &'a http::Uri,
    pub(crate) headers: &'a http::HeaderMap,
    pub(crate) extensions: &'a http::Extensions,
    /// Set when the layer has a closure key.
    pub(crate) parts: Option<&'a Parts>,
}

impl<'a> Head<'a> {
    pub(crate) fn of<B>(req: &'a http::Request<B>) -> Self {
        Head {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
            parts: None,
        }
    }

    pub(crate) fn of_parts(parts: &'a Parts) -> Self {
        Head {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
            parts: Some(parts),
        }
    }
}

/// The request carries no peer address.
#[derive(Debug)]
pub(crate) struct Missing;

/// The TCP peer of a request, from whichever server recorded it.
pub(crate) fn peer(req: &Head<'_>) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(c) = req
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(c.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(a) = req
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|c| c.remote_addr())
    {
        return Some(a.ip());
    }
    req.extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

#[cfg(test)]
mod tests {
    use super::push_ip;
    use std::net::IpAddr;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for a in [
            "0.0.0.0",
            "10.0.3.231",
            "192.168.100.9",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = a.parse().unwrap();
            let mut out = String::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string());
        }
    }
}
