//! How envoyproxy/ratelimit names its statistics: lyft/gostats' scopes
//! (dot-joined) with upstream's extra tags serialized into the name
//! (`name.__key=value`, keys sorted), and upstream's `SanitizeStatName` on
//! the keys of its per-rule statistics.

use std::sync::LazyLock;

use regex::Regex;

/// Upstream's service scope (`ratelimit`, then `service`).
pub(crate) const SERVICE: &str = "ratelimit.service";
/// Its per-rule scope.
pub(crate) const RATE_LIMIT: &str = "ratelimit.service.rate_limit";
/// Its `ShouldRateLimit` error scope.
pub(crate) const SHOULD_RATE_LIMIT: &str = "ratelimit.service.call.should_rate_limit";
/// Its gRPC server scope, per method.
pub(crate) const SERVER: &str = "ratelimit_server";
/// Its Redis pool scope.
pub(crate) const REDIS_POOL: &str = "ratelimit.redis_pool";
/// Its local cache's scope.
pub(crate) const LOCAL_CACHE: &str = "ratelimit.localcache";

/// IPv4 addresses, whose dots upstream replaces (Go's `\d` is ASCII).
static IPV4: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}").expect("a valid pattern")
});

/// Upstream's `SanitizeStatName`: `:` and `|` become `_`, and so do the
/// dots of anything that looks like an IPv4 address.
pub(crate) fn sanitize(key: &str) -> String {
    let replaced = key.replace([':', '|'], "_");
    IPV4.replace_all(&replaced, |found: &regex::Captures<'_>| {
        found[0].replace('.', "_")
    })
    .into_owned()
}

/// Upstream's extra tags on every statistic, as gostats keeps them: sorted
/// by key, without empty keys or values, `.`, `:` and `|` in values
/// replaced by `_`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags(Vec<(String, String)>);

impl Tags {
    /// The tags `pairs` give (a later pair with the same key wins).
    pub fn new(pairs: &[(String, String)]) -> Self {
        let mut tags: Vec<(String, String)> = Vec::new();
        for (key, value) in pairs {
            if key.is_empty() || value.is_empty() {
                continue;
            }
            let value = value.replace(['.', ':', '|'], "_");
            match tags.iter_mut().find(|(k, _)| k == key) {
                Some(tag) => tag.1 = value,
                None => tags.push((key.clone(), value)),
            }
        }
        tags.sort();
        Self(tags)
    }

    /// The tags, in order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    /// `name` with the tags in it, as gostats writes them for statsd (and
    /// as upstream's Prometheus sink maps them).
    pub fn serialize(&self, name: &str) -> String {
        let mut serialized = name.to_owned();
        for (key, value) in &self.0 {
            serialized.push_str(".__");
            serialized.push_str(key);
            serialized.push('=');
            serialized.push_str(value);
        }
        serialized
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sanitized_as_upstream_does() {
        assert_eq!(sanitize("d.ip_10.0.0.1.a:b|c"), "d.ip_10_0_0_1.a_b_c");
        assert_eq!(sanitize("d.v_1234.1.1.1"), "d.v_1234_1_1_1");
        assert_eq!(sanitize("d.k_1.2.3"), "d.k_1.2.3");
    }

    #[test]
    fn tags_sort_and_clean_as_gostats_does() {
        let pairs = [
            ("zone".to_owned(), "eu.west:1".to_owned()),
            ("app".to_owned(), "rl".to_owned()),
            ("empty".to_owned(), String::new()),
        ];
        let tags = Tags::new(&pairs);
        assert_eq!(
            tags.serialize("ratelimit.service.config_load_success"),
            "ratelimit.service.config_load_success.__app=rl.__zone=eu_west_1"
        );
        assert_eq!(Tags::default().serialize("a.b"), "a.b");
    }
}
