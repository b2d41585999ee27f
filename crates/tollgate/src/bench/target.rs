//! Where `tollgate bench` sends requests: `http://host:port` (`POST /v1/check`),
//! `grpc://host:port` (Envoy RLS v3 `ShouldRateLimit`) or `http://host:port/any/path` (`GET` of
//! that path with the `--header`s: forward-auth, `/v1/forward-auth/{domain}`, or a gateway in
//! front of an API; with `--body`, a `POST` of that JSON body instead, e.g. another rate
//! limiter's own check API), and the per-worker clients.
//!
//! HTTP: one keep-alive HTTP/1.1 connection per worker (hyper's connection API, no pool), so
//! `--concurrency` is the number of connections, as with wrk. A connection that fails or times
//! out is dropped and the next request opens a new one. gRPC: a few tonic channels shared by
//! all workers, each multiplexing many calls over one HTTP/2 connection, as Envoy does.

use super::report::Outcome;
use super::workload::Workload;
use anyhow::{bail, Context};
use axum::http::{header, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::net::TcpStream;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

/// Most gRPC channels (HTTP/2 connections) opened, whatever the concurrency.
const MAX_GRPC_CHANNELS: usize = 4;

/// A parsed target URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `http://host:port`: POST `/v1/check`.
    Http {
        /// `host:port` to connect to.
        addr: String,
        /// The `Host` header (a `HeaderValue`: cloned per request for a refcount, not a copy).
        authority: HeaderValue,
    },
    /// `grpc://host:port`: Envoy RLS v3.
    Grpc {
        /// `host:port` to connect to.
        addr: String,
    },
    /// `http://host:port/path`: GET `path` (with its query) and the `--header`s; 2xx is
    /// allowed, 429 denied.
    Get {
        /// `host:port` to connect to.
        addr: String,
        /// The `Host` header.
        authority: HeaderValue,
        /// Path and query.
        path: String,
        /// `--header` name and value templates (`{key}` replaced per request).
        headers: Vec<(header::HeaderName, String)>,
        /// `--body`: POST this JSON body template (`{key}` replaced per request) instead.
        body: Option<String>,
    },
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;

    fn from_str(url: &str) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .with_context(|| format!("invalid target URL '{url}'"))?;
        let authority = uri
            .authority()
            .with_context(|| format!("target '{url}' has no host:port"))?;
        if uri.path() == "/v1/check" {
            bail!("target '{url}': leave the path out, http://host:port posts to /v1/check (a path means GET that path)");
        }
        let host = authority.host();
        let addr =
            |default_port: u16| format!("{host}:{}", authority.port_u16().unwrap_or(default_port));
        match uri.scheme_str() {
            Some("http") if !matches!(uri.path(), "" | "/") => Ok(Target::Get {
                addr: addr(80),
                authority: HeaderValue::from_str(authority.as_str())
                    .with_context(|| format!("target '{url}': host is not a valid Host header"))?,
                path: uri
                    .path_and_query()
                    .map_or("/".to_string(), |p| p.as_str().to_string()),
                headers: Vec::new(),
                body: None,
            }),
            Some("http") => Ok(Target::Http {
                addr: addr(80),
                authority: HeaderValue::from_str(authority.as_str())
                    .with_context(|| format!("target '{url}': host is not a valid Host header"))?,
            }),
            Some("grpc") => Ok(Target::Grpc { addr: addr(8081) }),
            _ => bail!("target must start with http:// or grpc://, got '{url}'"),
        }
    }
}

impl Target {
    /// The same target sending `headers` (`Name: value`, `{key}` replaced per request): GET
    /// targets only.
    pub fn with_headers(mut self, headers: &[String]) -> anyhow::Result<Self> {
        let Target::Get { headers: h, .. } = &mut self else {
            if headers.is_empty() {
                return Ok(self);
            }
            bail!("--header only applies to a GET target (http://host:port/path)");
        };
        for text in headers {
            let (name, value) = text
                .split_once(':')
                .with_context(|| format!("--header '{text}' is not `Name: value`"))?;
            let name = header::HeaderName::from_bytes(name.trim().as_bytes())
                .with_context(|| format!("--header '{text}': invalid header name"))?;
            let value = value.trim().to_string();
            HeaderValue::from_str(&value.replace("{key}", "0"))
                .with_context(|| format!("--header '{text}': invalid header value"))?;
            h.push((name, value));
        }
        Ok(self)
    }

    /// The same target POSTing `body` (`{key}` replaced per request) as JSON: path targets
    /// only.
    pub fn with_body(mut self, body: Option<&str>) -> anyhow::Result<Self> {
        let Some(text) = body else {
            return Ok(self);
        };
        let Target::Get { body: b, .. } = &mut self else {
            bail!("--body only applies to a target with a path (http://host:port/path)");
        };
        *b = Some(text.to_string());
        Ok(self)
    }

    /// Clients for `workers` workers, connected (a target that is down fails here, not with a
    /// run full of errors).
    pub async fn connect(&self, workers: usize) -> anyhow::Result<Vec<Client>> {
        match self {
            Target::Http { addr, authority }
            | Target::Get {
                addr, authority, ..
            } => {
                let get = match self {
                    Target::Get {
                        path,
                        headers,
                        body,
                        ..
                    } => Some(Arc::new((path.clone(), headers.clone(), body.clone()))),
                    _ => None,
                };
                let mut clients = Vec::with_capacity(workers);
                for _ in 0..workers {
                    let mut c = HttpClient {
                        addr: addr.clone(),
                        authority: authority.clone(),
                        conn: None,
                        get: get.clone(),
                    };
                    c.connection()
                        .await
                        .with_context(|| format!("cannot connect to http://{addr}"))?;
                    clients.push(Client::Http(c));
                }
                Ok(clients)
            }
            Target::Grpc { addr } => {
                let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true);
                let mut channels = Vec::new();
                for _ in 0..workers.clamp(1, MAX_GRPC_CHANNELS) {
                    channels.push(
                        endpoint
                            .connect()
                            .await
                            .with_context(|| format!("cannot connect to grpc://{addr}"))?,
                    );
                }
                Ok((0..workers)
                    .map(|i| {
                        Client::Grpc(RateLimitServiceClient::new(
                            channels[i % channels.len()].clone(),
                        ))
                    })
                    .collect())
            }
        }
    }
}

/// One worker's client.
#[derive(Debug)]
pub enum Client {
    /// A keep-alive HTTP/1.1 connection (reopened after a failure).
    Http(HttpClient),
    /// A handle on a shared gRPC channel.
    Grpc(RateLimitServiceClient<Channel>),
}

impl Client {
    /// Send the request for `key` and classify the answer. A timeout is the caller's (the
    /// future is dropped); call [`Client::reset`] after one.
    pub async fn call(&mut self, workload: &Workload, key: u64) -> Outcome {
        match self {
            Client::Http(c) if c.get.is_some() => c.get(key).await,
            Client::Http(c) => c.check(workload.http_body(key)).await,
            Client::Grpc(c) => match c.should_rate_limit(workload.grpc_request(key)).await {
                Ok(resp) => match PbCode::try_from(resp.get_ref().overall_code) {
                    Ok(PbCode::Ok) => Outcome::Allowed,
                    Ok(PbCode::OverLimit) => Outcome::Denied,
                    _ => Outcome::Error("grpc_unknown_overall_code".into()),
                },
                Err(status) => Outcome::Error(format!(
                    "grpc_{}",
                    format!("{:?}", status.code()).to_lowercase()
                )),
            },
        }
    }

    /// Forget a connection whose request was abandoned (HTTP/1 cannot reuse it).
    pub fn reset(&mut self) {
        if let Client::Http(c) = self {
            c.conn = None;
        }
    }
}

/// One HTTP/1.1 keep-alive connection.
#[derive(Debug)]
pub struct HttpClient {
    addr: String,
    authority: HeaderValue,
    conn: Option<SendRequest<Full<Bytes>>>,
    /// GET targets: the path and the header templates.
    get: Option<Arc<GetSpec>>,
}

/// A path target's path, `--header` templates and `--body` template.
type GetSpec = (String, Vec<(header::HeaderName, String)>, Option<String>);

impl HttpClient {
    async fn connection(&mut self) -> anyhow::Result<&mut SendRequest<Full<Bytes>>> {
        if self.conn.as_ref().is_none_or(|c| c.is_closed()) {
            let stream = TcpStream::connect(&self.addr).await?;
            stream.set_nodelay(true)?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.conn = Some(sender);
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    async fn get(&mut self, key: u64) -> Outcome {
        let Some(spec) = self.get.clone() else {
            return Outcome::Error("not_a_get_target".into());
        };
        let key = key.to_string();
        let (mut req, body) = match &spec.2 {
            None => (Request::get(spec.0.as_str()), Bytes::new()),
            Some(template) => (
                Request::post(spec.0.as_str()).header(header::CONTENT_TYPE, "application/json"),
                Bytes::from(template.replace("{key}", &key)),
            ),
        };
        req = req.header(header::HOST, self.authority.clone());
        for (name, template) in &spec.1 {
            let value = if template.contains("{key}") {
                template.replace("{key}", &key)
            } else {
                template.clone()
            };
            req = req.header(name, value);
        }
        match req.body(Full::new(body)) {
            Ok(req) => self.send(req).await,
            Err(_) => Outcome::Error("invalid_request".into()),
        }
    }

    async fn check(&mut self, body: String) -> Outcome {
        let req = Request::post("/v1/check")
            .header(header::HOST, self.authority.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
        self.send(req).await
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Outcome {
        let sender = match self.connection().await {
            Ok(s) => s,
            Err(_) => return Outcome::Error("connect".into()),
        };
        if sender.ready().await.is_err() {
            self.conn = None;
            return Outcome::Error("connection_closed".into());
        }
        let resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(_) => {
                self.conn = None;
                return Outcome::Error("io".into());
            }
        };
        let status = resp.status().as_u16();
        // Read the body to the end so the connection can carry the next request.
        if resp.into_body().collect().await.is_err() {
            self.conn = None;
            return Outcome::Error("io".into());
        }
        match status {
            200..=299 => Outcome::Allowed,
            429 => Outcome::Denied,
            s => Outcome::Error(format!("http_{s}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        let http = |addr: &str, authority: &'static str| Target::Http {
            addr: addr.into(),
            authority: HeaderValue::from_static(authority),
        };
        for (url, want) in [
            (
                "http://127.0.0.1:8080",
                http("127.0.0.1:8080", "127.0.0.1:8080"),
            ),
            ("http://localhost/", http("localhost:80", "localhost")),
            ("http://[::1]:9", http("[::1]:9", "[::1]:9")),
            (
                "grpc://rls:8081",
                Target::Grpc {
                    addr: "rls:8081".into(),
                },
            ),
        ] {
            assert_eq!(url.parse::<Target>().unwrap(), want, "{url}");
        }
        for bad in [
            "ftp://x:1",
            "127.0.0.1:8080",
            "http://x:1/v1/check",
            "grpc://",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
        let get = "http://127.0.0.1:8080/v1/forward-auth/web?deny_status=403"
            .parse::<Target>()
            .unwrap()
            .with_headers(&["X-Api-Key: k{key}".into()])
            .unwrap();
        match get {
            Target::Get {
                path,
                headers,
                body,
                ..
            } => {
                assert_eq!(body, None);
                assert_eq!(path, "/v1/forward-auth/web?deny_status=403");
                assert_eq!(headers[0].0.as_str(), "x-api-key");
                assert_eq!(headers[0].1, "k{key}");
            }
            other => panic!("{other:?}"),
        }
        assert!("http://x:1"
            .parse::<Target>()
            .unwrap()
            .with_headers(&["a: b".into()])
            .is_err());
    }
}
