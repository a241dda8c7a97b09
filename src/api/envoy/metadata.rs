//! The dynamic metadata envoyproxy/ratelimit attaches to a response with
//! RESPONSE_DYNAMIC_METADATA: the domain, each descriptor's entries (as
//! `key=value`), limit override and hits, the request's hits, and the
//! merged `metadata` of the rules whose descriptors passed. Envoy puts it
//! under the rate limit filter's namespace for routes and logs to read.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

fn string(text: impl Into<String>) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.into())),
    }
}

fn number(value: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(value)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

/// The response's metadata for `request`; `passed` holds the metadata of
/// each rule whose descriptor passed, in descriptor order.
pub(crate) fn response_metadata<'a>(
    request: &RateLimitRequest,
    passed: impl Iterator<Item = &'a Struct>,
) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_owned(), string(&request.domain));
    fields.insert(
        "descriptors".to_owned(),
        list(request.descriptors.iter().map(descriptor_value).collect()),
    );
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number(f64::from(request.hits_addend)),
        );
    }
    let mut merged = Struct::default();
    for metadata in passed {
        merge(&mut merged, metadata);
    }
    if !merged.fields.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            Value {
                kind: Some(Kind::StructValue(merged)),
            },
        );
    }
    Struct { fields }
}

fn descriptor_value(descriptor: &RateLimitDescriptor) -> Value {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "entries".to_owned(),
        list(
            descriptor
                .entries
                .iter()
                .map(|entry| string(format!("{}={}", entry.key, entry.value)))
                .collect(),
        ),
    );
    if let Some(limit) = &descriptor.limit {
        // Upstream writes the override in protobuf text form.
        fields.insert(
            "limit".to_owned(),
            string(format!(
                "requests_per_unit:{} unit:{}",
                limit.requests_per_unit,
                unit_name(limit.unit)
            )),
        );
    }
    if let Some(hits) = descriptor.hits_addend {
        fields.insert("hitsAddend".to_owned(), number(hits as f64));
    }
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

/// A unit number's name (as upstream writes it, WEEK = 7), or UNKNOWN.
fn unit_name(unit: i32) -> &'static str {
    Unit::try_from(unit).map_or("UNKNOWN", |unit| unit.as_str_name())
}

/// Adds `source`'s fields to `target` as upstream merges: a key already
/// there keeps its value, except that two maps merge recursively.
fn merge(target: &mut Struct, source: &Struct) {
    for (key, value) in &source.fields {
        match target.fields.get_mut(key) {
            Some(Value {
                kind: Some(Kind::StructValue(existing)),
            }) => {
                if let Some(Kind::StructValue(incoming)) = &value.kind {
                    merge(existing, incoming);
                }
            }
            Some(_) => {}
            None => {
                target.fields.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::convert::json_to_struct;

    #[test]
    fn maps_merge_recursively_and_first_values_stay() {
        let first = json_to_struct(&serde_json::json!({"a": 1, "m": {"x": "one"}})).unwrap();
        let second =
            json_to_struct(&serde_json::json!({"a": 2, "b": true, "m": {"y": "two"}})).unwrap();
        let mut merged = Struct::default();
        merge(&mut merged, &first);
        merge(&mut merged, &second);
        assert_eq!(merged.fields["a"].kind, Some(Kind::NumberValue(1.0)));
        assert_eq!(merged.fields["b"].kind, Some(Kind::BoolValue(true)));
        let Some(Kind::StructValue(m)) = &merged.fields["m"].kind else {
            panic!("m is a map");
        };
        assert_eq!(m.fields.len(), 2);
        assert!(json_to_struct(&serde_json::json!([1])).is_none());
    }

    #[test]
    fn unit_names_are_upstreams() {
        let names: Vec<&str> = (0..=8).map(unit_name).collect();
        assert_eq!(
            names,
            [
                "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK", "UNKNOWN"
            ]
        );
    }
}
