//! The gRPC listener's settings: its HTTP/2 and connection limits ([`GrpcLimits`], the
//! `--grpc-*` flags) and which engine serves `ShouldRateLimit` ([`GrpcEngine`]).

use hyper::server::conn::http2;
use hyper_util::rt::TokioTimer;
use std::time::Duration;

/// HTTP/2 and connection limits of the gRPC listener, and its engine (`--grpc-*` flags). A zero
/// duration turns the keepalive pings and the connection age off.
///
/// The defaults bound one connection's memory to about `max_concurrent_streams` requests of at
/// most `--max-body-bytes` plus the connection window, whatever the client sends: streams beyond
/// the cap are refused (`REFUSED_STREAM`), and a stream that never finishes its request is
/// answered `DEADLINE_EXCEEDED` after `request_timeout`, freeing its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcLimits {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (`--grpc-max-concurrent-streams`, default 100, Envoy's
    /// recommended edge value and RFC 9113's suggested minimum). Streams beyond it are refused.
    pub max_concurrent_streams: u32,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE` (`--grpc-max-header-list-bytes`, default 16 KiB).
    pub max_header_list_bytes: u32,
    /// Interval of the server's HTTP/2 PING frames (`--grpc-keepalive-interval`, default 60 s).
    pub keepalive_interval: Duration,
    /// A PING not acknowledged within this closes the connection (`--grpc-keepalive-timeout`,
    /// default 20 s, as gRPC).
    pub keepalive_timeout: Duration,
    /// After this, a connection gets GOAWAY so the client reconnects, and a load balancer such as
    /// Envoy rebalances (`--grpc-max-connection-age`, default 24 h as envoyproxy/ratelimit).
    pub max_connection_age: Duration,
    /// How long calls may still run on a connection past its age before it is closed
    /// (`--grpc-max-connection-age-grace`, default 1 h as envoyproxy/ratelimit).
    pub max_connection_age_grace: Duration,
    /// A call not answered within this (body still unsent included) gets DEADLINE_EXCEEDED
    /// (`--grpc-request-timeout`, default 10 s).
    pub request_timeout: Duration,
    /// A connection that has not sent the HTTP/2 preface within this is closed
    /// (`--grpc-handshake-timeout`, default 10 s).
    pub handshake_timeout: Duration,
    /// Per-stream receive window (`SETTINGS_INITIAL_WINDOW_SIZE`), 64 KiB: the most a client may
    /// send on a stream before the service reads it.
    pub stream_window_bytes: u32,
    /// Per-connection receive window, 1 MiB: the most a client may have in flight on one
    /// connection.
    pub connection_window_bytes: u32,
    /// `SETTINGS_MAX_FRAME_SIZE`, 16 KiB (the protocol's minimum).
    pub max_frame_bytes: u32,
    /// How `ShouldRateLimit` is served (`--grpc-engine`). The library's default is
    /// [`GrpcEngine::Plain`]; the `tollgate` binary chooses [`GrpcEngine::Inline`].
    pub engine: GrpcEngine,
}

/// How the gRPC listener serves `ShouldRateLimit` (`--grpc-engine`). Both answer the same
/// statuses and messages; only the cost and the HTTP/2 machinery differ (see the `engine`
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrpcEngine {
    /// Answered on hyper's stream inside the connection's poll, streams polled once inline and
    /// writes coalesced: the fast path, resting on the hyper and h2 behaviour written down in
    /// the `engine` module docs, audited for hyper 1.12.0 and h2 0.4.20 only. Choose it only
    /// where the build resolves exactly those (the `tollgate` binary pins them).
    Inline,
    /// Through tonic's routes like every other method, each stream a spawned task, writes as
    /// h2 makes them: only what hyper and tonic document. The library's default, and the
    /// fallback if a hyper or h2 update breaks the inline engine's assumptions.
    #[default]
    Plain,
}

impl GrpcEngine {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::Plain => "plain",
        }
    }
}

impl std::fmt::Display for GrpcEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--grpc-engine` value that is neither `inline` nor `plain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGrpcEngine(pub String);

impl std::fmt::Display for UnknownGrpcEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown gRPC engine `{}` (inline or plain)", self.0)
    }
}

impl std::error::Error for UnknownGrpcEngine {}

impl std::str::FromStr for GrpcEngine {
    type Err = UnknownGrpcEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inline" => Ok(Self::Inline),
            "plain" => Ok(Self::Plain),
            other => Err(UnknownGrpcEngine(other.to_owned())),
        }
    }
}

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            max_header_list_bytes: 16 * 1024,
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            max_connection_age: Duration::from_secs(24 * 3600),
            max_connection_age_grace: Duration::from_secs(3600),
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            stream_window_bytes: 64 * 1024,
            connection_window_bytes: 1024 * 1024,
            max_frame_bytes: 16 * 1024,
            engine: GrpcEngine::Plain,
        }
    }
}

impl GrpcLimits {
    /// The HTTP/2 connection settings these limits stand for, streams run by `exec`.
    pub(super) fn builder<E>(&self, exec: E) -> http2::Builder<E> {
        let mut b = http2::Builder::new(exec);
        b.timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_header_list_size(self.max_header_list_bytes)
            .initial_stream_window_size(self.stream_window_bytes)
            .initial_connection_window_size(self.connection_window_bytes)
            .max_frame_size(self.max_frame_bytes)
            .keep_alive_interval(nonzero(self.keepalive_interval))
            .keep_alive_timeout(self.keepalive_timeout)
            // No `date` header on every answer: gRPC does not use it (grpc-go sends none), and
            // it costs a clock read, a header and its HPACK encoding per call.
            .auto_date_header(false);
        b
    }
}

pub(super) fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Sleep for `d`, or forever when it is `None`.
pub(super) async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_by_name() {
        for engine in [GrpcEngine::Inline, GrpcEngine::Plain] {
            assert_eq!(engine.as_str().parse(), Ok(engine));
        }
        assert_eq!(GrpcEngine::default(), GrpcEngine::Plain);
        assert_eq!(
            "fast".parse::<GrpcEngine>(),
            Err(UnknownGrpcEngine("fast".into()))
        );
    }

    #[test]
    fn default_limits_bound_a_connection() {
        let l = GrpcLimits::default();
        assert_eq!(l.max_concurrent_streams, 100);
        assert_eq!(l.max_header_list_bytes, 16 * 1024);
        assert!(l.stream_window_bytes <= l.connection_window_bytes);
        assert_eq!(nonzero(Duration::ZERO), None);
    }
}
