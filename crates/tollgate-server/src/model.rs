//! Transport-neutral request and response: what HTTP JSON, Envoy's `/json` and the Envoy RLS
//! gRPC service all translate to and from. Nothing here knows about JSON or protobuf.

use tollgate_core::clock::Micros;
use tollgate_core::quota::{Algorithm, Unit};

pub(crate) use tollgate_core::headers::secs_ceil;
pub use tollgate_core::headers::HeaderValues;
pub(crate) use tollgate_core::limiter::Descriptor;

/// Envoy's `RateLimitResponse.RateLimit.Unit` number (in protobuf and in its JSON) as tollgate's
/// unit; `None` for `UNKNOWN` (0) and numbers Envoy does not define. The numbers are the
/// protocol's (`grpc`'s tests hold them against the generated enum).
pub(crate) fn unit_from_number(n: i32) -> Option<Unit> {
    Some(match n {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        7 => Unit::Week,
        _ => return None,
    })
}

/// One rate-limit request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckRequest {
    /// The rules domain (`domain:` of a rule file). Must not be empty.
    pub domain: String,
    /// The descriptors, each with its entries in order and an optional cost of its own.
    pub descriptors: Vec<Descriptor>,
    /// The cost of descriptors without their own; `None` means 1. `Some(0)` is a pure query.
    ///
    /// gRPC mapping: Envoy's request `hits_addend` is a plain `uint32`, so 0 (unset) maps to
    /// `None`; a descriptor's `hits_addend` is a `UInt64Value`, so a present 0 is `Some(0)`.
    pub hits: Option<u64>,
}

impl CheckRequest {
    /// A request with a cost of 1 per descriptor.
    pub fn new(domain: impl Into<String>, descriptors: Vec<Descriptor>) -> Self {
        Self {
            domain: domain.into(),
            descriptors,
            hits: None,
        }
    }
}

/// OK or OVER_LIMIT, as Envoy's `RateLimitResponse.Code` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Over the limit: the caller should reject the request.
    OverLimit,
}

impl Code {
    /// `"OK"` / `"OVER_LIMIT"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
        }
    }
}

/// The limit that applied to a descriptor (Envoy's `current_limit`, plus tollgate's extras).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitInfo {
    /// The rule's identity (`domain|key=value|key`), unique in the rule set.
    pub id: String,
    /// `rate_limit.name`, if the rule has one.
    pub name: Option<String>,
    /// Requests (cost units) per period.
    pub requests_per_unit: u64,
    /// The period's unit.
    pub unit: Unit,
    /// How many units make a period (1 unless `unit_multiplier` is set).
    pub unit_multiplier: u32,
    /// The algorithm.
    pub algorithm: Algorithm,
}

/// The answer for one request descriptor, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT. A shadow-mode limit that denied reports OK (see `shadowed`).
    pub code: Code,
    /// The limit that applied; `None` when no rule matched or the rule is `unlimited`.
    pub limit: Option<LimitInfo>,
    /// Remaining after this request, as Envoy reports it: for an `unlimited` rule `u32::MAX`,
    /// for no matching rule 0 (and `limit` is `None`), otherwise the limiter's remaining.
    pub remaining: u64,
    /// Time until the counter is back to full; `None` without a limit.
    pub reset_after: Option<Micros>,
    /// Denied: when the same request could pass. `None` when allowed, and when it can never pass.
    pub retry_after: Option<Micros>,
    /// Admitted by a leaky bucket that asks the caller to wait this long first.
    pub delay: Option<Micros>,
    /// The rule's `message` (returned to throttled clients; `None` when allowed), or an explanation
    /// when the request can never pass.
    pub message: Option<String>,
    /// Denied by a shadow-mode rule but let through.
    pub shadowed: bool,
    /// Denied and retrying can never help (cost above what the limit admits).
    pub never_passes: bool,
    /// The rule is `unlimited: true`.
    pub unlimited: bool,
}

impl DescriptorStatus {
    /// A status with just a code, a limit and what remains (no timings, message or flags).
    pub fn new(code: Code, limit: Option<LimitInfo>, remaining: u64) -> Self {
        Self {
            code,
            limit,
            remaining,
            reset_after: None,
            retry_after: None,
            delay: None,
            message: None,
            shadowed: false,
            never_passes: false,
            unlimited: false,
        }
    }
}

/// The answer to a whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResponse {
    /// Whether the request may proceed (overall OK).
    pub allowed: bool,
    /// One status per request descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
    /// Header values from the binding limit; `None` when no (non-shadow) limit applied.
    pub headers: Option<HeaderValues>,
    /// Longest leaky-bucket delay over all descriptors (admitted requests only); 0 = none.
    pub delay: Micros,
    /// Allowed, and a rule's `degrade` threshold is crossed: that rule's id (the first such
    /// rule in request order). The caller may serve a cheaper answer.
    pub degrade: Option<String>,
    /// Denied, and every rule that denied is a `shadowban` rule: the client is to be answered
    /// as if allowed, without the request going through.
    pub shadowbanned: bool,
}

impl CheckResponse {
    /// Overall code.
    pub fn code(&self) -> Code {
        if self.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        }
    }
}

/// Microseconds to whole milliseconds, rounded up.
pub(crate) fn ms_ceil(us: Micros) -> u64 {
    us.div_ceil(1_000)
}

/// Names of three rate-limit response headers (the limit, the remaining, the reset), for
/// answers that name them otherwise than tollgate does (Envoy's `LIMIT_*_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// `LIMIT_LIMIT_HEADER` (default `RateLimit-Limit`).
    pub limit: String,
    /// `LIMIT_REMAINING_HEADER` (default `RateLimit-Remaining`).
    pub remaining: String,
    /// `LIMIT_RESET_HEADER` (default `RateLimit-Reset`).
    pub reset: String,
}
