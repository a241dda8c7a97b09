//! Each algorithm's parameters, validated once: a window is whole
//! milliseconds within bounds, a limit is non-zero, a rate is finite and
//! positive, so the algorithms never re-check. How a face's limit becomes
//! these parameters, and each algorithm's name, is the algorithm
//! registry's (`algorithm::registry`), which builds on these.

use std::time::Duration;

use super::{InvalidArgument, MAX_QUANTITY, MAX_SLIDING_WINDOW_LIMIT, MAX_WINDOW, Micros};

/// A window length: whole milliseconds, from 1 ms to [`MAX_WINDOW`].
/// Whole milliseconds because Redis expiry (`PEXPIRE`) counts in them; a
/// sub-millisecond part would be silently rounded, so it is refused instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window(Duration);

impl Window {
    /// A window of `window`, if it keeps the rules above.
    pub fn new(window: Duration) -> Result<Self, InvalidArgument> {
        if window.is_zero() {
            return Err(InvalidArgument::new("window", "must be positive"));
        }
        if window > MAX_WINDOW {
            return Err(InvalidArgument::new(
                "window",
                format!(
                    "must be at most {} (366 days)",
                    humantime::format_duration(MAX_WINDOW)
                ),
            ));
        }
        if !window.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(InvalidArgument::new(
                "window",
                "must be a whole number of milliseconds",
            ));
        }
        Ok(Self(window))
    }

    /// The window in whole milliseconds.
    pub fn as_millis(self) -> u64 {
        // At most 366 days, so this fits easily.
        self.0.as_millis() as u64
    }

    /// The window's length.
    pub fn as_micros(self) -> Micros {
        // At most 366 days, so this is exact.
        Micros::from_duration(self.0)
    }
}

/// A limit or capacity: 1 to `max`.
fn quantity(field: &str, value: u64, max: u64) -> Result<u64, InvalidArgument> {
    if value == 0 {
        return Err(InvalidArgument::new(field, "must be at least 1"));
    }
    if value > max {
        return Err(InvalidArgument::new(
            field,
            format!("must be at most {max} (got {value})"),
        ));
    }
    Ok(value)
}

/// At most `limit` units per window.
///
/// Each parameter is checked once, when the value is made; the error names
/// the field and the rule.
///
/// ```
/// use std::time::Duration;
///
/// use ratelimitd::limit::{FixedWindow, FixedWindowMode};
///
/// let per_minute = FixedWindow::new(100, Duration::from_secs(60)).unwrap();
/// assert_eq!(per_minute.limit(), 100);
/// assert_eq!(per_minute.window().as_millis(), 60_000);
/// assert_eq!(per_minute.mode(), FixedWindowMode::Anchored);
///
/// let refused = FixedWindow::new(0, Duration::from_secs(60)).unwrap_err();
/// assert_eq!(refused.to_string(), "limit: must be at least 1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: Window,
    mode: FixedWindowMode,
}

/// Where a fixed window starts, and how its count is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedWindowMode {
    /// The window starts at the key's first spending request
    /// (`CheckLimit`).
    Anchored,
    /// Windows are the multiples of the window's length since the Unix
    /// epoch, as envoyproxy/ratelimit counts them; the key keeps the number
    /// of the window it counts.
    Aligned,
    /// Aligned, and kept as envoyproxy/ratelimit keeps it: a plain counter
    /// in a key that its caller names with the window's start, living one
    /// window from its last count (`--envoy-key-layout upstream`).
    AlignedByName,
}

impl FixedWindow {
    /// A window anchored at the key's first spending request.
    pub fn new(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            limit: quantity("limit", limit, MAX_QUANTITY)?,
            window: Window::new(window)?,
            mode: FixedWindowMode::Anchored,
        })
    }

    /// A window aligned to multiples of its length since the Unix epoch.
    pub fn aligned(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            mode: FixedWindowMode::Aligned,
            ..Self::new(limit, window)?
        })
    }

    /// The same limit, aligned, counted in a plain counter that the caller
    /// names with each window's start, as envoyproxy/ratelimit counts.
    pub fn aligned_by_name(self) -> Self {
        Self {
            mode: FixedWindowMode::AlignedByName,
            ..self
        }
    }

    /// Units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Where the window starts, and how the count is kept.
    pub fn mode(&self) -> FixedWindowMode {
        self.mode
    }

    /// Windows aligned to multiples of their length since the Unix epoch.
    pub fn is_aligned(&self) -> bool {
        self.mode != FixedWindowMode::Anchored
    }
}

/// At most `limit` units within any span of `window`: the sliding log,
/// whose log holds one entry per unit spent (hence its lower bound).
pub type SlidingWindow = LimitPerWindow<MAX_SLIDING_WINDOW_LIMIT>;

/// At most about `limit` units per `window`, estimated from two aligned
/// fixed-window counts (the sliding window counter).
pub type SlidingWindowCounter = LimitPerWindow<MAX_QUANTITY>;

/// `limit` units, 1 to `MAX`, per `window`: the parameters of the two
/// sliding algorithms, which differ in their bound only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitPerWindow<const MAX: u64> {
    limit: u64,
    window: Window,
}

impl<const MAX: u64> LimitPerWindow<MAX> {
    /// At most `limit` units per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            limit: quantity("limit", limit, MAX)?,
            window: Window::new(window)?,
        })
    }

    /// Units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Window {
        self.window
    }
}

/// A bucket of `capacity` tokens, starting full, refilled continuously.
///
/// ```
/// use ratelimitd::limit::TokenBucket;
///
/// // Bursts of 10, 2 a second on average.
/// let bucket = TokenBucket::new(10, 2.0).unwrap();
/// assert_eq!(bucket.capacity(), 10);
///
/// let refused = TokenBucket::new(10, f64::NAN).unwrap_err();
/// assert_eq!(refused.field, "refill_per_second");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    capacity: u64,
    refill_per_second: f64,
}

impl TokenBucket {
    /// `capacity` tokens refilled at `refill_per_second`.
    pub fn new(capacity: u64, refill_per_second: f64) -> Result<Self, InvalidArgument> {
        let capacity = quantity("capacity", capacity, MAX_QUANTITY)?;
        if !refill_per_second.is_finite() {
            return Err(InvalidArgument::new(
                "refill_per_second",
                "must be a finite number",
            ));
        }
        if refill_per_second <= 0.0 {
            return Err(InvalidArgument::new(
                "refill_per_second",
                format!("must be positive (got {refill_per_second})"),
            ));
        }
        // The key lives until the bucket is full again; bound that like a window.
        let seconds_to_fill = capacity as f64 / refill_per_second;
        if seconds_to_fill > MAX_WINDOW.as_secs_f64() {
            return Err(InvalidArgument::new(
                "refill_per_second",
                format!(
                    "is too slow: refilling {capacity} tokens would take {seconds_to_fill:.0} s, \
                     more than the maximum of 366 days"
                ),
            ));
        }
        Ok(Self {
            capacity,
            refill_per_second,
        })
    }

    /// Tokens when full.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Tokens per second: finite and positive.
    pub fn refill_per_second(&self) -> f64 {
        self.refill_per_second
    }
}

/// GCRA (the generic cell rate algorithm): `rate` requests per `period`
/// sustained, one every `interval` microseconds, and up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    burst: u64,
    /// The period divided by the rate, rounded up to a whole microsecond,
    /// so the sustained rate is never above the one asked for.
    interval: Micros,
}

impl Gcra {
    /// `rate` requests per `period` sustained, up to `burst` at once.
    pub fn new(rate: u64, period: Duration, burst: u64) -> Result<Self, InvalidArgument> {
        let rate = quantity("rate", rate, MAX_QUANTITY)?;
        let period = Window::new(period).map_err(|err| InvalidArgument::new("period", err.rule))?;
        let burst = quantity("burst", burst, MAX_QUANTITY)?;
        let period_us = period.as_micros().as_micros();
        if rate > period_us {
            return Err(InvalidArgument::new(
                "rate",
                format!("must be at most one per microsecond of period ({period_us})"),
            ));
        }
        let interval = period_us.div_ceil(rate);
        // The key lives until a full burst is earned back; bound that like a
        // window (this also keeps every instant below 2^53, exact in Lua).
        let tolerance = u128::from(burst) * u128::from(interval);
        if tolerance > MAX_WINDOW.as_micros() {
            return Err(InvalidArgument::new(
                "burst",
                format!(
                    "is too large for the rate: earning back {burst} requests would take \
                     {} s, more than the maximum of 366 days",
                    tolerance / 1_000_000
                ),
            ));
        }
        Ok(Self {
            burst,
            interval: Micros::from_micros(interval),
        })
    }

    /// Requests that may pass at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The time between requests at the sustained rate: at least 1 µs.
    pub fn interval(&self) -> Micros {
        self.interval
    }
}

/// The algorithm and its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// A fixed window.
    FixedWindow(FixedWindow),
    /// A sliding window (log).
    SlidingWindow(SlidingWindow),
    /// A token bucket.
    TokenBucket(TokenBucket),
    /// GCRA.
    Gcra(Gcra),
    /// A sliding window counter.
    SlidingWindowCounter(SlidingWindowCounter),
}

impl Algorithm {
    /// The limit or capacity in force.
    pub fn limit(&self) -> u64 {
        match self {
            Self::FixedWindow(p) => p.limit(),
            Self::SlidingWindow(p) => p.limit(),
            Self::TokenBucket(p) => p.capacity(),
            Self::Gcra(p) => p.burst(),
            Self::SlidingWindowCounter(p) => p.limit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_must_be_whole_positive_milliseconds_within_a_year() {
        assert!(Window::new(Duration::from_millis(1)).is_ok());
        assert!(Window::new(MAX_WINDOW).is_ok());
        assert_eq!(
            Window::new(Duration::ZERO).unwrap_err().rule,
            "must be positive"
        );
        assert!(Window::new(Duration::from_micros(1500)).is_err());
        assert!(Window::new(MAX_WINDOW + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn token_bucket_refuses_rates_that_are_not_positive_finite_numbers() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = TokenBucket::new(10, rate).unwrap_err();
            assert_eq!(err.field, "refill_per_second", "rate {rate}");
        }
        assert!(TokenBucket::new(10, 0.5).is_ok());
        // 10 tokens at 1e-9/s would take centuries to refill.
        assert!(TokenBucket::new(10, 1e-9).is_err());
    }

    #[test]
    fn the_sliding_log_is_bounded_lower_than_the_counter() {
        let hour = Duration::from_secs(3600);
        let above = MAX_SLIDING_WINDOW_LIMIT + 1;
        assert_eq!(SlidingWindow::new(above, hour).unwrap_err().field, "limit");
        assert_eq!(
            SlidingWindowCounter::new(above, hour).unwrap().limit(),
            above
        );
    }

    #[test]
    fn nested_errors_name_the_full_field_path() {
        let err = FixedWindow::new(0, Duration::from_secs(1))
            .unwrap_err()
            .within("fixed_window");
        assert_eq!(err.to_string(), "fixed_window.limit: must be at least 1");
    }
}
