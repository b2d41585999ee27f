//! End-to-end tests of the Envoy RLS v3 gRPC service over real sockets: `serve::serve` runs
//! in-process on 127.0.0.1:0 with a temporary rules file, and a tonic client built from the
//! `tollgate-proto` protobufs calls `ShouldRateLimit` (and `grpc.health.v1.Health`), exactly as Envoy
//! would. The last tests check that gRPC, `/v1/check` and `/json` give the same decisions.
//! The server runs on the wall clock, so counted limits use the sliding log (exact, no window
//! boundary): a fixed window could roll over between two calls and make a test flaky.
//! Every test runs on both `--grpc-engine`s (`inline` and `plain`), which must answer alike.

use client::{send, Method};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_proto::pb::google::protobuf::UInt64Value;

/// The CLI's HTTP client, for the HTTP side of these tests.
#[allow(dead_code)]
#[path = "../../tollgate/src/client.rs"]
mod client;
use tollgate_server::grpc::{GrpcEngine, GrpcLimits};
use tollgate_server::serve::{serve, ServeConfig};
use tonic::transport::Channel;

const RULES: &str = r#"
domain: test
descriptors:
  - key: user
    rate_limit:
      name: per_user
      unit: minute
      requests_per_unit: 3
      algorithm: sliding_window_log
  - key: path
    value: /login
    descriptors:
      - key: ip
        rate_limit:
          unit: hour
          requests_per_unit: 2
          algorithm: sliding_window_log
  - key: client
    value: internal
    rate_limit:
      unlimited: true
  - key: tenant
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: plan
    rate_limit:
      name: plan_limit
      unit: day
      requests_per_unit: 0
  - key: vip
    rate_limit:
      name: vip_limit
      unit: day
      requests_per_unit: 1000
      replaces:
        - name: plan_limit
  - key: weekly
    rate_limit: { unit: week, requests_per_unit: 7 }
  - key: monthly
    rate_limit: { unit: month, requests_per_unit: 30 }
  - key: yearly
    rate_limit: { unit: year, requests_per_unit: 365 }
  - key: reader
    degrade: { below_remaining: 50% }
    rate_limit: { unit: hour, requests_per_unit: 4, algorithm: sliding_window_log }
  - key: abuser
    shadowban: true
    rate_limit: { unit: hour, requests_per_unit: 1, algorithm: sliding_window_log }
"#;

struct Server {
    http: SocketAddr,
    grpc: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    dir: PathBuf,
}

impl Server {
    async fn start(response_headers: bool, engine: GrpcEngine) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-grpc-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = dir.join("rules.yaml");
        std::fs::write(&rules, RULES).unwrap();
        let mut config = ServeConfig::default();
        config.listeners.http_addr = Some("127.0.0.1:0".parse().unwrap());
        config.listeners.grpc_addr = Some("127.0.0.1:0".parse().unwrap());
        config.rules.path = rules;
        config.response_headers = response_headers;
        config.grpc_limits = GrpcLimits {
            engine,
            ..GrpcLimits::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound_tx, bound_rx) = oneshot::channel();
        let task = tokio::spawn(serve(
            config,
            tollgate_server::envoy::EnvoyConfig::default(),
            async move {
                let _ = stopped.await;
            },
            move |b| {
                let _ = bound_tx.send(b);
            },
        ));
        let bound = tokio::time::timeout(Duration::from_secs(10), bound_rx)
            .await
            .expect("server bound in time")
            .expect("server started");
        Server {
            http: bound.http.expect("HTTP address reported"),
            grpc: bound.grpc.expect("gRPC address reported"),
            stop: Some(stop),
            task,
            dir,
        }
    }

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect gRPC")
    }

    fn base(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Graceful shutdown: both listeners stop and `serve` returns `Ok`.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = &mut self.task;
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("server stops in time")
            .expect("server task")
            .expect("serve returns Ok");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..desc(entries)
    }
}

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn call(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

async fn three_per_minute_then_over_limit(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    let mut got = Vec::new();
    for _ in 0..4 {
        let r = call(&mut c, req("test", vec![desc(&[("user", "alice")])])).await;
        assert_eq!(r.statuses.len(), 1);
        let st = &r.statuses[0];
        assert_eq!(st.code, r.overall_code, "one descriptor: same code");
        let limit = st.current_limit.as_ref().expect("current_limit");
        assert_eq!(limit.name, "per_user");
        assert_eq!(limit.requests_per_unit, 3);
        assert_eq!(limit.unit, Unit::Minute as i32);
        let reset = st.duration_until_reset.expect("duration_until_reset");
        let reset_us = reset.seconds * 1_000_000 + i64::from(reset.nanos) / 1_000;
        assert!(
            reset_us > 0 && reset_us <= 60_000_000,
            "a 3/minute sliding log frees up within a minute: {reset:?}"
        );
        assert!(reset.nanos >= 0 && reset.nanos < 1_000_000_000);
        assert!(r.response_headers_to_add.is_empty(), "off by default");
        got.push((r.overall_code, st.limit_remaining));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(got, vec![(ok, 2), (ok, 1), (ok, 0), (over, 0)]);
    s.stop().await;
}

async fn nested_unlimited_shadow_unmatched_and_units(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    let login = || desc(&[("path", "/login"), ("ip", "10.0.0.1")]);

    // Nested descriptor: 2 per hour per ip.
    let codes: Vec<(i32, u32)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let r = call(&mut c, req("test", vec![login()])).await;
            let st = &r.statuses[0];
            assert_eq!(st.current_limit.as_ref().unwrap().unit, Unit::Hour as i32);
            v.push((r.overall_code, st.limit_remaining));
        }
        v
    };
    assert_eq!(
        codes,
        vec![
            (Code::Ok as i32, 1),
            (Code::Ok as i32, 0),
            (Code::OverLimit as i32, 0)
        ]
    );

    // Unlimited: OK, no current_limit, limit_remaining u32::MAX (as envoyproxy/ratelimit).
    let r = call(&mut c, req("test", vec![desc(&[("client", "internal")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(r.statuses[0].duration_until_reset.is_none());

    // Shadow mode: over its 1/hour limit yet OK.
    for _ in 0..3 {
        let r = call(&mut c, req("test", vec![desc(&[("tenant", "t1")])])).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
        assert_eq!(r.statuses[0].limit_remaining, 0, "{r:?}");
    }

    // No matching rule / unknown domain: OK with no limit (as envoyproxy/ratelimit).
    for domain in ["test", "nope"] {
        let r = call(&mut c, req(domain, vec![desc(&[("path", "/login")])])).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses.len(), 1);
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[0].limit_remaining, 0);
    }

    // Week, month and year map to Envoy's WEEK=7, MONTH=5, YEAR=6; statuses in request order.
    let r = call(
        &mut c,
        req(
            "test",
            vec![
                desc(&[("yearly", "a")]),
                desc(&[("weekly", "a")]),
                desc(&[("monthly", "a")]),
            ],
        ),
    )
    .await;
    let units: Vec<(i32, u32)> = r
        .statuses
        .iter()
        .map(|s| {
            let l = s.current_limit.as_ref().unwrap();
            (l.unit, l.requests_per_unit)
        })
        .collect();
    assert_eq!(
        units,
        vec![
            (Unit::Year as i32, 365),
            (Unit::Week as i32, 7),
            (Unit::Month as i32, 30)
        ]
    );
    assert_eq!(remaining(&r), vec![364, 6, 29]);
    s.stop().await;
}

async fn replaces_removes_the_named_limit(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    // plan_limit alone (0 per day) denies.
    let r = call(&mut c, req("test", vec![desc(&[("plan", "free")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // With vip_limit (which replaces plan_limit) in the same request, plan_limit is not applied.
    let r = call(
        &mut c,
        req(
            "test",
            vec![desc(&[("plan", "free")]), desc(&[("vip", "yes")])],
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    let vip = r.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!(
        (vip.name.as_str(), vip.requests_per_unit, vip.unit),
        ("vip_limit", 1000, Unit::Day as i32)
    );
    assert_eq!(r.statuses[1].limit_remaining, 999);
    s.stop().await;
}

async fn hits_addend_request_and_per_descriptor(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    let bob = |h: Option<u64>| match h {
        Some(h) => desc_hits(&[("user", "bob")], h),
        None => desc(&[("user", "bob")]),
    };
    // Per-descriptor 2: costs 2.
    let r = call(&mut c, req("test", vec![bob(Some(2))])).await;
    assert_eq!((r.overall_code, remaining(&r)), (Code::Ok as i32, vec![1]));
    // Per-descriptor explicit 0: a pure query, nothing consumed.
    for _ in 0..2 {
        let r = call(&mut c, req("test", vec![bob(Some(0))])).await;
        assert_eq!((r.overall_code, remaining(&r)), (Code::Ok as i32, vec![1]));
    }
    // Request hits_addend 0 (proto3 default) means 1.
    let r = call(&mut c, req("test", vec![bob(None)])).await;
    assert_eq!((r.overall_code, remaining(&r)), (Code::Ok as i32, vec![0]));
    let r = call(&mut c, req("test", vec![bob(None)])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);

    // Request hits_addend 2 applies to descriptors without their own; theirs wins.
    let r = call(
        &mut c,
        RateLimitRequest {
            hits_addend: 2,
            ..req(
                "test",
                vec![
                    desc(&[("user", "carol")]),
                    desc_hits(&[("user", "dave")], 1),
                ],
            )
        },
    )
    .await;
    assert_eq!(
        (r.overall_code, remaining(&r)),
        (Code::Ok as i32, vec![1, 2])
    );
    // Cost 2 against 1 remaining: over limit, and (all-or-nothing) dave consumed nothing.
    let r = call(
        &mut c,
        RateLimitRequest {
            hits_addend: 2,
            ..req(
                "test",
                vec![
                    desc(&[("user", "carol")]),
                    desc_hits(&[("user", "dave")], 1),
                ],
            )
        },
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    let r = call(&mut c, req("test", vec![desc_hits(&[("user", "dave")], 0)])).await;
    assert_eq!(remaining(&r), vec![2]);
    s.stop().await;
}

async fn limit_override_replaces_the_rule(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    let over = |n: u32, unit: i32| RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: n,
            unit,
        }),
        ..desc(&[("user", "olga")])
    };
    // The rule says 3/minute; the override 5/hour governs, and is reported as the limit.
    let mut seen = vec![];
    for _ in 0..6 {
        let r = call(&mut c, req("test", vec![over(5, Unit::Hour as i32)])).await;
        let l = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (5, Unit::Hour as i32));
        seen.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    assert_eq!(seen[4], (Code::Ok as i32, 0));
    assert_eq!(seen[5].0, Code::OverLimit as i32);
    // The configured counter is untouched.
    let r = call(&mut c, req("test", vec![desc(&[("user", "olga")])])).await;
    assert_eq!(remaining(&r), vec![2]);
    // UNKNOWN unit: INVALID_ARGUMENT naming the field.
    let e = c
        .should_rate_limit(req("test", vec![over(5, Unit::Unknown as i32)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("descriptors[0].limit.unit"),
        "{}",
        e.message()
    );
    s.stop().await;
}

async fn invalid_requests_are_invalid_argument(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    let too_many: Vec<_> = (0..65)
        .map(|i| desc(&[("user", &format!("u{i}"))]))
        .collect();
    let cases = [
        (
            req("", vec![desc(&[("user", "a")])]),
            "invalid_domain",
            "domain",
        ),
        (req("test", vec![]), "no_descriptors", "descriptors"),
        (req("test", too_many), "too_many_descriptors", "maximum 64"),
        (
            req("test", vec![desc(&[])]),
            "invalid_descriptor",
            "no entries",
        ),
        (
            req("test", vec![desc(&[("", "x")])]),
            "invalid_entry",
            "key",
        ),
        (
            req("test", vec![desc(&[("user", &"v".repeat(2000))])]),
            "value_too_long",
            "maximum 1024",
        ),
        (
            req(
                "test",
                vec![desc_hits(&[("user", "a")], u64::from(u32::MAX) + 1)],
            ),
            "invalid_hits",
            "hits_addend",
        ),
    ];
    for (r, code, text) in cases {
        let e = c.should_rate_limit(r).await.expect_err("must be rejected");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(text), "{code}: {}", e.message());
        assert_eq!(
            e.metadata()
                .get(tollgate_server::grpc::ERROR_CODE_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some(code)
        );
    }
    // Larger than --max-body-bytes (64 KiB): refused by tonic before decoding (OUT_OF_RANGE).
    let huge = "x".repeat(70 * 1024);
    let e = c
        .should_rate_limit(req("test", vec![desc(&[("user", &huge)])]))
        .await
        .expect_err("too large");
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    // The connection and the service survive bad requests.
    let r = call(&mut c, req("test", vec![desc(&[("user", "after")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    s.stop().await;
}

async fn response_headers_only_with_the_flag(engine: GrpcEngine) {
    let s = Server::start(true, engine).await;
    let mut c = s.client().await;
    let headers = |r: &RateLimitResponse| -> Vec<(String, String)> {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    let r = call(&mut c, req("test", vec![desc(&[("user", "hdr")])])).await;
    let h = headers(&r);
    let get =
        |h: &[(String, String)], k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get(&h, "x-ratelimit-limit").as_deref(), Some("3"));
    assert_eq!(get(&h, "x-ratelimit-remaining").as_deref(), Some("2"));
    assert_eq!(get(&h, "ratelimit-policy").as_deref(), Some("3;w=60"));
    let reset: u64 = get(&h, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=60).contains(&reset));
    assert_eq!(get(&h, "retry-after"), None);

    // The same values HTTP puts in its headers (next call: remaining 1).
    let http = send(
        &s.base(),
        Method::POST,
        "/v1/check",
        Some(
            json!({"domain":"test","descriptors":[{"entries":[{"key":"user","value":"hdr"}]}]})
                .to_string(),
        ),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(http.header("x-ratelimit-remaining"), Some("1"));
    let r = call(&mut c, req("test", vec![desc(&[("user", "hdr")])])).await;
    let h = headers(&r);
    let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
    let http_names: Vec<&str> = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ]
    .to_vec();
    assert_eq!(names, http_names);
    assert_eq!(get(&h, "x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(http.header("x-ratelimit-limit"), Some("3"));
    // Over limit: Retry-After too.
    let r = call(&mut c, req("test", vec![desc(&[("user", "hdr")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // Sliding log: the same request passes once the first of the three ages out, i.e. 60 s
    // after it, less the time these calls took (seconds, rounded up).
    let retry: u64 = get(&headers(&r), "retry-after").unwrap().parse().unwrap();
    assert!((55..=60).contains(&retry), "retry-after {retry}");
    // No limit applied: no headers.
    let r = call(&mut c, req("test", vec![desc(&[("client", "internal")])])).await;
    assert!(r.response_headers_to_add.is_empty());
    s.stop().await;

    // Without the flag: never.
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    for _ in 0..4 {
        let r = call(&mut c, req("test", vec![desc(&[("user", "hdr")])])).await;
        assert!(r.response_headers_to_add.is_empty());
    }
    s.stop().await;
}

async fn health_serving(engine: GrpcEngine) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let s = Server::start(false, engine).await;
    let channel = Channel::from_shared(format!("http://{}", s.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(channel);
    for service in ["", tollgate_server::grpc::RLS_SERVICE_NAME] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let e = h
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    s.stop().await;
}

/// One decision as each transport reports it: (overall OK?, per status: OK?, remaining,
/// requests_per_unit, unit name).
type Decision = (bool, Vec<(bool, u64, Option<(u64, String)>)>);

fn from_grpc(r: &RateLimitResponse) -> Decision {
    (
        r.overall_code == Code::Ok as i32,
        r.statuses
            .iter()
            .map(|s| {
                (
                    s.code == Code::Ok as i32,
                    u64::from(s.limit_remaining),
                    s.current_limit.as_ref().map(|l| {
                        (
                            u64::from(l.requests_per_unit),
                            Unit::try_from(l.unit).unwrap().as_str_name().to_string(),
                        )
                    }),
                )
            })
            .collect(),
    )
}

fn from_v1(status: u16, body: &Value) -> Decision {
    let ok = body["overall_code"] == "OK";
    assert_eq!(status == 200, ok, "{body}");
    (
        ok,
        body["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["code"] == "OK",
                    s["limit_remaining"].as_u64().unwrap(),
                    s["current_limit"].as_object().map(|l| {
                        (
                            l["requests_per_unit"].as_u64().unwrap(),
                            l["unit"].as_str().unwrap().to_string(),
                        )
                    }),
                )
            })
            .collect(),
    )
}

fn from_json(status: u16, body: &Value) -> Decision {
    let ok = body["overallCode"] == "OK";
    assert_eq!(status == 200, ok, "{body}");
    (
        ok,
        body["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["code"] == "OK",
                    // protojson omits zero values.
                    s.get("limitRemaining").map_or(0, |v| v.as_u64().unwrap()),
                    s["currentLimit"].as_object().map(|l| {
                        (
                            l.get("requestsPerUnit").map_or(0, |v| v.as_u64().unwrap()),
                            l["unit"].as_str().unwrap().to_string(),
                        )
                    }),
                )
            })
            .collect(),
    )
}

async fn post(s: &Server, path: &str, body: &Value) -> (u16, Value) {
    let r = send(
        &s.base(),
        Method::POST,
        path,
        Some(body.to_string()),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    (r.status, serde_json::from_str(&r.body).unwrap())
}

fn descriptors(key: &str) -> Vec<Vec<(&'static str, String)>> {
    vec![
        vec![("user", key.to_string())],
        vec![("path", "/login".into()), ("ip", key.to_string())],
        vec![("client", "internal".into())],
        vec![("nothing", "matches".into())],
    ]
}

#[derive(Clone, Copy)]
enum Via {
    V1,
    Json,
    Grpc,
}

async fn one(s: &Server, c: &mut RateLimitServiceClient<Channel>, via: Via, key: &str) -> Decision {
    let ds = descriptors(key);
    let entries = |d: &Vec<(&str, String)>| {
        d.iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect::<Vec<_>>()
    };
    let body = json!({
        "domain": "test",
        "descriptors": ds.iter().map(|d| json!({"entries": entries(d)})).collect::<Vec<_>>(),
    });
    match via {
        Via::V1 => {
            let (st, b) = post(s, "/v1/check", &body).await;
            from_v1(st, &b)
        }
        Via::Json => {
            let (st, b) = post(s, "/json", &body).await;
            from_json(st, &b)
        }
        Via::Grpc => {
            let grpc_req = req(
                "test",
                ds.iter()
                    .map(|d| desc(&d.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>()))
                    .collect(),
            );
            from_grpc(&call(c, grpc_req).await)
        }
    }
}

async fn same_decision_on_every_transport(engine: GrpcEngine) {
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;

    // Three fresh keys, one per transport: the same first decision.
    let v1 = one(&s, &mut c, Via::V1, "fresh-a").await;
    let pj = one(&s, &mut c, Via::Json, "fresh-b").await;
    let g = one(&s, &mut c, Via::Grpc, "fresh-c").await;
    let expected: Decision = (
        true,
        vec![
            (true, 2, Some((3, "MINUTE".into()))),
            (true, 1, Some((2, "HOUR".into()))),
            (true, u32::MAX as u64, None),
            (true, 0, None),
        ],
    );
    assert_eq!(v1, expected, "/v1/check");
    assert_eq!(pj, expected, "/json");
    assert_eq!(g, expected, "gRPC");

    // One key, sequential calls alternating transports: one shared counter, consistent counts.
    let v1 = one(&s, &mut c, Via::V1, "shared").await;
    assert_eq!(v1, expected);
    let pj = one(&s, &mut c, Via::Json, "shared").await;
    assert_eq!(
        (pj.0, &pj.1[0], &pj.1[1]),
        (
            true,
            &(true, 1, Some((3, "MINUTE".into()))),
            &(true, 0, Some((2, "HOUR".into())))
        )
    );
    // Third call: the login limit (2/hour) is exhausted, so the request is OVER_LIMIT and,
    // all-or-nothing, the user counter is not consumed.
    let g = one(&s, &mut c, Via::Grpc, "shared").await;
    assert!(!g.0);
    assert_eq!(g.1[1], (false, 0, Some((2, "HOUR".into()))));
    assert!(g.1[0].0, "user limit itself is not exceeded");
    // And every transport now reports exactly that decision.
    assert_eq!(one(&s, &mut c, Via::V1, "shared").await, g, "/v1/check");
    assert_eq!(one(&s, &mut c, Via::Json, "shared").await, g, "/json");
    assert_eq!(one(&s, &mut c, Via::Grpc, "shared").await, g, "gRPC");
    s.stop().await;
}

async fn shutdown_with_an_open_health_watch(engine: GrpcEngine) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let s = Server::start(false, engine).await;
    let channel = Channel::from_shared(format!("http://{}", s.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(channel);
    let mut stream = h
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    // Graceful shutdown does not wait forever for the never-ending Watch call...
    s.stop().await;
    // ...which saw NOT_SERVING before it ended.
    let last = stream.message().await.unwrap().unwrap();
    assert_eq!(last.status, ServingStatus::NotServing as i32);
    assert!(matches!(stream.message().await, Ok(None) | Err(_)));
}

/// The degrade signal and the shadowban mark travel in `dynamic_metadata` (no metadata is
/// configured otherwise), on the same decisions `/v1/check` reports; `/metrics` counts the
/// shadowbanned hits of the rule.
async fn degrade_and_shadowban_in_dynamic_metadata(engine: GrpcEngine) {
    use tollgate_proto::pb::google::protobuf::value::Kind;
    let s = Server::start(false, engine).await;
    let mut c = s.client().await;
    let field = |r: &RateLimitResponse, name: &str| {
        r.dynamic_metadata
            .as_ref()
            .and_then(|m| m.fields.get(name))
            .and_then(|v| v.kind.clone())
    };
    // 4 per hour, degrade below 50%: remaining 3 and 2 are not below 2, 1 and 0 are.
    let mut degraded = Vec::new();
    for _ in 0..5 {
        let r = call(&mut c, req("test", vec![desc(&[("reader", "r1")])])).await;
        degraded.push((r.overall_code, field(&r, "tollgate_degrade")));
    }
    let on = Some(Kind::StringValue("test|reader".into()));
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        degraded,
        [
            (ok, None),
            (ok, None),
            (ok, on.clone()),
            (ok, on),
            (over, None)
        ]
    );
    // The same decision on `/v1/check`: the field and the header.
    let body =
        json!({"domain": "test", "descriptors": [{"entries": [{"key": "reader", "value": "r2"}]}]});
    for want in [None, None, Some("test|reader"), Some("test|reader")] {
        let (status, v) = post(&s, "/v1/check", &body).await;
        assert_eq!(status, 200);
        assert_eq!(v.get("degrade").and_then(Value::as_str), want, "{v}");
    }
    // Shadowban: the first is allowed, the next ones are marked; an honest denial is not.
    let first = call(&mut c, req("test", vec![desc(&[("abuser", "a1")])])).await;
    assert_eq!(
        (first.overall_code, first.dynamic_metadata.is_none()),
        (ok, true)
    );
    for _ in 0..2 {
        let r = call(&mut c, req("test", vec![desc(&[("abuser", "a1")])])).await;
        assert_eq!(r.overall_code, over);
        assert_eq!(
            field(&r, "tollgate_shadowbanned"),
            Some(Kind::BoolValue(true))
        );
    }
    let both = req(
        "test",
        vec![desc(&[("abuser", "a1")]), desc(&[("plan", "free")])],
    );
    let r = call(&mut c, both).await;
    assert_eq!(
        (r.overall_code, field(&r, "tollgate_shadowbanned")),
        (over, None)
    );
    let (status, v) = post(&s, "/v1/check", &json!({"domain": "test", "descriptors": [{"entries": [{"key": "abuser", "value": "a1"}]}]})).await;
    assert_eq!((status, &v["shadowbanned"]), (429, &json!(true)), "{v}");
    let metrics = send(
        &s.base(),
        Method::GET,
        "/metrics",
        None,
        Duration::from_secs(5),
    )
    .await
    .expect("metrics");
    assert!(
        metrics
            .body
            .contains("tollgate_shadowbanned{domain=\"test\",rule=\"test.abuser\"} 3"),
        "{}",
        metrics.body
    );
    s.stop().await;
}

// Each test on both engines: `NAME::inline` and `NAME::plain`.
tollgate_testsupport::test_each!([inline = GrpcEngine::Inline, plain = GrpcEngine::Plain];
    three_per_minute_then_over_limit,
    nested_unlimited_shadow_unmatched_and_units,
    replaces_removes_the_named_limit,
    hits_addend_request_and_per_descriptor,
    limit_override_replaces_the_rule,
    invalid_requests_are_invalid_argument,
    response_headers_only_with_the_flag,
    health_serving,
    same_decision_on_every_transport,
    shutdown_with_an_open_health_watch,
    degrade_and_shadowban_in_dynamic_metadata,
);
