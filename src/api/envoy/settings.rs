//! The Envoy face's server-wide settings, and the bounds on what one
//! `ShouldRateLimit` may ask, checked before anything is matched.

use crate::limit::InvalidArgument;
use crate::limiter::script::MAX_LIMITS_PER_SCRIPT;
use crate::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::rules::Rule;

/// Server-wide settings of the Envoy face.
#[derive(Debug, Clone, Default)]
pub struct EnvoySettings {
    /// Global shadow mode: decide, count and log, but always answer OK.
    pub shadow_mode: bool,
    /// Add the IETF `RateLimit-Policy` and `RateLimit` headers.
    pub ratelimit_headers: bool,
    /// Each descriptor counted on its own, denied hits too (upstream's
    /// default); otherwise a denied request spends nothing.
    pub count_denied_hits: bool,
    /// Every descriptor in quota mode (upstream's QUOTA_MODE).
    pub quota_mode: bool,
    /// Attach upstream's dynamic metadata to each response.
    pub dynamic_metadata: bool,
    /// Upstream's three headers (LIMIT_RESPONSE_HEADERS_ENABLED), by these
    /// names: limit, remaining, reset.
    pub limit_headers: Option<LimitHeaderNames>,
    /// The most one request may ask.
    pub bounds: RequestBounds,
    /// How fixed-window limits are named and counted in the store.
    pub key_layout: KeyLayout,
}

/// How the Envoy face names and counts its fixed-window limits in the
/// store (`--envoy-key-layout`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyLayout {
    /// ratelimitd's own: one key per limit, its window's number kept in it.
    #[default]
    Ratelimitd,
    /// envoyproxy/ratelimit's: a counter per window named
    /// `<prefix><domain>_<key>_<value>_..._<window start>`, counted with
    /// INCRBY, so that both share one count.
    Upstream,
}

impl EnvoySettings {
    /// Is `rule` in quota mode: its descriptor's `quota_mode`, or
    /// QUOTA_MODE for all?
    pub(super) fn in_quota_mode(&self, rule: &Rule) -> bool {
        rule.descriptor().quota || self.quota_mode
    }
}

/// The names of upstream's response headers.
#[derive(Debug, Clone)]
pub struct LimitHeaderNames {
    /// The header naming the limit (`RateLimit-Limit` by default).
    pub limit: String,
    /// The header naming what remains.
    pub remaining: String,
    /// The header naming the seconds to the reset.
    pub reset: String,
}

#[cfg(test)]
impl LimitHeaderNames {
    /// Short names, for tests: `L`, `R` and `T`.
    pub(super) fn short() -> Self {
        Self {
            limit: "L".into(),
            remaining: "R".into(),
            reset: "T".into(),
        }
    }
}

/// The most one `ShouldRateLimit` may ask, so that no single request can
/// hold a core or Redis for long: beyond any bound the request is refused
/// with `INVALID_ARGUMENT` naming it, before anything is matched or
/// written. Envoy sends a handful of descriptors of a few entries each.
#[derive(Debug, Clone, Copy)]
pub struct RequestBounds {
    /// Descriptors per request.
    pub max_descriptors: usize,
    /// Entries per descriptor.
    pub max_entries: usize,
    /// Of each entry's key and of its value.
    pub max_entry_bytes: usize,
}

impl RequestBounds {
    /// Upstream sends a handful; this leaves room and, one limit each,
    /// fits one script.
    pub const DEFAULT_MAX_DESCRIPTORS: usize = MAX_LIMITS_PER_SCRIPT;
    /// Entries per descriptor unless `--max-descriptor-entries` says.
    pub const DEFAULT_MAX_ENTRIES: usize = 16;
    /// Bytes per entry key or value unless `--max-descriptor-entry-bytes` says.
    pub const DEFAULT_MAX_ENTRY_BYTES: usize = 4096;

    /// Whether `request` is within the bounds; the error names the first
    /// field beyond one, and the flag that sets it.
    pub(super) fn check(&self, request: &RateLimitRequest) -> Result<(), InvalidArgument> {
        if request.descriptors.len() > self.max_descriptors {
            return Err(InvalidArgument::new(
                "descriptors",
                format!(
                    "at most {} per request (--max-descriptors), got {}",
                    self.max_descriptors,
                    request.descriptors.len()
                ),
            ));
        }
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.len() > self.max_entries {
                return Err(InvalidArgument::new(
                    format!("descriptors[{i}].entries"),
                    format!(
                        "at most {} per descriptor (--max-descriptor-entries), got {}",
                        self.max_entries,
                        descriptor.entries.len()
                    ),
                ));
            }
            for (j, entry) in descriptor.entries.iter().enumerate() {
                for (part, text) in [("key", &entry.key), ("value", &entry.value)] {
                    if text.len() > self.max_entry_bytes {
                        return Err(InvalidArgument::new(
                            format!("descriptors[{i}].entries[{j}].{part}"),
                            format!(
                                "at most {} bytes (--max-descriptor-entry-bytes), got {}",
                                self.max_entry_bytes,
                                text.len()
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Default for RequestBounds {
    fn default() -> Self {
        Self {
            max_descriptors: Self::DEFAULT_MAX_DESCRIPTORS,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_entry_bytes: Self::DEFAULT_MAX_ENTRY_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn request(descriptors: usize, entries: usize, bytes: usize) -> RateLimitRequest {
        let entry = Entry {
            key: "k".into(),
            value: "v".repeat(bytes),
        };
        let descriptor = RateLimitDescriptor {
            entries: vec![entry; entries],
            ..Default::default()
        };
        RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![descriptor; descriptors],
            hits_addend: 0,
        }
    }

    #[test]
    fn each_bound_holds_at_its_value_and_names_the_field_past_it() {
        let bounds = RequestBounds {
            max_descriptors: 2,
            max_entries: 3,
            max_entry_bytes: 4,
        };
        assert_eq!(bounds.check(&request(2, 3, 4)), Ok(()));
        let err = bounds.check(&request(3, 1, 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "descriptors: at most 2 per request (--max-descriptors), got 3"
        );
        let err = bounds.check(&request(1, 4, 1)).unwrap_err();
        assert_eq!(err.field, "descriptors[0].entries");
        let err = bounds.check(&request(2, 2, 5)).unwrap_err();
        assert_eq!(err.field, "descriptors[0].entries[0].value");
        assert!(
            err.rule.contains("(--max-descriptor-entry-bytes), got 5"),
            "{err}"
        );
        let mut long_key = request(1, 1, 1);
        long_key.descriptors[0].entries[0].key = "k".repeat(5);
        assert_eq!(
            bounds.check(&long_key).unwrap_err().field,
            "descriptors[0].entries[0].key"
        );
    }

    #[test]
    fn the_default_descriptors_fit_one_script() {
        assert_eq!(
            RequestBounds::default().max_descriptors,
            MAX_LIMITS_PER_SCRIPT
        );
    }
}
