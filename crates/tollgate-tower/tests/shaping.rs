//! Shaping on a paused Tokio clock: a leaky bucket used as a queue delays a burst into a steady
//! rate (the decisions' clock, a `TokioClock`, runs on the same paused time as the sleeps, so
//! the spacing is exact), `max_wait` refuses what would wait longer, and a dropped request
//! never reaches the inner service.

use axum::body::Body;
use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tollgate_tower::{Algorithm, Key, Quota, RateLimitLayer, TokioClock, Unit};
use tower::{service_fn, Layer as _, Service, ServiceExt as _};

/// An inner service that records when each request reached it.
fn recorder(
    seen: Arc<Mutex<Vec<Instant>>>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
       + Clone
       + Send {
    service_fn(move |_req: Request<Body>| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(Instant::now());
            Ok::<_, Infallible>(Response::new(Body::from("done")))
        }
    })
}

fn shaping(max_wait: Duration) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(
            Quota::new(5, Unit::Second)
                .with_algorithm(Algorithm::LeakyBucket)
                .with_burst(10),
        )
        .key(Key::global())
        .clock(TokioClock::new())
        .max_wait(max_wait)
        .build()
        .unwrap()
}

fn request() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn ten_at_once_reach_the_service_200_ms_apart() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = shaping(Duration::from_secs(10)).layer(recorder(seen.clone()));
    let start = Instant::now();
    let calls: Vec<_> = (0..10)
        .map(|_| tokio::spawn(svc.clone().oneshot(request())))
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let mut offsets: Vec<Duration> = seen.lock().unwrap().iter().map(|t| *t - start).collect();
    offsets.sort();
    let expected: Vec<Duration> = (0..10).map(|k| Duration::from_millis(200 * k)).collect();
    assert_eq!(offsets, expected);
    // An eleventh request keeps the rate: 200 ms after the tenth.
    let before = Instant::now();
    svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(Instant::now() - before, Duration::from_millis(200));
    // Once the queue has drained, a request waits for nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = Instant::now();
    svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(Instant::now() - before, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn max_wait_refuses_what_would_wait_longer_and_it_consumes_nothing() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    // 500 ms of waiting drains 2 more requests behind the first: 3 fit.
    let svc = shaping(Duration::from_millis(500)).layer(recorder(seen.clone()));
    let calls: Vec<_> = (0..10)
        .map(|_| tokio::spawn(svc.clone().oneshot(request())))
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        let r = c.await.unwrap().unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.headers().contains_key("retry-after"));
        }
        statuses.push(r.status());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 3, "{statuses:?}");
    assert_eq!(seen.lock().unwrap().len(), 3);
    // The 7 refused requests took no place in the queue: once it drained, 3 fit again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again: Vec<_> = (0..4)
        .map(|_| tokio::spawn(svc.clone().oneshot(request())))
        .collect();
    let mut ok = 0;
    for c in again {
        ok += usize::from(c.await.unwrap().unwrap().status() == StatusCode::OK);
    }
    assert_eq!(ok, 3);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_waiting_never_reaches_the_service() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = shaping(Duration::from_secs(10)).layer(recorder(seen.clone()));
    svc.clone().oneshot(request()).await.unwrap();
    // The second one must wait 200 ms; the client gives up after 100.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), svc.clone().oneshot(request())).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the dropped request was not served"
    );
}

/// A layer built while Tokio's clock is paused gets the exact Tokio clock by default (the
/// cheaper counter clock would not stop with it): paused time decides, here time advanced by
/// hand refills a limit that real time never could.
#[tokio::test(start_paused = true)]
async fn the_default_clock_follows_a_clock_paused_before_build() {
    let layer = RateLimitLayer::builder()
        .quota(Quota::new(1, Unit::Hour).with_algorithm(Algorithm::Gcra))
        .key(Key::global())
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = layer.layer(recorder(seen));
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    let denied = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
}
