//! gRPC server reflection on a real `tollgate serve`: the services are listed, and Envoy's RLS
//! descriptors (with their imports) are served, so `grpcurl localhost:8081 list` and
//! `grpcurl -d ... localhost:8081 envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
//! need no proto files. Checked with a reflection client (v1, and v1alpha which older grpcurl
//! versions use).

mod support;

use support::{repo, Server};
use tonic_reflection::pb::{v1, v1alpha};

const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn start() -> (Server, String) {
    let server = Server::start(
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
        &repo(),
        "grpc-reflection",
    );
    let grpc = format!("http://{}", server.addr("gRPC "));
    (server, grpc)
}

#[test]
fn reflection_v1_lists_services_and_serves_rls_descriptors() {
    let (_server, grpc) = start();
    runtime().block_on(async {
        use v1::server_reflection_client::ServerReflectionClient;
        use v1::server_reflection_request::MessageRequest;
        use v1::server_reflection_response::MessageResponse;
        let channel = tonic::transport::Channel::from_shared(grpc).unwrap();
        let mut client = ServerReflectionClient::new(channel.connect().await.unwrap());
        let ask = |m: MessageRequest| v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let requests = vec![
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(RLS.into())),
            // An import of rls.proto: a client resolves every type by asking for them.
            ask(MessageRequest::FileByFilename(
                "envoy/extensions/common/ratelimit/v3/ratelimit.proto".into(),
            )),
        ];
        let mut answers = client
            .server_reflection_info(tokio_stream_iter(requests))
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(a) = answers.message().await.unwrap() {
            got.push(a.message_response.unwrap());
        }
        assert_eq!(got.len(), 3);
        let MessageResponse::ListServicesResponse(list) = &got[0] else {
            panic!("{:?}", got[0]);
        };
        let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        for want in [
            RLS,
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
        ] {
            assert!(names.contains(&want), "{names:?}");
        }
        for (answer, file) in got[1..].iter().zip([
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        ]) {
            let MessageResponse::FileDescriptorResponse(files) = answer else {
                panic!("{answer:?}");
            };
            let file = file.as_bytes();
            assert!(
                files
                    .file_descriptor_proto
                    .iter()
                    .any(|f| f.windows(file.len()).any(|w| w == file)),
                "{answer:?}"
            );
        }
    });
}

#[test]
fn reflection_v1alpha_lists_services() {
    let (_server, grpc) = start();
    runtime().block_on(async {
        use v1alpha::server_reflection_client::ServerReflectionClient;
        use v1alpha::server_reflection_request::MessageRequest;
        use v1alpha::server_reflection_response::MessageResponse;
        let channel = tonic::transport::Channel::from_shared(grpc).unwrap();
        let mut client = ServerReflectionClient::new(channel.connect().await.unwrap());
        let request = v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = client
            .server_reflection_info(tokio_stream_iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("{answer:?}");
        };
        assert!(list.service.iter().any(|s| s.name == RLS), "{list:?}");
    });
}

/// A finite request stream (the reflection call is bidirectional).
fn tokio_stream_iter<T: Send + 'static>(
    items: Vec<T>,
) -> impl tonic::codegen::tokio_stream::Stream<Item = T> + Send + 'static {
    tonic::codegen::tokio_stream::iter(items)
}
