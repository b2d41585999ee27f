//! envoyproxy/ratelimit compatibility that holds in every mode, from outside: `tollgate serve`
//! as a real process with envoyproxy/ratelimit's own rule files (copied unchanged into
//! `tollgate-core`'s fixtures), called over real sockets on gRPC (as Envoy calls it), `/json`
//! and `/v1/check`: a status over its limit reports `limit_remaining` 0, `metadata` and
//! `quota_mode` load and mean what they mean there, metric labels are envoy's stats keys, and
//! `share_threshold` without a wildcard is rejected naming file and line.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use support::client::Method;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;

mod support;

use support::*;

fn fixture(rel: &str) -> PathBuf {
    repo()
        .join("crates/tollgate-core/tests/fixtures/envoy-ratelimit")
        .join(rel)
}

/// Quota-mode limits with metadata, on the sliding log (exact on the wall clock).
const QUOTA: &str = "domain: quota-domain
descriptors:
  - key: regular
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: quota
    quota_mode: true
    metadata:
      service_with_quota:
        name: service_q
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}
";

fn rules_dir() -> PathBuf {
    let dir = temp_dir("envoy-compat");
    for f in [
        "config/basic_config.yaml",
        "config/metadata.yaml",
        "readme/example10.yaml",
        "readme/example11_metrics.yaml",
    ] {
        let name = f.replace('/', "_");
        // metadata.yaml shares basic_config's domain: give it its own (the content is envoy's).
        let text = std::fs::read_to_string(fixture(f)).expect("fixture");
        let text = if f == "config/metadata.yaml" {
            text.replace("domain: test-domain", "domain: metadata-domain")
        } else {
            text
        };
        std::fs::write(dir.join(name), text).expect("write rules");
    }
    std::fs::write(dir.join("quota.yaml"), QUOTA).expect("write rules");
    dir
}

fn start(dir: &Path) -> Server {
    let rules = dir.display().to_string();
    serve_rules(&rules, &[], "envoy-compat")
}

fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = http(base, Method::POST, path, Some(body));
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u64) -> Value {
    json!({
        "domain": domain,
        "hits_addend": hits,
        "descriptors": descriptors.iter().map(|d| json!({
            "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()
        })).collect::<Vec<_>>()
    })
}

/// `ShouldRateLimit` over gRPC: (overall code, per status (code, limit_remaining)).
fn grpc(
    addr: &str,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits: u32,
) -> (i32, Vec<(i32, u32)>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("gRPC connect");
        let req = RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .iter()
                        .map(|(k, v)| Entry {
                            key: (*k).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: hits,
        };
        let r = client
            .should_rate_limit(req)
            .await
            .expect("ShouldRateLimit")
            .into_inner();
        (
            r.overall_code,
            r.statuses
                .iter()
                .map(|s| (s.code, s.limit_remaining))
                .collect(),
        )
    })
}

#[test]
fn envoy_rule_files_served_with_envoy_meaning_on_grpc_json_and_v1_check() {
    let dir = rules_dir();
    let server = start(&dir);
    let grpc_addr = server.addr("gRPC ");
    let over = Code::OverLimit as i32;

    // basic_config.yaml's key2 is 20/minute: hits 21 on a fresh counter is over, remaining 0.
    let (code, statuses) = grpc(&grpc_addr, "test-domain", &[&[("key2", "grpc")]], 21);
    assert_eq!((code, statuses.clone()), (over, vec![(over, 0)]), "gRPC");
    let (status, b) = post(
        &server.base,
        "/json",
        request("test-domain", &[&[("key2", "json")]], 21),
    );
    assert_eq!(status, 429, "{b}");
    assert_eq!(b["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(
        b["statuses"][0]
            .get("limitRemaining")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        0,
        "{b}"
    );
    let (status, b) = post(
        &server.base,
        "/v1/check",
        request("test-domain", &[&[("key2", "native")]], 21),
    );
    assert_eq!(status, 429, "{b}");
    assert_eq!(b["statuses"][0]["limit_remaining"], 0, "{b}");

    // metadata.yaml loads (envoy's file, unknown field before) and limits as envoy's does.
    let (status, b) = post(
        &server.base,
        "/v1/check",
        request("metadata-domain", &[&[("key2", "x")]], 1),
    );
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["statuses"][0]["current_limit"]["requests_per_unit"], 20);

    // quota_mode: one quota limit over and one under: OK overall, the over one OVER_LIMIT.
    let (code, _) = grpc(&grpc_addr, "quota-domain", &[&[("quota", "a")]], 1);
    assert_eq!(code, Code::Ok as i32);
    let (code, statuses) = grpc(
        &grpc_addr,
        "quota-domain",
        &[&[("quota", "a")], &[("quota2", "b")]],
        1,
    );
    assert_eq!(code, Code::Ok as i32, "{statuses:?}");
    assert_eq!(statuses, vec![(over, 0), (Code::Ok as i32, 4)]);
    // ...and when it is the only quota limit, it denies although the regular one passes.
    let (code, statuses) = grpc(
        &grpc_addr,
        "quota-domain",
        &[&[("regular", "r")], &[("quota", "a")]],
        1,
    );
    assert_eq!(code, over, "{statuses:?}");
    assert_eq!(statuses[1], (over, 0));

    // Metric labels are envoy's stats keys: value_to_metric on parent levels, share_threshold
    // hiding the value although value_to_metric is set.
    for (domain, entries) in [
        (
            "example10",
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "1"),
            ][..],
        ),
        (
            "example11_metrics",
            &[("route", "api/v1"), ("method", "GET")][..],
        ),
    ] {
        let (status, b) = post(&server.base, "/v1/check", request(domain, &[entries], 1));
        assert_eq!(status, 200, "{b}");
    }
    let metrics = http(&server.base, Method::GET, "/metrics", None).body;
    for line in [
        "tollgate_total_hits{domain=\"example10\",rule=\"example10.route_draw.http_method_GET.subject_id\"} 1",
        "tollgate_total_hits{domain=\"example11_metrics\",rule=\"example11_metrics.route_api/*.method\"} 1",
        "tollgate_over_limit{domain=\"test-domain\",rule=\"test-domain.key2\"} 63",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn share_threshold_without_wildcard_is_rejected_naming_file_and_line() {
    let dir = temp_dir("envoy-share");
    let file = dir.join("share.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: files\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    let out = tollgate(&["validate", &file.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}{stderr}");
    let text = format!("{stdout}{stderr}");
    assert!(
        text.contains(&format!(
            "{}:5:22: `share_threshold` can only be used with wildcard values",
            file.display()
        )),
        "{text}"
    );
    // envoy's own share_threshold fixture is valid.
    let out = tollgate(&[
        "validate",
        &fixture("config/share_threshold.yaml").display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
