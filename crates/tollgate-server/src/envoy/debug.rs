//! envoyproxy/ratelimit's debug port (`DEBUG_HOST`:`DEBUG_PORT`, default `0.0.0.0:6070`) under
//! `--profile envoy`: `/rlconfig` dumps the loaded rules in envoy's text format, `/stats` prints
//! the envoy-named counters, `/` lists both.
//!
//! Scripts and runbooks that read envoy's debug port keep working. Go's profiler endpoints
//! (`/debug/pprof/*`) and the Go runtime's `expvar` variables have no counterpart here, so
//! `/stats` prints what envoy's statistics would carry (one `name: value` line each, the shape
//! of envoy's `/stats`) instead of Go's `cmdline` and `memstats`. The port is served by the same
//! hardened accept loop as the HTTP API (`crate::listener`): connection cap, header, body and
//! idle timeouts, bounded shutdown.

use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::fmt::Write;
use tollgate_core::rules::RuleSet;

/// The endpoints and their help text, as envoy's index lists them (sorted by path).
const ENDPOINTS: [(&str, &str); 2] = [
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out stats"),
];

/// The debug port's routes over `state`.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .route("/stats", get(stats))
        .fallback(|| async { (StatusCode::NOT_FOUND, text("404 page not found\n".into())) })
        .with_state(state)
}

fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn index() -> Response {
    let mut out = String::new();
    for (path, help) in ENDPOINTS {
        let _ = writeln!(out, "{path}: {help}");
    }
    text(out)
}

async fn rlconfig(State(state): State<AppState>) -> Response {
    text(dump(&state.rules().set))
}

async fn stats(State(state): State<AppState>) -> Response {
    let mut counters = crate::envoy::stats::envoy_counters(state.metrics());
    counters.sort();
    let mut out = String::new();
    for (name, value) in counters {
        let _ = writeln!(out, "{name}: {value}");
    }
    text(out)
}

/// The rules as envoyproxy/ratelimit's `/rlconfig` prints its configuration: one line per rate
/// limit, `<stats key>: unit=<UNIT> requests_per_unit=<N>, shadow_mode: <bool>, quota_mode:
/// <bool>` (an `unlimited` rule has unit `UNKNOWN` and 0 requests, as its unset fields print
/// there), in the order of the rule files (envoy's follows Go's random map order).
pub(crate) fn dump(set: &RuleSet) -> String {
    let mut out = String::new();
    for limit in set.limits() {
        let (unit, requests) = limit.quota.map_or(("UNKNOWN", 0), |q| {
            (q.period().unit.as_proto_str(), q.limit())
        });
        let _ = writeln!(
            out,
            "{}: unit={unit} requests_per_unit={requests}, shadow_mode: {}, quota_mode: {}",
            limit.stats.base(),
            limit.shadow_mode,
            limit.quota_mode
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_is_envoys_rlconfig_text() {
        // envoyproxy/ratelimit's xDS provider test expects, for one 3/minute limit on k1=v1:
        // "foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n".
        let yaml = "domain: foo
descriptors:
  - key: k1
    value: v1
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: k2
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: k3
        rate_limit: {unlimited: true}
";
        let set = RuleSet::from_sources(&[("foo.yaml".into(), yaml.into())]).unwrap();
        assert_eq!(
            dump(&set),
            "foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n\
             foo.k2: unit=HOUR requests_per_unit=10, shadow_mode: true, quota_mode: true\n\
             foo.k2.k3: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n"
        );
    }
}
