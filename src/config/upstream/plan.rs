//! Applies the table of upstream's variables to a parse of our command
//! line: refusals first, then each row's settings, given as arguments
//! before the user's own (so clap judges them with every rule it knows) or
//! as defaults; a variable that disagrees with our own flag is an error
//! naming both.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command, FromArgMatches};

use super::convert::{Upstream, parse_go_bool};
use super::service_links::{self, is_service_link};
use super::{
    Accepts, Effect, Environment, Row, SHARED_NAMES, Setting, TABLE, UpstreamError, Value, Variable,
};

/// When envoyproxy/ratelimit's environment variables are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvoyproxyEnv {
    /// Read them when a variable only upstream uses is set.
    Auto,
    /// Always read them.
    Always,
    /// Never read them.
    Never,
}

/// What reading upstream's variables did, for the start-up log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Upstream's variables were in use (and its defaults applied).
    pub active: bool,
    /// The upstream variables that were set, by name.
    pub read: Vec<String>,
    /// Variables accepted without an equivalent here, with why.
    pub warnings: Vec<String>,
}

/// Which of our flags upstream's variables set (or defaulted): clap id to
/// the variables, so that a later error about the flag names them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Origins(BTreeMap<&'static str, String>);

impl Origins {
    /// The variables that set the flag `id`, if they did.
    pub fn of(&self, id: &str) -> Option<&str> {
        self.0.get(id).map(String::as_str)
    }
}

/// Why a command line with upstream's variables does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Our own flags do not parse (clap's message, with usage).
    #[error(transparent)]
    Clap(#[from] clap::Error),
    /// Upstream's variables cannot work.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// A parse of our command line and upstream's variables.
pub struct Parsed<C> {
    /// The options.
    pub options: C,
    /// What upstream's variables did.
    pub report: Report,
    /// Which flags they set.
    pub origins: Origins,
    /// The matches the options were read from: every flag's value as
    /// given, and where from.
    pub matches: ArgMatches,
}

/// Parses `args` (the program's name first) with `command`, whose flags
/// fill `C`, and applies upstream's variables from `environment` when its
/// `envoyproxy_env` flag says they are in use.
pub fn parse<C: FromArgMatches + PartialEq>(
    command: Command,
    args: &[OsString],
    environment: &Environment,
) -> Result<Parsed<C>, ParseError> {
    let matches = command.clone().try_get_matches_from(args)?;
    let own = C::from_arg_matches(&matches)?;
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let mode = matches
        .get_one::<EnvoyproxyEnv>("envoyproxy_env")
        .copied()
        .unwrap_or(EnvoyproxyEnv::Auto);
    let (report, settings) = plan(mode, environment, &given)?;
    if !report.active {
        return Ok(Parsed {
            options: own,
            report,
            origins: Origins::default(),
            matches,
        });
    }
    let mut arguments: Vec<OsString> = args.iter().take(1).cloned().collect();
    let mut with_defaults = command.clone();
    for setting in &settings {
        if given(setting.flag) {
            if setting.given {
                agree(&command, args, &matches, &own, setting)?;
            }
            continue;
        }
        let Value::Args(values) = &setting.value else {
            continue;
        };
        if setting.given {
            let long = long_name(&command, setting.flag);
            arguments.extend(
                values
                    .iter()
                    .map(|value| format!("--{long}={value}").into()),
            );
        } else {
            with_defaults =
                with_defaults.mut_arg(setting.flag, |arg| arg.default_values(values.clone()));
        }
    }
    arguments.extend(args.iter().skip(1).cloned());
    let matches = with_defaults
        .try_get_matches_from(&arguments)
        .map_err(|err| explain(&command, &settings, err))?;
    let options = C::from_arg_matches(&matches)?;
    let origins = Origins(
        settings
            .into_iter()
            .filter(|setting| !given(setting.flag))
            .map(|setting| (setting.flag, setting.from))
            .collect(),
    );
    Ok(Parsed {
        options,
        report,
        origins,
        matches,
    })
}

/// Is `name` one of upstream's variables (or under one of its prefixes)?
fn in_table(name: &str) -> Option<&'static Row> {
    let named = |variable: &Variable| match variable.name.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => variable.name == name,
    };
    // Exact names first: a prefix row covers only what no row names.
    TABLE
        .iter()
        .find(|row| {
            row.variables
                .iter()
                .any(|variable| !variable.name.ends_with('*') && named(variable))
        })
        .or_else(|| TABLE.iter().find(|row| row.variables.iter().any(named)))
}

/// Does setting `name` put upstream's variables in use (with
/// `--envoyproxy-env auto`)? Any of them does but the names other software
/// sets too (and Kubernetes service links, told by their value too: see
/// [`service_links`]).
pub fn switches_upstream_on(name: &str) -> bool {
    in_table(name).is_some() && !SHARED_NAMES.contains(&name)
}

/// Reads the table against `environment`: the report, and the settings of
/// our flags (none unless upstream's variables are in use). Refusals come
/// first, so a deployment learns what cannot work before anything else.
fn plan(
    mode: EnvoyproxyEnv,
    environment: &Environment,
    given: &dyn Fn(&str) -> bool,
) -> Result<(Report, Vec<Setting>), UpstreamError> {
    let active = match mode {
        EnvoyproxyEnv::Never => false,
        EnvoyproxyEnv::Always => true,
        EnvoyproxyEnv::Auto => environment
            .iter()
            .any(|(name, value)| switches_upstream_on(name) && !is_service_link(name, value)),
    };
    if !active {
        return Ok((Report::default(), Vec::new()));
    }
    let (environment, links) = without_service_links(environment);
    let environment = &environment;
    let mut report = Report {
        active,
        read: environment
            .keys()
            .filter(|name| in_table(name).is_some())
            .cloned()
            .collect(),
        warnings: links,
    };
    for (name, value) in environment {
        if let Some(row) = in_table(name) {
            check(row, name, value)?;
        }
    }
    let upstream = Upstream::new(environment, given);
    let mut settings = Vec::new();
    for row in TABLE {
        let applies = row.when.iter().try_fold(true, |all, condition| {
            Ok::<_, UpstreamError>(all && upstream.holds(condition)?)
        })?;
        match row.effect {
            Effect::Sets {
                convert, secret, ..
            } if applies => {
                for mut setting in convert(&upstream, row)?.unwrap_or_default() {
                    setting.secret = secret;
                    settings.push(setting);
                }
            }
            Effect::Warns { why } => {
                for variable in row.variables {
                    if let Some(value) = environment.get(variable.name) {
                        report.warnings.push(format!(
                            "{}={value} has no effect here: {why}",
                            variable.name
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok((report, settings))
}

/// `environment` without the Kubernetes service links that share a name
/// or prefix with upstream's variables, and a warning for each of those.
fn without_service_links(environment: &Environment) -> (Environment, Vec<String>) {
    let mut warnings = Vec::new();
    let kept = environment
        .iter()
        .filter(|(name, value)| {
            let Some(row) = in_table(name).filter(|_| is_service_link(name, value)) else {
                return true;
            };
            let exact = row.variables.iter().any(|variable| variable.name == *name);
            warnings.push(service_links::warning(name, value, exact));
            false
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    (kept, warnings)
}

/// Stops the start when `name`'s `value` is one its row does not take.
fn check(row: &Row, name: &str, value: &str) -> Result<(), UpstreamError> {
    let (accepts, why) = match row.effect {
        Effect::Refuses { accepts, why } | Effect::Ignores { accepts, why } => (accepts, why),
        Effect::Switches { what } => (Accepts::Bool, what),
        Effect::Sets { .. } | Effect::Warns { .. } => return Ok(()),
    };
    let taken = match accepts {
        Accepts::Any => true,
        Accepts::Nothing => value.is_empty(),
        Accepts::OneOf(values) => values.iter().any(|one| one.eq_ignore_ascii_case(value)),
        Accepts::Bool | Accepts::False => match parse_go_bool(value) {
            Some(flag) => !(flag && matches!(accepts, Accepts::False)),
            None => {
                return Err(UpstreamError::value(
                    name,
                    value,
                    "not a boolean (true or false)",
                ));
            }
        },
    };
    if taken {
        return Ok(());
    }
    let variable = row
        .variables
        .iter()
        .map(|variable| variable.name)
        .find(|known| *known == name)
        .unwrap_or("a variable of upstream's");
    Err(UpstreamError::Refused {
        name: variable,
        value: value.to_owned(),
        why,
    })
}

/// Checks that our flag, given, says what `setting` says.
fn agree<C: FromArgMatches + PartialEq>(
    command: &Command,
    args: &[OsString],
    matches: &ArgMatches,
    own: &C,
    setting: &Setting,
) -> Result<(), UpstreamError> {
    let long = long_name(command, setting.flag);
    let ours: Vec<String> = matches
        .get_raw(setting.flag)
        .into_iter()
        .flatten()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    let disagree = |theirs: String| UpstreamError::Disagrees {
        from: setting.from.clone(),
        flag: long.clone(),
        theirs,
        ours: if setting.secret {
            "something else".into()
        } else {
            ours.join(",")
        },
    };
    let Value::Args(values) = &setting.value else {
        return Err(disagree("it must be unset".into()));
    };
    let theirs = || {
        if setting.secret {
            "something".into()
        } else {
            values.join(",")
        }
    };
    let appends = command
        .get_arguments()
        .find(|arg| arg.get_id() == setting.flag)
        .is_some_and(|arg| matches!(arg.get_action(), ArgAction::Append));
    let same = if appends {
        ours == *values
    } else {
        // The user's command line with upstream's value last: typed,
        // equal to the user's own exactly when the values mean the same.
        let mut with_theirs = args.to_vec();
        with_theirs.extend(
            values
                .iter()
                .map(|value| format!("--{long}={value}").into()),
        );
        let command = command.clone().args_override_self(true);
        let matches = command
            .clone()
            .try_get_matches_from(&with_theirs)
            .map_err(|err| explain(&command, std::slice::from_ref(setting), err))?;
        C::from_arg_matches(&matches).is_ok_and(|theirs| theirs == *own)
    };
    if same {
        Ok(())
    } else {
        Err(disagree(theirs()))
    }
}

/// The long name of our flag `id`.
fn long_name(command: &Command, id: &str) -> String {
    command
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .and_then(|arg| arg.get_long())
        .unwrap_or(id)
        .to_owned()
}

/// Clap's refusal of a command line that upstream's `settings` were put
/// into, told in terms of the variables that set the flag at fault.
fn explain(command: &Command, settings: &[Setting], err: clap::Error) -> UpstreamError {
    let named = |kind| match err.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        Some(ContextValue::Strings(texts)) => Some(texts.join(" ")),
        _ => None,
    };
    let mentioned: Vec<String> = [ContextKind::InvalidArg, ContextKind::PriorArg]
        .into_iter()
        .filter_map(named)
        .collect();
    let culprit = settings.iter().find(|setting| {
        let long = format!("--{}", long_name(command, setting.flag));
        mentioned.iter().any(|text| {
            text.split([' ', '='])
                .next()
                .is_some_and(|flag| flag.trim_end_matches("[") == long)
        })
    });
    let reason = match err.kind() {
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
            if culprit.is_some_and(|setting| setting.secret) =>
        {
            "not a value it takes".to_owned()
        }
        _ => first_line(&err),
    };
    let as_flag = |setting: &Setting| {
        format!(
            "{} (as --{})",
            setting.from,
            long_name(command, setting.flag)
        )
    };
    let from = match culprit {
        Some(setting) => as_flag(setting),
        None => format!(
            "envoyproxy/ratelimit's variables ({})",
            settings
                .iter()
                .filter(|setting| setting.given)
                .map(as_flag)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    UpstreamError::Rejected { from, reason }
}

/// Clap's message on one line, without its `error: ` and usage lines.
fn first_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    message
        .strip_prefix("error: ")
        .unwrap_or(&message)
        .to_owned()
}
