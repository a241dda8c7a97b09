//! Conversions between generated protobuf types and ours that more than one
//! place needs: durations (ours are microseconds), JSON and protobuf
//! `Struct` (descriptor metadata) and envoyproxy/ratelimit's time units.
//! Each algorithm's messages are converted in `pb::algorithm`.

use std::time::Duration;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use super::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as RlsUnit;
use crate::limit::{InvalidArgument, Micros};
use crate::spec::Unit;

/// A time in microseconds as a protobuf duration, exactly.
pub fn micros_to_duration(micros: Micros) -> prost_types::Duration {
    let micros = micros.as_micros();
    prost_types::Duration {
        seconds: (micros / 1_000_000) as i64,
        nanos: ((micros % 1_000_000) * 1000) as i32,
    }
}

/// A protobuf duration that must be present and not negative; the error
/// names `field`.
pub fn required_duration(
    field: &str,
    value: Option<prost_types::Duration>,
) -> Result<Duration, InvalidArgument> {
    let value = value.ok_or_else(|| InvalidArgument::new(field, "is required"))?;
    if value.seconds < 0 || value.nanos < 0 {
        return Err(InvalidArgument::new(
            field,
            "must be positive (got a negative duration)",
        ));
    }
    if value.nanos > 999_999_999 {
        return Err(InvalidArgument::new(
            field,
            "nanos must be at most 999999999",
        ));
    }
    Ok(Duration::new(value.seconds as u64, value.nanos as u32))
}

/// Each unit beside its `RateLimitResponse.RateLimit.Unit`, whose numbers
/// a descriptor's limit override uses too (WEEK is 7 in both).
const RLS_UNITS: [(Unit, RlsUnit); 7] = [
    (Unit::Second, RlsUnit::Second),
    (Unit::Minute, RlsUnit::Minute),
    (Unit::Hour, RlsUnit::Hour),
    (Unit::Day, RlsUnit::Day),
    (Unit::Week, RlsUnit::Week),
    (Unit::Month, RlsUnit::Month),
    (Unit::Year, RlsUnit::Year),
];

impl From<Unit> for RlsUnit {
    fn from(unit: Unit) -> Self {
        RLS_UNITS
            .iter()
            .find(|(ours, _)| *ours == unit)
            .map_or(Self::Unknown, |(_, theirs)| *theirs)
    }
}

/// The unit a protobuf unit number names; `None` for UNKNOWN and numbers
/// no unit has.
pub fn unit_from_proto(number: i32) -> Option<Unit> {
    let theirs = RlsUnit::try_from(number).ok()?;
    RLS_UNITS
        .iter()
        .find(|(_, rls)| *rls == theirs)
        .map(|(ours, _)| *ours)
}

/// A YAML/JSON map as a protobuf Struct; `None` if `json` is not a map.
pub fn json_to_struct(json: &serde_json::Value) -> Option<Struct> {
    let serde_json::Value::Object(map) = json else {
        return None;
    };
    Some(Struct {
        fields: map
            .iter()
            .map(|(key, value)| (key.clone(), json_to_value(value)))
            .collect(),
    })
}

/// A protobuf Struct as JSON (how xDS configuration reaches the file
/// parser).
pub fn struct_to_json(value: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        value
            .fields
            .iter()
            .map(|(key, value)| (key.clone(), value_to_json(value)))
            .collect(),
    )
}

fn value_to_json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(flag)) => serde_json::Value::Bool(*flag),
        Some(Kind::NumberValue(number)) => serde_json::Number::from_f64(*number)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(text)) => serde_json::Value::String(text.clone()),
        Some(Kind::ListValue(list)) => {
            serde_json::Value::Array(list.values.iter().map(value_to_json).collect())
        }
        Some(Kind::StructValue(inner)) => struct_to_json(inner),
    }
}

fn json_to_value(json: &serde_json::Value) -> Value {
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(flag) => Kind::BoolValue(*flag),
        serde_json::Value::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(text) => Kind::StringValue(text.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_to_struct(json).unwrap_or_default()),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_convert_exactly() {
        let duration = micros_to_duration(Micros::from_micros(1_500_001));
        assert_eq!((duration.seconds, duration.nanos), (1, 500_001_000));
    }

    #[test]
    fn units_map_both_ways_and_unknown_is_none() {
        for (unit, rls) in RLS_UNITS {
            assert_eq!(RlsUnit::from(unit), rls);
            assert_eq!(unit_from_proto(rls as i32), Some(unit));
        }
        assert_eq!(unit_from_proto(7), Some(Unit::Week));
        assert_eq!(unit_from_proto(0), None);
        assert_eq!(unit_from_proto(8), None);
    }

    #[test]
    fn durations_must_be_present_and_not_negative() {
        let at = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
        assert_eq!(
            required_duration("window", at(1, 5)),
            Ok(Duration::new(1, 5))
        );
        for bad in [None, at(-1, 0), at(0, -1), at(0, 1_000_000_000)] {
            assert_eq!(
                required_duration("window", bad).unwrap_err().field,
                "window"
            );
        }
    }
}
