//! How upstream's values become ours: Go's booleans and durations, logrus's
//! level names, and the composite variables (an address from a host and a
//! port, the rules directory from three parts, the metrics address; Redis
//! URLs from addresses, socket types, passwords and TLS in `redis_urls`).

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

mod stats;

pub(super) use self::stats::{mapping_milliseconds, mogrifiers, statsd};
use super::{Effect, Environment, Row, Setting, UpstreamError, Value, Variable, When};

mod redis_urls;

pub(super) use self::redis_urls::{per_second_redis, redis, redis_tls_path};

/// Upstream's variables as set, and which of our flags were given.
pub struct Upstream<'a> {
    environment: &'a Environment,
    given: &'a dyn Fn(&str) -> bool,
}

impl<'a> Upstream<'a> {
    /// Reads `environment`; `given` says whether one of our flags (by clap
    /// id) was given on the command line or as `RATELIMITD_*`.
    pub fn new(environment: &'a Environment, given: &'a dyn Fn(&str) -> bool) -> Self {
        Self { environment, given }
    }

    /// The variable's value, when set (empty included).
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.environment.get(name).map(String::as_str)
    }

    /// Was our flag `id` given?
    pub fn given(&self, id: &str) -> bool {
        (self.given)(id)
    }

    /// A Go boolean (strconv.ParseBool), when set.
    pub fn go_bool(&self, name: &str) -> Result<Option<bool>, UpstreamError> {
        self.get(name)
            .map(|text| go_bool_of(name, text))
            .transpose()
    }

    /// Does `condition` hold?
    pub fn holds(&self, condition: &When) -> Result<bool, UpstreamError> {
        let is = |name: &str, wanted: &str| {
            self.get(name)
                .is_some_and(|value| value.eq_ignore_ascii_case(wanted))
        };
        Ok(match *condition {
            When::True(name) => self.go_bool(name)? == Some(true),
            When::Is(name, value) => is(name, value),
            When::IsNot(name, value) => !is(name, value),
        })
    }

    /// The value of the row's `index`th variable if set, else upstream's
    /// default (`given` says which).
    fn value_or_default(&self, row: &Row, index: usize) -> (&'a str, bool) {
        let variable = &row.variables[index];
        match self.get(variable.name) {
            Some(value) => (value, true),
            None => (variable.default, false),
        }
    }

    /// Is any of the row's variables set?
    fn any_set(&self, row: &Row) -> bool {
        row.variables
            .iter()
            .any(|variable| self.get(variable.name).is_some())
    }
}

/// Variable `name`'s `value` as a Go boolean.
fn go_bool_of(name: &str, value: &str) -> Result<bool, UpstreamError> {
    parse_go_bool(value)
        .ok_or_else(|| UpstreamError::value(name, value, "not a boolean (true or false)"))
}

/// Go's strconv.ParseBool.
pub(super) fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// The row's variables, as messages name them: `A/B`.
fn names(row: &Row) -> String {
    names_of(row.variables)
}

fn names_of(variables: &[Variable]) -> String {
    variables
        .iter()
        .map(|variable| variable.name)
        .collect::<Vec<_>>()
        .join("/")
}

/// The setting of our flag `flag` to `values`.
fn setting(flag: &'static str, values: Vec<String>, given: bool, from: String) -> Setting {
    Setting {
        flag,
        value: Value::Args(values),
        given,
        from,
        secret: false,
    }
}

/// One value, from the row's one variable (or its default) to its one
/// flag, through `map`.
fn one(
    row: &Row,
    upstream: &Upstream<'_>,
    map: impl FnOnce(&str, &str) -> Result<String, UpstreamError>,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let (value, given) = upstream.value_or_default(row, 0);
    let Effect::Sets { flags, .. } = row.effect else {
        return Ok(None);
    };
    let name = row.variables[0].name;
    Ok(Some(vec![setting(
        flags[0],
        vec![map(name, value)?],
        given,
        names(row),
    )]))
}

/// The value as it is.
pub(super) fn text(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    one(row, upstream, |_, value| Ok(value.to_owned()))
}

/// A number (Go reads it with the white space around it trimmed); our flag
/// checks its range.
pub(super) fn number(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    one(row, upstream, |_, value| Ok(value.trim().to_owned()))
}

/// The value in lower case (an enumeration upstream reads in any case).
pub(super) fn lowercase(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    one(row, upstream, |_, value| {
        Ok(value.trim().to_ascii_lowercase())
    })
}

/// A Go boolean, as ours.
pub(super) fn go_bool(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    one(row, upstream, |name, value| {
        Ok(go_bool_of(name, value)?.to_string())
    })
}

/// A Go boolean, negated: upstream says "stop", our flag says "do".
pub(super) fn inverted_go_bool(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    one(row, upstream, |name, value| {
        Ok((!go_bool_of(name, value)?).to_string())
    })
}

/// A Go duration (`10s`, `1m30s`, `250ms`), more than zero, to every flag
/// of the row. Upstream's default is not applied: where it differs, ours
/// is kept on purpose.
pub(super) fn positive_go_duration(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let name = row.variables[0].name;
    let Some(text) = upstream.get(name) else {
        return Ok(None);
    };
    let duration = match text.trim() {
        "0" => Duration::ZERO,
        trimmed => humantime::parse_duration(trimmed)
            .map_err(|err| UpstreamError::value(name, text, &format!("not a duration ({err})")))?,
    };
    if duration.is_zero() {
        return Err(UpstreamError::value(name, text, "must be more than zero"));
    }
    let Effect::Sets { flags, .. } = row.effect else {
        return Ok(None);
    };
    let value = humantime::format_duration(duration).to_string();
    Ok(Some(
        flags
            .iter()
            .map(|flag| setting(flag, vec![value.clone()], true, names(row)))
            .collect(),
    ))
}

/// logrus's level names, in any case, as ours.
pub(super) fn log_level(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    one(row, upstream, |name, value| {
        let level = match value.to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => {
                return Err(UpstreamError::value(
                    name,
                    value,
                    "not a log level (debug, info, warn, error)",
                ));
            }
        };
        Ok(level.to_owned())
    })
}

/// A file path, when set and not empty (upstream's "unset").
pub(super) fn path(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let name = row.variables[0].name;
    match upstream.get(name).filter(|path| !path.is_empty()) {
        Some(_) => text(upstream, row),
        None => Ok(None),
    }
}

/// A file path that the switch the row depends on needs.
pub(super) fn required_path(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let name = row.variables[0].name;
    if upstream.get(name).is_none_or(str::is_empty) {
        let switch = match row.when.first() {
            Some(When::True(switch)) => *switch,
            _ => "its switch",
        };
        return Err(UpstreamError::Needs {
            switch: format!("{switch}=true"),
            variable: name,
        });
    }
    text(upstream, row)
}

/// `HOST:PORT` (the gRPC, HTTP or debug listener's pair), resolved, to the
/// row's flag.
pub(super) fn listen(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let (host, host_given) = upstream.value_or_default(row, 0);
    let (port, port_given) = upstream.value_or_default(row, 1);
    let port: u16 = port
        .trim()
        .parse()
        .map_err(|_| UpstreamError::value(row.variables[1].name, port, "not a port number"))?;
    let address = resolve(row.variables[0].name, host, &format!("{host}:{port}"))?;
    let Effect::Sets { flags, .. } = row.effect else {
        return Ok(None);
    };
    Ok(Some(vec![setting(
        flags[0],
        vec![address],
        host_given || port_given,
        names(row),
    )]))
}

/// `address` (from variable `name` = `value`) resolved to one socket
/// address.
fn resolve(name: &str, value: &str, address: &str) -> Result<String, UpstreamError> {
    address
        .to_socket_addrs()
        .map_err(|err| UpstreamError::value(name, value, &err.to_string()))?
        .next()
        .map(|address| address.to_string())
        .ok_or_else(|| UpstreamError::value(name, value, "resolves to no address"))
}

/// The rules in `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`,
/// every file below it (dotfiles are the next row's). Not by default when
/// our own --xds-server names the source.
pub(super) fn runtime_directory(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let given = upstream.any_set(row);
    if upstream.given("xds_server") && !given {
        return Ok(None);
    }
    let part = |index| upstream.value_or_default(row, index).0;
    let path = PathBuf::from(part(0)).join(part(1)).join(part(2));
    Ok(Some(vec![
        setting(
            "config",
            vec![path.to_string_lossy().into_owned()],
            given,
            names(row),
        ),
        setting("config_files", vec!["all".into()], false, names(row)),
    ]))
}

/// The metrics address: none with DISABLE_STATS, PROMETHEUS_ADDR with
/// USE_PROMETHEUS (at PROMETHEUS_PATH, which must be `/metrics`).
pub(super) fn metrics(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let [disable, prometheus, address, path] = row.variables else {
        return Ok(None);
    };
    if upstream.go_bool(disable.name)? == Some(true) {
        return Ok(Some(vec![Setting {
            flag: "metrics_listen",
            value: Value::Unset,
            given: true,
            from: format!("{}=true", disable.name),
            secret: false,
        }]));
    }
    if upstream.go_bool(prometheus.name)? != Some(true) {
        return Ok(None);
    }
    if let Some(text) = upstream.get(path.name)
        && text != path.default
    {
        return Err(UpstreamError::value(
            path.name,
            text,
            "metrics are served at /metrics only",
        ));
    }
    let text = upstream.get(address.name).unwrap_or(address.default);
    // Go's ":9090" listens on every address.
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    let listen = resolve(address.name, text, &full)?;
    Ok(Some(vec![setting(
        "metrics_listen",
        vec![listen],
        true,
        names_of(&[*prometheus, *address]),
    )]))
}
