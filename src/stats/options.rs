//! The options of envoyproxy/ratelimit's statistics: statsd's address,
//! flush interval and DogStatsD form, the tags every statistic carries, the
//! statsd_exporter mapping of the Prometheus series, and the bound on
//! statistics named after requests.

use std::path::PathBuf;
use std::time::Duration;

use super::mapper::Mapping;
use super::mogrifier::Mogrifier;
use super::statsd::StatsdSettings;
use crate::config_error::ConfigError;
use crate::options::{KeyValues, count, key_values, positive_duration};

/// upstream's default mapping, with the response time in milliseconds
/// (upstream's PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS): its `scale`
/// taken out.
const SCALE_LINE: &str = "    scale: 0.001\n";

/// envoyproxy/ratelimit's statistics.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Statistics (envoyproxy/ratelimit's names)")]
pub struct StatsOptions {
    /// Send envoyproxy/ratelimit's statistics over statsd (UDP) to this
    /// host:port (a statsd_exporter, a Datadog agent). Unset: not sent.
    #[arg(long, env = "RATELIMITD_STATSD_ADDRESS")]
    pub statsd_address: Option<String>,

    /// How often counters (what they counted since) and gauges (their
    /// value) are sent; timers are sent every second.
    #[arg(long, env = "RATELIMITD_STATSD_FLUSH_INTERVAL", default_value = "10s",
          value_parser = positive_duration)]
    pub statsd_flush_interval: Duration,

    /// Send DogStatsD: the tags as `|#key:value` instead of in the name,
    /// and --statsd-mogrifier applies.
    #[arg(long, env = "RATELIMITD_STATSD_DOGSTATSD", num_args = 0..=1, require_equals = true)]
    pub statsd_dogstatsd: bool,

    /// With --statsd-dogstatsd, rename matching statistics and tag them:
    /// `pattern=<regex>;name=<template>[;tags=<key>:<value>,...]`, `$1`...
    /// the pattern's groups; the first that matches applies. Repeatable.
    #[arg(
        long,
        env = "RATELIMITD_STATSD_MOGRIFIER",
        value_delimiter = '\n',
        requires = "statsd_dogstatsd"
    )]
    pub statsd_mogrifier: Vec<Mogrifier>,

    /// Tags on every statistic, `key:value,...`: in the statsd name as
    /// `.__key=value` (upstream's form), or DogStatsD's tags; the
    /// Prometheus series are mapped from the names with them.
    #[arg(long, env = "RATELIMITD_STATS_TAGS", value_parser = key_values(':'),
          default_value = "")]
    pub stats_tags: KeyValues,

    /// A statsd_exporter mapping file naming the Prometheus series of
    /// these statistics at --metrics-listen. Unset: envoyproxy/ratelimit's
    /// default mapping.
    #[arg(long, env = "RATELIMITD_STATS_MAPPING")]
    pub stats_mapping: Option<PathBuf>,

    /// With the default mapping, observe response times in milliseconds
    /// rather than seconds.
    #[arg(long, env = "RATELIMITD_STATS_MAPPING_MILLISECONDS", num_args = 0..=1,
          require_equals = true, conflicts_with = "stats_mapping")]
    pub stats_mapping_milliseconds: bool,

    /// At most this many rules' statistics named after a request's values
    /// (`detailed_metric`, `value_to_metric`, a limit sent with the
    /// request, an unknown domain) are held at once; the least used go,
    /// and come back at 0 (statsd counters send what changed, so totals
    /// stay right).
    #[arg(long, env = "RATELIMITD_STATS_REQUEST_NAMES", default_value = "10000",
          value_parser = count())]
    pub stats_request_names: usize,
}

impl StatsOptions {
    /// Where statsd goes, if anywhere.
    pub fn statsd(&self) -> Option<StatsdSettings> {
        Some(StatsdSettings {
            address: self.statsd_address.clone()?,
            flush_interval: self.statsd_flush_interval,
            dogstatsd: self.statsd_dogstatsd.then(|| self.statsd_mogrifier.clone()),
        })
    }

    /// The mapping of the Prometheus series: the file's, or upstream's
    /// default.
    pub fn mapping(&self) -> Result<Mapping, ConfigError> {
        let text = match &self.stats_mapping {
            Some(path) => {
                std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
                    flag: "stats_mapping",
                    path: path.clone(),
                    source,
                })?
            }
            None if self.stats_mapping_milliseconds => DEFAULT_MAPPING.replacen(SCALE_LINE, "", 1),
            None => DEFAULT_MAPPING.to_owned(),
        };
        Mapping::parse(&text).map_err(|err| {
            let file = self.stats_mapping.as_ref().map_or_else(
                || "the default mapping".to_owned(),
                |p| p.display().to_string(),
            );
            ConfigError::invalid("stats_mapping", format!("{file}: {err}"))
        })
    }
}

/// envoyproxy/ratelimit's default statsd_exporter mapping.
pub(crate) const DEFAULT_MAPPING: &str = include_str!("default_mapper.yaml");
