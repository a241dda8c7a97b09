//! The lease service's options (see docs/leases.md), and the settings
//! they become. What may be leased, and each lease's bounds, is the
//! policies file's: `lease: true` on each limit.

use std::time::Duration;

use super::LeaseSettings;
use crate::options::{count, positive_duration};

/// Leases for application servers.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Leases for application servers")]
pub struct LeaseOptions {
    /// Most leases (one policy and key each) one client's stream may hold;
    /// asks for more are refused with RESOURCE_EXHAUSTED, and the client
    /// decides those by CheckLimit.
    #[arg(long, env = "RATELIMITD_LEASE_MAX_PER_STREAM", default_value_t = 10_000,
          value_parser = count())]
    pub lease_max_per_stream: usize,

    /// Most leases all clients' streams may hold on this instance together
    /// (about 1 KiB each); asks for more are refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "RATELIMITD_LEASE_MAX", default_value_t = 100_000,
          value_parser = count())]
    pub lease_max: usize,

    /// How often a lease's fair share of its policy is settled again among
    /// every client leasing it, at most (one store call per lease each
    /// time); renewals in between are sized from the share last settled.
    /// A client whose share is under 90% of its fair share at its demand
    /// (its demand rose) settles again after an eighth of this.
    #[arg(long, env = "RATELIMITD_LEASE_SETTLE_INTERVAL", default_value = "2s",
          value_parser = positive_duration)]
    pub lease_settle_interval: Duration,

    /// What each client's share allows beyond its measured demand, in
    /// percent of it, so it can grow before its share is settled again.
    /// Under contention a client below the fair level leaves its headroom
    /// unused, so this is kept small.
    #[arg(long, env = "RATELIMITD_LEASE_HEADROOM", default_value_t = 5,
          value_parser = clap::value_parser!(u16).range(0..=100))]
    pub lease_headroom: u16,
}

impl LeaseOptions {
    /// The lease service's settings.
    pub fn settings(&self) -> LeaseSettings {
        LeaseSettings {
            max_per_stream: self.lease_max_per_stream,
            max_total: self.lease_max,
            settle_every: self.lease_settle_interval,
            headroom_permille: u64::from(self.lease_headroom) * 10,
        }
    }
}
