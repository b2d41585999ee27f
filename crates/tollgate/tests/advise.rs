//! `tollgate advise` end to end on the real binary: on a generated access log with a planted
//! abuser and a planted bursty client, the advice names the abuser, its suggested rules deny it
//! and no one else when the same log is replayed through them (under every algorithm), the
//! burst is flagged, and the HTML report is well-formed and holds its plots. Every input format
//! parses (fixtures in tests/fixtures/advise/), malformed lines are reported with their line
//! numbers, and `simulate --plot` reproduces the pictures in docs/img/ byte for byte and shows
//! the fixed window's double burst at a window boundary.

mod support;

use serde_json::Value;
use std::path::Path;
use support::{repo, temp_dir, tollgate};

/// The planted clients of `tollgate generate-log` (src/advise/generate.rs).
const ABUSER: &str = "203.0.113.66";
const BURSTY: &str = "198.51.100.7";

/// Lines of the generated log: the largest that keeps this test well under 20 s in a debug
/// build with the replay under seven stores (BENCHMARKS-HISTORY.md has the 1,000,000-line figures).
const LINES: &str = "200000";

fn ok(args: &[&str]) -> String {
    let out = tollgate(args);
    assert!(
        out.status.success(),
        "tollgate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn json(args: &[&str]) -> Value {
    let text = ok(args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Every tag opened is closed, in order (the page is XHTML: a well-formed XML document). A
/// minimal check with no XML library: comments and the doctype are skipped; text must not
/// hold a raw `<`.
fn assert_well_formed(page: &str) {
    let mut open: Vec<&str> = Vec::new();
    let mut rest = page;
    while let Some(i) = rest.find('<') {
        rest = &rest[i..];
        if rest.starts_with("<!") {
            rest = &rest[rest.find('>').expect("unclosed declaration") + 1..];
            continue;
        }
        let end = rest.find('>').expect("unclosed tag");
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(name.trim()),
                "closing </{name}> out of order"
            );
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().expect("tag name");
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric()),
                "bad tag <{tag}>"
            );
            open.push(name);
        }
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
}

#[test]
fn advice_on_a_generated_log_denies_the_abuser_only_and_flags_the_burst() {
    let dir = temp_dir("advise");
    let log = dir.join("access.log");
    let out = tollgate(&["generate-log", "--lines", LINES, "--seed", "7"]);
    assert!(out.status.success());
    std::fs::write(&log, &out.stdout).unwrap();
    let log = log.to_str().unwrap();

    let advice = json(&["advise", log, "--json"]);
    assert_eq!(advice["requests"], 200_000);
    assert_eq!(advice["malformed"]["count"], 0);
    let ip = &advice["keys"][0];
    assert_eq!(ip["key"], "ip");
    assert_eq!(ip["busiest"][0]["client"], ABUSER, "{ip:#}");
    let s = &ip["suggestion"];
    assert_eq!(s["window"], "1m");
    assert_eq!(s["clients_over"], 1, "{s:#}");
    assert_eq!(s["over"][0], ABUSER);
    // The burst: the bursty client is within the limit per minute, and flagged.
    let bursty = &s["bursty"];
    assert_eq!(bursty["examples"][0]["client"], BURSTY, "{s:#}");
    assert_eq!(bursty["largest"], 60);
    assert_eq!(s["algorithm"], "token_bucket");

    // Replayed through the suggested rules, under each algorithm: the abuser is denied, and
    // no one else.
    let rules = dir.join("suggested.yaml");
    std::fs::write(&rules, s["yaml"].as_str().unwrap()).unwrap();
    let html = dir.join("report.html");
    let replay = json(&[
        "advise",
        log,
        "--json",
        "--rules",
        rules.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let rule = &replay["replay"]["rules"][0];
    assert_eq!(rule["rule"], "advised|remote_address");
    let outcomes = rule["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 7, "as written and six algorithms");
    assert_eq!(outcomes[0]["algorithm"], "token_bucket");
    for o in outcomes {
        assert_eq!(o["requests"], 200_000);
        assert_eq!(o["denied_clients"], 1, "{o:#}");
        assert_eq!(
            o["denied_clients_first"][0],
            format!("advised|remote_address={ABUSER}")
        );
        assert!(o["denied"].as_u64().unwrap() > 1000, "{o:#}");
    }

    let page = std::fs::read_to_string(&html).unwrap();
    assert_well_formed(&page);
    for plot in [
        "id=\"traffic\"",
        "class=\"distribution\"",
        "class=\"rule\"",
        "id=\"algorithms\"",
    ] {
        assert!(page.contains(plot), "no {plot} in the report");
    }
    assert!(page.matches("<svg").count() >= 4);
    // Self-contained: no script, nothing loaded from elsewhere.
    for external in ["<script", "src=", "href=", "@import", "url("] {
        assert!(!page.contains(external), "{external} in the report");
    }
    assert!(page.contains(ABUSER));
}

#[test]
fn malformed_lines_are_counted_and_shown_with_their_line_numbers() {
    let dir = temp_dir("advise-malformed");
    let log = dir.join("bad.log");
    std::fs::write(
        &log,
        "192.0.2.1 - - [01/Jan/2026:10:00:00 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n\
         this is not a log line\n\
         192.0.2.1 - - [01/Jan/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n\
         192.0.2.2 - - [01/Foo/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n\
         192.0.2.3 - - [01/Jan/2026:10:00:01 +0000] \"GET /LONG HTTP/1.1\" 200 1 \"-\" \"-\"\n",
    )
    .unwrap();
    // Line 5's path is longer than any line may be (64 KiB): reported, and the rest of the
    // line skipped.
    let text = std::fs::read_to_string(&log)
        .unwrap()
        .replace("/LONG", &format!("/{}", "x".repeat(70_000)));
    std::fs::write(
        &log,
        text + "192.0.2.1 - - [01/Jan/2026:10:00:02 +0000] \"GET / HTTP/1.1\" 200 1\n",
    )
    .unwrap();
    let name = log.to_str().unwrap();
    let table = ok(&["advise", name]);
    assert!(table.contains("malformed lines: 3"), "{table}");
    assert!(table.contains(&format!("{name}:2: ")), "{table}");
    assert!(table.contains(&format!("{name}:4: time")), "{table}");
    assert!(
        table.contains(&format!("{name}:5: longer than 65536 bytes")),
        "{table}"
    );
    assert!(table.contains("key ip: 1 clients, 3 requests"), "{table}");
    // Nothing to read is no error either.
    let empty = dir.join("empty.log");
    std::fs::write(&empty, "").unwrap();
    assert!(ok(&["advise", empty.to_str().unwrap()]).contains("read 0 lines"));
}

/// `advise --json` of a fixture: (format, requests, clients of the first key).
fn summary(args: &[&str]) -> (String, u64, u64) {
    let v = json(args);
    assert_eq!(v["malformed"]["count"], 0, "{v:#}");
    (
        v["files"][0]["format"].as_str().unwrap().to_owned(),
        v["requests"].as_u64().unwrap(),
        v["keys"][0]["clients"].as_u64().unwrap(),
    )
}

#[test]
fn every_format_parses() {
    let f = |name: &str| format!("crates/tollgate/tests/fixtures/advise/{name}");
    let combined = f("combined.log");
    assert_eq!(
        summary(&["advise", &combined, "--json"]),
        ("combined".into(), 4, 3)
    );
    // A header of the combined format as a key: the user agent.
    assert_eq!(
        summary(&["advise", &combined, "--json", "--key", "header:User-Agent"]).2,
        4
    );
    // Beyond --max-clients, clients are counted in the totals only, and the report says so.
    let capped = json(&["advise", &combined, "--json", "--max-clients", "2"]);
    assert_eq!(capped["keys"][0]["clients"], 2);
    assert_eq!(capped["keys"][0]["requests"], 4);
    assert_eq!(capped["keys"][0]["untracked_requests"], 1);
    assert!(ok(&["advise", &combined, "--max-clients", "2"]).contains("more than 2 clients"));
    let caddy = f("caddy.jsonl");
    assert_eq!(
        summary(&["advise", &caddy, "--json"]),
        ("json".into(), 3, 3)
    );
    assert_eq!(
        summary(&["advise", &caddy, "--json", "--key", "header:X-Api-Key"]).2,
        2
    );
    let envoy = f("envoy.log");
    assert_eq!(
        summary(&["advise", &envoy, "--json"]),
        ("envoy".into(), 3, 3)
    );
    // hits count: 1 + 1 + 2 + 1; the descriptors as written are the clients.
    let trace = f("trace.csv");
    assert_eq!(summary(&["advise", &trace, "--json"]), ("csv".into(), 5, 3));
    assert_eq!(
        summary(&["advise", &trace, "--json", "--key", "entry:user"]).2,
        2
    );
    // JSON lines with field names of one's own.
    let app = f("app.jsonl");
    let v = json(&[
        "advise",
        &app,
        "--json",
        "--time-field",
        "time",
        "--client-field",
        "who.addr",
        "--path-field",
        "url",
        "--key",
        "ip+path",
    ]);
    assert_eq!(v["keys"][0]["clients"], 3);
    // 10:00:00.5+01:00 is 09:00:00.5Z, the first; 10:00:01Z the last.
    let span = v["last_us"].as_u64().unwrap() - v["first_us"].as_u64().unwrap();
    assert_eq!(span, 3_600_500_000);
    // Several files at once, each detected on its own.
    let v = json(&["advise", &combined, &envoy, "--json"]);
    let formats: Vec<&str> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["format"].as_str().unwrap())
        .collect();
    assert_eq!(formats, ["combined", "envoy"]);
    assert_eq!(v["requests"], 7);
    // A CSV trace replays through rules that need no http section.
    let v = json(&["advise", &trace, "--json", "--rules", "tests/rules"]);
    assert!(v["replay"]["rules"].is_array(), "{v:#}");
}

/// `simulate --plot`'s summary: algorithm -> (admitted, most admitted within one period).
fn plot(trace: &str, algorithms: &str, svg: &Path) -> Vec<(String, u64, u64)> {
    // The tiers picture has its own rule.
    let rules = if trace == "tiers.csv" {
        "examples/plots/tiers.yaml"
    } else {
        "examples/plots/rules.yaml"
    };
    let text = ok(&[
        "simulate",
        "--rules",
        rules,
        "--input",
        &format!("examples/plots/{trace}"),
        "--algorithms",
        algorithms,
        "--plot",
        svg.to_str().unwrap(),
    ]);
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn simulate_plots_are_the_pictures_in_the_docs_and_show_the_boundary_burst() {
    let dir = temp_dir("advise-plots");
    // The commands of docs/algorithms.md.
    let pictures = [
        (
            "boundary.csv",
            "fixed_window,sliding_window_log,sliding_window_counter",
            "boundary.svg",
        ),
        (
            "uneven.csv",
            "sliding_window_log,sliding_window_counter",
            "log-vs-counter.svg",
        ),
        (
            "boundary.csv",
            "fixed_window,token_bucket,gcra,leaky_bucket",
            "buckets.svg",
        ),
        // docs/rules.md's tiers.
        ("tiers.csv", "fixed_window", "tiers.svg"),
    ];
    let mut summaries = Vec::new();
    for (trace, algorithms, picture) in pictures {
        let svg = dir.join(picture);
        summaries.push(plot(trace, algorithms, &svg));
        let made = std::fs::read_to_string(&svg).unwrap();
        let committed = std::fs::read_to_string(repo().join("docs/img").join(picture)).unwrap();
        assert!(
            made == committed,
            "docs/img/{picture} differs from what its command draws now: regenerate it with the \
             command in docs/algorithms.md (docs/rules.md for tiers.svg)"
        );
    }
    // The limit is 10 per minute. A fixed window admits twice the limit within one minute
    // across a window boundary; the sliding log never more than the limit.
    let boundary = &summaries[0];
    assert_eq!(boundary[0].0, "fixed_window");
    assert_eq!(boundary[0].2, 20, "{boundary:?}");
    assert_eq!(boundary[1].0, "sliding_window_log");
    assert_eq!(boundary[1].2, 10, "{boundary:?}");
    assert!(boundary[2].2 > 10 && boundary[2].2 < 20, "{boundary:?}");
    // Sliding log vs counter on uneven traffic: the counter admits more.
    let uneven = &summaries[1];
    assert_eq!(uneven[0].2, 10);
    assert!(uneven[1].1 > uneven[0].1, "{uneven:?}");
    // Tiers, minute by minute: free alone 20 (its 10, and what is left above its reserve and
    // paid's guarantee), both 80 + 20, paid at 60 with free 20, paid alone 90 (free's 10 kept).
    let tiers = &summaries[3];
    assert_eq!(
        tiers[1],
        ("fixed_window:free".to_string(), 60, 21),
        "{tiers:?}"
    );
    assert_eq!(
        tiers[2],
        ("fixed_window:paid".to_string(), 230, 120),
        "{tiers:?}"
    );
}

/// Regression: one JSON line of 65,000 `[` (under the 64 KiB line cap) overflowed the
/// reader's stack and aborted the process (exit 134), losing the whole report. Nesting is
/// bounded: the line is reported as malformed and the lines after it are read.
#[test]
fn a_deeply_nested_json_line_is_malformed_not_a_crash() {
    let dir = temp_dir("advise-deep");
    let log = dir.join("deep.jsonl");
    let deep = format!("{{\"ts\":1,\"x\":{}", "[".repeat(65_000));
    let object = format!(
        "{{\"ts\":1,\"y\":{}1{}}}",
        "{\"a\":".repeat(40_000),
        "}".repeat(40_000)
    );
    let header = format!(
        "{{\"ts\":1,\"request\":{{\"client_ip\":\"192.0.2.9\",\"headers\":{{\"K\":{}\"v\"{}}}}}}}",
        "[".repeat(30_000),
        "]".repeat(30_000)
    );
    std::fs::write(
        &log,
        format!(
            "{deep}\n{{\"ts\":2,\"request\":{{\"client_ip\":\"192.0.2.1\"}}}}\n{object}\n{header}\n\
             {{\"ts\":3,\"request\":{{\"client_ip\":\"192.0.2.2\"}}}}\n"
        ),
    )
    .unwrap();
    let out = tollgate(&["advise", log.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["malformed"]["count"], 3, "{v:#}");
    assert_eq!(v["requests"], 2, "{v:#}");
    assert_eq!(v["keys"][0]["clients"], 2, "{v:#}");
    let first = v["malformed"]["first"][0].as_str().unwrap();
    assert!(
        first.contains(":1: not JSON: nested deeper than"),
        "{first}"
    );
}

/// Regression: a key was kept whole, so long client keys (a 60 KB header) cost 60 KB per
/// client (the documented figure is about 150 bytes). A key longer than 64 bytes is kept as
/// its start and a hash of the whole: bounded, and distinct keys stay distinct clients.
#[test]
fn long_client_keys_are_kept_within_64_bytes_and_stay_distinct() {
    let dir = temp_dir("advise-long-keys");
    let log = dir.join("long.log");
    let mut text = String::new();
    for i in 0..200 {
        // The same long prefix for all: only the end tells them apart.
        let agent = format!("{}{i:04}", "A".repeat(20_000));
        text.push_str(&format!(
            "192.0.2.1 - - [01/Jan/2026:10:00:{:02} +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"{agent}\"\n",
            i % 60
        ));
    }
    std::fs::write(&log, text).unwrap();
    let v = json(&[
        "advise",
        log.to_str().unwrap(),
        "--json",
        "--key",
        "header:User-Agent",
    ]);
    let key = &v["keys"][0];
    assert_eq!(key["clients"], 200, "{key:#}");
    for client in key["busiest"].as_array().unwrap() {
        let c = client["client"].as_str().unwrap();
        assert!(c.len() <= 64, "{} bytes kept: {}...", c.len(), &c[..80]);
        assert!(c.starts_with("AAAA"), "{c}");
    }
}

/// Regression: values from the log reached the terminal raw, ESC sequences included (a
/// client key, a malformed line's excerpt). The table escapes them; the excerpt is cut short.
#[test]
fn log_values_reach_the_terminal_escaped() {
    let dir = temp_dir("advise-escape");
    let log = dir.join("esc.log");
    std::fs::write(
        &log,
        "192.0.2.1 - - [01/Jan/2026:10:00:00 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"\x1b]0;owned\x07\x1b[2J\"\n\
         192.0.2.1 - - [\x1b[31m\u{9b}2J] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n",
    )
    .unwrap();
    let table = ok(&[
        "advise",
        log.to_str().unwrap(),
        "--key",
        "header:User-Agent",
    ]);
    assert!(
        !table.contains(['\x1b', '\x07', '\u{9b}']),
        "raw control characters in:\n{}",
        table.escape_debug()
    );
    assert!(table.contains("\\u{1b}]0;owned\\u{7}"), "{table}");
    assert!(table.contains("malformed lines: 1"), "{table}");
    assert!(table.contains("\\u{1b}[31m\\u{9b}2J"), "{table}");
}

/// Regression: with few clients the 99th percentile of the peaks was the abuser's own peak
/// (21 clients, one sending 80 % of the requests): the suggested limit denied no one. Heavy
/// hitters are named apart and left out of the percentile, and the report says the sample is
/// small.
#[test]
fn with_few_clients_the_abuser_is_a_heavy_hitter_and_is_denied() {
    let dir = temp_dir("advise-few");
    let log = dir.join("few.log");
    let mut lines: Vec<(u64, String, &str)> = Vec::new();
    // 20 clients, 90 requests each over the hour: page loads of three requests in a second.
    for c in 0..20u64 {
        for j in 0..30u64 {
            let t = (j * 120 + c * 7 + (j * j * 13 + c * 31) % 60) % 3600;
            for path in ["/", "/api/items", "/login"] {
                lines.push((t, format!("10.0.0.{}", c + 1), path));
            }
        }
    }
    // The abuser: 7,232 requests to /login, two a second.
    for i in 0..7_232u64 {
        lines.push((i / 2 % 3600, ABUSER.to_owned(), "/login"));
    }
    lines.sort();
    let text: String = lines
        .iter()
        .map(|(t, ip, path)| {
            format!(
                "{ip} - - [01/Jan/2026:00:{:02}:{:02} +0000] \"GET {path} HTTP/1.1\" 200 1\n",
                t / 60,
                t % 60
            )
        })
        .collect();
    std::fs::write(&log, text).unwrap();
    let v = json(&["advise", log.to_str().unwrap(), "--json"]);
    assert_eq!(v["requests"], 9_032);
    let ip = &v["keys"][0];
    assert_eq!(ip["clients"], 21);
    let s = &ip["suggestion"];
    assert_eq!(s["clients_over"], 1, "{s:#}");
    assert_eq!(s["over"][0], ABUSER, "{s:#}");
    let heavy = &s["heavy_hitters"];
    assert_eq!(heavy["clients"], 1, "{s:#}");
    assert_eq!(heavy["named"][0]["client"], ABUSER, "{s:#}");
    assert_eq!(heavy["percent"], 80.1, "{s:#}");
    assert_eq!(s["p99_over_clients"], 20, "{s:#}");
    assert_eq!(s["small_sample"], true, "{s:#}");
    let table = ok(&["advise", log.to_str().unwrap()]);
    assert!(
        table.contains(&format!(
            "heavy hitters: 1 client(s) send 80 % of requests (7232 of 9032): {ABUSER}"
        )),
        "{table}"
    );
    assert!(table.contains("a small sample: 20 client(s)"), "{table}");
}
