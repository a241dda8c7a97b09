//! Envoy rate limit service requests for the tests: descriptors from
//! `(key, value)` entries, with or without their own hits.

use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

/// A descriptor of these entries, in order.
pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// `descriptor` with its own `hits_addend`.
pub(crate) fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(hits);
    descriptor
}
