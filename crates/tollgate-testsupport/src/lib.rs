//! # tollgate-testsupport
//!
//! Dev-only helpers shared by the Redis tests of several crates (one copy, not one per crate):
//! throwaway `redis-server` processes, a 3-master Redis Cluster and a Sentinel-monitored master
//! with a replica on free loopback ports, plus unique key prefixes for the shared server on 6379.
//!
//! Servers run from the installed `redis-server` binary in their own temporary directory with
//! persistence off, and are killed (and their directory removed) on drop, so a failing test
//! cannot leak them. Nothing here touches the server on 6379 beyond keys under the prefix a test
//! gets from [`unique_prefix`].
//!
//! And [`test_each!`]: one async test function run once per value of a parameter (a gRPC
//! engine, say), each run its own test.

use std::hash::BuildHasher;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shared Redis when `TOLLGATE_TEST_REDIS_URL` is not set. Tests use [`shared_url`], never
/// this: scripts/test.sh runs its own server on a free port.
pub const SHARED_URL: &str = "redis://127.0.0.1:6379";

/// The shared server of this run: `TOLLGATE_TEST_REDIS_URL` when set (scripts/test.sh runs the
/// store suites a second time against a Valkey server that way), else [`SHARED_URL`].
pub fn shared_url() -> &'static str {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        std::env::var("TOLLGATE_TEST_REDIS_URL").unwrap_or_else(|_| SHARED_URL.to_string())
    })
}

/// The port of [`shared_url`] (`redis://HOST:PORT`).
pub fn shared_port() -> u16 {
    shared_addr()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in TOLLGATE_TEST_REDIS_URL={}", shared_url()))
}

/// `HOST:PORT` of [`shared_url`], as envoyproxy/ratelimit's `REDIS_URL` takes it.
pub fn shared_addr() -> &'static str {
    let url = shared_url();
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// The server binary the throwaway servers run: `TOLLGATE_TEST_REDIS_SERVER` when set (a
/// `valkey-server`), else `redis-server` from the `PATH`.
pub fn server_binary() -> String {
    std::env::var("TOLLGATE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

fn random() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one((
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        Instant::now(),
    ))
}

/// A key prefix no other test run uses.
pub fn unique_prefix(what: &str) -> String {
    format!("tgtest-{what}-{:012x}", random() & 0xffff_ffff_ffff)
}

/// A loopback port that is free now, and whose cluster bus port (+10000) is free too: a
/// reservation for a server that must be told its port before it starts. Another process may
/// take it before that server binds it, so such servers start through [`on_free_ports`].
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = l.local_addr().unwrap().port();
        if port < 50_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A loopback port on which connections are refused for as long as this value lives: a socket
/// is bound to it but does not listen, so no other process can listen there meanwhile (a
/// port found free and released could come back to life as someone else's server).
pub struct RefusedPort {
    _socket: socket2::Socket,
    /// The port on 127.0.0.1.
    pub port: u16,
}

impl RefusedPort {
    /// Bind a fresh loopback port without listening on it.
    pub fn new() -> RefusedPort {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).expect("bind a loopback port");
        let port = socket
            .local_addr()
            .unwrap()
            .as_socket()
            .expect("an IP address")
            .port();
        RefusedPort {
            _socket: socket,
            port,
        }
    }
}

impl Default for RefusedPort {
    fn default() -> Self {
        Self::new()
    }
}

/// How many times [`on_free_ports`] starts a server before giving up.
const PORT_ATTEMPTS: usize = 10;

/// Start a server that cannot bind `:0` and report its port (nginx, Caddy, Envoy,
/// `redis-server`, a documented script, ...): `start(port)` starts it on a port found free a
/// moment ago and returns `None` when it lost that port to another process (see
/// [`wait_listening`]); the whole start is then retried on a new port, a bounded number of
/// times.
pub fn on_free_port<T>(what: &str, mut start: impl FnMut(u16) -> Option<T>) -> T {
    on_free_ports(what, |[port]: [u16; 1]| start(port))
}

/// [`on_free_port`] for a server told `N` ports: one lost is a start retried on `N` new ones.
pub fn on_free_ports<T, const N: usize>(
    what: &str,
    mut start: impl FnMut([u16; N]) -> Option<T>,
) -> T {
    for _ in 0..PORT_ATTEMPTS {
        if let Some(started) = start(std::array::from_fn(|_| free_port())) {
            return started;
        }
    }
    panic!("{what} lost a port to another process {PORT_ATTEMPTS} times in a row");
}

/// Wait until `child` itself listens on TCP `port` (a connection alone could reach another
/// process that took the port): `true` then; `false` when it exited first (it could not bind:
/// the caller starts it again elsewhere, see [`on_free_port`]). A child that neither listens
/// nor exits within `within` fails the test with `log` (its log file).
pub fn wait_listening(
    child: &mut Child,
    port: u16,
    what: &str,
    log: &std::path::Path,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        if listens(child.id(), port) {
            return true;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on port {port} within {within:?}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4 or IPv6): the inodes of
/// the listening sockets in `/proc/net/tcp{,6}` against the sockets among its open files.
pub fn listens(pid: u32, port: u16) -> bool {
    let inodes: Vec<String> = tcp_sockets()
        .into_iter()
        .filter(|s| s.listening && s.local_port == port)
        .map(|s| format!("socket:[{}]", s.inode))
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// One TCP socket of this network namespace, as `/proc/net/tcp{,6}` lists it.
#[derive(Debug, Clone)]
pub struct TcpSocket {
    /// Its local port.
    pub local_port: u16,
    /// Its peer's port (0 for a listening socket).
    pub remote_port: u16,
    /// In the LISTEN state.
    pub listening: bool,
    /// Bytes received and not read yet by the process that owns it.
    pub unread: u64,
    /// Its inode (`socket:[inode]` among a process's open files).
    pub inode: String,
}

/// Every TCP socket of this network namespace (IPv4 and IPv6).
pub fn tcp_sockets() -> Vec<TcpSocket> {
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    let mut sockets = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx_queue:rx_queue tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(st), Some(queues), Some(inode)) =
                (f.get(1), f.get(2), f.get(3), f.get(4), f.get(9))
            else {
                continue;
            };
            let unread = queues
                .split_once(':')
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok());
            if let (Some(local_port), Some(remote_port), Some(unread)) =
                (port(local), port(remote), unread)
            {
                sockets.push(TcpSocket {
                    local_port,
                    remote_port,
                    listening: *st == "0A",
                    unread,
                    inode: inode.to_string(),
                });
            }
        }
    }
    sockets
}

/// `redis-server ARGS` with persistence off, data in `dir`, output discarded.
fn spawn_redis(args: &[&str], dir: &std::path::Path) -> Child {
    Command::new(server_binary())
        .args(args)
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{} must be installed: {e}", server_binary()))
}

/// A fresh directory under the system temp dir, unique to this process and moment.
///
/// Directories are kept after the test (a failing test's server logs are in them) and removed
/// by a later test process: the first call in each process deletes the directories of test
/// processes that have exited ([`sweep_temp_dirs`]), so runs do not pile up in the temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_temp_dirs);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-test-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Remove `tollgate-test-*-PID-NANOS` directories whose process is gone (no `/proc/PID`).
/// Best effort: a directory that cannot be read or removed is left.
pub fn sweep_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("tollgate-test-") {
            continue;
        }
        // The pid is the second number from the end.
        let mut parts = name.rsplit('-');
        let (Some(_nanos), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A 2-worker Tokio runtime for tests that drive async code from a plain `#[test]`.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A `redis-server` child process, killed on drop.
pub struct RedisServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    /// Extra `redis-cli` arguments (TLS).
    cli_args: Vec<String>,
    /// The server arguments it was started with, for [`RedisServer::restart`] (empty: the
    /// server cannot be restarted that way).
    args: Vec<String>,
}

impl RedisServer {
    /// Start a server with extra arguments (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start(extra: &[&str]) -> RedisServer {
        on_free_port("redis-server", |port| Self::try_start_on(port, extra))
    }

    /// Start a server on a given port (e.g. to restart one that was killed).
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        for _attempt in 0..50 {
            if let Some(s) = Self::try_start_on(port, extra) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not start redis-server on port {port}");
    }

    fn try_start_on(port: u16, extra: &[&str]) -> Option<RedisServer> {
        {
            let dir = std::env::temp_dir().join(format!("tollgate-redis-{port}-{:x}", random()));
            std::fs::create_dir_all(&dir).unwrap();
            let port_s = port.to_string();
            let mut args = vec![
                "--port",
                &port_s,
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "no",
            ];
            args.extend(extra);
            let child = spawn_redis(&args, &dir);
            let mut server = RedisServer {
                child,
                port,
                dir,
                cli_args: Vec::new(),
                args: args.iter().map(|a| a.to_string()).collect(),
            };
            // `None`: it exited, having lost a race for the port.
            server.wait_ready(Duration::from_secs(20)).then_some(server)
        }
    }

    /// The server process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait until this process listens on its port and answers `PING`; `false` when it
    /// exited first (it could not bind the port).
    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let log = self.dir.join("redis.log");
        if !wait_listening(&mut self.child, self.port, "redis-server", &log, within) {
            return false;
        }
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let pong = self.cli(&["PING"]);
            if pong.contains("PONG") || pong.contains("NOAUTH") {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} listens but does not answer PING",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Run `redis-cli -p <port> args...` and return its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut all: Vec<&str> = self.cli_args.iter().map(String::as_str).collect();
        all.extend(args);
        cli(self.port, &all)
    }

    /// Start a TLS-only server with a fresh test CA; returns it and the CA certificate's path.
    pub fn start_tls() -> (RedisServer, PathBuf) {
        let dir = std::env::temp_dir().join(format!("tollgate-tls-{:x}", random()));
        std::fs::create_dir_all(&dir).unwrap();
        let sh = |script: &str| {
            let out = Command::new("sh")
                .arg("-c")
                .arg(script)
                .current_dir(&dir)
                .output()
                .expect("sh");
            assert!(
                out.status.success(),
                "{script}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        sh(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout ca.key -out ca.crt -days 2 -subj '/CN=tollgate test CA' 2>/dev/null",
        );
        sh(
            "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout server.key -out server.csr -subj '/CN=127.0.0.1' 2>/dev/null",
        );
        sh(
            "printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > ext.cnf && \
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -out server.crt -days 2 -extfile ext.cnf 2>/dev/null",
        );
        let file = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let (ca, cert, key) = (file("ca.crt"), file("server.crt"), file("server.key"));
        let server = on_free_port("a TLS redis-server", |port| {
            let port_s = port.to_string();
            let args = [
                "--port",
                "0",
                "--tls-port",
                &port_s,
                "--bind",
                "127.0.0.1",
                "--tls-auth-clients",
                "no",
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
            ];
            let child = spawn_redis(&args, &dir);
            let mut server = RedisServer {
                child,
                port,
                dir: dir.clone(),
                cli_args: vec!["--tls".into(), "--cacert".into(), ca.clone()],
                args: Vec::new(),
            };
            server.wait_ready(Duration::from_secs(20)).then_some(server)
        });
        (server, dir.join("ca.crt"))
    }

    /// Start the server again, killed or not, on its port with its arguments and its directory
    /// (no data: the store is not persisted; a Cluster node keeps its `nodes.conf`, so it
    /// rejoins its cluster as the same node). Waits until it answers `PING`.
    pub fn restart(&mut self) {
        assert!(!self.args.is_empty(), "this server cannot be restarted");
        self.kill();
        let owned = self.args.clone();
        let args: Vec<&str> = owned.iter().map(String::as_str).collect();
        for _attempt in 0..50 {
            self.child = spawn_redis(&args, &self.dir);
            if self.wait_ready(Duration::from_secs(20)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not restart redis-server on port {}", self.port);
    }

    /// This node's Redis Cluster id (`CLUSTER MYID`).
    pub fn node_id(&self) -> String {
        self.cli(&["CLUSTER", "MYID"]).trim().to_string()
    }

    /// `127.0.0.1:<port>`, as `CLUSTER SLOTS` names the node.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kill the server now (its port stays reserved by nobody).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `sig` (`-STOP`, `-CONT`, `-KILL`) to process `pid` (a test's own redis-server).
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Run `redis-cli` against a port.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Redis Cluster of `masters` masters and no replicas, torn down on drop.
pub struct Cluster {
    /// The nodes.
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Start the nodes, create the cluster and wait for `cluster_state:ok` on every node.
    pub fn start(masters: usize) -> Cluster {
        Self::start_with(masters, &[])
    }

    /// [`Cluster::start`] with extra server arguments on every node.
    pub fn start_with(masters: usize, extra: &[&str]) -> Cluster {
        Self::start_replicated(masters, 0, extra)
    }

    /// A cluster of `masters` masters with `replicas` replicas each (`nodes`: the masters
    /// first, as `redis-cli --cluster create` assigns them), extra server arguments on every
    /// node (later arguments override earlier ones, e.g. `--cluster-node-timeout`). Waits for
    /// `cluster_state:ok` on every node and, with replicas, for every replica's link.
    pub fn start_replicated(masters: usize, replicas: usize, extra: &[&str]) -> Cluster {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ];
                args.extend(extra);
                RedisServer::start(&args)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        let replicas_s = replicas.to_string();
        args.extend(["--cluster-replicas", &replicas_s, "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = cluster.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && (replicas == 0 || {
                        let role = n.cli(&["INFO", "replication"]);
                        role.contains("role:master") || role.contains("master_link_status:up")
                    })
            });
            if ok {
                return cluster;
            }
            assert!(
                Instant::now() < deadline,
                "cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}

/// Move `slot` with its keys from `src` to `dst` as `redis-cli --cluster reshard` does: the
/// target imports, the source migrates, the keys move, then every master in `masters` is told
/// the new owner, the target first. One key per `MIGRATE`: a sliding log's two keys are apart
/// for a moment, as with any batch size once a slot holds enough keys.
pub fn migrate_slot(masters: &[&RedisServer], slot: u16, src: &RedisServer, dst: &RedisServer) {
    let s = slot.to_string();
    let (src_id, dst_id) = (src.node_id(), dst.node_id());
    let ok = dst.cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]);
    assert!(ok.contains("OK"), "{ok}");
    let ok = src.cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]);
    assert!(ok.contains("OK"), "{ok}");
    let port = dst.port.to_string();
    loop {
        let keys: Vec<String> = src
            .cli(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        if keys.is_empty() {
            break;
        }
        for k in &keys {
            let out = src.cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", k]);
            assert!(out.contains("OK") || out.contains("NOKEY"), "{out}");
        }
    }
    let mut order = vec![dst, src];
    order.extend(
        masters
            .iter()
            .copied()
            .filter(|n| n.port != src.port && n.port != dst.port),
    );
    for n in order {
        let ok = n.cli(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        assert!(ok.contains("OK"), "{ok}");
    }
}

/// A master, one replica and `redis-sentinel`s monitoring them (two with quorum 1 by default; a
/// master is judged down after 1 s), all killed on drop.
pub struct SentinelGroup {
    /// The master's name, [`SentinelGroup::NAME`].
    pub name: &'static str,
    /// The servers: the master at start, then its replica.
    pub servers: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// The master's name the sentinels monitor.
    pub const NAME: &'static str = "mymaster";

    /// Start the master, the replica (wait for its link) and the sentinels (wait until they
    /// know the replica, so that a failover can pick it).
    pub fn start() -> SentinelGroup {
        Self::start_with(2, 1)
    }

    /// [`SentinelGroup::start`] with `sentinels` sentinels agreeing on a master's failure at
    /// `quorum`.
    pub fn start_with(sentinels: usize, quorum: usize) -> SentinelGroup {
        let master = RedisServer::start(&[]);
        let mport = master.port.to_string();
        let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &mport]);
        wait_for(
            Duration::from_secs(20),
            "the replica's link to the master",
            || {
                replica
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            },
        );
        let sentinels: Vec<RedisServer> = (0..sentinels)
            .map(|_| start_sentinel(master.port, quorum))
            .collect();
        let group = SentinelGroup {
            name: Self::NAME,
            servers: vec![master, replica],
            sentinels,
        };
        wait_for(
            Duration::from_secs(30),
            "the sentinels to know the replica",
            || {
                group.sentinels.iter().all(|s| {
                    let r = s.cli(&["SENTINEL", "REPLICAS", Self::NAME]);
                    r.contains(&group.servers[1].port.to_string()) && !r.contains("s_down")
                })
            },
        );
        group
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2/mymaster`.
    pub fn url(&self) -> String {
        format!("redis+sentinel://{}/{}", self.sentinel_list(), self.name)
    }

    /// `127.0.0.1:s1,127.0.0.1:s2`.
    pub fn sentinel_list(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        hosts.join(",")
    }

    /// The master's port as the first sentinel reports it.
    pub fn master_port(&self) -> u16 {
        let out = self.sentinels[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name]);
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no master address from the sentinel: {out}"))
    }

    /// The server running on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .expect("a server of the group")
    }

    /// `SENTINEL FAILOVER` (retried while the sentinel has no replica it can promote), then wait
    /// until every sentinel names the other server and it answers as a master. Returns the new
    /// master's port.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        wait_for(
            Duration::from_secs(30),
            "SENTINEL FAILOVER to be accepted",
            || {
                self.sentinels[0]
                    .cli(&["SENTINEL", "FAILOVER", self.name])
                    .contains("OK")
            },
        );
        wait_for(Duration::from_secs(60), "the failover to complete", || {
            self.sentinels.iter().all(|s| {
                let out = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name]);
                !out.contains(&old.to_string()) && out.lines().count() >= 2
            })
        });
        let new = self.master_port();
        wait_for(
            Duration::from_secs(30),
            "the new master to take writes",
            || self.server(new).cli(&["ROLE"]).starts_with("master"),
        );
        new
    }
}

/// `redis-sentinel` on a free port monitoring the master on `master_port` at `quorum`.
fn start_sentinel(master_port: u16, quorum: usize) -> RedisServer {
    on_free_port("redis-sentinel", |port| {
        let dir = std::env::temp_dir().join(format!("tollgate-sentinel-{port}-{:x}", random()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        let name = SentinelGroup::NAME;
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nlogfile {dir}/redis.log\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 10000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel must be installed (Debian package redis-sentinel)");
        let mut s = RedisServer {
            child,
            port,
            dir,
            cli_args: Vec::new(),
            args: Vec::new(),
        };
        s.wait_ready(Duration::from_secs(20)).then_some(s)
    })
}

/// Poll `ok` every 50 ms until it holds; panic naming `what` after `within`.
pub fn wait_for(within: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Delete every key under `prefix` on the server at `url` (tests clean up the shared server).
pub fn delete_prefix(url: &str, prefix: &str) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut con)
        .unwrap();
    for chunk in keys.chunks(500) {
        let _: () = redis::cmd("DEL").arg(chunk).query(&mut con).unwrap();
    }
    keys.len()
}

/// Assert that every key under `prefix` on `url` has a TTL; return how many keys there are.
pub fn assert_every_key_has_a_ttl(url: &str, prefix: &str) -> usize {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut con)
        .unwrap();
    let mut live = 0;
    for k in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut con).unwrap();
        // -2: the key expired between KEYS and PTTL (its TTL worked); -1 would be a key
        // without a TTL, the bug this looks for.
        if ttl == -2 {
            continue;
        }
        assert!(ttl > 0, "{k} has PTTL {ttl}");
        live += 1;
    }
    live
}

/// envoy's `INCRBY key hits` + `EXPIRE key secs`, as its Redis pipeline sends them.
pub fn envoy_incr(c: &mut redis::Connection, key: &str, hits: u64, secs: u64) -> u64 {
    let (n, _): (u64, u64) = redis::pipe()
        .cmd("INCRBY")
        .arg(key)
        .arg(hits)
        .cmd("EXPIRE")
        .arg(key)
        .arg(secs)
        .query(c)
        .unwrap();
    n
}

/// What a [`FaultProxy`] does with the bytes of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ProxyMode {
    /// Forward both ways.
    Pass = 0,
    /// Drop every byte both ways, silently: connections stay open, nothing arrives (a
    /// partition, a black-holed route). Bytes dropped meanwhile are gone for good.
    BlackHole = 1,
    /// Stop reading: bytes wait in the kernel's buffers and flow again when the mode changes
    /// (a stalled peer or link).
    Stall = 2,
}

struct ProxyState {
    mode: std::sync::atomic::AtomicU8,
    /// Connections accepted before this generation are dead for good (see
    /// [`FaultProxy::lose_connections`]).
    cut: AtomicU64,
    generation: AtomicU64,
    accepted: AtomicU64,
    stop: std::sync::atomic::AtomicBool,
    streams: std::sync::Mutex<Vec<TcpStream>>,
}

/// A TCP proxy on a free loopback port in front of `127.0.0.1:<upstream>` that can stall,
/// black-hole or silently lose connections on demand, as a network between a service and its
/// store does (a lost NAT or conntrack entry, a moved virtual IP, a silent peer). Threads, no
/// runtime; everything stops on drop.
pub struct FaultProxy {
    /// The proxy's port on 127.0.0.1.
    pub port: u16,
    state: std::sync::Arc<ProxyState>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Listen on `127.0.0.1:0` and forward each connection to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(ProxyState {
            mode: std::sync::atomic::AtomicU8::new(ProxyMode::Pass as u8),
            cut: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            stop: Default::default(),
            streams: Default::default(),
        });
        let st = state.clone();
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                st.accepted.fetch_add(1, Ordering::Relaxed);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let generation = st.generation.load(Ordering::Relaxed);
                {
                    let mut streams = st.streams.lock().unwrap();
                    streams.extend(client.try_clone().ok());
                    streams.extend(server.try_clone().ok());
                }
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(from), Ok(to)) = (from, to) else {
                        continue;
                    };
                    let st = st.clone();
                    std::thread::spawn(move || pump(from, to, generation, &st));
                }
            }
        });
        FaultProxy {
            port,
            state,
            accept: Some(accept),
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Change what happens to the bytes of every connection (old and new).
    pub fn set(&self, mode: ProxyMode) {
        self.state.mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Every connection open now is lost for good: its bytes are dropped from now on, whatever
    /// the mode, and it is never closed (the peers are not told). Connections made later pass
    /// as the mode says.
    pub fn lose_connections(&self) {
        let g = self.state.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.state.cut.store(g, Ordering::Relaxed);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::Relaxed)
    }
}

/// Copy `from` to `to` as the proxy's mode says, until either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, generation: u64, st: &ProxyState) {
    use std::io::{Read, Write};
    let mut buf = [0u8; 16 * 1024];
    loop {
        // Stalled: do not read, so the bytes wait in the kernel (polled: this is the proxy's
        // own loop, not a test's synchronisation).
        while st.mode.load(Ordering::Relaxed) == ProxyMode::Stall as u8
            && !st.stop.load(Ordering::Relaxed)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if st.stop.load(Ordering::Relaxed) {
            break;
        }
        let lost = generation < st.cut.load(Ordering::Relaxed);
        let black = st.mode.load(Ordering::Relaxed) == ProxyMode::BlackHole as u8;
        if lost || black {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    // A lost connection stays open: its peer must find out by itself.
    if generation >= st.cut.load(Ordering::Relaxed) {
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for s in self.state.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

/// Each listed `async fn NAME(value)` as tests `NAME::LABEL`, one per `LABEL = value`, on a
/// two-worker tokio runtime:
/// `test_each!([inline = GrpcEngine::Inline, plain = GrpcEngine::Plain]; first_test, second_test);`
#[macro_export]
macro_rules! test_each {
    ($values:tt; $($name:ident),* $(,)?) => {
        $($crate::test_each!(@one $name $values);)*
    };
    (@one $name:ident [$($label:ident = $value:expr),* $(,)?]) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $label() {
                    super::$name($value).await;
                }
            )*
        }
    };
}
