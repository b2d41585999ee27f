//! # tollgate-core
//!
//! The pure, synchronous heart of tollgate: rate-limiting algorithms as pure steps over an
//! injected clock, the rule model (envoyproxy/ratelimit's YAML plus extensions), and the
//! in-memory store, and the request -> descriptors mapping of the rules' `http` section. No async runtime, no sockets, no reads of the system clock.

pub mod algorithm;
pub mod clock;
pub mod decision;
mod fingerprint;
pub mod headers;
pub mod limiter;
pub mod memory;
pub mod quota;
pub mod request;
pub mod rules;
pub mod store;
pub mod window;

pub use clock::{Clock, ManualClock, Micros, MonotonicWallClock, SystemClock};
pub use decision::Decision;
pub use headers::HeaderValues;
pub use memory::MemoryStore;
pub use quota::{Algorithm, Period, Quota, SketchSize, Unit, MAX_PERIOD};
pub use rules::{Domain, Limit, Resolution, RuleDefaults, RuleError, RuleErrors, RuleSet};
pub use store::{CheckItem, FaultKind, Store, StoreError};
