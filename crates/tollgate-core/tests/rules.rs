//! Table-driven tests of rule loading and resolution against the fixtures in
//! `tests/fixtures/rules`: every good file with the resolutions it must give, every bad file
//! with the error (substring and line) it must produce. Every fixture file must appear in a
//! table, so a new fixture cannot be silently left untested.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tollgate_core::{Algorithm, Limit, Resolution, RuleErrors, RuleSet, Unit};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rules")
}

fn load(path: &Path) -> RuleSet {
    match RuleSet::load(path) {
        Ok(s) => s,
        Err(e) => panic!("{} should load:\n{e}", path.display()),
    }
}

fn load_err(path: &Path) -> RuleErrors {
    match RuleSet::load(path) {
        Ok(_) => panic!("{} should not load", path.display()),
        Err(e) => e,
    }
}

fn yaml_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("fixture dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect()
}

/// What a descriptor must resolve to.
#[derive(Debug)]
enum Want {
    NoMatch,
    /// Unlimited, with the rule id.
    Unlimited(&'static str),
    /// Limited: requests per unit, unit, counter key.
    Limited(u64, Unit, &'static str),
}
use Want::*;

type Entries = &'static [(&'static str, &'static str)];

/// A descriptor and what it must resolve to.
type Case = (Entries, Want);

/// (file, domain, [(descriptor, expected)])
const GOOD: &[(&str, &str, &[Case])] = &[
    (
        "readme_example1.yaml",
        "mongo_cps",
        &[
            (
                &[("database", "users")],
                Limited(500, Unit::Second, "mongo_cps|database=users"),
            ),
            (
                &[("database", "default")],
                Limited(500, Unit::Second, "mongo_cps|database=default"),
            ),
            (&[("database", "other")], NoMatch),
            (&[("Database", "users")], NoMatch), // case-sensitive
            (&[("database", "users"), ("x", "y")], NoMatch),
        ],
    ),
    (
        "readme_example2.yaml",
        "messaging",
        &[
            (
                &[("message_type", "marketing"), ("to_number", "2061111111")],
                Limited(
                    5,
                    Unit::Day,
                    "messaging|message_type=marketing|to_number=2061111111",
                ),
            ),
            (
                &[("message_type", "marketing"), ("to_number", "2062222222")],
                Limited(
                    5,
                    Unit::Day,
                    "messaging|message_type=marketing|to_number=2062222222",
                ),
            ),
            (
                &[("to_number", "2061111111")],
                Limited(100, Unit::Day, "messaging|to_number=2061111111"),
            ),
            (&[("message_type", "marketing")], NoMatch), // placeholder node, no rate_limit
            (
                &[("message_type", "transactional"), ("to_number", "1")],
                NoMatch,
            ),
        ],
    ),
    (
        "readme_example3.yaml",
        "edge_proxy_per_ip",
        &[
            (
                &[("remote_address", "50.0.0.1")],
                Limited(
                    10,
                    Unit::Second,
                    "edge_proxy_per_ip|remote_address=50.0.0.1",
                ),
            ),
            (
                &[("remote_address", "50.0.0.5")],
                Limited(0, Unit::Second, "edge_proxy_per_ip|remote_address=50.0.0.5"),
            ),
        ],
    ),
    (
        "readme_example4a.yaml",
        "example4a",
        &[
            (&[("key", "value"), ("subkey", "subvalue")], NoMatch),
            (
                &[("key", "value")],
                Limited(300, Unit::Second, "example4a|key=value"),
            ),
        ],
    ),
    (
        "readme_example4b.yaml",
        "example4",
        &[
            (
                &[("key", "value"), ("subkey", "subvalue")],
                Limited(300, Unit::Second, "example4|key=value|subkey=subvalue"),
            ),
            (&[("key", "value")], NoMatch),
            (&[("key", "other"), ("subkey", "subvalue")], NoMatch),
        ],
    ),
    (
        "readme_example5.yaml",
        "internal",
        &[
            (&[("ldap", "anything")], Unlimited("internal|ldap")),
            (
                &[("azure", "x")],
                Limited(100, Unit::Minute, "internal|azure=x"),
            ),
            (&[("aws", "x")], NoMatch),
        ],
    ),
    (
        "readme_example6.yaml",
        "example6",
        &[
            (
                &[("service", "auth-service"), ("user", "user-a")],
                Limited(
                    10,
                    Unit::Second,
                    "example6|service=auth-service|user=user-a",
                ),
            ),
            (
                &[("service", "auth-service"), ("user", "user-b")],
                Limited(
                    20,
                    Unit::Second,
                    "example6|service=auth-service|user=user-b",
                ),
            ),
            (&[("service", "auth-service"), ("user", "user-c")], NoMatch),
            (&[("service", "auth-service")], NoMatch),
        ],
    ),
    (
        "readme_example7.yaml",
        "example7",
        &[
            (
                &[("key_1", "value_1"), ("user", "bkthomps")],
                Limited(5, Unit::Second, "example7|key_1=value_1|user=bkthomps"),
            ),
            (
                &[("key_2", "value_2"), ("user", "bkthomps")],
                Limited(10, Unit::Second, "example7|key_2=value_2|user=bkthomps"),
            ),
            (&[("key_1", "value_1"), ("user", "other")], NoMatch),
        ],
    ),
    (
        "readme_example8.yaml",
        "example8",
        &[
            (
                &[("key1", "unspecified_value")],
                Limited(10, Unit::Minute, "example8|key1=unspecified_value"),
            ),
            (
                &[("key1", "unspecified_value2")],
                Limited(10, Unit::Minute, "example8|key1=unspecified_value2"),
            ),
            (
                &[("key1", "value1")],
                Limited(20, Unit::Minute, "example8|key1=value1"),
            ),
        ],
    ),
    (
        "readme_example9.yaml",
        "example9",
        &[
            (
                &[("key1", "value_1")],
                Limited(20, Unit::Minute, "example9|key1=value_1"),
            ),
            (
                &[("key1", "value_2")],
                Limited(20, Unit::Minute, "example9|key1=value_2"),
            ),
            (
                &[("key1", "value")],
                Limited(20, Unit::Minute, "example9|key1=value"),
            ),
            (&[("key1", "valu")], NoMatch),
            (&[("key1", "xvalue_1")], NoMatch),
        ],
    ),
    (
        "readme_descriptor_format.yaml",
        "format",
        &[
            (
                &[("files", "/api/files/a.pdf")],
                Limited(100, Unit::Hour, "format|files=/api/files/*"),
            ),
            (
                &[("files", "/api/files/b.csv")],
                Limited(100, Unit::Hour, "format|files=/api/files/*"),
            ),
            (&[("files", "/api/other")], NoMatch),
            (&[("whitelisted", "x")], NoMatch),
            (
                &[("status", "200")],
                Limited(7, Unit::Second, "format|status=200"),
            ),
            (
                &[("status", "200"), ("region", "eu")],
                Limited(3, Unit::Day, "format|status=200|region=eu"),
            ),
            (&[("status", "500")], NoMatch),
        ],
    ),
    (
        "extensions.yaml",
        "ext",
        &[
            (
                &[("user", "alice")],
                Limited(100, Unit::Minute, "ext|user=alice"),
            ),
            (
                &[("tenant", "t1")],
                Limited(100, Unit::Minute, "ext|tenant=t1"),
            ),
            (
                &[("generic_key", "global")],
                Limited(10000, Unit::Second, "ext|generic_key=global"),
            ),
            (&[("generic_key", "local")], NoMatch),
            (
                &[("ip", "1.2.3.4")],
                Limited(4294967295, Unit::Week, "ext|ip=1.2.3.4"),
            ),
            (
                &[("path", "/v2/users/42/avatar")],
                Limited(2, Unit::Second, "ext|path=/v2/users/42/avatar"),
            ),
            // "*" comes before "/v1/*" in the file, so it wins.
            (
                &[("path", "/v1/things")],
                Limited(1, Unit::Year, "ext|path=/v1/things"),
            ),
            (&[("path", "")], Limited(1, Unit::Year, "ext|path=")),
            // Values that look like separators are escaped in the counter key.
            (
                &[("user", "a|b=c")],
                Limited(100, Unit::Minute, r"ext|user=a\|b\=c"),
            ),
        ],
    ),
];

fn check(set: &RuleSet, file: &str, domain: &str, entries: Entries, want: &Want) {
    let got = set.resolve(domain, entries);
    let ctx = format!("{file}: {entries:?}");
    match (want, got) {
        (NoMatch, Resolution::NoMatch) => {}
        (Unlimited(id), Resolution::Unlimited(limit)) => {
            assert_eq!(limit.id, *id, "{ctx}");
            assert!(limit.quota.is_none(), "{ctx}");
        }
        (
            Limited(rpu, unit, key),
            Resolution::Limited {
                limit, counter_key, ..
            },
        ) => {
            let q = limit.quota.unwrap_or_else(|| panic!("{ctx}: no quota"));
            assert_eq!(q.limit(), *rpu, "{ctx}");
            assert_eq!(q.period().unit, *unit, "{ctx}");
            assert_eq!(counter_key, *key, "{ctx}");
            assert_eq!(limit.domain, domain, "{ctx}");
        }
        (want, got) => panic!("{ctx}: want {want:?}, got {got:?}"),
    }
}

#[test]
fn good_fixtures_resolve_as_expected() {
    let dir = fixtures().join("good");
    let mut covered = BTreeSet::new();
    for (file, domain, cases) in GOOD {
        covered.insert(file.to_string());
        let set = load(&dir.join(file));
        let names: Vec<&str> = set.domains().map(|d| d.name.as_str()).collect();
        assert_eq!(names, [*domain], "{file}");
        for (entries, want) in *cases {
            check(&set, file, domain, entries, want);
        }
    }
    assert_eq!(
        covered,
        yaml_files(&dir),
        "every good fixture must be in GOOD"
    );
}

#[test]
fn good_directory_loads_as_one_rule_set() {
    let dir = fixtures().join("good");
    let set = load(&dir);
    let names: Vec<&str> = set.domains().map(|d| d.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "domains() must be sorted");
    assert_eq!(names.len(), GOOD.len());
    for (file, domain, cases) in GOOD {
        let d = set.domain(domain).expect("domain");
        assert!(d.file.ends_with(file), "{} vs {file}", d.file);
        for (entries, want) in *cases {
            check(&set, file, domain, entries, want);
        }
    }
    // Every limit has a unique id and points at its file and line.
    let ids: BTreeSet<&str> = set.limits().map(|l| l.id.as_str()).collect();
    assert_eq!(ids.len(), set.limits().count());
}

fn limit<'a>(set: &'a RuleSet, id: &str) -> &'a Limit {
    set.limits()
        .find(|l| l.id == id)
        .unwrap_or_else(|| panic!("no limit {id}"))
}

#[test]
fn readme_options_are_kept() {
    let set = load(&fixtures().join("good"));
    let a = limit(&set, "example6|service|user=user-a");
    assert!(a.shadow_mode);
    assert!(!limit(&set, "example6|service|user=user-b").shadow_mode);
    let named = limit(&set, "example7|key_1=value_1|user=bkthomps");
    assert_eq!(named.name.as_deref(), Some("specific_limit"));
    assert!(named.replaces.is_empty());
    let replacing = limit(&set, "example7|key_2=value_2|user=bkthomps");
    assert_eq!(replacing.name, None);
    assert_eq!(replacing.replaces, ["specific_limit"]);
    assert!(limit(&set, "example8|key1").detailed_metric);
    assert!(!limit(&set, "example8|key1=value1").detailed_metric);
    let files = limit(&set, "format|files=/api/files/*");
    assert!(files.share_threshold && files.value_to_metric);
    assert_eq!(files.line, 5);
    assert!(files.file.ends_with("readme_descriptor_format.yaml"));
    let ldap = limit(&set, "internal|ldap");
    assert!(ldap.is_unlimited());
    assert_eq!(ldap.line, 4);
}

#[test]
fn extensions_are_decoded() {
    let set = load(&fixtures().join("good/extensions.yaml"));
    let user = limit(&set, "ext|user");
    let q = user.quota.expect("quota");
    assert_eq!(
        (q.limit(), q.period().unit, q.period().multiplier),
        (100, Unit::Minute, 15)
    );
    assert_eq!((q.algorithm(), q.burst()), (Algorithm::Gcra, Some(20)));
    assert_eq!(
        user.message.as_deref(),
        Some("retry-with-exponential-backoff")
    );
    // The anchor is reused as is.
    assert_eq!(limit(&set, "ext|tenant").quota, Some(q));
    let global = limit(&set, "ext|generic_key=global").quota.expect("quota");
    assert_eq!(
        (global.algorithm(), global.burst(), global.capacity()),
        (Algorithm::TokenBucket, None, 10000)
    );
    let ip = limit(&set, "ext|ip").quota.expect("quota");
    assert_eq!(ip.algorithm(), Algorithm::CountMinSketch);
    assert_eq!((ip.sketch().width, ip.sketch().depth), (4096, 5));
    let door = ip.doorkeeper().expect("doorkeeper");
    assert_eq!((door.expected_keys(), door.fp_rate()), (1_000_000, 0.01));
    let any = limit(&set, "ext|path=*").quota.expect("quota");
    assert_eq!(
        (any.algorithm(), any.period().unit),
        (Algorithm::FixedWindow, Unit::Year)
    );
    assert_eq!(
        limit(&set, "ext|path=/v1/*")
            .quota
            .map(|q| (q.algorithm(), q.period().unit)),
        Some((Algorithm::SlidingWindowLog, Unit::Month))
    );
    assert_eq!(
        limit(&set, "ext|path=/v*/users/*/avatar")
            .quota
            .map(|q| q.algorithm()),
        Some(Algorithm::LeakyBucket)
    );
}

/// (file, line, error substring)
const BAD: &[(&str, usize, &str)] = &[
    ("invalid_yaml.yaml", 5, "invalid YAML"),
    (
        "unknown_field.yaml",
        5,
        "unknown field `Value` in a descriptor (did you mean `value`? allowed: key, value,",
    ),
    (
        "unknown_rate_limit_field.yaml",
        7,
        "unknown field `requests_per_minute` in rate_limit (did you mean `requests_per_unit`? allowed: unit, requests_per_unit,",
    ),
    (
        "wrong_type.yaml",
        6,
        "`requests_per_unit` must be an unsigned integer, found string \"ten\"",
    ),
    (
        "wrong_type_bool.yaml",
        4,
        "`shadow_mode` must be true or false, found `maybe`",
    ),
    (
        "wrong_type_descriptors.yaml",
        3,
        "`descriptors` must be a list, found a mapping",
    ),
    ("missing_domain.yaml", 1, "missing required field `domain`"),
    ("empty_domain.yaml", 1, "`domain` must not be empty"),
    (
        "empty_file.yaml",
        1,
        "missing required field `domain` (the file is empty)",
    ),
    (
        "missing_key.yaml",
        5,
        "descriptor is missing required field `key`",
    ),
    (
        "missing_requests_per_unit.yaml",
        5,
        "rate_limit is missing required field `requests_per_unit`",
    ),
    (
        "missing_unit.yaml",
        5,
        "rate_limit is missing required field `unit`",
    ),
    (
        "unknown_unit.yaml",
        5,
        "invalid `unit`: unknown unit 'fortnight'",
    ),
    (
        "unlimited_with_unit.yaml",
        6,
        "`unlimited: true` cannot be combined with `unit`",
    ),
    (
        "unlimited_with_requests_per_unit.yaml",
        6,
        "`unlimited: true` cannot be combined with `requests_per_unit`",
    ),
    (
        "duplicate_descriptor.yaml",
        6,
        "duplicate descriptor: key `database` and value `users` already defined at line 3",
    ),
    (
        "duplicate_key_only.yaml",
        10,
        "duplicate descriptor: key `user` and no value already defined at line 5",
    ),
    (
        "duplicate_map_key.yaml",
        7,
        "duplicate key `unit` in mapping",
    ),
    (
        "burst_with_fixed_window.yaml",
        8,
        "`burst` has no effect with algorithm fixed_window",
    ),
    (
        "burst_with_default_algorithm.yaml",
        7,
        "`burst` has no effect with algorithm sliding_window_counter",
    ),
    ("burst_zero.yaml", 4, "`burst` must be at least 1, found 0"),
    (
        "lease_with_gcra.yaml",
        8,
        "`sync: lease` needs algorithm fixed_window or sliding_window_counter, not gcra",
    ),
    (
        "batched_with_token_bucket.yaml",
        8,
        "`sync: batched` needs algorithm fixed_window or sliding_window_counter, not token_bucket \
         (a batch is a count added to one window's count)",
    ),
    (
        "sync_unknown.yaml",
        7,
        "invalid `sync`: unknown sync mode 'eventual' (expected exact, lease or batched)",
    ),
    (
        "requests_per_unit_too_large.yaml",
        6,
        "`requests_per_unit` is too large: 4294967296 (at most 4294967295)",
    ),
    (
        "requests_per_unit_negative.yaml",
        6,
        "`requests_per_unit` must not be negative",
    ),
    (
        "unit_multiplier_zero.yaml",
        4,
        "`unit_multiplier` must be at least 1, found 0",
    ),
    // Regression: `unit: year, unit_multiplier: 1000000` passed validation, then overflowed the
    // period (a panic in debug builds, a much shorter period in release).
    (
        "period_too_long.yaml",
        6,
        "a period of 1000000 years is longer than the longest supported (100 years)",
    ),
    (
        "burst_too_large.yaml",
        8,
        "`burst` is too large: 5000000000 (at most 4294967295)",
    ),
    // Regression: a huge burst overflowed `burst * period / limit` in the bucket steps.
    (
        "burst_takes_too_long.yaml",
        8,
        "`burst` 4000000000 at 1 per day takes longer than 100 years to fill",
    ),
    (
        "unknown_algorithm.yaml",
        7,
        "invalid `algorithm`: unknown algorithm 'magic'",
    ),
    (
        "sketch_without_count_min_sketch.yaml",
        8,
        "`sketch_width` only applies to algorithm count_min_sketch, not gcra",
    ),
    (
        "doorkeeper_needs_windowed_algorithm.yaml",
        8,
        "`doorkeeper` needs algorithm fixed_window, sliding_window_counter or count_min_sketch, not gcra",
    ),
    (
        "doorkeeper_bad_fp_rate.yaml",
        9,
        "`fp_rate` must be a number between 0.000001 and 0.5, found `2`",
    ),
    (
        "replaces_without_name.yaml",
        8,
        "`replaces` entry is missing required field `name`",
    ),
    (
        "replaces_itself.yaml",
        9,
        "`replaces` must not name the rate limit itself (`mine`)",
    ),
    (
        "too_deep.yaml",
        35,
        "descriptors nested more than 16 levels deep",
    ),
    (
        "key_too_long.yaml",
        3,
        "`key` is 257 bytes long; at most 256 allowed",
    ),
    (
        "value_too_long.yaml",
        4,
        "`value` is 257 bytes long; at most 256 allowed",
    ),
];

#[test]
fn bad_fixtures_report_line_and_field() {
    let dir = fixtures().join("bad");
    let mut covered = BTreeSet::new();
    for (file, line, needle) in BAD {
        covered.insert(file.to_string());
        let path = dir.join(file);
        let errors = load_err(&path);
        let found = errors
            .iter()
            .any(|e| e.line == *line && e.message.contains(needle) && e.column >= 1);
        assert!(found, "{file}: want line {line} `{needle}`, got:\n{errors}");
        for e in errors.iter() {
            assert_eq!(e.file, path.display().to_string());
            // Display is file:line:column: message.
            assert_eq!(
                e.to_string(),
                format!("{}:{}:{}: {}", e.file, e.line, e.column, e.message)
            );
        }
    }
    assert_eq!(
        covered,
        yaml_files(&dir),
        "every bad fixture must be in BAD"
    );
}

#[test]
fn bad_directory_reports_every_file() {
    let errors = load_err(&fixtures().join("bad"));
    let files: BTreeSet<&str> = errors.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(files.len(), BAD.len());
    // One error per line in Display.
    assert_eq!(errors.to_string().lines().count(), errors.len());
}

#[test]
fn duplicate_domain_in_directory() {
    let dir = fixtures().join("bad_dirs/duplicate_domain");
    let errors = load_err(&dir);
    assert_eq!(errors.len(), 1, "{errors}");
    let e = &errors.0[0];
    assert!(e.file.ends_with("b.yml"), "{e}");
    assert_eq!((e.line, e.column), (2, 9));
    assert!(
        e.message
            .contains("duplicate domain `shared`: already defined in"),
        "{e}"
    );
    assert!(e.message.contains("a.yaml"), "{e}");
}

#[test]
fn repository_examples_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules");
    let set = load(&dir);
    let names: Vec<&str> = set.domains().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["api", "auth"]);
    let cases: &[(&str, Entries, Want)] = &[
        (
            "auth",
            &[("auth_type", "login")],
            Limited(5, Unit::Minute, "auth|auth_type=login"),
        ),
        ("auth", &[("auth_type", "logout")], NoMatch),
        (
            "api",
            &[("user", "alice")],
            Limited(100, Unit::Minute, "api|user=alice"),
        ),
        (
            "api",
            &[("generic_key", "global")],
            Limited(10000, Unit::Second, "api|generic_key=global"),
        ),
        (
            "api",
            &[("path", "/login"), ("ip", "1.2.3.4")],
            Limited(5, Unit::Minute, "api|path=/login|ip=1.2.3.4"),
        ),
        ("api", &[("path", "/logout"), ("ip", "1.2.3.4")], NoMatch),
        (
            "api",
            &[("plan", "premium"), ("user", "alice")],
            Limited(1000, Unit::Hour, "api|plan=premium|user=alice"),
        ),
        (
            "api",
            &[("plan", "free"), ("user", "bob")],
            Limited(100, Unit::Hour, "api|plan=free|user=bob"),
        ),
        (
            "api",
            &[("endpoint", "/reports/daily")],
            Limited(20, Unit::Minute, "api|endpoint=/reports/daily"),
        ),
        ("api", &[("endpoint", "/admin")], NoMatch),
        (
            "api",
            &[("client", "internal-batch")],
            Unlimited("api|client=internal-batch"),
        ),
        ("api", &[("client", "other")], NoMatch),
        (
            "api",
            &[("tenant", "t1")],
            Limited(50, Unit::Second, "api|tenant=t1"),
        ),
        (
            "api",
            &[("api_key", "k1"), ("action", "search")],
            Limited(10, Unit::Second, "api|api_key=k1|action=search"),
        ),
    ];
    for (domain, entries, want) in cases {
        check(&set, "examples", domain, entries, want);
    }
    assert!(limit(&set, "api|tenant").shadow_mode);
    let gcra = limit(&set, "api|api_key|action=search")
        .quota
        .expect("quota");
    assert_eq!(
        (gcra.algorithm(), gcra.burst()),
        (Algorithm::Gcra, Some(20))
    );
    assert_eq!(
        limit(&set, "api|path=/login|ip")
            .quota
            .map(|q| q.algorithm()),
        Some(Algorithm::SlidingWindowLog)
    );
    assert!(limit(&set, "api|user").message.is_some());
}

/// A Kubernetes ConfigMap volume: `..2024_01_01/` holds the files, `..data` links to it, and
/// the visible `api.yaml` links to `..data/api.yaml`.
#[cfg(unix)]
#[test]
fn kubernetes_configmap_layout() {
    use std::os::unix::fs::symlink;
    let root = std::env::temp_dir().join(format!("tollgate-rules-cm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let data = root.join("..2024_01_01_00_00_00.1");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(
        data.join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
    )
    .expect("write");
    // A stray file in the hidden dir that must not be read directly (it would duplicate `api`).
    std::fs::write(data.join("copy.yaml"), "domain: api\n").expect("write");
    symlink("..2024_01_01_00_00_00.1", root.join("..data")).expect("symlink");
    symlink("..data/api.yaml", root.join("api.yaml")).expect("symlink");
    std::fs::write(root.join(".hidden.yaml"), "not: valid: yaml: [").expect("write");
    std::fs::write(root.join("README.txt"), "ignored").expect("write");
    let set = load(&root);
    let names: Vec<&str> = set.domains().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["api"]);
    check(
        &set,
        "configmap",
        "api",
        &[("user", "u")],
        &Limited(3, Unit::Second, "api|user=u"),
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn missing_path_is_an_error_not_a_panic() {
    let errors = load_err(&fixtures().join("does-not-exist.yaml"));
    assert_eq!(errors.len(), 1);
    assert_eq!(errors.0[0].line, 0);
    assert!(errors.0[0].message.contains("cannot read rules"));
}

#[test]
fn index_of_finds_own_limits_only() {
    let set = load(&fixtures().join("good"));
    let copy = set.clone();
    assert!(set.limits().count() > 1);
    for (i, l) in set.limits().enumerate() {
        assert_eq!(set.index_of(l), Some(i), "{}", l.id);
        // An equal limit of another set (a clone) is not this set's.
        assert_eq!(set.index_of(limit(&copy, &l.id)), None, "{}", l.id);
    }
    let stray = set.limits().next().unwrap().clone();
    assert_eq!(set.index_of(&stray), None);
}

#[test]
fn period_and_bucket_fill_time_bounds_are_inclusive() {
    let dir = std::env::temp_dir().join(format!("tollgate-rules-bounds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("b.yaml");
    let try_rule = |rate_limit: &str| {
        std::fs::write(
            &file,
            format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n"),
        )
        .unwrap();
        RuleSet::load(&file).map(|_| ()).map_err(|e| e.to_string())
    };
    // 100 years is the longest period, and the longest bucket fill time.
    assert_eq!(
        try_rule("{unit: year, unit_multiplier: 100, requests_per_unit: 1}"),
        Ok(())
    );
    let err = try_rule("{unit: year, unit_multiplier: 101, requests_per_unit: 1}").unwrap_err();
    assert!(err.contains("longer than the longest supported"), "{err}");
    assert_eq!(
        try_rule("{unit: year, requests_per_unit: 1, algorithm: gcra, burst: 100}"),
        Ok(())
    );
    let err =
        try_rule("{unit: year, requests_per_unit: 1, algorithm: gcra, burst: 101}").unwrap_err();
    assert!(err.contains("takes longer than 100 years to fill"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A listed rule file that cannot be read is an error naming it (and a dangling link's
/// target), never a skipped file; `rule_files` lists it so a watcher sees it; a directory named
/// `*.yaml` is not a rule file.
#[cfg(unix)]
#[test]
fn dangling_symlinks_are_errors_not_skipped_files() {
    use std::os::unix::fs::symlink;
    use tollgate_core::rules::rule_files;
    let root = std::env::temp_dir().join(format!("tollgate-rules-lost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("dir.yaml")).expect("mkdir");
    std::fs::write(root.join("api.yaml"), "domain: api\n").expect("write");
    symlink("gone/api.yaml", root.join("lost.yaml")).expect("symlink");
    assert_eq!(
        rule_files(&root),
        [root.join("api.yaml"), root.join("lost.yaml")]
    );
    let errors = load_err(&root);
    assert_eq!(errors.len(), 1, "{errors}");
    assert_eq!(
        errors.0[0].file,
        root.join("lost.yaml").display().to_string()
    );
    assert!(
        errors.0[0]
            .message
            .contains("dangling symlink: its target gone/api.yaml does not exist"),
        "{errors}"
    );
    // The rules path itself a dangling link: an error too, never an empty set.
    let errors = load_err(&root.join("lost.yaml"));
    assert!(errors.0[0]
        .message
        .starts_with("cannot read rules: dangling symlink"));
    assert!(rule_files(&root.join("nope")).is_empty());
    // Removing the entry is removing the domain.
    std::fs::remove_file(root.join("lost.yaml")).expect("rm");
    assert_eq!(load(&root).domains().count(), 1);
    let _ = std::fs::remove_dir_all(&root);
}

/// `sync` is kept per limit; `--sync-default` applies it to the rules that name none, where
/// their algorithm can be leased, and a default algorithm that cannot is reported.
#[test]
fn sync_modes_and_their_default() {
    use tollgate_core::{RuleDefaults, SyncMode};
    let dir = std::env::temp_dir().join(format!("tollgate-sync-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("api.yaml");
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 5, sync: exact}\n  - key: d\n    rate_limit: {unit: second, requests_per_unit: 5, sync: lease}\n  - key: e\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window, sync: batched}\n",
    )
    .unwrap();
    let sync = |set: &RuleSet, id: &str| limit(set, id).quota.unwrap().sync();
    let plain = load(&file);
    assert_eq!(sync(&plain, "api|a"), SyncMode::Exact);
    assert_eq!(sync(&plain, "api|d"), SyncMode::Lease);
    assert_eq!(sync(&plain, "api|e"), SyncMode::Batched);
    let batched = load(&file).with_defaults(RuleDefaults {
        sync: SyncMode::Batched,
        ..RuleDefaults::default()
    });
    assert_eq!(sync(&batched, "api|a"), SyncMode::Batched);
    assert_eq!(
        sync(&batched, "api|b"),
        SyncMode::Exact,
        "gcra is not batched"
    );
    assert_eq!(
        sync(&batched, "api|d"),
        SyncMode::Lease,
        "named lease stays"
    );
    let leased = load(&file).with_defaults(RuleDefaults {
        sync: SyncMode::Lease,
        ..RuleDefaults::default()
    });
    assert_eq!(sync(&leased, "api|a"), SyncMode::Lease);
    assert_eq!(
        sync(&leased, "api|b"),
        SyncMode::Exact,
        "gcra cannot be leased"
    );
    assert_eq!(sync(&leased, "api|c"), SyncMode::Exact, "named exact stays");
    assert!(leased.unleasable().is_empty());
    // A rule naming lease whose algorithm comes from a default that cannot be leased.
    let gcra = load(&file).with_defaults(RuleDefaults {
        algorithm: Some(Algorithm::Gcra),
        ..RuleDefaults::default()
    });
    let problems = gcra.unleasable();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("api.yaml:9:") && problems[0].contains("not gcra"),
        "{problems:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// docs/rules.md's tiers example loads and does what the page's worked example says.
#[test]
fn the_docs_tiers_example_holds() {
    use tollgate_core::limiter::{check, Descriptor};
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/rules.md"),
    )
    .unwrap();
    let section = &page[page.find("## Tiers").expect("a Tiers section")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").unwrap()];
    let rules = RuleSet::from_sources(&[("rules.md".to_string(), yaml.to_string())]).unwrap();
    let store = tollgate_core::MemoryStore::default();
    let t0 = 1_795_305_600_000_000;
    let count = |plan: &str, now, n| {
        let d = [Descriptor::new([("api", "x"), ("plan", plan)])];
        (0..n)
            .filter(|_| check(&rules, &store, now, "api", &d, 1).unwrap().allowed())
            .count()
    };
    // Free alone gets 20, then paid 80; paid alone (next window) 90.
    assert_eq!(count("free", t0, 200), 20);
    assert_eq!(count("paid", t0, 200), 80);
    assert_eq!(count("paid", t0 + 1_000_000, 200), 90);
    // Unknown plans are free traffic.
    assert_eq!(count("gold", t0 + 1_000_000, 200), 10);
}

/// docs/rules.md's doorkeeper example loads, and its limit of 1 admits a key's first request
/// (held back: no counter) and denies the second.
#[test]
fn the_docs_doorkeeper_example_holds() {
    use tollgate_core::limiter::{check, Descriptor};
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/rules.md"),
    )
    .unwrap();
    let section = &page[page
        .find("<!-- doorkeeper example -->")
        .expect("the marker")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").unwrap()];
    let rules = RuleSet::from_sources(&[("rules.md".to_string(), yaml.to_string())]).unwrap();
    let store = tollgate_core::MemoryStore::default();
    let t0 = 1_795_305_600_000_000;
    let d = [Descriptor::new([("user_id", "u1")])];
    let allowed = |now| check(&rules, &store, now, "api", &d, 1).unwrap().allowed();
    assert!(allowed(t0));
    assert!(store.is_empty(), "the first request costs no counter");
    assert!(!allowed(t0 + 1));
    assert_eq!(store.len(), 1);
    assert!(allowed(t0 + 60_000_000), "a new minute");
}

/// A set of entries with no order (a quota bucket's id) finds the rule of the descriptor tree
/// whatever order it is given in, and resolves as the ordered descriptor does.
#[test]
fn unordered_entries_take_the_tree_order() {
    let set = RuleSet::from_sources(&[(
        "q.yaml".into(),
        "domain: q\ndescriptors:\n  - key: tenant\n    value: acme\n    descriptors:\n      - key: method\n        rate_limit: {unit: second, requests_per_unit: 40}\n  - key: method\n    value: get\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: tier\n    rate_limit: {unlimited: true}\n"
            .into(),
    )])
    .unwrap();
    let limited = |r: &Resolution<'_>| match r {
        Resolution::Limited { limit, .. } => Some(limit.quota.as_ref().unwrap().limit()),
        _ => None,
    };
    for entries in [
        [("method", "get"), ("tenant", "acme")],
        [("tenant", "acme"), ("method", "get")],
    ] {
        let (ordered, r) = set.resolve_unordered("q", &entries);
        assert_eq!(ordered, vec![("tenant", "acme"), ("method", "get")]);
        assert_eq!(limited(&r), Some(40));
        assert_eq!(r, set.resolve("q", &ordered));
    }
    // One entry: the top-level rule.
    let (_, r) = set.resolve_unordered("q", &[("method", "get")]);
    assert_eq!(limited(&r), Some(5));
    let (_, r) = set.resolve_unordered("q", &[("tier", "x")]);
    assert!(matches!(r, Resolution::Unlimited(_)));
    // No order reaches a rule; an unknown domain.
    let (_, r) = set.resolve_unordered("q", &[("tenant", "acme"), ("tier", "x")]);
    assert_eq!(r, Resolution::NoMatch);
    let (_, r) = set.resolve_unordered("nope", &[("tier", "x")]);
    assert_eq!(r, Resolution::NoMatch);
    assert_eq!(set.resolve_unordered("q", &[]).1, Resolution::NoMatch);
}
