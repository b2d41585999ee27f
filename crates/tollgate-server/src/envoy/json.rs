//! envoyproxy/ratelimit's HTTP endpoints: `POST /json` (its JSON form of `ShouldRateLimit`,
//! answered in protojson) and `GET /healthcheck`.

use super::{EnvoyMode, Health};
use crate::check::decide;
use crate::error::ApiError;
use crate::http::{fail, json_body, read_body, status_of, HttpState};
use crate::model::{CheckResponse, DescriptorStatus};
use crate::wire::{parse_request_within, Dialect};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use std::sync::Arc;

/// `POST /json`, and `GET /healthcheck` when `health` is given.
pub(super) fn routes(
    mode: Option<Arc<EnvoyMode>>,
    health: Option<Arc<Health>>,
) -> Router<HttpState> {
    let mut routes = Router::new().route(
        "/json",
        post(move |State(state): State<HttpState>, req: Request| {
            let mode = mode.clone();
            envoy_json(state, mode, req)
        }),
    );
    if let Some(health) = health {
        routes = routes.route("/healthcheck", get(move || healthcheck(health)));
    }
    routes
}

/// `GET /healthcheck`: `200 OK` with body `OK` while healthy, an empty 500 otherwise (shutting
/// down, or no domain loaded under `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`), as
/// envoyproxy/ratelimit answers.
async fn healthcheck(health: Arc<Health>) -> Response {
    if health.healthy() {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn envoy_json(state: HttpState, mode: Option<Arc<EnvoyMode>>, req: Request) -> Response {
    // The trace headers only, kept for the span (the request is consumed by reading its body).
    let parts_headers = crate::otel::trace_headers(state.tracing(), req.headers());
    let result = async {
        // Any content type: envoyproxy/ratelimit's clients (`curl --data`) send none or a form type.
        let body = read_body(&state, req, state.limits().max_body_bytes).await?;
        parse_request_within(&body, Dialect::ProtoJson, state.limits())
    }
    .await;
    let check = match result {
        Ok(c) => c,
        Err(e) => return fail(&state, e),
    };
    let traced = state
        .tracing()
        .map(|t| t.start(crate::otel::JSON_SPAN, &parts_headers));
    let resp = match crate::otel::in_context(traced, decide(&state, &check)).await {
        Ok(resp) => resp,
        Err(e) => return e.into_response(),
    };
    let Some(mode) = mode else {
        return envoy_response(&resp);
    };
    let headers = mode.headers.as_ref().zip(resp.headers.as_ref());
    if headers.is_none() && !mode.dynamic_metadata {
        return envoy_response(&resp);
    }
    let metadata = mode.dynamic_metadata.then(|| {
        let rules = state.rules();
        super::pb_struct_json(&super::dynamic_metadata(&check, &resp, &rules.set))
    });
    envoy_response_with(&resp, headers, metadata)
}

/// `/json` under the envoy profile with `LIMIT_RESPONSE_HEADERS_ENABLED` or
/// `RESPONSE_DYNAMIC_METADATA`: the body also holds `responseHeadersToAdd` and
/// `dynamicMetadata`, as envoyproxy/ratelimit's `/json` does (it marshals the gRPC response).
fn envoy_response_with(
    resp: &CheckResponse,
    headers: Option<(&crate::model::HeaderNames, &crate::model::HeaderValues)>,
    metadata: Option<Value>,
) -> Response {
    let body = EnvoyBody {
        overall_code: resp.code().as_str(),
        statuses: EnvoyStatuses(&resp.statuses),
    };
    let mut value = match serde_json::to_value(&body) {
        Ok(v) => v,
        Err(e) => {
            return ApiError::Internal(format!("cannot serialize the response: {e}"))
                .into_response()
        }
    };
    if let Some(map) = value.as_object_mut() {
        if let Some((names, values)) = headers {
            let headers: Vec<Value> = [
                (&names.limit, values.limit),
                (&names.remaining, values.remaining),
                (&names.reset, values.reset_secs),
            ]
            .into_iter()
            .map(|(key, v)| json!({"key": key, "value": v.to_string()}))
            .collect();
            map.insert("responseHeadersToAdd".to_owned(), headers.into());
        }
        if let Some(m) = metadata {
            map.insert("dynamicMetadata".to_owned(), m);
        }
    }
    json_body(status_of(resp), value.to_string().into_bytes())
}

/// The `/json` response: protojson `RateLimitResponse` (default values omitted), 200 / 429.
pub fn envoy_response(resp: &CheckResponse) -> Response {
    let body = EnvoyBody {
        overall_code: resp.code().as_str(),
        statuses: EnvoyStatuses(&resp.statuses),
    };
    let mut buf = Vec::with_capacity(32 + 160 * resp.statuses.len());
    if let Err(e) = serde_json::to_writer(&mut buf, &body) {
        // Unreachable for these types (string keys only); answer like any other bug.
        return ApiError::Internal(format!("cannot serialize the response: {e}")).into_response();
    }
    json_body(status_of(resp), buf)
}

// The `/json` body as typed, borrowed structs (field order = output order, alphabetical like
// the `serde_json::Value` maps this replaced; tests/response_bytes.rs pins the bytes).

#[derive(Serialize)]
struct EnvoyBody<'a> {
    #[serde(rename = "overallCode")]
    overall_code: &'static str,
    #[serde(skip_serializing_if = "EnvoyStatuses::is_empty")]
    statuses: EnvoyStatuses<'a>,
}

struct EnvoyStatuses<'a>(&'a [DescriptorStatus]);

impl EnvoyStatuses<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for EnvoyStatuses<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(EnvoyStatus::new))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct EnvoyStatus<'a> {
    code: &'static str,
    #[serde(rename = "currentLimit", skip_serializing_if = "Option::is_none")]
    current_limit: Option<EnvoyLimit<'a>>,
    #[serde(rename = "durationUntilReset", skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<ProtoDuration>,
    #[serde(rename = "limitRemaining", skip_serializing_if = "is_zero")]
    limit_remaining: u64,
}

#[derive(Serialize)]
struct EnvoyLimit<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(rename = "requestsPerUnit", skip_serializing_if = "is_zero")]
    requests_per_unit: u64,
    unit: &'static str,
}

impl<'a> EnvoyStatus<'a> {
    /// protojson: default values (0, empty name, no limit) are omitted; 32-bit fields saturate.
    fn new(s: &'a DescriptorStatus) -> Self {
        Self {
            code: s.code.as_str(),
            current_limit: s.limit.as_ref().map(|l| EnvoyLimit {
                name: l.name.as_deref().filter(|n| !n.is_empty()),
                requests_per_unit: l.requests_per_unit.min(u32::MAX as u64),
                unit: l.unit.as_proto_str(),
            }),
            duration_until_reset: s.reset_after.map(ProtoDuration),
            limit_remaining: s.remaining.min(u32::MAX as u64),
        }
    }
}

/// A protojson `google.protobuf.Duration`: `"54s"`, `"1.500s"`, `"0.000250s"`.
pub fn proto_duration(us: u64) -> String {
    ProtoDuration(us).to_string()
}

/// Microseconds written as a protojson duration (serialized without an intermediate `String`).
struct ProtoDuration(u64);

impl std::fmt::Display for ProtoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, frac) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if frac == 0 {
            write!(f, "{s}s")
        } else if frac % 1000 == 0 {
            write!(f, "{s}.{:03}s", frac / 1000)
        } else {
            write!(f, "{s}.{frac:06}s")
        }
    }
}

impl Serialize for ProtoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
