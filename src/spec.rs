//! What every grammar of the rules files shares (Envoy's descriptors, the
//! quota service's buckets, `CheckLimit`'s policies): scalars read as text,
//! as upstream's Go structs read them; upstream's time units; and the
//! parser's reason for a [`ConfigError`](crate::config_error::ConfigError)
//! naming the file and the line.

use std::fmt;

/// A YAML scalar read as text, as upstream's Go struct fields read them:
/// `value: 123` is the string "123".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Text(pub String);

impl<'de> serde::Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Text, E> {
                Ok(Text(text.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, number: i64) -> Result<Text, E> {
                Ok(Text(number.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, number: u64) -> Result<Text, E> {
                Ok(Text(number.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, flag: bool) -> Result<Text, E> {
                Ok(Text(flag.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Text {
    /// The text, for a field that may be absent: "" when it is.
    pub(crate) fn or_empty(text: Option<&Self>) -> &str {
        text.map_or("", |Self(text)| text.as_str())
    }
}

/// A unit of envoyproxy/ratelimit. Windows are this many seconds, aligned to
/// the Unix epoch (a month is 30 days and a year 365, as upstream counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as upstream counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Case-insensitive, as upstream reads it.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Self::Second,
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        })
    }

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3600,
            Self::Day => 86_400,
            Self::Week => 604_800,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        }
    }
}

/// The YAML parser's reason alone: its message starts with "error: line L
/// column C: " (the line is reported apart) and ends with a source excerpt.
pub(crate) fn parser_reason(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message).trim();
    let without_position = first
        .strip_prefix("error: line ")
        .and_then(|rest| rest.split_once(": "))
        .map_or(first, |(_, reason)| reason);
    without_position.to_owned()
}

/// For the grammars' tests: each of `cases`, `(text, line, reason)`, fails
/// to compile (by `compile`) in `file` at that line, for a reason holding
/// those words.
#[cfg(test)]
pub(crate) fn assert_refused<T>(
    file: &str,
    cases: &[(&str, u64, &str)],
    compile: impl Fn(&str) -> Result<T, crate::config_error::ConfigError>,
) {
    for &(text, line, reason) in cases {
        let err = match compile(text) {
            Err(err) => err,
            Ok(_) => panic!("{text:?} compiled"),
        };
        let crate::config_error::ConfigError::File {
            file: at,
            line: at_line,
            reason: why,
        } = &err
        else {
            panic!("{text:?}: not a file's error: {err}");
        };
        assert_eq!((at.as_str(), *at_line), (file, line), "{text:?}: {err}");
        assert!(why.contains(reason), "{text:?}: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_of_any_type_read_as_text() {
        let texts: Vec<Text> = serde_saphyr::from_str("[429, true, -1, plain]").unwrap();
        let texts: Vec<&str> = texts.iter().map(|Text(text)| text.as_str()).collect();
        assert_eq!(texts, ["429", "true", "-1", "plain"]);
    }

    #[test]
    fn units_ignore_case() {
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::Month.seconds(), 30 * Unit::Day.seconds());
    }

    #[test]
    fn the_parser_reason_drops_the_position_and_the_excerpt() {
        let message = "error: line 3 column 9: invalid type: sequence\n 3 | key: [\n";
        assert_eq!(parser_reason(message), "invalid type: sequence");
    }
}
