//! envoyproxy/ratelimit's statistics, by group, each named as upstream
//! names it: the service's (configuration loads, `ShouldRateLimit`
//! errors, global shadow mode), the gRPC server's per method (calls and
//! response time), the Redis pool's, the local cache's, and each rule's
//! hits.

use super::names::{
    LOCAL_CACHE, RATE_LIMIT, REDIS_POOL, SERVER, SERVICE, SHOULD_RATE_LIMIT, sanitize,
};
use super::registry::{Counter, Gauge, Registry, Timer};

/// The service's statistics (upstream's `ServiceStats`).
pub(crate) struct ServiceStats {
    /// `ratelimit.service.config_load_success`.
    pub config_load_success: Counter,
    /// `ratelimit.service.config_load_error`.
    pub config_load_error: Counter,
    /// `ratelimit.service.call.should_rate_limit.redis_error`.
    pub redis_error: Counter,
    /// `ratelimit.service.call.should_rate_limit.service_error`.
    pub service_error: Counter,
    /// `ratelimit.service.global_shadow_mode`.
    pub global_shadow_mode: Counter,
}

impl ServiceStats {
    /// The service's statistics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            config_load_success: registry.counter(&format!("{SERVICE}.config_load_success")),
            config_load_error: registry.counter(&format!("{SERVICE}.config_load_error")),
            redis_error: registry.counter(&format!("{SHOULD_RATE_LIMIT}.redis_error")),
            service_error: registry.counter(&format!("{SHOULD_RATE_LIMIT}.service_error")),
            global_shadow_mode: registry.counter(&format!("{SERVICE}.global_shadow_mode")),
        }
    }
}

/// One gRPC method's statistics (upstream's server reporter).
#[derive(Clone, Default)]
pub(crate) struct MethodStats {
    /// `ratelimit_server.<method>.total_requests`.
    pub total_requests: Counter,
    /// `ratelimit_server.<method>.response_time`, in milliseconds.
    pub response_time: Timer,
}

impl MethodStats {
    /// Method `method`'s statistics (its name without the service).
    pub(crate) fn new(registry: &Registry, method: &str) -> Self {
        Self {
            total_requests: registry.counter(&format!("{SERVER}.{method}.total_requests")),
            response_time: registry.timer(&format!("{SERVER}.{method}.response_time")),
        }
    }
}

/// The Redis pool's statistics (upstream's `poolStats`).
#[derive(Clone, Default)]
pub(crate) struct PoolStats {
    /// `ratelimit.redis_pool.cx_active`: connections open now.
    pub cx_active: Gauge,
    /// `ratelimit.redis_pool.cx_total`: connections opened.
    pub cx_total: Counter,
    /// `ratelimit.redis_pool.cx_local_close`: connections closed.
    pub cx_local_close: Counter,
}

impl PoolStats {
    /// The pool's statistics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            cx_active: registry.gauge(&format!("{REDIS_POOL}.cx_active")),
            cx_total: registry.counter(&format!("{REDIS_POOL}.cx_total")),
            cx_local_close: registry.counter(&format!("{REDIS_POOL}.cx_local_close")),
        }
    }

    /// A connection opened.
    pub(crate) fn opened(&self) {
        self.cx_total.inc();
        self.cx_active.add(1);
    }

    /// A connection closed.
    pub(crate) fn closed(&self) {
        self.cx_active.sub(1);
        self.cx_local_close.inc();
    }
}

/// The local over-limit cache's statistics (upstream's `localCacheStats`,
/// gauges of freecache's counts; its `averageAccessTime` has no
/// counterpart). Each is set as it changes.
#[derive(Clone, Default)]
pub(crate) struct LocalCacheStats {
    /// `ratelimit.localcache.hitCount`: lookups a cached denial answered.
    pub hit_count: Gauge,
    /// `ratelimit.localcache.missCount`: lookups it did not.
    pub miss_count: Gauge,
    /// `ratelimit.localcache.lookupCount`: lookups.
    pub lookup_count: Gauge,
    /// `ratelimit.localcache.entryCount`: entries held now.
    pub entry_count: Gauge,
    /// `ratelimit.localcache.evacuateCount`: live entries evicted for room.
    pub evacuate_count: Gauge,
    /// `ratelimit.localcache.expiredCount`: entries found or evicted past
    /// their denial.
    pub expired_count: Gauge,
    /// `ratelimit.localcache.overwriteCount`: entries a newer denial
    /// replaced.
    pub overwrite_count: Gauge,
}

impl LocalCacheStats {
    /// The local cache's statistics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        let gauge = |stat: &str| registry.gauge(&format!("{LOCAL_CACHE}.{stat}"));
        Self {
            hit_count: gauge("hitCount"),
            miss_count: gauge("missCount"),
            lookup_count: gauge("lookupCount"),
            entry_count: gauge("entryCount"),
            evacuate_count: gauge("evacuateCount"),
            expired_count: gauge("expiredCount"),
            overwrite_count: gauge("overwriteCount"),
        }
    }
}

/// One descriptor's hits, split as upstream splits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleHits {
    /// Hits asked for.
    pub total: u64,
    /// Hits within the limit.
    pub within: u64,
    /// Hits within but near the limit (upstream's near_limit).
    pub near: u64,
    /// Hits over the limit.
    pub over: u64,
    /// Hits over the limit answered from the local over-limit cache.
    pub over_local_cache: u64,
    /// Hits over the limit let through by the rule's shadow mode.
    pub shadow: u64,
}

/// One rule's statistics (upstream's `RateLimitStats`), named by its key:
/// `ratelimit.service.rate_limit.<key>.<stat>`.
pub struct RuleStats {
    total_hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    over_limit_with_local_cache: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

impl RuleStats {
    /// The statistics of the rule keyed `key` (`<domain>.<key>[_<value>]...`,
    /// sanitized here as upstream does).
    pub fn new(registry: &Registry, key: &str) -> Self {
        let key = sanitize(key);
        let counter = |stat: &str| registry.counter(&format!("{RATE_LIMIT}.{key}.{stat}"));
        Self {
            total_hits: counter("total_hits"),
            over_limit: counter("over_limit"),
            near_limit: counter("near_limit"),
            over_limit_with_local_cache: counter("over_limit_with_local_cache"),
            within_limit: counter("within_limit"),
            shadow_mode: counter("shadow_mode"),
        }
    }

    /// Adds one request's hits.
    pub fn record(&self, hits: &RuleHits) {
        self.total_hits.add(hits.total);
        self.within_limit.add(hits.within);
        self.near_limit.add(hits.near);
        self.over_limit.add(hits.over);
        self.over_limit_with_local_cache.add(hits.over_local_cache);
        self.shadow_mode.add(hits.shadow);
    }
}

/// `ratelimit.service.rate_limit.<domain>.domain_not_found`.
pub(crate) fn domain_not_found(registry: &Registry, domain: &str) -> Counter {
    registry.counter(&format!(
        "{RATE_LIMIT}.{}.domain_not_found",
        sanitize(domain)
    ))
}
