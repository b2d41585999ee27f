//! The hand-written RLS v3 messages (`tollgate-proto`) against Envoy's own definition of them:
//! the descriptor set protoc made from Envoy's `rls.proto`, which gRPC reflection serves.
//! Every field of a fully populated request and response is encoded, and the bytes are walked
//! with the descriptors: each field number must exist in Envoy's message with a matching wire
//! type, and every field Envoy defines must have been written once. A wrong tag, a wrong type
//! or a missing field fails here, before any client sees it.

use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};
use std::collections::{BTreeSet, HashMap};
use tollgate_proto::pb::envoy::config::core::v3::HeaderValue;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use tollgate_proto::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, Quota, RateLimit,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_proto::pb::google::protobuf::value::Kind;
use tollgate_proto::pb::google::protobuf::{
    Duration, ListValue, Struct, Timestamp, UInt64Value, Value,
};
use tollgate_server::grpc::RLS_DESCRIPTOR_SET;

/// Every message of the descriptor set by full name (`.pkg.Outer.Inner`).
fn messages() -> HashMap<String, DescriptorProto> {
    fn add(prefix: &str, m: &DescriptorProto, out: &mut HashMap<String, DescriptorProto>) {
        let name = format!("{prefix}.{}", m.name());
        for nested in &m.nested_type {
            add(&name, nested, out);
        }
        out.insert(name, m.clone());
    }
    let set = FileDescriptorSet::decode(RLS_DESCRIPTOR_SET).expect("the descriptor set decodes");
    let mut out = HashMap::new();
    for file in &set.file {
        for m in &file.message_type {
            add(&format!(".{}", file.package()), m, &mut out);
        }
    }
    out
}

/// Walk `bytes` as message `name`, recording each (message, field number) seen.
fn walk(
    name: &str,
    mut bytes: &[u8],
    all: &HashMap<String, DescriptorProto>,
    seen: &mut BTreeSet<(String, i32)>,
) {
    let message = all
        .get(name)
        .unwrap_or_else(|| panic!("{name} is not in Envoy's descriptors"));
    while !bytes.is_empty() {
        let (number, wire) = decode_key(&mut bytes).expect("a field key");
        let field = message
            .field
            .iter()
            .find(|f| f.number() == number as i32)
            .unwrap_or_else(|| panic!("{name} has no field {number} in Envoy's descriptors"));
        let expected = match field.r#type() {
            Type::Double | Type::Fixed64 | Type::Sfixed64 => WireType::SixtyFourBit,
            Type::Float | Type::Fixed32 | Type::Sfixed32 => WireType::ThirtyTwoBit,
            Type::String | Type::Bytes | Type::Message => WireType::LengthDelimited,
            _ => WireType::Varint,
        };
        assert_eq!(
            wire,
            expected,
            "{name}.{} has the wrong wire type",
            field.name()
        );
        seen.insert((name.to_owned(), number as i32));
        match wire {
            WireType::Varint => {
                decode_varint(&mut bytes).unwrap();
            }
            WireType::SixtyFourBit => bytes = &bytes[8..],
            WireType::ThirtyTwoBit => bytes = &bytes[4..],
            WireType::LengthDelimited => {
                let len = decode_varint(&mut bytes).unwrap() as usize;
                let (inner, rest) = bytes.split_at(len);
                if field.r#type() == Type::Message {
                    walk(field.type_name(), inner, all, seen);
                }
                bytes = rest;
            }
            other => panic!("{name}: unexpected wire type {other:?}"),
        }
    }
}

/// Every field of every message walked was written at least once.
fn assert_every_field_written(
    all: &HashMap<String, DescriptorProto>,
    seen: &BTreeSet<(String, i32)>,
) {
    let walked: BTreeSet<&String> = seen.iter().map(|(m, _)| m).collect();
    for name in walked {
        for field in &all[name].field {
            assert!(
                seen.contains(&(name.clone(), field.number())),
                "{name}.{} (field {}) is never written: tollgate-proto lacks it or has it under another number",
                field.name(),
                field.number()
            );
        }
    }
}

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

#[test]
fn the_request_matches_envoys_definition_field_for_field() {
    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: 5,
                unit: 2,
            }),
            hits_addend: Some(UInt64Value { value: 3 }),
        }],
        hits_addend: 2,
    };
    let all = messages();
    let mut seen = BTreeSet::new();
    walk(
        ".envoy.service.ratelimit.v3.RateLimitRequest",
        &request.encode_to_vec(),
        &all,
        &mut seen,
    );
    assert_every_field_written(&all, &seen);
}

#[test]
fn the_response_matches_envoys_definition_field_for_field() {
    let header = HeaderValue {
        key: "k".into(),
        value: "v".into(),
        raw_value: b"r".to_vec(),
    };
    let quota = Quota {
        requests: 1,
        id: "q".into(),
        expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
            seconds: 1,
            nanos: 1,
        })),
    };
    let list = ListValue {
        values: vec![
            value(Kind::NullValue(0)),
            value(Kind::NumberValue(1.5)),
            value(Kind::StringValue("s".into())),
            value(Kind::BoolValue(true)),
        ],
    };
    let inner = Struct {
        fields: [("l".to_owned(), value(Kind::ListValue(list)))].into(),
    };
    let response = RateLimitResponse {
        overall_code: 2,
        statuses: vec![DescriptorStatus {
            code: 2,
            current_limit: Some(RateLimit {
                name: "n".into(),
                requests_per_unit: 10,
                unit: 2,
            }),
            limit_remaining: 1,
            duration_until_reset: Some(Duration {
                seconds: 1,
                nanos: 1,
            }),
            quota: Some(quota.clone()),
        }],
        response_headers_to_add: vec![header.clone()],
        request_headers_to_add: vec![header],
        raw_body: b"b".to_vec(),
        dynamic_metadata: Some(Struct {
            fields: [("s".to_owned(), value(Kind::StructValue(inner)))].into(),
        }),
        quota: Some(quota),
    };
    let all = messages();
    let mut seen = BTreeSet::new();
    walk(
        ".envoy.service.ratelimit.v3.RateLimitResponse",
        &response.encode_to_vec(),
        &all,
        &mut seen,
    );
    assert_every_field_written(&all, &seen);
}
