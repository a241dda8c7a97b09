//! How upstream's statistics variables become our flags: which sink its
//! switches choose (statsd, DogStatsD, or neither; never two), statsd's
//! address from host and port, the default mapping's milliseconds, and the
//! DogStatsD mogrifiers from their named variables.

use super::{Upstream, go_bool_of, names, setting};
use crate::config::upstream::{Row, Setting, UpstreamError, Value};

/// upstream's words when two sinks are asked for.
const ONE_SINK: &str = "unable to use more than one stats sink at the same time: set one of \
                        USE_DOG_STATSD, USE_STATSD, USE_PROMETHEUS";

/// `USE_STATSD`/`USE_DOG_STATSD`/`STATSD_HOST`/`STATSD_PORT` (with
/// `DISABLE_STATS` and `USE_PROMETHEUS`, as upstream's runner reads them):
/// our statsd address, and DogStatsD or not.
pub(in crate::config::upstream) fn statsd(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let [use_statsd, use_dog, host, port] = row.variables else {
        return Ok(None);
    };
    let from = names(row);
    if upstream.go_bool("DISABLE_STATS")? == Some(true) {
        let unset = |flag| Setting {
            flag,
            value: Value::Unset,
            given: true,
            from: "DISABLE_STATS=true".into(),
            secret: false,
        };
        return Ok(Some(vec![unset("statsd_address")]));
    }
    let flag = |name: &str, default: &str| -> Result<bool, UpstreamError> {
        let text = upstream.get(name).unwrap_or(default);
        go_bool_of(name, text)
    };
    let dog = flag(use_dog.name, use_dog.default)?;
    let plain = flag(use_statsd.name, use_statsd.default)?;
    let prometheus = upstream.go_bool("USE_PROMETHEUS")? == Some(true);
    if (dog && (plain || prometheus)) || (plain && prometheus) {
        let (name, value) = if dog {
            (use_dog.name, "true")
        } else {
            (
                use_statsd.name,
                upstream
                    .get(use_statsd.name)
                    .unwrap_or("true (its default)"),
            )
        };
        return Err(UpstreamError::value(name, value, ONE_SINK));
    }
    if !dog && !plain {
        return Ok(None);
    }
    let host_text = upstream.get(host.name).unwrap_or(host.default);
    let port_text = upstream.get(port.name).unwrap_or(port.default);
    let port: u16 = port_text
        .trim()
        .parse()
        .map_err(|_| UpstreamError::value(port.name, port_text, "not a port number"))?;
    let address = if host_text.contains(':') {
        format!("[{host_text}]:{port}")
    } else {
        format!("{host_text}:{port}")
    };
    let given = row.variables.iter().any(|v| upstream.get(v.name).is_some());
    let mut settings = vec![setting(
        "statsd_address",
        vec![address],
        given,
        from.clone(),
    )];
    if dog {
        settings.push(setting("statsd_dogstatsd", vec!["true".into()], true, from));
    }
    Ok(Some(settings))
}

/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: with upstream's default
/// mapping only (upstream ignores it beside PROMETHEUS_MAPPER_YAML).
pub(in crate::config::upstream) fn mapping_milliseconds(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let variable = row.variables[0];
    let Some(text) = upstream.get(variable.name) else {
        return Ok(None);
    };
    let on = go_bool_of(variable.name, text)?;
    if upstream
        .get("PROMETHEUS_MAPPER_YAML")
        .is_some_and(|path| !path.is_empty())
    {
        return Ok(None);
    }
    Ok(Some(vec![setting(
        "stats_mapping_milliseconds",
        vec![on.to_string()],
        true,
        names(row),
    )]))
}

/// `USE_DOG_STATSD_MOGRIFIERS=A,B`: each named mogrifier from its
/// `DOG_STATSD_MOGRIFIER_<name>_PATTERN`, `_NAME` and `_TAGS`
/// (`key:value,...`), in order.
pub(in crate::config::upstream) fn mogrifiers(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let variable = row.variables[0];
    let Some(list) = upstream.get(variable.name) else {
        return Ok(None);
    };
    let mut written = Vec::new();
    for name in list
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let part = |what: &str| {
            let key = format!("DOG_STATSD_MOGRIFIER_{name}_{what}");
            (upstream.get(&key).unwrap_or_default().to_owned(), key)
        };
        let (pattern, pattern_name) = part("PATTERN");
        let (renamed, name_name) = part("NAME");
        let (tags, _) = part("TAGS");
        if pattern.is_empty() {
            return Err(UpstreamError::value(
                variable.name,
                list,
                &format!("no {pattern_name}"),
            ));
        }
        if renamed.is_empty() {
            return Err(UpstreamError::value(
                variable.name,
                list,
                &format!("no {name_name}"),
            ));
        }
        let mut text = format!("pattern={pattern};name={renamed}");
        if !tags.is_empty() {
            text.push_str(";tags=");
            text.push_str(&tags);
        }
        if let Err(why) = text.parse::<crate::stats::mogrifier::Mogrifier>() {
            return Err(UpstreamError::value(
                variable.name,
                list,
                &format!("mogrifier {name}: {why}"),
            ));
        }
        written.push(text);
    }
    if written.is_empty() {
        return Ok(None);
    }
    Ok(Some(vec![setting(
        "statsd_mogrifier",
        vec![written.join("\n")],
        true,
        names(row),
    )]))
}
