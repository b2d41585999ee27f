//! [`Builder`]: how a [`RateLimitLayer`] is configured, checked once in [`Builder::build`]
//! (so a mistake is an [`Error`] at start, never a surprise per request).

use crate::clock::{tokio_paused, CounterClock, LayerClock};
use crate::key::{Key, Kind};
use crate::limiter::{cap, Backend, Limiter, Limits};
use crate::service::RateLimitLayer;
use crate::TokioClock;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::request::Cidr;
use tollgate_core::rules::counter_key;
use tollgate_core::{Clock, HeaderFamilies, MemoryStore, Quota, RuleErrors, RuleSet, Store};

/// Why a layer could not be built.
///
/// `Debug` prints the same text as `Display` (each rule problem as `file:line:column: problem`,
/// as `tollgate validate` does), because `fn main() -> Result<(), Box<dyn Error>>` reports an
/// error with `Debug`: a user reads that line, not Rust's structure dump.
#[derive(thiserror::Error)]
pub enum Error {
    /// The rules file could not be read or is invalid (every problem, with its line).
    #[error("{0}")]
    Rules(#[from] RuleErrors),
    /// The builder's settings do not fit together (the message says how to fix them).
    #[error("{0}")]
    Config(String),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

fn config<T>(message: impl Into<String>) -> Result<T, Error> {
    Err(Error::Config(message.into()))
}

enum Source {
    None,
    File(PathBuf, String),
    Set(Arc<RuleSet>, String),
}

enum Chosen {
    Memory,
    Store(Arc<dyn Store>),
    #[cfg(feature = "redis")]
    Redis(Arc<tollgate_redis::Guarded>),
    #[cfg(feature = "remote")]
    Remote(crate::Remote),
}

/// Configures a [`RateLimitLayer`]: the limits (one in-code [`Quota`] per [`Key`], or a rules
/// file's domain), where counters live (memory by default, Redis, or a remote service), the
/// clock and the longest a shaped request may wait.
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::{Algorithm, Key, Quota, RateLimitLayer, Unit};
///
/// // 5 requests per second per client address, bursts of up to 10 queued and released at
/// // that steady rate (a leaky bucket), none waiting more than 3 s.
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::new(5, Unit::Second).with_algorithm(Algorithm::LeakyBucket).with_burst(10))
///     .key(Key::peer_ip())
///     .max_wait(Duration::from_secs(3))
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
pub struct Builder {
    quota: Option<Quota>,
    key: Option<Key>,
    domain: Option<String>,
    rules: Source,
    backend: Chosen,
    clock: Option<Arc<dyn Clock>>,
    trusted: Vec<String>,
    max_wait: Duration,
    queue_max_waiting: usize,
    allow_headers: Option<HeaderFamilies>,
    shadowban: Option<http::Response<String>>,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            quota: None,
            key: None,
            domain: None,
            rules: Source::None,
            backend: Chosen::Memory,
            clock: None,
            trusted: Vec::new(),
            max_wait: Duration::from_secs(10),
            queue_max_waiting: tollgate_core::queue::DEFAULT_MAX_WAITING,
            allow_headers: Some(HeaderFamilies::Both),
            shadowban: None,
        }
    }
}

impl RateLimitLayer {
    /// Start configuring a layer.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

impl Builder {
    /// An in-code limit: `quota` for each value of the [`Builder::key`].
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// What the in-code limit (or, in remote mode, the descriptor sent) counts by.
    pub fn key(mut self, key: Key) -> Self {
        self.key = Some(key);
        self
    }

    /// The domain of the in-code limit's counters (default `tower`): instances that share a
    /// store and a domain share counters, and in remote mode the domain of the service's rules.
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// Limits from a rules file (or directory), read by [`Builder::build`]: `domain`'s limits,
    /// with its `http` section deriving each request's descriptors.
    pub fn rules_file(mut self, path: impl Into<PathBuf>, domain: impl Into<String>) -> Self {
        self.rules = Source::File(path.into(), domain.into());
        self
    }

    /// Limits from rules already loaded (`RuleSet::load`, `RuleSet::from_sources`).
    pub fn rules(mut self, rules: RuleSet, domain: impl Into<String>) -> Self {
        self.rules = Source::Set(Arc::new(rules), domain.into());
        self
    }

    /// Proxies trusted to report the client address (`X-Forwarded-For`, `X-Real-IP`): CIDRs
    /// such as `10.0.0.0/8` or single addresses. Used by [`Key::forwarded_ip`] and the rules'
    /// `remote_address` actions; an invalid block is reported by [`Builder::build`].
    pub fn trusted_proxies<I, S>(mut self, cidrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.trusted = cidrs.into_iter().map(Into::into).collect();
        self
    }

    /// Counters in this store instead of a new memory store (for instance one
    /// [`MemoryStore`] shared by several layers).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.backend = Chosen::Store(store);
        self
    }

    /// Counters in Redis, shared by every instance of the application, behind the same
    /// failure policy and circuit breaker as `tollgate serve` (`tollgate_redis::Guarded`).
    /// Limits whose quota says `sync: lease` (a rules file's `rate_limit.sync`, or
    /// `Quota::with_sync(SyncMode::Lease)`) are leased as in the service: most decisions are made
    /// in this process from shares of the window's count, never more than the limit across
    /// instances (docs/distributed.md). Call `Guarded::return_leases` at shutdown to give the
    /// unspent shares back at once (otherwise they go back after half a second unused).
    /// Limits that say `sync: batched` are counted in this process and sent to Redis every
    /// flush interval: the limit's own (a rules file's `rate_limit.flush_interval`, or
    /// `Quota::with_flush_interval`), else `RedisSettings::flush_interval` (approximate, with a
    /// bounded overshoot); call
    /// `Guarded::flush` at shutdown to send the last counts.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, guarded: Arc<tollgate_redis::Guarded>) -> Self {
        self.backend = Chosen::Redis(guarded);
        self
    }

    /// Decisions from a running tollgate service (its rules, its store): see [`crate::Remote`].
    #[cfg(feature = "remote")]
    pub fn remote(mut self, remote: crate::Remote) -> Self {
        self.backend = Chosen::Remote(remote);
        self
    }

    /// The clock decisions are made on. Default: a [`TokioClock`] started at `build`, or, for a
    /// layer on its own memory store built while Tokio's clock is not paused, a cheaper clock on
    /// the CPU's counter (see the crate docs, "Time"). A test that pauses Tokio's clock after
    /// building the layer gives `.clock(TokioClock::new())`.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The longest a leaky-bucket limit may delay a request (default 10 s): a request that
    /// would wait longer is refused, as when the queue is full, and consumes nothing.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The most requests that may wait at once in the queues of rules with a `queue` option (see
    /// docs/rules.md, "Queueing"), all lines of the layer together (default 10,000): past it, a
    /// request such a rule denies gets the denial at once.
    pub fn queue_max_waiting(mut self, n: usize) -> Self {
        self.queue_max_waiting = n;
        self
    }

    /// Whether allowed responses get the rate-limit headers (default `true`, the families of
    /// [`Builder::allow_headers`]); denials always carry them all. Off saves formatting them
    /// per request where nobody reads them.
    pub fn headers_on_allow(mut self, on: bool) -> Self {
        self.allow_headers = match (on, self.allow_headers) {
            (false, _) => None,
            (true, Some(f)) => Some(f),
            (true, None) => Some(HeaderFamilies::Both),
        };
        self
    }

    /// Which rate-limit headers allowed responses get (default [`HeaderFamilies::Both`]):
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`, the IETF draft's `RateLimit-Policy` and
    /// `RateLimit`, or both. Denials (429 or `RESOURCE_EXHAUSTED`) always carry both families and
    /// `Retry-After`. Each header costs formatting and a header-map insert per request.
    ///
    /// ```
    /// use tollgate_tower::{HeaderFamilies, Key, Quota, RateLimitLayer, Unit};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::new(100, Unit::Minute))
    ///     .key(Key::peer_ip())
    ///     .allow_headers(HeaderFamilies::XRateLimit)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn allow_headers(mut self, families: HeaderFamilies) -> Self {
        self.allow_headers = Some(families);
        self
    }

    /// The response a request gets when only `shadowban` rules of the rules file deny it (see
    /// docs/rules.md): the inner service is not called, and the client is answered with a copy
    /// of `response` (status, headers, body), as if it had been served. Default: `200 OK` with
    /// no body. Use it only against abuse: it hides the limit from the client.
    ///
    /// ```
    /// use tollgate_tower::RateLimitLayer;
    ///
    /// let fake = http::Response::builder()
    ///     .header("content-type", "application/json")
    ///     .body(r#"{"results":[]}"#.to_string())
    ///     .unwrap();
    /// let builder = RateLimitLayer::builder().shadowban_response(fake);
    /// # let _ = builder;
    /// ```
    pub fn shadowban_response(mut self, response: http::Response<String>) -> Self {
        self.shadowban = Some(response);
        self
    }

    /// Check the settings and build the layer.
    pub fn build(self) -> Result<RateLimitLayer, Error> {
        let trusted = self
            .trusted
            .iter()
            .map(|c| c.parse::<Cidr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Config(e.to_string()))?;
        #[cfg(feature = "remote")]
        let remote = matches!(self.backend, Chosen::Remote(_));
        #[cfg(not(feature = "remote"))]
        let remote = false;
        if let Some(Key(Kind::BadHeader(name))) = &self.key {
            return config(format!("Key::header: `{name}` is not a valid header name"));
        }
        let limits = match (self.rules, self.quota, self.key) {
            (Source::None, _, None) => {
                return config(
                    "no limits: give .quota(..) and .key(..), or .rules_file(path, domain)",
                )
            }
            (Source::None, None, Some(_)) if !remote => {
                return config("a key without a quota: add .quota(Quota::new(..))")
            }
            (Source::None, Some(_), _) if remote => {
                return config(
                    "remote mode takes its limits from the service's rules: drop .quota(..) \
                     (give .domain(..) and .key(..))",
                )
            }
            (Source::None, quota, Some(key)) => {
                let domain = self.domain.unwrap_or_else(|| "tower".to_owned());
                // Also the rule id: one in-code limit, one rule.
                let prefix = counter_key(&domain, &[(key.name(), "")]);
                Limits::Key {
                    quota: quota.map(|q| cap(&q, self.max_wait)),
                    domain,
                    key,
                    rule: prefix.clone(),
                    prefix,
                }
            }
            (Source::File(path, domain), None, None) => {
                rules_limits(Arc::new(RuleSet::load(&path)?), domain)?
            }
            (Source::Set(rules, domain), None, None) => rules_limits(rules, domain)?,
            _ => {
                return config(
                    "both a rules file and an in-code .quota(..)/.key(..): choose one \
                     (put several limits in the rules file)",
                )
            }
        };
        let backend = match self.backend {
            Chosen::Memory => Backend::Own(Arc::new(MemoryStore::default())),
            Chosen::Store(s) => Backend::Local(s),
            #[cfg(feature = "redis")]
            Chosen::Redis(g) => {
                let problems = match &limits {
                    Limits::Rules { rules, .. } => tollgate_redis::guard::unsupported(rules),
                    Limits::Key { quota, .. } => quota
                        .as_ref()
                        .and_then(|q| tollgate_redis::keys::check_quota(q).err())
                        .map(|e| vec![e.to_string()])
                        .unwrap_or_default(),
                };
                if !problems.is_empty() {
                    return config(problems.join("\n"));
                }
                Backend::Redis(g)
            }
            #[cfg(feature = "remote")]
            Chosen::Remote(r) => Backend::Remote(Box::new(
                crate::remote::Client::new(&r).map_err(Error::Config)?,
            )),
        };
        // See `clock.rs`: the counter clock only where nobody else reads the counters.
        let clock = match self.clock {
            Some(c) => LayerClock::Custom(c),
            None if matches!(backend, Backend::Own(_)) && !tokio_paused() => {
                LayerClock::Counter(CounterClock::new())
            }
            None => LayerClock::Tokio(TokioClock::new()),
        };
        Ok(RateLimitLayer {
            limiter: Arc::new(Limiter {
                limits,
                backend,
                clock,
                trusted,
                max_wait: self.max_wait,
                allow_headers: self.allow_headers,
                queue: Arc::new(tollgate_core::queue::Waitlist::new(self.queue_max_waiting)),
                shadowban: self.shadowban.map_or_else(
                    crate::signal::FakeResponse::empty,
                    crate::signal::FakeResponse::of,
                ),
            }),
        })
    }
}

/// The limits of `domain` in `rules`, which must exist and have an `http` section.
fn rules_limits(rules: Arc<RuleSet>, domain: String) -> Result<Limits, Error> {
    let Some(d) = rules.domain(&domain) else {
        let known: Vec<&str> = rules.domains().map(|d| d.name.as_str()).collect();
        return config(format!(
            "the rules define no domain `{domain}` (they define: {})",
            known.join(", ")
        ));
    };
    if d.http().is_none() {
        return config(format!(
            "domain `{domain}` has no `http` section: the layer cannot derive descriptors \
             from requests without one (see docs/gateways.md)"
        ));
    }
    Ok(Limits::Rules { rules, domain })
}
