//! The memory store under a key flood, from outside: `tollgate serve` as a real process, a
//! denied client, then tens of thousands of distinct keys over one keep-alive HTTP connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod support;

use support::*;

/// 3 per day on a fixed window: every key of the flood shares the victim's expiry (midnight
/// UTC), the case where eviction used to drop them all, the victim included. (A day, not a
/// minute, so no window boundary passes while the test runs.)
const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3, algorithm: fixed_window}\n";

/// One keep-alive HTTP/1.1 connection sending `/v1/check` requests, pipelined in batches.
struct Conn {
    write: TcpStream,
    read: BufReader<TcpStream>,
}

impl Conn {
    fn open(base: &str) -> Conn {
        let addr = base.trim_start_matches("http://");
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Conn {
            read: BufReader::new(s.try_clone().unwrap()),
            write: s,
        }
    }

    /// Check each user in `users` (pipelined), returning each HTTP status.
    fn check(&mut self, users: &[String]) -> Vec<u16> {
        let mut out = Vec::with_capacity(users.len() * 160);
        for u in users {
            let body = format!(
                r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"user","value":"{u}"}}]}}]}}"#
            );
            write!(
                out,
                "POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
        self.write.write_all(&out).unwrap();
        users.iter().map(|_| self.response()).collect()
    }

    fn response(&mut self) -> u16 {
        let mut line = String::new();
        self.read.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            let mut h = String::new();
            self.read.read_line(&mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        self.read.read_exact(&mut body).unwrap();
        status
    }

    fn flood(&mut self, prefix: &str, n: usize) {
        let users: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
        for batch in users.chunks(250) {
            for s in self.check(batch) {
                assert_eq!(s, 200, "a fresh key is admitted");
            }
        }
    }
}

fn serve(max_keys: &str, name: &str) -> Server {
    let dir = temp_dir(name);
    std::fs::write(dir.join("api.yaml"), RULES).unwrap();
    serve_rules(&dir.display().to_string(), &["--max-keys", max_keys], name)
}

/// The value of metric `name` (unlabelled) from `/metrics`.
fn metric(base: &str, name: &str) -> u64 {
    let text = http(base, support::client::Method::GET, "/metrics", None).body;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_key_flood_does_not_free_a_denied_client() {
    let server = serve("10000", "flood-denied");
    let mut c = Conn::open(&server.base);
    let victim = vec!["victim".to_string()];
    for _ in 0..3 {
        assert_eq!(c.check(&victim), [200]);
    }
    assert_eq!(c.check(&victim), [429], "exhausted");
    c.flood("attacker-", 20_000);
    assert_eq!(
        c.check(&victim),
        [429],
        "the flood of distinct keys evicted the denied client's counter"
    );
    let keys = metric(&server.base, "tollgate_memory_keys");
    assert!((9_900..=10_000).contains(&keys), "{keys} keys held");
    assert!(metric(&server.base, "tollgate_memory_evictions_total") >= 10_000);
}

#[test]
fn the_store_holds_close_to_max_keys() {
    let server = serve("1000", "flood-bound");
    let mut c = Conn::open(&server.base);
    c.flood("k-", 3_000);
    let keys = metric(&server.base, "tollgate_memory_keys");
    // It used to hold about 585 (eviction dropped 10 % or more of a shard at once, and every
    // key sharing the threshold's expiry).
    assert!((990..=1_000).contains(&keys), "{keys} keys held");
    assert_eq!(
        metric(&server.base, "tollgate_memory_evictions_total"),
        2_000
    );
}
