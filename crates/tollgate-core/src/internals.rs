//! What tollgate-redis checks its Lua ports against, and this crate's own property tests and
//! benchmarks drive directly: the pure algorithm steps over explicit state, and the window
//! arithmetic. Not part of the API (hidden from the docs, no stability promise): a store uses
//! [`crate::Store`], a service [`crate::limiter`].
//!
//! Every step and clamp takes `(state, now, cost, quota)`, in that order (a clamp has no cost).

pub use crate::algorithm::count_min::Sketch;
pub use crate::algorithm::envoy_fixed_window::{
    window as envoy_window, window_secs as envoy_window_secs,
};
pub use crate::algorithm::fixed_window::Window;
pub use crate::algorithm::sliding_counter::Counter;
pub use crate::algorithm::sliding_log::Log;
pub use crate::algorithm::token_bucket::Bucket;
pub use crate::algorithm::{clamp, step, State};
pub use crate::window::{days_from_civil, previous_start, window};

/// The sliding window log's own step, on a bare [`Log`] (the property tests of its clock
/// handling step it without the [`State`] wrapper).
pub mod sliding_log {
    pub use super::Log;
    pub use crate::algorithm::sliding_log::step;
}

/// The tiered step (priority tiers sharing one limit), on its own state: it takes the levels
/// and the request's tier beside `(state, now, cost, quota)`.
pub mod tiers {
    pub use crate::algorithm::tiers::{clamp, step, Tiered};
}
