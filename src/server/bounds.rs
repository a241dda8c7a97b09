//! Bounds on what one peer, connection or request may hold or ask, and the
//! settings of each part that enforces them: the accept loop, the
//! decision slots, the HTTP/2 server, and each API's request checks.

use std::time::Duration;

use crate::api::envoy::RequestBounds;
use crate::decider::CheckBounds;
use crate::incoming::{IncomingSettings, ShutdownStarted};
use crate::limiter::script::MAX_LIMITS_PER_SCRIPT;
use crate::options::{DurationOrOff, count, duration_or_off, positive_duration};

/// Bounds per peer, connection and request.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Bounds")]
pub struct BoundsOptions {
    /// Largest request message accepted, in bytes (larger: OUT_OF_RANGE).
    #[arg(long, env = "RATELIMITD_MAX_REQUEST_BYTES", default_value_t = 1 << 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_request_bytes: u32,

    /// Most calls in flight at once, over all connections; more get
    /// RESOURCE_EXHAUSTED at once rather than queueing.
    #[arg(long, env = "RATELIMITD_MAX_CONCURRENT_REQUESTS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_requests: u32,

    /// Most calls in flight from one client IP address (more get
    /// RESOURCE_EXHAUSTED at once); unset, 90% of --max-concurrent-requests,
    /// so no one peer can take every slot.
    #[arg(long, env = "RATELIMITD_MAX_CONCURRENT_REQUESTS_PER_PEER",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_requests_per_peer: Option<u32>,

    /// Most client connections open at once; at the cap new connections
    /// wait in the kernel's backlog until one closes.
    #[arg(long, env = "RATELIMITD_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = count())]
    pub max_connections: usize,

    /// Most client connections open at once from one IP address (loopback
    /// included); more are closed as soon as they are accepted.
    #[arg(long, env = "RATELIMITD_MAX_CONNECTIONS_PER_IP", default_value_t = 1024,
          value_parser = count())]
    pub max_connections_per_ip: usize,

    /// Most calls one HTTP/2 connection may have open at once
    /// (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused by HTTP/2.
    #[arg(long, env = "RATELIMITD_MAX_CONCURRENT_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_streams: u32,

    /// Longest a call may take from its headers to its answer, reading its
    /// request included; past it the call is answered CANCELLED.
    #[arg(long, env = "RATELIMITD_REQUEST_TIMEOUT", default_value = "5s",
          value_parser = positive_duration)]
    pub request_timeout: Duration,

    /// A connection with no call and no stream open this long is closed
    /// ("0s": never).
    #[arg(long, env = "RATELIMITD_IDLE_TIMEOUT", default_value = "5m",
          value_parser = duration_or_off)]
    pub idle_timeout: DurationOrOff,

    /// How often to PING an HTTP/2 connection that sends nothing, to find
    /// dead peers ("0s": never).
    #[arg(long, env = "RATELIMITD_HTTP2_KEEPALIVE_INTERVAL", default_value = "30s",
          value_parser = duration_or_off)]
    pub http2_keepalive_interval: DurationOrOff,

    /// How long a PING may go unanswered before the connection is closed.
    #[arg(long, env = "RATELIMITD_HTTP2_KEEPALIVE_TIMEOUT", default_value = "10s",
          value_parser = positive_duration)]
    pub http2_keepalive_timeout: Duration,

    /// Idle time before TCP keepalive probes start on a connection ("0s":
    /// off).
    #[arg(long, env = "RATELIMITD_TCP_KEEPALIVE", default_value = "60s",
          value_parser = duration_or_off)]
    pub tcp_keepalive: DurationOrOff,

    /// Most descriptors one ShouldRateLimit may carry (more:
    /// INVALID_ARGUMENT). Envoy sends a handful.
    #[arg(long, env = "RATELIMITD_MAX_DESCRIPTORS", default_value_t = RequestBounds::DEFAULT_MAX_DESCRIPTORS,
          value_parser = count())]
    pub max_descriptors: usize,

    /// Most entries one descriptor may carry (more: INVALID_ARGUMENT).
    #[arg(long, env = "RATELIMITD_MAX_DESCRIPTOR_ENTRIES", default_value_t = RequestBounds::DEFAULT_MAX_ENTRIES,
          value_parser = count())]
    pub max_descriptor_entries: usize,

    /// Longest descriptor entry key or value, in bytes (longer:
    /// INVALID_ARGUMENT).
    #[arg(long, env = "RATELIMITD_MAX_DESCRIPTOR_ENTRY_BYTES", default_value_t = RequestBounds::DEFAULT_MAX_ENTRY_BYTES,
          value_parser = count())]
    pub max_descriptor_entry_bytes: usize,

    /// Most limits one CheckLimit may carry in `limits` (more:
    /// INVALID_ARGUMENT). Every limit of a request is decided in one Redis
    /// script when its keys share a node; the default is what one script
    /// decides.
    #[arg(long, env = "RATELIMITD_MAX_LIMITS_PER_REQUEST", default_value_t = MAX_LIMITS_PER_SCRIPT,
          value_parser = count())]
    pub max_limits_per_request: usize,

    /// Most requests one CheckLimits batch may carry (more:
    /// INVALID_ARGUMENT for the whole call), as gubernator bounds its
    /// batches.
    #[arg(long, env = "RATELIMITD_MAX_BATCH_SIZE", default_value_t = 1000,
          value_parser = count())]
    pub max_batch_size: usize,
}

impl BoundsOptions {
    /// Calls in flight from one peer: as given, or 90% of all (at least 1).
    pub fn max_concurrent_requests_per_peer(&self) -> usize {
        let all = self.max_concurrent_requests;
        self.max_concurrent_requests_per_peer
            .unwrap_or(all - all / 10)
            .max(1) as usize
    }

    /// How many connections are accepted and how long they are kept.
    pub(crate) fn connections(&self, shutting_down: ShutdownStarted) -> IncomingSettings {
        IncomingSettings {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            tcp_keepalive: self.tcp_keepalive.get(),
            idle_timeout: self.idle_timeout.get(),
            shutting_down,
        }
    }

    /// What one ShouldRateLimit may carry.
    pub fn envoy_request(&self) -> RequestBounds {
        RequestBounds {
            max_descriptors: self.max_descriptors,
            max_entries: self.max_descriptor_entries,
            max_entry_bytes: self.max_descriptor_entry_bytes,
        }
    }

    /// What one CheckLimit or CheckLimits may carry.
    pub fn check_request(&self) -> CheckBounds {
        CheckBounds {
            max_limits: self.max_limits_per_request,
            max_batch: self.max_batch_size,
        }
    }
}
