//! The `http` section end to end: decoded from a rules file here, evaluated by
//! [`crate::request`] (which knows nothing of rule files).

use crate::request::*;
use crate::rules::RuleSet;
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr};

fn actions(http: &str) -> HttpActions {
    let text = format!("domain: web\nhttp:\n{http}");
    match RuleSet::from_sources(&[("t.yaml".to_string(), text)]) {
        Ok(s) => s
            .domain("web")
            .and_then(|d| d.http())
            .cloned()
            .unwrap_or_default(),
        Err(e) => panic!("{e}"),
    }
}

fn errors(http: &str) -> Vec<String> {
    let text = format!("domain: web\nhttp:\n{http}");
    match RuleSet::from_sources(&[("t.yaml".to_string(), text)]) {
        Ok(_) => panic!("expected errors"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn parts<'a>(h: &'a HeaderMap, path: &'a str, ip: &str) -> RequestParts<'a> {
    RequestParts {
        method: Some("GET"),
        path: Some(path),
        authority: Some("api.example.com"),
        headers: h,
        remote_address: ip.parse().ok(),
    }
}

type Ds = Vec<Vec<(String, String)>>;

fn ds(list: &[&[(&str, &str)]]) -> Ds {
    list.iter()
        .map(|d| {
            d.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn the_design_example() {
    let a = actions(
        "  - actions: [{remote_address: {}}]
  - actions: [{request_headers: {header_name: X-Api-Key, descriptor_key: api_key}}]
",
    );
    let h = headers(&[("x-api-key", "k1")]);
    assert_eq!(
        a.descriptors(&parts(&h, "/", "10.0.0.1")),
        ds(&[&[("remote_address", "10.0.0.1")], &[("api_key", "k1")]])
    );
    // No key: that entry yields nothing, the other still applies.
    let none = HeaderMap::new();
    assert_eq!(
        a.descriptors(&parts(&none, "/", "::ffff:10.0.0.2")),
        ds(&[&[("remote_address", "10.0.0.2")]])
    );
    // No address either: nothing.
    assert_eq!(a.descriptors(&parts(&none, "/", "")), Ds::new());
}

#[test]
fn skip_if_absent_skips_the_action_not_the_descriptor() {
    let a = actions(
        "  - actions:
      - generic_key: {descriptor_value: all}
      - request_headers: {header_name: x-user, descriptor_key: user, skip_if_absent: true}
      - request_headers: {header_name: ':method', descriptor_key: method}
",
    );
    let none = HeaderMap::new();
    assert_eq!(
        a.descriptors(&parts(&none, "/", "1.2.3.4")),
        ds(&[&[("generic_key", "all"), ("method", "GET")]])
    );
    let h = headers(&[("x-user", "bob")]);
    assert_eq!(
        a.descriptors(&parts(&h, "/", "1.2.3.4")),
        ds(&[&[("generic_key", "all"), ("user", "bob"), ("method", "GET")]])
    );
    // Every action skipped: no descriptor at all.
    let only_skip = actions(
        "  - actions: [{request_headers: {header_name: x-user, descriptor_key: user, skip_if_absent: true}}]\n",
    );
    assert_eq!(
        only_skip.descriptors(&parts(&none, "/", "1.2.3.4")),
        Ds::new()
    );
}

#[test]
fn masked_remote_address_like_envoy() {
    let a = actions(
        "  - actions: [{masked_remote_address: {v4_prefix_mask_len: 24, v6_prefix_mask_len: 64}}]\n",
    );
    let h = HeaderMap::new();
    assert_eq!(
        a.descriptors(&parts(&h, "/", "10.1.2.3")),
        ds(&[&[("masked_remote_address", "10.1.2.0/24")]])
    );
    assert_eq!(
        a.descriptors(&parts(&h, "/", "2001:db8:1:2:3:4:5:6")),
        ds(&[&[("masked_remote_address", "2001:db8:1:2::/64")]])
    );
    let defaults = actions("  - actions: [{masked_remote_address: {}}]\n");
    assert_eq!(
        defaults.descriptors(&parts(&h, "/", "10.1.2.3")),
        ds(&[&[("masked_remote_address", "10.1.2.3/32")]])
    );
}

#[test]
fn header_value_match_forms() {
    let a = actions(
        "  - actions:
      - header_value_match:
          descriptor_value: api_writes
          headers:
            - {name: ':method', string_match: {exact: post, ignore_case: true}}
            - {name: ':path', prefix_match: /api/}
  - actions:
      - header_value_match:
          descriptor_key: bot
          descriptor_value: 'yes'
          headers: [{name: user-agent, safe_regex_match: {regex: '.*[Bb]ot.*'}}]
  - actions:
      - header_value_match:
          descriptor_value: anonymous
          expect_match: false
          headers: [{name: authorization, present_match: true}]
  - actions:
      - header_value_match:
          descriptor_value: not-json
          headers: [{name: content-type, contains_match: json, invert_match: true}]
  - actions:
      - header_value_match:
          descriptor_value: example-host
          headers: [{name: ':authority', suffix_match: .example.com}]
",
    );
    let h = headers(&[
        ("user-agent", "GoodBot/1.0"),
        ("content-type", "application/json"),
    ]);
    let mut p = parts(&h, "/api/items?x=1", "1.2.3.4");
    p.method = Some("POST");
    assert_eq!(
        a.descriptors(&p),
        ds(&[
            &[("header_match", "api_writes")],
            &[("bot", "yes")],
            &[("header_match", "anonymous")],
            &[("header_match", "example-host")],
        ])
    );
    let h = headers(&[("authorization", "x"), ("user-agent", "curl")]);
    let mut p = parts(&h, "/other", "1.2.3.4");
    p.authority = None;
    // Absent content-type under invert_match matches, as in Envoy.
    assert_eq!(a.descriptors(&p), ds(&[&[("header_match", "not-json")]]));
}

#[test]
fn regex_is_a_full_match() {
    let a = actions(
        "  - actions: [{header_value_match: {descriptor_value: v, headers: [{name: x, string_match: {safe_regex: {regex: 'ab+'}}}]}}]\n",
    );
    let yes = headers(&[("x", "abbb")]);
    let no = headers(&[("x", "xabbb")]);
    assert_eq!(a.descriptors(&parts(&yes, "/", "1.1.1.1")).len(), 1);
    assert_eq!(a.descriptors(&parts(&no, "/", "1.1.1.1")).len(), 0);
}

#[test]
fn query_parameters_and_value_match() {
    let a = actions(
        "  - actions: [{query_parameters: {query_parameter_name: tenant, descriptor_key: tenant}}]
  - actions:
      - query_parameter_value_match:
          descriptor_value: debug
          query_parameters: [{name: debug, present_match: true}, {name: level, string_match: {prefix: v}}]
",
    );
    let h = HeaderMap::new();
    assert_eq!(
        a.descriptors(&parts(
            &h,
            "/x?tenant=a%20b&debug&level=verbose#frag",
            "1.1.1.1"
        )),
        ds(&[&[("tenant", "a b")], &[("query_match", "debug")]])
    );
    assert_eq!(
        a.descriptors(&parts(&h, "/x?tenant=", "1.1.1.1")),
        ds(&[&[("tenant", "")]])
    );
    assert_eq!(a.descriptors(&parts(&h, "/x", "1.1.1.1")), Ds::new());
}

#[test]
fn multiple_header_values() {
    let a = actions(
        "  - actions: [{request_headers: {header_name: x-k, descriptor_key: k}}]
  - actions: [{header_value_match: {descriptor_value: both, headers: [{name: x-k, exact_match: 'a,b'}]}}]
",
    );
    let h = headers(&[("x-k", "a"), ("x-k", "b")]);
    assert_eq!(
        a.descriptors(&parts(&h, "/", "1.1.1.1")),
        ds(&[&[("k", "a")], &[("header_match", "both")]])
    );
}

#[test]
fn decoding_errors_have_positions() {
    let e = errors(
        "  - actions:
      - remote_adress: {}
      - masked_remote_address: {v4_prefix_mask_len: 33}
  - actions:
      - header_value_match: {descriptor_value: v, headers: [{name: x, safe_regex_match: {regex: 'a('}}]}
      - request_headers: {header_name: 'bad header', descriptor_key: k}
  - actions: [{request_headers: {header_name: ':scheme', descriptor_key: k}}]
  - actions: [{source_cluster: {}}]
  - actions: [{generic_key: {}}]
  - actions: []
  - {bogus: 1}
",
    );
    let joined = e.join("\n");
    for want in [
        "t.yaml:4:9: unknown action `remote_adress`",
        "t.yaml:5:53: `v4_prefix_mask_len` is too large: 33 (at most 32)",
        "t.yaml:7:97: invalid `regex` \"a(\": error: unclosed group",
        "t.yaml:8:40: `header_name` `bad header` is not a valid header name",
        "t.yaml:9:47: unknown pseudo-header `:scheme`",
        "t.yaml:10:16: action `source_cluster` does not apply",
        "t.yaml:11:29: missing required field `descriptor_value`",
        "t.yaml:12:14: `actions` must not be empty",
        "t.yaml:13:6: unknown field `bogus` in an `http` entry",
    ] {
        assert!(joined.contains(want), "missing {want:?} in\n{joined}");
    }
}

#[test]
fn a_domain_without_http_has_none() {
    let s = RuleSet::from_sources(&[("t.yaml".into(), "domain: d\n".into())]).unwrap();
    assert!(s.domain("d").unwrap().http().is_none());
}

#[test]
fn cidr_parse_and_contains() {
    let c: Cidr = "10.0.0.0/8".parse().unwrap();
    assert!(c.contains("10.9.8.7".parse().unwrap()));
    assert!(c.contains("::ffff:10.9.8.7".parse().unwrap()));
    assert!(!c.contains("11.0.0.1".parse().unwrap()));
    let one: Cidr = "127.0.0.1".parse().unwrap();
    assert_eq!(one.to_string(), "127.0.0.1/32");
    assert_eq!(
        "10.1.2.3/8".parse::<Cidr>().unwrap().to_string(),
        "10.0.0.0/8"
    );
    assert_eq!("::1/128".parse::<Cidr>().unwrap().to_string(), "::1/128");
    for bad in [
        "",
        "10.0.0.0/33",
        "::/129",
        "x/8",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "1.2.3.4/-1",
    ] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
}

fn xff(peer: &str, trusted: &[&str], h: &[(&str, &str)]) -> String {
    let trusted: Vec<Cidr> = trusted.iter().map(|t| t.parse().unwrap()).collect();
    client_address(peer.parse().unwrap(), &headers(h), &trusted).to_string()
}

#[test]
fn client_address_walks_from_the_right() {
    let proxies = ["127.0.0.1/32", "10.0.0.0/8"];
    // Untrusted peer: its own headers are ignored.
    assert_eq!(
        xff("203.0.113.9", &proxies, &[("x-forwarded-for", "1.1.1.1")]),
        "203.0.113.9"
    );
    assert_eq!(
        xff("203.0.113.9", &[], &[("x-real-ip", "1.1.1.1")]),
        "203.0.113.9"
    );
    // Trusted peer: the right-most untrusted hop; what the client wrote on the left is ignored.
    assert_eq!(
        xff(
            "127.0.0.1",
            &proxies,
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.1.1")]
        ),
        "198.51.100.7"
    );
    // Several header lines are one chain.
    assert_eq!(
        xff(
            "127.0.0.1",
            &proxies,
            &[
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-for", "198.51.100.7")
            ]
        ),
        "198.51.100.7"
    );
    // All trusted: the left-most.
    assert_eq!(
        xff(
            "127.0.0.1",
            &proxies,
            &[("x-forwarded-for", "10.0.0.5, 10.0.0.6")]
        ),
        "10.0.0.5"
    );
    // Garbage stops the walk at the last trusted hop.
    assert_eq!(
        xff(
            "127.0.0.1",
            &proxies,
            &[("x-forwarded-for", "unknown, 10.0.0.6")]
        ),
        "10.0.0.6"
    );
    // Ports and brackets.
    assert_eq!(
        xff(
            "127.0.0.1",
            &proxies,
            &[("x-forwarded-for", "[2001:db8::1]:443")]
        ),
        "2001:db8::1"
    );
    // X-Real-IP when there is no X-Forwarded-For.
    assert_eq!(
        xff("127.0.0.1", &proxies, &[("x-real-ip", "198.51.100.8")]),
        "198.51.100.8"
    );
    assert_eq!(
        xff("127.0.0.1", &proxies, &[("x-real-ip", "nonsense")]),
        "127.0.0.1"
    );
    // A dual-stack peer.
    assert_eq!(
        xff(
            "::ffff:127.0.0.1",
            &proxies,
            &[("x-forwarded-for", "198.51.100.7")]
        ),
        "198.51.100.7"
    );
}

proptest! {
    /// Whatever a client puts in X-Forwarded-For, the address its trusted proxy appends wins.
    #[test]
    fn a_client_cannot_choose_its_address(spoof in proptest::collection::vec(any::<u32>(), 0..5), client in any::<u32>()) {
        let trusted: Vec<Cidr> = vec!["127.0.0.0/8".parse().unwrap()];
        let client = IpAddr::V4(Ipv4Addr::from(client));
        prop_assume!(!trusted[0].contains(client));
        let mut chain: Vec<String> = spoof.iter().map(|a| Ipv4Addr::from(*a).to_string()).collect();
        chain.push(client.to_string());
        let h = headers(&[("x-forwarded-for", &chain.join(", "))]);
        prop_assert_eq!(client_address("127.0.0.1".parse().unwrap(), &h, &trusted), client);
    }

    /// A masked address is in its own block, and the block is the same for every address in it.
    #[test]
    fn masking(a in any::<u32>(), b in any::<u32>(), len in 0u8..=32) {
        let ca = Cidr::new(IpAddr::V4(Ipv4Addr::from(a)), len);
        prop_assert!(ca.contains(IpAddr::V4(Ipv4Addr::from(a))));
        let same = len == 0 || (a >> (32 - u32::from(len))) == (b >> (32 - u32::from(len)));
        prop_assert_eq!(ca.contains(IpAddr::V4(Ipv4Addr::from(b))), same);
        prop_assert_eq!(ca.to_string().parse::<Cidr>().unwrap(), ca);
    }

    /// One descriptor per entry that applies, in entry order; skipped headers never reorder.
    #[test]
    fn entry_order_is_preserved(present in proptest::collection::vec(any::<bool>(), 1..8), skip in any::<bool>()) {
        let mut http = String::new();
        for i in 0..present.len() {
            http.push_str(&format!(
                "  - actions: [{{request_headers: {{header_name: h{i}, descriptor_key: k{i}, skip_if_absent: {skip}}}}}, {{generic_key: {{descriptor_value: e{i}}}}}]\n"
            ));
        }
        let a = actions(&http);
        let mut h = HeaderMap::new();
        for (i, p) in present.iter().enumerate() {
            if *p {
                h.insert(http::HeaderName::from_bytes(format!("h{i}").as_bytes()).unwrap(), HeaderValue::from_static("v"));
            }
        }
        let got = a.descriptors(&parts(&h, "/", "1.1.1.1"));
        let want: Ds = present
            .iter()
            .enumerate()
            .filter(|(_, p)| **p || skip)
            .map(|(i, p)| {
                let mut d = Vec::new();
                if *p {
                    d.push((format!("k{i}"), "v".to_string()));
                }
                d.push(("generic_key".to_string(), format!("e{i}")));
                d
            })
            .collect();
        prop_assert_eq!(got, want);
    }

    /// Garbage requests never panic.
    #[test]
    fn any_request_is_safe(path in ".{0,40}", value in "[ -~]{0,20}") {
        let a = actions(
            "  - actions: [{query_parameters: {query_parameter_name: a, descriptor_key: a, skip_if_absent: true}}, {remote_address: {}}]
  - actions: [{header_value_match: {descriptor_value: v, headers: [{name: x, safe_regex_match: {regex: '.*'}}]}}]
",
        );
        let h = headers(&[("x", &value)]);
        let _ = a.descriptors(&parts(&h, &path, "1.1.1.1"));
    }
}

#[test]
fn garbage_http_sections_never_panic() {
    for http in [
        "  {a: 1}\n",
        "  - 1\n",
        "  - actions: {remote_address: {}}\n",
        "  - actions: [1, [2], {}]\n",
        "  - actions: [{remote_address: {}, generic_key: {descriptor_value: x}}]\n",
        "  - actions: [{remote_address: [1]}]\n",
        "  - actions: [{remote_address: {x: 1}}]\n",
        "  - actions: [{masked_remote_address: {v4_prefix_mask_len: -1, v6_prefix_mask_len: 129}}]\n",
        "  - actions: [{header_value_match: {descriptor_value: v, headers: []}}]\n",
        "  - actions: [{header_value_match: {descriptor_value: v, headers: [{name: x, exact_match: a, prefix_match: b}]}}]\n",
        "  - actions: [{header_value_match: {descriptor_value: v, headers: [{name: x, string_match: {}}]}}]\n",
        "  - actions: [{header_value_match: {descriptor_value: v, headers: [{name: x, string_match: {safe_regex: {regex: 'a{99999999}'}}}]}}]\n",
        "  - actions: [{query_parameter_value_match: {descriptor_value: v, query_parameters: [{string_match: {exact: a}}]}}]\n",
        "  - actions: [{request_headers: {header_name: '', descriptor_key: k}}]\n",
        "  - actions: [{generic_key: {descriptor_value: ''}}]\n",
    ] {
        let text = format!("domain: web\nhttp:\n{http}");
        let e = RuleSet::from_sources(&[("g.yaml".to_string(), text)]).expect_err(http);
        assert!(e.iter().all(|e| e.line > 0 && !e.message.is_empty()), "{e}");
    }
}
