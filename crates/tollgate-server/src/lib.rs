//! # tollgate-server
//!
//! The service around `tollgate-core`, in layers whose arrows point down:
//!
//! - **the service core**, with no transport in it: the request and answer [`model`], the
//!   decision ([`check::decide`]) under a [`policy::DecisionPolicy`], the shared [`state`] (the
//!   rules, swapped atomically on reload), the [`backend`] (memory, or Redis with a failure
//!   policy), [`metrics`], the live [`stats`], the [`decision_log`], the [`error`] type and the
//!   waiting of requests that rules with a `queue` hold ([`queue`]), the traces of decisions
//!   ([`otel`]), and the quota server behind Envoy's Rate Limit Quota Service ([`quota`]);
//! - **rule sources** over the core: file reload ([`reload`]) and the rule [`registry`];
//! - **transports** over those: one accept loop for every listener ([`listener`]), the HTTP API
//!   with forward-auth and the registry's endpoints ([`http`], its JSON codec [`wire`]) and the
//!   Envoy RLS gRPC service ([`grpc`]);
//! - **Envoy compatibility** ([`envoy`]) over the transports, filling their hooks;
//! - the settings ([`config`]) and **the composition root** ([`serve::serve`]), the only module
//!   that knows them all.
//!
//! `scripts/modgraph.py --check` holds the module graph to this shape.

pub mod backend;
pub mod check;
pub mod config;
pub mod decision_log;
pub mod envoy;
pub mod error;
pub mod exposition;
pub mod grpc;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod model;
pub mod otel;
pub mod policy;
pub mod queue;
pub mod quota;
pub mod registry;
pub mod reload;
pub mod serve;
pub mod state;
pub mod stats;
mod store_metrics;
pub mod wire;
pub mod xds;
pub mod xds_status;

pub use check::decide;
pub use error::{ApiError, ErrorClass};
pub use model::{CheckRequest, CheckResponse, Code, DescriptorStatus, HeaderValues, LimitInfo};
pub use state::{AppState, LoadedRules, RequestLimits};

/// The HTTP API of `state` as `serve` composes it, with no registry, no trusted proxy and no
/// Envoy profile ([`serve::http_api`]): tests drive it with `oneshot`; an embedding application
/// can nest or merge it.
pub fn router(state: AppState) -> axum::Router {
    serve::http_api(&state, None).router()
}
