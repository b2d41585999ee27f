//! The layer in a tonic server, called over a real HTTP/2 channel: the client address comes from
//! tonic's `TcpConnectInfo`, allowed calls carry the rate-limit headers as metadata, and a
//! denied call is RESOURCE_EXHAUSTED with the rule's message, `retry-after` and the same headers.

use tokio::net::TcpListener;
use tollgate_tower::{RateLimitLayer, RuleSet};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const RULES: &str = r#"
domain: grpc
http:
  - actions: [{remote_address: {}}, {request_headers: {header_name: ":path", descriptor_key: method}}]
descriptors:
  - key: remote_address
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 2}
        message: "2 health checks per minute"
"#;

#[tokio::test]
async fn resource_exhausted_with_the_message_and_headers_over_a_real_channel() {
    let rules = RuleSet::from_sources(&[("rules.yaml".into(), RULES.into())]).unwrap();
    let layer = RateLimitLayer::builder()
        .rules(rules, "grpc")
        .build()
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    for remaining in ["1", "0"] {
        let ok = client
            .check(HealthCheckRequest::default())
            .await
            .expect("allowed");
        let md = ok.metadata();
        assert_eq!(md.get("x-ratelimit-limit").unwrap(), "2");
        assert_eq!(md.get("x-ratelimit-remaining").unwrap(), remaining);
        assert_eq!(md.get("ratelimit-policy").unwrap(), "2;w=60");
    }
    let denied = client
        .check(HealthCheckRequest::default())
        .await
        .expect_err("the third call is over the limit");
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert_eq!(denied.message(), "2 health checks per minute");
    let md = denied.metadata();
    assert_eq!(md.get("x-ratelimit-remaining").unwrap(), "0");
    let retry: u64 = md
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(md.get("ratelimit").is_some());
    server.abort();
}
