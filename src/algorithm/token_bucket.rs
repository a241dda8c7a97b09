//! Token bucket: `capacity` tokens, starting full, refilled continuously at
//! `refill_per_second`; a request spends `cost` tokens. Allows bursts up to
//! the capacity and a steady rate after. The Lua side is `token_bucket.lua`;
//! this file holds its in-memory twin, which does the same floating-point
//! steps in the same order, so both give the same answers.

use super::parameters::{Mark, Parameters, Rate, ScriptValue, Shown, WindowStart};
use super::{Spend, written_for};
use crate::limit::{
    Decision, InvalidArgument, MAX_QUANTITY, MAX_WINDOW, Micros, RetryAfter, quantity,
};
use crate::store::MemoryChange;

/// A bucket of `capacity` tokens, starting full, refilled continuously.
///
/// ```
/// use ratelimitd::algorithm::TokenBucket;
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

/// The in-memory state of one key.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    tokens: f64,
    stamp: Micros,
}

impl State {
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            tokens: self.tokens,
            stamp: self.stamp,
        }
    }
}

/// A bucket as plain values, the same in both twins.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Tokens (fractional) as of `stamp`.
    pub tokens: f64,
    /// When `tokens` was true.
    pub stamp: Micros,
}

/// The in-memory twin of `token_bucket.lua`. A missing state is a full
/// bucket. With `spend` false it decides the same and changes nothing.
pub fn decide(
    params: &TokenBucket,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: bool,
) -> (Decision, MemoryChange) {
    let capacity = params.capacity() as f64;
    let rate = params.refill_per_second();
    let (mut tokens, mut stamp) = (capacity, now);
    if let Some(s) = state {
        tokens = s.tokens;
        stamp = s.stamp;
        if now > stamp {
            tokens += (now - stamp).as_micros() as f64 * rate / 1_000_000.0;
            stamp = now;
        }
        tokens = tokens.min(capacity);
    }
    let micros_to_refill =
        |amount: f64| Micros::from_micros((amount / rate * 1_000_000.0).ceil() as u64);
    let ahead = stamp - now;
    let denied = |retry_after| {
        let reset_after = ahead + micros_to_refill(capacity - tokens);
        Decision::denied(
            params.capacity(),
            tokens.floor() as u64,
            reset_after,
            retry_after,
        )
    };
    if cost > params.capacity() {
        return (denied(RetryAfter::Never), MemoryChange::None);
    }
    let cost_tokens = cost as f64;
    if cost_tokens > tokens {
        let retry_after = ahead + micros_to_refill(cost_tokens - tokens);
        return (denied(RetryAfter::After(retry_after)), MemoryChange::None);
    }
    tokens -= cost_tokens;
    let reset_after = ahead + micros_to_refill(capacity - tokens);
    let decision = Decision::allowed(params.capacity(), tokens.floor() as u64, reset_after);
    if cost == 0 || !spend {
        return (decision, MemoryChange::None);
    }
    *state = Some(State { tokens, stamp });
    (decision, written_for(now, reset_after))
}

/// What the lists made from the registry need of its parameters.
impl Parameters for TokenBucket {
    type State = State;
    /// `burst` tokens (default `limit`), refilled at `limit / per`.
    fn from_rate(rate: Rate, _start: WindowStart) -> Result<Self, InvalidArgument> {
        let Rate { limit, per, burst } = rate;
        if per.is_zero() {
            return Err(InvalidArgument::new("window", "must be positive"));
        }
        let refill_per_second = limit as f64 / per.as_secs_f64();
        Self::new(burst.unwrap_or(limit), refill_per_second)
    }
    fn limit(&self) -> u64 {
        self.capacity()
    }
    fn decide(
        &self,
        state: &mut Option<State>,
        now: Micros,
        cost: u64,
        spend: Spend,
    ) -> (Decision, MemoryChange) {
        decide(self, state, now, cost, spend != Spend::Dry)
    }
    fn script_values(&self) -> [ScriptValue; 3] {
        [
            ScriptValue::Whole(self.capacity()),
            ScriptValue::Rate(self.refill_per_second()),
            ScriptValue::Whole(0),
        ]
    }
    /// Tokens are simply given back.
    fn mark(&self) -> Mark {
        Mark::Unmarked
    }
    fn spend_mark(&self, _state: &State) -> u64 {
        0
    }
    /// As `token_bucket_refund`: `cost` tokens back, never above the
    /// capacity (its refill to now is left to the next decision, as the
    /// script leaves it).
    fn give_back(&self, state: &mut State, cost: u64, _mark: u64) -> bool {
        state.tokens = (state.tokens + cost as f64).min(self.capacity() as f64);
        true
    }
    fn shown(&self) -> Shown {
        Shown {
            refill_per_second: Some(self.refill_per_second()),
            ..Shown::default()
        }
    }
    /// The time to fill from empty.
    fn span(&self) -> Micros {
        Micros::from_micros((self.capacity() as f64 / self.refill_per_second() * 1e6) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time of `micros` microseconds.
    const fn us(micros: u64) -> Micros {
        Micros::from_micros(micros)
    }

    #[test]
    fn starts_full_and_refills_at_fractional_rates() {
        let p = TokenBucket::new(2, 0.5).unwrap();
        let mut state = None;
        assert!(decide(&p, &mut state, Micros::ZERO, 1, true).0.is_allowed());
        let (d, _) = decide(&p, &mut state, Micros::ZERO, 1, true);
        assert!(d.is_allowed());
        assert_eq!(d.reset_after(), us(4_000_000));
        let (d, _) = decide(&p, &mut state, us(1_000_000), 1, true);
        assert!(!d.is_allowed());
        // Half a token is back after 1 s at 0.5/s; the other half takes 1 s.
        assert_eq!(d.retry_after(), RetryAfter::After(us(1_000_000)));
        assert!(
            decide(&p, &mut state, us(2_000_000), 1, true)
                .0
                .is_allowed()
        );
    }

    #[test]
    fn never_refills_above_capacity() {
        let p = TokenBucket::new(3, 100.0).unwrap();
        let mut state = None;
        decide(&p, &mut state, Micros::ZERO, 3, true);
        let (d, _) = decide(&p, &mut state, us(3_600_000_000), 0, true);
        assert_eq!(d.remaining(), 3);
        assert_eq!(d.reset_after(), Micros::ZERO);
    }

    #[test]
    fn a_cost_above_capacity_is_never_allowed() {
        let p = TokenBucket::new(3, 1.0).unwrap();
        let mut state = None;
        let (d, change) = decide(&p, &mut state, Micros::ZERO, 4, true);
        assert_eq!(d.retry_after(), RetryAfter::Never);
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
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
}
