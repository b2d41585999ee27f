//! A keep-alive HTTP/1.1 connection to `tollgate serve` for the load tests: thousands of
//! requests without thousands of sockets.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// A keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    /// Connect to `base` (`http://host:port`).
    pub async fn open(base: &str) -> Conn {
        let host = base.trim_start_matches("http://").to_string();
        let stream = tokio::net::TcpStream::connect(&host).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        Conn { sender, host }
    }

    /// POST /v1/check, sent once the connection is ready; `None` when it failed.
    async fn send(&mut self, body: String) -> Option<hyper::Response<hyper::body::Incoming>> {
        let req = hyper::Request::post("/v1/check")
            .header("host", &self.host)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        if self.sender.ready().await.is_err() {
            return None;
        }
        self.sender.send_request(req).await.ok()
    }

    /// POST /v1/check; the status (0 when the connection failed). The body is read and dropped
    /// (an error reading it is ignored).
    pub async fn status(&mut self, body: String) -> u16 {
        match self.send(body).await {
            Some(r) => {
                let status = r.status().as_u16();
                let _ = r.into_body().collect().await;
                status
            }
            None => 0,
        }
    }

    /// POST /v1/check; the status and the JSON response (0 and null when the connection failed).
    pub async fn check(&mut self, body: String) -> (u16, Value) {
        match self.send(body).await {
            Some(r) => {
                let status = r.status().as_u16();
                let bytes = r.into_body().collect().await.unwrap().to_bytes();
                (
                    status,
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                )
            }
            None => (0, Value::Null),
        }
    }
}
