//! Hostile clients whose requests cost more than they should, against a real `tollgate serve`
//! process over real sockets: a counter named 64 times on a long sliding-window log, a
//! per-request override asking for a huge log, descriptor floods over HTTP and gRPC, metric
//! labels inflated by overrides, and refused YAML bombs. Each test asserts what a client or an
//! operator sees (statuses, messages, the `/metrics` page, the process's memory from
//! `/proc/PID/status`), never how fast.

use serde_json::{json, Value};
use support::client::Method;
use support::conn::Conn;
use support::registry::{put, token_file};
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;

mod support;

use support::*;

/// A field of `/proc/PID/status` in kB (`VmRSS`, `VmHWM`).
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn rules_file(dir: &std::path::Path, yaml: &str) -> String {
    let path = dir.join("rules.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.to_str().unwrap().to_string()
}

/// 5 per minute on `p` `k`: the rules of the tests that only need a configured domain.
const P_RULES: &str =
    "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// `tollgate serve` with `yaml` as `rules.yaml` and `extra` flags, in its own directory
/// (returned too).
fn serve_yaml(name: &str, yaml: &str, extra: &[&str]) -> (Server, std::path::PathBuf) {
    let dir = temp_dir(name);
    let rules = rules_file(&dir, yaml);
    (serve_rules(&rules, extra, name), dir)
}

/// After an attack: the RSS now and the peak, printed beside `idle`, all in kB.
fn rss_after(pid: u32, idle: u64, what: &str) -> (u64, u64) {
    let (after, peak) = (status_kb(pid, "VmRSS"), status_kb(pid, "VmHWM"));
    eprintln!("RSS idle {idle} kB, after {what} {after} kB, peak {peak} kB");
    (after, peak)
}

/// `clients` keep-alive connections at once, each sending `per_client` bodies
/// `body(client, i)`, every answer `want`.
fn on_connections(
    base: &str,
    clients: usize,
    per_client: usize,
    want: u16,
    body: impl Fn(usize, usize) -> String + Send + Sync + 'static,
) {
    let body = std::sync::Arc::new(body);
    runtime().block_on(async {
        let mut tasks = Vec::new();
        for client in 0..clients {
            let (base, body) = (base.to_string(), body.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = Conn::open(&base).await;
                for i in 0..per_client {
                    assert_eq!(c.status(body(client, i)).await, want);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `n` descriptors of `user=value`, as a request body.
fn repeated(value: &str, n: usize) -> String {
    let d = json!({"entries": [{"key": "user", "value": value}]});
    json!({"domain": "log", "descriptors": vec![d; n]}).to_string()
}

/// A counter named 64 times in one request costs the same as once, however long its sliding
/// log: before, every repeat copied the whole log (64 copies of 40,000 entries held at once,
/// about 40 MB per request, the peak kept by the allocator).
#[test]
fn a_counter_repeated_on_a_long_log_is_not_copied_per_repeat() {
    let (server, _dir) = serve_yaml("hostile-log-repeat", "domain: log\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 200000, algorithm: sliding_window_log}\n", &[]);
    let pid = server.child.id();
    // 40,000 admissions, each at its own microsecond: a log of 40,000 entries.
    on_connections(&server.base, 4, 10_000, 200, |_, _| repeated("victim", 1));
    let rt = runtime();
    let peak_before = status_kb(pid, "VmHWM");
    rt.block_on(async {
        let mut c = Conn::open(&server.base).await;
        for _ in 0..5 {
            let (status, v) = c.check(repeated("victim", 64)).await;
            assert_eq!(status, 200, "{v}");
            // Every repeat saw the ones before it: 40,000 + 64 * k + i.
            let last = v["statuses"][63]["limit_remaining"].as_u64().unwrap();
            let first = v["statuses"][0]["limit_remaining"].as_u64().unwrap();
            assert_eq!(first - last, 63, "{v}");
        }
    });
    let grown = status_kb(pid, "VmHWM").saturating_sub(peak_before);
    assert!(
        grown < 16 * 1024,
        "five requests naming one counter 64 times raised the peak RSS by {grown} kB"
    );
}

/// A per-request override may not make a sliding-window log as long as it likes: above
/// 10,000 per unit it is refused (400 `invalid_limit`, naming the bound), at the bound it works.
#[test]
fn a_sliding_log_override_is_bounded() {
    let (server, _dir) = serve_yaml("hostile-log-override", "domain: log\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n", &["--default-algorithm", "sliding_window_log"]);
    let ask = |n: u64| {
        let body = json!({"domain": "log", "descriptors": [{"entries": [{"key": "user", "value": "a"}],
            "limit": {"requests_per_unit": n, "unit": "second"}}]});
        let r = http(&server.base, Method::POST, "/v1/check", Some(body));
        (r.status, serde_json::from_str::<Value>(&r.body).unwrap())
    };
    let (status, v) = ask(50_000);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_limit", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("10000"), "{message}");
    let (status, v) = ask(10_000);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["statuses"][0]["limit_remaining"], 9_999);
}

/// 21,000 empty descriptors (63 KB) are refused at the 65th: the message names the limit, not
/// a total the reader never counted; what follows the 65th is not even read.
#[test]
fn a_descriptor_flood_is_refused_at_the_limit_over_http() {
    let (server, _dir) = serve_yaml("hostile-desc-http", P_RULES, &[]);
    let entry = r#"{"entries":[{"key":"k","value":"v"}]}"#;
    let post = |body: String| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { Conn::open(&server.base).await.check(body).await })
    };
    let flood = format!(
        r#"{{"domain":"p","descriptors":[{}]}}"#,
        vec!["{}"; 21_000].join(",")
    );
    let (status, v) = post(flood);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "too_many_descriptors");
    assert_eq!(
        v["error"]["message"], "more than the maximum 64 descriptors",
        "{v}"
    );
    // The 66th descriptor onwards is never read: here it is not even JSON.
    let cut = format!(
        r#"{{"domain":"p","descriptors":[{},{{"entries":[ not json"#,
        vec![entry; 65].join(",")
    );
    let (status, v) = post(cut);
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("too_many_descriptors")),
        "{v}"
    );
    // The same flood in a field that is not read: bounded too (it is parsed, not kept).
    let unknown = format!(
        r#"{{"domain":"p","descriptors":[{entry}],"x":[{}]}}"#,
        vec!["{}"; 21_000].join(",")
    );
    let (status, v) = post(unknown);
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("invalid_request")),
        "{v}"
    );
    // Entries likewise, naming the descriptor.
    let many = json!({"domain": "p", "descriptors": [
        {"entries": [{"key": "k", "value": "v"}]},
        {"entries": vec![json!({"key": "k", "value": "v"}); 1_000]}]});
    let (status, v) = post(many.to_string());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "too_many_entries");
    assert_eq!(
        v["error"]["message"], "descriptors[1] has more than the maximum 16 entries",
        "{v}"
    );
    // Within the limits: decided as ever.
    let ok = format!(
        r#"{{"domain":"p","descriptors":[{}]}}"#,
        vec![entry; 64].join(",")
    );
    assert_eq!(post(ok).0, 429, "64 hits on a limit of 5");
}

/// The same flood over gRPC (an empty descriptor is 2 bytes): INVALID_ARGUMENT naming the
/// limit, not the 21,000 the message holds.
#[test]
fn a_descriptor_flood_is_refused_at_the_limit_over_grpc() {
    let (server, _dir) = serve_yaml("hostile-desc-grpc", P_RULES, &[]);
    let grpc = format!("http://{}", server.addr("gRPC "));
    let rt = runtime();
    rt.block_on(async {
        let mut client = RateLimitServiceClient::connect(grpc).await.unwrap();
        let flood = RateLimitRequest {
            domain: "p".into(),
            descriptors: vec![RateLimitDescriptor::default(); 21_000],
            hits_addend: 0,
        };
        let e = client.should_rate_limit(flood).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains("more than the maximum 64 descriptors"),
            "{e:?}"
        );
        assert!(!e.message().contains("21000"), "{e:?}");
        let entry = Entry {
            key: "k".into(),
            value: "v".into(),
        };
        let wide = RateLimitRequest {
            domain: "p".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![entry; 5_000],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let e = client.should_rate_limit(wide).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .contains("descriptors[0] has more than the maximum 16 entries"),
            "{e:?}"
        );
    });
}

/// Overrides with long, distinct descriptors cannot inflate `/metrics`: labels are cut at 128
/// bytes with a visible marker, overrides get a budget of their own (so the operator's
/// per-value series still appear after an override flood), and the page stays small.
#[test]
fn override_labels_cannot_inflate_metrics_or_starve_configured_series() {
    let (server, _dir) = serve_yaml("hostile-labels", "domain: m\ndescriptors:\n  - key: path\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n", &[]);
    let key = "k".repeat(200);
    rt_flood(&server.base, &key);
    let r = http(
        &server.base,
        Method::POST,
        "/v1/check",
        Some(
            json!({"domain": "m", "descriptors": [{"entries": [{"key": "path", "value": "/login"}]}]}),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let page = http(&server.base, Method::GET, "/metrics", None).body;
    assert!(
        page.contains("tollgate_total_hits{domain=\"m\",rule=\"m.path_/login\"} 1"),
        "the per-value series of a configured rule is missing after an override flood"
    );
    let longest = page
        .lines()
        .filter_map(|l| l.split("rule=\"").nth(1))
        .map(|rest| rest.split("\"}").next().unwrap().len())
        .max()
        .unwrap();
    assert!(longest <= 128, "a rule label of {longest} bytes");
    assert!(page.contains('…'), "long labels carry the cut marker");
    assert!(
        page.len() < 4 << 20,
        "/metrics is {} bytes after the flood",
        page.len()
    );
}

/// 10,100 overrides, each with its own 200-byte key and 1,000-byte value, on 4 connections.
fn rt_flood(base: &str, key: &str) {
    let key = key.to_string();
    on_connections(base, 4, 2_525, 200, move |t, i| {
        let value = format!("{t}-{i}-{}", "v".repeat(1_000));
        json!({"domain": "m", "descriptors": [{"entries": [{"key": key, "value": value}],
            "limit": {"requests_per_unit": 5, "unit": "minute"}}]})
        .to_string()
    });
}

/// Nested aliases: a few hundred bytes that expand to millions of nodes.
fn yaml_bomb() -> String {
    let mut text = String::from("domain: bomb\nx0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let prev = format!("*a{}", i - 1);
        text.push_str(&format!("x{i}: &a{i} [{}]\n", vec![prev; 10].join(", ")));
    }
    text
}

/// Refused YAML bombs leave the process near its idle memory: the alias expansion is refused
/// after 16,384 nodes instead of after a million (which took and kept about 70 MB each).
#[test]
fn refused_yaml_bombs_leave_rss_near_idle() {
    let dir = temp_dir("hostile-bombs-registry");
    let token = token_file(&dir);
    let registry = dir.join("registry");
    let (server, _dir) = serve_yaml(
        "hostile-bombs",
        P_RULES,
        &[
            "--admin-token-file",
            token.to_str().unwrap(),
            "--registry-dir",
            registry.to_str().unwrap(),
        ],
    );
    let pid = server.child.id();
    assert_eq!(check(&server.base, "p", "k", "v").0, 200);
    let idle = status_kb(pid, "VmRSS");
    for _ in 0..2 {
        let r = put(&server.base, "bomb", &yaml_bomb(), None);
        assert!((400..500).contains(&r.status), "{} {}", r.status, r.body);
        assert!(r.body.contains("too large"), "{}", r.body);
    }
    assert_eq!(check(&server.base, "p", "k", "v").0, 200);
    let (after, _) = rss_after(pid, idle, "two bombs");
    assert!(
        after < idle + 12 * 1024,
        "RSS {idle} kB idle, {after} kB after two refused bombs"
    );
}

/// A descriptor flood from 32 clients at once leaves the process near its idle memory: nothing
/// past the 65th descriptor is built.
#[test]
fn a_descriptor_flood_leaves_rss_near_idle() {
    let (server, _dir) = serve_yaml("hostile-flood-rss", P_RULES, &[]);
    let pid = server.child.id();
    assert_eq!(check(&server.base, "p", "k", "v").0, 200);
    let idle = status_kb(pid, "VmRSS");
    let flood = format!(
        r#"{{"domain":"p","descriptors":[{}]}}"#,
        vec!["{}"; 21_000].join(",")
    );
    on_connections(&server.base, 32, 8, 400, move |_, _| flood.clone());
    let (_, peak) = rss_after(pid, idle, "the flood");
    assert!(
        peak < idle + 10 * 1024,
        "RSS {idle} kB idle, peak {peak} kB during a descriptor flood"
    );
}

/// A rules file ending in an empty `---` document loads (envoyproxy/ratelimit reads the first
/// document); a second document with content is still refused, naming the file and line.
#[test]
fn a_trailing_empty_document_loads_and_a_second_one_is_refused() {
    let (server, dir) = serve_yaml("hostile-trailing-doc", "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n---\n", &[]);
    assert_eq!(check(&server.base, "t", "k", "v").0, 200);
    assert_eq!(check(&server.base, "t", "k", "v").0, 429);
    drop(server);
    let rules = dir.join("rules.yaml").to_str().unwrap().to_string();
    std::fs::write(
        &rules,
        "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n---\ndomain: u\n",
    )
    .unwrap();
    let out = tollgate(&["validate", &rules]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("rules.yaml:5"), "{text}");
    assert!(text.contains("second"), "{text}");
}
