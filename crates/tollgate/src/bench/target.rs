//! Where `tollgate bench` sends requests: `http://host:port` (`POST /v1/check`) or
//! `grpc://host:port` (Envoy RLS v3 `ShouldRateLimit`), and the per-worker clients.
//!
//! HTTP: one keep-alive HTTP/1.1 connection per worker (hyper's connection API, no pool), so
//! `--concurrency` is the number of connections, as with wrk. A connection that fails or times
//! out is dropped and the next request opens a new one. gRPC: a few tonic channels shared by
//! all workers, each multiplexing many calls over one HTTP/2 connection, as Envoy does.

use super::report::Outcome;
use super::workload::Workload;
use anyhow::{bail, Context};
use axum::http::{header, HeaderValue, Request, Uri};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
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
        if !matches!(uri.path(), "" | "/") {
            bail!("target '{url}' must not have a path (HTTP always uses /v1/check)");
        }
        let host = authority.host();
        let addr =
            |default_port: u16| format!("{host}:{}", authority.port_u16().unwrap_or(default_port));
        match uri.scheme_str() {
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
    /// Clients for `workers` workers, connected (a target that is down fails here, not with a
    /// run full of errors).
    pub async fn connect(&self, workers: usize) -> anyhow::Result<Vec<Client>> {
        match self {
            Target::Http { addr, authority } => {
                let mut clients = Vec::with_capacity(workers);
                for _ in 0..workers {
                    let mut c = HttpClient {
                        addr: addr.clone(),
                        authority: authority.clone(),
                        conn: None,
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
}

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

    async fn check(&mut self, body: String) -> Outcome {
        let authority = self.authority.clone();
        let sender = match self.connection().await {
            Ok(s) => s,
            Err(_) => return Outcome::Error("connect".into()),
        };
        if sender.ready().await.is_err() {
            self.conn = None;
            return Outcome::Error("connection_closed".into());
        }
        let req = Request::post("/v1/check")
            .header(header::HOST, authority)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
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
            200 => Outcome::Allowed,
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
    }
}
