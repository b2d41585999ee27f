//! Shared by the registry tests: the admin token, registry requests with headers, and waits.

use super::client::{send_with, HttpResponse, Method};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The admin token the tests configure.
pub const TOKEN: &str = "registry-test-token-7f3a9c";

/// Write [`TOKEN`] (with a trailing newline, as editors leave it) into `dir/token`.
pub fn token_file(dir: &Path) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    path
}

/// `method path` with a body of `content_type` and extra headers.
pub fn call(
    base: &str,
    method: Method,
    path: &str,
    body: Option<(&str, &str)>,
    headers: &[(&str, &str)],
) -> HttpResponse {
    call_within(base, method, path, body, headers, Duration::from_secs(10))
}

/// [`call`], waiting for the answer up to `bound`.
pub fn call_within(
    base: &str,
    method: Method,
    path: &str,
    body: Option<(&str, &str)>,
    headers: &[(&str, &str)],
    bound: Duration,
) -> HttpResponse {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(send_with(
        base,
        method,
        path,
        body.map(|(t, b)| (t, b.to_string())),
        headers,
        bound,
    ))
    .expect("HTTP request")
}

/// `tollgate serve` in `dir` on an ephemeral HTTP port (no gRPC) with `--rules rules` (a file
/// or a directory) and `extra` flags: no admin token unless `extra` names one.
pub fn serve_http(dir: &Path, rules: &Path, extra: &[&str], name: &str) -> super::Server {
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "off",
        "--rules",
        rules.to_str().unwrap(),
    ];
    args.extend(extra);
    super::Server::start(&args, dir, name)
}

/// [`serve_http`] with the admin token of [`token_file`].
pub fn serve_registry(dir: &Path, rules: &Path, extra: &[&str], name: &str) -> super::Server {
    let token = token_file(dir);
    let mut args = vec!["--admin-token-file", token.to_str().unwrap()];
    args.extend(extra);
    serve_http(dir, rules, &args, name)
}

/// `PUT /v1/domains/{domain}` with the admin token, a YAML body and optional `If-Match`.
pub fn put(base: &str, domain: &str, yaml: &str, if_match: Option<&str>) -> HttpResponse {
    let auth = format!("Bearer {TOKEN}");
    let mut headers = vec![("authorization", auth.as_str())];
    if let Some(v) = if_match {
        headers.push(("if-match", v));
    }
    call(
        base,
        Method::PUT,
        &format!("/v1/domains/{domain}"),
        Some(("application/yaml", yaml)),
        &headers,
    )
}

/// `GET path` with the admin token (registry reads, the full `/v1/rules` listing).
pub fn admin_get(base: &str, path: &str) -> HttpResponse {
    let auth = format!("Bearer {TOKEN}");
    call(
        base,
        Method::GET,
        path,
        None,
        &[("authorization", auth.as_str())],
    )
}

/// `DELETE /v1/domains/{domain}` with the admin token.
pub fn delete(base: &str, domain: &str) -> HttpResponse {
    let auth = format!("Bearer {TOKEN}");
    call(
        base,
        Method::DELETE,
        &format!("/v1/domains/{domain}"),
        None,
        &[("authorization", auth.as_str())],
    )
}

/// One rules body: `domain` limits each `user` to `limit` per minute.
pub fn user_limit(domain: &str, limit: u64) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"
    )
}

/// The limit (`requests_per_unit`) that applies to `user=value` in `domain` right now, asked
/// with `hits_addend: 0` (nothing counted); `None` when no rule matches.
pub fn current_limit(base: &str, domain: &str, value: &str) -> Option<u64> {
    let body = json!({
        "domain": domain,
        "hits_addend": 0,
        "descriptors": [{"entries": [{"key": "user", "value": value}]}],
    });
    let r = call(
        base,
        Method::POST,
        "/v1/check",
        Some(("application/json", &body.to_string())),
        &[],
    );
    let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    v["statuses"][0]["current_limit"]["requests_per_unit"].as_u64()
}

/// Poll `f` every few milliseconds until it is true or `limit` passes: how long it took.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if f() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The entry of `domain` in a listing's `domains` (`/v1/domains`, `/v1/rules`).
pub fn listed(listing: &Value, domain: &str) -> Value {
    listing["domains"]
        .as_array()
        .unwrap_or_else(|| panic!("no domains in {listing}"))
        .iter()
        .find(|d| d["domain"] == domain)
        .unwrap_or_else(|| panic!("{domain} not listed in {listing}"))
        .clone()
}

/// The JSON body of `r`.
pub fn body(r: &HttpResponse) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

/// The value of the Prometheus series `series` (name and labels, as printed) on `base`; 0 when
/// absent.
pub fn metric(base: &str, series: &str) -> u64 {
    let r = call(base, Method::GET, "/metrics", None, &[]);
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
