#![warn(unreachable_pub)]
//! # tollgate-server
//!
//! The service around `tollgate-core`, in layers whose arrows point down:
//!
//! - **the service core**, with no transport in it: the request and answer ([`CheckRequest`],
//!   [`CheckResponse`]), the decision ([`decide`]) under a decision policy, the shared state
//!   ([`AppState`]: the rules, swapped atomically on reload), the [`backend`] (memory, or Redis
//!   with a failure policy), the metrics and their one writer, the live statistics, the
//!   [`decision_log`], the error type ([`ApiError`]), the waiting of requests that rules with a
//!   `queue` hold, the traces of decisions ([`otel`]), and the quota server behind Envoy's Rate
//!   Limit Quota Service;
//! - **rule sources** over the core: file reload ([`reload`]) and the rule [`registry`];
//! - **transports** over those: one accept loop for every listener, the HTTP API with
//!   forward-auth and the registry's endpoints ([`http`], its JSON codec [`wire`]) and the Envoy
//!   RLS gRPC service ([`grpc`]);
//! - **Envoy compatibility** ([`envoy`]) over the transports, filling their hooks;
//! - the settings ([`config`]) and **the composition root** ([`serve::serve`]), the only module
//!   that knows them all.
//!
//! `scripts/modgraph.py --check` holds the module graph to this shape.

// What embedders, tollgate-tower and the `tollgate` binary use is public, and nothing else: the
// composition root and its settings (`serve`, `config`), the settings of each part the binary
// fills from its flags (`backend`, `decision_log`, `grpc`, `otel`, `registry`, `xds`), rule
// loading (`reload`), the Envoy profile (`envoy`), the HTTP API to mount in an axum app
// (`router`, `http`), the JSON codec the load generator shares (`wire`), and the decision with
// its request and answer types, re-exported below. `api/tollgate-server.txt` lists every public
// item and the suite checks it (`scripts/public-api.py`).
pub mod backend;
mod check;
pub mod config;
pub mod decision_log;
pub mod envoy;
mod error;
mod exposition;
pub mod grpc;
pub mod http;
mod listener;
mod metrics;
mod model;
pub mod otel;
mod policy;
mod queue;
mod quota;
pub mod registry;
pub mod reload;
pub mod serve;
mod state;
mod stats;
mod store_metrics;
pub mod wire;
pub mod xds;
mod xds_status;

pub use check::{decide, DENIED_BY_POLICY};
pub use error::{ApiError, ErrorClass};
pub use model::{CheckRequest, CheckResponse, Code, DescriptorStatus, HeaderValues, LimitInfo};
pub use state::{AppState, LoadedRules, RequestLimits};

/// The HTTP API of `state` as `serve` composes it, with no registry, no trusted proxy and no
/// Envoy profile ([`serve::http_api`]): tests drive it with `oneshot`; an embedding application
/// can nest or merge it.
pub fn router(state: AppState) -> axum::Router {
    serve::http_api(&state, None).router()
}
