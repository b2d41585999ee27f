//! `tollgate bench-ceiling http|grpc` (hidden): the same server stacks as `tollgate serve` with
//! the rate limiting taken out, so `tollgate bench` can measure, on the same machine and with
//! the same settings, the most any service on this stack could do.
//!
//! - HTTP: `axum::serve` (as `serve`), `POST /v1/check` reads the body, parses it into the same
//!   [`tollgate_server::CheckRequest`] as the real service (`parse_request`), and answers a fixed
//!   200 OK body. No rules, no store, no response building, no tracing layer.
//! - gRPC: tonic with the `tollgate-proto` RLS service (as `serve`, TCP_NODELAY too) answering a
//!   constant OK, one OK status per request descriptor.
//!
//! - HTTP floor (`http-floor`): no HTTP stack at all. Each kept-alive connection reads until a
//!   request head and its `Content-Length` body are in, then writes one fixed 200 answer. That is
//!   the least any HTTP/1.1 server does per request (one read, one write), so its CPU per request
//!   is the floor under every HTTP server on this machine, the system calls' share included.
//!   It is a measuring tool, not a server: no header limits, no timeouts, no chunked bodies.
//!
//! It prints a `listening: ...` line like `serve` so scripts find the port from `--addr ...:0`.

use anyhow::Context;
use std::net::SocketAddr;
use std::process::ExitCode;
use tokio::net::TcpListener;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::server::TcpIncoming;

/// Which ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Bare axum `/v1/check`: parse the JSON body, answer a fixed OK.
    Http,
    /// Bare tonic `ShouldRateLimit`: answer a constant OK.
    Grpc,
    /// No HTTP stack: read a request (head and `Content-Length` body), write a fixed 200.
    HttpFloor,
}

/// `tollgate bench-ceiling` flags.
#[derive(Debug, clap::Args)]
pub struct CeilingArgs {
    /// Which server.
    #[arg(value_enum)]
    kind: Kind,
    /// Listen address (port 0: any free port, printed on the `listening` line).
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
}

/// Serve until SIGTERM/SIGINT.
pub fn run(args: &CeilingArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tollgate-ceiling")
        .build()?;
    runtime.block_on(async {
        let shutdown = tollgate_server::serve::shutdown_signal();
        let listener = TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.addr))?;
        let addr = listener.local_addr()?;
        match args.kind {
            Kind::Http => {
                println!("listening: HTTP http://{addr} (ceiling: bare axum /v1/check)");
                axum::serve(listener, http_router())
                    .with_graceful_shutdown(shutdown)
                    .await
                    .context("HTTP ceiling failed")
            }
            Kind::HttpFloor => {
                println!("listening: HTTP http://{addr} (floor: one read, one fixed write)");
                let mut shutdown = std::pin::pin!(shutdown);
                loop {
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            // Best effort, as the other listeners: a failure only costs speed.
                            let _ = stream.set_nodelay(true);
                            tokio::spawn(floor_connection(stream));
                        }
                    }
                }
            }
            Kind::Grpc => {
                println!("listening: gRPC {addr} (ceiling: bare tonic ShouldRateLimit)");
                tonic::transport::Server::builder()
                    .add_service(RateLimitServiceServer::new(ConstantOk))
                    .serve_with_incoming_shutdown(
                        TcpIncoming::from(listener).with_nodelay(Some(true)),
                        shutdown,
                    )
                    .await
                    .context("gRPC ceiling failed")
            }
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The floor's one answer.
const FLOOR_ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

/// Serves one connection of the HTTP floor until the client closes it or sends what it cannot
/// frame (no head end within 64 KiB, no parsable `Content-Length`).
async fn floor_connection(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::with_capacity(8192);
    loop {
        while let Some(len) = floor_request_len(&buf) {
            buf.drain(..len);
            if stream.write_all(FLOOR_ANSWER).await.is_err() {
                return;
            }
        }
        if buf.len() > 64 * 1024 {
            return;
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The length of the first whole request in `buf` (head and body), if it is all there.
fn floor_request_len(buf: &[u8]) -> Option<usize> {
    let head = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let body = buf[..head]
        .split(|&b| b == b'\n')
        .find_map(|line| {
            let (name, value) = line.split_at(line.iter().position(|&b| b == b':')?);
            name.eq_ignore_ascii_case(b"content-length").then(|| {
                std::str::from_utf8(&value[1..])
                    .ok()?
                    .trim()
                    .parse::<usize>()
                    .ok()
            })?
        })
        .unwrap_or(0);
    (buf.len() >= head + body).then_some(head + body)
}

/// `ShouldRateLimit` answering OK to everything.
#[derive(Debug, Clone, Copy)]
struct ConstantOk;

#[tonic::async_trait]
impl RateLimitService for ConstantOk {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let ok = DescriptorStatus {
            code: PbCode::Ok as i32,
            ..DescriptorStatus::default()
        };
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: PbCode::Ok as i32,
            statuses: vec![ok; request.get_ref().descriptors.len()],
            ..RateLimitResponse::default()
        }))
    }
}

/// The HTTP ceiling's service: the same `POST /v1/check` parsing as the service
/// (`parse_request`) and a fixed 200 body the size of
/// one allowed status, with no rules, store, metrics, response building or layers: the most any
/// service on this stack could do.
pub(crate) fn http_router() -> axum::Router {
    /// What tollgate answers for one allowed descriptor.
    const OK_BODY: &str = r#"{"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"name":null,"requests_per_unit":1000000000,"unit":"SECOND"},"limit_remaining":999999999,"duration_until_reset_ms":1,"retry_after_ms":null,"message":null}],"delay_ms":null}"#;
    async fn check(body: axum::body::Bytes) -> axum::response::Response {
        use axum::http::{header, StatusCode};
        use axum::response::IntoResponse;
        use tollgate_server::wire::{parse_request, Dialect};
        match parse_request(&body, Dialect::Native).ok() {
            Some(req) => {
                std::hint::black_box(req);
                ([(header::CONTENT_TYPE, "application/json")], OK_BODY).into_response()
            }
            None => (StatusCode::BAD_REQUEST, "invalid request").into_response(),
        }
    }
    axum::Router::new().route("/v1/check", axum::routing::post(check))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn post(body: &str) -> (StatusCode, String) {
        let resp = http_router()
            .oneshot(
                Request::post("/v1/check")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn http_ceiling_parses_and_answers_ok() {
        let (s, body) =
            post(r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#)
                .await;
        assert_eq!(s, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["overall_code"], "OK");
        // It does parse: a body the real service rejects is rejected here too.
        assert_eq!(post(r#"{"domain":1}"#).await.0, StatusCode::BAD_REQUEST);
        assert_eq!(post("not json").await.0, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn http_floor_frames_requests_by_content_length() {
        let req = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody";
        assert_eq!(floor_request_len(req), Some(req.len()));
        assert_eq!(floor_request_len(&req[..req.len() - 1]), None);
        let mut two = req.to_vec();
        two.extend_from_slice(b"GET / HTTP/1.1\r\ncontent-length:0\r\n\r\n");
        assert_eq!(floor_request_len(&two), Some(req.len()));
        assert_eq!(floor_request_len(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
        assert_eq!(floor_request_len(b"GET / HTTP/1.1\r\n"), None);
    }

    #[tokio::test]
    async fn grpc_ceiling_answers_one_ok_per_descriptor() {
        let req = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![Default::default(), Default::default()],
            hits_addend: 0,
        };
        let resp = ConstantOk
            .should_rate_limit(tonic::Request::new(req))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.overall_code, PbCode::Ok as i32);
        assert_eq!(resp.statuses.len(), 2);
    }
}
