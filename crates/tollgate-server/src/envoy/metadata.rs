//! envoyproxy/ratelimit's `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`), built from the
//! decoded request, so that gRPC and `/json` return the same.

use crate::model::{CheckRequest, CheckResponse, Code};
use tollgate_proto::pb::google::protobuf::value::Kind as PbKind;
use tollgate_proto::pb::google::protobuf::{
    ListValue as PbListValue, Struct as PbStruct, Value as PbValue,
};

/// The envoy profile's `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`), as envoyproxy/ratelimit
/// builds it: the request's `domain`, its `descriptors` (`entries` as `key=value` strings, the
/// `limit` override, `hitsAddend`), the request's `hitsAddend` when not 0, and `metadata`: the
/// rule `metadata` of every descriptor that passed (OK, not unlimited), merged in request order
/// (a key already present is kept; maps present in both are merged). Built from the decoded
/// request, so gRPC and `/json` (see [`pb_struct_json`]) return the same.
pub(crate) fn dynamic_metadata(
    req: &CheckRequest,
    resp: &CheckResponse,
    rules: &tollgate_core::rules::RuleSet,
) -> PbStruct {
    use std::collections::HashMap;
    let string = |s: String| PbValue {
        kind: Some(PbKind::StringValue(s)),
    };
    let number = |n: f64| PbValue {
        kind: Some(PbKind::NumberValue(n)),
    };
    let list = |values: Vec<PbValue>| PbValue {
        kind: Some(PbKind::ListValue(PbListValue { values })),
    };
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|(k, v)| string(format!("{k}={v}")))
                .collect();
            fields.insert("entries".to_owned(), list(entries));
            if let Some(l) = &d.limit {
                fields.insert(
                    "limit".to_owned(),
                    string(format!(
                        "requests_per_unit:{} unit:{}",
                        l.requests_per_unit,
                        crate::grpc::pb_unit(l.unit).as_str_name()
                    )),
                );
            }
            if let Some(h) = d.hits {
                fields.insert("hitsAddend".to_owned(), number(h as f64));
            }
            PbValue {
                kind: Some(PbKind::StructValue(PbStruct { fields })),
            }
        })
        .collect();
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), string(req.domain.clone()));
    fields.insert("descriptors".to_owned(), list(descriptors));
    if let Some(h) = req.hits.filter(|&h| h != 0) {
        fields.insert("hitsAddend".to_owned(), number(h as f64));
    }
    let mut passed = PbStruct::default();
    for (d, status) in req.descriptors.iter().zip(&resp.statuses) {
        if status.code != Code::Ok || status.unlimited || d.limit.is_some() {
            continue;
        }
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let tollgate_core::rules::Resolution::Limited { limit, .. } =
            rules.resolve(&req.domain, &entries)
        {
            if let Some(meta) = &limit.metadata {
                merge_metadata(&mut passed, meta);
            }
        }
    }
    if !passed.fields.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            PbValue {
                kind: Some(PbKind::StructValue(passed)),
            },
        );
    }
    PbStruct { fields }
}

/// A `google.protobuf.Struct` as protojson writes it (envoyproxy/ratelimit's `/json` marshals
/// its response so): a plain JSON object; numbers that are whole (below 2^53) without a
/// fraction, as Go prints them. protojson refuses NaN and infinities; they become `null`.
pub fn pb_struct_json(s: &PbStruct) -> serde_json::Value {
    fn value(v: &PbValue) -> serde_json::Value {
        use serde_json::Value as J;
        match &v.kind {
            None | Some(PbKind::NullValue(_)) => J::Null,
            Some(PbKind::BoolValue(b)) => J::Bool(*b),
            Some(PbKind::NumberValue(n))
                if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 =>
            {
                J::from(*n as i64)
            }
            Some(PbKind::NumberValue(n)) => {
                serde_json::Number::from_f64(*n).map_or(J::Null, J::Number)
            }
            Some(PbKind::StringValue(s)) => J::String(s.clone()),
            Some(PbKind::ListValue(l)) => J::Array(l.values.iter().map(value).collect()),
            Some(PbKind::StructValue(s)) => pb_struct_json(s),
        }
    }
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

/// Merge a rule's `metadata` into `dest` as envoyproxy/ratelimit does: new keys are added, a
/// key present in both is kept unless both values are maps, which are merged.
fn merge_metadata(
    dest: &mut PbStruct,
    src: &std::collections::BTreeMap<String, tollgate_core::rules::MetaValue>,
) {
    for (k, v) in src {
        match (dest.fields.get_mut(k), v) {
            (
                Some(PbValue {
                    kind: Some(PbKind::StructValue(d)),
                }),
                tollgate_core::rules::MetaValue::Map(m),
            ) => merge_metadata(d, m),
            (Some(_), _) => {}
            (None, v) => {
                dest.fields.insert(k.clone(), meta_value(v));
            }
        }
    }
}

/// A metadata value as a `google.protobuf.Value`.
fn meta_value(v: &tollgate_core::rules::MetaValue) -> PbValue {
    use tollgate_core::rules::MetaValue;
    let kind = match v {
        MetaValue::Null => PbKind::NullValue(0),
        MetaValue::Bool(b) => PbKind::BoolValue(*b),
        MetaValue::Number(n) => PbKind::NumberValue(*n),
        MetaValue::String(s) => PbKind::StringValue(s.clone()),
        MetaValue::List(l) => PbKind::ListValue(PbListValue {
            values: l.iter().map(meta_value).collect(),
        }),
        MetaValue::Map(m) => PbKind::StructValue(PbStruct {
            fields: m.iter().map(|(k, v)| (k.clone(), meta_value(v))).collect(),
        }),
    };
    PbValue { kind: Some(kind) }
}
