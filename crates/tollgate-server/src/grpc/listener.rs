//! The gRPC listener: RLS, Envoy's quota service (RLQS), health and reflection served on connections taken by the shared
//! accept loop (`listener::accept_loop`), over TCP, TLS ([`GrpcTls`]) or a unix socket; health
//! kept in step, and the shutdown.

use super::connection::{connection, Services};
use super::limits::GrpcLimits;
use super::rlqs::QuotaGrpc;
use super::rls::{GrpcAnswers, HealthFn, RateLimitGrpc, RlsServer, RLS_SERVICE_NAME};

use crate::listener::{accept_loop, AcceptLimits, NoDelay, Tls};
use crate::state::AppState;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic_health::ServingStatus;

/// The encoded `FileDescriptorSet` of `envoy.service.ratelimit.v3` and its imports, served by
/// the reflection service (made by protoc from Envoy's proto files: `scripts/gen-rls-descriptors.sh`).
pub const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!("../../proto/rls_descriptor_set.bin");

/// Serve RLS, health and reflection on `listener` until `shutdown` resolves. Health reports
/// SERVING for `""` and for [`RLS_SERVICE_NAME`], and for the extra service of
/// [`GrpcAnswers::health`] as long as it says so.
///
/// Connections are taken by `listener::accept_loop`, as the HTTP listener's, at most
/// `max_connections` at once (at the cap the listener is not accepted from: clients wait in the
/// kernel's backlog; counted in `tollgate_connections_cap_reached_total{listener="grpc"}`), and
/// served by hyper's HTTP/2 server with `limits`.
///
/// At shutdown, the listener closes, health turns NOT_SERVING (open `Watch` streams get it and
/// then end: an open `Watch` is a call that never finishes), every connection gets GOAWAY and
/// in-flight calls finish; after `shutdown_timeout` the connections left (a client that never
/// finishes a call, or only sent the preface and never answers) are dropped, and this returns.
pub async fn serve(
    state: AppState,
    answers: GrpcAnswers,
    listener: TcpListener,
    limits: GrpcLimits,
    max_connections: usize,
    shutdown_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_on(
        state,
        answers,
        GrpcListener::Tcp(listener),
        limits,
        max_connections,
        shutdown_timeout,
        shutdown,
    )
    .await
}

/// Where the gRPC service accepts connections: TCP, or a unix socket (envoyproxy/ratelimit's
/// `GRPC_UDS`).
pub(crate) enum GrpcListener {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A TCP listener, TLS on every connection (envoy profile's `GRPC_SERVER_USE_TLS`).
    Tls(TcpListener, tokio_rustls::TlsAcceptor),
    /// A unix-domain socket listener.
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
}

impl std::fmt::Debug for GrpcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(l) => f.debug_tuple("Tcp").field(l).finish(),
            Self::Tls(l, _) => f.debug_tuple("Tls").field(l).finish_non_exhaustive(),
            #[cfg(unix)]
            Self::Unix(l) => f.debug_tuple("Unix").field(l).finish(),
        }
    }
}

/// [`serve`] on any [`GrpcListener`].
pub(crate) async fn serve_on(
    state: AppState,
    answers: GrpcAnswers,
    listener: GrpcListener,
    limits: GrpcLimits,
    max_connections: usize,
    shutdown_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let (mut reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::Serving)
        .await;
    // The extra service: its status set once here and then only when it changes (a Watch
    // stream gets one message per change, never the same status twice).
    let mut names = vec!["", RLS_SERVICE_NAME];
    let extra_health = match answers.health.clone() {
        Some((name, healthy)) => {
            let now = healthy();
            reporter.set_service_status(name, serving(now)).await;
            names.push(name);
            Some(tokio::spawn(follow_health(
                name,
                healthy,
                reporter.clone(),
                now,
            )))
        }
        None => None,
    };
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let metrics = Arc::clone(&state.metrics().grpc_connections);
    // The request size capped at `--max-body-bytes` like HTTP.
    let max_message = state.limits().max_body_bytes;
    // Envoy's quota service (RLQS), on the same rules.
    let quotas = Arc::new(crate::quota::Quotas::new(
        crate::quota::Bounds::default(),
        Arc::clone(&state.metrics().quota),
    ));
    let rlqs = tollgate_proto::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer::from_arc(
        Arc::new(QuotaGrpc::new(state.clone(), quotas)),
    )
    .max_decoding_message_size(max_message);
    let direct = Arc::new(RateLimitGrpc::new(state, answers));
    let rls = RlsServer::with_codec(Arc::clone(&direct)).max_decoding_message_size(max_message);
    let routes = Routes::new(health)
        .add_service(rls)
        .add_service(rlqs)
        .add_service(reflection().build_v1().map_err(std::io::Error::other)?)
        .add_service(
            reflection()
                .build_v1alpha()
                .map_err(std::io::Error::other)?,
        )
        .prepare();
    let routes = Services {
        routes,
        rls: direct,
        max_message,
    };
    // Past the listener's close and before its connections are told to go: health turns
    // NOT_SERVING, then the statuses are cleared (which ends the open `Watch` streams).
    let on_stop = async move {
        if let Some(task) = extra_health {
            task.abort();
        }
        for &name in &names {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        for &name in &names {
            reporter.clear_service_status(name).await;
        }
    };
    let accept = AcceptLimits {
        kind: "gRPC",
        max_connections,
        shutdown_timeout,
    };
    // One closure per kind of socket (each a stream type of its own); the loop is the same.
    match listener {
        GrpcListener::Tcp(tcp) => {
            let serve = move |s, _, close| connection(s, routes.clone(), limits, close);
            accept_loop(NoDelay(tcp), accept, metrics, shutdown, on_stop, serve).await;
        }
        GrpcListener::Tls(tcp, acceptor) => {
            let tls = Tls {
                listener: tcp,
                acceptor,
                handshake_timeout: limits.handshake_timeout,
            };
            let serve = move |s, _, close| connection(s, routes.clone(), limits, close);
            accept_loop(tls, accept, metrics, shutdown, on_stop, serve).await;
        }
        #[cfg(unix)]
        GrpcListener::Unix(unix) => {
            let serve = move |s, _, close| connection(s, routes.clone(), limits, close);
            accept_loop(unix, accept, metrics, shutdown, on_stop, serve).await;
        }
    }
    Ok(())
}

/// Keep the extra health service `name` in step with `healthy`, checked every 100 ms until
/// aborted.
async fn follow_health(
    name: &'static str,
    healthy: HealthFn,
    reporter: tonic_health::server::HealthReporter,
    mut last: bool,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = healthy();
        if now != last {
            reporter.set_service_status(name, serving(now)).await;
            last = now;
        }
    }
}

/// The health status for `healthy`.
fn serving(healthy: bool) -> ServingStatus {
    if healthy {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// TLS on the gRPC listener: a certificate chain and key (PEM files), and optionally the CAs
/// client certificates must chain to (then a client without a valid certificate is refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcTls {
    /// The server's certificate chain (PEM).
    pub cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub key: std::path::PathBuf,
    /// CA certificates (PEM) that client certificates are verified against; `None`: no client
    /// certificate asked for.
    pub client_ca: Option<std::path::PathBuf>,
}

impl GrpcTls {
    /// The TLS acceptor (ALPN `h2`), or why the files cannot be used.
    pub(crate) fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let read_certs = |path: &std::path::Path| -> Result<Vec<CertificateDer<'static>>, String> {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("{}: no certificate in the file", path.display()));
            }
            Ok(certs)
        };
        let certs = read_certs(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("{}: {e}", self.key.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in read_certs(ca)? {
                    roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("{} and {}: {e}", self.cert.display(), self.key.display()))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}
