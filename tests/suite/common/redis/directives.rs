//! `redis-server` settings as directives (a name and its arguments), so that
//! one list serves both as command-line arguments (`--name arg...`, for data
//! nodes) and as lines of a configuration file (for sentinels, which must
//! have one to rewrite).

use std::path::Path;

/// One setting: its name, then its arguments (`["tls-port", "6380"]`).
pub(crate) type Directive = Vec<String>;

/// A directive from its words.
pub(crate) fn directive(words: &[&str]) -> Directive {
    words.iter().map(|word| (*word).to_owned()).collect()
}

/// Loopback only, on `port`: the plain port, or for TLS the TLS port with
/// the plain one off.
pub(crate) fn listen(port: u16, tls: bool) -> Vec<Directive> {
    let port = port.to_string();
    let mut directives = vec![directive(&["bind", "127.0.0.1"])];
    if tls {
        directives.push(directive(&["port", "0"]));
        directives.push(directive(&["tls-port", &port]));
    } else {
        directives.push(directive(&["port", &port]));
    }
    directives
}

/// What every data node gets: no persistence (nothing to clean up, no fork
/// for a save), and full resyncs that start at once instead of waiting 5 s
/// for more replicas (the Redis 7 default), so replicas are in sync, and
/// therefore eligible for failover, within milliseconds.
pub(crate) fn data_node() -> Vec<Directive> {
    vec![
        directive(&["save", ""]),
        directive(&["appendonly", "no"]),
        directive(&["repl-diskless-sync-delay", "0"]),
    ]
}

/// The directives as `redis-server` arguments.
pub(crate) fn as_args(directives: &[Directive]) -> Vec<String> {
    directives
        .iter()
        .flat_map(|words| {
            let (name, arguments) = words.split_first().expect("a directive has a name");
            std::iter::once(format!("--{name}")).chain(arguments.iter().cloned())
        })
        .collect()
}

/// The directives as a `redis.conf`, every argument quoted.
pub(crate) fn as_config(directives: &[Directive]) -> String {
    directives
        .iter()
        .map(|words| {
            let (name, arguments) = words.split_first().expect("a directive has a name");
            let arguments: Vec<String> = arguments.iter().map(|word| quoted(word)).collect();
            format!("{name} {}\n", arguments.join(" "))
        })
        .collect()
}

/// A string as a quoted `redis.conf` argument.
fn quoted(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// A path as an argument (temporary directories are UTF-8).
pub(crate) fn path_arg(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("non-UTF-8 path {}", path.display()))
        .to_owned()
}
