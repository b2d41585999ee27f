//! The rule registry on Redis, end to end with real `tollgate serve` processes and real Redis:
//! three instances share one registry (a limit registered on one limits on the others; the
//! propagation time of 20 changes is measured and printed, not asserted); a change whose
//! announcement was missed is caught by polling; a restart keeps the registered domains; an
//! instance keeps its running rules while Redis is down, and one started while Redis is down
//! serves the registered limits from its local snapshot. When Redis loses the registry
//! (restarted empty, `FLUSHALL`), the instances write it back and nothing registered is lost;
//! an instance started from a stale snapshot does not bring back a domain deleted while it was
//! away; deleting every domain is not taken for a loss; the registry works on a Redis
//! Cluster (polled; its keys in one slot); and concurrent writes over two instances each get
//! an answer that describes their own write.

mod support;

use std::path::Path;
use std::time::Duration;
use support::registry::*;
use support::*;
use tollgate_testsupport::{cli, unique_prefix, Cluster, RedisServer};

/// Generous bound on "every instance applies a change within 1 s" on a loaded test machine.
const PROPAGATION_WAIT: Duration = Duration::from_secs(15);

/// `tollgate serve` on `store` with key prefix `prefix`, the admin token, and a registry
/// snapshot directory `snapshot`.
fn instance(dir: &Path, store: &str, prefix: &str, snapshot: &str, name: &str) -> Server {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, "domain: files\n").unwrap();
    let snapshot = dir.join(snapshot);
    serve_registry(
        dir,
        &rules,
        &[
            "--store",
            store,
            "--redis-prefix",
            prefix,
            "--registry-dir",
            snapshot.to_str().unwrap(),
        ],
        name,
    )
}

/// Removes the registry's keys under a prefix from the shared Redis when the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let keys = cli(
            tollgate_testsupport::shared_port(),
            &["--scan", "--pattern", &format!("{{{}:registry}}*", self.0)],
        );
        for k in keys.lines().filter(|k| !k.is_empty()) {
            cli(tollgate_testsupport::shared_port(), &["DEL", k]);
        }
        tollgate_testsupport::delete_prefix(tollgate_testsupport::shared_url(), &self.0);
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn three_instances_share_the_registry() {
    let prefix = unique_prefix("registry3");
    let _cleanup = Cleanup(prefix.clone());
    let dir = temp_dir("registry-3");
    let store = tollgate_testsupport::shared_url();
    let a = instance(&dir, store, &prefix, "snap-a", "registry-3a");
    let b = instance(&dir, store, &prefix, "snap-b", "registry-3b");
    let c = instance(&dir, store, &prefix, "snap-c", "registry-3c");
    let others = [&b, &c];

    // Register on A: A limits at once, B and C soon after; the count is shared.
    let r = put(&a.base, "shop", &user_limit("shop", 3), None);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(current_limit(&a.base, "shop", "ann"), Some(3));
    for s in others {
        let waited = wait_for(PROPAGATION_WAIT, || {
            current_limit(&s.base, "shop", "ann") == Some(3)
        });
        assert!(
            waited.is_some(),
            "not applied on {}:\n{}",
            s.base,
            s.stderr()
        );
    }
    assert_eq!(check(&a.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&b.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&c.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&b.base, "shop", "user", "ann").0, 429);
    // B's snapshot directory holds the domain.
    assert!(dir.join("snap-b/domains/shop.json").exists());

    // 20 changes, each from another instance in turn: how long until all three serve it.
    let servers = [&a, &b, &c];
    let mut times = Vec::new();
    for i in 0..20u64 {
        let limit = 100 + i;
        let writer = servers[i as usize % 3];
        let r = put(&writer.base, "shop", &user_limit("shop", limit), None);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(current_limit(&writer.base, "shop", "ann"), Some(limit));
        let mut slowest = Duration::ZERO;
        for s in servers {
            let waited = wait_for(PROPAGATION_WAIT, || {
                current_limit(&s.base, "shop", "ann") == Some(limit)
            })
            .unwrap_or_else(|| panic!("change {i} not applied on {}:\n{}", s.base, s.stderr()));
            slowest = slowest.max(waited);
        }
        times.push(slowest);
    }
    let max = *times.iter().max().unwrap();
    let med = median(&mut times);
    println!(
        "registry propagation across 3 instances over 20 changes: median {:.1} ms, max {:.1} ms",
        med.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );

    // Roll back from history on C, delete on B: applied everywhere.
    let h = body(&admin_get(&c.base, "/v1/domains/shop/history"));
    let oldest = h["versions"].as_array().unwrap().last().unwrap()["rules"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(put(&c.base, "shop", &oldest, None).status, 200);
    // 21 versions were written; the history keeps the last 10: limits 119 down to 110.
    assert!(oldest.contains("requests_per_unit: 110"), "{oldest}");
    for s in servers {
        assert!(
            wait_for(PROPAGATION_WAIT, || current_limit(&s.base, "shop", "ann")
                == Some(110))
            .is_some()
        );
    }
    assert_eq!(delete(&b.base, "shop").status, 200);
    for s in servers {
        assert!(
            wait_for(PROPAGATION_WAIT, || current_limit(&s.base, "shop", "ann")
                .is_none())
            .is_some(),
            "delete not applied on {}",
            s.base
        );
    }
    assert!(!dir.join("snap-a/domains/shop.json").exists());

    // A stale If-Match is refused by the shared registry whichever instance is asked.
    assert_eq!(
        put(&a.base, "shop", &user_limit("shop", 5), None).status,
        201
    );
    let v = body(&admin_get(&a.base, "/v1/domains/shop"))["version"].clone();
    let stale = format!("\"{}\"", v.as_u64().unwrap() - 1);
    assert!(
        wait_for(PROPAGATION_WAIT, || current_limit(&c.base, "shop", "ann")
            == Some(5))
        .is_some()
    );
    assert_eq!(
        put(&c.base, "shop", &user_limit("shop", 6), Some(&stale)).status,
        412
    );
    // Registry keys have no TTL.
    let ttl = cli(
        tollgate_testsupport::shared_port(),
        &["TTL", &format!("{{{prefix}:registry}}:revision")],
    );
    assert_eq!(ttl.trim(), "-1");
}

#[test]
fn a_change_whose_message_was_missed_is_polled() {
    let prefix = unique_prefix("registrypoll");
    let _cleanup = Cleanup(prefix.clone());
    let dir = temp_dir("registry-poll");
    let a = instance(
        &dir,
        tollgate_testsupport::shared_url(),
        &prefix,
        "snap",
        "registry-poll",
    );
    assert_eq!(
        put(&a.base, "shop", &user_limit("shop", 3), None).status,
        201
    );
    // Another writer changes the registry without announcing it (as if the message was lost).
    // The revision key is bumped last: the instance may poll between these commands (a real
    // writer changes all three in one script), and must not see the new revision before the
    // version it names exists.
    let tag = format!("{{{prefix}:registry}}");
    let rev = cli(
        tollgate_testsupport::shared_port(),
        &["GET", &format!("{tag}:revision")],
    );
    let rev = rev.trim().parse::<u64>().unwrap() + 1;
    let version = serde_json::json!({
        "version": rev,
        "updated_at_ms": 1,
        "updated_by": "elsewhere",
        "rules": user_limit("shop", 42),
    });
    cli(
        tollgate_testsupport::shared_port(),
        &[
            "LPUSH",
            &format!("{tag}:history:shop"),
            &version.to_string(),
        ],
    );
    cli(
        tollgate_testsupport::shared_port(),
        &["HSET", &format!("{tag}:domains"), "shop", &rev.to_string()],
    );
    cli(
        tollgate_testsupport::shared_port(),
        &["SET", &format!("{tag}:revision"), &rev.to_string()],
    );
    let waited = wait_for(PROPAGATION_WAIT, || {
        current_limit(&a.base, "shop", "ann") == Some(42)
    });
    assert!(waited.is_some(), "{}", a.stderr());
}

#[test]
fn restarts_and_redis_outages_keep_registered_limits() {
    let mut redis = RedisServer::start(&[]);
    let prefix = unique_prefix("registryout");
    let dir = temp_dir("registry-outage");
    let url = redis.url();
    let mut a = instance(&dir, &url, &prefix, "snap", "registry-outage-1");
    assert_eq!(
        put(&a.base, "shop", &user_limit("shop", 2), None).status,
        201
    );

    // Restart with Redis up, without the snapshot: the domain comes from Redis.
    a.terminate();
    assert!(a.wait(Duration::from_secs(15)).success());
    let a = instance(&dir, &url, &prefix, "other-snap", "registry-outage-2");
    assert_eq!(current_limit(&a.base, "shop", "ann"), Some(2));
    drop(a);

    // Redis goes down under a running instance: its rules stay (and the failure policy serves
    // them locally).
    let b = instance(&dir, &url, &prefix, "snap", "registry-outage-3");
    assert_eq!(current_limit(&b.base, "shop", "ann"), Some(2));
    redis.kill();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(current_limit(&b.base, "shop", "ann"), Some(2));
    let r = put(&b.base, "shop", &user_limit("shop", 9), None);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(body(&r)["error"]["code"], "registry_unavailable");
    assert_eq!(current_limit(&b.base, "shop", "ann"), Some(2));
    drop(b);

    // Started while Redis is down: the limits of the local snapshot, enforced.
    let c = instance(&dir, &url, &prefix, "snap", "registry-outage-4");
    assert_eq!(current_limit(&c.base, "shop", "ann"), Some(2));
    assert_eq!(check(&c.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&c.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&c.base, "shop", "user", "ann").0, 429);
    assert!(
        c.stderr().contains("serving the local snapshot"),
        "{}",
        c.stderr()
    );

    // Redis back, empty (no persistence): the registered domains are not dropped, and the
    // instance writes them back.
    let _redis = RedisServer::start_on(redis.port, &[]);
    assert!(
        wait_for(PROPAGATION_WAIT, || stored_domains(redis.port, &prefix)
            == ["shop"])
        .is_some(),
        "{}",
        c.stderr()
    );
    assert_eq!(current_limit(&c.base, "shop", "ann"), Some(2));
}

/// The domains the registry under `prefix` holds in the Redis on `port` (`-c`: a cluster node
/// redirects), sorted.
fn stored_domains(port: u16, prefix: &str) -> Vec<String> {
    let out = cli(
        port,
        &["-c", "HKEYS", &format!("{{{prefix}:registry}}:domains")],
    );
    let mut names: Vec<String> = out
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    names.sort();
    names
}

/// The registry's revision under `prefix` in the Redis on `port` (empty: no revision key).
fn stored_revision(port: u16, prefix: &str) -> String {
    cli(
        port,
        &["-c", "GET", &format!("{{{prefix}:registry}}:revision")],
    )
    .trim()
    .to_string()
}

/// Wait until every server serves each `(domain, limit)` (`None`: no rule) for user `ann`.
fn wait_serving(servers: &[&Server], expected: &[(&str, Option<u64>)]) {
    for s in servers {
        let waited = wait_for(PROPAGATION_WAIT, || {
            expected
                .iter()
                .all(|(d, l)| current_limit(&s.base, d, "ann") == *l)
        });
        assert!(
            waited.is_some(),
            "{} does not serve {expected:?}:\n{}",
            s.base,
            s.stderr()
        );
    }
}

/// `tollgate_registry_restores_total` summed over `servers`.
fn restores(servers: &[&Server]) -> u64 {
    servers
        .iter()
        .map(|s| metric(&s.base, "tollgate_registry_restores_total"))
        .sum()
}

/// A write made right after Redis came back: retried while the instance has not reconnected
/// yet (`503`, nothing changed).
fn put_when_up(base: &str, domain: &str, limit: u64) -> u16 {
    let mut status = 0;
    wait_for(PROPAGATION_WAIT, || {
        status = put(base, domain, &user_limit(domain, limit), None).status;
        status != 503
    });
    status
}

#[test]
fn a_redis_that_lost_the_registry_gets_it_back_from_the_instances() {
    let mut redis = RedisServer::start(&[]);
    let port = redis.port;
    let url = redis.url();
    let prefix = unique_prefix("registrylost");
    let dir = temp_dir("registry-lost");
    let a = instance(&dir, &url, &prefix, "snap-a", "registry-lost-a");
    let b = instance(&dir, &url, &prefix, "snap-b", "registry-lost-b");
    let c = instance(&dir, &url, &prefix, "snap-c", "registry-lost-c");
    let all = [&a, &b, &c];
    assert_eq!(
        put(&a.base, "shop", &user_limit("shop", 3), None).status,
        201
    );
    assert_eq!(
        put(&a.base, "cart", &user_limit("cart", 5), None).status,
        201
    );
    assert_eq!(
        put(&b.base, "gone", &user_limit("gone", 7), None).status,
        201
    );
    assert_eq!(delete(&c.base, "gone").status, 200);
    wait_serving(
        &all,
        &[("shop", Some(3)), ("cart", Some(5)), ("gone", None)],
    );
    let shop_version = body(&admin_get(&a.base, "/v1/domains/shop"))["version"]
        .as_u64()
        .unwrap();
    let revision: u64 = stored_revision(port, &prefix).parse().unwrap();
    assert_eq!(restores(&all), 0);

    // Redis restarts empty (no persistence); then a write through one instance.
    redis.kill();
    redis = RedisServer::start_on(port, &[]);
    assert_eq!(put_when_up(&b.base, "fresh", 9), 201);
    wait_serving(
        &all,
        &[
            ("shop", Some(3)),
            ("cart", Some(5)),
            ("fresh", Some(9)),
            ("gone", None),
        ],
    );
    assert_eq!(stored_domains(port, &prefix), ["cart", "fresh", "shop"]);
    // Written back once (the instances race; one script run wins), versions and history kept,
    // revisions carry on from where they were.
    assert_eq!(restores(&all), 1);
    let history = body(&admin_get(&c.base, "/v1/domains/shop/history"));
    assert_eq!(history["versions"][0]["version"], shop_version, "{history}");
    let fresh = body(&admin_get(&c.base, "/v1/domains/fresh"));
    assert!(fresh["version"].as_u64().unwrap() > revision, "{fresh}");

    // FLUSHALL, then a delete through another instance: it deletes what was registered.
    cli(port, &["FLUSHALL"]);
    let r = delete(&c.base, "cart");
    assert_eq!(r.status, 200, "{}", r.body);
    wait_serving(
        &all,
        &[("shop", Some(3)), ("cart", None), ("fresh", Some(9))],
    );
    assert_eq!(stored_domains(port, &prefix), ["fresh", "shop"]);
    assert_eq!(restores(&all), 2);

    // Deleting every domain is not a loss: the revision key stays and nothing comes back.
    assert_eq!(delete(&a.base, "shop").status, 200);
    assert_eq!(delete(&b.base, "fresh").status, 200);
    wait_serving(&all, &[("shop", None), ("fresh", None)]);
    let revision = stored_revision(port, &prefix);
    assert!(!revision.is_empty());
    for s in all {
        let waited = wait_for(PROPAGATION_WAIT, || {
            metric(&s.base, "tollgate_registry_revision").to_string() == revision
        });
        assert!(waited.is_some(), "{}", s.stderr());
    }
    // A few polls later: still empty, nothing written back.
    std::thread::sleep(Duration::from_secs(1));
    assert!(stored_domains(port, &prefix).is_empty());
    assert_eq!(restores(&all), 2);
    wait_serving(&all, &[("shop", None), ("fresh", None), ("cart", None)]);
    drop(redis);
}

#[test]
fn a_stale_snapshot_does_not_bring_back_domains_deleted_while_it_was_away() {
    let mut redis = RedisServer::start(&[]);
    let port = redis.port;
    let url = redis.url();
    let prefix = unique_prefix("registrystale");
    let dir = temp_dir("registry-stale");
    let mut a = instance(&dir, &url, &prefix, "snap-a", "registry-stale-a1");
    let mut c = instance(&dir, &url, &prefix, "snap-c", "registry-stale-c1");
    assert_eq!(put(&a.base, "old", &user_limit("old", 3), None).status, 201);
    assert_eq!(
        put(&a.base, "keep", &user_limit("keep", 4), None).status,
        201
    );
    wait_serving(&[&a, &c], &[("old", Some(3)), ("keep", Some(4))]);

    // C stops; while it is away `old` is deleted and `new` registered; then A stops too and
    // Redis restarts empty.
    c.terminate();
    assert!(c.wait(Duration::from_secs(15)).success());
    assert_eq!(delete(&a.base, "old").status, 200);
    assert_eq!(put(&a.base, "new", &user_limit("new", 5), None).status, 201);
    let revision = stored_revision(port, &prefix);
    a.terminate();
    assert!(a.wait(Duration::from_secs(15)).success());
    redis.kill();
    redis = RedisServer::start_on(port, &[]);

    // C starts first, from its stale snapshot, and writes it back into the empty Redis.
    let c = instance(&dir, &url, &prefix, "snap-c", "registry-stale-c2");
    wait_serving(&[&c], &[("old", Some(3)), ("keep", Some(4))]);
    assert!(
        wait_for(PROPAGATION_WAIT, || stored_domains(port, &prefix)
            == ["keep", "old"])
        .is_some(),
        "{}",
        c.stderr()
    );
    // A starts from its newer snapshot: Redis is behind it, so A's registry wins everywhere.
    let a = instance(&dir, &url, &prefix, "snap-a", "registry-stale-a2");
    wait_serving(
        &[&a, &c],
        &[("old", None), ("keep", Some(4)), ("new", Some(5))],
    );
    assert_eq!(stored_domains(port, &prefix), ["keep", "new"]);
    assert_eq!(stored_revision(port, &prefix), revision);
    assert!(!dir.join("snap-c/domains/old.json").exists());
    drop(redis);
}

#[test]
fn the_registry_works_on_a_redis_cluster() {
    let cluster = Cluster::start(3);
    let url = cluster.url();
    let port = cluster.nodes[0].port;
    let prefix = unique_prefix("registrycluster");
    let dir = temp_dir("registry-cluster");
    let a = instance(&dir, &url, &prefix, "snap-a", "registry-cluster-a");
    let b = instance(&dir, &url, &prefix, "snap-b", "registry-cluster-b");
    let both = [&a, &b];
    let r = put(&a.base, "shop", &user_limit("shop", 3), None);
    assert_eq!(r.status, 201, "{}\n{}", r.body, a.stderr());
    // No subscription on a cluster: B polls the change.
    wait_serving(&both, &[("shop", Some(3))]);
    assert_eq!(check(&a.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&b.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&b.base, "shop", "user", "ann").0, 200);
    assert_eq!(check(&a.base, "shop", "user", "ann").0, 429);
    // Every registry key in one slot.
    let tag = format!("{{{prefix}:registry}}");
    let slots: std::collections::BTreeSet<String> = ["revision", "domains", "history:shop"]
        .iter()
        .map(|k| cli(port, &["CLUSTER", "KEYSLOT", &format!("{tag}:{k}")]))
        .collect();
    assert_eq!(slots.len(), 1, "{slots:?}");

    let r = put(&b.base, "shop", &user_limit("shop", 6), None);
    assert_eq!(r.status, 200, "{}", r.body);
    wait_serving(&both, &[("shop", Some(6))]);

    // Every node flushed: written back, then a write on top.
    for n in &cluster.nodes {
        n.cli(&["FLUSHALL"]);
    }
    assert_eq!(
        put(&a.base, "cart", &user_limit("cart", 2), None).status,
        201
    );
    wait_serving(&both, &[("shop", Some(6)), ("cart", Some(2))]);
    assert_eq!(stored_domains(port, &prefix), ["cart", "shop"]);
    assert_eq!(restores(&both), 1);

    assert_eq!(delete(&b.base, "shop").status, 200);
    wait_serving(&both, &[("shop", None), ("cart", Some(2))]);
    assert_eq!(stored_domains(port, &prefix), ["cart"]);
}

/// 20 `PUT`s of one new domain at once, without `If-Match`, spread over two instances: each
/// answer describes the write its caller made. Exactly one created the domain; ordered by
/// version, each names the one before as `previous_version`, and its diff is against that
/// version's limit.
#[test]
fn concurrent_puts_each_answer_for_their_own_write() {
    let dir = temp_dir("registry-redis-races");
    let prefix = unique_prefix("regrace");
    let _cleanup = Cleanup(prefix.clone());
    let store = tollgate_testsupport::shared_url();
    let a = instance(&dir, store, &prefix, "snap-a", "registry-race-a");
    let b = instance(&dir, store, &prefix, "snap-b", "registry-race-b");
    let writers = 20u64;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(writers as usize));
    let threads: Vec<_> = (0..writers)
        .map(|i| {
            let base = if i % 2 == 0 { &a.base } else { &b.base }.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let limit = 100 + i;
                barrier.wait();
                let r = put(&base, "raced", &user_limit("raced", limit), None);
                (limit, r.status, body(&r))
            })
        })
        .collect();
    let mut answers: Vec<(u64, u16, serde_json::Value)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    answers.sort_by_key(|(_, _, v)| v["version"].as_u64().unwrap_or(0));
    let created: Vec<_> = answers.iter().filter(|(_, s, _)| *s == 201).collect();
    assert_eq!(created.len(), 1, "{answers:#?}");
    let mut wrong = Vec::new();
    for (k, (limit, status, v)) in answers.iter().enumerate() {
        assert!(v["version"].as_u64().is_some(), "{v}");
        if k == 0 {
            if *status != 201 || v["created"] != true || !v["previous_version"].is_null() {
                wrong.push(format!("first write: {v}"));
            }
            continue;
        }
        let (prev_limit, _, prev) = &answers[k - 1];
        let described = v["created"] == false
            && *status == 200
            && v["previous_version"] == prev["version"]
            && v["changes"]["changed"][0]["from"]
                .as_str()
                .is_some_and(|f| f.starts_with(&format!("{prev_limit} per minute")))
            && v["changes"]["changed"][0]["to"]
                .as_str()
                .is_some_and(|t| t.starts_with(&format!("{limit} per minute")));
        if !described {
            wrong.push(format!("after {}: {v}", prev["version"]));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {writers} answers describe another write: {wrong:#?}",
        wrong.len()
    );
}
