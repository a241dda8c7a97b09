//! The parts every algorithm's parameters are made of, validated once: a
//! window is whole milliseconds within bounds, a limit is non-zero, so the
//! algorithms never re-check. Each algorithm's own parameters type is its
//! module's, under `algorithm`.

use std::time::Duration;

use super::{InvalidArgument, MAX_WINDOW, Micros};

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

/// A limit or capacity: 1 to `max`; the error names `field`.
pub fn quantity(field: &str, value: u64, max: u64) -> Result<u64, InvalidArgument> {
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
    fn nested_errors_name_the_full_field_path() {
        let err = LimitPerWindow::<10>::new(0, Duration::from_secs(1))
            .unwrap_err()
            .within("fixed_window");
        assert_eq!(err.to_string(), "fixed_window.limit: must be at least 1");
    }
}
