//! `tollgate bench-ceiling http|grpc` (hidden): the same server stacks as `tollgate serve` with
//! the rate limiting taken out, so `tollgate bench` can measure, on the same machine and with
//! the same settings, the most any service on this stack could do.
//!
//! - HTTP: `axum::serve` (as `serve`), `POST /v1/check` reads the body, parses it into the same
//!   [`tollgate_server::CheckRequest`] as the real service (`parse_request`), and answers a fixed
//!   200 OK body. No rules, no store, no response building, no tracing layer.
//! - gRPC: tonic with the `envoy-types` RLS service (as `serve`, TCP_NODELAY too) answering a
//!   constant OK, one OK status per request descriptor.
//!
//! It prints a `listening: ...` line like `serve` so scripts find the port from `--addr ...:0`.

use anyhow::Context;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::net::SocketAddr;
use std::process::ExitCode;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

/// Which ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Bare axum `/v1/check`: parse the JSON body, answer a fixed OK.
    Http,
    /// Bare tonic `ShouldRateLimit`: answer a constant OK.
    Grpc,
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
                axum::serve(listener, tollgate_server::http::ceiling_router())
                    .with_graceful_shutdown(shutdown)
                    .await
                    .context("HTTP ceiling failed")
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn post(body: &str) -> (StatusCode, String) {
        let resp = tollgate_server::http::ceiling_router()
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
