//! The common call costs no task and no future: when hyper hands a stream over, h2 has usually
//! read its HEADERS, DATA and END_STREAM already (they come in one read), and with the memory
//! store the decision is synchronous ([`crate::check::decide_now`]), so the call is answered
//! there and then, and hyper's stream future is polled once inline (`InlineExecutor`) instead of
//! being spawned. A call that has to wait (its body still coming, Redis, tonic's routes) becomes
//! a task. The connection's writes are held while it is polled and let through at the
//! end of the poll (`poll_coalesced`), and deferred one scheduler turn while stream tasks are
//! answering (`Replayed::hold_or_defer`): with many calls in flight, one `writev` carries the
//! answers of a whole turn instead of one each.
//!
//! That is the inline engine ([`GrpcEngine::Inline`]), which the `tollgate` binary runs by
//! default. The plain engine ([`GrpcEngine::Plain`], `--grpc-engine plain`) serves
//! `ShouldRateLimit` through tonic's routes like the other methods, each stream a task spawned
//! by hyper-util's `TokioExecutor`, writes as h2 makes them: more instructions per call
//! (BENCHMARKS-HISTORY.md has both), and it rests only on what hyper, h2 and tonic document.
//! The two share the listener, the limits, the timeouts and the panic handling.
//!
//! The library's default ([`GrpcLimits::default`]) is the plain engine: a crate that embeds
//! this one resolves hyper and h2 with its own `Cargo.lock`, which may hold versions nobody
//! audited. The binary opts into the inline engine, and its manifest pins hyper and h2 to the
//! audited versions exactly, so `cargo install` resolves those too. An embedder whose lock
//! file resolves the versions named in [`GrpcEngine::Inline`] may opt in the same way.
//!
//! # What the inline engine relies on
//!
//! hyper documents `Executor` as "spawn this future", and `AsyncWrite` wants a waker registered
//! with every `Pending`; the inline engine goes beyond that on the strength of reading hyper
//! 1.12.0 and h2 0.4.20 (`hyper/src/proto/h2/server.rs`, `h2/src/server.rs`,
//! `h2/src/proto/streams/streams.rs`, `h2/src/codec/framed_write.rs`). A test fails when
//! `Cargo.lock` resolves other versions (`audited_hyper_and_h2` in `tests/grpc_inline.rs`): read
//! these again against the new sources, then update the versions there and the binary's pins
//! (`crates/tollgate/Cargo.toml`, checked by the same test). If one no longer holds, run
//! `--grpc-engine plain` until the inline engine is fixed.
//!
//! - **I1, no lock across `execute`.** hyper's `Serving::poll_server` calls the executor for a
//!   stream after `h2::server::Connection::poll_accept` returned it, from inside the
//!   connection's poll, with none of h2's locks held; the stream's future takes h2's lock only
//!   within each of its calls (`send_response`, `send_data`, `poll_data`, `poll_capacity`), and
//!   what it wakes there is the connection task, which is the one running. So a stream future
//!   polled inside `execute` neither deadlocks nor re-enters the connection. Held by every
//!   gRPC test on the inline engine (`tests/grpc.rs`, `tests/grpc_inline.rs`, the binary's
//!   `grpc_*` tests), which answer calls this way.
//! - **I2, the first poll loses nothing.** A stream future left `Pending` by the no-op waker is
//!   spawned and polled again by its task with a real waker, and everything it waits on keeps
//!   the waker of the latest poll (h2's stream recv, send and capacity tasks; tokio's timers and
//!   sockets; tonic's routes). Held by `inline_executor_polls_once_then_spawns` and, end to end,
//!   `a_body_that_arrives_in_later_reads_is_still_answered` and
//!   `calls_over_a_slow_redis_are_answered_when_it_answers`.
//! - **I3, held writes.** h2 touches the socket only inside `Connection::poll` (stream handles
//!   queue frames and wake the connection task), and a write that returned `Pending` is tried
//!   again, whole, at its next poll (`FramedWrite` keeps its buffer). A write held by
//!   `Replayed` returns `Pending` *without registering a waker*: that is sound only because
//!   `poll_coalesced` is the only place that sets the hold and it polls again at once, with
//!   writes let through, whenever one was held; so no `Pending` reaches the runtime unless the
//!   socket or h2 registered the real waker. A deferred write (`Replayed::hold_or_defer`) wakes
//!   its task itself. Held by `writes_of_a_poll_go_out_together` and
//!   `a_write_is_deferred_once_not_for_ever`.
//! - **I4, panics.** A panic in a stream's future outside h2's lock (the service, the body, the
//!   store) is caught (`should_rate_limit`, `RateLimitGrpc::decide_caught`, the executor) and
//!   the stream answered INTERNAL or reset: the connection and its other calls go on (both
//!   engines: `a_panicking_call_is_internal_and_the_connection_goes_on`). A panic while h2's
//!   streams mutex is held (h2 itself, or a `Buf` it reads under the lock) poisons it, and h2
//!   then panics on every use of that connection (`lock().unwrap()`, and "StreamRef::drop;
//!   mutex poisoned" when a stream handle is dropped). Such a connection cannot go on: every
//!   poll of it runs under `catch_unwind` (`drive`), and the first panic out of it closes it
//!   (the socket is dropped without a GOAWAY, which h2 would write under the same lock; calls in
//!   flight on it fail at the client as UNAVAILABLE), logged as an error; the task, the
//!   listener and the other connections go on. A stream task still waiting on that connection
//!   (for flow-control window, say) is not woken by it and ends at its own timeout or wake-up.
//!   Both engines: `a_poisoned_connection_is_closed_inline` and `_plain` (unit tests).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 section 3.4): the first bytes of every
/// connection; the handshake timeout is on these.
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Poll hyper's connection with its writes held, then, if it wanted to write, once more with
/// them let through: everything this turn produced (the answers of every call answered inline
/// as hyper handed their streams over, see [`InlineExecutor`]) goes out in one `writev`.
/// Without the hold, h2 writes what is queued each time hyper asks it for the next stream: one
/// system call per answer.
pub(super) fn poll_coalesced<F: Future>(
    mut conn: Pin<&mut F>,
    cx: &mut Context<'_>,
    shared: &ConnShared,
) -> Poll<F::Output> {
    shared.hold.store(true, Relaxed);
    let first = conn.as_mut().poll(cx);
    shared.hold.store(false, Relaxed);
    if first.is_pending() && shared.held.swap(false, Relaxed) {
        return conn.poll(cx);
    }
    first
}

/// What one connection's socket ([`Replayed`]), its streams' executor ([`InlineExecutor`]) and
/// [`poll_coalesced`] share. One task uses it at a time (the connection's, and its streams'
/// tasks only to count themselves): relaxed atomics, for `Send`.
#[derive(Debug, Default)]
pub(super) struct ConnShared {
    /// Writes are held (set around the first poll of [`poll_coalesced`]).
    hold: AtomicBool,
    /// A write was held: poll again to let it through.
    held: AtomicBool,
    /// The socket brought frames, or a stream task finished, since the last write: with stream
    /// tasks still running, the next write waits one turn for them (`Replayed::hold_or_defer`).
    armed: AtomicBool,
    /// Stream tasks of this connection still running (streams not answered inline).
    spawned: AtomicUsize,
}

/// How hyper runs each stream of a gRPC connection (`hyper::rt::Executor`) under the inline
/// engine: polled once at once, inside the connection task, with a no-op waker, and spawned as
/// a task only if that poll left it pending. A call answered at once ([`Answer::Now`]) is then
/// sent within the connection's own poll: no task per stream (spawning, scheduling and freeing
/// one cost about a tenth of a decision), and its frames join the connection's next write.
///
/// What this rests on is in the module docs ("What the inline engine relies on"): hyper holds
/// none of h2's locks when it hands a stream over (I1), and a future left pending by the no-op
/// waker is made whole by its task's first poll (I2). A panic in that first poll is caught and
/// the stream dropped (I4): h2 resets it and the connection goes on, unless the panic came
/// while h2's lock was held, in which case the connection is closed by [`drive`].
#[derive(Clone, Debug)]
pub(super) struct InlineExecutor {
    pub(super) shared: Arc<ConnShared>,
}

impl<F> hyper::rt::Executor<F> for InlineExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut = Box::pin(fut);
        let first = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        }));
        match first {
            Ok(Poll::Ready(_)) => {}
            Ok(Poll::Pending) => {
                self.shared.spawned.fetch_add(1, Relaxed);
                tokio::spawn(StreamTask {
                    fut,
                    shared: Arc::clone(&self.shared),
                });
            }
            Err(_) => {
                tracing::error!("gRPC stream panicked; the stream was reset");
                // Dropping the stream panics if the panic poisoned h2's lock; then the next
                // poll of the connection panics too, and [`drive`] closes it.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(fut)));
            }
        }
    }
}

/// A stream that was not answered inline, as a task: counted in [`ConnShared::spawned`] while it
/// lives, and arming the connection's write deferral when it finishes, so that the answers of
/// the tasks finishing in the same turn share a write.
struct StreamTask<F> {
    fut: Pin<Box<F>>,
    shared: Arc<ConnShared>,
}

impl<F: Future> Future for StreamTask<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let done = self.fut.as_mut().poll(cx);
        if done.is_ready() {
            self.shared.armed.store(true, Relaxed);
        }
        done
    }
}

impl<F> Drop for StreamTask<F> {
    fn drop(&mut self) {
        self.shared.spawned.fetch_sub(1, Relaxed);
    }
}

/// A connection whose preface was read (to time it), handed to hyper as if it were not: the
/// preface is read again first. It also holds and defers writes so that answers share them (see
/// [`poll_coalesced`] and [`Replayed::hold_or_defer`]).
pub(super) struct Replayed<S> {
    io: S,
    pub(super) replayed: usize,
    pub(super) shared: Arc<ConnShared>,
    /// The last write attempt was deferred: the next one goes out whatever happened since, so
    /// frames arriving and tasks finishing turn after turn cannot put writes off for ever.
    deferred: bool,
    /// Writes are held and deferred (the inline engine); otherwise they go straight through.
    coalesce: bool,
}

impl<S> Replayed<S> {
    /// `io` with the connection's [`ConnShared`], made here.
    pub(super) fn new(io: S, coalesce: bool) -> Self {
        Self {
            io,
            replayed: 0,
            shared: Arc::new(ConnShared::default()),
            deferred: false,
            coalesce,
        }
    }

    /// Whether this write waits: held ([`poll_coalesced`]), or deferred. A deferred write is put
    /// off by one turn of the scheduler when stream tasks are still running and frames came in
    /// or a stream task finished since the last write: the connection task wakes itself and goes
    /// to the back of the run queue (a task waking itself is not run next), so the tasks
    /// answering meanwhile join this write. Without it, each task answering wakes the connection
    /// task, the runtime runs it next (its LIFO slot), and h2 writes and flushes one answer per
    /// system call. Calls answered inline need no deferral: their answers are all queued when
    /// the hold is lifted. Nothing waits on a timer.
    fn hold_or_defer(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.coalesce {
            return false;
        }
        // No waker registered: [`poll_coalesced`], the only one to set `hold`, polls again at
        // once with the writes let through (see "Held writes" in the module docs).
        if self.shared.hold.load(Relaxed) {
            self.shared.held.store(true, Relaxed);
            return true;
        }
        let armed = self.shared.armed.swap(false, Relaxed);
        if std::mem::take(&mut self.deferred) {
            return false;
        }
        if armed && self.shared.spawned.load(Relaxed) > 0 {
            self.deferred = true;
            cx.waker().wake_by_ref();
            return true;
        }
        false
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.replayed < PREFACE.len() {
            let n = buf.remaining().min(PREFACE.len() - this.replayed);
            buf.put_slice(&PREFACE[this.replayed..this.replayed + n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.shared.armed.store(true, Relaxed);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.hold_or_defer(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.hold_or_defer(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The executor of the connections' streams runs a future that is ready at once within
    /// `execute` (no task), spawns one that is pending (its task then finishes it), and
    /// survives a panic in the first poll.
    #[test]
    fn inline_executor_polls_once_then_spawns() {
        use hyper::rt::Executor as _;
        use std::sync::atomic::{AtomicBool, Ordering};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let exec = InlineExecutor {
            shared: Arc::new(ConnShared::default()),
        };
        rt.block_on(async {
            let ran = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&ran);
            exec.execute(async move { flag.store(true, Ordering::SeqCst) });
            assert!(
                ran.load(Ordering::SeqCst),
                "ready at once: run within execute"
            );

            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
            exec.execute(async move {
                let n = rx.await.unwrap();
                let _ = done_tx.send(n + 1);
            });
            tx.send(41).unwrap();
            assert_eq!(done_rx.await.unwrap(), 42, "pending: spawned and woken");
            while exec.shared.spawned.load(Relaxed) != 0 {
                tokio::task::yield_now().await; // the task is counted until it is dropped
            }

            exec.execute(async { panic!("a stream that panics") });
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            exec.execute(async move {
                let _ = tx.send(());
            });
            rx.await.expect("streams after a panicking one still run");
        });
    }

    /// The writes of a connection's poll are held, then let through by one more poll: what a
    /// poll queued reaches the socket together (regression: answering streams inline made h2
    /// write once per stream, as hyper asked it for the next one).
    #[test]
    fn writes_of_a_poll_go_out_together() {
        use tokio::io::AsyncWriteExt as _;
        /// A socket counting the writes that reach it.
        #[derive(Default)]
        struct Counting(Vec<usize>);
        impl AsyncRead for Counting {
            fn poll_read(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Pending
            }
        }
        impl AsyncWrite for Counting {
            fn poll_write(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                self.0.push(buf.len());
                Poll::Ready(Ok(buf.len()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        let mut io = Replayed::new(Counting::default(), true);
        let shared = Arc::clone(&io.shared);
        io.replayed = PREFACE.len();
        let mut polls = 0;
        // A connection that, each time it is polled, tries to write what it has queued.
        let mut conn = std::pin::pin!(std::future::poll_fn(|cx| {
            polls += 1;
            let mut write = std::pin::pin!(io.write_all(b"answers"));
            match write.as_mut().poll(cx) {
                Poll::Ready(r) => Poll::Ready(r.map(|()| polls)),
                Poll::Pending => Poll::Pending,
            }
        }));
        let mut cx = Context::from_waker(Waker::noop());
        let done = poll_coalesced(conn.as_mut(), &mut cx, &shared);
        assert!(
            matches!(done, Poll::Ready(Ok(2))),
            "held once, then written"
        );
        assert_eq!(io.io.0, vec![7], "one write of everything");
        assert!(!shared.held.load(Relaxed) && !shared.hold.load(Relaxed));
    }

    /// Regression (liveness): a write is deferred at most one turn, even when frames keep
    /// arriving and stream tasks keep finishing (each would arm another deferral).
    #[test]
    fn a_write_is_deferred_once_not_for_ever() {
        let mut io = Replayed::new((), true);
        let shared = Arc::clone(&io.shared);
        shared.spawned.store(3, Relaxed);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..3 {
            shared.armed.store(true, Relaxed);
            assert!(io.hold_or_defer(&mut cx), "deferred one turn");
            shared.armed.store(true, Relaxed);
            assert!(!io.hold_or_defer(&mut cx), "then written");
        }
        shared.spawned.store(0, Relaxed);
        shared.armed.store(true, Relaxed);
        assert!(
            !io.hold_or_defer(&mut cx),
            "no task to wait for: written at once"
        );
    }
}
