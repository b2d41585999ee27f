//! The HTTP accept loop: serves the API on hyper's connection builders (HTTP/1.1 and HTTP/2
//! prior knowledge, as `axum::serve` did) with the limits `axum::serve` has not got, so that idle
//! or slow clients cannot hold the process:
//!
//! - a cap on open connections ([`ConnLimits::max_connections`]): at the cap the loop stops
//!   accepting until a connection ends (new clients wait in the kernel's backlog, costing the
//!   process nothing), logging a rate-limited WARN;
//! - a header-read timeout: a connection that has not sent a complete request head within it
//!   (from accept, or, on a kept-alive HTTP/1.1 connection, from the first byte of the next
//!   request) is dropped;
//! - an idle timeout: a connection with no request in flight for that long is closed (HTTP/2 gets
//!   a GOAWAY first);
//! - graceful shutdown that always ends: on shutdown the listener is closed, every connection is
//!   told to finish (idle ones close at once, in-flight requests complete), and whatever is still
//!   open after [`ConnLimits::shutdown_timeout`] is dropped.
//!
//! - a body-read timeout: each request body is wrapped ([`TimedBody`]) so that a body not
//!   complete within it fails with [`BodyTimedOut`]; the handler reading it answers 408 in JSON
//!   (`http::read_body`) and closes the connection. A body that came with its head costs no
//!   timer: one is only armed when the body has to be waited for.
//!
//! Why not hyper's own `header_read_timeout`: it also runs while an HTTP/1.1 connection waits
//! idle for its next request, so the idle timeout could never exceed it. Each connection instead
//! carries a small `Activity` record (requests in flight, when it went idle, when the next
//! request head began), updated by the service wrapper and the socket reader, and one timer
//! that checks it only when the nearest deadline is due.

use crate::metrics::{ConnectionMetrics, DropReason};
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Service, ServiceExt as _};

/// Connection limits and timeouts of one listener (`tollgate serve` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
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

/// At most one "connection cap reached" WARN per this interval.
const CAP_WARN_EVERY: Duration = Duration::from_secs(10);

/// Serve on `listener` until `shutdown` turns `true`, then shut down within
/// `limits.shutdown_timeout`. Each connection is served by `make(peer)` (the client's address,
/// when known: [`with_connect_info`] gives it to handlers as axum's `ConnectInfo`), each request
/// with its body as a [`TimedBody`]. Counts connections in `metrics`.
pub async fn serve<M, S>(
    listener: TcpListener,
    make: M,
    limits: ConnLimits,
    metrics: Arc<ConnectionMetrics>,
    mut shutdown: watch::Receiver<bool>,
) where
    M: Fn(Option<SocketAddr>) -> S + Send + Sync + 'static,
    S: Service<Request<TimedBody>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let make = Arc::new(make);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut builder = Builder::new(TokioExecutor::new());
    // What one connection may make the process buffer for a request head: hyper's defaults
    // (~400 KB for HTTP/1.1, 16 MB of HTTP/2 header list) times the connection cap would be
    // gigabytes. 64 KiB is 8 times what nginx accepts by default; beyond it: 431.
    builder.http1().max_buf_size(MAX_HEAD_BYTES);
    builder.http2().max_header_list_size(MAX_HEAD_BYTES as u32);
    let builder = Arc::new(builder);
    let (close_tx, close_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut last_cap_warn: Option<Instant> = None;
    let mut last_accept_warn: Option<Instant> = None;
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
                        "HTTP connection cap reached: new connections wait until one closes"
                    );
                }
                loop {
                    tokio::select! {
                        biased;
                        _ = stopped(&mut shutdown) => break 'accept,
                        Some(_) = tasks.join_next() => {}
                        p = slots.clone().acquire_owned() => match p {
                            Ok(p) => break p,
                            Err(_) => break 'accept,
                        },
                    }
                }
            }
        };
        let stream = tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => break,
            // Reap finished connections (their permits are already back).
            Some(_) = tasks.join_next() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Per-connection failures (reset before accept) are nothing; anything else
                    // (out of descriptors) is worth a (rate-limited) line and a short pause.
                    if !is_connection_error(&e) {
                        if last_accept_warn.is_none_or(|t| t.elapsed() >= CAP_WARN_EVERY) {
                            last_accept_warn = Some(Instant::now());
                            tracing::warn!(error = %e, "HTTP accept failed");
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
        };
        let connection = Connection {
            stream,
            make: make.clone(),
            builder: builder.clone(),
            limits,
            metrics: metrics.clone(),
            close: close_rx.clone(),
        };
        tasks.spawn(async move {
            let _permit = permit;
            connection.run().await;
        });
    }

    // Stop accepting: new clients are refused by the kernel from here on.
    drop(listener);
    let _ = close_tx.send(true);
    let open = tasks.len();
    if open > 0 {
        tracing::info!(connections = open, "closing HTTP connections");
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
            "shutdown timeout: dropping the HTTP connections still open"
        );
        metrics.dropped(DropReason::Shutdown, left as u64);
        tasks.shutdown().await;
    }
}

/// Resolves when `rx` turns `true` (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
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
    make: Arc<M>,
    builder: Arc<Builder<TokioExecutor>>,
    limits: ConnLimits,
    metrics: Arc<ConnectionMetrics>,
    close: watch::Receiver<bool>,
}

impl<M> Connection<M> {
    /// Serve the connection until it ends, a timeout drops it or shutdown closes it.
    async fn run<S>(self)
    where
        M: Fn(Option<SocketAddr>) -> S,
        S: Service<Request<TimedBody>, Response = Response, Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let Connection {
            stream,
            make,
            builder,
            limits,
            metrics,
            mut close,
        } = self;
        metrics.opened();
        let _open = OpenGuard(&metrics);
        let peer = stream.peer_addr().ok();
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Tracked {
            inner: stream,
            activity: activity.clone(),
            preface: Preface::Unknown(0),
        });
        let tracker = activity.clone();
        let service = make(peer);
        drop(make);
        let hyper_service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let request = RequestGuard::begin(tracker.clone());
            let req = req.map(|body| TimedBody::new(body, limits.body_read_timeout));
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
        let mut stop = pin!(stopped(&mut close));
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
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                    return;
                }
                Event::Timer => {
                    let now = Instant::now();
                    if close_by.is_some_and(|at| now >= at) {
                        return;
                    }
                    let next = match activity.deadline(&limits) {
                        Some(at) if at > now => close_by.map_or(at, |c| c.min(at)),
                        // A request is in flight: it is bounded by the body timeout and the
                        // store timeout; look again later.
                        None => now + limits.header_read_timeout.min(limits.idle_timeout),
                        Some(_) if activity.reading_head() => {
                            metrics.dropped(DropReason::HeaderTimeout, 1);
                            tracing::debug!("HTTP header-read timeout: connection dropped");
                            return;
                        }
                        Some(_) => {
                            // Idle: HTTP/1.1 closes at once, HTTP/2 sends GOAWAY first.
                            metrics.dropped(DropReason::IdleTimeout, 1);
                            if closing {
                                return;
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
pub fn with_connect_info<S>(
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
pub struct WithConnectInfo<S> {
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
}

impl Activity {
    fn new() -> Self {
        Self {
            born: Instant::now(),
            in_flight: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
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
    fn begin(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Relaxed);
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
pub struct BodyTimedOut(pub Duration);

impl BodyTimedOut {
    /// The [`BodyTimedOut`] in `err` or its sources, if any.
    pub fn find(err: &(dyn std::error::Error + 'static)) -> Option<BodyTimedOut> {
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
pub struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    deadline: Instant,
    /// Armed on the first wait only.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TimedBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: Instant::now() + timeout,
            sleep: None,
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
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
    preface: Preface,
}

impl Tracked {
    fn on_read(&mut self, bytes: &[u8]) {
        self.preface = self.preface.after(bytes);
        let a = &self.activity;
        if self.preface == Preface::Http1
            && a.served.load(Relaxed)
            && a.in_flight.load(Relaxed) == 0
            && a.head_since.load(Relaxed) == 0
        {
            a.head_since.store(a.stamp(Instant::now()), Relaxed);
        }
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.on_read(&buf.filled()[before..]);
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
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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
        let r = RequestGuard::begin(a.clone());
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
        drop(RequestGuard::begin(a.clone()));
        assert_eq!(a.head_since.load(Relaxed), 0);
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
