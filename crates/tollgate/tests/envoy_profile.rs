//! `tollgate serve --profile envoy` as a real process configured only with envoyproxy/ratelimit's
//! environment variables, called over real sockets: its listeners (`HOST`, `PORT`, `GRPC_PORT`),
//! its runtime folder (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, any extension,
//! dot files), `SHADOW_MODE`, `LIMIT_RESPONSE_HEADERS_ENABLED` with its header names,
//! `GET /healthcheck`, the `ratelimit` health service, `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`
//! with `FORCE_START_WITHOUT_INITIAL_CONFIG`, `GRPC_UDS`, TLS on gRPC (with client
//! certificates), `RESPONSE_DYNAMIC_METADATA`, and a WARN for a variable it does not know. Also
//! the native flags that set what those listener variables set, without the profile.

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use support::client::Method;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

mod support;

use support::*;

/// A 3-per-minute limit on the sliding log (exact on the wall clock: no window boundary can
/// reset it during a test, whatever the profile's default algorithm).
const RULES: &str = "domain: profile
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
";

/// A second domain in a dot file (envoy reads dot files unless RUNTIME_IGNOREDOTFILES).
const HIDDEN: &str = "domain: hidden
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
";

fn runtime(name: &str) -> std::path::PathBuf {
    let root = temp_dir(name);
    let app = root.join("ratelimit/config");
    std::fs::create_dir_all(&app).unwrap();
    root
}

fn write(root: &Path, file: &str, text: &str) {
    std::fs::write(root.join("ratelimit/config").join(file), text).unwrap();
}

/// `tollgate serve --profile envoy` with `vars` and envoy's listeners on loopback ports the
/// server picks (port 0, so envoy's defaults 8080 / 8081 / 6070 never show).
fn start(root: &Path, vars: &[(&str, &str)], name: &str) -> (Server, String) {
    let root = root.display().to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("RUNTIME_ROOT", &root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        // envoy's debug port on any free port (its default 6070 may be taken).
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ];
    env.extend_from_slice(vars);
    let s = Server::start_env(&["--profile", "envoy"], &env, &repo(), name);
    // HOST / PORT and GRPC_HOST / GRPC_PORT made the listeners.
    assert!(s.line.contains("HTTP http://127.0.0.1:"), "{}", s.line);
    assert_ne!(s.port(), 8080, "{}", s.line);
    let grpc_addr = s.addr("gRPC ");
    assert!(grpc_addr.starts_with("127.0.0.1:"), "{}", s.line);
    assert_ne!(grpc_addr, "127.0.0.1:8081", "{}", s.line);
    (s, grpc_addr)
}

fn runtime_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn should_rate_limit(addr: &str, domain: &str, user: &str) -> RateLimitResponse {
    runtime_block(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("gRPC connect");
        client
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: user.into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            })
            .await
            .expect("ShouldRateLimit")
            .into_inner()
    })
}

fn health(addr: &str, service: &str) -> Result<i32, tonic::Code> {
    runtime_block(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("gRPC connect");
        let mut h = HealthClient::new(channel);
        h.check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|s| s.code())
    })
}

fn json_check(base: &str, domain: &str, user: &str) -> (u16, Value) {
    let r = http(
        base,
        Method::POST,
        "/json",
        Some(
            json!({"domain": domain, "descriptors": [{"entries": [{"key": "user", "value": user}]}]}),
        ),
    );
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

#[test]
fn envoy_environment_listeners_runtime_folder_health_and_headers() {
    let root = runtime("envoy-profile-main");
    write(&root, "limits.conf", RULES);
    write(&root, ".hidden.txt", HIDDEN);
    // A subdirectory's files are read too, as envoy's runtime loader walks it.
    std::fs::create_dir_all(root.join("ratelimit/config/more")).unwrap();
    write(
        &root,
        "more/sub.yaml",
        "domain: nested\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}\n",
    );
    let (s, grpc) = start(
        &root,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
            ("REDIS_URLS", "typo"),
            ("LOG_LEVEL", "info"),
            ("LOG_FORMAT", "json"),
        ],
        "envoy-profile-main",
    );

    // envoy's health check and health service.
    let h = http(&s.base, Method::GET, "/healthcheck", None);
    assert_eq!((h.status, h.body.as_str()), (200, "OK"));
    assert_eq!(
        health(&grpc, "ratelimit"),
        Ok(ServingStatus::Serving as i32)
    );
    assert_eq!(health(&grpc, ""), Ok(ServingStatus::Serving as i32));

    // The `.conf` file of the runtime folder is loaded: 3 per minute.
    for left in ["2", "1", "0"] {
        let r = should_rate_limit(&grpc, "profile", "alice");
        assert_eq!(r.overall_code, Code::Ok as i32);
        let h = headers(&r);
        assert_eq!(h.len(), 3, "{h:?}");
        assert_eq!(h[0], ("RateLimit-Limit".into(), "3".into()));
        assert_eq!(h[1], ("X-Left".into(), left.into()));
        assert_eq!(h[2].0, "RateLimit-Reset");
        let reset: u64 = h[2].1.parse().unwrap();
        assert!((1..=60).contains(&reset), "{h:?}");
    }
    let r = should_rate_limit(&grpc, "profile", "alice");
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(headers(&r)[1], ("X-Left".into(), "0".into()));
    // No rule matched: no headers, as envoy.
    let r = should_rate_limit(&grpc, "profile-unknown", "alice");
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");

    // `/json` carries them as well, as envoy's does.
    let (status, body) = json_check(&s.base, "profile", "alice");
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        body["responseHeadersToAdd"],
        json!([
            {"key": "RateLimit-Limit", "value": "3"},
            {"key": "X-Left", "value": "0"},
            {"key": "RateLimit-Reset", "value": body["responseHeadersToAdd"][2]["value"]},
        ]),
        "{body}"
    );

    // The dot file and the subdirectory's file too.
    for domain in ["hidden", "nested"] {
        assert_eq!(json_check(&s.base, domain, "bob").0, 200, "{domain}");
        assert_eq!(json_check(&s.base, domain, "bob").0, 429, "{domain}");
    }

    // The variable it does not know is one WARN, logged as JSON (LOG_FORMAT), and INFO lines
    // are there (LOG_LEVEL=info; envoy's default is WARN).
    let log = s.stderr();
    let warned: Vec<Value> = log
        .lines()
        .filter(|l| l.contains("REDIS_URLS"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert_eq!(warned[0]["level"], "WARN", "{log}");
    assert!(log.contains("\"level\":\"INFO\""), "{log}");
}

#[test]
fn unhealthy_once_shutdown_begins() {
    let root = runtime("envoy-profile-stop");
    write(&root, "limits.yaml", RULES);
    let (mut s, grpc) = start(&root, &[], "envoy-profile-stop");
    let statuses = runtime_block(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .expect("gRPC connect");
        let mut stream = HealthClient::new(channel)
            .watch(HealthCheckRequest {
                service: "ratelimit".into(),
            })
            .await
            .expect("watch")
            .into_inner();
        let mut seen = vec![
            stream
                .message()
                .await
                .expect("first")
                .expect("status")
                .status,
        ];
        s.terminate();
        while let Ok(Some(m)) = stream.message().await {
            seen.push(m.status);
        }
        // A status may be sent twice at shutdown (the health follower and the shutdown both
        // set NOT_SERVING); what matters is the sequence of changes.
        seen.dedup();
        seen
    });
    assert_eq!(
        statuses,
        vec![
            ServingStatus::Serving as i32,
            ServingStatus::NotServing as i32
        ]
    );
    assert!(s.wait(Duration::from_secs(30)).success());
}

#[test]
fn shadow_mode_answers_ok_and_counts() {
    let root = runtime("envoy-profile-shadow");
    write(&root, "limits.yaml", RULES);
    let (s, grpc) = start(&root, &[("SHADOW_MODE", "true")], "envoy-profile-shadow");
    for _ in 0..3 {
        assert_eq!(
            should_rate_limit(&grpc, "profile", "carol").overall_code,
            Code::Ok as i32
        );
    }
    let r = should_rate_limit(&grpc, "profile", "carol");
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    // The descriptor still says what the limit decided.
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32, "{r:?}");
    let (status, body) = json_check(&s.base, "profile", "carol");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["overallCode"], "OK", "{body}");
    let metrics = http(&s.base, Method::GET, "/metrics", None).body;
    assert!(
        metrics.contains("tollgate_global_shadow_mode_total 2"),
        "{metrics}"
    );
}

#[test]
fn healthy_only_once_a_config_is_loaded() {
    let root = runtime("envoy-profile-health");
    let (s, grpc) = start(
        &root,
        &[
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
        "envoy-profile-health",
    );
    let h = http(&s.base, Method::GET, "/healthcheck", None);
    assert_eq!((h.status, h.body.as_str()), (500, ""));
    assert_eq!(
        health(&grpc, "ratelimit"),
        Ok(ServingStatus::NotServing as i32)
    );
    write(&root, "limits.yaml", RULES);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let h = http(&s.base, Method::GET, "/healthcheck", None);
        if h.status == 200 && health(&grpc, "ratelimit") == Ok(ServingStatus::Serving as i32) {
            assert_eq!(h.body, "OK");
            break;
        }
        assert!(Instant::now() < until, "never healthy: {}", s.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn without_the_profile_nothing_changes() {
    let root = runtime("envoy-profile-off");
    write(&root, "limits.yaml", RULES);
    let rules = root.join("ratelimit/config").display().to_string();
    let s = Server::start_env(
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--rules",
            &rules,
        ],
        &[("SHADOW_MODE", "true")],
        &repo(),
        "envoy-profile-off",
    );
    assert_eq!(http(&s.base, Method::GET, "/healthcheck", None).status, 404);
    let grpc = s.addr("gRPC ");
    assert_eq!(health(&grpc, "ratelimit"), Err(tonic::Code::NotFound));
    for _ in 0..3 {
        json_check(&s.base, "profile", "dave");
    }
    assert_eq!(json_check(&s.base, "profile", "dave").0, 429);
}

#[test]
fn memcache_and_bad_values_are_clear_errors() {
    let root = runtime("envoy-profile-bad");
    for (var, value, expect) in [
        (
            "BACKEND_TYPE",
            "memcache",
            "memcache backend is not supported",
        ),
        ("SHADOW_MODE", "yes", "SHADOW_MODE=yes"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--profile", "envoy"])
            .env("RUNTIME_ROOT", &root)
            .env("PORT", "0")
            .env("GRPC_PORT", "0")
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A tonic channel over the unix socket `path`.
async fn unix_channel(path: &Path) -> tonic::transport::Channel {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .expect("gRPC connect over the unix socket")
}

#[test]
fn grpc_on_a_unix_socket() {
    let root = runtime("envoy-profile-uds");
    write(&root, "limits.yaml", RULES);
    let sock = root.join("rls.sock");
    let sock_s = sock.display().to_string();
    let root_s = root.display().to_string();
    // The profile from TOLLGATE_PROFILE rather than the flag.
    let s = Server::start_env(
        &[],
        &[
            ("TOLLGATE_PROFILE", "envoy"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_UDS", &sock_s),
            ("RUNTIME_ROOT", &root_s),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
        ],
        &repo(),
        "envoy-profile-uds",
    );
    assert!(
        s.line.contains(&format!("gRPC unix:{sock_s}")),
        "{}",
        s.line
    );
    let codes = runtime_block(async {
        let channel = unix_channel(&sock).await;
        let mut h = HealthClient::new(channel.clone());
        let status = h
            .check(HealthCheckRequest {
                service: "ratelimit".into(),
            })
            .await
            .expect("health")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32);
        let mut client = RateLimitServiceClient::new(channel);
        let mut codes = Vec::new();
        for _ in 0..4 {
            let r = client
                .should_rate_limit(RateLimitRequest {
                    domain: "profile".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user".into(),
                            value: "erin".into(),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                })
                .await
                .expect("ShouldRateLimit")
                .into_inner();
            codes.push(r.overall_code);
        }
        codes
    });
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, vec![ok, ok, ok, over]);
}

/// `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (needed to make test certificates)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for `localhost` and a client certificate, both signed by the CA.
fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend_from_slice(&ec);
    ca.extend_from_slice(&[
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=tollgate-test-ca",
    ]);
    openssl(dir, &ca);
    for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
        std::fs::write(
            dir.join(format!("{name}.ext")),
            format!("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        let mut req = vec!["req"];
        req.extend_from_slice(&ec);
        req.extend_from_slice(&["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
}

/// A tonic channel over TLS to `addr` (server name `localhost`, trusting `dir/ca.pem`),
/// presenting `dir/client.pem` when `client_cert`.
async fn tls_channel(
    addr: &str,
    dir: &Path,
    client_cert: bool,
) -> Result<tonic::transport::Channel, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = if client_cert {
        let certs = CertificateDer::pem_file_iter(dir.join("client.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(dir.join("client.key")).unwrap();
        builder.with_client_auth_cert(certs, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let addr = addr.to_owned();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let (connector, addr) = (connector.clone(), addr.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").unwrap();
                connector
                    .connect(name, tcp)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .map_err(|e| format!("{e:?}"))
}

async fn tls_health(addr: &str, dir: &Path, client_cert: bool) -> Result<i32, String> {
    tls_health_of(addr, dir, client_cert, "ratelimit").await
}

/// The health of `service` over TLS (see [`tls_channel`]).
async fn tls_health_of(
    addr: &str,
    dir: &Path,
    client_cert: bool,
    service: &str,
) -> Result<i32, String> {
    let channel = tls_channel(addr, dir, client_cert).await?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|s| format!("{s:?}"))
}

#[test]
fn grpc_server_tls_and_client_certificates() {
    let root = runtime("envoy-profile-tls");
    write(&root, "limits.yaml", RULES);
    certificates(&root);
    let file = |name: &str| root.join(name).display().to_string();
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
    ];

    // TLS: a TLS client is served; a plaintext one is not.
    let (_s, grpc) = start(&root, &tls, "envoy-profile-tls");
    let serving = ServingStatus::Serving as i32;
    assert_eq!(runtime_block(tls_health(&grpc, &root, false)), Ok(serving));
    let plain = runtime_block(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .map_err(|e| e.to_string())
    });
    assert!(plain.is_err(), "plaintext gRPC answered on a TLS listener");

    // Client certificates: required once GRPC_CLIENT_TLS_CACERT is set.
    let mut mtls = tls.to_vec();
    mtls.push(("GRPC_CLIENT_TLS_CACERT", ca.as_str()));
    let (_m, grpc) = start(&root, &mtls, "envoy-profile-mtls");
    assert_eq!(runtime_block(tls_health(&grpc, &root, true)), Ok(serving));
    assert!(runtime_block(tls_health(&grpc, &root, false)).is_err());

    // Difference: the certificate files are read at start-up. Replaced by a certificate of
    // another CA, they are not picked up (envoyproxy/ratelimit reloads them): a client trusting
    // only the first CA is still served.
    let other = root.join("other");
    std::fs::create_dir_all(&other).unwrap();
    certificates(&other);
    for f in ["server.pem", "server.key"] {
        std::fs::copy(other.join(f), root.join(f)).unwrap();
    }
    assert_eq!(runtime_block(tls_health(&grpc, &root, true)), Ok(serving));
}

/// What the envoy variables `GRPC_SERVER_USE_TLS` / `GRPC_SERVER_TLS_*` / `GRPC_CLIENT_TLS_CACERT`,
/// `GRPC_UDS` and `DEBUG_HOST` / `DEBUG_PORT` set, plain `tollgate serve` sets with its own flags
/// (and their `TOLLGATE_*` variables): gRPC over TLS with client certificates (and the
/// handshake bounded by `--grpc-handshake-timeout`), gRPC on a unix socket, the debug port.
#[test]
fn native_flags_for_grpc_tls_unix_socket_and_debug_port() {
    let root = runtime("native-listeners");
    write(&root, "limits.yaml", RULES);
    certificates(&root);
    let file = |name: &str| root.join(name).display().to_string();
    let rules = root
        .join("ratelimit/config/limits.yaml")
        .display()
        .to_string();
    let serving = ServingStatus::Serving as i32;

    // TLS with client certificates, from the flags; the debug port from its variable.
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let s = serve_rules_env(
        &rules,
        &[
            "--grpc-tls-cert",
            &cert,
            "--grpc-tls-key",
            &key,
            "--grpc-tls-client-ca",
            &ca,
        ],
        &[("TOLLGATE_DEBUG_ADDR", "127.0.0.1:0")],
        "native-tls",
    );
    let grpc = s.addr("gRPC ");
    assert_eq!(
        runtime_block(tls_health_of(&grpc, &root, true, "")),
        Ok(serving)
    );
    assert!(runtime_block(tls_health_of(&grpc, &root, false, "")).is_err());
    let debug = format!("http://{}", s.addr("debug http://"));
    let config = http(&debug, Method::GET, "/rlconfig", None);
    assert_eq!(config.status, 200);
    assert!(
        config.body.contains("profile.user: unit=MINUTE"),
        "{}",
        config.body
    );
    drop(s);

    // A client that never starts its TLS handshake is closed at --grpc-handshake-timeout.
    let s = serve_rules(
        &rules,
        &[
            "--grpc-tls-cert",
            &cert,
            "--grpc-tls-key",
            &key,
            "--grpc-handshake-timeout",
            "300ms",
        ],
        "native-tls-silent",
    );
    let mut silent = std::net::TcpStream::connect(s.addr("gRPC ")).unwrap();
    silent.set_read_timeout(Some(HANG)).unwrap();
    let mut buf = [0u8; 64];
    let read = std::io::Read::read(&mut silent, &mut buf);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "a silent TLS client was not closed: {read:?}"
    );
    drop(s);

    // The unix socket, from its variable; the debug port from the flag.
    let sock = root.join("native.sock");
    let sock_s = sock.display().to_string();
    let s = Server::start_env(
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--rules",
            &rules,
            "--debug-addr",
            "127.0.0.1:0",
        ],
        &[("TOLLGATE_GRPC_UNIX_SOCKET", &sock_s)],
        &repo(),
        "native-uds",
    );
    assert!(
        s.line.contains(&format!("gRPC unix:{sock_s}")),
        "{}",
        s.line
    );
    let status = runtime_block(async {
        HealthClient::new(unix_channel(&sock).await)
            .check(HealthCheckRequest::default())
            .await
            .map(|r| r.into_inner().status)
            .map_err(|e| e.to_string())
    });
    assert_eq!(status, Ok(serving));
    let debug = format!("http://{}", s.addr("debug http://"));
    assert_eq!(http(&debug, Method::GET, "/stats", None).status, 200);
    drop(s);

    // A certificate without its key (and the reverse) is refused at start, naming both flags.
    for (flag, path) in [("--grpc-tls-cert", &cert), ("--grpc-tls-key", &key)] {
        let out = tollgate(&["serve", "--rules", &rules, flag, path]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--grpc-tls-cert") && err.contains("--grpc-tls-key"),
            "{err}"
        );
    }
    // Under the profile, a flag and the envoy variable that say different things: an error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--profile", "envoy", "--grpc-unix-socket", &sock_s])
        .env("GRPC_UDS", root.join("other.sock"))
        .env("RUNTIME_ROOT", &root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--grpc-unix-socket conflicts with GRPC_UDS"),
        "{err}"
    );
}

#[test]
fn response_dynamic_metadata() {
    let root = runtime("envoy-profile-metadata");
    write(
        &root,
        "limits.yaml",
        "domain: meta
descriptors:
  - key: user
    metadata: {team: {name: payments, tier: 1}, free: true}
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: sliding_window_log}
",
    );
    let (s, grpc) = start(
        &root,
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
        "envoy-profile-metadata",
    );
    let r = should_rate_limit(&grpc, "meta", "frank");
    let m = r.dynamic_metadata.expect("dynamic_metadata");
    let text = format!("{m:?}");
    for part in [
        "\"domain\"",
        "StringValue(\"meta\")",
        "StringValue(\"user=frank\")",
        "\"team\"",
        "StringValue(\"payments\")",
        "BoolValue(true)",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    // Over the limit: the descriptor did not pass, so no rule metadata.
    let r = should_rate_limit(&grpc, "meta", "frank");
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let m = r.dynamic_metadata.expect("dynamic_metadata");
    assert!(m.fields.contains_key("domain"), "{m:?}");
    assert!(!m.fields.contains_key("metadata"), "{m:?}");

    // The same request over gRPC and `/json` carries the same dynamic metadata: envoy's `/json`
    // marshals the gRPC response, `dynamicMetadata` included. A request `hitsAddend`, a
    // descriptor `hitsAddend` (0 is kept: it is set) and a `limit` override (whose descriptor
    // adds no rule metadata).
    let expected = |user: &str| {
        json!({
            "domain": "meta",
            "descriptors": [
                {"entries": [format!("user={user}")]},
                {"entries": [format!("user={user}-o")], "hitsAddend": 0,
                 "limit": "requests_per_unit:5 unit:MINUTE"},
            ],
            "hitsAddend": 1,
            "metadata": {"team": {"name": "payments", "tier": 1}, "free": true},
        })
    };
    let grpc_meta = runtime_block(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("gRPC connect");
        let descriptor = |value: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: value.into(),
            }],
            ..Default::default()
        };
        let mut overridden = descriptor("grace-o");
        overridden.hits_addend =
            Some(tollgate_proto::pb::google::protobuf::UInt64Value { value: 0 });
        overridden.limit = Some(
            tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: 5,
                unit: 2,
            },
        );
        client
            .should_rate_limit(RateLimitRequest {
                domain: "meta".into(),
                descriptors: vec![descriptor("grace"), overridden],
                hits_addend: 1,
            })
            .await
            .expect("ShouldRateLimit")
            .into_inner()
            .dynamic_metadata
            .expect("dynamic_metadata")
    });
    assert_eq!(
        tollgate_server::envoy::pb_struct_json(&grpc_meta),
        expected("grace")
    );
    let r = http(
        &s.base,
        Method::POST,
        "/json",
        Some(json!({
            "domain": "meta",
            "hitsAddend": 1,
            "descriptors": [
                {"entries": [{"key": "user", "value": "heidi"}]},
                {"entries": [{"key": "user", "value": "heidi-o"}], "hitsAddend": "0",
                 "limit": {"requestsPerUnit": 5, "unit": "MINUTE"}},
            ],
        })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["dynamicMetadata"], expected("heidi"), "{}", r.body);
    assert_eq!(body["overallCode"], "OK", "{}", r.body);
    // Over the limit: `/json` too leaves the rule metadata out.
    let r = http(
        &s.base,
        Method::POST,
        "/json",
        Some(
            json!({"domain": "meta", "descriptors": [{"entries": [{"key": "user", "value": "heidi"}]}]}),
        ),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["dynamicMetadata"]["domain"], "meta", "{}", r.body);
    assert!(
        body["dynamicMetadata"].get("metadata").is_none(),
        "{}",
        r.body
    );
}

#[test]
fn merge_domain_config() {
    let root = runtime("envoy-profile-merge");
    write(&root, "a.yaml", RULES);
    write(
        &root,
        "b.yaml",
        "domain: profile
descriptors:
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
",
    );
    let (s, grpc) = start(
        &root,
        &[("MERGE_DOMAIN_CONFIG", "true")],
        "envoy-profile-merge",
    );
    // Both files' descriptors are in the one domain.
    assert_eq!(
        should_rate_limit(&grpc, "profile", "gina").overall_code,
        Code::Ok as i32
    );
    let team = |n: u16| {
        let r = http(
            &s.base,
            Method::POST,
            "/json",
            Some(
                json!({"domain": "profile", "descriptors": [{"entries": [{"key": "team", "value": "t"}]}]}),
            ),
        );
        assert_eq!(r.status, n, "{}", r.body);
    };
    team(200);
    team(429);

    // Without it, two files of one domain stop the start, as envoy's duplicate domain does.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--profile", "envoy"])
        .env("RUNTIME_ROOT", &root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("duplicate domain `profile`"), "{err}");
}

#[test]
fn unhealthy_until_redis_has_answered() {
    let root = runtime("envoy-profile-redis");
    write(&root, "limits.yaml", RULES);
    // Refused until Redis starts there; held meanwhile, so no other server can take it.
    let dead = RefusedPort::new();
    let port = dead.port;
    let url = format!("127.0.0.1:{port}");
    // envoy's own variables name the store (TCP, standalone).
    let (s, grpc) = start(
        &root,
        &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", &url)],
        "envoy-profile-redis",
    );
    // Regression: envoy's empty CACHE_KEY_PREFIX printed `(prefix )` in the start line.
    assert!(
        s.line
            .contains(&format!("store redis://127.0.0.1:{port} (no key prefix)")),
        "{}",
        s.line
    );
    let h = http(&s.base, Method::GET, "/healthcheck", None);
    assert_eq!(h.status, 500, "{}", h.body);
    assert_eq!(
        health(&grpc, "ratelimit"),
        Ok(ServingStatus::NotServing as i32)
    );
    drop(dead);
    let mut redis = tollgate_testsupport::RedisServer::start_on(port, &[]);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let h = http(&s.base, Method::GET, "/healthcheck", None);
        if h.status == 200 && health(&grpc, "ratelimit") == Ok(ServingStatus::Serving as i32) {
            break;
        }
        assert!(Instant::now() < until, "never healthy: {}", s.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    // A later outage does not make it unhealthy (envoy checks Redis once, at start). The
    // sleep is the scenario: an outage that lasts.
    redis.kill();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(http(&s.base, Method::GET, "/healthcheck", None).status, 200);
}

#[test]
fn debug_port_serves_rlconfig_and_stats() {
    let root = runtime("envoy-profile-debug");
    write(&root, "limits.yaml", RULES);
    write(
        &root,
        "more.yaml",
        "domain: debug
descriptors:
  - key: k1
    value: v1
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: k2
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: k3
        rate_limit: {unlimited: true}
",
    );
    let (s, grpc) = start(
        &root,
        &[
            // The hardened listener's limits apply to the debug port too.
            ("TOLLGATE_HEADER_READ_TIMEOUT", "1s"),
        ],
        "envoy-profile-debug",
    );
    // DEBUG_HOST / DEBUG_PORT made the listener (not envoy's default 6070).
    let debug = format!("http://{}", s.addr("debug http://"));
    assert!(debug.starts_with("http://127.0.0.1:"), "{}", s.line);
    assert_ne!(debug, "http://127.0.0.1:6070", "{}", s.line);

    // `/`: the endpoints, as envoy's debug index lists them.
    let index = http(&debug, Method::GET, "/", None);
    assert_eq!(index.status, 200);
    assert_eq!(
        index.body,
        "/rlconfig: print out the currently loaded configuration for debugging\n/stats: print out stats\n"
    );
    // `/rlconfig`: one line per limit in envoy's `Dump` format.
    let config = http(&debug, Method::GET, "/rlconfig", None);
    assert_eq!(config.status, 200);
    for line in [
        "debug.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
        "debug.k2: unit=HOUR requests_per_unit=10, shadow_mode: true, quota_mode: false",
        "debug.k2.k3: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
        "profile.user: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
    ] {
        assert!(
            config.body.lines().any(|l| l == line),
            "{line} in\n{}",
            config.body
        );
    }
    assert_eq!(config.body.lines().count(), 4, "{}", config.body);
    // `/stats`: `name: value` lines of envoy's stat names.
    for _ in 0..4 {
        should_rate_limit(&grpc, "profile", "ivan");
    }
    let stats = http(&debug, Method::GET, "/stats", None);
    assert_eq!(stats.status, 200);
    for line in [
        "ratelimit.service.rate_limit.profile.user.total_hits: 4",
        "ratelimit.service.rate_limit.profile.user.over_limit: 1",
        "ratelimit.service.rate_limit.profile.user.within_limit: 3",
        "ratelimit_server.ShouldRateLimit.total_requests: 4",
        "ratelimit.service.config_load_success: 1",
    ] {
        assert!(
            stats.body.lines().any(|l| l == line),
            "{line} in\n{}",
            stats.body
        );
    }
    assert_eq!(http(&debug, Method::GET, "/debug/pprof/", None).status, 404);
    // A client that never finishes its request head is dropped (header-read timeout).
    let mut conn = std::net::TcpStream::connect(s.addr("debug http://")).unwrap();
    use std::io::{Read, Write};
    conn.write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = Vec::new();
    let read = conn.read_to_end(&mut buf);
    assert!(
        read.is_ok() && !String::from_utf8_lossy(&buf).contains("ratelimit"),
        "{read:?} {:?}",
        String::from_utf8_lossy(&buf)
    );

    // envoy logs a debug port it cannot bind and serves on: so does the profile.
    // The first server holds its debug port: a second one asked for it cannot bind it.
    let port = s.addr("debug http://127.0.0.1:");
    let (s2, grpc2) = start(&root, &[("DEBUG_PORT", &port)], "envoy-profile-debug-taken");
    assert!(!s2.line.contains("debug http://"), "{}", s2.line);
    assert!(
        s2.stderr().contains("cannot open the debug listener"),
        "{}",
        s2.stderr()
    );
    assert_eq!(
        should_rate_limit(&grpc2, "profile", "judy").overall_code,
        Code::Ok as i32
    );
}
