//! envoyproxy/ratelimit's `REDIS_*` variables, translated by `tollgate_server::envoy::redis`, run
//! against private `redis-server`s: a unix socket with a password, and TCP with an ACL user.
//! `--on-store-error deny` makes a store that cannot be reached visible (every request denied),
//! and the counters are looked up in that Redis.

mod support;

use serde_json::json;
use std::collections::HashMap;
use support::client::Method;
use support::{http, serve_store, temp_dir};
use tollgate_server::envoy::redis::redis_from_env;
use tollgate_testsupport::RedisServer;

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Serve with the store mapped from `vars`, send three hits on a 2/minute limit.
fn three_hits(name: &str, vars: &[(&str, &str)]) -> Vec<u16> {
    let mapped = redis_from_env(&env(vars)).expect("mapping");
    let dir = temp_dir(name);
    std::fs::write(dir.join("api.yaml"), RULES).unwrap();
    let rules = dir.display().to_string();
    let server = serve_store(
        &rules,
        &mapped.store,
        &["--on-store-error", "deny", "--redis-timeout-ms", "2000"],
        name,
    );
    assert!(
        !server.line.contains("s3cret") && !server.stderr().contains("s3cret"),
        "password leaked: {}\n{}",
        server.line,
        server.stderr()
    );
    (0..3)
        .map(|_| {
            let body = json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "bob"}]}]});
            http(&server.base, Method::POST, "/v1/check", Some(body)).status
        })
        .collect()
}

#[test]
fn unix_socket_with_password_from_envoy_variables() {
    let dir = temp_dir("envoy-redis-unix");
    let sock = dir.join("redis.sock").display().to_string();
    let redis = RedisServer::start(&[
        "--unixsocket",
        &sock,
        "--unixsocketperm",
        "700",
        "--requirepass",
        "s3cret",
    ]);
    let statuses = three_hits(
        "envoy-redis-unix",
        &[
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_URL", &sock),
            ("REDIS_AUTH", "s3cret"),
        ],
    );
    assert_eq!(statuses, [200, 200, 429]);
    let keys = redis.cli(&["-a", "s3cret", "--no-auth-warning", "DBSIZE"]);
    assert_ne!(keys.trim(), "0", "no counter in the unix-socket Redis");
}

#[test]
fn tcp_with_acl_user_and_password_from_envoy_variables() {
    let redis = RedisServer::start(&["--user", "rl", "on", ">s3cret", "~*", "&*", "+@all"]);
    let url = format!("127.0.0.1:{}", redis.port);
    let statuses = three_hits(
        "envoy-redis-acl",
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &url),
            ("REDIS_AUTH", "rl:s3cret"),
        ],
    );
    assert_eq!(statuses, [200, 200, 429]);
    let keys = redis.cli(&[
        "--user",
        "rl",
        "--pass",
        "s3cret",
        "--no-auth-warning",
        "DBSIZE",
    ]);
    assert_ne!(keys.trim(), "0", "no counter in Redis");
}
