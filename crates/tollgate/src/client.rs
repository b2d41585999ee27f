//! A minimal HTTP/1.1 client (plain `http://` only) for `tollgate check` and the tests: one
//! request per connection over hyper's connection API, no pool, no TLS.

use anyhow::{bail, Context};
pub use axum::http::Method;
use axum::http::{header, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

/// A response, fully read.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers (names lower-case), in order.
    pub headers: Vec<(String, String)>,
    /// Body as text (lossy UTF-8).
    pub body: String,
}

impl HttpResponse {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Send `method` to `base` (e.g. `http://127.0.0.1:8080`) + `path` with an optional JSON body.
pub async fn send(
    base: &str,
    method: Method,
    path: &str,
    json: Option<String>,
    timeout: Duration,
) -> anyhow::Result<HttpResponse> {
    send_with(
        base,
        method,
        path,
        json.map(|j| ("application/json", j)),
        &[],
        timeout,
    )
    .await
}

/// [`send`] with a body of any content type (`(content type, body)`) and extra headers
/// (`Authorization`, `If-Match`, ...).
pub async fn send_with(
    base: &str,
    method: Method,
    path: &str,
    body: Option<(&str, String)>,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> anyhow::Result<HttpResponse> {
    let content_type = body.as_ref().map(|(t, _)| t.to_string());
    let json = body.map(|(_, b)| b);
    let extra: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: Uri = url
        .parse()
        .with_context(|| format!("invalid URL '{url}'"))?;
    if uri.scheme_str() != Some("http") {
        bail!("only http:// URLs are supported, got '{base}'");
    }
    let host = uri.host().context("URL has no host")?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| host.clone());
    let path_q = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let fut = async move {
        let addr = format!(
            "{}:{port}",
            host.trim_start_matches('[').trim_end_matches(']')
        );
        let stream = TcpStream::connect(&addr)
            .await
            .with_context(|| format!("cannot connect to {base}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake failed")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path_q)
            .header(header::HOST, authority);
        for (k, v) in &extra {
            req = req.header(k.as_str(), v.as_str());
        }
        let body = match json {
            Some(j) => {
                if let Some(t) = &content_type {
                    req = req.header(header::CONTENT_TYPE, t.as_str());
                }
                Full::new(Bytes::from(j))
            }
            None => Full::new(Bytes::new()),
        };
        let resp = sender
            .send_request(req.body(body)?)
            .await
            .context("request failed")?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("cannot read response body")?
            .to_bytes();
        Ok(HttpResponse {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {base} within {timeout:?}"))?
}
