//! Each algorithm in `CheckLimit`'s protobuf, both ways: the message that
//! states it, how that message becomes the validated algorithm (and a
//! face's rate becomes that message), and the window a client is told of.
//! The one place the gRPC layer knows the algorithms; [`algorithms!`] lists
//! them once, for both oneofs that carry one (`CheckLimitRequest.algorithm`
//! and `Limit.algorithm`).

use super::convert::required_duration;
use super::ratelimitd::v1 as pb;
use super::ratelimitd::v1::check_limit_request::Algorithm as OneLimit;
use super::ratelimitd::v1::limit::Algorithm as OfSeveral;
use crate::algorithm::registry::{Kind, Rate, WindowStart};
use crate::algorithm::{Algorithm, TokenBucket};
use crate::limit::InvalidArgument;

/// One algorithm's protobuf message.
trait Message: Sized {
    /// The algorithm it states.
    const KIND: Kind;

    /// The algorithm it states, its parameters checked; the error names
    /// the field within the message.
    fn build(self) -> Result<Algorithm, InvalidArgument>;

    /// `rate` as this message states it (the parameters [`Kind::build`]
    /// reads from it, in the message's fields).
    fn stated(rate: Rate) -> Self;

    /// The window a client is told of, in whole seconds rounded up.
    fn window_seconds(&self) -> Option<u64>;
}

/// `rate` as a window's limit: `per` beyond protobuf's range is sent unset.
fn window_of(rate: Rate) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(rate.per).ok()
}

/// `limit` per `window`, a fixed window starting at the key's first request.
fn windowed(kind: Kind, limit: u64, window: Option<prost_types::Duration>) -> BuildResult {
    let per = required_duration("window", window)?;
    kind.build(Rate::new(limit, per), WindowStart::FirstRequest)
}

type BuildResult = Result<Algorithm, InvalidArgument>;

/// A duration in whole seconds, rounded up (never early).
fn seconds(duration: Option<&prost_types::Duration>) -> Option<u64> {
    let duration = duration?;
    let whole = u64::try_from(duration.seconds).ok()?;
    Some(whole + u64::from(duration.nanos > 0))
}

/// The messages that state a limit per window and nothing else: alike but
/// for the algorithm they name.
macro_rules! windowed_message {
    ($($message:ident => $kind:ident),* $(,)?) => {$(
        impl Message for pb::$message {
            const KIND: Kind = Kind::$kind;
            fn build(self) -> BuildResult {
                windowed(Self::KIND, self.limit, self.window)
            }
            fn stated(rate: Rate) -> Self {
                Self {
                    limit: rate.limit,
                    window: window_of(rate),
                }
            }
            fn window_seconds(&self) -> Option<u64> {
                seconds(self.window.as_ref())
            }
        }
    )*};
}

windowed_message! {
    FixedWindow => FixedWindow,
    SlidingWindow => SlidingWindow,
    SlidingWindowCounter => SlidingWindowCounter,
}

impl Message for pb::TokenBucket {
    const KIND: Kind = Kind::TokenBucket;
    /// Stated as capacity and refill rate, not as a rate per period.
    fn build(self) -> BuildResult {
        TokenBucket::new(self.capacity, self.refill_per_second).map(Algorithm::TokenBucket)
    }
    fn stated(rate: Rate) -> Self {
        Self {
            capacity: rate.burst.unwrap_or(rate.limit),
            refill_per_second: rate.limit as f64 / rate.per.as_secs_f64(),
        }
    }
    /// The time an empty bucket takes to fill: the window of its capacity.
    fn window_seconds(&self) -> Option<u64> {
        let seconds = (self.capacity as f64 / self.refill_per_second).ceil();
        // Validation keeps it within 366 days; a cast of anything else is
        // not a window.
        (seconds.is_finite() && seconds >= 0.0 && seconds < u64::MAX as f64)
            .then_some(seconds as u64)
    }
}

impl Message for pb::Gcra {
    const KIND: Kind = Kind::Gcra;
    fn build(self) -> BuildResult {
        let period = required_duration("period", self.period)?;
        let rate = Rate {
            limit: self.rate,
            per: period,
            burst: Some(self.burst),
        };
        Self::KIND.build(rate, WindowStart::FirstRequest)
    }
    fn stated(rate: Rate) -> Self {
        Self {
            rate: rate.limit,
            period: window_of(rate),
            burst: rate.burst.unwrap_or(rate.limit),
        }
    }
    fn window_seconds(&self) -> Option<u64> {
        seconds(self.period.as_ref())
    }
}

/// The conversions over every algorithm's message: each variant of both
/// oneofs, and of [`Kind`], is named as its message is.
macro_rules! algorithms {
    ($($variant:ident),* $(,)?) => {
        /// A `CheckLimit` algorithm and its parameters, each checked; the
        /// error names the field within the algorithm's message
        /// (`fixed_window.window`). A fixed window starts at the key's
        /// first request.
        pub fn from_proto(algorithm: OneLimit) -> Result<Algorithm, InvalidArgument> {
            let (kind, built) = match algorithm {
                $(OneLimit::$variant(p) => (pb::$variant::KIND, p.build()),)*
            };
            built.map_err(|err| err.within(kind.name()))
        }

        /// `rate` under `kind` as `CheckLimit`'s one-limit form states it
        /// (the parameters [`Kind::build`] reads from it, in the message's
        /// fields). `per` beyond protobuf's range is sent unset.
        pub fn to_proto(kind: Kind, rate: Rate) -> OneLimit {
            match kind {
                $(Kind::$variant => OneLimit::$variant(pb::$variant::stated(rate)),)*
            }
        }

        /// The window, in whole seconds rounded up, that a stated algorithm
        /// tells a client of (`RateLimit-Policy`'s `w`): its window or
        /// period, or a token bucket's time to fill.
        pub trait StatedWindow {
            /// The window in whole seconds, if the message states one.
            fn window_seconds(&self) -> Option<u64>;
        }

        impl StatedWindow for OneLimit {
            fn window_seconds(&self) -> Option<u64> {
                match self {
                    $(Self::$variant(p) => p.window_seconds(),)*
                }
            }
        }

        impl StatedWindow for OfSeveral {
            fn window_seconds(&self) -> Option<u64> {
                match self {
                    $(Self::$variant(p) => p.window_seconds(),)*
                }
            }
        }

        // The same messages under both oneofs, so each converts to the
        // other.
        impl From<OneLimit> for OfSeveral {
            fn from(algorithm: OneLimit) -> Self {
                match algorithm {
                    $(OneLimit::$variant(p) => Self::$variant(p),)*
                }
            }
        }

        impl From<OfSeveral> for OneLimit {
            fn from(algorithm: OfSeveral) -> Self {
                match algorithm {
                    $(OfSeveral::$variant(p) => Self::$variant(p),)*
                }
            }
        }
    };
}

algorithms!(
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    Gcra,
    SlidingWindowCounter
);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_proto_form_builds_back_to_the_same_algorithm() {
        let rate = Rate::new(7, Duration::from_secs(3));
        for kind in Kind::ALL {
            let built = kind.build(rate, WindowStart::FirstRequest).unwrap();
            let stated = to_proto(kind, rate);
            let sent = from_proto(stated).unwrap();
            assert_eq!(sent, built, "{}", kind.name());
            assert_eq!(sent.name(), kind.name());
            let of_several = OfSeveral::from(stated);
            assert_eq!(OneLimit::from(of_several), stated);
            assert_eq!(of_several.window_seconds(), stated.window_seconds());
            assert_eq!(stated.window_seconds(), Some(3), "{}", kind.name());
        }
    }

    #[test]
    fn proto_errors_name_the_algorithm_and_its_field() {
        let missing = OneLimit::Gcra(pb::Gcra {
            rate: 1,
            period: None,
            burst: 1,
        });
        assert_eq!(from_proto(missing).unwrap_err().field, "gcra.period");
        let zero = OneLimit::SlidingWindowCounter(pb::SlidingWindowCounter {
            limit: 0,
            window: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        });
        assert_eq!(
            from_proto(zero).unwrap_err().to_string(),
            "sliding_window_counter.limit: must be at least 1"
        );
        let bucket = OneLimit::TokenBucket(pb::TokenBucket {
            capacity: 1,
            refill_per_second: f64::NAN,
        });
        assert_eq!(
            from_proto(bucket).unwrap_err().field,
            "token_bucket.refill_per_second"
        );
    }

    #[test]
    fn a_window_is_told_in_whole_seconds_rounded_up() {
        let window = |seconds, nanos| pb::FixedWindow {
            limit: 1,
            window: Some(prost_types::Duration { seconds, nanos }),
        };
        assert_eq!(window(10, 0).window_seconds(), Some(10));
        assert_eq!(window(10, 1).window_seconds(), Some(11));
        let bucket = pb::TokenBucket {
            capacity: 10,
            refill_per_second: 4.0,
        };
        assert_eq!(bucket.window_seconds(), Some(3));
    }
}
