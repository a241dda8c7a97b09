//! envoyproxy/ratelimit's statistics, named once, here, as upstream names
//! them (lyft/gostats' dot-separated statsd names: `ratelimit.service.
//! rate_limit.<domain>.<key>.total_hits`, `ratelimit_server.ShouldRateLimit
//! .total_requests`, ...), and sent where upstream sends them: over statsd
//! (`statsd`), and as Prometheus series named by a statsd_exporter
//! mapping ([`mapper`], upstream's default one unless another is given)
//! beside ratelimitd's own metrics at `--metrics-listen`.
//!
//! Recording never takes a lock: each statistic is a handle onto atomics,
//! made once per name (a rule's when the rule is first used). Statistics
//! named after a request's values (`detailed_metric`, `value_to_metric`,
//! a limit sent with the request, an unknown domain) are made per distinct
//! name and held in a bounded cache (`--stats-request-names`).
//!
//! Off (every handle a no-op) unless statsd or the metrics endpoint is on.

pub mod mapper;
pub(crate) mod mogrifier;
pub(crate) mod names;
pub(crate) mod options;
pub(crate) mod prometheus;
pub(crate) mod registry;
pub(crate) mod server;
pub(crate) mod statsd;
pub(crate) mod upstream;

use std::sync::{Arc, OnceLock};

use quick_cache::sync::Cache;
use tracing::{info, warn};

use self::mapper::Mapping;
use self::names::Tags;
pub use self::options::StatsOptions;
use self::prometheus::Prometheus;
pub(crate) use self::registry::{Counter, Gauge};
use self::registry::{Registry, TIMER_QUEUE};
pub(crate) use self::server::ServerStatsLayer;
pub(crate) use self::upstream::{LocalCacheStats, PoolStats, RuleHits, RuleStats};
use self::upstream::{MethodStats, ServiceStats, domain_not_found};

/// The statistics of this process, once installed.
static STATS: OnceLock<Stats> = OnceLock::new();

/// Every statistic, and the groups made at start.
struct Stats {
    registry: Arc<Registry>,
    service: ServiceStats,
    pool: PoolStats,
    should_rate_limit: MethodStats,
    health_check: MethodStats,
    by_request: Cache<String, Arc<RuleStats>>,
    domains: Cache<String, Counter>,
}

/// Turns statistics on, as `options` say, with Prometheus series named by
/// `mapping` when the metrics endpoint is on: call once, inside the tokio
/// runtime, before anything is counted. Nothing happens when neither
/// statsd nor the endpoint is on; a second call changes nothing.
pub(crate) fn install(options: &StatsOptions, mapping: Option<Mapping>) {
    let statsd = options.statsd();
    if statsd.is_none() && mapping.is_none() {
        return;
    }
    if STATS.get().is_some() {
        warn!("statistics are already on in this process; kept as they are");
        return;
    }
    let tags = Tags::new(&options.stats_tags.0);
    let (timers, queued) = match statsd {
        Some(_) => {
            let (sender, receiver) = tokio::sync::mpsc::channel(TIMER_QUEUE);
            (Some(sender), Some(receiver))
        }
        None => (None, None),
    };
    let registry = Arc::new(Registry::new(tags, mapping.map(Prometheus::new), timers));
    let capacity = options.stats_request_names;
    let stats = Stats {
        service: ServiceStats::new(&registry),
        pool: PoolStats::new(&registry),
        should_rate_limit: MethodStats::new(&registry, "ShouldRateLimit"),
        health_check: MethodStats::new(&registry, "Check"),
        by_request: Cache::new(capacity),
        domains: Cache::new(capacity),
        registry: registry.clone(),
    };
    if STATS.set(stats).is_err() {
        return;
    }
    if let (Some(settings), Some(queued)) = (statsd, queued) {
        info!(address = %settings.address, interval = ?settings.flush_interval,
              dogstatsd = settings.dogstatsd.is_some(), "sending statistics over statsd");
        tokio::spawn(statsd::run(registry, settings, queued));
    }
}

/// Whether statistics are on.
pub(crate) fn enabled() -> bool {
    STATS.get().is_some()
}

/// A configuration load (the first, or a reload) that took, or did not.
pub(crate) fn config_load(succeeded: bool) {
    if let Some(stats) = STATS.get() {
        match succeeded {
            true => stats.service.config_load_success.inc(),
            false => stats.service.config_load_error.inc(),
        }
    }
}

/// A failed `ShouldRateLimit`: on Redis (`redis_error`) or anything else
/// (`service_error`).
pub(crate) fn should_rate_limit_error(redis: bool) {
    if let Some(stats) = STATS.get() {
        match redis {
            true => stats.service.redis_error.inc(),
            false => stats.service.service_error.inc(),
        }
    }
}

/// A request global shadow mode answered OK although it was over.
pub(crate) fn global_shadow_mode() {
    if let Some(stats) = STATS.get() {
        stats.service.global_shadow_mode.inc();
    }
}

/// The local over-limit cache's statistics (no-ops when off); made when
/// asked, so that they exist only when the cache is on.
pub(crate) fn local_cache() -> LocalCacheStats {
    STATS
        .get()
        .map(|stats| LocalCacheStats::new(&stats.registry))
        .unwrap_or_default()
}

/// The Redis pool's statistics (no-ops when off).
pub(crate) fn pool() -> PoolStats {
    STATS
        .get()
        .map(|stats| stats.pool.clone())
        .unwrap_or_default()
}

/// A server method's statistics, when on.
fn method(name: &str) -> Option<MethodStats> {
    let stats = STATS.get()?;
    match name {
        "ShouldRateLimit" => Some(stats.should_rate_limit.clone()),
        "Check" => Some(stats.health_check.clone()),
        _ => None,
    }
}

/// The statistics of a configured rule, keyed `key` (`<domain>.<path>`),
/// when on: hold them (they are made per call).
pub(crate) fn rule(key: &str) -> Option<Arc<RuleStats>> {
    let stats = STATS.get()?;
    Some(Arc::new(RuleStats::new(&stats.registry, key)))
}

/// The statistics keyed by a request's values, from the bounded cache.
pub(crate) fn request_rule(key: &str) -> Option<Arc<RuleStats>> {
    let stats = STATS.get()?;
    if let Some(found) = stats.by_request.get(key) {
        return Some(found);
    }
    let made = Arc::new(RuleStats::new(&stats.registry, key));
    stats.by_request.insert(key.to_owned(), made.clone());
    Some(made)
}

/// A descriptor of a domain no configuration has.
pub(crate) fn unknown_domain(domain: &str) {
    let Some(stats) = STATS.get() else { return };
    let counter = match stats.domains.get(domain) {
        Some(counter) => counter,
        None => {
            let made = domain_not_found(&stats.registry, domain);
            stats.domains.insert(domain.to_owned(), made.clone());
            made
        }
    };
    counter.inc();
}
