//! A programmable xDS management server for the tests: the aggregated discovery service's
//! state-of-the-world stream for `RateLimitConfig` resources, serving per-node snapshots the
//! test sets (and replaces) on demand, recording every request (subscriptions, ACKs, NACKs with
//! their `error_detail`, the stream's metadata) so a test can wait for the event it needs.
//!
//! It behaves as a go-control-plane snapshot cache does for one type: a response when the
//! node's snapshot version differs from the version the client last acknowledged, one response
//! in flight at a time (the next waits for the ACK or NACK of the previous nonce), and a NACKed
//! version is not sent again until the snapshot changes. It runs on its own runtime, so
//! [`XdsServer::kill`] drops every stream at once as a killed process would.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tollgate_proto::pb::envoy::r#type::v3::RateLimitUnit;
use tollgate_proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tollgate_proto::pb::google::protobuf::Any;
use tollgate_proto::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RATE_LIMIT_CONFIG_TYPE,
};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{http, BoxFuture, Service};

const PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub node: String,
    pub version: String,
    pub nonce: String,
    /// The NACK's `error_detail.message`.
    pub error: Option<String>,
    /// The stream's gRPC metadata.
    pub metadata: HashMap<String, String>,
    /// The node's metadata (string values).
    pub node_metadata: HashMap<String, String>,
}

#[derive(Default)]
struct Shared {
    snapshots: Mutex<HashMap<String, (String, Vec<RateLimitConfig>)>>,
    seen: Mutex<Vec<Seen>>,
    arrived: Condvar,
}

/// A running management server.
pub struct XdsServer {
    pub addr: String,
    shared: Arc<Shared>,
    changes: watch::Sender<u64>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl XdsServer {
    /// Serve plain gRPC on `127.0.0.1:port` (0: a free port).
    pub fn start(port: u16) -> XdsServer {
        Self::start_with(port, None)
    }

    /// Serve gRPC over TLS (`tls`: the server's settings, e.g. requiring a client certificate)
    /// on `127.0.0.1:port`.
    pub fn start_tls(port: u16, tls: rustls::ServerConfig) -> XdsServer {
        Self::start_with(port, Some(Arc::new(tls)))
    }

    fn start_with(port: u16, tls: Option<Arc<rustls::ServerConfig>>) -> XdsServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("bind the xDS server");
        let addr = listener.local_addr().unwrap().to_string();
        let shared = Arc::new(Shared::default());
        let (changes, _) = watch::channel(0u64);
        let svc = Ads {
            shared: shared.clone(),
            changes: changes.clone(),
        };
        runtime.spawn(async move {
            match tls {
                None => {
                    let incoming =
                        tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let _ = tonic::transport::Server::builder()
                        .add_service(svc)
                        .serve_with_incoming(incoming)
                        .await;
                }
                Some(tls) => {
                    // Handshakes here; only the connections that pass reach the gRPC server.
                    let (tx, rx) = mpsc::channel(16);
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    tokio::spawn(async move {
                        while let Ok((tcp, _)) = listener.accept().await {
                            let acceptor = acceptor.clone();
                            let tx = tx.clone();
                            tokio::spawn(async move {
                                if let Ok(stream) = acceptor.accept(tcp).await {
                                    let _ = tx.send(Ok::<_, std::io::Error>(Tls(stream))).await;
                                }
                            });
                        }
                    });
                    let _ = tonic::transport::Server::builder()
                        .add_service(svc)
                        .serve_with_incoming(ReceiverStream::new(rx))
                        .await;
                }
            }
        });
        XdsServer {
            addr,
            shared,
            changes,
            runtime: Some(runtime),
        }
    }

    /// Serve `configs` as version `version` to `node` (replacing its snapshot).
    pub fn set(&self, node: &str, version: &str, configs: Vec<RateLimitConfig>) {
        self.shared
            .snapshots
            .lock()
            .unwrap()
            .insert(node.to_owned(), (version.to_owned(), configs));
        self.changes.send_modify(|n| *n += 1);
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// Wait until a request matches `pred`, and return it. The deadline only turns a hang into a
    /// failure.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = self.shared.seen.lock().unwrap();
        loop {
            if let Some(s) = seen.iter().find(|s| pred(s)) {
                return s.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "xDS server: no {what}; saw {seen:#?}");
            seen = self.shared.arrived.wait_timeout(seen, left).unwrap().0;
        }
    }

    /// Wait for the ACK of `version`.
    pub fn wait_ack(&self, version: &str) -> Seen {
        self.wait_for(&format!("ACK of {version}"), |s| {
            s.version == version && !s.nonce.is_empty() && s.error.is_none()
        })
    }

    /// Wait for a NACK, and return its error.
    pub fn wait_nack(&self) -> String {
        self.wait_for("NACK", |s| s.error.is_some()).error.unwrap()
    }

    /// Stop at once, dropping every stream (as a killed process).
    pub fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A TLS connection as tonic's server takes one.
struct Tls(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for Tls {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for Tls {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Tls {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Server TLS for `dir`'s `server.pem` / `server.key`, requiring a client certificate signed by
/// `ca.pem`, speaking `h2`.
pub fn mutual_tls(dir: &std::path::Path) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let certs = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

#[derive(Clone)]
struct Ads {
    shared: Arc<Shared>,
    changes: watch::Sender<u64>,
}

impl tonic::server::NamedService for Ads {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> Service<http::Request<B>> for Ads
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let method = Stream(self.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.streaming(method, req).await)
        })
    }
}

struct Stream(Ads);

impl tonic::server::StreamingService<DiscoveryRequest> for Stream {
    type Response = DiscoveryResponse;
    type ResponseStream = ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;

    fn call(
        &mut self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Self::Future {
        let ads = self.0.clone();
        Box::pin(async move {
            let metadata: HashMap<String, String> = request
                .metadata()
                .iter()
                .filter_map(|kv| match kv {
                    tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                        Some((k.to_string(), v.to_str().unwrap_or_default().to_owned()))
                    }
                    _ => None,
                })
                .collect();
            let inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(16);
            tokio::spawn(serve_stream(ads, metadata, inbound, tx));
            Ok(tonic::Response::new(ReceiverStream::new(rx)))
        })
    }
}

async fn serve_stream(
    ads: Ads,
    metadata: HashMap<String, String>,
    mut inbound: tonic::Streaming<DiscoveryRequest>,
    out: mpsc::Sender<Result<DiscoveryResponse, tonic::Status>>,
) {
    let mut changes = ads.changes.subscribe();
    let mut node: Option<String> = None;
    let mut client_version = String::new();
    let mut pending: Option<(String, String)> = None; // (nonce, version)
    let mut nacked: Option<String> = None;
    let mut seq = 0u64;
    loop {
        tokio::select! {
            r = inbound.message() => {
                let Ok(Some(req)) = r else { return };
                let n = req.node.clone().unwrap_or_default();
                let node_metadata = n
                    .metadata
                    .map(|m| {
                        m.fields
                            .into_iter()
                            .filter_map(|(k, v)| match v.kind {
                                Some(tollgate_proto::pb::google::protobuf::value::Kind::StringValue(s)) => Some((k, s)),
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                {
                    let mut seen = ads.shared.seen.lock().unwrap();
                    seen.push(Seen {
                        node: n.id.clone(),
                        version: req.version_info.clone(),
                        nonce: req.response_nonce.clone(),
                        error: req.error_detail.as_ref().map(|e| e.message.clone()),
                        metadata: metadata.clone(),
                        node_metadata,
                    });
                    ads.shared.arrived.notify_all();
                }
                if node.is_none() {
                    node = Some(n.id);
                    client_version = req.version_info;
                } else if pending.as_ref().is_some_and(|(nonce, _)| *nonce == req.response_nonce) {
                    let (_, version) = pending.take().unwrap();
                    if req.error_detail.is_some() {
                        nacked = Some(version);
                    }
                    client_version = req.version_info;
                }
            }
            r = changes.changed() => {
                if r.is_err() { return }
                nacked = None;
            }
        }
        let Some(node) = &node else { continue };
        if pending.is_some() {
            continue;
        }
        let snapshot = ads.shared.snapshots.lock().unwrap().get(node).cloned();
        let Some((version, configs)) = snapshot else {
            continue;
        };
        if version == client_version || nacked.as_ref() == Some(&version) {
            continue;
        }
        seq += 1;
        let nonce = seq.to_string();
        let response = DiscoveryResponse {
            version_info: version.clone(),
            resources: configs
                .iter()
                .map(|c| Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    value: prost::Message::encode_to_vec(c),
                })
                .collect(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: nonce.clone(),
            ..DiscoveryResponse::default()
        };
        if out.send(Ok(response)).await.is_err() {
            return;
        }
        pending = Some((nonce, version));
    }
}

/// A `RateLimitConfig` named after its domain, with one flat descriptor per `(key, unit,
/// requests_per_unit)`.
pub fn config(domain: &str, limits: &[(&str, RateLimitUnit, u32)]) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.to_owned(),
        domain: domain.to_owned(),
        descriptors: limits
            .iter()
            .map(|(key, unit, n)| RateLimitDescriptor {
                key: (*key).to_owned(),
                rate_limit: Some(RateLimitPolicy {
                    unit: *unit as i32,
                    requests_per_unit: *n,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
    }
}

/// An envoyproxy/ratelimit YAML rules document as a `RateLimitConfig` (named after its
/// domain): how a control plane would carry the same rules.
pub fn config_from_yaml(text: &str) -> RateLimitConfig {
    use yaml_rust2::{Yaml, YamlLoader};
    fn descriptor(y: &Yaml) -> RateLimitDescriptor {
        let s = |k: &str| y[k].as_str().unwrap_or_default().to_owned();
        let b = |k: &str| y[k].as_bool().unwrap_or(false);
        let rate_limit = match &y["rate_limit"] {
            Yaml::BadValue => None,
            r => Some(RateLimitPolicy {
                unit: r["unit"]
                    .as_str()
                    .map_or(0, |u| unit(&u.to_ascii_uppercase())),
                requests_per_unit: r["requests_per_unit"].as_i64().unwrap_or(0) as u32,
                unlimited: r["unlimited"].as_bool().unwrap_or(false),
                name: r["name"].as_str().unwrap_or_default().to_owned(),
                replaces: r["replaces"]
                    .as_vec()
                    .map(|v| {
                        v.iter()
                            .map(|x| tollgate_proto::pb::ratelimit::config::ratelimit::v3::RateLimitReplace {
                                name: x["name"].as_str().unwrap_or_default().to_owned(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
        };
        RateLimitDescriptor {
            key: s("key"),
            value: match &y["value"] {
                Yaml::Integer(i) => i.to_string(),
                v => v.as_str().unwrap_or_default().to_owned(),
            },
            rate_limit,
            descriptors: y["descriptors"]
                .as_vec()
                .map(|v| v.iter().map(descriptor).collect())
                .unwrap_or_default(),
            shadow_mode: b("shadow_mode"),
            detailed_metric: b("detailed_metric"),
            quota_mode: b("quota_mode"),
            metadata: None,
        }
    }
    let doc = &YamlLoader::load_from_str(text).expect("YAML")[0];
    let domain = doc["domain"].as_str().unwrap_or_default().to_owned();
    RateLimitConfig {
        name: domain.clone(),
        domain,
        descriptors: doc["descriptors"]
            .as_vec()
            .map(|v| v.iter().map(descriptor).collect())
            .unwrap_or_default(),
    }
}

fn unit(name: &str) -> i32 {
    [
        RateLimitUnit::Second,
        RateLimitUnit::Minute,
        RateLimitUnit::Hour,
        RateLimitUnit::Day,
        RateLimitUnit::Week,
        RateLimitUnit::Month,
        RateLimitUnit::Year,
    ]
    .into_iter()
    .find(|u| u.as_str_name() == name)
    .map_or(0, |u| u as i32)
}

/// `openssl` with `args` in `dir`.
fn openssl(dir: &std::path::Path, args: &[&str]) {
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

/// In `dir`: a CA (`ca.pem`), a server certificate for `localhost` and a client certificate
/// (`server.pem`/`.key`, `client.pem`/`.key`), both signed by the CA.
pub fn certificates(dir: &std::path::Path) {
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
        "/CN=xds-test-ca",
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
