//! The HTTP listeners' options: where `/healthcheck` and `/json` are
//! served (on by default, on loopback), and where the debug endpoints are
//! (off by default).

use crate::options::{AddressOrOff, address_or_off};

/// Where the HTTP side is served.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "HTTP and debug listeners")]
pub struct HttpOptions {
    /// Address to serve HTTP/1.1 on: `/healthcheck` (200 `OK` while
    /// health is SERVING, else 500) and `/json` (ShouldRateLimit in
    /// proto3's JSON mapping). Empty: no HTTP listener.
    #[arg(long, env = "RATELIMITD_HTTP_LISTEN", default_value = "127.0.0.1:8080",
          value_parser = address_or_off)]
    pub http_listen: AddressOrOff,

    /// Address to serve the debug endpoints on: `/rlconfig` (the rules in
    /// force, as text), `/metrics` (Prometheus text), and `/` listing them.
    /// Unset or empty: none.
    #[arg(long, env = "RATELIMITD_DEBUG_LISTEN", default_value = "", hide_default_value = true,
          value_parser = address_or_off)]
    pub debug_listen: AddressOrOff,
}
