//! One gRPC connection: the HTTP/2 preface read within the handshake timeout, hyper's HTTP/2
//! server with the [`GrpcLimits`](super::GrpcLimits), the connection's age (GOAWAY, then the
//! grace), and every poll of it under `catch_unwind`: a panic out of h2 poisons that
//! connection's state, so it is closed and the listener and the other connections go on.

use super::call::{call_timeout, should_rate_limit, within, Answer, SHOULD_RATE_LIMIT_PATH};
use super::engine::{poll_coalesced, ConnShared, InlineExecutor, Replayed, PREFACE};
use super::limits::{nonzero, sleep_or_never, GrpcEngine, GrpcLimits};
use super::rls::RateLimitGrpc;

use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::watch;
use tonic::codegen::http::Request as HttpRequest;
use tonic::codegen::{http, Body, StdError};
use tonic::service::Routes;
use tower::ServiceExt as _;

/// One connection (its slot of `--max-connections` held by the accept loop until this ends):
/// the preface within the handshake timeout, then HTTP/2 until the client leaves, the
/// connection's age (GOAWAY, then at most the grace) or shutdown (`drain`: GOAWAY, then until
/// the accept loop gives up and drops this task).
pub(super) async fn connection<S>(
    mut tcp: S,
    services: Services,
    limits: GrpcLimits,
    mut drain: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut preface = [0u8; PREFACE.len()];
    let read = tokio::select! {
        r = tokio::time::timeout(limits.handshake_timeout, tcp.read_exact(&mut preface)) => r,
        _ = drain.wait_for(|d| *d) => return,
    };
    match read {
        Ok(Ok(_)) if &preface == PREFACE => {}
        Ok(Ok(_)) => {
            tracing::debug!("gRPC connection closed: not HTTP/2");
            return;
        }
        Ok(Err(_)) => return,
        Err(_) => {
            tracing::debug!(
                "gRPC connection closed: no HTTP/2 preface within the handshake timeout"
            );
            return;
        }
    }
    let inline = limits.engine == GrpcEngine::Inline;
    let service = hyper::service::service_fn(move |req: HttpRequest<Incoming>| {
        let answer = if inline
            && req.method() == http::Method::POST
            && req.uri().path() == SHOULD_RATE_LIMIT_PATH
        {
            should_rate_limit(
                &services.rls,
                req,
                services.max_message,
                limits.request_timeout,
            )
        } else {
            let timeout = call_timeout(req.headers(), limits.request_timeout);
            let call = services.routes.clone().oneshot(req).map(|r| match r {
                Ok(response) => response.map(http_body_util::Either::Right),
                Err(never) => match never {},
            });
            Answer::Later(Box::pin(within(timeout, call)))
        };
        answer
    });
    serve_http2(Replayed::new(tcp, inline), service, limits, drain).await;
}

/// Serve HTTP/2 on `io` with `service`, its streams run by `limits.engine`'s executor, until
/// [`drive`] ends it.
async fn serve_http2<S, Svc, B>(
    io: Replayed<S>,
    service: Svc,
    limits: GrpcLimits,
    drain: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    Svc: hyper::service::HttpService<Incoming, ResBody = B>,
    Svc::Error: Into<StdError>,
    B: Body + 'static,
    B::Error: Into<StdError>,
    InlineExecutor: hyper::rt::bounds::Http2ServerConnExec<Svc::Future, B>,
    hyper_util::rt::TokioExecutor: hyper::rt::bounds::Http2ServerConnExec<Svc::Future, B>,
{
    let shared = Arc::clone(&io.shared);
    let io = TokioIo::new(io);
    match limits.engine {
        GrpcEngine::Inline => {
            let exec = InlineExecutor {
                shared: Arc::clone(&shared),
            };
            let conn = limits.builder(exec).serve_connection(io, service);
            drive(conn, Some(&shared), limits, drain).await;
        }
        GrpcEngine::Plain => {
            let exec = hyper_util::rt::TokioExecutor::new();
            let conn = limits.builder(exec).serve_connection(io, service);
            drive(conn, None, limits, drain).await;
        }
    }
}

/// hyper's HTTP/2 connection as [`drive`] uses it, whatever runs its streams.
trait Http2Conn: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, E, B> Http2Conn for http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<StdError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: Body + 'static,
    B::Error: Into<StdError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

/// A panic came out of hyper's connection: h2's state is poisoned, the connection is closed.
#[derive(Debug)]
struct ConnPanicked;

/// Serve `conn` until the client leaves, the connection's age (GOAWAY, then at most the grace)
/// or `drain` (GOAWAY, then until the caller drops this task). `coalesce`: the inline engine's
/// connection, polled by [`poll_coalesced`].
///
/// Every poll of hyper's connection, and its graceful shutdown, is made under `catch_unwind`
/// (see I4 in the `engine` module docs): a panic out of hyper's connection means h2's mutex is
/// poisoned, and the connection is closed ([`close_poisoned`]) instead of unwinding this task.
async fn drive<C>(
    conn: C,
    coalesce: Option<&ConnShared>,
    limits: GrpcLimits,
    mut drain: watch::Receiver<bool>,
) where
    C: Http2Conn<Output = hyper::Result<()>>,
{
    let mut conn = Box::pin(conn);
    let grace = tokio::select! {
        r = std::future::poll_fn(|cx| poll_caught(conn.as_mut(), cx, coalesce)) => Err(r),
        () = sleep_or_never(nonzero(limits.max_connection_age)) => {
            Ok(Some(limits.max_connection_age_grace))
        }
        _ = drain.wait_for(|d| *d) => Ok(None),
    };
    let grace = match grace {
        Ok(grace) => grace,
        Err(Ok(Ok(()))) => return,
        Err(Ok(Err(e))) => {
            tracing::debug!(error = %e, "gRPC connection ended");
            return;
        }
        Err(Err(ConnPanicked)) => return close_poisoned(conn),
    };
    let shutdown = std::panic::catch_unwind(AssertUnwindSafe(|| conn.as_mut().graceful_shutdown()));
    if shutdown.is_err() {
        return close_poisoned(conn);
    }
    let closed = tokio::select! {
        r = std::future::poll_fn(|cx| poll_caught(conn.as_mut(), cx, coalesce)) => r.is_ok(),
        () = sleep_or_never(grace) => {
            tracing::debug!("gRPC connection closed: max connection age and grace reached");
            true
        }
    };
    if !closed {
        close_poisoned(conn);
    }
}

/// Poll hyper's connection (through [`poll_coalesced`] when `coalesce`), a panic out of it
/// caught.
fn poll_caught<F: Future>(
    conn: Pin<&mut F>,
    cx: &mut Context<'_>,
    coalesce: Option<&ConnShared>,
) -> Poll<Result<F::Output, ConnPanicked>> {
    let polled = std::panic::catch_unwind(AssertUnwindSafe(|| match coalesce {
        Some(shared) => poll_coalesced(conn, cx, shared),
        None => conn.poll(cx),
    }));
    match polled {
        Ok(poll) => poll.map(Ok),
        Err(_) => Poll::Ready(Err(ConnPanicked)),
    }
}

/// Close a connection whose h2 state is poisoned: drop it (the socket closes; not even a
/// GOAWAY can be written, h2 writes under that lock), its slot released by the caller. Calls in
/// flight on it fail at the client (UNAVAILABLE); other connections are not concerned.
fn close_poisoned<C>(conn: Pin<Box<C>>) {
    tracing::error!(
        "gRPC connection closed: a panic while HTTP/2's state was locked left it unusable"
    );
    // A stream handle dropped with it may find the lock poisoned and panic again.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(conn)));
}

/// What a gRPC connection serves: `ShouldRateLimit` directly (`should_rate_limit`),
/// everything else (health, reflection, unknown methods) through tonic's routes.
#[derive(Clone)]
pub(super) struct Services {
    pub(super) routes: Routes,
    pub(super) rls: Arc<RateLimitGrpc>,
    /// `--max-body-bytes`: the largest request message.
    pub(super) max_message: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    use tokio::net::TcpListener;

    /// A response body of one DATA frame whose `Buf` panics when h2 measures it, which h2 does
    /// under its streams mutex: the panic poisons the connection's HTTP/2 state, as a bug in h2
    /// would. hyper measures it first, outside the lock: that first measure answers 0 (an
    /// empty frame, handed to h2 at once). It reports on its channel just before panicking.
    struct PoisoningBody(Option<PoisoningBuf>);
    struct PoisoningBuf {
        measured: std::sync::atomic::AtomicUsize,
        reached: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    }

    impl bytes::Buf for PoisoningBuf {
        fn remaining(&self) -> usize {
            if self.measured.fetch_add(1, Relaxed) == 0 {
                return 0;
            }
            if let Some(reached) = self.reached.lock().unwrap().take() {
                let _ = reached.send(());
            }
            panic!("a Buf that panics under h2's lock");
        }
        fn chunk(&self) -> &[u8] {
            &[]
        }
        fn advance(&mut self, _: usize) {}
    }

    impl Body for PoisoningBody {
        type Data = PoisoningBuf;
        type Error = Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<PoisoningBuf>, Infallible>>> {
            Poll::Ready(
                self.get_mut()
                    .0
                    .take()
                    .map(|b| Ok(hyper::body::Frame::data(b))),
            )
        }
    }

    /// A connection whose HTTP/2 state a panic poisoned is closed: the client's calls on it
    /// fail, and the connection's task ends normally (no panic out of it; the listener and the
    /// other connections are other tasks). On both engines.
    fn a_poisoned_connection_is_closed(engine: GrpcEngine) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (reached_tx, reached) = tokio::sync::oneshot::channel();
            let reached_tx = std::sync::Mutex::new(Some(reached_tx));
            let server = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let service = hyper::service::service_fn(move |_req: HttpRequest<Incoming>| {
                    let buf = PoisoningBuf {
                        measured: AtomicUsize::new(0),
                        reached: std::sync::Mutex::new(reached_tx.lock().unwrap().take()),
                    };
                    let response = http::Response::new(PoisoningBody(Some(buf)));
                    async move { Ok::<_, Infallible>(response) }
                });
                let mut io = Replayed::new(tcp, engine == GrpcEngine::Inline);
                io.replayed = PREFACE.len(); // the client's preface is read by hyper itself
                let limits = GrpcLimits {
                    engine,
                    ..GrpcLimits::default()
                };
                let (_drain_tx, drain) = watch::channel(false);
                serve_http2(io, service, limits, drain).await;
            });
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut client, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                TokioIo::new(tcp),
            )
            .await
            .unwrap();
            let client_conn = tokio::spawn(conn);
            let request = || {
                http::Request::post(format!("http://{addr}/x"))
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap()
            };
            /// `f`, with a bound on a hang (a failure, not a synchronisation).
            fn within<F: Future>(f: F) -> tokio::time::Timeout<F> {
                tokio::time::timeout(Duration::from_secs(10), f)
            }
            let first = client.send_request(request());
            let first = tokio::spawn(async move {
                let response = first.await?;
                http_body_util::BodyExt::collect(response.into_body()).await
            });
            within(reached).await.expect("the body reached h2").unwrap();
            // The poisoned lock is found by the connection's next poll at the latest: this
            // call's frames wake it (the plain engine's stream task panicked on its own).
            let second = within(client.send_request(request()))
                .await
                .expect("the connection ends");
            assert!(second.is_err(), "a call on a poisoned connection fails");
            let first = within(first).await.expect("the call ends").unwrap();
            assert!(first.is_err(), "the call that poisoned it fails");
            within(server)
                .await
                .expect("the connection is closed")
                .expect("and its task ends without a panic");
            let _ = within(client_conn)
                .await
                .expect("the client sees it closed");
        });
    }

    #[test]
    fn a_poisoned_connection_is_closed_inline() {
        a_poisoned_connection_is_closed(GrpcEngine::Inline);
    }

    #[test]
    fn a_poisoned_connection_is_closed_plain() {
        a_poisoned_connection_is_closed(GrpcEngine::Plain);
    }
}
