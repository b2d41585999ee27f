//! Rules from an xDS management server: a state-of-the-world subscription to
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resources on the aggregated discovery
//! service's stream, as envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW` takes them.
//!
//! Each response holds every domain. Its resources become the same rule sources a rules file
//! would be (one per resource, in envoy's YAML layout: `domain`, `descriptors`), parsed and
//! validated by the same code, so a domain means over xDS what it means in a file. A valid
//! response is swapped in atomically, as a file reload is (requests in flight finish on the rules
//! they started with), then ACKed with its version and nonce; an invalid one is NACKed with an
//! `error_detail` naming the domain and what is wrong, and the running rules stay. A lost stream
//! is opened again after a backoff and subscribes with the last version applied.

use crate::metrics::RuleSlots;
use crate::state::{AppState, LoadedRules, ReloadError};
pub use crate::xds_status::XdsStatus;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tollgate_core::clock::{Clock, SystemClock};
use tollgate_core::rules::RuleSet;
use tollgate_proto::pb::envoy::config::core::v3::Node;
use tollgate_proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tollgate_proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tollgate_proto::pb::google::protobuf::{value::Kind, Any, Struct, Value};
use tollgate_proto::pb::google::rpc::Status;
use tollgate_proto::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RATE_LIMIT_CONFIG_TYPE,
};

/// How to reach the management server and how to behave when it is away.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct XdsConfig {
    /// `host:port` of the management server.
    pub server: String,
    /// The node id the server keys its snapshots by.
    pub node_id: String,
    /// The node's metadata (string values).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the stream.
    pub headers: Vec<(String, String)>,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// The wait between attempts to connect (jittered by ±50 %), as envoyproxy/ratelimit's
    /// dialer retries (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`).
    pub connect_retry: Duration,
    /// The wait before opening again a stream that was open and was lost.
    pub backoff: Backoff,
    /// Largest response accepted, in bytes (`None`: tonic's 4 MiB).
    pub max_message_size: Option<usize>,
    /// Ready before the first configuration arrives (envoy's
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub force_start: bool,
    /// TLS to the server (`None`: plain gRPC).
    pub tls: Option<XdsTls>,
}

/// TLS to the management server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdsTls {
    /// CA bundle the server's certificate must chain to (`None`: the system's,
    /// /etc/ssl/certs/ca-certificates.crt).
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM), sent when the server asks for one.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry (`None`: the host of the server address).
    pub server_name: Option<String>,
}

impl XdsConfig {
    /// A subscription to `server` (`host:port`) as `node_id`, with envoyproxy/ratelimit's
    /// defaults for the rest.
    pub fn new(server: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            node_id: node_id.into(),
            node_metadata: Vec::new(),
            headers: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            connect_retry: Duration::from_secs(3),
            backoff: Backoff::default(),
            max_message_size: None,
            force_start: false,
            tls: None,
        }
    }
}

/// Exponential backoff between connection attempts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Each wait is the previous one times this.
    pub factor: f64,
    /// Randomise each wait between half and all of it.
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true,
        }
    }
}

impl Backoff {
    /// tollgate's own: from half a second, doubling, up to 30 s, jittered.
    pub fn native() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: true,
        }
    }

    /// The wait before attempt `n` (0-based), as envoyproxy/ratelimit's backoff computes it:
    /// `initial × factor^n`, with jitter a uniform draw between `initial` and that, kept within
    /// `initial..=max`. (So its default factor, 0.5, waits `initial` every time.)
    fn delay(&self, n: u32, random: f64) -> Duration {
        let min = self.initial.as_secs_f64();
        let max = self.max.as_secs_f64().max(min);
        let mut secs = min * self.factor.max(0.0).powi(n.min(64) as i32);
        if self.jitter {
            secs = random.clamp(0.0, 1.0) * (secs - min) + min;
        }
        Duration::from_secs_f64(secs.clamp(min, max))
    }
}

/// The task that keeps the subscription until `shutdown` turns true, reporting to the status
/// held in `state` (attached here if the server did not attach it when it built the state).
pub fn start(
    state: &AppState,
    config: XdsConfig,
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let status = match state.xds() {
        Some(s) => s.clone(),
        None => {
            let s = Arc::new(XdsStatus::new(config.server.clone(), config.force_start));
            state.set_xds(s.clone());
            s
        }
    };
    run(state.clone(), config, status, shutdown)
}

async fn run(
    state: AppState,
    config: XdsConfig,
    status: Arc<XdsStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut attempt = 0u32;
    let mut seed = SystemClock.now().max(1);
    loop {
        let mut opened = false;
        let ended = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            r = session(&state, &config, &status, &mut attempt, &mut opened) => r,
        };
        status.connected.store(false, Relaxed);
        // xorshift: jitter needs no more than this.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let random = (seed % 10_000) as f64 / 10_000.0;
        let delay = if opened {
            // A stream that was open and was lost: the backoff.
            let d = config.backoff.delay(attempt, random);
            attempt = attempt.saturating_add(1);
            d
        } else {
            // Not connected: try again after the retry interval, ±50 %.
            config.connect_retry.mul_f64(0.5 + random)
        };
        tracing::warn!(
            server = %config.server,
            // What the server said is its text, not ours: escaped.
            error = %ended.escape_debug(),
            was_open = opened,
            retry_in = ?delay,
            "xDS stream to the rules server ended; reconnecting"
        );
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One stream, until it fails: returns why.
async fn session(
    state: &AppState,
    config: &XdsConfig,
    status: &XdsStatus,
    attempt: &mut u32,
    opened: &mut bool,
) -> String {
    let endpoint =
        match tonic::transport::Endpoint::from_shared(format!("http://{}", config.server)) {
            Ok(e) => e.connect_timeout(config.connect_timeout),
            Err(e) => return format!("bad server address {}: {e}", config.server),
        };
    let connected = match &config.tls {
        None => endpoint.connect().await,
        Some(tls) => match tls_connector(&config.server, tls) {
            Ok(connector) => endpoint.connect_with_connector(connector).await,
            Err(e) => return format!("TLS settings: {e}"),
        },
    };
    let channel = match connected {
        Ok(c) => c,
        Err(e) => return format!("cannot connect: {}", error_chain(&e)),
    };
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    if let Some(n) = config.max_message_size {
        client = client.max_decoding_message_size(n);
    }
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
    let node = node(config);
    // Resume: the first request names the version last applied.
    let _ = tx
        .send(request(&node, status.version(), String::new(), None))
        .await;
    let outgoing =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut req = tonic::Request::new(outgoing);
    for (k, v) in &config.headers {
        match (
            tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            v.parse(),
        ) {
            (Ok(key), Ok(value)) => {
                req.metadata_mut().insert(key, value);
            }
            _ => {
                tracing::warn!(header = %k.escape_debug(), "xDS client header not valid as gRPC metadata; not sent")
            }
        }
    }
    let mut responses = match client.stream_aggregated_resources(req).await {
        Ok(r) => r.into_inner(),
        Err(e) => return format!("stream refused: {}", e.message()),
    };
    status.connected.store(true, Relaxed);
    status.streams.fetch_add(1, Relaxed);
    *opened = true;
    tracing::info!(server = %config.server, node = %config.node_id.escape_debug(), "xDS stream to the rules server open");
    loop {
        let response = match responses.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return "the server closed the stream".into(),
            Err(e) => return format!("stream failed: {}", e.message()),
        };
        *attempt = 0;
        if response.type_url != RATE_LIMIT_CONFIG_TYPE {
            // Not ours (an aggregated stream may carry other types): refuse it without touching
            // the rules.
            let detail = format!("unexpected resource type {}", response.type_url);
            let _ = tx
                .send(request(
                    &node,
                    status.version(),
                    response.nonce.clone(),
                    Some(detail),
                ))
                .await;
            continue;
        }
        // Validation and the swap are CPU work: off the runtime's threads, as a file reload.
        let applied = {
            let (state, response) = (state.clone(), response.clone());
            tokio::task::spawn_blocking(move || apply(&state, &response))
                .await
                .unwrap_or_else(|e| Err(format!("rules could not be applied: {e}")))
        };
        let reply = match applied {
            Ok(()) => {
                *status.version.lock().unwrap_or_else(|e| e.into_inner()) =
                    response.version_info.clone();
                status.has_config.store(true, Relaxed);
                status.applied.fetch_add(1, Relaxed);
                request(&node, response.version_info.clone(), response.nonce, None)
            }
            Err(detail) => {
                status.rejected.fetch_add(1, Relaxed);
                // As a failed file reload: shown by `GET /v1/rules`, counted as a failed reload.
                state.set_reload_error(ReloadError {
                    at: SystemClock.now(),
                    errors: vec![detail.clone()],
                });
                state.metrics().reload(false);
                tracing::error!(
                    version = %response.version_info.escape_debug(),
                    error = %detail.escape_debug(),
                    "rules from the xDS server refused (NACK); keeping the running rules"
                );
                request(&node, status.version(), response.nonce, Some(detail))
            }
        };
        if tx.send(reply).await.is_err() {
            return "the request stream closed".into();
        }
    }
}

/// A connector that dials `server` and speaks TLS (ALPN `h2`) as `tls` says.
fn tls_connector(
    server: &str,
    tls: &XdsTls,
) -> Result<
    impl tower::Service<
            tonic::codegen::http::Uri,
            Response = hyper_util::rt::TokioIo<
                tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
            >,
            Error = std::io::Error,
            Future = impl Send,
        > + Send
        + 'static,
    String,
> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let read_certs = |path: &std::path::Path| -> Result<Vec<CertificateDer<'static>>, String> {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no PEM certificate", path.display()));
        }
        Ok(certs)
    };
    let ca = tls
        .ca
        .clone()
        .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"));
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(&ca)? {
        roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    let mut client = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(read_certs(cert)?, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("a client certificate needs both its file and its key".into()),
    };
    client.alpn_protocols = vec![b"h2".to_vec()];
    let host = match &tls.server_name {
        Some(name) => name.clone(),
        None => server
            .rsplit_once(':')
            .map_or(server, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    };
    let name = ServerName::try_from(host.clone())
        .map_err(|e| format!("{host}: not a valid server name: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let server = server.to_owned();
    Ok(tower::service_fn(move |_uri| {
        let connector = connector.clone();
        let name = name.clone();
        let server = server.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(&server).await?;
            let stream = connector.connect(name, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        }
    }))
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let _ = write!(s, ": {c}");
        cur = c.source();
    }
    s
}

fn node(config: &XdsConfig) -> Node {
    let fields = config
        .node_metadata
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Value {
                    kind: Some(Kind::StringValue(v.clone())),
                },
            )
        })
        .collect();
    Node {
        id: config.node_id.clone(),
        metadata: Some(Struct { fields }),
        user_agent_name: "tollgate".into(),
        user_agent_version: env!("CARGO_PKG_VERSION").into(),
        ..Node::default()
    }
}

fn request(node: &Node, version: String, nonce: String, error: Option<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version,
        node: Some(node.clone()),
        resource_names: Vec::new(),
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        response_nonce: nonce,
        error_detail: error.map(|message| Status {
            // INVALID_ARGUMENT
            code: 3,
            message,
            details: Vec::new(),
        }),
    }
}

/// Validate `response` and swap its rules in, or say what is wrong.
fn apply(state: &AppState, response: &DiscoveryResponse) -> Result<(), String> {
    let sources = sources(&response.resources)?;
    let _update = state.rules_update_lock();
    let running = state.rules();
    let set = RuleSet::from_read_sources(&sources, Vec::new(), state.rule_listing())
        .map_err(|errors| {
            errors
                .iter()
                .map(|e| format!("{}: {}", e.file, e.message))
                .collect::<Vec<_>>()
                .join("; ")
        })?
        .with_defaults(running.set.defaults());
    let problems = state.backend().unsupported(&set);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let generation = running.generation + 1;
    let version = response.version_info.clone();
    tracing::info!(
        version = %version.escape_debug(),
        generation,
        domains = set.domains().count(),
        limits = set.limits().count(),
        "rules from the xDS server applied"
    );
    drop(running);
    state.swap_rules(LoadedRules {
        counters: RuleSlots::new(&set),
        stats: crate::stats::StatSlots::new(&set),
        set,
        hash: version,
        generation,
        loaded_at: SystemClock.now(),
        file_sources: sources.into(),
    });
    state.metrics().reload(true);
    state.stats().reloaded(state.now(), generation, &[]);
    Ok(())
}

/// Rule sources, one per resource, named after its domain and resource name (what an error
/// message names), in envoy's YAML layout.
fn sources(resources: &[Any]) -> Result<Vec<(String, String)>, String> {
    resources
        .iter()
        .enumerate()
        .map(|(i, any)| {
            if any.type_url != RATE_LIMIT_CONFIG_TYPE {
                return Err(format!(
                    "resource {i}: unexpected type {}",
                    any.type_url.escape_debug()
                ));
            }
            let config = <RateLimitConfig as prost::Message>::decode(any.value.as_slice())
                .map_err(|e| format!("resource {i}: not a RateLimitConfig: {e}"))?;
            let name = format!(
                "domain \"{}\" (resource \"{}\")",
                config.domain.escape_debug(),
                config.name.escape_debug()
            );
            let doc = serde_json::json!({
                "domain": config.domain,
                "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
            });
            Ok((name, serde_json::to_string_pretty(&doc).unwrap_or_default()))
        })
        .collect()
}

/// One descriptor as a rules file writes it: only the fields set, so defaults are the file's.
fn descriptor(d: &RateLimitDescriptor) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        m.insert("value".into(), d.value.clone().into());
    }
    if let Some(p) = &d.rate_limit {
        let mut r = serde_json::Map::new();
        // Proto3 has no "unset": unit 0 (UNKNOWN) is no unit, and a count of 0 beside
        // `unlimited` is no count, as envoyproxy/ratelimit reads them.
        if p.unit != 0 {
            let unit = tollgate_proto::pb::envoy::r#type::v3::RateLimitUnit::try_from(p.unit)
                .map(|u| u.as_str_name().to_ascii_lowercase())
                .unwrap_or_else(|_| p.unit.to_string());
            r.insert("unit".into(), unit.into());
        }
        if !(p.unlimited && p.requests_per_unit == 0) {
            r.insert("requests_per_unit".into(), p.requests_per_unit.into());
        }
        if p.unlimited {
            r.insert("unlimited".into(), true.into());
        }
        if !p.name.is_empty() {
            r.insert("name".into(), p.name.clone().into());
        }
        if !p.replaces.is_empty() {
            r.insert(
                "replaces".into(),
                p.replaces
                    .iter()
                    .map(|x| serde_json::json!({"name": x.name}))
                    .collect::<Vec<_>>()
                    .into(),
            );
        }
        m.insert("rate_limit".into(), r.into());
    }
    for (flag, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            m.insert(flag.into(), true.into());
        }
    }
    if let Some(meta) = &d.metadata {
        m.insert("metadata".into(), struct_json(meta));
    }
    if !d.descriptors.is_empty() {
        m.insert(
            "descriptors".into(),
            d.descriptors
                .iter()
                .map(descriptor)
                .collect::<Vec<_>>()
                .into(),
        );
    }
    m.into()
}

fn struct_json(s: &Struct) -> serde_json::Value {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_json(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn value_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into)
        }
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value_json).collect::<Vec<_>>().into(),
    }
}

/// The rules a server starts with before the first configuration: none.
pub(crate) fn initial_rules(defaults: tollgate_core::rules::RuleDefaults) -> LoadedRules {
    LoadedRules {
        hash: "none".into(),
        ..LoadedRules::inline(RuleSet::empty().with_defaults(defaults))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_envoys() {
        let envoy = Backoff::default();
        for n in 0..5 {
            assert_eq!(envoy.delay(n, 0.7), Duration::from_secs(10));
        }
        let b = Backoff {
            jitter: false,
            ..Backoff::native()
        };
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(500));
        assert_eq!(b.delay(1, 0.0), Duration::from_secs(1));
        assert_eq!(b.delay(20, 0.0), Duration::from_secs(30));
        let j = Backoff::native();
        assert_eq!(j.delay(3, 0.0), Duration::from_millis(500));
        assert_eq!(j.delay(3, 1.0), Duration::from_secs(4));
    }
}
