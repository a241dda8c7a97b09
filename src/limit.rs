//! The validated model of a rate-limit question and its answer, free of
//! protobuf and of any store.
//!
//! Every constructor here checks its rule once; code past the API layer holds
//! only values that passed (a window is whole milliseconds within bounds, a
//! limit is non-zero, a rate is finite and positive), so the algorithms never
//! re-check. A rule that fails is an [`InvalidArgument`] naming the field.

use std::fmt;
use std::time::Duration;

/// Time inside the decision core: microseconds. Redis `TIME` gives
/// microseconds, and 2^53 µs (the exact range of a Lua number) is 285 years,
/// so the same arithmetic runs in Lua and in Rust without rounding.
pub type Micros = u64;

/// Longest caller key, in bytes. Keys longer than this are almost always a
/// bug in the caller (a whole header or body used as a key), and each key is
/// stored in Redis at this length.
pub const MAX_KEY_BYTES: usize = 1024;

/// How much of an over-long Envoy key is kept readable before its digest.
pub const ENVOY_DIGEST_PREFIX_BYTES: usize = 128;

/// Largest limit, capacity or cost: 10^15 keeps every count exact in a Lua
/// number (a double, exact to 2^53 ≈ 9·10^15) even after adding a cost.
pub const MAX_QUANTITY: u64 = 1_000_000_000_000_000;

/// Largest sliding-window limit: the log holds one sorted-set entry per unit
/// spent, so memory and the work of one decision grow with the limit.
pub const MAX_SLIDING_WINDOW_LIMIT: u64 = 100_000;

/// Longest window, and longest time a token bucket may take to refill: one
/// leap year, so that no key lives longer than that.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// A request that breaks a rule, before anything is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidArgument {
    /// The field's path in the request, e.g. `fixed_window.window`.
    pub field: String,
    /// The rule it breaks, e.g. `must be at least 1 ms`.
    pub rule: String,
}

impl InvalidArgument {
    /// `field` breaks `rule`.
    pub fn new(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            rule: rule.into(),
        }
    }

    /// The same error for a field nested one level deeper, e.g. `limit`
    /// inside `fixed_window`.
    pub fn within(self, parent: &str) -> Self {
        Self {
            field: format!("{parent}.{}", self.field),
            rule: self.rule,
        }
    }
}

impl fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for InvalidArgument {}

/// Who is limited: a caller's key from `CheckLimit`, or a key ratelimitd
/// composed from an Envoy descriptor. Any characters are allowed; they travel
/// to Redis as a key argument, never as script text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerKey {
    text: String,
    origin: KeyOrigin,
}

/// Where a key came from. Keys of different origins never name the same
/// storage key, whatever their text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// A `CheckLimit` caller's key.
    CheckLimit,
    /// Composed from an Envoy rate-limit descriptor.
    Envoy,
    /// Composed from an Envoy descriptor too long to keep as it is: its
    /// prefix and digest ([`CallerKey::envoy`]).
    EnvoyDigest,
    /// A named limit of a `CheckLimit` with several: `<name>:<key>`
    /// ([`CallerKey::named`]).
    Named,
    /// A limit of a named policy: `<policy>/<limit>:<key>`, or
    /// `<policy>/<limit>` for one counter shared by every key
    /// ([`CallerKey::policy`]).
    Policy,
}

impl CallerKey {
    /// A `CheckLimit` caller's key: non-empty, at most [`MAX_KEY_BYTES`].
    pub fn new(key: String) -> Result<Self, InvalidArgument> {
        if key.is_empty() {
            return Err(InvalidArgument::new("key", "must not be empty"));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(InvalidArgument::new(
                "key",
                format!("must be at most {MAX_KEY_BYTES} bytes (got {})", key.len()),
            ));
        }
        Ok(Self {
            text: key,
            origin: KeyOrigin::CheckLimit,
        })
    }

    /// A key composed from an Envoy descriptor. One of at most
    /// [`MAX_KEY_BYTES`] is kept as it is (as upstream names its counters);
    /// a longer one (descriptor values come from request headers, up to
    /// `--max-descriptor-entry-bytes` each) is kept as its first
    /// [`ENVOY_DIGEST_PREFIX_BYTES`] bytes, for people reading Redis, and
    /// the SHA-256 of all of it: never a truncation, so two long keys
    /// never share a counter, and no key takes more than about 200 bytes
    /// of it. Digested keys have an origin of their own, so no short key
    /// can name one.
    pub fn envoy(composed: String) -> Self {
        if composed.len() <= MAX_KEY_BYTES {
            return Self {
                text: composed,
                origin: KeyOrigin::Envoy,
            };
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, composed.as_bytes());
        let mut cut = ENVOY_DIGEST_PREFIX_BYTES;
        while !composed.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut text = String::with_capacity(cut + 1 + 2 * digest.as_ref().len());
        text.push_str(&composed[..cut]);
        text.push('#');
        for byte in digest.as_ref() {
            text.push_str(&format!("{byte:02x}"));
        }
        Self {
            text,
            origin: KeyOrigin::EnvoyDigest,
        }
    }

    /// The key of a named limit: its own counter, apart from the key's
    /// unnamed limits and from every other name. `name` passed
    /// [`check_name`], so it holds no `:` and the text splits one way only.
    pub fn named(name: &str, key: &CallerKey) -> Self {
        Self {
            text: format!("{name}:{}", key.text),
            origin: KeyOrigin::Named,
        }
    }

    /// The key of limit `limit` of policy `policy`: for `key`, or with
    /// `None`, the one counter every key of the policy shares. Both names
    /// passed [`check_name`] (no `:` and no `/`).
    pub fn policy(policy: &str, limit: &str, key: Option<&CallerKey>) -> Self {
        let text = match key {
            Some(key) => format!("{policy}/{limit}:{}", key.text),
            None => format!("{policy}/{limit}"),
        };
        Self {
            text,
            origin: KeyOrigin::Policy,
        }
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Where the key came from.
    pub fn origin(&self) -> KeyOrigin {
        self.origin
    }
}

/// Longest limit or policy name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// A limit's or a policy's name: 1 to [`MAX_NAME_BYTES`] bytes of ASCII
/// letters, digits, `_`, `-` and `.`. Names become part of storage keys
/// and metric labels, so they are kept to characters that read the same
/// everywhere.
pub fn check_name(field: &str, name: &str) -> Result<(), InvalidArgument> {
    if name.is_empty() {
        return Err(InvalidArgument::new(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(InvalidArgument::new(
            field,
            format!(
                "must be at most {MAX_NAME_BYTES} bytes (got {})",
                name.len()
            ),
        ));
    }
    if let Some(odd) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(InvalidArgument::new(
            field,
            format!(
                "may hold only ASCII letters, digits, '_', '-' and '.' (found {:?})",
                odd
            ),
        ));
    }
    Ok(())
}

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

    /// The window in microseconds.
    pub fn as_micros(self) -> Micros {
        self.0.as_micros() as Micros
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: Window,
    /// `false`: the window starts at the key's first spending request
    /// (`CheckLimit`). `true`: windows are the multiples of `window` since
    /// the Unix epoch, as envoyproxy/ratelimit counts them.
    aligned: bool,
}

impl FixedWindow {
    /// A window anchored at the key's first spending request.
    pub fn new(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            limit: quantity("limit", limit, MAX_QUANTITY)?,
            window: Window::new(window)?,
            aligned: false,
        })
    }

    /// A window aligned to multiples of its length since the Unix epoch.
    pub fn aligned(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            aligned: true,
            ..Self::new(limit, window)?
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

    /// Windows aligned to multiples of their length since the Unix epoch.
    pub fn is_aligned(&self) -> bool {
        self.aligned
    }
}

/// At most `limit` units within any span of `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u64,
    window: Window,
}

impl SlidingWindow {
    /// At most `limit` units in any span of `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            limit: quantity("limit", limit, MAX_SLIDING_WINDOW_LIMIT)?,
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

/// At most about `limit` units per `window`, estimated from two aligned
/// fixed-window counts (the sliding window counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    limit: u64,
    window: Window,
}

impl SlidingWindowCounter {
    /// About `limit` units per sliding `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            limit: quantity("limit", limit, MAX_QUANTITY)?,
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
        let period_us = period.as_micros();
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
        Ok(Self { burst, interval })
    }

    /// Requests that may pass at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Microseconds between requests at the sustained rate: at least 1.
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

    /// A short stable name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::FixedWindow(_) => "fixed_window",
            Self::SlidingWindow(_) => "sliding_window",
            Self::TokenBucket(_) => "token_bucket",
            Self::Gcra(_) => "gcra",
            Self::SlidingWindowCounter(_) => "sliding_window_counter",
        }
    }
}

/// Units a request spends: 0 (look only) to [`MAX_QUANTITY`].
pub fn cost(cost: Option<u64>) -> Result<u64, InvalidArgument> {
    let cost = cost.unwrap_or(1);
    if cost > MAX_QUANTITY {
        return Err(InvalidArgument::new(
            "cost",
            format!("must be at most {MAX_QUANTITY} (got {cost})"),
        ));
    }
    Ok(cost)
}

/// One validated question: may `key` spend `cost` under `algorithm` now?
#[derive(Debug, Clone, PartialEq)]
pub struct LimitRequest {
    /// Who is limited.
    pub key: CallerKey,
    /// Under which limit.
    pub algorithm: Algorithm,
    /// Units to spend (0 looks without spending).
    pub cost: u64,
    /// Decided and reported, but never the reason a group of limits is
    /// denied (Envoy's shadow mode). Always `false` for `CheckLimit`.
    pub shadow: bool,
}

/// When a denied request could be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// After this long (zero when allowed).
    After(Micros),
    /// Never: the cost exceeds the limit or capacity itself.
    Never,
}

/// What to answer when the store cannot decide in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Fail with UNAVAILABLE: the caller decides.
    FailClosed,
    /// Allow, marked degraded.
    FailOpen,
    /// Decide on this instance's embedded store, marked degraded.
    Local,
}

/// The answer. Being over the limit is a decision, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the cost may be spent now (it was, unless a look or denied).
    pub allowed: bool,
    /// The limit or capacity in force.
    pub limit: u64,
    /// Units left after this decision.
    pub remaining: u64,
    /// Until the key is back to its full quota.
    pub reset_after: Micros,
    /// When the cost could pass.
    pub retry_after: RetryAfter,
    /// Decided by the failure policy, without the shared store.
    pub degraded: bool,
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
    fn keys_are_bounded_but_take_any_text() {
        assert!(CallerKey::new(String::new()).is_err());
        assert!(CallerKey::new("x".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(CallerKey::new("x".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(CallerKey::new("}{\n\0'\"; redis.call('FLUSHALL')".into()).is_ok());
    }

    #[test]
    fn nested_errors_name_the_full_field_path() {
        let err = FixedWindow::new(0, Duration::from_secs(1))
            .unwrap_err()
            .within("fixed_window");
        assert_eq!(err.to_string(), "fixed_window.limit: must be at least 1");
    }
}
