//! The operator's kit of `deploy/prometheus/` and `deploy/grafana/` against the real tools and a
//! real `tollgate serve`: promtool checks the alerting rules and runs their unit tests; every
//! metric the alerts and the dashboard name exists in the `/metrics` of a running instance; and
//! a real Prometheus scrapes a running instance, loads the alerts, evaluates them, answers every
//! dashboard query, and shows each rule's limit as configured.
//!
//! `prometheus` and `promtool` come from Debian's `prometheus` package (scripts/test.sh
//! installs it).

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::client::Method;
use support::gateway::need;
use support::*;
use tollgate_testsupport::{delete_prefix, shared_url, unique_prefix, wait_listening};
use yaml_rust2::{Yaml, YamlLoader};

/// How long Prometheus may take to scrape, evaluate and answer before the test calls it a hang.
const PROMETHEUS_HANG: Duration = Duration::from_secs(90);

/// Rules that exercise the per-rule series: a limit the test hits past, a shadow-mode one, an
/// unlimited one (no limit series).
const RULES: &str = "domain: kit
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: ip
    shadow_mode: true
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 20, algorithm: fixed_window}
  - key: internal
    rate_limit: {unlimited: true}
";

fn kit_file(path: &str) -> PathBuf {
    repo().join(path)
}

fn load_yaml(path: &str) -> Yaml {
    let text = std::fs::read_to_string(kit_file(path)).unwrap();
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .remove(0)
}

/// `promtool ARGS` in `deploy/prometheus`: its output, after asserting it succeeded.
fn promtool(args: &[&str]) -> String {
    need("promtool", "prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(kit_file("deploy/prometheus"))
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// Every rule of alerts.yml: `(alert or record name, expr, annotations)`.
fn alert_rules() -> Vec<(String, String, BTreeMap<String, String>)> {
    let doc = load_yaml("deploy/prometheus/alerts.yml");
    let mut rules = Vec::new();
    for group in doc["groups"].as_vec().unwrap() {
        for rule in group["rules"].as_vec().unwrap() {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .unwrap()
                .to_string();
            let annotations = rule["annotations"]
                .as_hash()
                .map(|h| {
                    h.iter()
                        .map(|(k, v)| (k.as_str().unwrap().into(), v.as_str().unwrap().into()))
                        .collect()
                })
                .unwrap_or_default();
            rules.push((
                name,
                rule["expr"].as_str().unwrap().to_string(),
                annotations,
            ));
        }
    }
    rules
}

/// Every `expr` of the dashboard's panels (rows hold none) and variables' queries.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(kit_file("deploy/grafana/tollgate.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    exprs
}

/// The dashboard's template variables and Grafana's interval as a plain query has them.
fn as_plain_query(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$job", ".*")
        .replace("$instance", ".*")
        .replace("$domain", ".*")
        .replace("$rule", ".*")
}

/// The metric names `expr` uses that start with `tollgate`: identifiers outside quoted strings
/// and outside `{...}` label matchers, `by (...)` / `on (...)` lists left out.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let (mut i, mut braces, mut parens_after_keyword) = (0, 0, false);
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        match c {
            '{' => braces += 1,
            '}' => braces -= 1,
            '(' if parens_after_keyword => {
                // A label list: skip to its `)`.
                while i < bytes.len() && bytes[i] != b')' {
                    i += 1;
                }
                parens_after_keyword = false;
            }
            _ => {}
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || b"_:".contains(&bytes[i]))
            {
                i += 1;
            }
            let word = &expr[start..i];
            if [
                "by",
                "on",
                "without",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word)
            {
                parens_after_keyword = true;
            } else if braces == 0 && word.starts_with("tollgate") {
                names.insert(word.to_string());
            }
            continue;
        }
        if !c.is_whitespace() && c != '(' {
            parens_after_keyword = false;
        }
        i += 1;
    }
    names
}

/// A `/metrics` page: each family's type (from `# TYPE`) and the names its samples carry.
struct Exposition {
    types: BTreeMap<String, String>,
    samples: BTreeSet<String>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut types = BTreeMap::new();
        let mut samples = BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                types.insert(name.to_string(), kind.to_string());
            } else if !line.starts_with('#') && !line.is_empty() {
                let end = line.find(['{', ' ']).unwrap();
                samples.insert(line[..end].to_string());
            }
        }
        Exposition { types, samples }
    }

    /// Why `name` is not a series of this page, or `None` when it is: a family with samples,
    /// or a histogram's `_bucket`, `_sum` or `_count` series (a summary's `_sum`, `_count`).
    fn missing(&self, name: &str) -> Option<String> {
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = name.strip_suffix(suffix)?;
            let kind = self.types.get(base)?;
            (kind == "histogram" || (kind == "summary" && *suffix != "_bucket")).then_some(base)
        });
        let family = family.unwrap_or(name);
        if !self.types.contains_key(family) {
            return Some(format!("{name}: no such metric"));
        }
        (!self.samples.contains(name)).then(|| format!("{name}: declared, with no samples"))
    }
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let check = promtool(&["check", "rules", "alerts.yml"]);
    assert!(check.contains("SUCCESS"), "{check}");
    let tests = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(tests.contains("SUCCESS"), "{tests}");
    promtool(&["check", "config", "prometheus.yml"]);

    // The unit tests fire the alerts an on-call most needs, and each once stays quiet.
    let unit = load_yaml("deploy/prometheus/alerts_test.yml");
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in unit["tests"].as_vec().unwrap() {
        for case in test["alert_rule_test"].as_vec().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_string();
            if case["exp_alerts"].as_vec().unwrap().is_empty() {
                quiet.insert(name);
            } else {
                fired.insert(name);
            }
        }
    }
    for alert in [
        "TollgateRuleNearLimit",
        "TollgateStoreDown",
        "TollgateDenialSpike",
    ] {
        assert!(fired.contains(alert) && quiet.contains(alert), "{alert}");
    }
}

#[test]
fn every_alert_says_what_and_where_to_look() {
    let ops = std::fs::read_to_string(kit_file("docs/operations.md")).unwrap();
    let anchors: BTreeSet<String> = ops
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let mut alerts = 0;
    for (name, _, annotations) in alert_rules() {
        if !name.starts_with("Tollgate") {
            continue;
        }
        alerts += 1;
        for key in ["summary", "description", "runbook"] {
            assert!(
                annotations.get(key).is_some_and(|v| !v.is_empty()),
                "{name} has no {key}"
            );
        }
        let anchor = annotations["runbook"]
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{name}: runbook not in docs/operations.md"));
        assert!(
            anchors.contains(anchor),
            "{name}: no section #{anchor} in docs/operations.md"
        );
    }
    assert!(alerts >= 6, "{alerts} alerts");
}

/// The dashboard imports into any Grafana: its one input is the Prometheus data source, which
/// every panel, query and variable uses; panel ids are unique and panels fit the 24-column grid.
#[test]
fn the_dashboard_is_import_ready() {
    let text = std::fs::read_to_string(kit_file("deploy/grafana/tollgate.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let inputs = dash["__inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), 1);
    assert_eq!(inputs[0]["name"], "DS_PROMETHEUS");
    assert_eq!(inputs[0]["pluginId"], "prometheus");
    let ds = serde_json::json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"});
    let mut ids = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{panel}");
        let grid = &panel["gridPos"];
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{panel}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"], ds, "{}", panel["title"]);
        assert!(!panel["description"].as_str().unwrap().is_empty());
        for target in panel["targets"].as_array().unwrap() {
            assert_eq!(target["datasource"], ds, "{}", panel["title"]);
        }
    }
    for var in dash["templating"]["list"].as_array().unwrap() {
        assert_eq!(var["datasource"], ds, "{var}");
    }
    assert!(ids.len() >= 20, "{} panels", ids.len());
}

#[test]
fn metric_names_are_read_out_of_expressions() {
    let names = metric_names(
        "sum by (job, le) (rate(tollgate_a_bucket{code=\"tollgate_x\"}[5m])) / on (domain) group_left max by (rule) (tollgate:b:c) > 0 and tollgate_d",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["tollgate:b:c", "tollgate_a_bucket", "tollgate_d"]
    );
    let page = Exposition::parse(
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n# TYPE c counter\nc 1\n# TYPE e gauge\n",
    );
    assert_eq!(page.missing("h_bucket"), None);
    assert_eq!(page.missing("h_count"), None);
    assert_eq!(page.missing("c"), None);
    assert!(page.missing("h").is_some());
    assert!(page.missing("c_count").is_some());
    assert!(page.missing("e").is_some());
}

/// `tollgate serve` with the Redis store on the shared server (its own key prefix) and the
/// local deny cache, so that every store series shows, and traffic on every per-rule series.
#[test]
fn every_metric_the_kit_names_is_served() {
    let dir = temp_dir("monitoring-names");
    std::fs::write(dir.join("kit.yaml"), RULES).unwrap();
    let prefix = unique_prefix("monitoring");
    let server = serve_store(
        &dir.display().to_string(),
        shared_url(),
        &["--redis-prefix", &prefix, "--local-deny-cache"],
        "monitoring-names",
    );
    exercise(&server.base, "alice");
    let page = http(&server.base, Method::GET, "/metrics", None).body;
    let exposition = Exposition::parse(&page);

    let records: BTreeSet<String> = alert_rules()
        .into_iter()
        .filter(|(name, _, _)| name.contains(':'))
        .map(|(name, _, _)| name)
        .collect();
    let mut used = BTreeMap::new();
    for (name, expr, _) in alert_rules() {
        for metric in metric_names(&expr) {
            used.entry(metric)
                .or_insert_with(|| format!("alerts.yml {name}"));
        }
    }
    for expr in dashboard_exprs() {
        for metric in metric_names(&expr) {
            used.entry(metric).or_insert_with(|| "tollgate.json".into());
        }
    }
    let mut missing = Vec::new();
    for (metric, by) in &used {
        if metric.contains(':') {
            if !records.contains(metric) {
                missing.push(format!("{metric} ({by}): no recording rule makes it"));
            }
        } else if let Some(why) = exposition.missing(metric) {
            missing.push(format!("{why} ({by})"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}\n/metrics:\n{page}");
    // The kit covers the service, not a corner of it.
    assert!(used.len() >= 30, "{used:?}");
    delete_prefix(shared_url(), &prefix);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Traffic on every per-rule series: the `user` limit passed by `user` (denied hits), the
/// shadow rule passed (shadow-mode hits, let through), a descriptor of no rule, one of an
/// unknown domain, and an invalid request.
fn exercise(base: &str, user: &str) {
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(check(base, "kit", "user", user).0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    for _ in 0..22 {
        assert_eq!(check(base, "kit", "ip", user).0, 200);
    }
    check(base, "kit", "nothing", "x");
    check(base, "elsewhere", "user", "x");
    let invalid = http(
        base,
        Method::POST,
        "/v1/check",
        Some(serde_json::json!({"domain": "kit", "descriptors": []})),
    );
    assert_eq!(invalid.status, 400, "{}", invalid.body);
}

/// `query` percent-encoded for a URL's query string.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server (stopped and waited for when dropped).
struct Prometheus {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Prometheus {
    /// Prometheus scraping `target` (`host:port`) every second and evaluating `rules` (a
    /// rule file) every second, its data in a temporary directory, on a free port.
    fn start(target: &str, rules: &Path) -> Prometheus {
        need("prometheus", "prometheus");
        let dir = temp_dir("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: tollgate\n    static_configs:\n      - targets: [\"{target}\"]\n",
                rules.display()
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        on_free_port("prometheus", |port| {
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("spawn prometheus");
            if wait_listening(&mut child, port, "prometheus", &log, PROMETHEUS_HANG) {
                let prometheus = Prometheus {
                    child,
                    base: format!("http://127.0.0.1:{port}"),
                    log: log.clone(),
                };
                // It listens before its storage is open (503 until then).
                prometheus.wait_until("ready", |p| {
                    try_http(&p.base, Method::GET, "/-/ready", None).is_ok_and(|r| r.status == 200)
                });
                Some(prometheus)
            } else {
                let _ = child.wait();
                None
            }
        })
    }

    /// `GET /api/v1/PATH`: the JSON answer (any status: Prometheus answers errors in JSON).
    fn api(&self, path: &str) -> Value {
        let r = http(&self.base, Method::GET, &format!("/api/v1/{path}"), None);
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.body))
    }

    /// The instant-vector result of `query` now.
    fn query(&self, query: &str) -> Value {
        let v = self.api(&format!("query?query={}", encode(query)));
        assert_eq!(v["status"], "success", "{query}: {v}");
        v["data"]["result"].clone()
    }

    /// Poll until `ok` holds on something Prometheus answers; the deadline only turns a hang
    /// into a failure.
    fn wait_until(&self, what: &str, mut ok: impl FnMut(&Prometheus) -> bool) {
        let until = Instant::now() + PROMETHEUS_HANG;
        while !ok(self) {
            assert!(
                Instant::now() < until,
                "Prometheus: no {what} after {PROMETHEUS_HANG:?}; log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_the_limits_and_evaluates_the_kit() {
    let dir = temp_dir("monitoring-prometheus");
    std::fs::write(dir.join("kit.yaml"), RULES).unwrap();
    let server = serve_rules(&dir.display().to_string(), &[], "monitoring-prometheus");
    exercise(&server.base, "alice");
    let target = server.base.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(&target, &kit_file("deploy/prometheus/alerts.yml"));

    prometheus.wait_until("healthy tollgate target", |p| {
        p.api("targets")["data"]["activeTargets"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["health"] == "up"))
    });
    // Each rule's limit as configured, under the labels of its hit counters.
    let query = "tollgate_rule_limit{domain=\"kit\"}";
    prometheus.wait_until("limit series", |p| {
        p.query(query).as_array().is_some_and(|r| !r.is_empty())
    });
    let limit = prometheus.query(query);
    let mut rows: Vec<(String, String)> = limit
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let m = &s["metric"];
            (
                format!(
                    "{} {} {} {} {} {}",
                    m["rule"],
                    m["unit"],
                    m["unit_multiplier"],
                    m["algorithm"],
                    m["shadow"],
                    m["sync"]
                )
                .replace('"', ""),
                s["value"][1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            (
                "kit.ip second 10 fixed_window true exact".to_string(),
                "20".to_string()
            ),
            (
                "kit.user minute 1 sliding_window_counter false exact".to_string(),
                "5".to_string()
            ),
        ]
    );
    // The "share of the limit" expression of docs/operations.md joins the hits to the limits:
    // one answer per rule with hits and a limit (the unlimited rule has none).
    prometheus.wait_until("hit rate over the limit", |p| {
        let r = p.query(
            "sum by (domain, rule) (rate(tollgate_total_hits[1m])) / on (domain, rule) group_left max by (domain, rule) (tollgate_rule_limit_per_second)",
        );
        let mut rules: Vec<&str> = r
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["metric"]["rule"].as_str().unwrap())
            .collect();
        rules.sort();
        rules == ["kit.ip", "kit.user"]
    });
    // The alerting rules load and evaluate without error on the real series.
    prometheus.wait_until("evaluated rule groups", |p| {
        let groups = p.api("rules")["data"]["groups"].clone();
        let groups = groups.as_array().cloned().unwrap_or_default();
        !groups.is_empty()
            && groups.iter().all(|g| {
                g["rules"].as_array().unwrap().iter().all(|r| {
                    assert_ne!(r["health"], "err", "{r}");
                    r["health"] == "ok"
                })
            })
    });
    // Traffic while Prometheus watches: the recording rules see hits and denials.
    exercise(&server.base, "bob");
    prometheus.wait_until("a denied share of kit's hits", |p| {
        let r = p.query("tollgate_domain:denied_ratio:rate5m{domain=\"kit\"}");
        r.as_array().unwrap().iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
        })
    });
    // Every dashboard query is valid PromQL and evaluates.
    for expr in dashboard_exprs() {
        prometheus.query(&as_plain_query(&expr));
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
