//! envoyproxy/ratelimit's own rule files (`tests/fixtures/envoy-ratelimit`, copied unchanged from
//! its repository) judged by its own test expectations: every file it loads loads here with the
//! same meaning (limits, units, unlimited, shadow and quota mode, replaces, metadata, and stats
//! keys equal to its stats keys), every file it rejects is rejected here with a message naming
//! the file and line, and the decisions it makes on request sequences are made here (manual
//! clock, memory store). Every fixture file must appear in a table, so none is left untested.
//!
//! Behaviours checked (one row = one envoy expectation; counts are asserted by
//! `behaviour_count`):
//!
//! | group | source of the expectation | rows |
//! |---|---|---|
//! | resolution + stats key | test/config/config_test.go (Basic, ShadowMode, Wildcard, ShareThreshold, Metadata), README examples 1-11, integration config | `RESOLVE` |
//! | stats key composition | config_test.go (DetailedMetric, ValueToMetric_*, WildcardStatsBehavior), inline rules | `STATS` |
//! | rejected files | config_test.go (expectConfigPanic cases) | `REJECT` |
//! | decisions | service tests (quota mode, shadow, unlimited, replaces) and README examples | `decisions_*` tests |
//! | deliberate differences (default mode) | README / limiter behaviour | `differences_*` tests |

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tollgate_core::clock::SECOND;
use tollgate_core::limiter::{check, Descriptor, Status, Verdict};
use tollgate_core::rules::MetaValue;
use tollgate_core::{Algorithm, MemoryStore, Micros, Resolution, RuleSet, Unit};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/envoy-ratelimit")
}

fn load(rel: &str) -> RuleSet {
    let p = root().join(rel);
    match RuleSet::load(&p) {
        Ok(s) => s,
        Err(e) => panic!(
            "{} should load (envoyproxy/ratelimit loads it):\n{e}",
            p.display()
        ),
    }
}

fn inline(yaml: &str) -> RuleSet {
    match RuleSet::from_sources(&[("inline.yaml".to_string(), yaml.to_string())]) {
        Ok(s) => s,
        Err(e) => panic!("inline rules should load:\n{e}\n{yaml}"),
    }
}

/// What envoyproxy/ratelimit's `GetLimit` returns for a descriptor.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// `nil`: no limit.
    NoLimit,
    /// An `unlimited` limit with this stats key.
    Unlimited(&'static str),
    /// requests per unit, unit, shadow mode, stats key.
    Limit(u64, Unit, bool, &'static str),
}
use Want::*;

type Entries = &'static [(&'static str, &'static str)];

/// Files envoyproxy/ratelimit loads (each alone: one domain per file, as it loads them unless
/// merging), with descriptors and what they resolve to.
/// (file or directory, domain, descriptors with what they resolve to).
type Resolve = (&'static str, &'static str, &'static [(Entries, Want)]);

const RESOLVE: &[Resolve] = &[
    (
        "config/basic_config.yaml",
        "test-domain",
        &[
            (&[("key1", "something")], NoLimit),
            (&[("key1", "value1")], NoLimit),
            (&[("key2", "value2"), ("subkey", "subvalue")], NoLimit),
            (&[("key5", "value5"), ("subkey5", "subvalue")], NoLimit),
            (
                &[("key1", "value1"), ("subkey1", "something")],
                Limit(5, Unit::Second, false, "test-domain.key1_value1.subkey1"),
            ),
            (
                &[("key1", "value1"), ("subkey1", "subvalue1")],
                Limit(
                    10,
                    Unit::Second,
                    false,
                    "test-domain.key1_value1.subkey1_subvalue1",
                ),
            ),
            (
                &[("key2", "something")],
                Limit(20, Unit::Minute, false, "test-domain.key2"),
            ),
            (
                &[("key2", "value2")],
                Limit(30, Unit::Minute, false, "test-domain.key2_value2"),
            ),
            (&[("key2", "value3")], NoLimit),
            (
                &[("key3", "foo")],
                Limit(1, Unit::Hour, false, "test-domain.key3"),
            ),
            (
                &[("key4", "foo")],
                Limit(1, Unit::Day, false, "test-domain.key4"),
            ),
            (&[("key6", "foo")], Unlimited("test-domain.key6")),
            (
                &[("key7", "unspecified_value")],
                Limit(
                    70,
                    Unit::Minute,
                    false,
                    "test-domain.key7_unspecified_value",
                ),
            ),
            (
                &[("key7", "another_value")],
                Limit(70, Unit::Minute, false, "test-domain.key7_another_value"),
            ),
            (
                &[("key5", "value5"), ("subkey5", "subvalue5")],
                Limit(
                    25,
                    Unit::Day,
                    false,
                    "test-domain.key5_value5.subkey5_subvalue5",
                ),
            ),
        ],
    ),
    (
        "config/shadowmode_config.yaml",
        "test-domain",
        &[
            (
                &[("key1", "value1"), ("subkey1", "something")],
                Limit(5, Unit::Second, false, "test-domain.key1_value1.subkey1"),
            ),
            (
                &[("key1", "value1"), ("subkey1", "subvalue1")],
                Limit(
                    10,
                    Unit::Second,
                    true,
                    "test-domain.key1_value1.subkey1_subvalue1",
                ),
            ),
            (
                &[("key2", "something")],
                Limit(20, Unit::Minute, true, "test-domain.key2"),
            ),
            (
                &[("key2", "value2")],
                Limit(30, Unit::Minute, false, "test-domain.key2_value2"),
            ),
        ],
    ),
    (
        "config/wildcard.yaml",
        "test-domain",
        &[
            (
                &[("noVal", "foo1")],
                Limit(20, Unit::Minute, false, "test-domain.noVal"),
            ),
            (
                &[("wild", "foo1")],
                Limit(20, Unit::Minute, false, "test-domain.wild_foo*"),
            ),
            (
                &[("wild", "foo2")],
                Limit(20, Unit::Minute, false, "test-domain.wild_foo*"),
            ),
            (
                &[("nestedWild", "val1"), ("wild", "goo2")],
                Limit(
                    20,
                    Unit::Minute,
                    false,
                    "test-domain.nestedWild_val1.wild_goo*",
                ),
            ),
            (&[("wild", "bar")], NoLimit),
            (&[("noWild", "foo1")], NoLimit),
            (
                &[("midWild", "barab")],
                Limit(20, Unit::Minute, false, "test-domain.midWild_bar*b"),
            ),
            (
                &[("midWild", "bar123b")],
                Limit(20, Unit::Minute, false, "test-domain.midWild_bar*b"),
            ),
            (
                &[("midWild", "barb")],
                Limit(20, Unit::Minute, false, "test-domain.midWild_bar*b"),
            ),
            (&[("midWild", "bara")], NoLimit),
            (&[("midWild", "xbarb")], NoLimit),
            (
                &[("multiWild", "foo123bar456baz")],
                Limit(10, Unit::Minute, false, "test-domain.multiWild_foo*bar*baz"),
            ),
            (
                &[("multiWild", "foobarbaz")],
                Limit(10, Unit::Minute, false, "test-domain.multiWild_foo*bar*baz"),
            ),
            (&[("multiWild", "foo123baz")], NoLimit),
            (&[("multiWild", "bar456baz")], NoLimit),
        ],
    ),
    (
        "config/share_threshold.yaml",
        "test-domain",
        &[
            (
                &[("files", "files/a.pdf")],
                Limit(100, Unit::Minute, false, "test-domain.files_files/*"),
            ),
            (
                &[("files", "files/b.csv")],
                Limit(100, Unit::Minute, false, "test-domain.files_files/*"),
            ),
            (
                &[("route", "api/v1"), ("method", "GET")],
                Limit(60, Unit::Minute, false, "test-domain.route_api/*.method"),
            ),
            (
                &[("service", "svc/user"), ("endpoint", "get")],
                Limit(
                    80,
                    Unit::Minute,
                    false,
                    "test-domain.service_svc/*.endpoint_get",
                ),
            ),
            (
                &[("nested", "parent"), ("files", "nested/file1.txt")],
                Limit(
                    200,
                    Unit::Minute,
                    false,
                    "test-domain.nested_parent.files_nested/*",
                ),
            ),
            (
                &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
                Limit(
                    300,
                    Unit::Minute,
                    false,
                    "test-domain.files_top/*.files_nested/*",
                ),
            ),
            (
                &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
                Limit(
                    120,
                    Unit::Minute,
                    false,
                    "test-domain.path_path/*.file_file/*.type",
                ),
            ),
            (
                &[
                    ("user", "user/alice"),
                    ("resource", "res/file1"),
                    ("action", "read"),
                ],
                Limit(
                    150,
                    Unit::Minute,
                    false,
                    "test-domain.user_user/*.resource_res/*.action",
                ),
            ),
            (
                &[("file", "test1")],
                Limit(50, Unit::Minute, false, "test-domain.file_test1"),
            ),
            (
                &[("file", "test2")],
                Limit(100, Unit::Minute, false, "test-domain.file_test*"),
            ),
            (
                &[("file", "test123")],
                Limit(100, Unit::Minute, false, "test-domain.file_test*"),
            ),
            (
                &[("midpath", "/api/v1")],
                Limit(100, Unit::Minute, false, "test-domain.midpath_/api*v1"),
            ),
            (&[("midpath", "/api/v2")], NoLimit),
            (
                &[("multiroute", "svcAepBrpc")],
                Limit(50, Unit::Minute, false, "test-domain.multiroute_svc*ep*rpc"),
            ),
            (&[("multiroute", "svcABCrpc")], NoLimit),
            (
                &[("midroute", "/api/v2")],
                Limit(80, Unit::Minute, false, "test-domain.midroute_/api*v2"),
            ),
            (
                &[("midroute", "/api-beta-v2")],
                Limit(80, Unit::Minute, false, "test-domain.midroute_/api*v2"),
            ),
            (
                &[("tenant", "t1prod"), ("resource", "resAv2")],
                Limit(
                    60,
                    Unit::Minute,
                    false,
                    "test-domain.tenant_t*prod.resource_res*v2",
                ),
            ),
            (
                &[("tenant", "t99prod"), ("resource", "resBBBv2")],
                Limit(
                    60,
                    Unit::Minute,
                    false,
                    "test-domain.tenant_t*prod.resource_res*v2",
                ),
            ),
        ],
    ),
    (
        "config/metadata.yaml",
        "test-domain",
        &[
            (
                &[("key1", "value1"), ("subkey1", "something")],
                Limit(5, Unit::Second, false, "test-domain.key1_value1.subkey1"),
            ),
            (
                &[("key2", "something")],
                Limit(20, Unit::Minute, false, "test-domain.key2"),
            ),
        ],
    ),
    (
        "config/merge_domain_key1.yaml",
        "test-domain",
        &[(
            &[("key1", "value1")],
            Limit(10, Unit::Minute, false, "test-domain.key1_value1"),
        )],
    ),
    (
        "config/merge_domain_key2.yaml",
        "test-domain",
        &[(
            &[("key2", "value2")],
            Limit(20, Unit::Minute, false, "test-domain.key2_value2"),
        )],
    ),
    // Alone, a domain with no descriptors: loads, limits nothing.
    (
        "config/duplicate_domain.yaml",
        "test-domain",
        &[(&[("key1", "value1")], NoLimit)],
    ),
    (
        "integration/reload.yaml",
        "reload",
        &[
            (
                &[("key1", "x")],
                Limit(50, Unit::Second, false, "reload.key1"),
            ),
            (
                &[("block", "x")],
                Limit(0, Unit::Second, false, "reload.block"),
            ),
            (
                &[("one_per_minute", "x")],
                Limit(1, Unit::Minute, false, "reload.one_per_minute"),
            ),
        ],
    ),
    // The integration tests' runtime folder, loaded as a directory (all its domains).
    (
        "integration/config",
        "basic",
        &[
            (
                &[("key1", "foo")],
                Limit(50, Unit::Second, false, "basic.key1"),
            ),
            (
                &[("key1_local", "foo")],
                Limit(50, Unit::Second, false, "basic.key1_local"),
            ),
            (
                &[("one_per_minute", "foo")],
                Limit(1, Unit::Minute, false, "basic.one_per_minute"),
            ),
        ],
    ),
    (
        "integration/config",
        "another",
        &[
            (
                &[("key2", "x")],
                Limit(20, Unit::Minute, false, "another.key2"),
            ),
            (
                &[("key3", "x")],
                Limit(10, Unit::Hour, false, "another.key3"),
            ),
            (
                &[("key4", "x")],
                Limit(20, Unit::Day, false, "another.key4"),
            ),
            (
                &[("key4_local", "x")],
                Limit(20, Unit::Day, false, "another.key4_local"),
            ),
        ],
    ),
    (
        "integration/config",
        "share-threshold-test",
        &[
            (
                &[("files", "files/a")],
                Limit(10, Unit::Hour, false, "share-threshold-test.files_files/*"),
            ),
            (
                &[("files_no_share", "files_no_share/a")],
                Limit(
                    10,
                    Unit::Hour,
                    false,
                    "share-threshold-test.files_no_share_files_no_share/*",
                ),
            ),
        ],
    ),
    (
        "readme/example1.yaml",
        "mongo_cps",
        &[
            (
                &[("database", "users")],
                Limit(500, Unit::Second, false, "mongo_cps.database_users"),
            ),
            (
                &[("database", "default")],
                Limit(500, Unit::Second, false, "mongo_cps.database_default"),
            ),
            (&[("database", "other")], NoLimit),
        ],
    ),
    (
        "readme/example2.yaml",
        "messaging",
        &[
            (
                &[("message_type", "marketing"), ("to_number", "2061234567")],
                Limit(
                    5,
                    Unit::Day,
                    false,
                    "messaging.message_type_marketing.to_number",
                ),
            ),
            (
                &[("to_number", "2061234567")],
                Limit(100, Unit::Day, false, "messaging.to_number"),
            ),
            (
                &[
                    ("message_type", "transactional"),
                    ("to_number", "2061234567"),
                ],
                NoLimit,
            ),
        ],
    ),
    (
        "readme/example3.yaml",
        "edge_proxy_per_ip",
        &[
            (
                &[("remote_address", "10.0.0.1")],
                Limit(10, Unit::Second, false, "edge_proxy_per_ip.remote_address"),
            ),
            (
                &[("remote_address", "50.0.0.5")],
                Limit(
                    0,
                    Unit::Second,
                    false,
                    "edge_proxy_per_ip.remote_address_50.0.0.5",
                ),
            ),
        ],
    ),
    (
        "readme/example4a.yaml",
        "example4",
        &[(
            &[("key", "value")],
            Limit(300, Unit::Second, false, "example4.key_value"),
        )],
    ),
    (
        "readme/example4b.yaml",
        "example4",
        &[
            (
                &[("key", "value"), ("subkey", "subvalue")],
                Limit(300, Unit::Second, false, "example4.key_value.subkey"),
            ),
            (&[("key", "value")], NoLimit),
        ],
    ),
    (
        "readme/example5.yaml",
        "internal",
        &[
            (&[("ldap", "x")], Unlimited("internal.ldap")),
            (
                &[("azure", "x")],
                Limit(100, Unit::Minute, false, "internal.azure"),
            ),
        ],
    ),
    (
        "readme/example6.yaml",
        "example6",
        &[
            (
                &[("service", "s"), ("user", "user-a")],
                Limit(10, Unit::Second, true, "example6.service.user_user-a"),
            ),
            (
                &[("service", "s"), ("user", "user-b")],
                Limit(20, Unit::Second, false, "example6.service.user_user-b"),
            ),
            (&[("service", "s"), ("user", "user-c")], NoLimit),
        ],
    ),
    (
        "readme/example7.yaml",
        "example7",
        &[
            (
                &[("key_1", "value_1"), ("user", "bkthomps")],
                Limit(
                    5,
                    Unit::Second,
                    false,
                    "example7.key_1_value_1.user_bkthomps",
                ),
            ),
            (
                &[("key_2", "value_2"), ("user", "bkthomps")],
                Limit(
                    10,
                    Unit::Second,
                    false,
                    "example7.key_2_value_2.user_bkthomps",
                ),
            ),
        ],
    ),
    (
        "readme/example8.yaml",
        "example8",
        &[
            (
                &[("key1", "foo")],
                Limit(10, Unit::Minute, false, "example8.key1_foo"),
            ),
            (
                &[("key1", "value1")],
                Limit(20, Unit::Minute, false, "example8.key1_value1"),
            ),
        ],
    ),
    (
        "readme/example9a.yaml",
        "example9",
        &[
            (
                &[("key1", "value1")],
                Limit(20, Unit::Minute, false, "example9.key1_value*"),
            ),
            (&[("key1", "other")], NoLimit),
        ],
    ),
    (
        "readme/example9b.yaml",
        "example9",
        &[
            (
                &[("path", "/api/v1/action")],
                Limit(20, Unit::Minute, false, "example9.path_/api/*/action"),
            ),
            (&[("path", "/api/v1/other")], NoLimit),
        ],
    ),
    (
        "readme/example9c.yaml",
        "example9",
        &[(
            &[("route", "/api/a/resource/b/action")],
            Limit(
                20,
                Unit::Minute,
                false,
                "example9.route_/api/*/resource/*/action",
            ),
        )],
    ),
    (
        "readme/example10.yaml",
        "example10",
        &[
            (
                &[
                    ("route", "draw"),
                    ("http_method", "GET"),
                    ("subject_id", "123"),
                ],
                Limit(
                    60,
                    Unit::Minute,
                    false,
                    "example10.route_draw.http_method_GET.subject_id",
                ),
            ),
            (
                &[
                    ("route", "erase"),
                    ("http_method", "POST"),
                    ("subject_id", "9"),
                ],
                Limit(
                    60,
                    Unit::Minute,
                    false,
                    "example10.route_erase.http_method_POST.subject_id",
                ),
            ),
        ],
    ),
    (
        "readme/example10_wildcard.yaml",
        "example10_wildcard",
        &[
            (
                &[
                    ("user", "alice"),
                    ("action", "readfile"),
                    ("resource", "documents"),
                ],
                Limit(
                    100,
                    Unit::Minute,
                    false,
                    "example10_wildcard.user_alice.action_readfile.resource",
                ),
            ),
            (
                &[
                    ("user", "alice"),
                    ("action", "write"),
                    ("resource", "documents"),
                ],
                NoLimit,
            ),
        ],
    ),
    (
        "readme/example11.yaml",
        "example11",
        &[
            (
                &[("files", "files/a.pdf")],
                Limit(10, Unit::Hour, false, "example11.files_files/*"),
            ),
            (
                &[("files_no_share", "files_no_share/a.pdf")],
                Limit(
                    10,
                    Unit::Hour,
                    false,
                    "example11.files_no_share_files_no_share/*",
                ),
            ),
        ],
    ),
    (
        "readme/example11_metrics.yaml",
        "example11_metrics",
        &[
            (
                &[("route", "api/v1"), ("method", "GET")],
                Limit(
                    60,
                    Unit::Minute,
                    false,
                    "example11_metrics.route_api/*.method",
                ),
            ),
            (
                &[("route", "api/v2"), ("method", "POST")],
                Limit(
                    60,
                    Unit::Minute,
                    false,
                    "example11_metrics.route_api/*.method",
                ),
            ),
        ],
    ),
];

/// Files envoyproxy/ratelimit rejects (alone, or after the file in `.1`), its error, and what
/// tollgate must say: (file, loaded after, envoy's error, line, substring of tollgate's message).
type Reject = (
    &'static str,
    Option<&'static str>,
    &'static str,
    usize,
    &'static str,
);

const REJECT: &[Reject] = &[
    (
        "config/bad_limit_unit.yaml",
        None,
        "invalid rate limit unit 'foo'",
        6,
        "invalid `unit`: unknown unit 'foo'",
    ),
    (
        "config/bad_yaml.yaml",
        None,
        "error loading config file: yaml: line 2: found unexpected end of stream",
        2,
        "invalid YAML",
    ),
    (
        "config/empty_domain.yaml",
        None,
        "config file cannot have empty domain",
        1,
        "missing required field `domain`",
    ),
    (
        "config/empty_key.yaml",
        None,
        "descriptor has empty key",
        3,
        "missing required field `key`",
    ),
    (
        "config/duplicate_key.yaml",
        None,
        "duplicate descriptor composite key 'test-domain.key1_value1'",
        6,
        "duplicate descriptor: key `key1` and value `value1`",
    ),
    (
        "config/misspelled_key.yaml",
        None,
        "config error, unknown key 'ratelimit'",
        5,
        "unknown field `ratelimit`",
    ),
    (
        "config/misspelled_key2.yaml",
        None,
        "config error, unknown key 'requestsperunit'",
        7,
        "unknown field `requestsperunit`",
    ),
    (
        "config/non_map_list.yaml",
        None,
        "config error, yaml file contains list of type other than map: a",
        3,
        "a descriptor must be a mapping, found `a`",
    ),
    (
        "config/non_string_key.yaml",
        None,
        "config error, key is not of type string: 0.25",
        1,
        "unknown field `0.25`",
    ),
    (
        "config/replaces_empty.yaml",
        None,
        "should not have an empty replaces entry",
        10,
        "`replaces` entry is missing required field `name`",
    ),
    (
        "config/replaces_self.yaml",
        None,
        "replaces should not contain name of same descriptor",
        10,
        "`replaces` must not name the rate limit itself",
    ),
    (
        "config/unlimited_with_unit.yaml",
        None,
        "should not specify rate limit unit when unlimited",
        6,
        "`unlimited: true` cannot be combined with `unit`",
    ),
    (
        "config/duplicate_domain.yaml",
        Some("config/basic_config.yaml"),
        "duplicate domain 'test-domain' in config file",
        1,
        "duplicate domain `test-domain`",
    ),
    // Without MERGE_DOMAIN_CONFIG (envoyproxy/ratelimit's default), two files of one domain
    // are rejected; merging them is a setting of `--profile envoy`.
    (
        "config/merge_domain_key2.yaml",
        Some("config/merge_domain_key1.yaml"),
        "duplicate domain 'test-domain' in config file",
        2,
        "duplicate domain `test-domain`",
    ),
];

/// Stats keys of envoyproxy/ratelimit's inline-config tests (DetailedMetric, ValueToMetric_*,
/// WildcardStatsBehavior), written as rule files: (rules, descriptor, stats key).
const STATS: &[(&str, Entries, &str)] = &[
    // TestValueToMetric_UsesRuntimeValuesInStats
    (
        V2M_NESTED,
        &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
        "domain.route_draw.http_method_GET.subject_id",
    ),
    // TestValueToMetric_WithEmptyValue (three requests)
    (
        V2M_NESTED,
        &[("route", ""), ("http_method", "GET"), ("subject_id", "123")],
        "domain.route.http_method_GET.subject_id",
    ),
    (
        V2M_NESTED,
        &[("route", "draw"), ("http_method", ""), ("subject_id", "123")],
        "domain.route_draw.http_method.subject_id",
    ),
    (
        V2M_NESTED,
        &[("route", ""), ("http_method", ""), ("subject_id", "123")],
        "domain.route.http_method.subject_id",
    ),
    // TestValueToMetric_DefaultKeyIncludesValueAtThatLevel
    (
        "domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        &[("k1", "A"), ("k2", "foo")],
        "d.k1_A.k2",
    ),
    // TestValueToMetric_MidLevelOnly
    (
        "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - key: k3\n            rate_limit: {unit: second, requests_per_unit: 1}\n",
        &[("k1", "X"), ("k2", "Y"), ("k3", "Z")],
        "d.k1.k2_Y.k3",
    ),
    // TestValueToMetric_NoFlag_Unchanged
    (
        "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        &[("k1", "X"), ("k2", "Y")],
        "d.k1.k2",
    ),
    // TestValueToMetric_DoesNotOverrideDetailedMetric
    (
        "domain: domain\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            detailed_metric: true\n            rate_limit: {unit: minute, requests_per_unit: 60}\n",
        &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
        "domain.route_draw.http_method_GET.subject_id_123",
    ),
    // TestValueToMetric_WithConfiguredValues (two requests)
    (
        V2M_CONFIGURED,
        &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")],
        "test-domain.route_api.http_method_GET.subject_id",
    ),
    (
        V2M_CONFIGURED,
        &[("route", "api"), ("http_method", "POST"), ("subject_id", "user456")],
        "test-domain.route_api.http_method_POST.subject_id",
    ),
    // TestValueToMetric_WithWildcard (two requests)
    (
        V2M_WILDCARD,
        &[("user", "alice"), ("action", "readfile"), ("resource", "documents")],
        "domain.user_alice.action_readfile.resource",
    ),
    (
        V2M_WILDCARD,
        &[("user", "bob"), ("action", "readdata"), ("resource", "database")],
        "domain.user_bob.action_readdata.resource",
    ),
    // TestValueToMetric_FullKeyMatchesStatsKey, cases 2 and 3
    (
        "domain: test-domain\ndescriptors:\n  - key: route\n    descriptors:\n      - key: http_method\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n",
        &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")],
        "test-domain.route.http_method.subject_id",
    ),
    (
        "domain: test-domain\ndescriptors:\n  - key: route\n    descriptors:\n      - key: http_method\n        descriptors:\n          - key: subject_id\n            detailed_metric: true\n            rate_limit: {unit: minute, requests_per_unit: 60}\n",
        &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")],
        "test-domain.route_api.http_method_GET.subject_id_user123",
    ),
    // TestDetailedMetric: a detailed leaf under a configured value / a key only.
    (
        "domain: nested\ndescriptors:\n  - key: key-1\n    value: value-1\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
        &[("key-1", "value-1")],
        "nested.key-1_value-1",
    ),
    (
        "domain: nested\ndescriptors:\n  - key: key_1\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
        &[("key_1", "value-for-key-1")],
        "nested.key_1_value-for-key-1",
    ),
    (
        "domain: nested\ndescriptors:\n  - key: key_2\n    descriptors:\n      - key: key_3\n        detailed_metric: true\n        rate_limit: {unit: minute, requests_per_unit: 100}\n",
        &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
        "nested.key_2_key-2-value.key_3_requested-key3-value",
    ),
    // detailed_metric with an empty request value keeps the underscore.
    (
        "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        &[("k", "")],
        "d.k_",
    ),
    // TestWildcardStatsBehavior
    (
        "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
        &[("wild", "foo1")],
        "test-domain.wild_foo1",
    ),
    (
        "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    share_threshold: true\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
        &[("wild", "foo1")],
        "test-domain.wild_foo*",
    ),
    (
        "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    descriptors:\n      - key: other\n        value_to_metric: true\n        descriptors:\n          - key: limit\n            rate_limit: {unit: minute, requests_per_unit: 20}\n",
        &[("wild", "foo1"), ("other", "bar"), ("limit", "X")],
        "test-domain.wild_foo*.other_bar.limit",
    ),
    (
        "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*bar*\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
        &[("wild", "foo123bar456")],
        "test-domain.wild_foo*bar*",
    ),
    (
        "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*bar*\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
        &[("wild", "foo123bar456")],
        "test-domain.wild_foo123bar456",
    ),
];

const V2M_NESTED: &str = "domain: domain\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n";
const V2M_CONFIGURED: &str = "domain: test-domain\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value: GET\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n      - key: http_method\n        value: POST\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 30}\n";
const V2M_WILDCARD: &str = "domain: domain\ndescriptors:\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        value: read*\n        value_to_metric: true\n        descriptors:\n          - key: resource\n            rate_limit: {unit: minute, requests_per_unit: 100}\n";

fn check_resolution(set: &RuleSet, what: &str, domain: &str, entries: Entries, want: Want) {
    let got = set.resolve(domain, entries);
    match (want, got) {
        (NoLimit, Resolution::NoMatch) => {}
        (Unlimited(key), Resolution::Unlimited(l)) => {
            assert_eq!(l.stats.for_request(entries), key, "{what} {entries:?}");
        }
        (Limit(rpu, unit, shadow, key), Resolution::Limited { limit, .. }) => {
            let q = limit.quota.expect("limited has a quota");
            assert_eq!(
                (q.limit(), q.period().unit, q.period().multiplier),
                (rpu, unit, 1),
                "{what} {entries:?}"
            );
            assert_eq!(limit.shadow_mode, shadow, "{what} {entries:?}");
            assert_eq!(limit.stats.for_request(entries), key, "{what} {entries:?}");
        }
        (want, got) => panic!("{what} {entries:?}: want {want:?}, got {got:?}"),
    }
}

#[test]
fn every_fixture_file_is_in_a_table() {
    let mut listed: BTreeSet<String> = RESOLVE.iter().map(|r| r.0.to_string()).collect();
    listed.extend(REJECT.iter().map(|r| r.0.to_string()));
    listed.extend(REJECT.iter().filter_map(|r| r.1.map(str::to_string)));
    let mut missing = Vec::new();
    for dir in ["config", "integration", "integration/config", "readme"] {
        for e in std::fs::read_dir(root().join(dir)).expect("fixture dir") {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            if !name.ends_with(".yaml") {
                continue;
            }
            let rel = format!("{dir}/{name}");
            // The integration runtime folder is loaded as a whole.
            if dir == "integration/config" && listed.contains("integration/config") {
                continue;
            }
            if !listed.contains(&rel) {
                missing.push(rel);
            }
        }
    }
    assert!(missing.is_empty(), "fixtures not checked: {missing:?}");
}

#[test]
fn files_envoy_loads_load_with_the_same_limits_and_stats_keys() {
    for (file, domain, cases) in RESOLVE {
        let set = load(file);
        assert!(set.domain(domain).is_some(), "{file}: domain {domain}");
        for (entries, want) in *cases {
            check_resolution(&set, file, domain, entries, *want);
        }
    }
}

#[test]
fn files_envoy_rejects_are_rejected_naming_file_and_line() {
    for (file, after, envoy_says, line, needle) in REJECT {
        let mut sources = Vec::new();
        for f in after.iter().chain(std::iter::once(file)) {
            let p = root().join(f);
            let text = std::fs::read_to_string(&p).expect("fixture");
            sources.push((p.display().to_string(), text));
        }
        let errors = match RuleSet::from_sources(&sources) {
            Ok(_) => {
                panic!("{file}: envoyproxy/ratelimit rejects it ({envoy_says}); tollgate loaded it")
            }
            Err(e) => e,
        };
        let shown = errors.to_string();
        let hit = errors.iter().find(|e| e.message.contains(needle));
        let Some(e) = hit else {
            panic!(
                "{file}: want an error containing {needle:?} (envoy: {envoy_says}), got:\n{shown}"
            );
        };
        assert!(e.file.ends_with(file), "{file}: error names {}", e.file);
        assert_eq!(e.line, *line, "{file}: {shown}");
        assert!(
            e.to_string().starts_with(&format!("{}:{line}:", e.file)),
            "{e}"
        );
    }
}

#[test]
fn stats_keys_compose_per_level_as_envoy() {
    for (yaml, entries, key) in STATS {
        let set = inline(yaml);
        let domain = set.domains().next().expect("a domain").name.clone();
        match set.resolve(&domain, entries) {
            Resolution::Limited { limit, .. } => {
                assert_eq!(limit.stats.for_request(entries), *key, "{yaml}")
            }
            other => panic!("{entries:?} in\n{yaml}\nresolved to {other:?}"),
        }
    }
}

#[test]
fn share_threshold_without_a_wildcard_is_rejected_as_envoy_rejects_it() {
    let yaml = "domain: d\ndescriptors:\n  - key: files\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let e = RuleSet::from_sources(&[("st.yaml".to_string(), yaml.to_string())])
        .expect_err("envoyproxy/ratelimit rejects share_threshold without *");
    assert_eq!(
        e.to_string(),
        "st.yaml:5:22: `share_threshold` can only be used with wildcard values (containing `*`), but found key `files_exact`"
    );
    // A key-only descriptor too; `false` is fine; a `*` anywhere in key or value is accepted.
    let key_only = "domain: d\ndescriptors:\n  - key: files\n    share_threshold: true\n";
    assert!(RuleSet::from_sources(&[("k.yaml".into(), key_only.into())]).is_err());
    inline(
        "domain: d\ndescriptors:\n  - key: files\n    value: exact\n    share_threshold: false\n",
    );
    inline("domain: d\ndescriptors:\n  - key: f\n    value: a*b\n    share_threshold: true\n");
    inline("domain: d\ndescriptors:\n  - key: f*\n    share_threshold: true\n");
}

#[test]
fn metadata_and_quota_mode_are_kept_with_the_limit() {
    let set = load("config/metadata.yaml");
    let meta = |entries: Entries| match set.resolve("test-domain", entries) {
        Resolution::Limited { limit, .. } => limit.metadata.clone(),
        other => panic!("{other:?}"),
    };
    let m = meta(&[("key1", "value1"), ("subkey1", "something")]).expect("metadata");
    assert_eq!(m.get("name"), Some(&MetaValue::String("service_1".into())));
    let m = meta(&[("key2", "something")]).expect("metadata");
    match m.get("service_with_quota") {
        Some(MetaValue::Map(inner)) => {
            assert_eq!(
                inner.get("name"),
                Some(&MetaValue::String("service_2".into()))
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(meta(&[("key1", "value1"), ("subkey1", "subvalue1")]), None);

    let set = inline(
        "domain: q\ndescriptors:\n  - key: quota\n    quota_mode: true\n    metadata: {n: 1, f: 1.5, b: yes, s: '1', l: [x, ~]}\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let Resolution::Limited { limit, .. } = set.resolve("q", &[("quota", "x")]) else {
        panic!("quota limit");
    };
    assert!(limit.quota_mode);
    let m = limit.metadata.as_ref().expect("metadata");
    assert_eq!(m.get("n"), Some(&MetaValue::Number(1.0)));
    assert_eq!(m.get("f"), Some(&MetaValue::Number(1.5)));
    assert_eq!(m.get("b"), Some(&MetaValue::Bool(true)));
    assert_eq!(m.get("s"), Some(&MetaValue::String("1".into())));
    assert_eq!(
        m.get("l"),
        Some(&MetaValue::List(vec![
            MetaValue::String("x".into()),
            MetaValue::Null
        ]))
    );
    for bad in [
        "metadata: [1]",
        "metadata: text",
        "metadata: {x: .inf}",
        "quota_mode: maybe",
    ] {
        let yaml = format!("domain: q\ndescriptors:\n  - key: k\n    {bad}\n");
        let e = RuleSet::from_sources(&[("b.yaml".into(), yaml)]).expect_err(bad);
        assert_eq!(e.0[0].line, 4, "{bad}: {e}");
    }
}

// ---- Decisions on request sequences (manual clock, memory store) ----

/// 16 minutes after the epoch: the start of a second and of a minute.
const T0: Micros = 960 * SECOND;

fn desc(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor::new(entries.iter().copied())
}

fn run<'r>(
    set: &'r RuleSet,
    store: &MemoryStore,
    now: Micros,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> Verdict<'r> {
    let d: Vec<Descriptor> = descriptors.iter().map(|e| desc(e)).collect();
    check(set, store, now, domain, &d, 1).expect("memory store never fails")
}

fn over(s: &Status<'_>) -> bool {
    s.blocks()
}

#[test]
fn decisions_basic_limits_shadow_unlimited_and_blacklist() {
    // basic_config: key2 is 20/minute: 20 pass, the 21st is over.
    let set = load("config/basic_config.yaml");
    let store = MemoryStore::default();
    for i in 0..20 {
        assert!(
            run(&set, &store, T0, "test-domain", &[&[("key2", "x")]]).allowed(),
            "{i}"
        );
    }
    let v = run(&set, &store, T0, "test-domain", &[&[("key2", "x")]]);
    assert!(!v.allowed() && over(&v.statuses[0]));
    // key6 is unlimited: never limited, no counter.
    for _ in 0..100 {
        let v = run(&set, &store, T0, "test-domain", &[&[("key6", "x")]]);
        assert!(v.allowed() && matches!(v.statuses[0], Status::Unlimited(_)));
    }
    // shadowmode_config: key2 (shadow, 20/minute) never denies, reports shadowed past 20.
    let set = load("config/shadowmode_config.yaml");
    let store = MemoryStore::default();
    for i in 0..25 {
        let v = run(&set, &store, T0, "test-domain", &[&[("key2", "x")]]);
        assert!(v.allowed(), "{i}");
        assert_eq!(v.statuses[0].shadowed(), i >= 20, "{i}");
    }
    // Example 3: 50.0.0.5 is blacklisted (0 per second), others get 10 per second.
    let set = load("readme/example3.yaml");
    let store = MemoryStore::default();
    let v = run(
        &set,
        &store,
        T0,
        "edge_proxy_per_ip",
        &[&[("remote_address", "50.0.0.5")]],
    );
    assert!(!v.allowed());
    for _ in 0..10 {
        assert!(run(
            &set,
            &store,
            T0,
            "edge_proxy_per_ip",
            &[&[("remote_address", "10.0.0.1")]]
        )
        .allowed());
    }
    assert!(!run(
        &set,
        &store,
        T0,
        "edge_proxy_per_ip",
        &[&[("remote_address", "10.0.0.1")]]
    )
    .allowed());
    assert!(run(
        &set,
        &store,
        T0,
        "edge_proxy_per_ip",
        &[&[("remote_address", "10.0.0.2")]]
    )
    .allowed());
    // reload.yaml: `block` has 0 requests per unit.
    let set = load("integration/reload.yaml");
    assert!(!run(
        &set,
        &MemoryStore::default(),
        T0,
        "reload",
        &[&[("block", "x")]]
    )
    .allowed());
}

#[test]
fn decisions_replaces_and_nested_examples() {
    // Example 7: with both descriptors, the 10/second limit replaces the 5/second one.
    let set = load("readme/example7.yaml");
    let store = MemoryStore::default();
    let both: &[Entries] = &[
        &[("key_1", "value_1"), ("user", "bkthomps")],
        &[("key_2", "value_2"), ("user", "bkthomps")],
    ];
    for i in 0..10 {
        let v = run(&set, &store, T0, "example7", both);
        assert!(v.allowed(), "{i}");
        assert!(matches!(v.statuses[0], Status::NoLimit), "replaced");
    }
    assert!(!run(&set, &store, T0, "example7", both).allowed());
    // Example 2: 5 marketing messages a day per number, 100 messages a day per number.
    let set = load("readme/example2.yaml");
    let store = MemoryStore::default();
    let marketing: &[Entries] = &[
        &[("message_type", "marketing"), ("to_number", "2061111111")],
        &[("to_number", "2061111111")],
    ];
    for i in 0..5 {
        assert!(
            run(&set, &store, T0, "messaging", marketing).allowed(),
            "{i}"
        );
    }
    let v = run(&set, &store, T0, "messaging", marketing);
    assert!(!v.allowed() && over(&v.statuses[0]) && !over(&v.statuses[1]));
    // Other message types to the same number still pass (the daily 100 has room).
    assert!(run(
        &set,
        &store,
        T0,
        "messaging",
        &[&[("to_number", "2061111111")]]
    )
    .allowed());
    // Example 6: user-a is in shadow mode (10/s), user-b is enforced (20/s).
    let set = load("readme/example6.yaml");
    let store = MemoryStore::default();
    for _ in 0..15 {
        assert!(run(
            &set,
            &store,
            T0,
            "example6",
            &[&[("service", "s"), ("user", "user-a")]]
        )
        .allowed());
    }
    for _ in 0..20 {
        assert!(run(
            &set,
            &store,
            T0,
            "example6",
            &[&[("service", "s"), ("user", "user-b")]]
        )
        .allowed());
    }
    assert!(!run(
        &set,
        &store,
        T0,
        "example6",
        &[&[("service", "s"), ("user", "user-b")]]
    )
    .allowed());
}

#[test]
fn decisions_share_threshold_and_wildcards() {
    // Example 11: files/* share one 10/hour counter; files_no_share/* get one each.
    let set = load("readme/example11.yaml");
    let store = MemoryStore::default();
    for i in 0..10 {
        let f = if i % 2 == 0 {
            "files/a.pdf"
        } else {
            "files/b.csv"
        };
        assert!(run(&set, &store, T0, "example11", &[&[("files", f)]]).allowed());
    }
    assert!(!run(
        &set,
        &store,
        T0,
        "example11",
        &[&[("files", "files/c.txt")]]
    )
    .allowed());
    for _ in 0..10 {
        assert!(run(
            &set,
            &store,
            T0,
            "example11",
            &[&[("files_no_share", "files_no_share/a.pdf")]]
        )
        .allowed());
    }
    assert!(!run(
        &set,
        &store,
        T0,
        "example11",
        &[&[("files_no_share", "files_no_share/a.pdf")]]
    )
    .allowed());
    assert!(run(
        &set,
        &store,
        T0,
        "example11",
        &[&[("files_no_share", "files_no_share/b.csv")]]
    )
    .allowed());
    // Example 9: a wildcard without share_threshold counts each value apart.
    let set = load("readme/example9a.yaml");
    let store = MemoryStore::default();
    for _ in 0..20 {
        assert!(run(&set, &store, T0, "example9", &[&[("key1", "value_a")]]).allowed());
    }
    assert!(!run(&set, &store, T0, "example9", &[&[("key1", "value_a")]]).allowed());
    assert!(run(&set, &store, T0, "example9", &[&[("key1", "value_b")]]).allowed());
}

const QUOTA: &str = "domain: quota-domain
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: shadow_quota
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// Exhausts `entries` (1/minute) so the next request is over.
fn exhaust(set: &RuleSet, store: &MemoryStore, entries: Entries) {
    assert!(run(set, store, T0, "quota-domain", &[entries]).allowed());
}

#[test]
fn decisions_quota_mode_as_envoy_service_tests() {
    let set = inline(QUOTA);
    // TestServicePerDescriptorQuotaMode: regular over, quota under: OVER_LIMIT.
    let store = MemoryStore::default();
    exhaust(&set, &store, &[("regular", "limit")]);
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("regular", "limit")], &[("quota", "limit")]],
    );
    assert!(!v.allowed() && over(&v.statuses[0]) && !over(&v.statuses[1]));
    // TestServiceMixedPerDescriptorModes: regular under, the only quota one over: OVER_LIMIT.
    let store = MemoryStore::default();
    exhaust(&set, &store, &[("quota", "limit")]);
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("regular", "limit")], &[("quota", "limit")]],
    );
    assert!(!v.allowed() && !over(&v.statuses[0]) && over(&v.statuses[1]));
    // TestServiceMixedPerDescriptorModesUnderLimit: both under: OK.
    let store = MemoryStore::default();
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("regular", "limit")], &[("quota", "limit")]],
    );
    assert!(v.allowed());
    // TestServiceQuotaModeOnlyAllOverTheLimit: every quota limit over: OVER_LIMIT.
    let store = MemoryStore::default();
    exhaust(&set, &store, &[("quota", "a")]);
    exhaust(&set, &store, &[("quota2", "b")]);
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("quota", "a")], &[("quota2", "b")]],
    );
    assert!(!v.allowed() && over(&v.statuses[0]) && over(&v.statuses[1]));
    // TestServiceQuotaModeOnlySomeOverTheLimit: one over, one under: OK, the status stays over,
    // and the one under counted the request (it is now exhausted).
    let store = MemoryStore::default();
    exhaust(&set, &store, &[("quota", "a")]);
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("quota", "a")], &[("quota2", "b")]],
    );
    assert!(v.allowed() && over(&v.statuses[0]) && !over(&v.statuses[1]));
    let v = run(&set, &store, T0, "quota-domain", &[&[("quota2", "b")]]);
    assert!(!v.allowed(), "the passing quota descriptor consumed");
    // A quota-mode limit in shadow mode is never over (envoy reports it OK): a request with it
    // and an over quota limit passes.
    let store = MemoryStore::default();
    exhaust(&set, &store, &[("quota", "a")]);
    exhaust(&set, &store, &[("shadow_quota", "s")]);
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("quota", "a")], &[("shadow_quota", "s")]],
    );
    assert!(v.allowed() && v.statuses[1].shadowed());
    // TestServiceGlobalQuotaMode: every descriptor in quota mode; all over: OVER_LIMIT; one
    // without a limit counts as a passed one: OK.
    let store = MemoryStore::default();
    exhaust(&set, &store, &[("regular", "a")]);
    let v = run(&set, &store, T0, "quota-domain", &[&[("regular", "a")]]);
    assert!(!v.allowed_with_quota_mode(true));
    let v = run(
        &set,
        &store,
        T0,
        "quota-domain",
        &[&[("regular", "a")], &[("nolimit", "x")]],
    );
    assert!(v.allowed_with_quota_mode(true) && !v.allowed());
}

// ---- Deliberate differences without `--profile envoy` ----

#[test]
fn differences_default_algorithm_is_sliding_window_counter() {
    // envoyproxy/ratelimit counts in fixed windows aligned on the epoch; tollgate's default is
    // the sliding window counter (no burst of 2x the limit across a window boundary).
    let set = load("integration/reload.yaml");
    let Resolution::Limited { limit, .. } = set.resolve("reload", &[("key1", "x")]) else {
        panic!("key1");
    };
    assert_eq!(
        limit.quota.expect("quota").algorithm(),
        Algorithm::SlidingWindowCounter
    );
    // A per-second limit exhausted during second N: envoy admits again at the start of N+1;
    // the sliding window still denies early in N+1 (most of second N is still in the window).
    let store = MemoryStore::default();
    let late_in_n = T0 + 900_000;
    for _ in 0..50 {
        assert!(run(&set, &store, late_in_n, "reload", &[&[("key1", "x")]]).allowed());
    }
    // Early in N+1 envoy admits a fresh 50; the sliding window weighs 90% of second N's 50 in.
    let early_in_n1 = T0 + SECOND + 100_000;
    let admitted = (0..50)
        .filter(|_| run(&set, &store, early_in_n1, "reload", &[&[("key1", "x")]]).allowed())
        .count();
    assert_eq!(admitted, 5, "envoy (fixed window) would admit 50");
    // duration_until_reset of a MINUTE limit can exceed 60 s (envoy: at most 60 s, the end of
    // the current minute).
    let set = load("integration/config");
    let store = MemoryStore::default();
    let v = run(
        &set,
        &store,
        T0 + 30 * SECOND,
        "basic",
        &[&[("one_per_minute", "x")]],
    );
    let Status::Limited { decision, .. } = v.statuses[0] else {
        panic!("limited");
    };
    assert!(
        decision.reset_after > 60 * SECOND,
        "{}",
        decision.reset_after
    );
}

#[test]
fn differences_denied_requests_consume_nothing() {
    // envoyproxy/ratelimit increments every descriptor's counter even when the request is
    // denied (unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); tollgate's default checks a
    // request all-or-nothing.
    let set = load("readme/example2.yaml");
    let store = MemoryStore::default();
    let marketing: &[Entries] = &[
        &[("message_type", "marketing"), ("to_number", "1")],
        &[("to_number", "1")],
    ];
    for _ in 0..5 {
        assert!(run(&set, &store, T0, "messaging", marketing).allowed());
    }
    for _ in 0..20 {
        assert!(!run(&set, &store, T0, "messaging", marketing).allowed());
    }
    // Envoy would have counted 25 on the daily 100; here the denied 20 were not counted.
    let v = run(&set, &store, T0, "messaging", &[&[("to_number", "1")]]);
    let Status::Limited { decision, .. } = v.statuses[0] else {
        panic!("limited");
    };
    assert_eq!(decision.remaining, 100 - 6);
}

#[test]
fn differences_week_month_year_are_calendar_periods() {
    use tollgate_core::internals::{days_from_civil, window};
    use tollgate_core::Period;
    // envoyproxy/ratelimit: windows of 7, 30 and 365 days counted from the Unix epoch.
    // tollgate: weeks start on Monday, months on the 1st, years on January 1st (UTC).
    let day = 86_400 * SECOND;
    let at = |y, m, d| days_from_civil(y, m, d) as u64 * day;
    let now = at(2024, 3, 15) + 3_600 * SECOND;
    let envoy = |len_days: u64| {
        let len = len_days * day;
        (now - now % len, now - now % len + len)
    };
    let cases = [
        (Unit::Week, (at(2024, 3, 11), at(2024, 3, 18)), 7),
        (Unit::Month, (at(2024, 3, 1), at(2024, 4, 1)), 30),
        (Unit::Year, (at(2024, 1, 1), at(2025, 1, 1)), 365),
    ];
    for (unit, calendar, envoy_days) in cases {
        let got = window(Period::new(unit, 1), now);
        assert_eq!(got, calendar, "{unit:?}");
        assert_ne!(got, envoy(envoy_days), "{unit:?} would be envoy's window");
    }
}

#[test]
fn differences_stricter_validation() {
    // envoyproxy/ratelimit loads both (the first as 0 requests, the second ignoring the count).
    for (yaml, needle) in [
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
            "missing required field `requests_per_unit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n",
            "`unlimited: true` cannot be combined with `requests_per_unit`",
        ),
    ] {
        let e = RuleSet::from_sources(&[("s.yaml".into(), yaml.into())]).expect_err(yaml);
        assert!(e.to_string().starts_with("s.yaml:4:"), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn differences_matching_on_key_and_value_separately() {
    // envoyproxy/ratelimit looks a descriptor entry up by its joined `key_value` string, so the
    // entry `a_b` = `c` finds the rule `a` = `b_c` (both are `a_b_c`); tollgate compares key and
    // value, so it does not.
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let set = RuleSet::from_sources(&[("s.yaml".into(), yaml.into())]).unwrap();
    assert!(matches!(
        set.resolve("d", &[("a", "b_c")]),
        tollgate_core::rules::Resolution::Limited { .. }
    ));
    assert!(!matches!(
        set.resolve("d", &[("a_b", "c")]),
        tollgate_core::rules::Resolution::Limited { .. }
    ));
}

#[test]
fn behaviour_count() {
    let resolutions: usize = RESOLVE.iter().map(|r| r.2.len()).sum();
    let total = resolutions + REJECT.len() + STATS.len();
    // Keep the count in the report and the migration guide in step with the tables.
    assert_eq!(
        (resolutions, REJECT.len(), STATS.len()),
        (103, 14, 23),
        "total {total}"
    );
}
