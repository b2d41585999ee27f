//! Byte-for-byte pins of the `/v1/check` and `/json` responses (body text, status, headers), so
//! that the response builders can be optimised without any client seeing a difference: key
//! order, `null`s, omitted defaults, number formatting and header spelling are all fixed here.

use axum::http::HeaderMap;
use axum::response::Response;
use tollgate_core::quota::{Algorithm, Unit};
use tollgate_server::envoy::envoy_response;
use tollgate_server::http::native_response;
use tollgate_server::{CheckResponse, Code, DescriptorStatus, HeaderValues, LimitInfo};

fn limit(name: Option<&str>, rpu: u64, unit: Unit, mult: u32, alg: Algorithm) -> LimitInfo {
    LimitInfo {
        id: "api|user".into(),
        name: name.map(str::to_string),
        requests_per_unit: rpu,
        unit,
        unit_multiplier: mult,
        algorithm: alg,
    }
}

fn status(code: Code, limit: Option<LimitInfo>, remaining: u64) -> DescriptorStatus {
    DescriptorStatus::new(code, limit, remaining)
}

/// Allowed; one limited, one unlimited, one unmatched descriptor; headers; no delay.
fn allowed() -> CheckResponse {
    let mut limited = status(
        Code::Ok,
        Some(limit(
            Some("per-user"),
            100,
            Unit::Minute,
            1,
            Algorithm::Gcra,
        )),
        99,
    );
    limited.reset_after = Some(600_001);
    let mut unlimited = status(Code::Ok, None, u32::MAX as u64);
    unlimited.unlimited = true;
    CheckResponse {
        allowed: true,
        statuses: vec![limited, unlimited, status(Code::Ok, None, 0)],
        headers: Some(HeaderValues {
            limit: 100,
            remaining: 99,
            reset_secs: 1,
            retry_after_secs: None,
            window_secs: 60,
        }),
        delay: 0,
        degrade: None,
        shadowbanned: false,
    }
}

/// Denied (retry later, message with characters JSON must escape), a shadowed denial, a leaky
/// bucket delay, a never-passing denial, sub-second durations and a multi-unit period.
fn denied() -> CheckResponse {
    let mut over = status(
        Code::OverLimit,
        Some(limit(
            None,
            5,
            Unit::Second,
            1,
            Algorithm::SlidingWindowCounter,
        )),
        0,
    );
    over.reset_after = Some(1_500_000);
    over.retry_after = Some(250);
    over.message = Some("slow \"down\"\n\\ é ☃ \u{1}".into());
    let mut shadow = status(
        Code::Ok,
        Some(limit(Some(""), 3, Unit::Hour, 2, Algorithm::FixedWindow)),
        0,
    );
    shadow.reset_after = Some(54_000_000);
    shadow.shadowed = true;
    let mut leaky = status(
        Code::Ok,
        Some(limit(
            Some("q"),
            7_000_000_000,
            Unit::Day,
            1,
            Algorithm::LeakyBucket,
        )),
        6_000_000_000,
    );
    leaky.reset_after = Some(0);
    leaky.delay = Some(1_001);
    let mut never = status(
        Code::OverLimit,
        Some(limit(None, 1, Unit::Year, 1, Algorithm::TokenBucket)),
        0,
    );
    never.reset_after = Some(31_556_952_000_001);
    never.never_passes = true;
    never.message = Some("request cost 2 exceeds what this limit can ever admit".into());
    CheckResponse {
        allowed: false,
        statuses: vec![over, shadow, leaky, never],
        headers: Some(HeaderValues {
            limit: 5,
            remaining: 0,
            reset_secs: 2,
            retry_after_secs: Some(1),
            window_secs: 1,
        }),
        delay: 1_001,
        degrade: None,
        shadowbanned: false,
    }
}

/// No limit applied at all: no headers, default-only statuses.
fn bare() -> CheckResponse {
    CheckResponse {
        allowed: true,
        statuses: vec![status(Code::Ok, None, 0)],
        headers: None,
        delay: 0,
        degrade: None,
        shadowbanned: false,
    }
}

async fn parts(r: Response) -> (u16, Vec<(String, String)>, String) {
    let status = r.status().as_u16();
    let headers = header_list(r.headers());
    let body = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .expect("body");
    (
        status,
        headers,
        String::from_utf8(body.to_vec()).expect("utf-8"),
    )
}

fn header_list(h: &HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| (k.to_string(), v.to_str().expect("ascii").to_string()))
        .collect()
}

fn hdrs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn native_allowed_bytes() {
    let (status, headers, body) = parts(native_response(&allowed())).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"delay_ms":null,"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"algorithm":"gcra","id":"api|user","name":"per-user","requests_per_unit":100,"unit":"MINUTE","unit_multiplier":1},"delay_ms":null,"duration_until_reset_ms":601,"limit_remaining":99,"message":null,"retry_after_ms":null,"shadow_mode":false},{"code":"OK","current_limit":null,"delay_ms":null,"duration_until_reset_ms":null,"limit_remaining":4294967295,"message":null,"retry_after_ms":null,"shadow_mode":false},{"code":"OK","current_limit":null,"delay_ms":null,"duration_until_reset_ms":null,"limit_remaining":0,"message":null,"retry_after_ms":null,"shadow_mode":false}]}"#
    );
    assert_eq!(
        headers,
        hdrs(&[
            ("content-type", "application/json"),
            ("x-ratelimit-limit", "100"),
            ("x-ratelimit-remaining", "99"),
            ("x-ratelimit-reset", "1"),
            ("ratelimit-policy", "100;w=60"),
            ("ratelimit", "limit=100, remaining=99, reset=1"),
        ])
    );
}

/// `degrade` and `shadowbanned` are written only when set, in the keys' alphabetical order; the
/// degrade header's value is the rule id, percent-encoded outside printable ASCII.
#[tokio::test]
async fn native_degrade_and_shadowban_bytes() {
    let degraded = CheckResponse {
        statuses: vec![status(Code::Ok, None, 0)],
        headers: None,
        degrade: Some("api|user=\u{e9}%".to_string()),
        ..allowed()
    };
    let (status_code, headers, body) = parts(native_response(&degraded)).await;
    assert_eq!(status_code, 200);
    assert_eq!(
        body,
        r#"{"degrade":"api|user=é%","delay_ms":null,"overall_code":"OK","statuses":[{"code":"OK","current_limit":null,"delay_ms":null,"duration_until_reset_ms":null,"limit_remaining":0,"message":null,"retry_after_ms":null,"shadow_mode":false}]}"#
    );
    assert_eq!(
        headers,
        hdrs(&[
            ("content-type", "application/json"),
            ("x-ratelimit-degrade", "api|user=%C3%A9%25"),
        ])
    );
    let banned = CheckResponse {
        allowed: false,
        statuses: vec![status(Code::OverLimit, None, 0)],
        headers: None,
        shadowbanned: true,
        ..allowed()
    };
    let (status_code, _, body) = parts(native_response(&banned)).await;
    assert_eq!(status_code, 429);
    assert_eq!(
        body,
        r#"{"delay_ms":null,"overall_code":"OVER_LIMIT","shadowbanned":true,"statuses":[{"code":"OVER_LIMIT","current_limit":null,"delay_ms":null,"duration_until_reset_ms":null,"limit_remaining":0,"message":null,"retry_after_ms":null,"shadow_mode":false}]}"#
    );
}

#[tokio::test]
async fn native_denied_bytes() {
    let (status, headers, body) = parts(native_response(&denied())).await;
    assert_eq!(status, 429);
    assert_eq!(
        body,
        r#"{"delay_ms":2,"overall_code":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","current_limit":{"algorithm":"sliding_window_counter","id":"api|user","name":null,"requests_per_unit":5,"unit":"SECOND","unit_multiplier":1},"delay_ms":null,"duration_until_reset_ms":1500,"limit_remaining":0,"message":"slow \"down\"\n\\ é ☃ \u0001","retry_after_ms":1,"shadow_mode":false},{"code":"OK","current_limit":{"algorithm":"fixed_window","id":"api|user","name":"","requests_per_unit":3,"unit":"HOUR","unit_multiplier":2},"delay_ms":null,"duration_until_reset_ms":54000,"limit_remaining":0,"message":null,"retry_after_ms":null,"shadow_mode":true},{"code":"OK","current_limit":{"algorithm":"leaky_bucket","id":"api|user","name":"q","requests_per_unit":7000000000,"unit":"DAY","unit_multiplier":1},"delay_ms":2,"duration_until_reset_ms":0,"limit_remaining":6000000000,"message":null,"retry_after_ms":null,"shadow_mode":false},{"code":"OVER_LIMIT","current_limit":{"algorithm":"token_bucket","id":"api|user","name":null,"requests_per_unit":1,"unit":"YEAR","unit_multiplier":1},"delay_ms":null,"duration_until_reset_ms":31556952001,"limit_remaining":0,"message":"request cost 2 exceeds what this limit can ever admit","retry_after_ms":null,"shadow_mode":false}]}"#
    );
    assert_eq!(
        headers,
        hdrs(&[
            ("content-type", "application/json"),
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "2"),
            ("ratelimit-policy", "5;w=1"),
            ("ratelimit", "limit=5, remaining=0, reset=2"),
            ("retry-after", "1"),
        ])
    );
}

#[tokio::test]
async fn native_bare_bytes() {
    let (status, headers, body) = parts(native_response(&bare())).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"delay_ms":null,"overall_code":"OK","statuses":[{"code":"OK","current_limit":null,"delay_ms":null,"duration_until_reset_ms":null,"limit_remaining":0,"message":null,"retry_after_ms":null,"shadow_mode":false}]}"#
    );
    assert_eq!(headers, hdrs(&[("content-type", "application/json")]));
}

#[tokio::test]
async fn envoy_json_bytes() {
    let (status, headers, body) = parts(envoy_response(&allowed())).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"name":"per-user","requestsPerUnit":100,"unit":"MINUTE"},"durationUntilReset":"0.600001s","limitRemaining":99},{"code":"OK","limitRemaining":4294967295},{"code":"OK"}]}"#
    );
    assert_eq!(headers, hdrs(&[("content-type", "application/json")]));

    let (status, _, body) = parts(envoy_response(&denied())).await;
    assert_eq!(status, 429);
    assert_eq!(
        body,
        r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":5,"unit":"SECOND"},"durationUntilReset":"1.500s"},{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"HOUR"},"durationUntilReset":"54s"},{"code":"OK","currentLimit":{"name":"q","requestsPerUnit":4294967295,"unit":"DAY"},"durationUntilReset":"0s","limitRemaining":4294967295},{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":1,"unit":"YEAR"},"durationUntilReset":"31556952.000001s"}]}"#
    );

    let empty = CheckResponse {
        allowed: true,
        statuses: vec![],
        headers: None,
        delay: 0,
        degrade: None,
        shadowbanned: false,
    };
    let (_, _, body) = parts(envoy_response(&empty)).await;
    assert_eq!(body, r#"{"overallCode":"OK"}"#);
}
