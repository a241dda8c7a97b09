//! The configuration in force, flag by flag, as the admin API shows it:
//! each flag's value as given (or its default), and where it came from.
//! Secrets are hidden by the type their flag parses into, so a new secret
//! flag is hidden as soon as it is one of these types: a [`Secret`] or
//! [`SecretValues`] shows as `***`, a Redis URL with its credentials
//! replaced ([`redacted_url`]). Paths (TLS keys among them) show as given:
//! they name files, and hold no key material.

use std::any::TypeId;
use std::fmt;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use serde::Serialize;

use super::upstream::Origins;
use crate::options::{Secret, SecretValues};
use crate::store::{RedisUrl, redacted_url};

/// Every flag's value, in `--help`'s order.
#[derive(Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Effective(Vec<EffectiveFlag>);

/// One flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectiveFlag {
    /// Its long name, without `--`.
    pub flag: String,
    /// Its value as given (one string, or a list for a flag that takes
    /// several), secrets hidden; `null` when unset.
    pub value: serde_json::Value,
    /// `command line`, `environment (NAME)`, `default`, `envoyproxy/ratelimit
    /// (NAMES)` for one upstream's variables set or defaulted, or `unset`.
    pub source: String,
}

/// What is shown of a secret.
const HIDDEN: &str = "***";

impl Effective {
    /// Every flag of `command` with its value in `matches` (the parse the
    /// configuration was read from); `origins` says which flags
    /// upstream's variables set.
    pub fn from_matches(command: &Command, matches: &ArgMatches, origins: &Origins) -> Self {
        let flags = command
            .get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    return None;
                }
                let kind = arg.get_value_parser().type_id();
                let shown = |raw: &std::ffi::OsStr| {
                    let text = raw.to_string_lossy();
                    if kind == TypeId::of::<Secret>() || kind == TypeId::of::<SecretValues>() {
                        HIDDEN.to_owned()
                    } else if kind == TypeId::of::<RedisUrl>() {
                        redacted_url(&text)
                    } else {
                        text.into_owned()
                    }
                };
                let raw: Vec<String> = matches
                    .try_get_raw(id)
                    .ok()
                    .flatten()
                    .map(|values| values.map(shown).collect())
                    .unwrap_or_default();
                let many = matches!(arg.get_action(), clap::ArgAction::Append)
                    || arg.get_value_delimiter().is_some();
                let value = match (raw.as_slice(), many) {
                    ([], _) => serde_json::Value::Null,
                    ([one], false) => serde_json::Value::String(one.clone()),
                    (all, _) => all.iter().cloned().map(serde_json::Value::String).collect(),
                };
                let source = match (origins.of(id), matches.value_source(id)) {
                    (Some(variables), _) => format!("envoyproxy/ratelimit ({variables})"),
                    (None, Some(ValueSource::CommandLine)) => "command line".to_owned(),
                    (None, Some(ValueSource::EnvVariable)) => match arg.get_env() {
                        Some(name) => format!("environment ({})", name.to_string_lossy()),
                        None => "environment".to_owned(),
                    },
                    (None, Some(ValueSource::DefaultValue)) => "default".to_owned(),
                    (None, _) => "unset".to_owned(),
                };
                Some(EffectiveFlag {
                    flag: long.to_owned(),
                    value,
                    source,
                })
            })
            .collect();
        Self(flags)
    }

    /// The flags.
    pub fn flags(&self) -> &[EffectiveFlag] {
        &self.0
    }
}

/// Only how many: the configuration is logged whole beside it.
impl fmt::Debug for Effective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Effective({} flags)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn secrets_are_hidden_by_their_type_and_sources_are_named() {
        let args = [
            "ratelimitd",
            "--redis-url",
            "redis://app:pw1@127.0.0.1:1/0",
            "--redis-sentinel-auth",
            "pw2",
            "--xds-headers",
            "authorization:Bearer pw3",
            "--admin-token",
            "pw4-an-admin-token-long-enough",
            "--max-request-bytes",
            "2048",
        ];
        let environment = Default::default();
        let (config, _) = Config::load_from(&args, &environment).expect("parses");
        let shown = serde_json::to_string(&config.effective).expect("JSON");
        for secret in ["pw1", "pw2", "pw3", "pw4"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        let flag = |name: &str| {
            config
                .effective
                .flags()
                .iter()
                .find(|flag| flag.flag == name)
                .unwrap_or_else(|| panic!("--{name} in {shown}"))
                .clone()
        };
        assert_eq!(
            flag("redis-url").value,
            serde_json::json!(["redis://app:***@127.0.0.1:1/0"])
        );
        assert_eq!(flag("admin-token").value, "***");
        assert_eq!(flag("max-request-bytes").value, "2048");
        assert_eq!(flag("max-request-bytes").source, "command line");
        assert_eq!(flag("listen").source, "default");
        assert_eq!(flag("admin-token-file").value, serde_json::Value::Null);
        assert!(!format!("{config:?}").contains("pw4"));
    }
}
