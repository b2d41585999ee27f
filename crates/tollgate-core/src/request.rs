//! From an HTTP request to rate-limit descriptors: the `http` section of a rules file, evaluated.
//!
//! A domain's `http` section lists rate limit entries in the vocabulary of Envoy's route
//! `rate_limits` (`remote_address`, `masked_remote_address`, `request_headers`, `generic_key`,
//! `header_value_match`, `query_parameters`, `query_parameter_value_match`), so an Envoy user's
//! snippet carries over. As in Envoy, each entry yields one descriptor made of one `(key, value)`
//! per action, in order, or none at all when one of its actions does not apply (a header absent
//! without `skip_if_absent`, a match that failed); a skipped action adds nothing, and an entry
//! whose actions were all skipped yields nothing.
//!
//! Method, path and host are read through Envoy's pseudo-headers `:method`, `:path` (path and
//! query, as sent) and `:authority` wherever a header name is expected.
//!
//! This module is pure (no I/O, no clock) and knows nothing about transports: forward-auth
//! builds a [`RequestParts`] from the headers a gateway sends, an in-process middleware from the
//! request itself. The client address it is given is already resolved; [`client_address`] is
//! how to resolve it from a peer address and the `X-Forwarded-For` chain.

use http::HeaderMap;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// What a rate limit action can see of one HTTP request.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// The method (`:method`), when known.
    pub method: Option<&'a str>,
    /// Path and query as sent (`:path`), when known.
    pub path: Option<&'a str>,
    /// The host (`:authority`), when known.
    pub authority: Option<&'a str>,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The client's address, already resolved (see [`client_address`]); `None` when unknown.
    pub remote_address: Option<IpAddr>,
}

impl<'a> RequestParts<'a> {
    /// The first value of header `name` (lower case), pseudo-headers included. A value that is
    /// not UTF-8 is read lossily.
    fn first(&self, name: &str) -> Option<Cow<'a, str>> {
        match name {
            ":method" => self.method.map(Cow::Borrowed),
            ":path" => self.path.map(Cow::Borrowed),
            ":authority" => self.authority.map(Cow::Borrowed),
            _ => self
                .headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes())),
        }
    }

    /// Every value of header `name` joined by `,`, as Envoy's header matchers see them.
    fn joined(&self, name: &str) -> Option<Cow<'a, str>> {
        if name.starts_with(':') {
            return self.first(name);
        }
        let mut values = self.headers.get_all(name).iter();
        let first = values.next()?;
        let mut out = String::from_utf8_lossy(first.as_bytes());
        for v in values {
            let s = out.to_mut();
            s.push(',');
            s.push_str(&String::from_utf8_lossy(v.as_bytes()));
        }
        Some(out)
    }

    /// The query string's parameters, percent-decoded, in order.
    fn query(&self) -> Vec<(String, String)> {
        let Some(path) = self.path else {
            return Vec::new();
        };
        let path = path.split('#').next().unwrap_or("");
        let Some((_, query)) = path.split_once('?') else {
            return Vec::new();
        };
        query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect()
    }
}

/// `%XX` sequences decoded (invalid ones kept as they are); invalid UTF-8 read lossily.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A domain's `http` section, validated: its rate limit entries in file order.
#[derive(Debug, Clone, Default)]
pub struct HttpActions {
    /// The entries, in file order.
    pub(crate) entries: Vec<RateLimitEntry>,
}

/// One entry of the `http` list: its actions, each contributing one `(key, value)`.
#[derive(Debug, Clone)]
pub(crate) struct RateLimitEntry {
    /// The actions, in order.
    pub(crate) actions: Vec<Action>,
}

/// A rate limit action, as Envoy's `RateLimit.Action`.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// `remote_address`: `("remote_address", client address)`; does not apply when unknown.
    RemoteAddress,
    /// `masked_remote_address`: `("masked_remote_address", "10.1.2.0/24")`.
    MaskedRemoteAddress {
        /// `v4_prefix_mask_len` (default 32).
        v4: u8,
        /// `v6_prefix_mask_len` (default 128).
        v6: u8,
    },
    /// `request_headers`: `(descriptor_key, first value of header_name)`.
    RequestHeaders {
        /// `header_name`, lower case (pseudo-headers `:method`, `:path`, `:authority` too).
        header_name: String,
        /// `descriptor_key`.
        descriptor_key: String,
        /// `skip_if_absent`: an absent header skips this action instead of the descriptor.
        skip_if_absent: bool,
    },
    /// `generic_key`: `(descriptor_key or "generic_key", descriptor_value)`.
    GenericKey {
        /// `descriptor_key`.
        descriptor_key: String,
        /// `descriptor_value`.
        descriptor_value: String,
    },
    /// `header_value_match`: `(descriptor_key or "header_match", descriptor_value)` when every
    /// matcher matches (or, with `expect_match: false`, when not all do).
    HeaderValueMatch {
        /// `descriptor_key`.
        descriptor_key: String,
        /// `descriptor_value`.
        descriptor_value: String,
        /// `expect_match` (default true).
        expect_match: bool,
        /// `headers`.
        headers: Vec<HeaderMatcher>,
    },
    /// `query_parameters`: `(descriptor_key, first value of query_parameter_name)`.
    QueryParameters {
        /// `query_parameter_name`.
        name: String,
        /// `descriptor_key`.
        descriptor_key: String,
        /// `skip_if_absent`.
        skip_if_absent: bool,
    },
    /// `query_parameter_value_match`: `(descriptor_key or "query_match", descriptor_value)`.
    QueryParameterValueMatch {
        /// `descriptor_key`.
        descriptor_key: String,
        /// `descriptor_value`.
        descriptor_value: String,
        /// `expect_match` (default true).
        expect_match: bool,
        /// `query_parameters`.
        params: Vec<QueryMatcher>,
    },
}

/// Envoy's `HeaderMatcher` (without `range_match`).
#[derive(Debug, Clone)]
pub(crate) struct HeaderMatcher {
    /// The header name, lower case.
    pub(crate) name: String,
    /// What the value must be.
    pub(crate) rule: MatchRule,
    /// `invert_match` (no effect on `present_match`).
    pub(crate) invert: bool,
}

/// Envoy's `QueryParameterMatcher`.
#[derive(Debug, Clone)]
pub(crate) struct QueryMatcher {
    /// The parameter name.
    pub(crate) name: String,
    /// What the value must be.
    pub(crate) rule: MatchRule,
}

/// How a header or parameter value is matched.
#[derive(Debug, Clone)]
pub(crate) enum MatchRule {
    /// `present_match`: matches when presence equals this.
    Present(bool),
    /// A string matcher.
    String(StringMatch),
}

/// Envoy's `StringMatcher` (also the legacy `exact_match`, `prefix_match`, ... forms).
#[derive(Debug, Clone)]
pub(crate) struct StringMatch {
    /// The comparison.
    pub(crate) kind: StringMatchKind,
    /// `ignore_case` (not for regexes).
    pub(crate) ignore_case: bool,
}

/// A string comparison.
#[derive(Debug, Clone)]
pub(crate) enum StringMatchKind {
    /// `exact`.
    Exact(String),
    /// `prefix`.
    Prefix(String),
    /// `suffix`.
    Suffix(String),
    /// `contains`.
    Contains(String),
    /// `safe_regex.regex`: the whole value must match (anchored, as RE2's full match).
    Regex(regex::Regex),
}

impl StringMatch {
    /// Whether `value` matches.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let ignore_case = self.ignore_case;
        fn fold_with(ignore_case: bool, s: &str) -> Cow<'_, str> {
            if ignore_case {
                Cow::Owned(s.to_lowercase())
            } else {
                Cow::Borrowed(s)
            }
        }
        let fold = |s| fold_with(ignore_case, s);
        match &self.kind {
            StringMatchKind::Regex(r) => r.is_match(value),
            StringMatchKind::Exact(p) => fold(value) == fold(p),
            StringMatchKind::Prefix(p) => fold(value).starts_with(fold(p).as_ref()),
            StringMatchKind::Suffix(p) => fold(value).ends_with(fold(p).as_ref()),
            StringMatchKind::Contains(p) => fold(value).contains(fold(p).as_ref()),
        }
    }
}

impl HeaderMatcher {
    /// Envoy's rules: an absent header matches `present_match: false` only, or any inverted
    /// string matcher; a present one matches `present_match: true`, or a string matcher (XOR
    /// `invert_match`).
    fn matches(&self, req: &RequestParts<'_>) -> bool {
        match (req.joined(&self.name), &self.rule) {
            (None, MatchRule::Present(p)) => !p,
            (None, MatchRule::String(_)) => self.invert,
            (Some(_), MatchRule::Present(p)) => *p,
            (Some(v), MatchRule::String(m)) => m.matches(&v) != self.invert,
        }
    }
}

impl QueryMatcher {
    fn matches(&self, query: &[(String, String)]) -> bool {
        let value = query.iter().find(|(k, _)| *k == self.name).map(|(_, v)| v);
        match (value, &self.rule) {
            (v, MatchRule::Present(p)) => v.is_some() == *p,
            (None, MatchRule::String(_)) => false,
            (Some(v), MatchRule::String(m)) => m.matches(v),
        }
    }
}

/// What one action gives.
enum Outcome {
    Entry(String, String),
    Skip,
    NoDescriptor,
}

impl Action {
    fn apply(&self, req: &RequestParts<'_>, query: &mut Option<Vec<(String, String)>>) -> Outcome {
        match self {
            Action::RemoteAddress => match req.remote_address {
                Some(a) => Outcome::Entry("remote_address".into(), canonical(a).to_string()),
                None => Outcome::NoDescriptor,
            },
            Action::MaskedRemoteAddress { v4, v6 } => match req.remote_address.map(canonical) {
                Some(a) => {
                    let len = if a.is_ipv4() { *v4 } else { *v6 };
                    Outcome::Entry(
                        "masked_remote_address".into(),
                        Cidr::new(a, len).to_string(),
                    )
                }
                None => Outcome::NoDescriptor,
            },
            Action::RequestHeaders {
                header_name,
                descriptor_key,
                skip_if_absent,
            } => match req.first(header_name) {
                Some(v) => Outcome::Entry(descriptor_key.clone(), v.into_owned()),
                None if *skip_if_absent => Outcome::Skip,
                None => Outcome::NoDescriptor,
            },
            Action::GenericKey {
                descriptor_key,
                descriptor_value,
            } => Outcome::Entry(descriptor_key.clone(), descriptor_value.clone()),
            Action::HeaderValueMatch {
                descriptor_key,
                descriptor_value,
                expect_match,
                headers,
            } => {
                let all = headers.iter().all(|h| h.matches(req));
                if all == *expect_match {
                    Outcome::Entry(descriptor_key.clone(), descriptor_value.clone())
                } else {
                    Outcome::NoDescriptor
                }
            }
            Action::QueryParameters {
                name,
                descriptor_key,
                skip_if_absent,
            } => {
                let q = query.get_or_insert_with(|| req.query());
                match q.iter().find(|(k, _)| k == name) {
                    Some((_, v)) => Outcome::Entry(descriptor_key.clone(), v.clone()),
                    None if *skip_if_absent => Outcome::Skip,
                    None => Outcome::NoDescriptor,
                }
            }
            Action::QueryParameterValueMatch {
                descriptor_key,
                descriptor_value,
                expect_match,
                params,
            } => {
                let q = query.get_or_insert_with(|| req.query());
                let all = params.iter().all(|m| m.matches(q));
                if all == *expect_match {
                    Outcome::Entry(descriptor_key.clone(), descriptor_value.clone())
                } else {
                    Outcome::NoDescriptor
                }
            }
        }
    }
}

impl HttpActions {
    /// The descriptors of `req`: at most one per entry, in entry order, each a list of
    /// `(key, value)`. Values are taken as they are (length limits are the caller's business).
    pub fn descriptors(&self, req: &RequestParts<'_>) -> Vec<Vec<(String, String)>> {
        let mut query = None;
        let mut out = Vec::with_capacity(self.entries.len());
        'entries: for e in &self.entries {
            let mut entries = Vec::with_capacity(e.actions.len());
            for a in &e.actions {
                match a.apply(req, &mut query) {
                    Outcome::Entry(k, v) => entries.push((k, v)),
                    Outcome::Skip => {}
                    Outcome::NoDescriptor => continue 'entries,
                }
            }
            if !entries.is_empty() {
                out.push(entries);
            }
        }
        out
    }

    /// Whether the section has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// An entry that ends with a header or query parameter naming a tier (its `descriptor_key`
    /// is the `tiers.key` of one of the domain's rules) skips that action when the request lacks
    /// it, as with `skip_if_absent`: the descriptor is then the tiered rule's without a tier
    /// entry, in its lowest level. Dropping the whole descriptor would leave every request that
    /// names no tier unlimited.
    pub(crate) fn skip_absent_tiers(&mut self, tier_keys: &[&str]) {
        for e in &mut self.entries {
            if e.actions.len() < 2 {
                continue;
            }
            if let Some(
                Action::RequestHeaders {
                    descriptor_key,
                    skip_if_absent,
                    ..
                }
                | Action::QueryParameters {
                    descriptor_key,
                    skip_if_absent,
                    ..
                },
            ) = e.actions.last_mut()
            {
                if tier_keys.contains(&descriptor_key.as_str()) {
                    *skip_if_absent = true;
                }
            }
        }
    }

    /// Where each entry takes a value straight from the request (`request_headers`, or
    /// `query_parameters` as `?name`): its descriptor key and the header name, in entry order.
    pub fn plain_request_values(&self) -> Vec<(&str, String)> {
        let mut out = Vec::new();
        for e in &self.entries {
            for a in &e.actions {
                match a {
                    Action::RequestHeaders {
                        header_name,
                        descriptor_key,
                        ..
                    } => out.push((descriptor_key.as_str(), header_name.clone())),
                    Action::QueryParameters {
                        name,
                        descriptor_key,
                        ..
                    } => out.push((descriptor_key.as_str(), format!("?{name}"))),
                    _ => {}
                }
            }
        }
        out
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack socket reports for an IPv4
/// client) as the IPv4 address it is; anything else unchanged.
#[inline]
pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// An address block: `10.0.0.0/8`, `::1/128`. The address is stored masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// The block of `addr` with `len` prefix bits (clamped to the family's width).
    pub fn new(addr: IpAddr, len: u8) -> Self {
        let addr = canonical(addr);
        match addr {
            IpAddr::V4(a) => {
                let len = len.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                Cidr {
                    addr: IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask)),
                    len,
                }
            }
            IpAddr::V6(a) => {
                let len = len.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                Cidr {
                    addr: IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask)),
                    len,
                }
            }
        }
    }

    /// Whether `ip` is in the block (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        Cidr::new(ip, self.len) == *self
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Why a CIDR could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address block `{0}`: expected an address or address/prefix-length such as 10.0.0.0/8 or ::1/128")]
pub struct CidrError(pub String);

impl FromStr for Cidr {
    type Err = CidrError;

    /// `a.b.c.d/n`, `v6/n`, or a bare address (a block of one).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CidrError(s.to_string());
        let (a, len) = match s.trim().split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => match l.parse::<u8>() {
                Ok(n) if n <= max && l.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(err()),
            },
        };
        Ok(Cidr::new(addr, len))
    }
}

/// The client address to rate-limit by. The TCP `peer` unless it is one of the `trusted`
/// proxies; then the right-most address of the `X-Forwarded-For` chain (all its header lines,
/// in order) that is not trusted, walking from the right, so a client cannot pick its own counter
/// by sending its own `X-Forwarded-For` (what it writes stays left of the hop its first trusted
/// proxy appends). When every hop is trusted the left-most one is taken; a hop that is not an
/// address ends the walk at the last trusted one. Without `X-Forwarded-For`, a trusted peer's
/// `X-Real-IP` is taken when it is an address.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let peer = canonical(peer);
    let is_trusted = |a: IpAddr| trusted.iter().any(|c| c.contains(a));
    if !is_trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    if hops.is_empty() {
        return headers
            .get("x-real-ip")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_hop)
            .unwrap_or(peer);
    }
    let mut last = peer;
    for hop in hops.iter().rev() {
        let Some(a) = parse_hop(hop) else {
            return last;
        };
        if !is_trusted(a) {
            return a;
        }
        last = a;
    }
    last
}

/// One `X-Forwarded-For` hop: an address, optionally with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
        .map(canonical)
}
