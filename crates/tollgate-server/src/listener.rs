//! The accept loop of every listener, and the HTTP listener on it.
//!
//! `accept_loop` is the one loop that takes connections, for the HTTP API, the gRPC service
//! ([`crate::grpc`]), envoy's debug port and the envoy-named Prometheus page, over TCP, TLS over
//! TCP (the handshake bounded) or a unix socket (`Listener`). It owns what every listener
//! needs the same way:
//!
//! - a cap on open connections (`--max-connections`): at the cap the loop stops accepting until
//!   a connection ends (new clients wait in the kernel's backlog, costing the process nothing),
//!   counted in `ConnectionMetrics::cap_reached` and logged as a rate-limited WARN naming the
//!   listener ("gRPC connection cap reached");
//! - accept errors: one connection's are skipped, the process's (out of descriptors) pause the
//!   loop briefly with a rate-limited WARN;
//! - graceful shutdown that always ends: on shutdown the listener is closed, every connection is
//!   told to finish (idle ones close at once, in-flight requests complete), and whatever is still
//!   open after `--shutdown-timeout` is dropped.
//!
//! [`serve`] is the HTTP listener on that loop: it serves the API on hyper's connection builders
//! (HTTP/1.1 and HTTP/2 prior knowledge, as `axum::serve` did) with the limits `axum::serve` has
//! not got, so that idle or slow clients cannot hold the process:
//!
//! - a header-read timeout: a connection that has not sent a complete request head within it
//!   (from accept, or, on a kept-alive HTTP/1.1 connection, from the first byte of the next
//!   request) is dropped;
//! - an idle timeout: a connection with no request in flight for that long is closed (HTTP/2 gets
//!   a GOAWAY first);
//! - a body-read timeout: each request body is wrapped ([`TimedBody`]) so that a body not
//!   complete within it fails with `BodyTimedOut`; the handler reading it answers 408 in JSON
//!   (`http::read_body`) and closes the connection. A body that came with its head costs no
//!   timer: one is only armed when the body has to be waited for;
//! - at most `MAX_HTTP2_STREAMS` requests in flight on one HTTP/2 connection (the others are
//!   refused with REFUSED_STREAM), so that a request waiting in a queue holds a connection's
//!   share as over HTTP/1.1, and `--max-connections` bounds the waiters;
//! - a strict request head: a bare LF line ending in an HTTP/1.1 head is refused with 400 and
//!   the connection closed. hyper's parser takes a bare LF as a line end, so
//!   `X-Forwarded-For: a\nX-Forwarded-For: b` would be two headers to tollgate and one to a
//!   gateway in front that vouched for the first; the head bytes are checked as they are read,
//!   before hyper sees them (the bytes after a head are the body, not checked). A head that
//!   follows a request whose body the handler did not read to its end is not checked (its
//!   start cannot be told without parsing the body; hyper closes such a connection anyway).
//! - a lingering close: when the server ends a connection the client may still be sending (a
//!   413 for a body the client writes whole before reading), closing with unread bytes would
//!   make the kernel send a reset, which can destroy the response before the client reads it.
//!   So the write side is shut (the client sees the response end), and what still arrives is
//!   read and thrown away until the client closes, for at most 5 s (and 2 s between reads)
//!   and 16 MiB, as nginx's `lingering_close`. The
//!   connection keeps its slot under the cap meanwhile.
//!
//! Why not hyper's own `header_read_timeout`: it also runs while an HTTP/1.1 connection waits
//! idle for its next request, so the idle timeout could never exceed it. Each connection instead
//! carries a small `Activity` record (requests in flight, when it went idle, when the next
//! request head began), updated by the service wrapper and the socket reader, and one timer
//! that checks it only when the nearest deadline is due.

use crate::metrics::{ConnectionMetrics, DropReason};
use axum::extract::Request;
use axum::response::Response;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64,
    Ordering::{AcqRel, Relaxed, Release},
};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Service, ServiceExt as _};

/// Connection limits and timeouts of one HTTP listener (`tollgate serve` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnLimits {
    /// `--header-read-timeout`: longest wait for a complete request head.
    pub header_read_timeout: Duration,
    /// `--body-read-timeout`: longest wait for a whole request body once its head is in.
    pub body_read_timeout: Duration,
    /// `--idle-timeout`: longest a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// `--max-connections`: most connections open at once.
    pub max_connections: usize,
    /// `--shutdown-timeout`: how long shutdown waits for connections before dropping them.
    pub shutdown_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// Largest request head (HTTP/1.1 read buffer, HTTP/2 header list) a connection may send.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Most requests in flight at once on one HTTP/2 connection (hyper's default is 200).
pub(crate) const MAX_HTTP2_STREAMS: u32 = 16;

/// Lingering close: the longest a closed connection is drained in all.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// Lingering close: the longest wait for the client's next bytes (or its close).
const LINGER_IDLE: Duration = Duration::from_secs(2);
/// Lingering close: the most bytes read and thrown away.
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// The answer to a request head with a bare LF line ending (JSON, as every error).
fn bare_lf_response() -> Vec<u8> {
    let body = r#"{"error":{"code":"malformed_request_head","message":"a line of the request head ends in LF without CR"}}"#;
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// At most one "connection cap reached" WARN, and one "accept failed" WARN, per listener per
/// this interval.
const CAP_WARN_EVERY: Duration = Duration::from_secs(10);

/// What serves the requests of a connection ([`serve`]'s `make` gives one per connection).
pub(crate) trait ConnService:
    Service<Request<TimedBody>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> ConnService for S where
    S: Service<Request<TimedBody>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Serve on `listener` until `shutdown` turns `true`, then shut down within
/// `limits.shutdown_timeout`. Each connection is served by `make(peer)` (the client's address,
/// when known: [`with_connect_info`] gives it to handlers as axum's `ConnectInfo`), each request
/// with its body as a [`TimedBody`]. Counts connections in `metrics`. The connections come from
/// `accept_loop` (the cap, accept errors, the drain at shutdown), whose log lines name the
/// listener `kind` (`HTTP` for the API's; `debug`, `envoy metrics`).
pub(crate) async fn serve<M, S>(
    kind: &'static str,
    listener: TcpListener,
    make: M,
    limits: ConnLimits,
    metrics: Arc<ConnectionMetrics>,
    shutdown: watch::Receiver<bool>,
) where
    M: Fn(Option<SocketAddr>) -> S + Send + Sync + 'static,
    S: ConnService,
{
    let make = Arc::new(make);
    let mut builder = Builder::new(TokioExecutor::new());
    // What one connection may make the process buffer for a request head: hyper's defaults
    // (~400 KB for HTTP/1.1, 16 MB of HTTP/2 header list) times the connection cap would be
    // gigabytes. 64 KiB is 8 times what nginx accepts by default; beyond it: 431.
    builder.http1().max_buf_size(MAX_HEAD_BYTES);
    builder.http2().max_header_list_size(MAX_HEAD_BYTES as u32);
    // Each request in flight may be a queue waiter: an HTTP/2 connection carries at most this
    // many at once (a client sending more has the extra streams refused, REFUSED_STREAM, safe
    // to retry), so that `--max-connections` bounds the waiters as it does over HTTP/1.1.
    builder.http2().max_concurrent_streams(MAX_HTTP2_STREAMS);
    let builder = Arc::new(builder);
    let counters = metrics.clone();
    let serve_one = move |stream, peer, close| {
        Connection {
            stream,
            peer,
            make: make.clone(),
            builder: builder.clone(),
            limits,
            metrics: counters.clone(),
            close,
        }
        .run()
    };
    let accept = AcceptLimits {
        kind,
        max_connections: limits.max_connections,
        shutdown_timeout: limits.shutdown_timeout,
    };
    accept_loop(
        listener,
        accept,
        metrics,
        stopped_owned(shutdown),
        async {},
        serve_one,
    )
    .await;
}

/// A listening socket [`accept_loop`] takes connections from: TCP ([`TcpListener`], or
/// [`NoDelay`]), TLS over TCP ([`Tls`]) or a unix socket.
pub(crate) trait Listener: Send + 'static {
    /// A connection ready to be served.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// What makes an accepted socket a [`Listener::Stream`] (the TLS handshake; nothing for
    /// plain sockets). It runs on the connection's own task, holding its slot, so a slow
    /// handshake holds up no other client; shutdown cuts it short.
    type Handshake: Future<Output = io::Result<Self::Stream>> + Send + 'static;

    /// The next socket and its peer's address (none on a unix socket).
    fn accept(
        &self,
    ) -> impl Future<Output = io::Result<(Self::Handshake, Option<SocketAddr>)>> + Send;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    type Handshake = std::future::Ready<io::Result<TcpStream>>;

    async fn accept(&self) -> io::Result<(Self::Handshake, Option<SocketAddr>)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        Ok((std::future::ready(Ok(stream)), Some(peer)))
    }
}

/// TCP with `TCP_NODELAY` on every connection: the gRPC listener's, whose small frames (an
/// answer, a PING acknowledgement) must not wait for the previous write's ACK (Nagle).
#[derive(Debug)]
pub(crate) struct NoDelay(pub TcpListener);

impl Listener for NoDelay {
    type Stream = TcpStream;
    type Handshake = std::future::Ready<io::Result<TcpStream>>;

    async fn accept(&self) -> io::Result<(Self::Handshake, Option<SocketAddr>)> {
        let (stream, peer) = self.0.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok((std::future::ready(Ok(stream)), Some(peer)))
    }
}

/// TLS over TCP (`TCP_NODELAY` on, as [`NoDelay`]): a handshake not done within
/// `handshake_timeout` fails and the connection is closed.
pub(crate) struct Tls {
    /// The TCP listener.
    pub listener: TcpListener,
    /// The TLS configuration.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// The longest a client may take over its handshake.
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("listener", &self.listener)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// A TLS handshake under way (see [`Tls`]).
pub(crate) type TlsHandshake =
    Pin<Box<dyn Future<Output = io::Result<tokio_rustls::server::TlsStream<TcpStream>>> + Send>>;

impl Listener for Tls {
    type Stream = tokio_rustls::server::TlsStream<TcpStream>;
    type Handshake = TlsHandshake;

    async fn accept(&self) -> io::Result<(Self::Handshake, Option<SocketAddr>)> {
        let (tcp, peer) = self.listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let (accept, timeout) = (self.acceptor.accept(tcp), self.handshake_timeout);
        let handshake = async move {
            match tokio::time::timeout(timeout, accept).await {
                Ok(done) => done,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "TLS handshake not done within the handshake timeout ({} ms)",
                        timeout.as_millis()
                    ),
                )),
            }
        };
        Ok((Box::pin(handshake) as TlsHandshake, Some(peer)))
    }
}

#[cfg(unix)]
impl Listener for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    type Handshake = std::future::Ready<io::Result<tokio::net::UnixStream>>;

    async fn accept(&self) -> io::Result<(Self::Handshake, Option<SocketAddr>)> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        Ok((std::future::ready(Ok(stream)), None))
    }
}

/// What [`accept_loop`] needs besides the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AcceptLimits {
    /// The listener's name in log lines (`HTTP`, `gRPC`).
    pub kind: &'static str,
    /// `--max-connections`: most connections open at once.
    pub max_connections: usize,
    /// `--shutdown-timeout`: how long shutdown waits for connections before dropping them.
    pub shutdown_timeout: Duration,
}

/// Pause after an accept error that is not one connection's (see [`accept_loop`]).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The accept loop of every listener: take connections from `listener` until `shutdown`
/// resolves, each served by `serve(stream, peer, close)` on a task of its own once its
/// handshake ([`Listener::Handshake`]) is done; `close` turns `true` when shutdown begins, and
/// the connection is to finish what it is doing and end.
///
/// - At most `limits.max_connections` connections at once: at the cap nothing is accepted (new
///   clients wait in the kernel's backlog, costing the process nothing) until one ends; each
///   time, [`ConnectionMetrics::cap_reached`] counts it and a WARN says so, at most once every
///   10 s.
/// - Accept errors: one connection's (reset before it was accepted) are skipped; the process's
///   (out of descriptors) pause the loop for 50 ms, with a WARN at most once every 10 s (the
///   comment in the loop says why).
/// - Finished connections are reaped as the loop goes, so the task set is as large as the open
///   connections.
/// - At shutdown: the listener is closed (the kernel refuses new clients), `on_stop` runs (the
///   gRPC listener turns its health NOT_SERVING there), every connection is told to close, and
///   whatever is still open after `limits.shutdown_timeout` is dropped
///   ([`DropReason::Shutdown`]).
///
/// [`ConnectionMetrics`] counts the connections open (handshake included).
pub(crate) async fn accept_loop<L, F, Fut>(
    listener: L,
    limits: AcceptLimits,
    metrics: Arc<ConnectionMetrics>,
    shutdown: impl Future<Output = ()> + Send,
    on_stop: impl Future<Output = ()> + Send,
    serve: F,
) where
    L: Listener,
    F: Fn(L::Stream, Option<SocketAddr>, watch::Receiver<bool>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let kind = limits.kind;
    let serve = Arc::new(serve);
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let (close_tx, close_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut last_cap_warn: Option<Instant> = None;
    let mut last_accept_warn: Option<Instant> = None;
    let mut shutdown = pin!(shutdown);
    'accept: loop {
        // A slot first: at the cap nothing is accepted (the kernel's backlog holds new clients).
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                metrics.cap_reached();
                if last_cap_warn.is_none_or(|t| t.elapsed() >= CAP_WARN_EVERY) {
                    last_cap_warn = Some(Instant::now());
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "{kind} connection cap reached: new connections wait until one closes"
                    );
                }
                loop {
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break 'accept,
                        Some(_) = tasks.join_next() => {}
                        p = slots.clone().acquire_owned() => match p {
                            Ok(p) => break p,
                            Err(_) => break 'accept,
                        },
                    }
                }
            }
        };
        let (handshake, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            // Reap finished connections (their permits are already back).
            Some(_) = tasks.join_next() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // One policy for every listener. A connection that failed between the kernel's
                // handshake and `accept` (reset by its client) concerns that client alone: go
                // on at once. Anything else is the process's (out of descriptors: EMFILE,
                // ENFILE; out of memory) and lasts until something is freed: accepting again at
                // once would spin a core on the same error, so pause briefly (connections
                // closing meanwhile free descriptors; shutdown still ends the pause) and say so,
                // at most once every 10 s, as the error repeats every pause.
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    if last_accept_warn.is_none_or(|t| t.elapsed() >= CAP_WARN_EVERY) {
                        last_accept_warn = Some(Instant::now());
                        tracing::warn!(error = %e, "{kind} accept failed");
                    }
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                    continue;
                }
            },
        };
        let (serve, metrics, mut close) = (serve.clone(), metrics.clone(), close_rx.clone());
        tasks.spawn(async move {
            let _permit = permit;
            metrics.opened();
            let _open = OpenGuard(&metrics);
            let stream = tokio::select! {
                biased;
                stream = handshake => stream,
                () = stopped(&mut close) => return,
            };
            match stream {
                Ok(stream) => serve(stream, peer, close).await,
                Err(e) => tracing::debug!(error = %e, "{kind} connection handshake failed"),
            }
        });
    }

    // Stop accepting: new clients are refused by the kernel from here on.
    drop(listener);
    on_stop.await;
    let _ = close_tx.send(true);
    let open = tasks.len();
    if open > 0 {
        tracing::info!(connections = open, "closing {kind} connections");
    }
    let deadline = Instant::now() + limits.shutdown_timeout;
    let drained = tokio::time::timeout_at(deadline, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    if !drained {
        let left = tasks.len();
        tracing::warn!(
            connections = left,
            shutdown_timeout_ms = limits.shutdown_timeout.as_millis() as u64,
            "shutdown timeout: dropping the {kind} connections still open"
        );
        metrics.dropped(DropReason::Shutdown, left as u64);
        tasks.shutdown().await;
    }
}

/// Resolves when `rx` turns `true` (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// [`stopped`], owning its receiver.
async fn stopped_owned(mut rx: watch::Receiver<bool>) {
    stopped(&mut rx).await;
}

/// Errors of one connection that `accept` reports; the listener itself is fine.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// One accepted connection and what it needs to be served.
struct Connection<M> {
    stream: TcpStream,
    /// The client's address.
    peer: Option<SocketAddr>,
    make: Arc<M>,
    builder: Arc<Builder<TokioExecutor>>,
    limits: ConnLimits,
    metrics: Arc<ConnectionMetrics>,
    close: watch::Receiver<bool>,
}

impl<M> Connection<M> {
    /// Serve the connection until it ends, a timeout drops it or shutdown closes it.
    async fn run<S: ConnService>(self)
    where
        M: Fn(Option<SocketAddr>) -> S,
    {
        let Connection {
            stream,
            peer,
            make,
            builder,
            limits,
            metrics,
            mut close,
        } = self;
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Tracked {
            inner: Some(stream),
            activity: activity.clone(),
            preface: Preface::Unknown(0),
            head: HeadScan::default(),
        });
        let service = make(peer);
        drop(make);
        let end = drive(
            io, service, &builder, limits, &metrics, &activity, &mut close,
        )
        .await;
        // hyper has let go of the socket (its connection is dropped): `Tracked` handed it back.
        let stream = activity
            .stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(stream) = stream else {
            return;
        };
        match end {
            End::Drop => {}
            End::Refuse => {
                metrics.dropped(DropReason::MalformedHead, 1);
                tracing::debug!("HTTP request head with a bare LF: answered 400, closing");
                linger(stream, Some(&bare_lf_response())).await;
            }
            End::Close if activity.peer_closed.load(Relaxed) => {}
            End::Close => linger(stream, None).await,
        }
    }
}

/// How a connection's serving ended, for what to do with its socket.
enum End {
    /// Dropped (a timeout, shutdown): close at once.
    Drop,
    /// hyper ended it (served, closed by either side, failed): close lingering.
    Close,
    /// A request head was refused ([`HeadScan`]): answer 400, then close lingering.
    Refuse,
}

/// Serve `io` with hyper until the connection ends or a timeout or shutdown drops it.
async fn drive<S: ConnService>(
    io: TokioIo<Tracked>,
    service: S,
    builder: &Builder<TokioExecutor>,
    limits: ConnLimits,
    metrics: &ConnectionMetrics,
    activity: &Arc<Activity>,
    close: &mut watch::Receiver<bool>,
) -> End {
    let tracker = activity.clone();
    let hyper_service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let request = RequestGuard::begin(tracker.clone(), !req.body().is_end_stream());
        let req = req.map(|body| TimedBody::new(body, limits.body_read_timeout, &tracker));
        let response = service.clone().oneshot(req);
        async move {
            let response = response.await;
            drop(request);
            response
        }
    });
    let mut conn = pin!(builder.serve_connection(io, hyper_service));
    let mut closing = false;
    // Set once the connection was told to close because it was idle: a peer that does not
    // let go (HTTP/2 GOAWAY unanswered) is dropped at this instant.
    let mut close_by: Option<Instant> = None;
    let next = activity.deadline(&limits).unwrap_or_else(Instant::now);
    let mut timer = pin!(tokio::time::sleep_until(next));
    let mut stop = pin!(stopped(close));
    // The timer and the shutdown signal wake the task through `side`, which notes it: the
    // socket wakes the task for every request, and polling those two each time (a lock
    // in the watch channel, the timer entry) would cost more than the check below.
    let side = Arc::new(SideWake::default());
    let side_waker = std::task::Waker::from(side.clone());
    loop {
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = conn.as_mut().poll(cx) {
                return Poll::Ready(Event::Ended(result));
            }
            side.task.register(cx.waker());
            if side.woken.swap(false, AcqRel) {
                let mut side_cx = Context::from_waker(&side_waker);
                if timer.as_mut().poll(&mut side_cx).is_ready() {
                    return Poll::Ready(Event::Timer);
                }
                if !closing && stop.as_mut().poll(&mut side_cx).is_ready() {
                    return Poll::Ready(Event::Stop);
                }
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Ended(result) => {
                if activity.refused.load(Relaxed) {
                    return End::Refuse;
                }
                if let Err(e) = result {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                // Closed for idleness or shutdown: nothing is being sent; do not hold on.
                return if closing { End::Drop } else { End::Close };
            }
            Event::Timer => {
                let now = Instant::now();
                if close_by.is_some_and(|at| now >= at) {
                    return End::Drop;
                }
                let next = match activity.deadline(&limits) {
                    Some(at) if at > now => close_by.map_or(at, |c| c.min(at)),
                    // A request is in flight: it is bounded by the body timeout and the
                    // store timeout; look again later.
                    None => now + limits.header_read_timeout.min(limits.idle_timeout),
                    Some(_) if activity.reading_head() => {
                        metrics.dropped(DropReason::HeaderTimeout, 1);
                        tracing::debug!("HTTP header-read timeout: connection dropped");
                        return End::Drop;
                    }
                    Some(_) => {
                        // Idle: HTTP/1.1 closes at once, HTTP/2 sends GOAWAY first.
                        metrics.dropped(DropReason::IdleTimeout, 1);
                        if closing {
                            return End::Drop;
                        }
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                        let at = now + limits.header_read_timeout;
                        close_by = Some(at);
                        at
                    }
                };
                timer.as_mut().reset(next);
                // Polled next time round, which arms it again.
                side.woken.store(true, Release);
            }
            Event::Stop => {
                closing = true;
                conn.as_mut().graceful_shutdown();
                // The timer may have fired meanwhile: look at it again.
                side.woken.store(true, Release);
            }
        }
    }
}

/// Close `stream` the way nginx's `lingering_close` does: write `answer` (if any), shut the
/// write side, then read and drop what the client still sends until it closes, within
/// [`LINGER_TIME`], [`LINGER_IDLE`] and [`LINGER_BYTES`].
async fn linger(mut stream: TcpStream, answer: Option<&[u8]>) {
    let deadline = Instant::now() + LINGER_TIME;
    if let Some(answer) = answer {
        if !matches!(
            tokio::time::timeout_at(deadline, stream.write_all(answer)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
    // hyper may have shut it already; an error here changes nothing below.
    let _ = stream.shutdown().await;
    let mut buf = vec![0u8; 16 * 1024];
    let mut drained = 0usize;
    while drained < LINGER_BYTES {
        let wait = deadline.min(Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(wait, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => return,
        }
    }
}

/// What woke a connection's task, for [`Connection::run`].
enum Event<E> {
    /// The connection is done (served, closed or failed).
    Ended(Result<(), E>),
    /// The timeout timer fired.
    Timer,
    /// Shutdown began.
    Stop,
}

/// The waker given to a connection's timer and shutdown signal: it notes that one of them
/// fired, then wakes the connection's task.
struct SideWake {
    /// Set when the timer or the shutdown signal woke the task (and to begin with).
    woken: AtomicBool,
    /// The connection task's waker.
    task: futures_util::task::AtomicWaker,
}

impl Default for SideWake {
    fn default() -> Self {
        Self {
            woken: AtomicBool::new(true),
            task: futures_util::task::AtomicWaker::new(),
        }
    }
}

impl std::task::Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Release);
        self.task.wake();
    }
}

/// A `make` for [`serve`] giving every request of a connection the client's address as axum's
/// `ConnectInfo` (what forward-auth and the registry read), for any `service`.
pub(crate) fn with_connect_info<S>(
    service: S,
) -> impl Fn(Option<SocketAddr>) -> WithConnectInfo<S> + Send + Sync + 'static
where
    S: Clone + Send + Sync + 'static,
{
    move |peer| WithConnectInfo {
        inner: service.clone(),
        peer,
    }
}

/// `inner`, with the client's address inserted into each request (see [`with_connect_info`]).
#[derive(Debug, Clone)]
pub(crate) struct WithConnectInfo<S> {
    inner: S,
    peer: Option<SocketAddr>,
}

impl<S, B> Service<Request<B>> for WithConnectInfo<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if let Some(peer) = self.peer {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
        }
        self.inner.call(req)
    }
}

/// Keeps [`ConnectionMetrics::open`] right however the connection task ends (also aborted).
struct OpenGuard<'a>(&'a ConnectionMetrics);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.closed();
    }
}

/// What a connection is doing, for its timeouts. Times are milliseconds since `born`, plus one
/// (0 = not set), in atomics: HTTP/2 requests run on tasks of their own.
struct Activity {
    born: Instant,
    in_flight: AtomicU32,
    /// Whether a request was ever received (before that, the header timeout runs from accept).
    served: AtomicBool,
    /// When the last request finished.
    idle_since: AtomicU64,
    /// When the first byte of the next HTTP/1.1 request head arrived (0: none yet).
    head_since: AtomicU64,
    /// Whether the last request's body was not read to its end (the bytes that follow may be
    /// the rest of it, not a head).
    body_open: AtomicBool,
    /// A request head was refused ([`HeadScan`]).
    refused: AtomicBool,
    /// The client closed its side (a read gave end of file).
    peer_closed: AtomicBool,
    /// The socket, handed back by [`Tracked`] when hyper drops it, for the close.
    stream: std::sync::Mutex<Option<TcpStream>>,
}

impl Activity {
    fn new() -> Self {
        Self {
            born: Instant::now(),
            in_flight: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            body_open: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            peer_closed: AtomicBool::new(false),
            stream: std::sync::Mutex::new(None),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.born).as_millis() as u64 + 1
    }

    fn at(&self, stamp: u64) -> Instant {
        self.born + Duration::from_millis(stamp.saturating_sub(1))
    }

    /// Whether the connection is (or should be) reading a request head rather than idling.
    fn reading_head(&self) -> bool {
        !self.served.load(Relaxed) || self.head_since.load(Relaxed) != 0
    }

    /// When the connection is to be dropped (header timeout) or closed (idle timeout) as things
    /// stand; `None` while a request is in flight.
    fn deadline(&self, limits: &ConnLimits) -> Option<Instant> {
        if self.in_flight.load(Relaxed) > 0 {
            return None;
        }
        if !self.served.load(Relaxed) {
            return Some(self.born + limits.header_read_timeout);
        }
        match self.head_since.load(Relaxed) {
            0 => Some(self.at(self.idle_since.load(Relaxed)) + limits.idle_timeout),
            head => Some(self.at(head) + limits.header_read_timeout),
        }
    }
}

/// One request in flight on a connection, from its head to its response.
struct RequestGuard(Arc<Activity>);

impl RequestGuard {
    /// `body`: whether the request has a body still to be read.
    fn begin(activity: Arc<Activity>, body: bool) -> Self {
        activity.in_flight.fetch_add(1, Relaxed);
        activity.body_open.store(body, Relaxed);
        activity.served.store(true, Relaxed);
        activity.head_since.store(0, Relaxed);
        Self(activity)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since.store(a.stamp(Instant::now()), Relaxed);
        a.in_flight.fetch_sub(1, Relaxed);
    }
}

/// A request body that did not arrive within the body-read timeout (the error [`TimedBody`]
/// yields; find it in an error's `source` chain with [`BodyTimedOut::find`]).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("request body not received within {} ms", .0.as_millis())]
pub(crate) struct BodyTimedOut(pub Duration);

impl BodyTimedOut {
    /// The [`BodyTimedOut`] in `err` or its sources, if any.
    pub(crate) fn find(err: &(dyn std::error::Error + 'static)) -> Option<BodyTimedOut> {
        let mut next = Some(err);
        while let Some(e) = next {
            if let Some(t) = e.downcast_ref::<BodyTimedOut>() {
                return Some(*t);
            }
            next = e.source();
        }
        None
    }
}

/// A request body with a deadline, counted from when the head was received.
pub(crate) struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    deadline: Instant,
    /// Armed on the first wait only.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Told when the body was read to its end ([`Activity::body_open`]); `None` once told.
    activity: Option<Arc<Activity>>,
}

impl TimedBody {
    fn new(inner: Incoming, timeout: Duration, activity: &Arc<Activity>) -> Self {
        let activity = (!inner.is_end_stream()).then(|| activity.clone());
        Self {
            inner,
            timeout,
            deadline: Instant::now() + timeout,
            sleep: None,
            activity,
        }
    }

    /// Note in the connection's activity that the body was read to its end.
    fn ended(&mut self) {
        if let Some(a) = self.activity.take() {
            a.body_open.store(false, Relaxed);
        }
    }
}

impl hyper::body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_none() || this.inner.is_end_stream() {
                this.ended();
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The HTTP/2 connection preface: a connection starting with it is HTTP/2.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Which protocol the first bytes showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preface {
    /// Undecided; that many bytes of [`H2_PREFACE`] matched so far.
    Unknown(usize),
    Http1,
    Http2,
}

impl Preface {
    /// What the protocol looks like once `bytes` (the next ones read) are in.
    fn after(self, bytes: &[u8]) -> Preface {
        let Preface::Unknown(matched) = self else {
            return self;
        };
        let want = &H2_PREFACE[matched..];
        let n = want.len().min(bytes.len());
        if bytes[..n] != want[..n] {
            Preface::Http1
        } else if matched + n == H2_PREFACE.len() {
            Preface::Http2
        } else {
            Preface::Unknown(matched + n)
        }
    }
}

/// The socket, noting when an idle HTTP/1.1 connection starts sending its next request head
/// (HTTP/2 frames such as PING arrive on idle connections: no head is being read there).
///
/// It also checks HTTP/1.1 request heads ([`HeadScan`]) and, when hyper drops it, hands the
/// socket back through [`Activity::stream`] for the close.
struct Tracked {
    /// `None` only once handed back (in `drop`).
    inner: Option<TcpStream>,
    activity: Arc<Activity>,
    preface: Preface,
    head: HeadScan,
}

impl Tracked {
    /// Note `bytes`, just read; `false` when they are to be refused (a bare LF in a head).
    fn on_read(&mut self, bytes: &[u8]) -> bool {
        self.preface = self.preface.after(bytes);
        if self.preface != Preface::Http1 {
            return true;
        }
        let a = &self.activity;
        if a.served.load(Relaxed)
            && a.in_flight.load(Relaxed) == 0
            && a.head_since.load(Relaxed) == 0
        {
            a.head_since.store(a.stamp(Instant::now()), Relaxed);
            if !a.body_open.load(Relaxed) {
                self.head = HeadScan::default();
            }
        }
        self.head.accepts(bytes)
    }

    fn stream(&mut self) -> io::Result<&mut TcpStream> {
        self.inner
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(stream) = self.inner.take() {
            *self
                .activity
                .stream
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(stream);
        }
    }
}

/// Where a connection is in its HTTP/1.1 requests, to refuse a bare LF line ending in a head.
/// A head is followed by its body, framed by `Content-Length` (skipped, then the next head is
/// checked: pipelined requests too); a body framed otherwise (`Transfer-Encoding`) or a length
/// that cannot be read ends the checking until the connection is idle again.
#[derive(Debug, Clone, Copy)]
struct HeadScan {
    at: ScanAt,
    /// The previous byte of the head was a CR.
    after_cr: bool,
    /// How much of the blank line ending the head (CR LF CR LF) was just seen.
    end: u8,
    /// A byte other than CR and LF was seen (CR LF before the request line is not its end).
    started: bool,
    /// The start of the current line, for its header name (`line_len` past the array: longer).
    line: [u8; 40],
    line_len: usize,
    /// The head's body length, when it has one (`Content-Length`).
    body: u64,
    /// The body's framing is not a plain `Content-Length` this scan can follow.
    unframed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanAt {
    Head,
    /// In a body: that many bytes left.
    Body(u64),
    /// Not checking (see [`HeadScan`]).
    Off,
}

impl Default for HeadScan {
    fn default() -> Self {
        Self {
            at: ScanAt::Head,
            after_cr: false,
            end: 0,
            started: false,
            line: [0; 40],
            line_len: 0,
            body: 0,
            unframed: false,
        }
    }
}

impl HeadScan {
    /// Take the next bytes read; `false` when a head line ends in a bare LF.
    fn accepts(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match self.at {
                ScanAt::Off => return true,
                ScanAt::Body(left) => {
                    let n = bytes.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    bytes = &bytes[n..];
                    let left = left - n as u64;
                    *self = if left == 0 {
                        HeadScan::default()
                    } else {
                        HeadScan {
                            at: ScanAt::Body(left),
                            ..*self
                        }
                    };
                }
                ScanAt::Head => {
                    // Most of a head is runs of bytes other than CR and LF, which leave the
                    // same state however they are cut: such a run is taken whole.
                    let run = line_break(bytes);
                    if run > 0 {
                        self.text(&bytes[..run]);
                        bytes = &bytes[run..];
                    } else {
                        let b = bytes[0];
                        bytes = &bytes[1..];
                        if !self.head_byte(b) {
                            return false;
                        }
                    }
                }
            }
        }
        true
    }

    /// Head bytes other than CR and LF, as [`HeadScan::head_byte`] takes them one at a time.
    fn text(&mut self, run: &[u8]) {
        self.end = 0;
        self.started = true;
        self.after_cr = false;
        let at = self.line_len.min(self.line.len());
        let n = run.len().min(self.line.len() - at);
        self.line[at..at + n].copy_from_slice(&run[..n]);
        self.line_len = self.line_len.saturating_add(run.len());
    }

    fn head_byte(&mut self, b: u8) -> bool {
        match b {
            b'\n' if !self.after_cr => return false,
            b'\n' => {
                self.end = if self.end == 1 { 2 } else { 4 };
                self.header_line();
                if self.end == 4 && self.started {
                    self.at = if self.unframed {
                        ScanAt::Off
                    } else if self.body > 0 {
                        ScanAt::Body(self.body)
                    } else {
                        ScanAt::Head
                    };
                    if self.at == ScanAt::Head {
                        *self = HeadScan::default();
                    }
                }
            }
            b'\r' => self.end = if self.end == 2 { 3 } else { 1 },
            _ => {
                self.end = 0;
                self.started = true;
                if let Some(slot) = self.line.get_mut(self.line_len) {
                    *slot = b;
                }
                self.line_len = self.line_len.saturating_add(1);
            }
        }
        self.after_cr = b == b'\r';
        true
    }

    /// A line of the head ended: note how its body is framed.
    fn header_line(&mut self) {
        let len = std::mem::take(&mut self.line_len);
        // Only `Content-Length` and `Transfer-Encoding` are looked for: a line starting with
        // another byte is done with (an empty line's stale first byte only costs the checks).
        if !matches!(self.line[0].to_ascii_lowercase(), b'c' | b't') {
            return;
        }
        let Some(line) = self.line.get(..len) else {
            // Longer than the array: a framing header this long is not followed.
            if starts_with_name(&self.line, b"content-length:")
                || starts_with_name(&self.line, b"transfer-encoding:")
            {
                self.unframed = true;
            }
            return;
        };
        if starts_with_name(line, b"transfer-encoding:") {
            self.unframed = true;
        } else if starts_with_name(line, b"content-length:") {
            let value = std::str::from_utf8(&line[15..]).unwrap_or("").trim();
            match value.parse::<u64>() {
                Ok(n) if self.body == 0 || self.body == n => self.body = n,
                _ => self.unframed = true,
            }
        }
    }
}

/// Where the first CR or LF of `bytes` is (its length when there is none), eight bytes at a
/// time: a byte equal to CR or LF is a zero byte of the word XORed with that byte repeated, and
/// `(x - 0x01..) & !x & 0x80..` marks the lowest zero byte of `x` exactly (a false mark can
/// only follow a true one, from the borrow).
fn line_break(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let w = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let found = zero(w ^ (ONES * u64::from(b'\r'))) | zero(w ^ (ONES * u64::from(b'\n')));
        if found != 0 {
            return at + found.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    let rest = words.remainder();
    at + rest
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(rest.len())
}

/// Whether `line` starts with the header name `name` (lowercase, with its colon), in any case.
fn starts_with_name(line: &[u8], name: &[u8]) -> bool {
    line.len() >= name.len() && line[..name.len()].eq_ignore_ascii_case(name)
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let result = Pin::new(this.stream()?).poll_read(cx, buf);
        if buf.filled().len() > before {
            if !this.on_read(&buf.filled()[before..]) {
                // Not given to hyper: it ends the connection on this error, and the
                // connection answers 400 itself.
                buf.set_filled(before);
                this.activity.refused.store(true, Relaxed);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bare LF in the request head",
                )));
            }
        } else if room && matches!(result, Poll::Ready(Ok(()))) {
            this.activity.peer_closed.store(true, Relaxed);
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().stream()?).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().stream()?).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().stream()?).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.activity.refused.load(Relaxed) {
            // The 400 is still to be written (`Connection::run`).
            return Poll::Ready(Ok(()));
        }
        Pin::new(this.stream()?).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnLimits {
        ConnLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            ..ConnLimits::default()
        }
    }

    #[test]
    fn deadlines_follow_the_connection() {
        let a = Arc::new(Activity::new());
        let l = limits();
        let ms = Duration::from_millis;
        // Fresh: the header timeout runs from accept.
        assert_eq!(a.deadline(&l), Some(a.born + l.header_read_timeout));
        assert!(a.reading_head());
        let r = RequestGuard::begin(a.clone(), false);
        assert_eq!(a.deadline(&l), None, "in flight");
        drop(r);
        // Idle after a request: the idle timeout runs from its end (here, 3 s after accept).
        a.idle_since.store(a.stamp(a.born + ms(3000)), Relaxed);
        assert_eq!(a.deadline(&l), Some(a.born + ms(3000) + l.idle_timeout));
        assert!(!a.reading_head());
        // The next HTTP/1.1 head begins (8 s after accept): the header timeout runs from there.
        a.head_since.store(a.stamp(a.born + ms(8000)), Relaxed);
        assert_eq!(
            a.deadline(&l),
            Some(a.born + ms(8000) + l.header_read_timeout)
        );
        assert!(a.reading_head());
        // A request clears it.
        drop(RequestGuard::begin(a.clone(), false));
        assert_eq!(a.head_since.load(Relaxed), 0);
    }

    #[test]
    fn bare_lf_in_a_head_is_refused_and_a_body_is_not_looked_at() {
        let scan = |chunks: &[&[u8]]| {
            let mut h = HeadScan::default();
            chunks.iter().all(|c| h.accepts(c))
        };
        assert!(scan(&[b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"]));
        assert!(scan(&[b"\r\nGET / HTTP/1.1\r", b"\nHost: x\r\n\r", b"\n"]));
        assert!(!scan(&[
            b"GET / HTTP/1.1\r\nX-Forwarded-For: 1.1.1.1\nX-Forwarded-For: 6.6.6.6\r\n\r\n"
        ]));
        assert!(!scan(&[b"GET / HTTP/1.1\n"]));
        assert!(!scan(&[b"GET / HTTP/1.1\r\nHost: x\r\n\n"]));
        assert!(!scan(&[b"GET / HTTP/1.1\r\nHost: x\r", b"\r\n", b"\n"]));
        // After the head: the body's bytes are its own business.
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
            b"a\nb"
        ]));
        // The next head (pipelined) is checked again, after a body or none.
        assert!(!scan(&[
            b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\nHost: x\r\n\r\n"
        ]));
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\ncontent-length:  3 \r\n\r\na\n",
            b"bGET / HTTP/1.1\nHost: x\r\n\r\n"
        ]));
        assert!(scan(&[
            b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\na\nbGET / HTTP/1.1\r\n\r\n"
        ]));
        // A body framed otherwise is not followed: checking stops there.
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n\n\r\n0\r\n\r\n"
        ]));
        let response = String::from_utf8(bare_lf_response()).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }

    /// The scan as first written, every head byte through `head_byte`: what taking runs of
    /// plain bytes whole must agree with.
    fn bytewise(h: &mut HeadScan, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| match h.at {
            ScanAt::Head => h.head_byte(b),
            _ => h.accepts(&[b]),
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn head_scan_in_runs_is_head_scan_byte_by_byte(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "\r", "\n", "\r\n", "a", ":", "GET / HTTP/1.1", "Host: x", "content-length: 3",
                "Content-Length:12", "content-length: x", "transfer-encoding: chunked",
                "x-a-header-name-longer-than-forty-bytes-in-all: 1", "abc\ndef",
            ]), 0..24),
            cuts in proptest::collection::vec(0usize..200, 0..4),
        ) {
            let input = parts.concat().into_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
            cuts.sort_unstable();
            cuts.push(input.len());
            let (mut runs, mut bytes) = (HeadScan::default(), HeadScan::default());
            let (mut from, mut ok) = (0, true);
            for to in cuts {
                ok = ok && runs.accepts(&input[from..to]);
                from = to;
            }
            proptest::prop_assert_eq!(ok, bytewise(&mut bytes, &input));
            proptest::prop_assert_eq!(format!("{runs:?}"), format!("{bytes:?}"));
        }

        #[test]
        fn line_break_is_the_first_cr_or_lf(
            bytes in proptest::collection::vec(proptest::sample::select(vec![
                b'\r', b'\n', b'a', 0, 0x09, 0x0b, 0x0c, 0x0e, 0x8a, 0x8d, 0xff,
            ]), 0..40),
        ) {
            let first = bytes.iter().position(|&b| b == b'\r' || b == b'\n');
            proptest::prop_assert_eq!(line_break(&bytes), first.unwrap_or(bytes.len()));
        }
    }

    #[test]
    fn preface_detection() {
        let sniff = |chunks: &[&[u8]]| {
            let mut p = Preface::Unknown(0);
            for c in chunks {
                p = p.after(c);
            }
            p
        };
        assert_eq!(sniff(&[H2_PREFACE]), Preface::Http2);
        assert_eq!(
            sniff(&[b"PRI * HT", b"TP/2.0\r\n\r\nSM\r\n\r\n\0\0"]),
            Preface::Http2
        );
        assert_eq!(sniff(&[b"PRI * HT"]), Preface::Unknown(8));
        assert_eq!(sniff(&[b"P", b"OST / HTTP/1.1"]), Preface::Http1);
        assert_eq!(sniff(&[b"GET / HTTP/1.1\r\n"]), Preface::Http1);
    }
}
