//! What every group of command-line options shares: the parsers of their
//! values (durations, byte sizes, `key=value` lists), the types that keep
//! secrets out of logs, and the readers of the files flags name (their
//! errors [`ConfigError`]s naming the flag).
//!
//! Each subsystem owns its group of options (a `clap::Args` struct beside
//! it) and turns it into its settings once, at start; [`crate::config`]
//! only gathers the groups. The groups import this module; it imports
//! none of them.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use crate::config_error::ConfigError;

/// The PEM file `path` that `flag` names, read whole.
pub fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|source| ConfigError::Unreadable {
        flag,
        path: path.to_owned(),
        source,
    })
}

/// A PEM file (CA certificates) that `flag` may name, read whole.
pub fn read_optional_pem(
    flag: &'static str,
    path: Option<&Path>,
) -> Result<Option<Vec<u8>>, ConfigError> {
    path.map(|path| read_pem(flag, path)).transpose()
}

/// A certificate chain and its private key, as PEM.
pub type PemIdentity = (Vec<u8>, Vec<u8>);

/// A certificate and its key, named by two flags (`[cert flag, key flag]`)
/// that clap makes go together, read whole.
pub fn read_identity(
    flags: [&'static str; 2],
    [cert, key]: [Option<&Path>; 2],
) -> Result<Option<PemIdentity>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((read_pem(flags[0], cert)?, read_pem(flags[1], key)?))),
        _ => Ok(None),
    }
}

/// A value that does not parse, with why: what the parsers below return
/// (clap prints it after the flag and the value).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(String);

impl BadValue {
    fn new(why: impl Into<String>) -> Self {
        Self(why.into())
    }
}

/// A duration such as `250ms`, `10s` or `1m 30s`, more than zero.
pub fn positive_duration(text: &str) -> Result<Duration, BadValue> {
    let duration = humantime::parse_duration(text).map_err(|err| BadValue::new(err.to_string()))?;
    if duration.is_zero() {
        return Err(BadValue::new("must be more than zero"));
    }
    Ok(duration)
}

/// A duration of whole seconds, at least one.
pub fn whole_seconds(text: &str) -> Result<Duration, BadValue> {
    let duration = positive_duration(text)?;
    if duration.subsec_nanos() != 0 {
        return Err(BadValue::new(
            "must be whole seconds, at least 1s (Envoy ignores fractions)",
        ));
    }
    Ok(duration)
}

/// A duration where `0s` means "off".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationOrOff(Option<Duration>);

impl DurationOrOff {
    /// The duration, or `None` for off.
    pub fn get(self) -> Option<Duration> {
        self.0
    }
}

/// Parses a [`DurationOrOff`].
pub fn duration_or_off(text: &str) -> Result<DurationOrOff, BadValue> {
    let duration = humantime::parse_duration(text).map_err(|err| BadValue::new(err.to_string()))?;
    Ok(DurationOrOff((!duration.is_zero()).then_some(duration)))
}

/// A socket address, or none (an empty value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressOrOff(pub Option<std::net::SocketAddr>);

/// Parses an [`AddressOrOff`]: `host:port` (an IP address and a port), or
/// empty for none.
pub fn address_or_off(text: &str) -> Result<AddressOrOff, BadValue> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(AddressOrOff(None));
    }
    text.parse()
        .map(|address| AddressOrOff(Some(address)))
        .map_err(|_| {
            BadValue::new("not an address (IP:port, such as 127.0.0.1:8080), nor empty for none")
        })
}

/// A count of things, at least one (and at most `u32::MAX`, so that it
/// fits every platform's `usize`).
pub fn count() -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::TypedValueParser as _;
    clap::value_parser!(u32).range(1..).map(|n| n as usize)
}

/// An enumerated flag's value as the command line writes it
/// (`fail-closed`), for messages that name it.
pub fn value_name(value: &impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |value| value.get_name().to_owned())
}

/// A size such as `256MiB`, `1GB` or `65536`, in bytes; 0 allowed (off).
pub fn byte_size(text: &str) -> Result<usize, BadValue> {
    let size: bytesize::ByteSize = text.parse().map_err(BadValue::new)?;
    usize::try_from(size.as_u64()).map_err(|_| BadValue::new("too large"))
}

/// A size as [`byte_size`] reads it, at least 64 KiB (below that a store's
/// 64 shards hold almost nothing each).
pub fn memory_budget(text: &str) -> Result<usize, BadValue> {
    let bytes = byte_size(text)?;
    if bytes < 64 << 10 {
        return Err(BadValue::new("must be at least 64KiB"));
    }
    Ok(bytes)
}

/// `key=value` (or `key:value`) pairs separated by commas; empty for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyValues(pub Vec<(String, String)>);

/// The parser of [`KeyValues`] split at `separator`.
pub fn key_values(separator: char) -> impl Fn(&str) -> Result<KeyValues, BadValue> + Clone {
    move |text: &str| {
        text.split(',')
            .map(str::trim)
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                pair.split_once(separator)
                    .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
                    .filter(|(key, _)| !key.is_empty())
                    .ok_or_else(|| BadValue::new(format!("{pair:?} is not key{separator}value")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(KeyValues)
    }
}

/// Pairs whose values are secret (headers carry tokens): its `Debug` names
/// only the keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(pub KeyValues);

impl fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// The parser of [`SecretValues`] split at `separator`.
pub fn secret_values(separator: char) -> impl Fn(&str) -> Result<SecretValues, BadValue> + Clone {
    let pairs = key_values(separator);
    move |text: &str| pairs(text).map(SecretValues)
}

/// A secret (a password): its `Debug` is `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for using it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Self(secret)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_sizes_and_pairs_parse_or_say_why() {
        assert_eq!(
            positive_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert!(positive_duration("0s").is_err());
        assert!(whole_seconds("1500ms").is_err());
        assert_eq!(whole_seconds("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(duration_or_off("0s").unwrap().get(), None);
        assert_eq!(
            duration_or_off("5m").unwrap().get(),
            Some(Duration::from_secs(300))
        );
        assert_eq!(byte_size("0").unwrap(), 0);
        assert_eq!(byte_size("16MiB").unwrap(), 16 << 20);
        assert!(memory_budget("1KiB").is_err());
        assert_eq!(
            key_values('=')("a=1, b = 2").unwrap().0,
            [("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        let err = key_values(':')("nocolon").unwrap_err();
        assert!(err.to_string().contains("is not key:value"), "{err}");
        let headers = secret_values(':')("authorization:Bearer s3cret").unwrap();
        assert!(!format!("{headers:?}").contains("s3cret"));
        assert_eq!(format!("{:?}", Secret::from("pw".to_owned())), "***");
    }
}
