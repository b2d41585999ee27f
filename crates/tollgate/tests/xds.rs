//! Rules from an xDS management server, from outside: `tollgate serve --rules-from xds://..`
//! (and `--profile envoy` with `CONFIG_TYPE=GRPC_XDS_SOTW`) as a real process subscribed to a
//! real gRPC management server (the programmable one in `support/xds.rs`): rules arrive and
//! decide, an update applies, an invalid update is NACKed naming the domain while the old rules
//! keep deciding, a killed and restarted server finds the stream resumed from the last version,
//! and `/readyz` says "no config yet" until rules arrive.

use serde_json::Value;
use support::client::Method;
use tollgate_proto::pb::envoy::r#type::v3::RateLimitUnit::{Day, Hour, Minute, Second, Unknown};

mod support;
#[path = "support/xds.rs"]
mod xds_server;

use support::*;
use xds_server::{config, XdsServer};

fn serve_xds(xds: &XdsServer, node: &str, name: &str) -> Server {
    let url = format!("xds://{}", xds.addr);
    Server::start(
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--rules-from",
            &url,
            "--xds-node-id",
            node,
        ],
        &repo(),
        name,
    )
}

fn status(base: &str, domain: &str, key: &str, value: &str) -> u16 {
    check(base, domain, key, value).0
}

fn metrics(base: &str) -> String {
    http(base, Method::GET, "/metrics", None).body
}

fn ready(base: &str) -> (u16, Value) {
    let r = http(base, Method::GET, "/readyz", None);
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

#[test]
fn rules_arrive_update_and_a_nack_keeps_the_running_rules() {
    let xds = XdsServer::start(0);
    let s = serve_xds(&xds, "node-a", "xds-basic");
    // No snapshot for this node yet: subscribed, but not ready.
    let sub = xds.wait_for("subscription", |r| r.node == "node-a");
    assert_eq!(sub.version, "");
    assert_eq!(sub.node_metadata.len(), 0);
    let (code, body) = ready(&s.base);
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["reason"], "no rules from the xDS server yet");

    xds.set("node-a", "v1", vec![config("shop", &[("user", Minute, 2)])]);
    xds.wait_ack("v1");
    assert_eq!(ready(&s.base).0, 200);
    assert_eq!(status(&s.base, "shop", "user", "ann"), 200);
    assert_eq!(status(&s.base, "shop", "user", "ann"), 200);
    assert_eq!(status(&s.base, "shop", "user", "ann"), 429);
    let m = metrics(&s.base);
    assert!(
        m.contains("tollgate_xds_config_info{version=\"v1\"} 1"),
        "{m}"
    );
    assert!(m.contains("tollgate_xds_connected 1"), "{m}");

    // An update: a new domain and a higher limit, in force once ACKed.
    xds.set(
        "node-a",
        "v2",
        vec![
            config("shop", &[("user", Minute, 3)]),
            config("search", &[("ip", Hour, 1)]),
        ],
    );
    xds.wait_ack("v2");
    // Counters carry over a change of limit: ann used 3 of 3 (the denied hit is not counted).
    assert_eq!(status(&s.base, "shop", "user", "ann"), 200);
    assert_eq!(status(&s.base, "shop", "user", "ann"), 429);
    assert_eq!(status(&s.base, "search", "ip", "1.2.3.4"), 200);
    assert_eq!(status(&s.base, "search", "ip", "1.2.3.4"), 429);

    // Invalid: a limit without a unit. NACKed naming the domain; v2 keeps deciding.
    let mut bad = config("shop", &[("user", Unknown, 1000)]);
    bad.name = "shop-rules".into();
    xds.set(
        "node-a",
        "v3",
        vec![bad, config("search", &[("ip", Day, 1000)])],
    );
    let error = xds.wait_nack();
    assert!(error.contains("domain \"shop\""), "{error}");
    assert!(error.contains("unit"), "{error}");
    let nack = xds.wait_for("NACK", |r| r.error.is_some());
    assert_eq!(nack.version, "v2", "a NACK names the version still applied");
    assert_eq!(status(&s.base, "search", "ip", "1.2.3.4"), 429);
    assert_eq!(status(&s.base, "shop", "user", "bob"), 200);
    let m = metrics(&s.base);
    assert!(
        m.contains("tollgate_xds_config_info{version=\"v2\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_xds_updates_total{result=\"rejected\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_xds_updates_total{result=\"applied\"} 2"),
        "{m}"
    );
    assert!(s.stderr().contains("NACK"), "{}", s.stderr());

    // Fixed: applied.
    xds.set(
        "node-a",
        "v4",
        vec![config("shop", &[("user", Second, 1000)])],
    );
    xds.wait_ack("v4");
    assert_eq!(status(&s.base, "shop", "user", "ann"), 200);
    assert_eq!(
        status(&s.base, "search", "ip", "1.2.3.4"),
        200,
        "search is gone"
    );
}

#[test]
fn a_killed_server_leaves_the_last_rules_deciding_and_the_stream_resumes() {
    let xds = XdsServer::start(0);
    let port: u16 = xds.addr.rsplit(':').next().unwrap().parse().unwrap();
    xds.set("node-r", "1", vec![config("pay", &[("card", Minute, 1)])]);
    let s = serve_xds(&xds, "node-r", "xds-restart");
    xds.wait_ack("1");
    assert_eq!(status(&s.base, "pay", "card", "c1"), 200);
    xds.kill();

    // Decisions go on with the last rules while the server is away.
    assert_eq!(status(&s.base, "pay", "card", "c1"), 429);
    assert_eq!(status(&s.base, "pay", "card", "c2"), 200);
    assert_eq!(ready(&s.base).0, 200, "rules once received stay ready");

    // Back on the same port, with the same version: the client resumes from "1", so nothing is
    // sent again; then a new version applies on the resumed stream.
    let xds = XdsServer::start(port);
    xds.set("node-r", "1", vec![config("pay", &[("card", Minute, 1)])]);
    let resumed = xds.wait_for("resubscription", |r| r.node == "node-r");
    assert_eq!(
        resumed.version, "1",
        "the new stream names the last version applied"
    );
    xds.set("node-r", "2", vec![config("pay", &[("card", Minute, 5)])]);
    xds.wait_ack("2");
    assert_eq!(status(&s.base, "pay", "card", "c1"), 200);
    let m = metrics(&s.base);
    assert!(m.contains("tollgate_xds_streams_total 2"), "{m}");
}
