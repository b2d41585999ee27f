//! A `serve` whose start fails returns its error with nothing left running in the process: no
//! listener bound before the failing step is still listening (or serving), whichever step fails
//! (a port taken, a registry that cannot start). In a process of its own (this file's only
//! test): it counts every listening socket the process holds.

use std::net::TcpListener;
use tollgate_server::envoy::stats::{EnvoyStats, PrometheusSettings};
use tollgate_server::envoy::EnvoyConfig;
use tollgate_server::serve::{serve, ServeConfig};

/// The ports of the TCP sockets this process listens on.
fn listening_ports() -> Vec<u16> {
    let ours: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.display().to_string())
        .collect();
    let mut ports: Vec<u16> = tollgate_testsupport::tcp_sockets()
        .into_iter()
        .filter(|s| s.listening && ours.contains(&format!("socket:[{}]", s.inode)))
        .map(|s| s.local_port)
        .collect();
    ports.sort_unstable();
    ports
}

#[test]
fn a_failed_start_leaves_no_listener() {
    let dir = tollgate_testsupport::temp_dir("failed-start");
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    // The port the envoy metrics page is told to take, held by the test.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let held_addr = held.local_addr().unwrap();
    let mut base = ServeConfig::default();
    base.listeners.http_addr = Some("127.0.0.1:0".parse().unwrap());
    base.listeners.grpc_addr = Some("127.0.0.1:0".parse().unwrap());
    base.listeners.debug_addr = Some("127.0.0.1:0".parse().unwrap());
    base.rules.path = rules;
    let mut no_token = base.clone();
    no_token.registry = tollgate_server::registry::RegistryConfig {
        token_file: Some(dir.join("no-such-token")),
        ..Default::default()
    };
    let failing = [
        (
            "cannot listen for envoy metrics",
            base.clone(),
            EnvoyConfig::with_stats(EnvoyStats {
                prometheus: Some(PrometheusSettings {
                    addr: held_addr,
                    path: "/metrics".into(),
                }),
                ..EnvoyStats::default()
            }),
        ),
        (
            "cannot start the rule registry",
            no_token,
            EnvoyConfig::default(),
        ),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let before = listening_ports();
    assert_eq!(before, vec![held_addr.port()]);
    for (expected, config, envoy) in failing {
        let result = runtime.block_on(serve(config, envoy, std::future::pending(), |bound| {
            panic!("a start that fails reported its listeners bound: {bound:?}")
        }));
        let err = format!("{:#}", result.expect_err("the start fails"));
        assert!(err.contains(expected), "{err}");
        // Nothing listens but the test's own socket: the HTTP, gRPC and debug listeners bound
        // before the failure are closed, and none was left serving on the runtime (which
        // still runs whatever `serve` spawned).
        assert_eq!(listening_ports(), before, "{expected}");
    }
}
