//! The gRPC listener answers a `ShouldRateLimit` call inside the connection's own poll when the
//! whole request is in hand and the store is in this process, and otherwise runs it as a task
//! (`grpc::InlineExecutor`, `Answer::Later`). These pin the cases that must take the second
//! way, and that one call's failure stays that call's: a request body that arrives in later
//! reads, a Redis that is slow to answer, and a store that panics, each beside ordinary calls on
//! the same HTTP/2 connection. Each runs on both `--grpc-engine`s: the plain engine must answer
//! these alike. And the versions of hyper and h2 that the inline engine was audited against are
//! pinned here (`audited_hyper_and_h2`).

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use http_body_util::BodyExt as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tollgate_core::rules::RuleSet;
use tollgate_core::{CheckItem, Decision, Micros, Store, StoreError};
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_server::grpc::{self, GrpcEngine, GrpcLimits};
use tollgate_server::{AppState, LoadedRules};
use tonic_prost::prost::Message as _;

const RULES: &str = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

/// The gRPC service of `state` on 127.0.0.1:0; stops when the sender is dropped or fires.
async fn start(state: AppState, engine: GrpcEngine) -> (String, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(grpc::serve(
        state,
        grpc::GrpcAnswers::default(),
        listener,
        GrpcLimits {
            engine,
            ..GrpcLimits::default()
        },
        16,
        Duration::from_secs(5),
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

fn rules() -> LoadedRules {
    LoadedRules::inline(RuleSet::from_sources(&[("rules.yaml".into(), RULES.into())]).unwrap())
}

/// One HTTP/2 connection, as a client library opens it.
async fn connect(addr: &str) -> hyper::client::conn::http2::SendRequest<ChanBody> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    client
}

/// A `ShouldRateLimit` message for `user`, length-prefixed as on the wire.
fn message(user: &str) -> Bytes {
    let req = RateLimitRequest {
        domain: "t".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitRequest::default()
    };
    let mut out = BytesMut::new();
    out.put_u8(0);
    out.put_u32(u32::try_from(req.encoded_len()).unwrap());
    req.encode(&mut out).unwrap();
    out.freeze()
}

/// Send a call whose body comes through the returned channel (each item one DATA frame; the
/// body ends when the sender is dropped); resolves to the `grpc-status` and the response.
fn call(
    client: &mut hyper::client::conn::http2::SendRequest<ChanBody>,
    addr: &str,
) -> (
    mpsc::Sender<Bytes>,
    impl std::future::Future<Output = (String, Option<RateLimitResponse>)>,
) {
    let (tx, rx) = mpsc::channel(4);
    let req = hyper::Request::post(format!(
        "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(ChanBody(rx))
    .unwrap();
    let sent = client.send_request(req);
    let answer = async move {
        let resp = tokio::time::timeout(Duration::from_secs(30), sent)
            .await
            .expect("answered")
            .unwrap();
        if let Some(status) = resp.headers().get("grpc-status") {
            return (status.to_str().unwrap().to_string(), None);
        }
        let body = resp.into_body().collect().await.unwrap();
        let status = body.trailers().expect("trailers")["grpc-status"]
            .to_str()
            .unwrap()
            .to_string();
        let mut data = body.to_bytes();
        assert_eq!(data.get_u8(), 0, "uncompressed");
        let len = data.get_u32() as usize;
        assert_eq!(data.len(), len, "one whole message");
        (status, Some(RateLimitResponse::decode(data).unwrap()))
    };
    (tx, answer)
}

/// One whole call on `client`: its status and overall code (0 when there is no message).
async fn whole_call(
    client: &mut hyper::client::conn::http2::SendRequest<ChanBody>,
    addr: &str,
    user: &str,
) -> (String, i32) {
    let (tx, answer) = call(client, addr);
    tx.send(message(user)).await.unwrap();
    drop(tx);
    let (status, resp) = answer.await;
    (status, resp.map_or(0, |r| r.overall_code))
}

/// Regression for the inline answer: a call whose message arrives in later reads (here in two
/// pieces, after the headers and after each other) is handed over unfinished, must not be
/// answered from what is there yet, and is answered once its body is complete, while calls on
/// the same connection are answered meanwhile.
async fn a_body_that_arrives_in_later_reads_is_still_answered(engine: GrpcEngine) {
    let (addr, _stop) = start(AppState::builder(rules()).build(), engine).await;
    let mut client = connect(&addr).await;
    let (tx, slow) = call(&mut client, &addr);
    let slow = tokio::spawn(slow);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Meanwhile, on the same connection: whole calls, answered (1 = OK, then 2 = OVER_LIMIT).
    assert_eq!(whole_call(&mut client, &addr, "bob").await, ("0".into(), 1));
    assert_eq!(whole_call(&mut client, &addr, "bob").await, ("0".into(), 2));
    let msg = message("alice");
    tx.send(msg.slice(..3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(msg.slice(3..)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(tx);
    let (status, resp) = slow.await.unwrap();
    assert_eq!(status, "0");
    assert_eq!(
        resp.expect("a message").overall_code,
        1,
        "OK: alice's first"
    );
}

/// A store whose counter `user_boom` panics (a bug in a store), the others decided by the
/// memory store.
struct PanickyStore(tollgate_core::memory::MemoryStore);

impl Store for PanickyStore {
    fn check(&self, now: Micros, items: &[CheckItem<'_>]) -> Result<Vec<Decision>, StoreError> {
        if items.iter().any(|i| i.key.contains("boom")) {
            panic!("store bug");
        }
        self.0.check(now, items)
    }
}

/// A call that panics while it is answered inside the connection's poll gets INTERNAL, and the
/// connection and its other calls go on.
async fn a_panicking_call_is_internal_and_the_connection_goes_on(engine: GrpcEngine) {
    let store = Arc::new(PanickyStore(tollgate_core::memory::MemoryStore::new(1000)));
    let (addr, _stop) = start(AppState::builder(rules()).store(store).build(), engine).await;
    let mut client = connect(&addr).await;
    assert_eq!(
        whole_call(&mut client, &addr, "carol").await,
        ("0".into(), 1)
    );
    let (status, code) = whole_call(&mut client, &addr, "boom").await;
    assert_eq!((status.as_str(), code), ("13", 0), "INTERNAL");
    assert_eq!(
        whole_call(&mut client, &addr, "carol").await,
        ("0".into(), 2)
    );
    assert_eq!(
        whole_call(&mut client, &addr, "dave").await,
        ("0".into(), 1)
    );
}

/// Calls over Redis are never answered on their first poll: while Redis sleeps (`DEBUG
/// SLEEP`), they wait as tasks and are answered when it wakes, and so is a second connection's.
#[test]
fn calls_over_a_slow_redis_are_answered_when_it_answers() {
    calls_over_a_slow_redis(GrpcEngine::Inline);
    calls_over_a_slow_redis(GrpcEngine::Plain);
}

fn calls_over_a_slow_redis(engine: GrpcEngine) {
    let redis = tollgate_testsupport::RedisServer::start(&["--enable-debug-command", "yes"]);
    let rt = tollgate_testsupport::runtime();
    rt.block_on(async {
        let opts = tollgate_redis::RedisOptions {
            timeout: Duration::from_secs(10),
            ..tollgate_redis::RedisOptions::default()
        };
        let store = tollgate_redis::RedisStore::connect(&redis.url(), opts)
            .await
            .unwrap();
        let guarded = tollgate_redis::guard::Guarded::start(
            store,
            tollgate_redis::guard::RedisSettings::default(),
        )
        .await;
        let state = AppState::builder(rules()).redis(guarded).build();
        let (addr, _stop) = start(state, engine).await;
        let mut a = connect(&addr).await;
        let mut b = connect(&addr).await;
        assert_eq!(whole_call(&mut a, &addr, "erin").await, ("0".into(), 1));
        let port = redis.port;
        let sleeper =
            std::thread::spawn(move || tollgate_testsupport::cli(port, &["DEBUG", "SLEEP", "0.5"]));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (first, second) = tokio::join!(
            whole_call(&mut a, &addr, "erin"),
            whole_call(&mut b, &addr, "frank")
        );
        assert_eq!(first, ("0".into(), 2), "OVER_LIMIT: erin's second");
        assert_eq!(second, ("0".into(), 1), "OK: frank's first");
        sleeper.join().unwrap();
    });
}

/// A request body fed through a channel (each item one DATA frame, flow control by hyper).
struct ChanBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|d| d.map(|d| Ok(hyper::body::Frame::data(d))))
    }
}

// Each test on both engines: `NAME::inline` and `NAME::plain`.
tollgate_testsupport::test_each!([inline = GrpcEngine::Inline, plain = GrpcEngine::Plain];
    a_body_that_arrives_in_later_reads_is_still_answered,
    a_panicking_call_is_internal_and_the_connection_goes_on,
);

/// The versions of hyper and h2 whose sources the inline engine's invariants were checked
/// against (the docs of `tollgate_server::grpc`'s `engine` module, "What the inline engine relies on").
const AUDITED: &[(&str, &str)] = &[("hyper", "1.12.0"), ("h2", "0.4.20")];

/// Fails when `Cargo.lock` resolves hyper or h2 to a version other than the audited one (a
/// `cargo update`, a new dependency pulling another major): the inline engine rests on
/// behaviour of theirs that they do not promise.
#[test]
fn audited_hyper_and_h2() {
    let lock = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock");
    let lock = std::fs::read_to_string(lock).expect("the workspace's Cargo.lock");
    for (name, audited) in AUDITED {
        let resolved = locked_versions(&lock, name);
        assert!(
            resolved == [*audited],
            "Cargo.lock resolves {name} {resolved:?}, but the inline gRPC engine was audited \
             against {name} {audited} only. Re-audit the invariants in the module docs of \
             crates/tollgate-server/src/grpc/engine.rs (\"What the inline engine relies on\": I1 to I4) \
             against the new {name} sources, then update AUDITED in {}. Until then, \
             `--grpc-engine plain` does not depend on them.",
            file!()
        );
    }
}

/// The binary, whose default is the inline engine, pins the audited versions exactly in its
/// manifest, so a build outside this workspace's lock file (`cargo install`) resolves them too.
#[test]
fn the_binary_pins_the_audited_hyper_and_h2() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../tollgate/Cargo.toml");
    let manifest = std::fs::read_to_string(manifest).expect("crates/tollgate/Cargo.toml");
    for (name, audited) in AUDITED {
        let pin = format!("{name} = {{ version = \"={audited}\"");
        assert!(
            manifest.lines().any(|l| l.starts_with(&pin)),
            "crates/tollgate/Cargo.toml must pin {name} to ={audited} (the inline gRPC engine's \
             audited version): no line starts with `{pin}`"
        );
    }
}

/// A crate that embeds the library gets the engine that rests only on documented behaviour;
/// the inline one is chosen by the binary (or an embedder whose lock holds the audited versions).
#[test]
fn the_library_defaults_to_the_plain_engine() {
    assert_eq!(GrpcLimits::default().engine, GrpcEngine::Plain);
    assert_eq!(GrpcEngine::default(), GrpcEngine::Plain);
}

/// The versions of package `name` in a `Cargo.lock` (`[[package]]` tables, `name` then
/// `version` lines).
fn locked_versions<'a>(lock: &'a str, name: &str) -> Vec<&'a str> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    let mut out = Vec::new();
    while let Some(line) = lines.next() {
        if line == wanted {
            if let Some(version) = lines
                .next()
                .and_then(|l| l.strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'))
            {
                out.push(version);
            }
        }
    }
    out
}
