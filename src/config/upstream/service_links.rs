//! Kubernetes service links: the variables Kubernetes sets for every
//! Service in the namespace (`STATSD_SERVICE_HOST`, `STATSD_PORT=tcp://…`,
//! …) unless `enableServiceLinks: false`. Some share a name or a prefix
//! with upstream's variables; shaped as links, they never switch
//! upstream's variables on and are never read as them.

use std::sync::LazyLock;

use regex::Regex;

/// The names Kubernetes gives a Service's links, whatever the value:
/// `<S>_SERVICE_HOST`, `<S>_SERVICE_PORT`, `<S>_SERVICE_PORT_<name>`,
/// `<S>_PORT_<n>_<proto>` and its `_PROTO`, `_PORT` and `_ADDR`.
static LINK_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$",
    )
    .expect("a valid pattern")
});

/// The value of `<S>_PORT`: `tcp://host:port` (or udp, sctp).
static LINK_URL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(tcp|udp|sctp)://[^/\s]+:[0-9]+$").expect("a valid pattern"));

/// Is `name=value` shaped as a Kubernetes service link?
pub(super) fn is_service_link(name: &str, value: &str) -> bool {
    LINK_NAME.is_match(name)
        || name
            .strip_suffix("_PORT")
            .is_some_and(|service| !service.is_empty() && LINK_URL.is_match(value))
}

/// The warning for the service link `name=value`, which shares a name
/// (`exact`) or a prefix with upstream's variables and is not read as one.
pub(super) fn warning(name: &str, value: &str, exact: bool) -> String {
    let upstream = if exact {
        "envoyproxy/ratelimit itself would read it as its own and fail to start on such a value"
    } else {
        "envoyproxy/ratelimit does not read it"
    };
    format!(
        "{name}={value} is ignored: it is shaped as a Kubernetes service link (a Service's \
         address, set in every pod of the namespace unless enableServiceLinks: false), not as \
         one of envoyproxy/ratelimit's variables; {upstream}"
    )
}
