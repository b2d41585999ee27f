//! OpenTelemetry traces of `tollgate serve`, from outside: the real binary sends its spans to a
//! real OTLP receiver (tests/otlp_receiver.py, on the OpenTelemetry project's `opentelemetry-proto`
//! messages and `grpcio`, in the venv scripts/test.sh makes in target/otlp-receiver/), over gRPC
//! and over http/protobuf. The spans join the caller's trace (a test client's `traceparent`, and
//! a real Envoy's with its own tracing on), say what decided, keep descriptor values out unless
//! asked, carry the Redis call as a child; sampling 0 records nothing the caller did not ask for;
//! and a collector that is down or never answers costs the decisions nothing (drops counted).

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_testsupport::RedisServer;

const RULES: &str = "\
domain: traced
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: bulk
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
";

const RLS_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The receiver's python: `TOLLGATE_TEST_OTLP_PYTHON`, else the venv scripts/test.sh makes.
fn receiver_python() -> PathBuf {
    let path = std::env::var_os("TOLLGATE_TEST_OTLP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/otlp-receiver/bin/python"));
    assert!(
        path.exists(),
        "no OTLP receiver python at {}: run scripts/test.sh (it installs opentelemetry-proto and \
         grpcio from PyPI into target/otlp-receiver/), or set TOLLGATE_TEST_OTLP_PYTHON",
        path.display()
    );
    path
}

/// The OTLP receiver, and every span it has received so far.
struct Receiver {
    child: Child,
    grpc: u16,
    http: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let mut child = Command::new(receiver_python())
            .arg(repo().join("crates/tollgate/tests/otlp_receiver.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines
            .next()
            .expect("the receiver's first line")
            .expect("read the receiver");
        let port = |name: &str| -> u16 {
            first
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{first:?}"))
        };
        let (grpc, http) = (port("grpc="), port("http="));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&spans);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let span: Value = serde_json::from_str(&line).expect("a JSON span");
                seen.lock().unwrap().push(span);
            }
        });
        Receiver {
            child,
            grpc,
            http,
            spans,
        }
    }

    fn spans(&self) -> Vec<Value> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans once `ok` says they are all there (within a generous bound).
    fn wait(&self, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.spans();
            if ok(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < until,
                "timed out waiting for {what}; received:\n{spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rules(name: &str) -> String {
    let dir = temp_dir(name);
    let path = dir.join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    path.display().to_string()
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "traced".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// `ShouldRateLimit` calls on one connection, each with its `traceparent` (if any): the codes.
fn calls(grpc: &str, calls: &[(&str, Option<&str>)]) -> Vec<i32> {
    block(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("gRPC connect");
        let mut codes = Vec::new();
        for (user, traceparent) in calls {
            let mut req = tonic::Request::new(request("user", user));
            if let Some(tp) = traceparent {
                req.metadata_mut()
                    .insert("traceparent", tp.parse().unwrap());
            }
            let resp = client
                .should_rate_limit(req)
                .await
                .expect("ShouldRateLimit");
            codes.push(resp.into_inner().overall_code);
        }
        codes
    })
}

fn attr<'a>(span: &'a Value, name: &str) -> &'a Value {
    &span["attributes"][name]
}

fn of_trace<'a>(spans: &'a [Value], trace: &str, name: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["trace_id"] == trace && s["name"] == name)
        .collect()
}

/// A counter of tollgate's `/metrics`.
fn metric(base: &str, name: &str) -> u64 {
    let body = http(base, client::Method::GET, "/metrics", None).body;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
}

#[test]
fn grpc_spans_join_the_callers_trace_with_the_redis_call_as_a_child() {
    let receiver = Receiver::start();
    let redis = RedisServer::start(&[]);
    let endpoint = format!("http://127.0.0.1:{}", receiver.grpc);
    let rules = rules("tracing-grpc");
    let server = serve_rules(
        &rules,
        &[
            "--store",
            &redis.url(),
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
        ],
        "tracing-grpc",
    );
    let grpc = server.addr("gRPC ");
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let tp = format!("00-{trace}-{parent}-01");
    let codes = calls(&grpc, &[("alice-secret", Some(tp.as_str())); 3]);
    assert_eq!(codes, [1, 1, 2], "OK, OK, OVER_LIMIT");
    let spans = receiver.wait("3 decisions and 3 store calls", |s| {
        of_trace(s, trace, RLS_SPAN).len() == 3 && of_trace(s, trace, "store.check").len() == 3
    });
    let decisions = of_trace(&spans, trace, RLS_SPAN);
    let mut outcomes: Vec<&str> = Vec::new();
    for d in &decisions {
        assert_eq!(d["via"], "grpc");
        assert_eq!(
            d["parent_span_id"], parent,
            "the caller's span is the parent: {d}"
        );
        assert_eq!(d["kind"], 2, "a server span: {d}");
        assert_eq!(attr(d, "tollgate.domain"), "traced");
        assert_eq!(attr(d, "tollgate.rule"), "traced|user");
        assert_eq!(d["resource"]["service.name"], "tollgate");
        outcomes.push(attr(d, "tollgate.outcome").as_str().unwrap());
        let store: Vec<&Value> = of_trace(&spans, trace, "store.check")
            .into_iter()
            .filter(|s| s["parent_span_id"] == d["span_id"])
            .collect();
        assert_eq!(store.len(), 1, "one store call under {d}");
        assert_eq!(attr(store[0], "db.system.name"), "redis");
        assert_eq!(attr(store[0], "tollgate.store"), "redis");
        assert_eq!(store[0]["kind"], 3, "a client span");
        let (start, end) = (d["start"].as_u64().unwrap(), d["end"].as_u64().unwrap());
        let (s_start, s_end) = (
            store[0]["start"].as_u64().unwrap(),
            store[0]["end"].as_u64().unwrap(),
        );
        assert!(
            start <= s_start && s_end <= end,
            "the store call within the decision"
        );
    }
    outcomes.sort();
    assert_eq!(outcomes, ["OK", "OK", "OVER_LIMIT"]);
    // Descriptor values name clients: not in any span unless the operator asks.
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains("alice-secret"), "{all}");
    assert_eq!(
        metric(&server.base, "tollgate_trace_spans_dropped_total"),
        0
    );
}

/// `POST` on tollgate's HTTP listener with extra headers: the status and body.
fn post(base: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out)
}

#[test]
fn http_checks_over_http_protobuf_with_descriptor_values_only_when_asked() {
    let receiver = Receiver::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    let rules = rules("tracing-http");
    let server = serve_rules_env(
        &rules,
        &["--otlp-endpoint", &endpoint, "--trace-descriptor-values"],
        &[("TOLLGATE_TRACE_SERVICE_NAME", "edge-limits")],
        "tracing-http",
    );
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{trace}-b7ad6b7169203331-01");
    let body = r#"{"domain":"traced","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let (status, _) = post(
        &server.base,
        "/v1/check",
        body,
        &[("traceparent", &tp), ("tracestate", "vendor=1")],
    );
    assert_eq!(status, 200);
    let spans = receiver.wait("the HTTP check's span", |s| {
        of_trace(s, trace, "POST /v1/check").len() == 1
    });
    let d = of_trace(&spans, trace, "POST /v1/check")[0];
    assert_eq!(d["via"], "http", "sent over http/protobuf");
    assert_eq!(d["parent_span_id"], "b7ad6b7169203331");
    assert_eq!(d["resource"]["service.name"], "edge-limits");
    assert_eq!(attr(d, "tollgate.outcome"), "OK");
    assert_eq!(
        attr(d, "tollgate.descriptor_values"),
        &serde_json::json!(["user=bob"])
    );
    // An unknown domain decides OK with no rule: no `tollgate.rule`.
    let trace2 = "11111111111111111111111111111111";
    let tp2 = format!("00-{trace2}-2222222222222222-01");
    let body = r#"{"domain":"nowhere","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    post(&server.base, "/v1/check", body, &[("traceparent", &tp2)]);
    let spans = receiver.wait("the second check", |s| {
        of_trace(s, trace2, "POST /v1/check").len() == 1
    });
    let d = of_trace(&spans, trace2, "POST /v1/check")[0];
    assert_eq!(attr(d, "tollgate.domain"), "nowhere");
    assert!(attr(d, "tollgate.rule").is_null(), "{d}");
}

#[test]
fn sampling_zero_records_only_what_the_caller_sampled() {
    let receiver = Receiver::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.grpc);
    let rules = rules("tracing-zero");
    let server = serve_rules(
        &rules,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
            "--trace-sampling",
            "0",
        ],
        "tracing-zero",
    );
    let grpc = server.addr("gRPC ");
    let unsampled = "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-00";
    let sampled_trace = "cccccccccccccccccccccccccccccccc";
    let sampled = format!("00-{sampled_trace}-dddddddddddddddd-01");
    let mut batch: Vec<(&str, Option<&str>)> = vec![("u1", None); 5];
    batch.extend([("u2", Some(unsampled)); 5]);
    // Last, one the caller sampled: spans leave in order, so once it has arrived every span
    // made before it has too.
    batch.push(("u3", Some(sampled.as_str())));
    calls(&grpc, &batch);
    let spans = receiver.wait("the sampled call", |s| {
        of_trace(s, sampled_trace, RLS_SPAN).len() == 1
            && of_trace(s, sampled_trace, "store.check").len() == 1
    });
    assert_eq!(spans.len(), 2, "only the sampled call's spans: {spans:#?}");
}

#[test]
fn a_dead_collector_costs_decisions_nothing_and_its_losses_are_counted() {
    // A collector that accepts connections and never answers: exports wait out their timeout
    // while decisions go on, and the queue overflows.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let rules = rules("tracing-silent");
    let server = serve_rules(&rules, &["--otlp-endpoint", &endpoint], "tracing-silent");
    let grpc = server.addr("gRPC ");
    let n = 3000;
    let codes = block(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        let mut codes = Vec::new();
        for i in 0..n {
            let resp = client
                .should_rate_limit(request("bulk", &format!("b{i}")))
                .await
                .expect("every decision answered");
            codes.push(resp.into_inner().overall_code);
        }
        codes
    });
    assert!(codes.iter().all(|&c| c == 1), "every decision OK");
    // Two spans a decision (the decision, the store call): what the queue could not hold is
    // counted as dropped at once.
    let dropped = metric(&server.base, "tollgate_trace_spans_dropped_total");
    assert!(dropped > 0, "a full queue drops and counts: {dropped}");
    assert_eq!(
        metric(&server.base, "tollgate_trace_spans_exported_total"),
        0
    );
    drop(silent);

    // A collector whose port refuses connections: every export fails, counted.
    let refused = RefusedPort::new();
    let endpoint = format!("http://127.0.0.1:{}", refused.port);
    let server = serve_rules(
        &rules,
        &["--otlp-endpoint", &endpoint, "--otlp-protocol", "grpc"],
        "tracing-refused",
    );
    let grpc = server.addr("gRPC ");
    let users: Vec<String> = (0..20).map(|i| format!("r{i}")).collect();
    let batch: Vec<(&str, Option<&str>)> = users.iter().map(|u| (u.as_str(), None)).collect();
    let codes = calls(&grpc, &batch);
    assert!(codes.iter().all(|&c| c == 1), "{codes:?}");
    tollgate_testsupport::wait_for(Duration::from_secs(60), "failed exports counted", || {
        metric(&server.base, "tollgate_trace_spans_failed_total")
            + metric(&server.base, "tollgate_trace_spans_dropped_total")
            == 40
    });
    assert!(metric(&server.base, "tollgate_trace_spans_failed_total") > 0);
}

/// Envoy with OpenTelemetry tracing on (every request sampled, its spans to the receiver over
/// gRPC), rate limiting through tollgate at `rls`.
struct Envoy {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Envoy {
    fn start(rls: &str, otlp_grpc: u16) -> Envoy {
        on_free_ports("Envoy", |[port, app, admin]| {
            match Self::try_start(rls, otlp_grpc, port, app, admin) {
                Ok(e) => Some(e),
                Err(log) if log.contains("Address already in use") => None,
                Err(log) => panic!("{log}"),
            }
        })
    }

    fn try_start(rls: &str, otlp: u16, port: u16, app: u16, admin: u16) -> Result<Envoy, String> {
        static BASE_ID: AtomicU32 = AtomicU32::new(0);
        let (rls_host, rls_port) = rls.rsplit_once(':').unwrap();
        let dir = temp_dir("tracing-envoy");
        let h2 = r#"
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: {} }"#;
        let yaml = format!(
            r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
    - name: proxy
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: proxy
                tracing:
                  random_sampling: {{ value: 100 }}
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      grpc_service:
                        envoy_grpc: {{ cluster_name: otlp }}
                        timeout: 1s
                      service_name: envoy-front
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: traced
                      failure_mode_deny: true
                      timeout: 10s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {{ envoy_grpc: {{ cluster_name: tollgate }} }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                route_config:
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: / }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - request_headers: {{ header_name: x-user, descriptor_key: user }}
    - name: app
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: {app} }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: app
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                route_config:
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: / }}
                          direct_response: {{ status: 200, body: {{ inline_string: "hello\n" }} }}
  clusters:
    - name: app
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: app
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {app} }} }} }}
    - name: tollgate
      type: STATIC
      connect_timeout: 1s{h2}
      load_assignment:
        cluster_name: tollgate
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: {rls_host}, port_value: {rls_port} }} }} }}
    - name: otlp
      type: STATIC
      connect_timeout: 1s{h2}
      load_assignment:
        cluster_name: otlp
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {otlp} }} }} }}
"#
        );
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, yaml).unwrap();
        let base_id =
            (std::process::id() % 100_000) * 100 + 50 + BASE_ID.fetch_add(1, Ordering::Relaxed);
        let mut child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&config)
            .args(["--base-id", &base_id.to_string()])
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        let pid = child.id();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
                return Err(format!("Envoy exited ({status}):\n{log}"));
            }
            if [admin, port, app]
                .iter()
                .all(|p| tollgate_testsupport::listens(pid, *p))
            {
                return Ok(Envoy { child, port, dir });
            }
            assert!(Instant::now() < until, "Envoy not listening after 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /` through the proxy as user `user`: the status.
    fn get(&self, user: &str) -> u16 {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "GET / HTTP/1.1\r\nhost: app\r\nx-user: {user}\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out[9..12].parse().unwrap()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn write_runtime(root: &Path) {
    let app = root.join("ratelimit/config");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("traced.yaml"), RULES).unwrap();
}

#[test]
fn envoys_span_is_the_parent_of_tollgates_under_the_envoy_profile() {
    let receiver = Receiver::start();
    let root = temp_dir("tracing-envoy-runtime");
    write_runtime(&root);
    let root_s = root.display().to_string();
    let otlp = format!("http://127.0.0.1:{}", receiver.grpc);
    // Envoy Gateway's variables, envoyproxy/ratelimit's meanings.
    let server = Server::start_env(
        &["--profile", "envoy"],
        &[
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("RUNTIME_ROOT", &root_s),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "ratelimit-pod-1"),
            ("TRACING_SAMPLING_RATE", "1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
        ],
        &repo(),
        "tracing-envoy",
    );
    let grpc = server.addr("gRPC ");
    let envoy = Envoy::start(&grpc, receiver.grpc);
    assert_eq!(envoy.get("carol"), 200);
    // Envoy exports its spans every few seconds; tollgate at once.
    let spans = receiver.wait("tollgate's span and Envoy's parent of it", |s| {
        s.iter()
            .filter(|t| t["name"] == RLS_SPAN && t["resource"]["service.name"] == "RateLimit")
            .any(|t| {
                s.iter().any(|e| {
                    e["resource"]["service.name"] == "envoy-front"
                        && e["span_id"] == t["parent_span_id"]
                        && e["trace_id"] == t["trace_id"]
                })
            })
    });
    let ours = spans
        .iter()
        .find(|t| t["name"] == RLS_SPAN)
        .expect("tollgate's span");
    assert_eq!(
        ours["resource"]["service.namespace"],
        "envoy-gateway-system"
    );
    assert_eq!(ours["resource"]["service.instance.id"], "ratelimit-pod-1");
    assert_eq!(attr(ours, "tollgate.domain"), "traced");
    assert_eq!(attr(ours, "tollgate.outcome"), "OK");
    let _ = std::fs::remove_dir_all(&root);
}
