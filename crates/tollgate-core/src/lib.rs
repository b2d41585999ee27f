#![warn(unreachable_pub)]
//! # tollgate-core
//!
//! The pure, synchronous heart of tollgate: rate-limiting algorithms as pure steps over an
//! injected clock, the rule model (envoyproxy/ratelimit's YAML plus extensions), the in-memory
//! store, the request -> descriptors mapping of the rules' `http` section ([`request`]) and the
//! rate-limit response headers ([`headers`]). No async runtime, no sockets, no reads of the
//! system clock: time is a parameter ([`Clock`]).
//!
//! One counter, checked directly (a [`Decision`] is a value, a denial included):
//!
//! ```
//! use tollgate_core::{Algorithm, CheckItem, ManualClock, Clock, MemoryStore, Quota, Store, Unit};
//!
//! let store = MemoryStore::default();
//! let clock = ManualClock::new(1_700_000_000_000_000); // microseconds since the Unix epoch
//! let quota = Quota::new(2, Unit::Second).with_algorithm(Algorithm::Gcra);
//! let hit = CheckItem::hit("api|user", "api|user=alice", &quota);
//! assert!(store.check_one(clock.now(), &hit).unwrap().allowed);
//! assert!(store.check_one(clock.now(), &hit).unwrap().allowed);
//! let denied = store.check_one(clock.now(), &hit).unwrap();
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_after, Some(500_000)); // one more in half a second
//! clock.advance(std::time::Duration::from_millis(500));
//! assert!(store.check_one(clock.now(), &hit).unwrap().allowed);
//! ```
//!
//! Or through rules, as the service and the middleware do:
//!
//! ```
//! use tollgate_core::limiter::{check, Descriptor};
//! use tollgate_core::{HeaderValues, MemoryStore, RuleSet};
//!
//! let rules = RuleSet::from_sources(&[(
//!     "rules.yaml".into(),
//!     "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}\n    message: one a minute\n".into(),
//! )])
//! .unwrap();
//! let store = MemoryStore::default();
//! let alice = [Descriptor::new([("user", "alice")])];
//! let now = 1_700_000_000_000_000;
//! assert!(check(&rules, &store, now, "api", &alice, 1).unwrap().allowed());
//! let verdict = check(&rules, &store, now, "api", &alice, 1).unwrap();
//! assert!(!verdict.allowed());
//! let (limit, _) = verdict.binding().unwrap();
//! assert_eq!(limit.message.as_deref(), Some("one a minute"));
//! let headers = HeaderValues::of_verdict(&verdict, false, now).unwrap();
//! assert_eq!(headers.retry_after_secs, Some(60));
//! ```

mod algorithm;
pub mod clock;
pub mod decision;
mod doorkeeper;
mod fingerprint;
pub mod headers;
pub mod limiter;
pub mod memory;
pub mod queue;
pub mod quota;
pub mod request;
pub mod rules;
pub mod shares;
pub mod store;
mod window;

// Not part of the API: the algorithm steps and window arithmetic that tollgate-redis's Lua ports
// are checked against (and this crate's own property tests and benchmarks). Hidden from the
// docs, with no stability promise.
#[doc(hidden)]
pub mod internals;

pub use clock::{Clock, ManualClock, Micros, MonotonicWallClock, SystemClock};
pub use decision::Decision;
pub use doorkeeper::DoorkeeperStats;
pub use headers::{HeaderFamilies, HeaderValues};
pub use memory::MemoryStore;
pub use quota::{Algorithm, Doorkeeper, Period, Quota, SketchSize, SyncMode, Unit, MAX_PERIOD};
pub use rules::{Domain, Limit, Resolution, RuleDefaults, RuleError, RuleErrors, RuleSet};
pub use store::{CheckItem, FaultKind, Store, StoreError};
