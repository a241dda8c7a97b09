//! Time inside the decision core, in whole microseconds: an instant (since
//! the Unix epoch) or a span. A type of its own, so that a count of units
//! cannot be taken for a time, nor a time for one.

use std::ops::{Add, AddAssign, Div, Mul, Sub};
use std::time::Duration;

/// Microseconds: an instant since the Unix epoch, or a span. Redis `TIME`
/// gives microseconds, and 2^53 µs (the exact range of a Lua number) is 285
/// years, so the same arithmetic runs in Lua and in Rust without rounding.
///
/// Adding and subtracting times, a span times a count, and a span divided
/// by a span (how many whole spans fit: a count) are operators, with the
/// integer semantics the Lua twins have; everything else is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Micros(u64);

impl Micros {
    /// No time at all: the epoch, or an empty span.
    pub const ZERO: Self = Self(0);

    /// The longest time there is: what "never" sorts as.
    pub const MAX: Self = Self(u64::MAX);

    /// `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// `millis` whole milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis * 1000)
    }

    /// `secs` whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs * 1_000_000)
    }

    /// `duration`, to the microsecond below; the longest time there is
    /// when it does not fit (584 554 years).
    pub fn from_duration(duration: Duration) -> Self {
        Self(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
    }

    /// The time as a `Duration`.
    pub const fn as_duration(self) -> Duration {
        Duration::from_micros(self.0)
    }

    /// The number of microseconds.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// The whole milliseconds in it (rounded down): the millisecond an
    /// instant falls in, as Redis keeps expiry.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1000
    }

    /// The whole seconds in it (rounded down).
    pub const fn as_secs(self) -> u64 {
        self.0 / 1_000_000
    }

    /// The milliseconds a span takes, rounded up: the time to live that
    /// keeps a key through all of it (`PEXPIRE` counts milliseconds).
    pub const fn as_millis_rounded_up(self) -> u64 {
        self.0.div_ceil(1000)
    }

    /// `self - other`, or zero when `other` is later or longer.
    pub const fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }
}

impl Add for Micros {
    type Output = Self;

    /// An instant plus a span, or two spans.
    fn add(self, other: Self) -> Self {
        Self(self.0 + other.0)
    }
}

impl AddAssign for Micros {
    fn add_assign(&mut self, other: Self) {
        self.0 += other.0;
    }
}

impl Sub for Micros {
    type Output = Self;

    /// The span between two instants, or an instant a span earlier.
    fn sub(self, other: Self) -> Self {
        Self(self.0 - other.0)
    }
}

impl Mul<u64> for Micros {
    type Output = Self;

    /// `times` spans of this length, end to end.
    fn mul(self, times: u64) -> Self {
        Self(self.0 * times)
    }
}

impl Div for Micros {
    type Output = u64;

    /// How many whole spans of `span` fit (rounded down): since the epoch,
    /// the number of the aligned window an instant falls in.
    fn div(self, span: Self) -> u64 {
        self.0 / span.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_round_down_for_instants_and_up_for_spans() {
        let time = Micros::from_micros(2_000_001);
        assert_eq!(time.as_millis(), 2000);
        assert_eq!(time.as_millis_rounded_up(), 2001);
        assert_eq!(Micros::from_millis(3).as_millis_rounded_up(), 3);
        assert_eq!(Micros::ZERO.as_millis_rounded_up(), 0);
    }

    #[test]
    fn durations_convert_both_ways_and_saturate() {
        let span = Duration::from_nanos(1_500_999);
        assert_eq!(Micros::from_duration(span), Micros::from_micros(1500));
        assert_eq!(
            Micros::from_micros(1500).as_duration(),
            Duration::from_micros(1500)
        );
        assert_eq!(Micros::from_duration(Duration::MAX), Micros::MAX);
    }

    #[test]
    fn spans_count_whole_spans_and_stop_at_zero() {
        let window = Micros::from_millis(10);
        assert_eq!(Micros::from_micros(25_000) / window, 2);
        assert_eq!(window * 3, Micros::from_millis(30));
        assert_eq!(window.saturating_sub(Micros::MAX), Micros::ZERO);
    }
}
