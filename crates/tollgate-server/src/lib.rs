//! # tollgate-server
//!
//! The service around `tollgate-core`: the HTTP JSON API ([`http::router`]),
//! the transport-neutral decision shared with the Envoy RLS gRPC service ([`check::decide`] on
//! [`model`] types) over a [`backend`] (memory, or Redis with a failure policy), metrics, health, rules hot reload ([`reload`]), the rule registry ([`registry`]) and the `serve` wiring
//! ([`serve::serve`]).

pub mod backend;
pub mod check;
pub mod client;
pub mod debug;
pub mod decision_log;
pub mod envoy_redis;
pub mod envoy_stats;
pub mod error;
pub mod forward_auth;
pub mod grpc;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod model;
pub mod profile;
pub mod registry;
pub mod reload;
pub mod serve;
pub mod state;
pub mod wire;

pub use check::decide;
pub use error::{ApiError, ErrorClass};
pub use http::router;
pub use model::{CheckRequest, CheckResponse, Code, DescriptorStatus, HeaderValues, LimitInfo};
pub use state::{AppState, LoadedRules, RequestLimits};
