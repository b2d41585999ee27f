//! The log readers over arbitrary input, for a bounded number of cases per run: no line and
//! no file makes `advise` panic, overflow its stack or lose the report; every line is either
//! read or reported as malformed. Random bytes, bytes biased to the formats' structure
//! (brackets, quotes, separators), valid lines of each format mutated byte by byte, and
//! nesting of any depth.

use super::parse::{Format, JsonFields, Parser};
use super::{measure, report::Report, AdviseArgs};
use clap::Parser as _;
use proptest::prelude::*;
use std::io::Write;

fn fields() -> JsonFields {
    JsonFields::new(
        "ts",
        "request.client_ip,request.remote_ip",
        "request.uri",
        "request.method",
        "request.host",
        "request.headers",
    )
}

const FORMATS: [Format; 4] = [Format::Combined, Format::Json, Format::Envoy, Format::Csv];

/// One valid line of each format, to mutate.
const SEEDS: [&str; 4] = [
    r#"203.0.113.9 - frank [10/Oct/2000:13:55:36 -0700] "GET /a?b=1 HTTP/1.1" 200 2326 "http://x/\"q" "curl/8.0""#,
    r#"{"ts":"2026-01-01T00:00:01.5Z","request":{"client_ip":"10.0.0.\u0031","uri":"/a\"b","method":"GET","host":"h","headers":{"K":["v"],"L":[[1],{"a":[]}]}},"n":[-1.5e3,null,true,{"x":"}"}]}"#,
    r#"[2016-04-15T20:17:00.310Z] "POST /api HTTP/2" 204 - 154 0 226 100 "10.0.35.28, 10.0.0.1" "nsq2http" "cc21d9b0" "locations" "tcp://10.0.2.1:80""#,
    "1500,api,user=a;path=/x,2",
];

/// Cases per property: enough to reach odd states in every reader, few enough that a debug
/// build runs them all in a few seconds.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Every reader reads `line` or says why not; none panics.
fn read_everywhere(line: &str) {
    for format in FORMATS {
        let mut p = Parser::new(format, fields());
        if let Err(e) = p.parse(line) {
            assert!(!e.is_empty());
        }
    }
}

fn structural() -> impl Strategy<Value = Vec<u8>> {
    let alphabet = b"{}[]\":,\\ -+.0123456789eEtrufalsn/Tz\n\r\tu;=#".to_vec();
    prop::collection::vec(
        prop_oneof![8 => prop::sample::select(alphabet), 1 => any::<u8>()],
        0..600,
    )
}

/// A seed line with `edits` applied: (position, byte, kind) replaces, inserts or deletes.
fn mutated(seed: &str, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut b = seed.as_bytes().to_vec();
    for &(at, byte, kind) in edits {
        let at = at % (b.len() + 1);
        match kind % 3 {
            0 if at < b.len() => b[at] = byte,
            1 => b.insert(at, byte),
            _ if at < b.len() => {
                b.remove(at);
            }
            _ => b.push(byte),
        }
    }
    b
}

proptest! {
    #![proptest_config(config(1500))]

    #[test]
    fn no_reader_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        read_everywhere(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn no_reader_panics_on_structural_bytes(bytes in structural()) {
        read_everywhere(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn no_reader_panics_on_mutated_lines(
        seed in 0..SEEDS.len(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8),
    ) {
        read_everywhere(&String::from_utf8_lossy(&mutated(SEEDS[seed], &edits)));
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// Nesting of any depth, of arrays or objects, in a skipped value or a wanted one: read
    /// when within the bound, malformed beyond it, never a stack overflow.
    #[test]
    fn nesting_of_any_depth_is_read_or_refused(
        depth in prop_oneof![0usize..40_000, 120usize..136],
        open in prop::sample::select(vec!["[", "{\"a\":"]),
        wanted in any::<bool>(),
        closed in any::<bool>(),
    ) {
        let close = if open == "[" { "]" } else { "}" };
        let inner = format!(
            "{}1{}",
            open.repeat(depth),
            if closed { close.repeat(depth) } else { String::new() }
        );
        let line = if wanted {
            format!("{{\"ts\":1,\"request\":{{\"client_ip\":{inner}}}}}")
        } else {
            format!("{{\"ts\":1,\"x\":{inner}}}")
        };
        let mut p = Parser::new(Format::Json, fields());
        let r = p.parse(&line);
        // The line's own objects count too.
        let levels = depth + if wanted { 2 } else { 1 };
        if levels > super::json::MAX_NESTING || !closed && depth > 0 {
            prop_assert!(r.is_err(), "depth {depth}: {:?}", r.map(|r| r.map(|r| r.ip)));
        } else {
            prop_assert!(r.is_ok(), "depth {depth}: {r:?}");
        }
    }
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    advise: AdviseArgs,
}

proptest! {
    #![proptest_config(config(64))]

    /// Whole files of arbitrary lines through the whole command: measured, and the report
    /// built and rendered as table, JSON and HTML. Every line is counted.
    #[test]
    fn a_file_of_arbitrary_lines_gives_a_report(
        lines in prop::collection::vec(
            prop_oneof![
                structural(),
                prop::collection::vec(any::<u8>(), 0..200),
                (0..SEEDS.len(), prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..4))
                    .prop_map(|(s, e)| mutated(SEEDS[s], &e)),
            ],
            0..40,
        ),
        format in prop::sample::select(vec!["auto", "combined", "json", "envoy", "csv"]),
    ) {
        let dir = tollgate_testsupport::temp_dir("advise-fuzz");
        let path = dir.join("in.log");
        let mut f = std::fs::File::create(&path).unwrap();
        for l in &lines {
            // A line's own newlines make more lines: fine, they are counted as the file has them.
            f.write_all(l).unwrap();
            f.write_all(b"\n").unwrap();
        }
        drop(f);
        let cli = Cli::try_parse_from([
            "advise",
            path.to_str().unwrap(),
            "--format",
            format,
            "--key",
            "ip+path",
            "--key",
            "header:User-Agent",
            "--window",
            "1s,1m",
        ])
        .unwrap();
        let m = measure(&cli.advise).unwrap();
        let total = std::fs::read(&path).unwrap().iter().filter(|&&b| b == b'\n').count();
        prop_assert_eq!(m.lines, total as u64);
        let report = Report::build(&cli.advise, &m);
        let _ = report.table(&m);
        let _ = report.json(&m);
        let _ = super::html::page(&report, &m);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
