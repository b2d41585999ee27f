//! The service's text log on the real binary, fed by a hostile client: every value a client
//! chose (a descriptor value in the decision log, an unknown domain in its warning) is written
//! escaped, so that it can neither forge a log line of its own nor send an escape sequence to
//! the terminal of an operator reading the log.

mod support;

use std::time::{Duration, Instant};
use support::{check, serve_rules, temp_dir, Server};

const ONE_AN_HOUR: &str = "domain: login
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
";

/// A value that, written raw, ends the line, forges a whole decision line of its own, sets
/// the terminal's title (OSC), clears the screen (CSI, and its one-byte C1 form) and flips
/// the text's direction.
const HOSTILE: &str = "x\n2026-01-01T00:00:00.000000Z  INFO tollgate::decision: decision \
                       domain=\"login\" rule=login|user key=user=admin outcome=\"allowed\"\r\
                       \x1b]0;owned\x07\x1b[2J\u{9b}2J\u{202e}";

/// Poll the server's stderr until `cond` holds (the deadline only turns a hang into a failure).
fn wait_for_stderr(s: &Server, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let text = s.stderr();
        if cond(&text) {
            return text;
        }
        assert!(Instant::now() < until, "no {what} in:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The raw control characters (and direction overrides) of `log`, if any.
fn raw_controls(log: &str) -> Vec<char> {
    log.chars()
        .filter(|&c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c))
        .collect()
}

/// Regression: with `--decision-log denied` the text format wrote the key raw: a `\n` in a
/// descriptor value forged a whole decision line (`key=user=admin outcome="allowed"`) and
/// ESC/OSC sequences reached the operator's terminal.
#[test]
fn the_text_decision_log_escapes_the_clients_values() {
    let dir = temp_dir("log-escaping-decision");
    std::fs::write(dir.join("rules.yaml"), ONE_AN_HOUR).unwrap();
    let s = serve_rules(
        dir.to_str().unwrap(),
        &["--decision-log", "denied"],
        "log-escaping-decision",
    );
    assert_eq!(check(&s.base, "login", "user", HOSTILE).0, 200);
    assert_eq!(check(&s.base, "login", "user", HOSTILE).0, 429);
    // An unknown domain is warned about, naming it.
    assert_eq!(check(&s.base, "evil\n\x1b]0;owned\x07", "user", "a").0, 200);
    let log = wait_for_stderr(&s, "decision line and unknown-domain warning", |l| {
        l.contains("tollgate::decision") && l.contains("unknown domain")
    });
    let decisions: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tollgate::decision"))
        .collect();
    assert_eq!(decisions.len(), 1, "one denial, one line:\n{log}");
    assert!(
        !log.contains("\n2026-01-01T00:00:00"),
        "a client forged a log line:\n{}",
        log.escape_debug()
    );
    assert_eq!(
        raw_controls(&log),
        Vec::<char>::new(),
        "{}",
        log.escape_debug()
    );
    let line = decisions[0];
    assert!(
        line.contains(r#"key="user=x\n2026-01-01T00:00:00.000000Z  INFO"#),
        "{line}"
    );
    assert!(
        line.contains(r#"outcome=\"allowed\"\r\u{1b}]0;owned\u{7}"#),
        "{line}"
    );
    assert!(
        line.ends_with("outcome=\"denied\" shadow=false hits=1 limit=1 remaining=0"),
        "{line}"
    );
}
