//! Queueing on a paused Tokio clock: requests a rule with `queue` denies wait for capacity
//! instead of getting 429, in order, never longer than `max_wait`, within `max_length`; a
//! request whose future is dropped leaves its line and its place is taken by the next one.
//! The decisions' clock (a `TokioClock` anchored on a whole second) runs on the same paused
//! time as the waits, so every instant below is exact.

use axum::body::Body;
use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::RuleSet;
use tollgate_tower::{RateLimitLayer, TokioClock};
use tower::{service_fn, Layer as _, Service, ServiceExt as _};

/// One request a second for everyone, and a line of `length` waiting up to `wait`.
fn layer(wait: &str, length: usize) -> RateLimitLayer {
    let rules = format!(
        "domain: web
http:
  - actions: [{{generic_key: {{descriptor_value: all}}}}]
descriptors:
  - key: generic_key
    value: all
    rate_limit: {{unit: second, requests_per_unit: 1, algorithm: fixed_window}}
    queue: {{max_wait: {wait}, max_length: {length}}}
"
    );
    let rules = RuleSet::from_sources(&[("web.yaml".into(), rules)]).unwrap();
    RateLimitLayer::builder()
        .rules(rules, "web")
        // A whole second: fixed windows start when the test does.
        .clock(TokioClock::anchored(1_700_000_000_000_000))
        .build()
        .unwrap()
}

/// One request a second shared by two tiers (neither guaranteed anything: they compete for
/// it), and a line of 3 waiting up to 5 s.
fn tiered() -> RateLimitLayer {
    let rules = "domain: web
http:
  - actions:
      - generic_key: {descriptor_value: all}
      - request_headers: {header_name: x-plan, descriptor_key: plan}
descriptors:
  - key: generic_key
    value: all
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}
    tiers: {key: plan, levels: [{value: paid, guaranteed: 0}, {value: free, guaranteed: 0}]}
    queue: {max_wait: 5s, max_length: 3}
";
    let rules = RuleSet::from_sources(&[("web.yaml".into(), rules.into())]).unwrap();
    RateLimitLayer::builder()
        .rules(rules, "web")
        .clock(TokioClock::anchored(1_700_000_000_000_000))
        .build()
        .unwrap()
}

/// An inner service recording each request's `x-id` and when it arrived.
type Seen = Arc<Mutex<Vec<(String, Duration)>>>;

fn recorder(
    seen: Seen,
    start: Instant,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
       + Clone
       + Send {
    service_fn(move |req: Request<Body>| {
        let seen = seen.clone();
        async move {
            let id = req.headers()["x-id"].to_str().unwrap().to_owned();
            seen.lock().unwrap().push((id, start.elapsed()));
            Ok::<_, Infallible>(Response::new(Body::from("done")))
        }
    })
}

fn request(id: &str) -> Request<Body> {
    Request::get("/")
        .header("x-id", id)
        .body(Body::empty())
        .unwrap()
}

/// A request of the tier its id starts with (`p`: paid, else free).
fn of_tier(id: &str) -> Request<Body> {
    let plan = if id.starts_with('p') { "paid" } else { "free" };
    Request::get("/")
        .header("x-id", id)
        .header("x-plan", plan)
        .body(Body::empty())
        .unwrap()
}

/// Let the spawned requests run until `n` wait in the layer's lines.
async fn until_waiting(layer: &RateLimitLayer, n: usize) {
    while layer.waiting() != n {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_order_within_max_wait_and_max_length() {
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let layer = layer("2500ms", 3);
    let svc = layer.clone().layer(recorder(seen.clone(), start));
    let first = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let mut waiting = Vec::new();
    for (n, id) in ["b", "c", "d"].into_iter().enumerate() {
        waiting.push((id, tokio::spawn(svc.clone().oneshot(request(id)))));
        until_waiting(&layer, n + 1).await;
    }
    // The line is full: the next one is refused at once.
    let full = svc.clone().oneshot(request("e")).await.unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = axum::body::to_bytes(full.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"rate limit exceeded (queue full)\n");
    assert_eq!(start.elapsed(), Duration::ZERO);
    let mut answers = Vec::new();
    for (id, call) in waiting {
        let r = call.await.unwrap().unwrap();
        answers.push((id, r.status(), start.elapsed()));
    }
    // b at the next window, c at the one after; d would pass at 3 s, past its 2.5 s: refused
    // as soon as that is known (when its turn came at 2 s), never after its deadline.
    assert_eq!(
        answers,
        [
            ("b", StatusCode::OK, Duration::from_secs(1)),
            ("c", StatusCode::OK, Duration::from_secs(2)),
            ("d", StatusCode::TOO_MANY_REQUESTS, Duration::from_secs(2)),
        ]
    );
    let order: Vec<(String, Duration)> = seen.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            ("a".into(), Duration::ZERO),
            ("b".into(), Duration::from_secs(1)),
            ("c".into(), Duration::from_secs(2)),
        ]
    );
    assert_eq!(layer.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_request_leaves_the_line_and_its_place_is_reused() {
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let layer = layer("5s", 1);
    let svc = layer.clone().layer(recorder(seen.clone(), start));
    assert_eq!(
        svc.clone().oneshot(request("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let gone = tokio::spawn(svc.clone().oneshot(request("gone")));
    until_waiting(&layer, 1).await;
    let full = svc.clone().oneshot(request("refused")).await.unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS, "max_length 1");
    // The client goes away: its future is dropped, its place freed at once.
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    assert_eq!(layer.waiting(), 0);
    let next = tokio::spawn(svc.clone().oneshot(request("next")));
    until_waiting(&layer, 1).await;
    assert_eq!(next.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let ids: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        ids,
        ["a", "next"],
        "the dropped request never reached the service"
    );
}

#[tokio::test(start_paused = true)]
async fn paid_requests_arriving_later_are_served_before_the_free_ones_waiting() {
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let layer = tiered();
    let svc = layer.clone().layer(recorder(seen.clone(), start));
    let first = svc.clone().oneshot(of_tier("a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The line fills with free requests.
    let mut free = Vec::new();
    for (n, id) in ["f1", "f2", "f3"].into_iter().enumerate() {
        free.push(tokio::spawn(svc.clone().oneshot(of_tier(id))));
        until_waiting(&layer, n + 1).await;
    }
    // Then paid ones arrive: each takes the place of the last free waiter, which is refused at
    // once, and waits ahead of every free one.
    let p1 = tokio::spawn(svc.clone().oneshot(of_tier("p1")));
    let f3 = free.pop().unwrap().await.unwrap().unwrap();
    assert_eq!(f3.status(), StatusCode::TOO_MANY_REQUESTS);
    let p2 = tokio::spawn(svc.clone().oneshot(of_tier("p2")));
    let f2 = free.pop().unwrap().await.unwrap().unwrap();
    assert_eq!(f2.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(layer.waiting(), 3);
    // A third paid one takes the place of the last free one, the head (which was waiting for
    // the next window). The line is then full of paid requests: a fourth is refused.
    let p3 = tokio::spawn(svc.clone().oneshot(of_tier("p3")));
    let f1 = free.pop().unwrap().await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(f1.status(), StatusCode::TOO_MANY_REQUESTS);
    let p4 = svc.clone().oneshot(of_tier("p4")).await.unwrap();
    assert_eq!(p4.status(), StatusCode::TOO_MANY_REQUESTS);
    for (call, at) in [(p1, 1), (p2, 2), (p3, 3)] {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(start.elapsed(), Duration::from_secs(at));
    }
    let ids: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(ids, ["a", "p1", "p2", "p3"]);
    assert_eq!(layer.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn free_requests_wait_behind_paid_ones_and_are_served_after_them() {
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let layer = tiered();
    let svc = layer.clone().layer(recorder(seen.clone(), start));
    assert_eq!(
        svc.clone().oneshot(of_tier("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let mut calls = Vec::new();
    for (n, id) in ["f1", "p1", "f2"].into_iter().enumerate() {
        calls.push(tokio::spawn(svc.clone().oneshot(of_tier(id))));
        until_waiting(&layer, n + 1).await;
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<(String, Duration)> = [("a", 0), ("p1", 1), ("f1", 2), ("f2", 3)]
        .into_iter()
        .map(|(id, s)| (id.to_owned(), Duration::from_secs(s)))
        .collect();
    assert_eq!(
        seen, expected,
        "highest tier first, then first come first served"
    );
}
