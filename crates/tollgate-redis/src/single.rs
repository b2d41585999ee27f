//! The connection to a single Redis server (`redis://`, `rediss://`, `redis+unix://`), replaced
//! when it stops answering.
//!
//! The `redis` crate's [`ConnectionManager`] reconnects when the socket reports an error (reset,
//! refused, closed), but a connection whose peer went silent (a lost NAT or conntrack entry, a
//! moved virtual IP, a black-holed route, a byte stream that lost a few bytes and now waits for
//! a reply that will never parse) reports nothing: every request on it times out, forever. So
//! this module treats a request left unanswered past its whole bound as proof that the
//! connection is dead and swaps in a new manager (with back-off, so an unreachable server is not
//! dialled in a loop), and it offers a fresh connection of its own for the breaker's probe: a
//! probe that shares the dead connection can never see the server come back.
//!
//! Every socket also gets TCP keepalive and a TCP user timeout ([`tcp_settings`]), so the kernel
//! itself notices a silent peer even on an idle connection.

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, RedisResult};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// Least time between two replacements of a connection that stopped answering (doubled after
/// each replacement that did not help, up to [`MAX_GAP`]; reset by an answer).
pub(crate) const MIN_GAP: Duration = Duration::from_millis(250);
/// Most time between two replacements.
pub(crate) const MAX_GAP: Duration = Duration::from_secs(4);

/// Socket settings of every store connection: no Nagle delay, keepalive probes after 5 s idle
/// (every 2 s, 3 of them), and unacknowledged data for 10 s fails the connection.
pub(crate) fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive)
        .set_user_timeout(Duration::from_secs(10))
}

/// `url`'s client, with [`tcp_settings`] on its sockets.
pub(crate) fn client(url: &str) -> RedisResult<Client> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    Client::open(info)
}

struct Backoff {
    /// No replacement before this.
    next: Option<Instant>,
    gap: Duration,
}

/// A self-replacing connection to one server (see the module docs).
pub(crate) struct SingleConn {
    client: Client,
    config: ConnectionManagerConfig,
    current: RwLock<ConnectionManager>,
    backoff: Mutex<Backoff>,
    /// Set by a replacement, cleared by the next answer (the healthy path only reads it).
    replaced: std::sync::atomic::AtomicBool,
}

impl SingleConn {
    /// Wrap a manager made from `client` with `config`.
    pub(crate) fn new(
        client: Client,
        config: ConnectionManagerConfig,
        conn: ConnectionManager,
    ) -> Self {
        SingleConn {
            client,
            config,
            current: RwLock::new(conn),
            backoff: Mutex::new(Backoff {
                next: None,
                gap: MIN_GAP,
            }),
            replaced: Default::default(),
        }
    }

    /// The current connection (a cheap clone of the shared, multiplexed one).
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A request was answered: the next replacement may happen at once again.
    pub(crate) fn answered(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.replaced.load(Relaxed) {
            self.replaced.store(false, Relaxed);
            let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
            *b = Backoff {
                next: None,
                gap: MIN_GAP,
            };
        }
    }

    /// The connection is dead (`why`, for the log): open a new one, unless one was opened less
    /// than the back-off gap ago (`force`: whatever the gap, when a new connection was just seen
    /// to work). Returns whether it replaced. Requests already on the old connection end with
    /// their own timeout; new ones use the new connection.
    pub(crate) fn replace(&self, why: &str, url: &str, force: bool) -> bool {
        let now = Instant::now();
        {
            let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
            if !force && b.next.is_some_and(|next| now < next) {
                return false;
            }
            b.next = Some(now + b.gap);
            b.gap = (b.gap * 2).min(MAX_GAP);
        }
        // Lazy: the new manager dials on its first use, with the manager's own retries.
        let Ok(fresh) = self.client.get_connection_manager_lazy(self.config.clone()) else {
            return false;
        };
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        self.replaced
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(store = %url, "replacing the Redis connection: {why}");
        true
    }

    /// A new connection of its own (not the shared one), for a probe: dialled within
    /// `connect`, its replies bounded by `response`.
    pub(crate) async fn fresh(
        &self,
        connect: Duration,
        response: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response));
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_socket_has_keepalive_and_a_user_timeout() {
        let t = tcp_settings();
        assert!(t.nodelay());
        assert!(t.keepalive().is_some());
        assert_eq!(t.user_timeout(), Some(Duration::from_secs(10)));
        let c = client("redis://127.0.0.1:1/0").unwrap();
        assert!(c.get_connection_info().tcp_settings().keepalive().is_some());
    }

    #[tokio::test]
    async fn replacements_back_off_until_an_answer() {
        let c = client("redis://127.0.0.1:1/0").unwrap();
        let cfg = ConnectionManagerConfig::new();
        let cm = c.get_connection_manager_lazy(cfg.clone()).unwrap();
        let s = SingleConn::new(c, cfg, cm);
        let url = "redis://127.0.0.1:1";
        assert!(s.replace("test", url, false));
        assert!(!s.replace("test", url, false), "within the gap");
        assert!(s.replace("test", url, true), "forced");
        s.answered();
        assert!(s.replace("test", url, false), "an answer resets it");
    }
}
