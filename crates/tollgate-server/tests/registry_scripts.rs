//! The registry's Redis scripts against the real Redis, step by step (the end-to-end tests in
//! `crates/tollgate/tests/registry_redis.rs` race real instances; here each case is forced):
//! a write to a registry that lost changes is refused, a write-back happens once and only
//! while Redis is behind, a lost revision key alone is repaired without overwriting newer
//! domains, deleting the last domain keeps the revision, and a domain whose history key is gone
//! is an error rather than a silent drop.

use std::time::Duration;
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_server::registry::storage::redis::RedisRegistry;
use tollgate_server::registry::storage::{Expect, Refused, Version};
use tollgate_testsupport::{cli, shared_url, unique_prefix};

fn version(rules: &str) -> Version {
    Version {
        version: 0,
        updated_at_ms: 1,
        updated_by: "127.0.0.1".into(),
        rules: rules.into(),
    }
}

/// Removes the registry's keys under a prefix when the test ends.
struct Keys(String);

impl Keys {
    fn key(&self, k: &str) -> String {
        format!("{{{}:registry}}:{k}", self.0)
    }

    /// Every registry key gone, as after a `FLUSHALL`.
    fn lose_all(&self) {
        let keys = cli(
            tollgate_testsupport::shared_port(),
            &["--scan", "--pattern", &format!("{{{}:registry}}*", self.0)],
        );
        for k in keys.lines().filter(|k| !k.is_empty()) {
            cli(tollgate_testsupport::shared_port(), &["DEL", k]);
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.lose_all();
    }
}

#[tokio::test]
async fn lost_registries_are_refused_written_back_once_and_repaired() {
    let prefix = unique_prefix("regscripts");
    let keys = Keys(prefix.clone());
    let opts = RedisOptions {
        prefix: prefix.clone(),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(shared_url(), opts).await.unwrap();
    let reg = RedisRegistry::new(store);

    // A new registry: nothing known, nothing stored.
    assert_eq!(reg.load().await.unwrap(), None);
    assert_eq!(
        reg.put("a", &version("A"), Expect::Any, 10, 5, 0)
            .await
            .unwrap()
            .map(|w| w.version),
        Ok(1)
    );
    assert_eq!(
        reg.put("b", &version("B"), Expect::Any, 10, 5, 1)
            .await
            .unwrap()
            .map(|w| w.version),
        Ok(2)
    );
    // The script answers with the version it replaced, read in the same step.
    let written = reg
        .put("a", &version("A2"), Expect::Any, 10, 5, 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(written.version, 3);
    let previous = written.previous.expect("a was at version 1");
    assert_eq!((previous.version, previous.rules.as_str()), (1, "A"));
    let known = reg.load().await.unwrap().unwrap();
    assert_eq!(known.revision, 3);
    assert_eq!(known.domains["a"].versions.len(), 2);

    // Lost: writes from an instance that knows revision 3 are refused, not made on top.
    keys.lose_all();
    assert_eq!(
        reg.put("c", &version("C"), Expect::Any, 10, 5, 3)
            .await
            .unwrap(),
        Err(Refused::Behind)
    );
    assert_eq!(
        reg.delete("a", Expect::Any, 3).await.unwrap(),
        Err(Refused::Behind)
    );
    assert_eq!(
        reg.load().await.unwrap(),
        None,
        "a refused write left nothing"
    );

    // Written back once, history included; a second (racing) write-back does nothing.
    assert_eq!(reg.restore(&known).await.unwrap(), Some(0));
    assert_eq!(reg.restore(&known).await.unwrap(), None);
    assert_eq!(reg.load().await.unwrap().as_ref(), Some(&known));
    // An older snapshot does not overwrite a newer registry.
    let mut older = known.clone();
    older.revision = 2;
    older.domains.remove("b");
    assert_eq!(reg.restore(&older).await.unwrap(), None);
    assert_eq!(reg.load().await.unwrap().as_ref(), Some(&known));
    // Behind: a newer snapshot replaces it wholesale (its deletions included).
    let mut newer = known.clone();
    newer.revision = 5;
    newer.domains.remove("b");
    assert_eq!(reg.restore(&newer).await.unwrap(), Some(3));
    assert_eq!(reg.load().await.unwrap().as_ref(), Some(&newer));
    assert_eq!(
        cli(
            tollgate_testsupport::shared_port(),
            &["EXISTS", &keys.key("history:b")]
        )
        .trim(),
        "0"
    );
    assert_eq!(
        reg.put("c", &version("C"), Expect::Any, 10, 5, 5)
            .await
            .unwrap()
            .map(|w| w.version),
        Ok(6)
    );

    // Only the revision key lost (evicted): the domains hash shows Redis is not behind an
    // older snapshot; the key comes back, nothing is overwritten.
    cli(
        tollgate_testsupport::shared_port(),
        &["DEL", &keys.key("revision")],
    );
    assert_eq!(reg.restore(&newer).await.unwrap(), None);
    assert_eq!(reg.revision().await.unwrap(), Some(6));
    assert_eq!(reg.load().await.unwrap().unwrap().domains.len(), 2);

    // Deleting every domain keeps the revision: an empty registry, not a lost one.
    assert_eq!(reg.delete("a", Expect::Any, 6).await.unwrap(), Ok((7, 3)));
    assert_eq!(reg.delete("c", Expect::Any, 7).await.unwrap(), Ok((8, 6)));
    let empty = reg.load().await.unwrap().unwrap();
    assert_eq!((empty.revision, empty.domains.len()), (8, 0));

    // A domain whose history key is gone is an error (the running rules stay), not a drop.
    assert_eq!(
        reg.put("d", &version("D"), Expect::Any, 10, 5, 8)
            .await
            .unwrap()
            .map(|w| w.version),
        Ok(9)
    );
    cli(
        tollgate_testsupport::shared_port(),
        &["DEL", &keys.key("history:d")],
    );
    let e = reg.load().await.unwrap_err().to_string();
    assert!(e.contains("`d`"), "{e}");
}
