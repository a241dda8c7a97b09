//! The HTTP listeners' options: where the service listener is (on by
//! default, on loopback: `/healthcheck`, `/json`, the `/v1` API, health
//! and its OpenAPI document), how long it waits for a request's body, and
//! where the debug endpoints are (off by default); the admin API's token
//! ([`AdminOptions`]).

use std::time::Duration;

use super::admin::AdminOptions;
use crate::options::{AddressOrOff, address_or_off, positive_duration};

/// Where the HTTP side is served.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "HTTP and debug listeners")]
pub struct HttpOptions {
    /// Address to serve HTTP/1.1 on: the web console (`/`), the JSON API
    /// (`POST /v1/check`, `POST /v1/check-many`), `/healthz`, `/readyz`,
    /// `/openapi.json`, `/healthcheck` (200 `OK` while health is SERVING,
    /// else 500) and `/json` (ShouldRateLimit in proto3's JSON mapping).
    /// Optional: empty turns it off (a second instance on one host needs
    /// another address, or none).
    #[arg(long, env = "RATELIMITD_HTTP_LISTEN", default_value = "127.0.0.1:8080",
          value_parser = address_or_off)]
    pub http_listen: AddressOrOff,

    /// Longest the HTTP listeners wait for a request's headers (slower: the
    /// connection is closed) and then for its body, to its last byte
    /// (slower: 408 Request Timeout), so a client that sends slowly cannot
    /// hold a connection open for ever.
    #[arg(long, env = "RATELIMITD_HTTP_READ_TIMEOUT", default_value = "5s",
          value_parser = positive_duration)]
    pub http_read_timeout: Duration,

    /// Address to serve the debug endpoints on: `/rlconfig` (the rules in
    /// force, as text), `/metrics` (Prometheus text), and `/` listing them.
    /// Unset or empty: none.
    #[arg(long, env = "RATELIMITD_DEBUG_LISTEN", default_value = "", hide_default_value = true,
          value_parser = address_or_off)]
    pub debug_listen: AddressOrOff,

    /// The admin API on the HTTP listener, when a token is given.
    #[command(flatten)]
    pub admin: AdminOptions,
}
