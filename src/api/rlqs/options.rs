//! The quota service's options: how assignments are made and kept, and the
//! settings they become. Its policies are the configuration's
//! `quota_buckets`; the Envoy face's shadow mode and the failure policy
//! apply to it too.

use std::time::Duration;

use crate::api::envoy::RequestBounds;
use crate::limit::FailurePolicy;
use crate::options::{count, positive_duration, whole_seconds};

/// The Envoy quota service (RLQS): how assignments are made and kept.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Envoy quota service (RLQS)")]
pub struct QuotaOptions {
    /// How long an assignment holds at an Envoy unless renewed, in whole
    /// seconds (Envoy ignores fractions). Renewed at the Envoy's reports
    /// (every 5 s in Envoy 1.40) or the rebalance tick, by half-way through
    /// it; when the service is gone, the Envoy falls back to its
    /// expired_assignment_behavior this long after the last one.
    #[arg(long, env = "RATELIMITD_QUOTA_ASSIGNMENT_TTL", default_value = "15s",
          value_parser = whole_seconds)]
    pub quota_assignment_ttl: Duration,

    /// A bucket an Envoy has not reported for this long is dropped: its
    /// share is freed and the Envoy told to abandon it.
    #[arg(long, env = "RATELIMITD_QUOTA_SUBSCRIBER_TIMEOUT", default_value = "15s",
          value_parser = positive_duration)]
    pub quota_subscriber_timeout: Duration,

    /// On a shared Redis: an instance that has not beaten for this long is
    /// dead. Its Envoys' demand stops counting, and their shares go to the
    /// others once as many Envoys have subscribed again on live instances
    /// (within this, a quarter of the rebalance interval, and two rebalance
    /// intervals, or when they subscribe if later), or else once their
    /// assignments have run out (the assignment's time to live and 1 s
    /// after their last settlement, and a rebalance interval). Envoys move
    /// to another instance at their next report (every 5 s in Envoy 1.40).
    /// Each instance beats every quarter of this or of the rebalance
    /// interval, whichever is shorter.
    #[arg(long, env = "RATELIMITD_QUOTA_INSTANCE_TIMEOUT", default_value = "5s",
          value_parser = positive_duration)]
    pub quota_instance_timeout: Duration,

    /// How often each stream settles its contended buckets again (those
    /// with subscribers elsewhere, or short of their fair share), so that
    /// shares move between the Envoys of different instances within this
    /// rather than at each Envoy's next report: one store call per
    /// contended bucket and stream each time.
    #[arg(long, env = "RATELIMITD_QUOTA_REBALANCE_INTERVAL", default_value = "1s",
          value_parser = positive_duration)]
    pub quota_rebalance_interval: Duration,

    /// What each Envoy is given beyond its reported demand, in percent of
    /// it, so it can grow before its next report.
    #[arg(long, env = "RATELIMITD_QUOTA_HEADROOM", default_value_t = 20,
          value_parser = clap::value_parser!(u16).range(0..=100))]
    pub quota_headroom: u16,

    /// Most buckets one Envoy stream may subscribe to; reports of more are
    /// ignored (and counted).
    #[arg(long, env = "RATELIMITD_QUOTA_MAX_BUCKETS_PER_STREAM", default_value_t = 10_000,
          value_parser = count())]
    pub quota_max_buckets_per_stream: usize,

    /// Most buckets all Envoy streams of this instance may subscribe to
    /// together (about 1.4 KiB each on the embedded store); reports of more
    /// are ignored (and counted).
    #[arg(long, env = "RATELIMITD_QUOTA_MAX_BUCKETS", default_value_t = 100_000,
          value_parser = count())]
    pub quota_max_buckets: usize,
}

impl QuotaOptions {
    /// The quota service's settings: these options, with the bucket ids
    /// bounded as the Envoy face bounds descriptors, a report's size as any
    /// request's (`max_report_bytes`, --max-request-bytes), and the Envoy face's
    /// shadow mode, the failure policy and the key prefix in force.
    pub fn settings(
        &self,
        bounds: &RequestBounds,
        max_report_bytes: usize,
        shadow_mode: bool,
        failure_policy: FailurePolicy,
        key_prefix: &str,
    ) -> QuotaSettings {
        QuotaSettings {
            assignment_ttl: self.quota_assignment_ttl,
            subscriber_timeout: self.quota_subscriber_timeout,
            instance_timeout: self.quota_instance_timeout,
            rebalance_interval: self.quota_rebalance_interval,
            headroom_permille: u64::from(self.quota_headroom) * 10,
            max_buckets_per_stream: self.quota_max_buckets_per_stream,
            max_buckets: self.quota_max_buckets,
            max_entries: bounds.max_entries,
            max_entry_bytes: bounds.max_entry_bytes,
            max_report_bytes,
            shadow_mode,
            failure_policy,
            key_prefix: key_prefix.to_owned(),
        }
    }
}

impl QuotaSettings {
    /// How often this instance beats and reads the others' nudges: a
    /// quarter of the instance timeout or of the rebalance interval,
    /// whichever is shorter (so a beat never runs out between two).
    pub fn beat_interval(&self) -> Duration {
        (self.instance_timeout.min(self.rebalance_interval) / 4).max(Duration::from_millis(10))
    }
}

/// Server-wide settings of the quota service.
#[derive(Debug, Clone)]
pub struct QuotaSettings {
    /// How long an assignment holds at an Envoy unless renewed (renewed
    /// at the Envoy's reports or the rebalance tick, by half-way through
    /// it: see `Shared::renew_after`).
    pub assignment_ttl: Duration,
    /// A bucket not reported for this long is dropped from its stream:
    /// its share freed, the Envoy told to abandon it.
    pub subscriber_timeout: Duration,
    /// An instance that has not beaten for this long is dead (on Redis).
    pub instance_timeout: Duration,
    /// What a subscriber wants beyond its demand, per mille.
    pub headroom_permille: u64,
    /// How often each stream drops the buckets Envoy stopped reporting and
    /// settles its contended buckets again.
    pub rebalance_interval: Duration,
    /// Most buckets one stream may subscribe to.
    pub max_buckets_per_stream: usize,
    /// Most buckets all streams of this instance may subscribe to together.
    pub max_buckets: usize,
    /// Most pairs in a `BucketId`.
    pub max_entries: usize,
    /// Most bytes in a `BucketId` key or value.
    pub max_entry_bytes: usize,
    /// Most bytes in one message of usage reports (--max-request-bytes,
    /// enforced by tonic's decoder).
    pub max_report_bytes: usize,
    /// Assignments are worked out and counted, and every Envoy is told to
    /// allow all.
    pub shadow_mode: bool,
    /// What answers while the store cannot.
    pub failure_policy: FailurePolicy,
    /// The prefix of every storage key.
    pub key_prefix: String,
}
