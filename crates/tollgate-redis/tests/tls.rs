//! `rediss://`: TLS to a throwaway TLS-only `redis-server` whose certificate is signed by a
//! test CA. The client trusts the platform roots, which honour `SSL_CERT_FILE`; this test runs in
//! its own process, so pointing that variable at the test CA affects nothing else.

mod support;

use support::RedisServer;
use tollgate_core::{Algorithm, CheckItem, Quota, Unit};
use tollgate_redis::{RedisOptions, RedisStore};

#[tokio::test]
async fn rediss_connects_and_checks() {
    let (server, ca) = RedisServer::start_tls();
    // Set before the first TLS connection builds its root store (read once, at that point).
    std::env::set_var("SSL_CERT_FILE", &ca);
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let store = RedisStore::connect(&url, RedisOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.ping().await.unwrap();
    let q = Quota::new(2, Unit::Minute).with_algorithm(Algorithm::FixedWindow);
    let item = CheckItem::hit("r", "tls", &q);
    let allowed: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(store.check(None, &[item]).await.unwrap()[0].allowed);
        }
        v
    };
    assert_eq!(allowed, [true, true, false]);
    // Plain redis:// to a TLS port fails cleanly.
    let plain = format!("redis://127.0.0.1:{}", server.port);
    assert!(RedisStore::connect(&plain, RedisOptions::default())
        .await
        .is_err());
}
