//! envoyproxy/ratelimit's environment variables, as one table: for each,
//! the flag of ours it sets and how its value converts, upstream's default,
//! or why it is refused, warned about or ignored. A deployment of upstream
//! starts ratelimitd unchanged: its variables become our flags before clap
//! parses ([`plan`]), so clap's own rules (types, ranges, flags that
//! require or exclude each other) judge them, and `--help` names them.
//!
//! When: only while upstream's variables are in use (`--envoyproxy-env
//! auto`: any variable that only upstream uses is set). Precedence: our own
//! flag (or `RATELIMITD_*` variable), when given, wins over a variable that
//! says the same and is an error beside one that says otherwise; where
//! neither is given, upstream's default applies where it differs from ours.

mod convert;
mod plan;
mod service_links;
mod table;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use clap::Command;

pub use self::convert::Upstream;
pub use self::plan::{
    EnvoyproxyEnv, Origins, ParseError, Parsed, Report, parse, switches_upstream_on,
};
pub use self::table::TABLE;

/// Variable name to value.
pub type Environment = BTreeMap<String, String>;

/// Upstream's variables cannot start ratelimitd.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// A value that does not parse or cannot work.
    #[error("{name}={value}: {why}")]
    Value {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// Behaviour ratelimitd does not have.
    #[error("{name}={value} cannot be honoured: {why}; unset it to start ratelimitd")]
    Refused {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A switch is on without what it needs.
    #[error("{switch} needs {variable}")]
    Needs {
        /// The switch, as `NAME=true`.
        switch: String,
        /// The variable it needs.
        variable: &'static str,
    },
    /// Our flag says otherwise.
    #[error("{from} says {theirs} but --{flag} says {ours}: set one of them")]
    Disagrees {
        /// The variables.
        from: String,
        /// Our flag.
        flag: String,
        /// What the variables say.
        theirs: String,
        /// What our flag says.
        ours: String,
    },
    /// Clap refused what the variables set, for this reason.
    #[error("{from}: {reason}")]
    Rejected {
        /// The variables, and the flags of ours they set.
        from: String,
        /// Clap's reason.
        reason: String,
    },
}

impl UpstreamError {
    /// Variable `name` = `value` is wrong: `why`.
    pub fn value(name: &str, value: &str, why: &str) -> Self {
        Self::Value {
            name: name.to_owned(),
            value: value.to_owned(),
            why: why.to_owned(),
        }
    }
}

/// One of upstream's variables.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// Its name; ending in `*`, every variable with that prefix.
    pub name: &'static str,
    /// Upstream's default, as upstream's settings write it.
    pub default: &'static str,
}

/// A row of the table: some of upstream's variables and what they do here.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The variables the row reads.
    pub variables: &'static [Variable],
    /// Only when all of these hold (on other variables) does the row apply.
    pub when: &'static [When],
    /// What the variables do.
    pub effect: Effect,
}

/// A condition on another variable.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// The variable is a true Go boolean.
    True(&'static str),
    /// The variable is this value (any case).
    Is(&'static str, &'static str),
    /// The variable is anything but this value (any case), or unset.
    IsNot(&'static str, &'static str),
}

/// What a row's variables do.
#[derive(Clone, Copy)]
pub enum Effect {
    /// They set our flags: `convert` says to what (from the variables, or
    /// from upstream's defaults when none is set).
    Sets {
        /// Our flags (clap ids) that `convert` may set.
        flags: &'static [&'static str],
        /// How the value converts, for people.
        how: &'static str,
        /// The values may hold a password: error messages do not show them.
        secret: bool,
        /// The conversion.
        convert: Convert,
    },
    /// Set to any value `accepts` does not take, the start stops.
    Refuses {
        /// What is accepted.
        accepts: Accepts,
        /// What ratelimitd does instead.
        why: &'static str,
    },
    /// Accepted, but it changes nothing here where it would upstream: a
    /// warning at start says so.
    Warns {
        /// Why it has no effect.
        why: &'static str,
    },
    /// A Go boolean that switches on the rows that name it in their
    /// `when`.
    Switches {
        /// What it switches on.
        what: &'static str,
    },
    /// Accepted, with no effect and none needed (what it configures is off
    /// upstream too, or here works without it).
    Ignores {
        /// What is accepted.
        accepts: Accepts,
        /// Why nothing is lost.
        why: &'static str,
    },
}

impl std::fmt::Debug for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sets { flags, how, .. } => write!(f, "Sets({flags:?}: {how})"),
            Self::Refuses { accepts, why } => write!(f, "Refuses({accepts:?}: {why})"),
            Self::Warns { why } => write!(f, "Warns({why})"),
            Self::Switches { what } => write!(f, "Switches({what})"),
            Self::Ignores { accepts, why } => write!(f, "Ignores({accepts:?}: {why})"),
        }
    }
}

/// The values a checked variable may take.
#[derive(Debug, Clone, Copy)]
pub enum Accepts {
    /// Any.
    Any,
    /// Unset or empty.
    Nothing,
    /// A Go boolean.
    Bool,
    /// A false Go boolean (or unset).
    False,
    /// One of these (any case).
    OneOf(&'static [&'static str]),
}

/// A row's conversion: the settings of our flags it makes, or `None` when
/// the row does not apply after all.
pub type Convert = fn(&Upstream<'_>, &Row) -> Result<Option<Vec<Setting>>, UpstreamError>;

/// One flag of ours set from upstream's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Our flag's clap id.
    pub flag: &'static str,
    /// What it is set to.
    pub value: Value,
    /// `true`: a variable said so, and it counts as given (a default of
    /// upstream's otherwise, which our own flag simply overrides).
    pub given: bool,
    /// The variables it came from, for messages (`A/B`).
    pub from: String,
    /// The value may hold a password: messages do not show it.
    pub secret: bool,
}

/// A flag's value from upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// These values, as they would be written after the flag.
    Args(Vec<String>),
    /// Our flag must stay unset.
    Unset,
}

/// Names upstream shares with other software (platforms set `PORT`,
/// `REDIS_URL`, `LOG_LEVEL`): read when upstream's variables are in use,
/// but never the reason they are.
pub const SHARED_NAMES: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "REDIS_URL",
    "REDIS_AUTH",
];

/// `command` with each flag's help naming the upstream variables that set
/// it, so that `--help` speaks both vocabularies; and without the values of
/// the `RATELIMITD_*` variables in force, which may hold passwords.
pub fn annotate(command: Command) -> Command {
    let command = command.mut_args(|arg| arg.hide_env_values(true));
    let mut by_flag: Vec<(&str, Vec<&str>)> = Vec::new();
    for row in TABLE {
        if let Effect::Sets { flags, .. } = row.effect {
            for flag in flags {
                let names = row.variables.iter().map(|variable| variable.name);
                match by_flag.iter_mut().find(|(known, _)| known == flag) {
                    Some((_, variables)) => variables.extend(names),
                    None => by_flag.push((flag, names.collect())),
                }
            }
        }
    }
    by_flag
        .into_iter()
        .fold(command, |command, (flag, variables)| {
            let note = format!("[envoyproxy/ratelimit: {}]", variables.join(", "));
            command.mut_arg(flag, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                let long = arg.get_long_help().map(ToString::to_string);
                let arg = arg.help(format!("{help} {note}"));
                match long {
                    Some(long) => arg.long_help(format!("{long}\n\n{note}")),
                    None => arg,
                }
            })
        })
}
