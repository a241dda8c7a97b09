//! Conversions between generated protobuf types and ours that more than one
//! place needs: durations (ours are microseconds), and the two oneofs that
//! carry one algorithm.

use std::time::Duration;

use super::ratelimitd::v1::check_limit_request::Algorithm as OneLimit;
use super::ratelimitd::v1::limit::Algorithm as OfSeveral;
use crate::limit::{InvalidArgument, Micros};

/// Microseconds as a protobuf duration, exactly.
pub fn micros_to_duration(micros: Micros) -> prost_types::Duration {
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

// One algorithm's messages, under the one-limit form's oneof
// (`CheckLimitRequest.algorithm`) and under a `Limit`'s: the same
// messages, so each converts to the other.

impl From<OneLimit> for OfSeveral {
    fn from(algorithm: OneLimit) -> Self {
        match algorithm {
            OneLimit::FixedWindow(p) => Self::FixedWindow(p),
            OneLimit::SlidingWindow(p) => Self::SlidingWindow(p),
            OneLimit::TokenBucket(p) => Self::TokenBucket(p),
            OneLimit::Gcra(p) => Self::Gcra(p),
            OneLimit::SlidingWindowCounter(p) => Self::SlidingWindowCounter(p),
        }
    }
}

impl From<OfSeveral> for OneLimit {
    fn from(algorithm: OfSeveral) -> Self {
        match algorithm {
            OfSeveral::FixedWindow(p) => Self::FixedWindow(p),
            OfSeveral::SlidingWindow(p) => Self::SlidingWindow(p),
            OfSeveral::TokenBucket(p) => Self::TokenBucket(p),
            OfSeveral::Gcra(p) => Self::Gcra(p),
            OfSeveral::SlidingWindowCounter(p) => Self::SlidingWindowCounter(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_convert_exactly() {
        let duration = micros_to_duration(1_500_001);
        assert_eq!((duration.seconds, duration.nanos), (1, 500_001_000));
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
