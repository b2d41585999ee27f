//! What a decision's answer means, where tollgate and a service it stands in for differ.
//!
//! The decision ([`crate::check`]) is the same for every caller: validate, resolve the rules,
//! ask the store, count. A few things around it are a matter of semantics, not of transport:
//! whether a descriptor with no entries is an error, whether every descriptor is in quota mode,
//! which limit the rate-limit headers describe, and whether an over-limit answer is turned into
//! OK (a global shadow mode). [`DecisionPolicy`] carries those choices; `TollgatePolicy` is
//! tollgate's own, the default. The Envoy compatibility profile supplies its own implementation
//! from outside this module, so the core never names it.

use crate::model::HeaderValues;
use tollgate_core::clock::Micros;
use tollgate_core::limiter::Verdict;

/// The semantic choices of a decision (see the module docs). Every method has tollgate's
/// behaviour as its default; an implementation overrides what differs.
pub(crate) trait DecisionPolicy: Send + Sync + std::fmt::Debug + 'static {
    /// Whether a descriptor with no entries is accepted (it matches no rule: OK, no limit)
    /// instead of refused as invalid.
    fn empty_descriptors_ok(&self) -> bool {
        false
    }

    /// Whether every descriptor is in quota mode (a request is over only when all its
    /// quota-mode limits are).
    fn quota_mode(&self) -> bool {
        false
    }

    /// The rate-limit headers of a decision: by default those of the binding limit
    /// ([`HeaderValues::of_verdict`]).
    fn headers(&self, verdict: &Verdict<'_>, allowed: bool, now: Micros) -> Option<HeaderValues> {
        HeaderValues::of_verdict(verdict, allowed, now)
    }

    /// Called once for each over-limit answer: `true` turns it into OK (the statuses keep their
    /// codes and the counters what the store decided; nobody is told to wait). An
    /// implementation that does this counts it and reports the count in
    /// [`Self::expose`].
    fn overrule_denial(&self) -> bool {
        false
    }

    /// The policy's own families on `/metrics` (none by default).
    fn expose(&self, _out: &mut crate::exposition::Exposition) {}
}

/// tollgate's own semantics: every method's default.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TollgatePolicy;

impl DecisionPolicy for TollgatePolicy {}
