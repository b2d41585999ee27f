//! Real gateways (nginx, Caddy) in front of a tiny upstream, with `tollgate serve` as their
//! forward-auth endpoint, for the end-to-end tests: each runs as the current user from the
//! shipped example config (only its addresses replaced), in its own temporary prefix, and is
//! stopped when dropped. Plus a raw HTTP/1.1 client that can pick its source address on the
//! loopback (127.0.0.0/8), so tests have many distinct client IPs.

use super::{on_free_port, on_free_ports, temp_dir, wait_listening, HANG};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The example's listen, tollgate and API addresses, replaced by the test's.
pub const EXAMPLE_LISTEN: &str = "127.0.0.1:8000";
pub const EXAMPLE_TOLLGATE: &str = "127.0.0.1:8080";
pub const EXAMPLE_API: &str = "127.0.0.1:9000";

/// A response: status, headers (names lower case) and body.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` to `127.0.0.1:port` from source address `from`, with extra headers.
pub fn get(from: &str, port: u16, path: &str, headers: &[(&str, &str)]) -> Resp {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let from: IpAddr = from.parse().unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let raw = rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let mut stream = tokio::time::timeout(
            Duration::from_secs(10),
            socket.connect(SocketAddr::from(([127, 0, 0, 1], port))),
        )
        .await
        .expect("connect timed out")
        .expect("connect");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut buf))
            .await
            .expect("response timed out")
            .expect("read");
        buf
    });
    parse(&raw)
}

fn parse(raw: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad response: {text}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// An upstream that answers every request 200 with the request head it received as its body
/// (so tests see which headers the gateway added).
pub struct Upstream {
    pub port: u16,
    /// Every request head received, lower case, in order.
    pub heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = heads.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let record = record.clone();
                std::thread::spawn(move || echo(conn, &record));
            }
        });
        Upstream { port, heads }
    }

    /// How many requests the upstream received whose head contains `needle` (lower case).
    /// A request is recorded before it is answered, so one the client got an answer for is
    /// counted.
    pub fn saw(&self, needle: &str) -> usize {
        let heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        heads.iter().filter(|h| h.contains(needle)).count()
    }
}

fn echo(mut conn: TcpStream, record: &std::sync::Mutex<Vec<String>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    record
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(head.clone());
    let body = format!("upstream saw:\n{head}");
    let _ = conn.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}

/// Fail with a clear message when a gateway binary is missing (`scripts/test.sh` installs it).
pub fn need(cmd: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "`{cmd}` is required by this test: install the Debian package `{package}` (scripts/test.sh does)"
    );
}

/// A gateway process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Gateway {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
    pub dir: PathBuf,
}

impl Gateway {
    /// The shipped example config with the test's addresses.
    fn config(example: &str, port: u16, tollgate_port: u16, upstream: u16) -> String {
        let text = std::fs::read_to_string(super::repo().join(example)).unwrap();
        for addr in [EXAMPLE_LISTEN, EXAMPLE_TOLLGATE, EXAMPLE_API] {
            assert!(text.contains(addr), "{example} no longer uses {addr}");
        }
        text.replace(EXAMPLE_LISTEN, &format!("127.0.0.1:{port}"))
            .replace(EXAMPLE_TOLLGATE, &format!("127.0.0.1:{tollgate_port}"))
            .replace(EXAMPLE_API, &format!("127.0.0.1:{upstream}"))
    }

    /// nginx from `examples/nginx/nginx.conf`; `edit` may change the config further (e.g.
    /// uncomment the fail-open line).
    pub fn nginx(
        name: &str,
        tollgate_port: u16,
        upstream: u16,
        edit: impl Fn(String) -> String,
    ) -> Gateway {
        need("nginx", "nginx");
        on_free_port("nginx", |port| {
            Self::try_nginx(name, port, tollgate_port, upstream, &edit)
        })
    }

    /// nginx listening on `port`; `None` when it could not bind it.
    fn try_nginx(
        name: &str,
        port: u16,
        tollgate_port: u16,
        upstream: u16,
        edit: &impl Fn(String) -> String,
    ) -> Option<Gateway> {
        let dir = temp_dir(name);
        let conf = dir.join("nginx.conf");
        let text = edit(Self::config(
            "examples/nginx/nginx.conf",
            port,
            tollgate_port,
            upstream,
        ));
        std::fs::write(&conf, text).unwrap();
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let log = dir.join("error.log");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        // As root, workers would switch to `nobody`, which cannot use the temporary prefix.
        let user = if root { "user root;" } else { "" };
        let globals = format!(
            "daemon off; pid {}; {user}",
            dir.join("nginx.pid").display()
        );
        let child = Command::new("nginx")
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(&log)
            .args(["-g", &globals])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("spawn nginx");
        let mut g = Gateway {
            child,
            port,
            log,
            dir,
        };
        let stderr = g.dir.join("stderr.log");
        wait_listening(&mut g.child, port, "nginx", &stderr, HANG).then_some(g)
    }

    /// Caddy from `examples/caddy/Caddyfile` (its admin endpoint moved to a free port).
    pub fn caddy(name: &str, tollgate_port: u16, upstream: u16) -> Gateway {
        Self::caddy_with(name, tollgate_port, upstream, |c| c)
    }

    /// [`Gateway::caddy`]; `edit` may change the config further (e.g. fill the plan table).
    pub fn caddy_with(
        name: &str,
        tollgate_port: u16,
        upstream: u16,
        edit: impl Fn(String) -> String,
    ) -> Gateway {
        need("caddy", "caddy");
        // Caddy exits when it loses either port (its listener's, its admin endpoint's).
        on_free_ports("caddy", |[port, admin]| {
            Self::try_caddy(name, port, admin, tollgate_port, upstream, &edit)
        })
    }

    /// Caddy listening on `port`, its admin endpoint on `admin`; `None` when it could not bind
    /// them.
    fn try_caddy(
        name: &str,
        port: u16,
        admin: u16,
        tollgate_port: u16,
        upstream: u16,
        edit: &impl Fn(String) -> String,
    ) -> Option<Gateway> {
        let dir = temp_dir(name);
        let conf = dir.join("Caddyfile");
        let text = edit(Self::config(
            "examples/caddy/Caddyfile",
            port,
            tollgate_port,
            upstream,
        ));
        assert!(text.contains("localhost:2019"));
        let text = text.replace("localhost:2019", &format!("localhost:{admin}"));
        std::fs::write(&conf, text).unwrap();
        let log = dir.join("caddy.log");
        let child = Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&conf)
            .env("HOME", &dir)
            .env("XDG_DATA_HOME", &dir)
            .env("XDG_CONFIG_HOME", &dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn caddy");
        let mut g = Gateway {
            child,
            port,
            log,
            dir,
        };
        wait_listening(&mut g.child, port, "caddy", &g.log.clone(), HANG).then_some(g)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // TERM lets the nginx master stop its workers (SIGKILL would orphan them).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
