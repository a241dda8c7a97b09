//! Upstream's ways of naming a Redis, as our flags: an address list, a
//! socket type, a Redis type, a password and a TLS switch become URLs, a
//! mode and a sentinel master, for the main Redis and the per-second one
//! alike; and the TLS files upstream reads for both.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{Upstream, setting};
use crate::config::upstream::{Effect, Row, Setting, UpstreamError, Variable};

/// Our Redis URLs, mode and sentinel master (the row's three flags, in
/// that order) from upstream's address list, socket type, Redis type,
/// password and TLS switch (the row's five variables, in that order): the
/// main Redis's and the per-second one's alike.
pub(in crate::config::upstream) fn redis(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let [url, socket, kind, auth, tls] = row.variables else {
        return Ok(None);
    };
    let Effect::Sets {
        flags: &[url_flag, mode_flag, master_flag],
        ..
    } = row.effect
    else {
        return Ok(None);
    };
    let value = |variable: &Variable| upstream.get(variable.name).unwrap_or(variable.default);
    let given = upstream.any_set(row);
    let tls_on = upstream.go_bool(tls.name)?.unwrap_or(false);
    let mode = match value(kind).to_ascii_lowercase().as_str() {
        "single" => "standalone",
        "cluster" => "cluster",
        "sentinel" => "sentinel",
        other => {
            return Err(UpstreamError::value(
                kind.name,
                other,
                "not single, cluster or sentinel",
            ));
        }
    };
    let list = value(url);
    let mut addresses: Vec<&str> = list.split(',').map(str::trim).collect();
    let mut settings = Vec::new();
    if mode == "sentinel" {
        if addresses.len() < 2 {
            return Err(UpstreamError::value(
                url.name,
                list,
                &format!(
                    "with {}=sentinel, the master's name then the sentinels, as \
                     mymaster,host:port,...",
                    kind.name
                ),
            ));
        }
        let master = addresses.remove(0);
        settings.push(setting(
            master_flag,
            vec![master.to_owned()],
            given,
            url.name.to_owned(),
        ));
    }
    let password = upstream.get(auth.name).filter(|auth| !auth.is_empty());
    let names = RedisNames {
        url: url.name,
        socket: socket.name,
        tls: tls.name,
        auth: auth.name,
    };
    let urls = addresses
        .iter()
        .map(|address| redis_url(address, value(socket), password, tls_on, &names))
        .collect::<Result<Vec<_>, _>>()?;
    settings.push(setting(url_flag, urls, given, url.name.to_owned()));
    settings.push(setting(
        mode_flag,
        vec![mode.into()],
        given,
        kind.name.to_owned(),
    ));
    Ok(Some(settings))
}

/// The per-second Redis (with REDIS_PERSECOND=true), as [`redis`] reads
/// the main one; given even where its variables are left to upstream's
/// defaults (REDIS_PERSECOND=true asked for a per-second Redis), unless
/// our own flag names it.
pub(in crate::config::upstream) fn per_second_redis(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let given = upstream.any_set(row);
    Ok(redis(upstream, row)?.map(|settings| {
        settings
            .into_iter()
            .map(|setting| Setting {
                given: given || !upstream.given(setting.flag),
                ..setting
            })
            .collect()
    }))
}

/// A TLS file (REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT or
/// REDIS_TLS_CLIENT_KEY), when set and not empty: upstream reads one set of
/// files for both Redis deployments, so it goes to the main Redis's flag
/// (the row's first) with REDIS_TLS, and to the per-second one's (its
/// second) with REDIS_PERSECOND and REDIS_PERSECOND_TLS.
pub(in crate::config::upstream) fn redis_tls_path(
    upstream: &Upstream<'_>,
    row: &Row,
) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let name = row.variables[0].name;
    let Some(path) = upstream.get(name).filter(|path| !path.is_empty()) else {
        return Ok(None);
    };
    let Effect::Sets {
        flags: &[main, per_second],
        ..
    } = row.effect
    else {
        return Ok(None);
    };
    let mut settings = Vec::new();
    if upstream.go_bool("REDIS_TLS")? == Some(true) {
        settings.push(setting(main, vec![path.to_owned()], true, name.to_owned()));
    }
    if upstream.go_bool("REDIS_PERSECOND")? == Some(true)
        && upstream.go_bool("REDIS_PERSECOND_TLS")? == Some(true)
    {
        settings.push(setting(
            per_second,
            vec![path.to_owned()],
            true,
            name.to_owned(),
        ));
    }
    Ok(Some(settings))
}

/// The variables that describe one Redis, for messages.
struct RedisNames {
    url: &'static str,
    socket: &'static str,
    tls: &'static str,
    auth: &'static str,
}

/// What must be escaped in a URL's user or password.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One Redis address as upstream writes it (`host:port`, or a socket path
/// with REDIS_SOCKET_TYPE=unix), as a URL with REDIS_AUTH (`password` or
/// `user:password`) and REDIS_TLS in it (or the per-second Redis's
/// variables, as `names` says). A `redis://` or `rediss://` URL is taken as
/// it is.
fn redis_url(
    address: &str,
    socket: &str,
    auth: Option<&str>,
    tls: bool,
    names: &RedisNames,
) -> Result<String, UpstreamError> {
    let refuse =
        |name: &'static str, value: &str, why: &str| Err(UpstreamError::value(name, value, why));
    if address.contains("://") {
        if auth.is_some() {
            return refuse(
                names.url,
                address,
                &format!("a URL: put the credentials in it, not in {}", names.auth),
            );
        }
        return Ok(address.to_owned());
    }
    let (user, password) = match auth {
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => (Some(user), Some(password)),
            None => (None, Some(auth)),
        },
        None => (None, None),
    };
    let escape = |text: &str| utf8_percent_encode(text, USERINFO).to_string();
    match socket.to_ascii_lowercase().as_str() {
        "unix" => {
            if tls {
                return refuse(names.tls, "true", &format!("needs {}=tcp", names.socket));
            }
            let query: Vec<String> = [("user", user), ("pass", password)]
                .into_iter()
                .filter_map(|(key, value)| value.map(|value| format!("{key}={}", escape(value))))
                .collect();
            Ok(match query.is_empty() {
                true => format!("redis+unix://{address}"),
                false => format!("redis+unix://{address}?{}", query.join("&")),
            })
        }
        "tcp" => {
            if address.is_empty() || !address.contains(':') {
                return refuse(names.url, address, "not host:port");
            }
            let scheme = if tls { "rediss" } else { "redis" };
            let credentials = match (user, password) {
                (Some(user), Some(password)) => format!("{}:{}@", escape(user), escape(password)),
                (None, Some(password)) => format!(":{}@", escape(password)),
                _ => String::new(),
            };
            Ok(format!("{scheme}://{credentials}{address}"))
        }
        other => refuse(names.socket, other, "not tcp or unix"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_addresses_become_urls_with_escaped_credentials() {
        let names = RedisNames {
            url: "REDIS_PERSECOND_URL",
            socket: "REDIS_PERSECOND_SOCKET_TYPE",
            tls: "REDIS_PERSECOND_TLS",
            auth: "REDIS_PERSECOND_AUTH",
        };
        let url = |address, socket, auth, tls| redis_url(address, socket, auth, tls, &names);
        assert_eq!(
            url("127.0.0.1:1", "tcp", Some("app:p@ss"), true).unwrap(),
            "rediss://app:p%40ss@127.0.0.1:1"
        );
        assert_eq!(
            url("/tmp/r.sock", "unix", Some("pw"), false).unwrap(),
            "redis+unix:///tmp/r.sock?pass=pw"
        );
        assert_eq!(
            url("redis://h:1", "tcp", None, false).unwrap(),
            "redis://h:1"
        );
        let err = url("/tmp/r.sock", "unix", None, true).unwrap_err();
        assert!(
            err.to_string()
                .contains("REDIS_PERSECOND_TLS=true: needs REDIS_PERSECOND_SOCKET_TYPE=tcp"),
            "{err}"
        );
        let err = url("h", "udp", None, false).unwrap_err();
        assert!(
            err.to_string().contains("REDIS_PERSECOND_SOCKET_TYPE"),
            "{err}"
        );
    }
}
