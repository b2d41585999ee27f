//! The input contract of `tollgate serve`, from outside (a real process on real sockets):
//! - the OpenAPI document and the server agree: schemathesis, a schema-based fuzzer, runs against
//!   the served `/openapi.json` with every check on and must find nothing;
//! - a JSON key given twice is a 400 `duplicate_key` on both check endpoints;
//! - a gRPC request that is not valid protobuf is INVALID_ARGUMENT with a message, and the
//!   server keeps serving;
//! - every 4xx body is the JSON error shape.
//!
//! schemathesis is a Python tool: `scripts/test.sh` installs it into `target/schemathesis`
//! (a venv); `TOLLGATE_TEST_SCHEMATHESIS` may name another executable. Missing, the test fails
//! and says how to install it: it never skips.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::client::{send, HttpResponse, Method};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

mod support;

use support::*;

const RULES: &str = "domain: api
http:
  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log}
";

/// `tollgate serve` on free ports with [`RULES`], and the rule registry (a directory, writes
/// with [`support::registry::TOKEN`]).
fn start(name: &str) -> Server {
    let dir = temp_dir(name);
    std::fs::write(dir.join("rules.yaml"), RULES).unwrap();
    let rules = dir.join("rules.yaml");
    let token = support::registry::token_file(&dir);
    let registry = dir.join("registry");
    Server::start(
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--rules",
            rules.to_str().unwrap(),
            "--admin-token-file",
            token.to_str().unwrap(),
            "--registry-dir",
            registry.to_str().unwrap(),
        ],
        &dir,
        name,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `method path` with a raw body (any bytes the test wants, duplicates included).
fn raw(base: &str, method: Method, path: &str, body: Option<&str>) -> HttpResponse {
    runtime()
        .block_on(send(
            base,
            method,
            path,
            body.map(str::to_string),
            Duration::from_secs(10),
        ))
        .expect("HTTP request")
}

/// The JSON error body's code, after checking its shape: `{"error":{"code","message"}}` with a
/// JSON content type and a non-empty message.
fn error_code(r: &HttpResponse) -> String {
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("application/json")),
        "{:?}",
        r.headers
    );
    let body: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    let error = body["error"].as_object().expect("an `error` object");
    assert_eq!(error.len(), 2, "{}", r.body);
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.body
    );
    error["code"].as_str().expect("a string code").to_string()
}

/// The schemathesis executable: `TOLLGATE_TEST_SCHEMATHESIS`, the venv `scripts/test.sh`
/// makes, or `schemathesis` on the PATH.
fn schemathesis() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_TEST_SCHEMATHESIS") {
        return PathBuf::from(p);
    }
    let venv = repo().join("target/schemathesis/bin/schemathesis");
    if venv.exists() {
        return venv;
    }
    let on_path = Command::new("schemathesis").arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success()) {
        return PathBuf::from("schemathesis");
    }
    panic!(
        "schemathesis is missing: run scripts/test.sh (it installs it into target/schemathesis), \
         or `python3 -m venv target/schemathesis && target/schemathesis/bin/pip install \
         'schemathesis>=4.32,<5'`, or set TOLLGATE_TEST_SCHEMATHESIS to its path"
    );
}

/// schemathesis, every check on, over every operation of the served document: schema-valid
/// requests must be accepted (200/429, or 413 for a body over the size limit), schema-violating
/// ones refused (400/413/415), no 5xx, and every response must match its documented status,
/// content type, headers and schema. Bounded: a fixed number of examples and a fixed seed.
#[test]
fn schemathesis_finds_nothing_with_every_check() {
    let st = schemathesis();
    let server = start("contract-fuzz");
    // A registered domain for the registry's operations to work on (see schemathesis.toml).
    let r = support::registry::put(
        &server.base,
        "reg",
        &support::registry::user_limit("reg", 5),
        None,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let work = temp_dir("contract-fuzz-run");
    let config = repo().join("crates/tollgate/tests/schemathesis/schemathesis.toml");
    let out = Command::new(&st)
        .arg("--config-file")
        .arg(&config)
        .args([
            "run",
            &format!("{}/openapi.json", server.base),
            "--checks",
            "all",
            "--max-examples",
            "40",
            "--seed",
            "1",
            "--generation-database",
            "none",
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--no-color",
            // The registry's writes need the admin token (`ignored_auth` checks that they do).
            "--header",
            &format!("Authorization: Bearer {}", support::registry::TOKEN),
        ])
        .current_dir(&work)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", st.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems (exit {:?}):\n{stdout}\n{}\nserver stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    assert!(stdout.contains("No issues found"), "{stdout}");
}

/// `{"domain":"nope","domain":"api"}` and its kind, at any depth: 400 `duplicate_key` naming
/// the key, on `/v1/check` and `/json`; nothing is counted, and the server goes on.
#[test]
fn duplicate_json_keys_are_400_naming_the_key() {
    let server = start("contract-dup");
    let entry = r#"[{"entries":[{"key":"user","value":"alice"}]}]"#;
    let cases = [
        (
            format!(r#"{{"domain":"nope","domain":"api","descriptors":{entry}}}"#),
            "domain",
        ),
        (
            format!(r#"{{"domain":"api","descriptors":{entry},"descriptors":{entry}}}"#),
            "descriptors",
        ),
        (
            r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","key":"ip","value":"alice"}]}]}"#
                .to_string(),
            "key",
        ),
        (
            format!(r#"{{"domain":"api","descriptors":{entry},"ext":{{"a":{{"b":1,"b":2}}}}}}"#),
            "b",
        ),
    ];
    for path in ["/v1/check", "/json"] {
        for (body, key) in &cases {
            let r = raw(&server.base, Method::POST, path, Some(body));
            assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
            assert_eq!(error_code(&r), "duplicate_key", "{}", r.body);
            assert!(r.body.contains(&format!("`{key}`")), "{}", r.body);
        }
    }
    // None of them counted: the limit (5) is all there.
    let ok = format!(r#"{{"domain":"api","descriptors":{entry}}}"#);
    for n in (0..5).rev() {
        let r = raw(&server.base, Method::POST, "/v1/check", Some(&ok));
        assert_eq!(r.status, 200, "{}", r.body);
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["statuses"][0]["limit_remaining"], n);
    }
}

/// Every 4xx answer is `{"error":{"code","message"}}` with a JSON content type.
#[test]
fn every_4xx_body_is_the_json_error_shape() {
    let server = start("contract-4xx");
    let base = &server.base;
    let big = format!(r#"{{"domain":"{}"}}"#, "x".repeat(70 * 1024));
    let cases: [(Method, &str, Option<&str>, u16, &str); 8] = [
        (Method::POST, "/v1/check", Some("{"), 400, "invalid_json"),
        (Method::POST, "/json", Some("[]"), 400, "invalid_request"),
        (
            Method::POST,
            "/json",
            Some(
                r#"{"domain":"api","hitsAddend":"+1","descriptors":[{"entries":[{"key":"user"}]}]}"#,
            ),
            400,
            "invalid_hits",
        ),
        (
            Method::POST,
            "/v1/check",
            Some(
                r#"{"domain":"api","descriptors":[{"entries":[{"key":"k"}],"limit":{"requests_per_unit":4294967296,"unit":"second"}}]}"#,
            ),
            400,
            "invalid_limit",
        ),
        (
            Method::POST,
            "/v1/check",
            Some(&big),
            413,
            "payload_too_large",
        ),
        (Method::GET, "/v1/check", None, 405, "method_not_allowed"),
        (Method::GET, "/nope", None, 404, "not_found"),
        (Method::DELETE, "/json", None, 405, "method_not_allowed"),
    ];
    for (method, path, body, status, code) in cases {
        let r = raw(base, method.clone(), path, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert_eq!(error_code(&r), code, "{method} {path}");
    }
}

/// Bytes in, bytes out: a gRPC message exactly as the test builds it.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

async fn should_rate_limit(channel: &Channel, message: Vec<u8>) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    grpc.unary(
        tonic::Request::new(message),
        PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// A length-delimited protobuf field (`wire type 2`).
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![number << 3 | 2, bytes.len() as u8];
    out.extend_from_slice(bytes);
    out
}

/// Garbage, a `domain` that is not UTF-8, groups nested 200 deep and a truncated field are
/// INVALID_ARGUMENT with prost's reason and the `invalid_protobuf` code (they were INTERNAL),
/// and counted; an oversize message stays OUT_OF_RANGE; a valid request on the same connection
/// is then answered.
#[test]
fn malformed_protobuf_is_invalid_argument() {
    let server = start("contract-grpc");
    let grpc = server.addr("gRPC ");
    runtime().block_on(async {
        let channel = Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .expect("connect gRPC");
        // A valid RateLimitRequest: domain "api", one descriptor {user: alice}.
        let entry = [field(1, b"user"), field(2, b"alice")].concat();
        let descriptor = field(1, &entry);
        let valid = [field(1, b"api"), field(2, &descriptor)].concat();
        let mut nested = vec![9 << 3 | 3; 200]; // field 9, start group, 200 deep
        nested.extend(vec![9 << 3 | 4; 200]);
        let cases = [
            ("garbage", vec![0xff; 16], "RateLimitRequest"),
            (
                "invalid UTF-8 domain",
                [field(1, &[b'a', 0xc3, 0x28]), field(2, &descriptor)].concat(),
                "UTF-8",
            ),
            (
                "nested groups",
                [valid.clone(), nested].concat(),
                "recursion",
            ),
            (
                "truncated field",
                vec![1 << 3 | 2, 50, b'a'],
                "RateLimitRequest",
            ),
        ];
        for (name, message, reason) in cases {
            let e = should_rate_limit(&channel, message).await.expect_err(name);
            assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e:?}");
            assert!(e.message().contains(reason), "{name}: {}", e.message());
            assert_eq!(
                e.metadata()
                    .get("tollgate-error-code")
                    .and_then(|v| v.to_str().ok()),
                Some("invalid_protobuf"),
                "{name}"
            );
        }
        // Over --max-body-bytes (64 KiB): refused before decoding, OUT_OF_RANGE with a message.
        let e = should_rate_limit(&channel, vec![0; 70 * 1024])
            .await
            .expect_err("too large");
        assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
        assert!(e.message().contains("too large"), "{}", e.message());
        // Still serving, on the same connection.
        let reply = should_rate_limit(&channel, valid)
            .await
            .expect("valid request");
        // RateLimitResponse.overall_code (field 1) = OK (1).
        assert_eq!(reply.get(..2), Some(&[1 << 3, 1][..]), "{reply:?}");
    });
    // Counted like every client error.
    let metrics = raw(&server.base, Method::GET, "/metrics", None).body;
    assert!(
        metrics.contains("tollgate_request_errors_total{code=\"invalid_protobuf\"} 4"),
        "{metrics}"
    );
}
