//! The decision for one request, independent of tower: what to count (an in-code key, or the
//! rules' `http` section), where (memory, Redis, a remote service), and the answer the layer
//! acts on (pass with headers, pass after a delay, or deny with headers and a message).
//!
//! One async path serves every backend ([`Limiter::decide`]); with the memory store the answer
//! comes in place instead: an in-code key synchronously ([`Limiter::prepare`] with a binary
//! counter key on the layer's own store, [`Limiter::decide_key_now`] with a text one in a
//! per-thread buffer on a given store; no allocation either way), rules by polling the async
//! path once ([`Limiter::decide_now`]). So the common
//! case costs no task, no boxed future and no extra poll.
//!
//! Shaping: a leaky bucket admits a request with the `delay` it must wait in the queue. A
//! maximum wait caps that queue: leaky-bucket quotas are checked with their burst lowered to
//! what `max_wait` can drain (`max_wait / interval + 1`), so a request that would have to wait
//! longer is refused exactly as when the queue is full, and consumes nothing; an admitted one
//! never waits longer than `max_wait`.

use crate::clock::LayerClock;
use crate::key::{Head, Key, Missing};
use futures_util::FutureExt as _;
use http::HeaderMap;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::limiter::{Descriptor, Plan, QueueSpot, Status};
use tollgate_core::queue::{self, Attempt, Dropped, LineKey, Waitlist};
use tollgate_core::request::{client_address, Cidr, HttpActions, RequestParts};
use tollgate_core::{
    Algorithm, CheckItem, Decision, HeaderFamilies, HeaderValues, MemoryStore, Micros, Quota,
    RuleSet, Store,
};

/// The message of a denial by a rule without one (and of every remote denial).
pub(crate) const DEFAULT_MESSAGE: &str = "rate limit exceeded";
/// The message of a denial made because the store or service could not decide.
pub(crate) const UNAVAILABLE_MESSAGE: &str =
    "rate limit store unavailable: denied by the failure policy; retry later";
/// `Retry-After` (seconds) of a denial by a failure policy: the store may be back by then.
const UNAVAILABLE_RETRY_SECS: u32 = 1;

/// What requests are counted by.
pub(crate) enum Limits {
    /// One in-code limit: `quota` (burst capped for shaping) per value of `key`.
    Key {
        /// The domain sent to a remote service.
        #[cfg_attr(not(feature = "remote"), allow(dead_code))]
        domain: String,
        key: Key,
        /// `domain|name=`, escaped: each counter key is this plus the escaped value.
        prefix: String,
        /// `None` in remote mode: the service's rules decide.
        quota: Option<Quota>,
        /// The limit's id (its counter keys' prefix).
        rule: String,
    },
    /// A rules file's domain, its `http` section deriving the descriptors.
    Rules { rules: Arc<RuleSet>, domain: String },
}

/// Where counters live.
pub(crate) enum Backend {
    /// The layer's own memory store (the default): nobody else reads it, so an in-code key
    /// names its counters in binary (see `key.rs`).
    Own(Arc<MemoryStore>),
    /// A store given to the builder, maybe shared: text counter keys, as everywhere else.
    Local(Arc<dyn Store>),
    #[cfg(feature = "redis")]
    Redis(Arc<tollgate_redis::Guarded>),
    #[cfg(feature = "remote")]
    Remote(Box<crate::remote::Client>),
}

/// Everything a layer shares between its services.
pub(crate) struct Limiter {
    pub(crate) limits: Limits,
    pub(crate) backend: Backend,
    pub(crate) clock: LayerClock,
    pub(crate) trusted: Vec<Cidr>,
    pub(crate) max_wait: Duration,
    /// The rate-limit headers added to allowed responses (`None`: none).
    pub(crate) allow_headers: Option<HeaderFamilies>,
    /// What a request denied only by `shadowban` rules is answered with.
    pub(crate) shadowban: crate::signal::FakeResponse,
    /// The lines of requests that rules with a `queue` make wait.
    pub(crate) queue: Arc<Waitlist<LineKey>>,
}

/// A request of a rules layer waiting in line: what [`queue::serve`] drives.
struct Queued<'a> {
    limiter: &'a Limiter,
    rules: &'a RuleSet,
    domain: &'a str,
    descriptors: &'a [Descriptor],
}

impl queue::Driver for Queued<'_> {
    type Answer = Answer;

    fn now(&self) -> Micros {
        self.limiter.clock.now()
    }

    async fn sleep_until(&self, at: Micros) {
        let now = self.now();
        if at > now {
            tokio::time::sleep(Duration::from_micros(at - now)).await;
        }
    }

    async fn decide(&self) -> Attempt<Answer> {
        let now = self.now();
        self.limiter
            .decide_rules(self.rules, self.domain, self.descriptors, now)
            .await
    }

    async fn refusal(&self, spot: &QueueSpot<'_>, why: Dropped) -> Answer {
        // Nothing was decided: the wait the rule allows is the best hint of when to retry.
        let secs = tollgate_core::headers::secs_ceil(spot.policy.max_wait).max(1);
        let mut retry = HeaderMap::new();
        retry.insert(http::header::RETRY_AFTER, secs.into());
        Answer::Deny {
            headers: Headers::Map(Box::new(retry)),
            message: format!(
                "{} ({})",
                message(spot.limit.message.as_deref(), false),
                match why {
                    Dropped::Full => "queue full",
                    _ => "queue wait exceeded",
                }
            ),
        }
    }

    fn joined(&self, _: &QueueSpot<'_>) {}
    fn served(&self, _: &QueueSpot<'_>, _: Micros) {}
    fn dropped(&self, _: &QueueSpot<'_>, _: Dropped, _: bool) {}
}

/// What one request asks the backend about.
pub(crate) enum Query {
    /// The in-code key's counter key (local and Redis backends) or its value (remote).
    One(String),
    /// Descriptors from the `http` section.
    Many(Vec<Vec<(String, String)>>),
}

/// The rate-limit headers of an answer.
pub(crate) enum Headers {
    None,
    /// Computed values, and which of them to send.
    Values(HeaderValues, HeaderFamilies),
    /// As a remote service sent them (boxed: rare, and large).
    Map(Box<HeaderMap>),
}

impl Headers {
    pub(crate) fn add_to(&self, map: &mut HeaderMap) {
        match self {
            Headers::None => {}
            Headers::Values(v, families) => {
                // Room for every header at once, and for the `Content-Length` axum adds after
                // the layer: an axum response's map holds 6 entries before it grows, so
                // without this it may grow (a rehash) on that last insert, all entries to move.
                map.reserve(v.count(*families) + 1);
                v.insert_families(map, *families)
            }
            Headers::Map(m) => {
                for (n, v) in m.iter() {
                    map.insert(n.clone(), v.clone());
                }
            }
        }
    }
}

/// What [`Limiter::prepare`] found for a request.
pub(crate) enum Prepared {
    /// Pass it on now, adding these headers to the response: the common case, kept small.
    Pass(Headers),
    /// The answer (when known already: refused, or shaped) and the query (when it must still be
    /// decided), or `Err` when a key needs the peer address and there is none. Boxed, so that
    /// the common case moves a small value.
    Later(Box<Later>),
}

/// What [`Prepared::Later`] carries: the query and the known answer, or no peer address.
pub(crate) type Later = Result<(Option<Query>, Option<Answer>), Missing>;

/// What the layer does with a request.
pub(crate) enum Answer {
    /// Pass it on (after `delay`), adding `headers` to the response (unless the layer adds
    /// none to allowed responses).
    Allow { headers: Headers, delay: Duration },
    /// Refuse it: 429 (HTTP) or RESOURCE_EXHAUSTED (gRPC).
    Deny { headers: Headers, message: String },
    /// Pass it on as [`Answer::Allow`] does, the request carrying the [`crate::Degraded`]
    /// extension and the response its header: a rule's `degrade` threshold was crossed.
    Degrade {
        headers: Headers,
        delay: Duration,
        degraded: crate::Degraded,
    },
    /// Denied only by `shadowban` rules: answered with the configured response, the inner
    /// service not called.
    Shadowban,
    /// The server did not record the client address a key needs.
    NoPeer,
}

impl Answer {
    fn pass() -> Self {
        Answer::Allow {
            headers: Headers::None,
            delay: Duration::ZERO,
        }
    }

    fn unavailable() -> Self {
        let mut retry = HeaderMap::new();
        retry.insert(http::header::RETRY_AFTER, UNAVAILABLE_RETRY_SECS.into());
        Answer::Deny {
            headers: Headers::Map(Box::new(retry)),
            message: UNAVAILABLE_MESSAGE.to_owned(),
        }
    }
}

/// The store's decisions and whether a failure policy made them.
struct Decided {
    decisions: Vec<Decision>,
    denied_by_policy: bool,
}

impl Limiter {
    /// What to ask about `req`; `Ok(None)` when nothing limits it.
    pub(crate) fn query(&self, req: &Head<'_>) -> Result<Option<Query>, Missing> {
        match &self.limits {
            Limits::Key { key, prefix, .. } => {
                let mut out = String::with_capacity(prefix.len() + 40);
                let escape = !self.is_remote();
                if escape {
                    out.push_str(prefix);
                }
                let limited = key.write_value(req, &self.trusted, &mut out, escape)?;
                Ok(limited.then_some(Query::One(out)))
            }
            Limits::Rules { rules, domain } => {
                let Some(actions) = rules.domain(domain).and_then(|d| d.http()) else {
                    return Ok(None);
                };
                let descriptors = descriptors(actions, req, &self.trusted);
                Ok((!descriptors.is_empty()).then_some(Query::Many(descriptors)))
            }
        }
    }

    /// The answer of an in-code limit's decision `d` (its headers computed only when sent).
    fn one_answer(
        &self,
        quota: &Quota,
        d: &Decision,
        now: Micros,
        denied_by_policy: bool,
    ) -> Answer {
        if d.allowed {
            Answer::Allow {
                headers: match self.allow_headers {
                    Some(f) => Headers::Values(HeaderValues::new(Some(quota), d, true, now), f),
                    None => Headers::None,
                },
                delay: Duration::from_micros(d.delay),
            }
        } else {
            Answer::Deny {
                headers: Headers::Values(
                    HeaderValues::new(Some(quota), d, false, now),
                    HeaderFamilies::Both,
                ),
                message: message(None, denied_by_policy),
            }
        }
    }

    /// What to do with a request an in-code limit with `quota` decided `d` for.
    #[inline(always)]
    fn prepared(&self, quota: &Quota, d: &Decision, now: Micros) -> Prepared {
        if d.allowed && d.delay == 0 {
            Prepared::Pass(match self.allow_headers {
                Some(f) => Headers::Values(HeaderValues::new(Some(quota), d, true, now), f),
                None => Headers::None,
            })
        } else {
            Prepared::Later(Box::new(Ok((
                None,
                Some(self.one_answer(quota, d, now, false)),
            ))))
        }
    }

    /// Whether deciding needs the request's [`http::request::Parts`] (a closure key).
    pub(crate) fn needs_parts(&self) -> bool {
        matches!(&self.limits, Limits::Key { key, .. } if key.needs_parts())
    }

    /// What to do with a request (see [`Prepared`]).
    pub(crate) fn prepare(&self, req: &Head<'_>) -> Prepared {
        // The common case, kept small: an in-code key on the layer's own store, decided in place
        // with a binary counter key (see `key.rs`).
        if let (
            Limits::Key {
                key,
                quota: Some(quota),
                rule,
                ..
            },
            Backend::Own(own),
        ) = (&self.limits, &self.backend)
        {
            let found = key.with_bytes(
                req,
                &self.trusted,
                #[inline(always)]
                |bytes| {
                    let now = self.clock.now();
                    let d = own.check_binary(now, rule, bytes, quota, 1);
                    self.prepared(quota, &d, now)
                },
            );
            return match found {
                Ok(Some(p)) => p,
                Ok(None) => Prepared::Pass(Headers::None),
                Err(missing) => Prepared::Later(Box::new(Err(missing))),
            };
        }
        self.prepare_otherwise(req)
    }

    /// [`Limiter::prepare`] for every other configuration.
    #[inline(never)]
    fn prepare_otherwise(&self, req: &Head<'_>) -> Prepared {
        // Memory store: decided here, in place (the store never waits).
        if let Some(fast) = self.decide_key_now(req) {
            return fast;
        }
        let found = self.query(req).map(|query| match query {
            Some(q) => {
                let known = self.decide_now(&q);
                (Some(q), known)
            }
            None => (None, None),
        });
        match found {
            Ok((None, None)) => Prepared::Pass(Headers::None),
            Ok((_, Some(Answer::Allow { headers, delay }))) if delay.is_zero() => {
                Prepared::Pass(self.on_allow(headers))
            }
            other => Prepared::Later(Box::new(other)),
        }
    }

    /// The headers of an allowed request, as the layer is configured to send them.
    pub(crate) fn on_allow(&self, headers: Headers) -> Headers {
        match (self.allow_headers, headers) {
            (None, _) => Headers::None,
            (Some(f), Headers::Values(v, _)) => Headers::Values(v, f),
            (Some(HeaderFamilies::Both), other) => other,
            // A remote service's headers: those of the chosen family.
            (Some(f), Headers::Map(mut m)) => {
                let ietf = |n: &http::HeaderName| n.as_str().starts_with("ratelimit");
                let x = |n: &http::HeaderName| n.as_str().starts_with("x-ratelimit-");
                let names: Vec<http::HeaderName> = m.keys().cloned().collect();
                for n in names {
                    let keep = match f {
                        HeaderFamilies::XRateLimit => x(&n),
                        _ => ietf(&n),
                    };
                    if !keep {
                        m.remove(&n);
                    }
                }
                Headers::Map(m)
            }
            (Some(_), Headers::None) => Headers::None,
        }
    }

    /// The backend when it is a store that decides in place (memory, or any synchronous one).
    fn local(&self) -> Option<&dyn Store> {
        match &self.backend {
            Backend::Own(store) => Some(&**store),
            Backend::Local(store) => Some(&**store),
            // Redis, remote (unreachable without those features).
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn is_remote(&self) -> bool {
        #[cfg(feature = "remote")]
        if let Backend::Remote(_) = self.backend {
            return true;
        }
        false
    }

    /// An in-code key on a store given to the builder (memory, or any synchronous store),
    /// decided in place with the text counter key built in a per-thread buffer (no allocation).
    /// `None` when the layer is not configured so; else what [`Limiter::query`] and
    /// [`Limiter::decide_now`] give. (The layer's own store is [`Limiter::prepare`]'s.)
    fn decide_key_now(&self, req: &Head<'_>) -> Option<Prepared> {
        let (
            Limits::Key {
                key,
                prefix,
                quota: Some(quota),
                rule,
                ..
            },
            Backend::Local(store),
        ) = (&self.limits, &self.backend)
        else {
            return None;
        };
        thread_local!(static KEY: RefCell<String> = RefCell::new(String::with_capacity(64)));
        let decide = |buf: &mut String| {
            buf.clear();
            buf.push_str(prefix);
            match key.write_value(req, &self.trusted, buf, true) {
                Ok(true) => {}
                Ok(false) => return Prepared::Pass(Headers::None),
                Err(missing) => return Prepared::Later(Box::new(Err(missing))),
            }
            let now = self.clock.now();
            let item = CheckItem::hit(rule, buf, quota);
            match store.check_one(now, &item) {
                Ok(d) => self.prepared(quota, &d, now),
                Err(_) => Prepared::Later(Box::new(Ok((None, Some(Answer::unavailable()))))),
            }
        };
        Some(KEY.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => decide(&mut buf),
            // Re-entered from a key closure: a buffer of its own.
            Err(_) => decide(&mut String::new()),
        }))
    }

    /// With the memory store (or any synchronous one), the answer right away; `None` when it
    /// takes I/O ([`Limiter::decide`]).
    pub(crate) fn decide_now(&self, query: &Query) -> Option<Answer> {
        let store = self.local()?;
        if matches!(&self.limits, Limits::Rules { rules, .. } if rules.has_queues()) {
            // A request may wait: that takes timers, so the async path.
            return None;
        }
        match self.one_counter(query) {
            Some((quota, item)) => {
                let now = self.clock.now();
                Some(match store.check_one(now, &item) {
                    Ok(d) => self.one_answer(quota, &d, now, false),
                    Err(_) => Answer::unavailable(),
                })
            }
            None => self.decide(query).now_or_never(),
        }
    }

    /// The in-code limit's quota and the check of `query`'s one counter, when `query` is that.
    fn one_counter<'a>(&'a self, query: &'a Query) -> Option<(&'a Quota, CheckItem<'a>)> {
        match (&self.limits, query) {
            (
                Limits::Key {
                    quota: Some(quota),
                    rule,
                    ..
                },
                Query::One(counter),
            ) => Some((quota, CheckItem::hit(rule, counter, quota))),
            _ => None,
        }
    }

    /// Decide `query`.
    pub(crate) async fn decide(&self, query: &Query) -> Answer {
        #[cfg(feature = "remote")]
        if let Backend::Remote(client) = &self.backend {
            return self.decide_remote(client, query).await;
        }
        let now = self.clock.now();
        if let Some((quota, item)) = self.one_counter(query) {
            return match self.check(now, std::slice::from_ref(&item)).await {
                Some(decided) => {
                    let d = decided.decisions.first().copied().unwrap_or_default();
                    self.one_answer(quota, &d, now, decided.denied_by_policy)
                }
                None => Answer::unavailable(),
            };
        }
        match (&self.limits, query) {
            (Limits::Rules { rules, domain }, Query::Many(entries)) => {
                let descriptors: Vec<Descriptor> = entries
                    .iter()
                    .map(|e| Descriptor {
                        entries: e.clone(),
                        hits: None,
                        limit: None,
                    })
                    .collect();
                if rules.has_queues() {
                    let plan = Plan::new(rules, domain, &descriptors, 1);
                    let spots = plan.queue_spots();
                    if !spots.is_empty() {
                        let driver = Queued {
                            limiter: self,
                            rules,
                            domain,
                            descriptors: &descriptors,
                        };
                        // Boxed: only requests that may wait carry the waiting's future.
                        return Box::pin(queue::serve(&self.queue, &driver, &spots)).await;
                    }
                }
                match self.decide_rules(rules, domain, &descriptors, now).await {
                    Attempt::Done(answer, _) | Attempt::Denied { answer, .. } => answer,
                }
            }
            _ => Answer::pass(),
        }
    }

    /// Decide `descriptors` of `domain` by the rules, at `now`: the answer, and whether the
    /// denial may wait in a queue instead.
    async fn decide_rules(
        &self,
        rules: &RuleSet,
        domain: &str,
        descriptors: &[Descriptor],
        now: Micros,
    ) -> Attempt<Answer> {
        let plan = Plan::new(rules, domain, descriptors, 1);
        let items = plan.items();
        let decided = if items.is_empty() {
            Decided {
                decisions: Vec::new(),
                denied_by_policy: false,
            }
        } else {
            let capped = self.capped(&items);
            let items: Vec<CheckItem<'_>> = match &capped {
                None => items,
                Some(quotas) => items
                    .iter()
                    .zip(quotas)
                    .map(|(i, quota)| CheckItem { quota, ..*i })
                    .collect(),
            };
            match self.check(now, &items).await {
                Some(d) => d,
                None => return Attempt::Done(Answer::unavailable(), false),
            }
        };
        let verdict = plan.finish(decided.decisions);
        let allowed = verdict.allowed();
        let headers = match HeaderValues::of_verdict(&verdict, allowed, now) {
            Some(h) => Headers::Values(h, HeaderFamilies::Both),
            None => Headers::None,
        };
        if allowed {
            let delay = Duration::from_micros(verdict.delay());
            let degrade = verdict.statuses.iter().find_map(|s| match s {
                Status::Limited {
                    limit, decision, ..
                } => limit
                    .degrade
                    .filter(|t| t.signals(decision))
                    .map(|_| limit.id.clone()),
                _ => None,
            });
            let answer = match degrade {
                None => Answer::Allow { headers, delay },
                Some(rule) => Answer::Degrade {
                    headers,
                    delay,
                    degraded: crate::Degraded::new(rule),
                },
            };
            return Attempt::Done(answer, true);
        }
        let mut blocking = verdict.statuses.iter().filter(|s| s.blocks());
        let banned = blocking.clone().next().is_some()
            && blocking.all(|s| matches!(s, Status::Limited { limit, .. } if limit.shadowban));
        if banned && !decided.denied_by_policy {
            return Attempt::Done(Answer::Shadowban, false);
        }
        let rule_message = verdict.statuses.iter().find_map(|s| match s {
            Status::Limited { limit, .. } if s.blocks() => limit.message.as_deref(),
            _ => None,
        });
        let answer = Answer::Deny {
            headers,
            message: message(rule_message, decided.denied_by_policy),
        };
        let wait = if rules.has_queues() && !decided.denied_by_policy {
            queue::wait_for(&verdict)
        } else {
            None
        };
        match wait {
            Some(wait) => Attempt::Denied { answer, wait },
            None => Attempt::Done(answer, false),
        }
    }

    /// The leaky-bucket quotas of `items` with their burst capped to what `max_wait` drains;
    /// `None` when no item needs it (the common case: no allocation).
    fn capped(&self, items: &[CheckItem<'_>]) -> Option<Vec<Quota>> {
        let needs = |q: &Quota| cap(q, self.max_wait) != *q;
        items
            .iter()
            .any(|i| needs(i.quota))
            .then(|| items.iter().map(|i| cap(i.quota, self.max_wait)).collect())
    }

    /// Ask the store; `None` when it failed and nothing else could decide.
    async fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Option<Decided> {
        match &self.backend {
            Backend::Own(_) | Backend::Local(_) => {
                let store = self.local()?;
                let decisions = match items {
                    [one] => store.check_one(now, one).map(|d| vec![d]),
                    many => store.check(now, many),
                };
                decisions.ok().map(|decisions| Decided {
                    decisions,
                    denied_by_policy: false,
                })
            }
            #[cfg(feature = "redis")]
            Backend::Redis(g) => g.check(now, items).await.ok().map(|o| Decided {
                denied_by_policy: o.degraded == Some(tollgate_redis::Policy::Deny),
                decisions: o.decisions,
            }),
            #[cfg(feature = "remote")]
            Backend::Remote(_) => None,
        }
    }

    #[cfg(feature = "remote")]
    async fn decide_remote(&self, client: &crate::remote::Client, query: &Query) -> Answer {
        let (domain, one);
        let descriptors: &[Vec<(String, String)>] = match (&self.limits, query) {
            (Limits::Key { domain: d, key, .. }, Query::One(value)) => {
                domain = d.as_str();
                one = [vec![(key.name().to_owned(), value.clone())]];
                &one
            }
            (Limits::Rules { domain: d, .. }, Query::Many(m)) => {
                domain = d.as_str();
                m
            }
            _ => return Answer::pass(),
        };
        match client.check(domain, descriptors).await {
            Ok(a) if a.allowed => match a.degrade {
                None => Answer::Allow {
                    headers: Headers::Map(Box::new(a.headers)),
                    delay: Duration::ZERO,
                },
                Some(rule) => Answer::Degrade {
                    headers: Headers::Map(Box::new(a.headers)),
                    delay: Duration::ZERO,
                    degraded: crate::Degraded::new(rule),
                },
            },
            Ok(a) if a.shadowbanned => Answer::Shadowban,
            Ok(a) => Answer::Deny {
                headers: Headers::Map(Box::new(a.headers)),
                message: DEFAULT_MESSAGE.to_owned(),
            },
            Err(_) if client.fail_closed => Answer::unavailable(),
            Err(_) => Answer::pass(),
        }
    }
}

/// The descriptors the `http` section derives from a request.
fn descriptors(
    actions: &HttpActions,
    req: &Head<'_>,
    trusted: &[Cidr],
) -> Vec<Vec<(String, String)>> {
    let authority = req
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers.get(http::header::HOST)?.to_str().ok());
    let parts = RequestParts {
        method: Some(req.method.as_str()),
        path: req.uri.path_and_query().map(|p| p.as_str()),
        authority,
        headers: req.headers,
        remote_address: crate::key::peer(req).map(|p| client_address(p, req.headers, trusted)),
    };
    actions.descriptors(&parts)
}

/// `q` with a leaky bucket's burst capped so that no admitted request waits more than
/// `max_wait` (see the module docs); other quotas unchanged.
pub(crate) fn cap(q: &Quota, max_wait: Duration) -> Quota {
    match (q.algorithm(), q.emission_interval()) {
        (Algorithm::LeakyBucket, Some(t)) => {
            let wait = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
            let most = (wait / t).saturating_add(1);
            if most < q.capacity() {
                q.with_burst(most)
            } else {
                *q
            }
        }
        _ => *q,
    }
}

fn message(rule: Option<&str>, denied_by_policy: bool) -> String {
    if denied_by_policy {
        UNAVAILABLE_MESSAGE.to_owned()
    } else {
        rule.unwrap_or(DEFAULT_MESSAGE).to_owned()
    }
}
