//! The validated model of a rate-limit question and its answer that every
//! algorithm shares (keys, names, costs, windows, decisions), free of
//! protobuf and of any store; each algorithm's parameters, and the
//! question that names one, are `algorithm`'s.
//!
//! Every constructor here checks its rule once; code past the API layer holds
//! only values that passed (a window is whole milliseconds within bounds, a
//! limit is non-zero), so the algorithms never re-check. A rule that fails
//! is an [`InvalidArgument`] naming the field.

use std::fmt;
use std::time::Duration;

mod decision;
mod micros;
mod parameters;

pub use decision::{Decision, RetryAfter};
pub use micros::Micros;
pub use parameters::{LimitPerWindow, Window, quantity};

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
    /// Named from an Envoy descriptor as envoyproxy/ratelimit names its
    /// counters, window start and all ([`CallerKey::upstream`]).
    Upstream,
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

    /// A counter named as envoyproxy/ratelimit names it, after the key
    /// prefix (`domain_key_value_..._windowstart`): stored under exactly
    /// that name, so that upstream's instances count on the same key. Kept
    /// whole, however long (the request bounds cap it), as upstream keeps
    /// it.
    pub fn upstream(name: String) -> Self {
        Self {
            text: name,
            origin: KeyOrigin::Upstream,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_but_take_any_text() {
        assert!(CallerKey::new(String::new()).is_err());
        assert!(CallerKey::new("x".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(CallerKey::new("x".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(CallerKey::new("}{\n\0'\"; redis.call('FLUSHALL')".into()).is_ok());
    }
}
