//! The command line, with a `RATELIMITD_*` environment fallback for every
//! flag, parsed into one checked [`Config`] in groups (listener, store,
//! failure policy, Envoy rules, limits, telemetry; each a help section).
//! Secrets are held in types whose `Debug` hides them, so the whole
//! configuration can be logged; files are read once, by
//! [`Config::read_at_start`].

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::{CommandFactory, FromArgMatches, Parser};

use crate::api::envoy::RequestBounds;
use crate::api::envoy::xds::{XdsSettings, XdsTls};
use crate::limit::FailurePolicy;
use crate::limiter::DEFAULT_KEY_PREFIX;
use crate::store::{Credentials, RedisSettings, RedisTls, Topology};
use crate::telemetry::{LogFormat, LogLevel};

pub mod envoyproxy_env;

/// ratelimitd: answers "may this key spend this much now?" over gRPC.
///
/// Without --redis-url, state lives in this process (the embedded store) and
/// is not shared with other instances.
#[derive(Clone, Debug, Parser)]
#[command(version, about)]
pub struct Config {
    /// Where and how gRPC is served.
    #[command(flatten)]
    pub listener: ListenerConfig,

    /// Where counters live.
    #[command(flatten)]
    pub store: StoreConfig,

    /// What answers while Redis cannot.
    #[command(flatten)]
    pub failure: FailureConfig,

    /// The Envoy face.
    #[command(flatten)]
    pub envoy: EnvoyConfig,

    /// The Envoy quota service (RLQS).
    #[command(flatten)]
    pub quota: QuotaConfig,

    /// Bounds per peer, connection and request.
    #[command(flatten)]
    pub limits: LimitsConfig,

    /// Logs and metrics.
    #[command(flatten)]
    pub telemetry: TelemetryConfig,
}

/// Where and how gRPC is served: the address, TLS, reflection, shutdown.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Listener and TLS")]
pub struct ListenerConfig {
    /// Address to serve gRPC on.
    #[arg(long, env = "RATELIMITD_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Once the gRPC listener is bound, write its address (`host:port`) to
    /// this file: with `--listen 127.0.0.1:0`, how a supervisor or a test
    /// learns the port the system chose. Written whole (to a temporary file
    /// beside it, then renamed), so a reader never sees half of it.
    #[arg(long, env = "RATELIMITD_ADDRESS_FILE")]
    pub address_file: Option<PathBuf>,

    /// After SIGTERM, longest wait for calls in flight before exiting anyway.
    #[arg(long, env = "RATELIMITD_SHUTDOWN_GRACE", default_value = "10s",
          value_parser = positive_duration)]
    pub shutdown_grace: Duration,

    /// PEM certificate chain for serving gRPC over TLS (with --tls-key).
    #[arg(long, env = "RATELIMITD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "RATELIMITD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates: clients must present a certificate signed by one
    /// (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "RATELIMITD_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca: a name (DNS or IP) the client's certificate
    /// must carry among its subject alternative names.
    #[arg(long, env = "RATELIMITD_TLS_CLIENT_SAN", requires = "tls_client_ca")]
    pub tls_client_san: Option<String>,

    /// How often to look whether --tls-cert or --tls-key changed on disk;
    /// a changed pair that loads serves new connections.
    #[arg(long, env = "RATELIMITD_TLS_RELOAD_INTERVAL", default_value = "1s",
          value_parser = positive_duration)]
    pub tls_reload_interval: Duration,

    /// Serve gRPC server reflection (grpcurl, grpcui and alike list and call
    /// the services without the .proto files). `--reflection=false` removes
    /// it.
    #[arg(long, env = "RATELIMITD_REFLECTION", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub reflection: bool,
}

/// Where counters live: Redis (standalone, Cluster or Sentinel) or, without --redis-url, the embedded store.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Store")]
pub struct StoreConfig {
    /// Redis to keep counters in, e.g. redis://127.0.0.1:6379/0 (user and
    /// password go in the URL; rediss:// for TLS). With --redis-mode cluster,
    /// seed nodes; with sentinel, the sentinels: repeat the flag or separate
    /// URLs with commas. Unset: the embedded in-memory store.
    #[arg(long, env = "RATELIMITD_REDIS_URL", value_delimiter = ',')]
    pub redis_url: Vec<RedisUrl>,

    /// What --redis-url names: one standalone server, a Redis Cluster, or
    /// Sentinels watching a primary (see --redis-sentinel-master).
    #[arg(
        long,
        env = "RATELIMITD_REDIS_MODE",
        value_enum,
        default_value = "standalone"
    )]
    pub redis_mode: RedisMode,

    /// With --redis-mode sentinel: the name the sentinels monitor the
    /// primary under. Its password and database come from the first URL.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_SENTINEL_MASTER",
        default_value = "mymaster"
    )]
    pub redis_sentinel_master: String,

    /// With --redis-mode sentinel, when the sentinels' credentials differ
    /// from the primary's (those in the URLs): `password`, `user:password`,
    /// or empty for sentinels without a password.
    #[arg(long, env = "RATELIMITD_REDIS_SENTINEL_AUTH")]
    pub redis_sentinel_auth: Option<Secret>,

    /// For rediss:// URLs: PEM CA certificates to trust instead of the
    /// system's.
    #[arg(long, env = "RATELIMITD_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,

    /// For rediss:// URLs: a PEM client certificate (with
    /// --redis-tls-key), for a Redis with tls-auth-clients.
    #[arg(long, env = "RATELIMITD_REDIS_TLS_CERT", requires = "redis_tls_key")]
    pub redis_tls_cert: Option<PathBuf>,

    /// The PEM private key of --redis-tls-cert.
    #[arg(long, env = "RATELIMITD_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    pub redis_tls_key: Option<PathBuf>,

    /// Prefix of every storage key, to share one Redis between services.
    #[arg(long, env = "RATELIMITD_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,

    /// Most Redis connections held open at once.
    #[arg(long, env = "RATELIMITD_REDIS_POOL_SIZE", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub redis_pool_size: u16,

    /// Longest wait to open a Redis connection.
    #[arg(long, env = "RATELIMITD_REDIS_CONNECT_TIMEOUT", default_value = "1s",
          value_parser = positive_duration)]
    pub redis_connect_timeout: Duration,

    /// Longest one decision may wait on Redis (pool, command and reply)
    /// before the call fails with UNAVAILABLE.
    #[arg(long, env = "RATELIMITD_REDIS_COMMAND_TIMEOUT", default_value = "100ms",
          value_parser = positive_duration)]
    pub redis_command_timeout: Duration,

    /// Keys this instance remembers Redis denied (until their denial lifts),
    /// to answer a flood on them without Redis; 0 turns the cache off. A
    /// cached denial only answers the same limit and the same or a larger
    /// cost, so it never denies what Redis would allow (but a key deleted by
    /// hand in Redis stays denied here until its retry-after).
    #[arg(long, env = "RATELIMITD_LOCAL_CACHE_SIZE", default_value_t = 100_000)]
    pub local_cache_size: usize,

    /// Most memory the local over-limit cache may take, e.g. `16MiB` (its
    /// estimate: keys and entries); with --local-cache-size, whichever
    /// binds first. 0 turns the cache off.
    #[arg(long, env = "RATELIMITD_LOCAL_CACHE_MAX_BYTES", default_value = "16MiB",
          value_parser = cache_bytes)]
    pub local_cache_max_bytes: usize,

    /// How often the embedded store evicts expired keys.
    #[arg(long, env = "RATELIMITD_MEMORY_SWEEP_INTERVAL", default_value = "5s",
          value_parser = positive_duration)]
    pub memory_sweep_interval: Duration,

    /// Most memory the embedded store's keys may take (its estimate: keys,
    /// state, tables), e.g. `256MiB`. A write past it evicts what expired,
    /// then the keys closest to expiry.
    #[arg(long, env = "RATELIMITD_MEMORY_MAX_BYTES", default_value = "256MiB",
          value_parser = byte_size)]
    pub memory_max_bytes: usize,
}

/// What answers while Redis cannot, and how soon that is noticed.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Failure policy")]
pub struct FailureConfig {
    /// What to answer when Redis cannot decide in time: fail-closed
    /// (UNAVAILABLE), fail-open (allow), or local (decide on this instance's
    /// own embedded store). CheckLimit calls may name their own.
    #[arg(
        long,
        env = "RATELIMITD_FAILURE_POLICY",
        value_enum,
        default_value = "fail-closed"
    )]
    pub failure_policy: FailurePolicy,

    /// Redis failures in a row after which calls stop waiting on Redis (and
    /// the failure policy answers at once) until a health probe succeeds.
    #[arg(long, env = "RATELIMITD_REDIS_BREAKER_THRESHOLD", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub redis_breaker_threshold: u32,

    /// How often health checks that the store answers.
    #[arg(long, env = "RATELIMITD_HEALTH_INTERVAL", default_value = "1s",
          value_parser = positive_duration)]
    pub health_interval: Duration,
}

/// The Envoy face: where its rules come from (files or xDS) and how it answers.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Envoy rules")]
pub struct EnvoyConfig {
    /// envoyproxy/ratelimit configuration for the Envoy face: a YAML file, or
    /// a directory of them (`*.yaml`, `*.yml`; dotfiles ignored). Reloaded
    /// when it changes. Unset: every Envoy domain is unconfigured (OK).
    #[arg(long, env = "RATELIMITD_CONFIG")]
    pub config: Option<PathBuf>,

    /// Which files of a --config directory are rules: `yaml` (`*.yaml` and
    /// `*.yml` directly in it) or `all` (every file in it and its
    /// subdirectories, as envoyproxy/ratelimit's runtime loader reads them).
    #[arg(
        long,
        env = "RATELIMITD_CONFIG_FILES",
        value_enum,
        default_value = "yaml"
    )]
    pub config_files: ConfigFiles,

    /// Read files and directories whose names start with `.` in --config
    /// too (off: skipped, as a Kubernetes ConfigMap's `..data` needs).
    #[arg(long, env = "RATELIMITD_CONFIG_DOTFILES")]
    pub config_dotfiles: bool,

    /// Take the Envoy rules from this xDS management server (`host:port`,
    /// or an `http://` / `https://` URI) instead of --config: a
    /// state-of-the-world ADS stream for `RateLimitConfig` resources, as
    /// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW.
    #[arg(long, env = "RATELIMITD_XDS_SERVER", conflicts_with = "config")]
    pub xds_server: Option<String>,

    /// The node id sent to the xDS server.
    #[arg(long, env = "RATELIMITD_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,

    /// The node's metadata sent to the xDS server: `key=value,key=value`.
    #[arg(long, env = "RATELIMITD_XDS_NODE_METADATA", value_parser = key_values('='),
          default_value = "")]
    pub xds_node_metadata: KeyValues,

    /// Headers sent with the xDS stream: `name:value,name:value`.
    #[arg(long, env = "RATELIMITD_XDS_HEADERS",
          value_parser = key_values(':').map(SecretValues), default_value = "")]
    pub xds_headers: SecretValues,

    /// Speak TLS to the xDS server (system roots, or --xds-tls-ca).
    #[arg(long, env = "RATELIMITD_XDS_TLS")]
    pub xds_tls: bool,

    /// With --xds-tls: PEM CA certificates to trust instead of the system's.
    #[arg(long, env = "RATELIMITD_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,

    /// With --xds-tls: a PEM client certificate (with --xds-tls-key).
    #[arg(long, env = "RATELIMITD_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,

    /// The PEM key of --xds-tls-cert.
    #[arg(long, env = "RATELIMITD_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,

    /// With --xds-tls: the name the server's certificate must carry, when
    /// not its host.
    #[arg(long, env = "RATELIMITD_XDS_TLS_SAN")]
    pub xds_tls_san: Option<String>,

    /// First wait before reconnecting to the xDS server; doubled on each
    /// failure in a row, up to --xds-retry-max, ±50% jitter.
    #[arg(long, env = "RATELIMITD_XDS_RETRY_INTERVAL", default_value = "3s",
          value_parser = positive_duration)]
    pub xds_retry_interval: Duration,

    /// Longest wait before reconnecting to the xDS server.
    #[arg(long, env = "RATELIMITD_XDS_RETRY_MAX", default_value = "60s",
          value_parser = positive_duration)]
    pub xds_retry_max: Duration,

    /// How often to look for changes to --config.
    #[arg(long, env = "RATELIMITD_CONFIG_POLL_INTERVAL", default_value = "1s",
          value_parser = positive_duration)]
    pub config_poll_interval: Duration,

    /// Envoy face: decide, count and log as usual, but answer every request
    /// OK (descriptor statuses still say OVER_LIMIT where they are).
    #[arg(long, env = "RATELIMITD_SHADOW_MODE")]
    pub shadow_mode: bool,

    /// Envoy face: add the IETF RateLimit-Policy and RateLimit headers
    /// (draft-ietf-httpapi-ratelimit-headers) to responses.
    #[arg(long, env = "RATELIMITD_ENVOY_RATELIMIT_HEADERS")]
    pub envoy_ratelimit_headers: bool,

    /// Envoy face: a descriptor over its limit still spends its hits (as
    /// envoyproxy/ratelimit does unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT),
    /// and each descriptor is counted on its own. Off: a denied request
    /// spends nothing on any descriptor.
    #[arg(long, env = "RATELIMITD_ENVOY_COUNT_DENIED_HITS")]
    pub envoy_count_denied_hits: bool,

    /// Envoy face: every descriptor is in quota mode (as `quota_mode: true`
    /// on each rule): the request is denied only when all its quota
    /// descriptors are over.
    #[arg(long, env = "RATELIMITD_ENVOY_QUOTA_MODE")]
    pub envoy_quota_mode: bool,

    /// Envoy face: attach envoyproxy/ratelimit's dynamic metadata (domain,
    /// descriptors, hits, and the `metadata` of the rules that passed) to
    /// each response.
    #[arg(long, env = "RATELIMITD_ENVOY_DYNAMIC_METADATA")]
    pub envoy_dynamic_metadata: bool,

    /// Envoy face: add envoyproxy/ratelimit's three headers (limit,
    /// remaining, reset seconds) of the most restrictive descriptor.
    #[arg(long, env = "RATELIMITD_ENVOY_LIMIT_HEADERS")]
    pub envoy_limit_headers: bool,

    /// Name of --envoy-limit-headers' limit header.
    #[arg(
        long,
        env = "RATELIMITD_ENVOY_LIMIT_HEADER",
        default_value = "RateLimit-Limit"
    )]
    pub envoy_limit_header: String,

    /// Name of --envoy-limit-headers' remaining header.
    #[arg(
        long,
        env = "RATELIMITD_ENVOY_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub envoy_remaining_header: String,

    /// Name of --envoy-limit-headers' reset header.
    #[arg(
        long,
        env = "RATELIMITD_ENVOY_RESET_HEADER",
        default_value = "RateLimit-Reset"
    )]
    pub envoy_reset_header: String,

    /// Read envoyproxy/ratelimit's environment variables (REDIS_URL,
    /// RUNTIME_ROOT, ...; see docs/deployment.md) as aliases of these flags,
    /// with upstream's defaults where ours differ: `auto` when any variable
    /// only upstream uses is set, `always`, or `never`.
    #[arg(
        long,
        env = "RATELIMITD_ENVOYPROXY_ENV",
        value_enum,
        default_value = "auto"
    )]
    pub envoyproxy_env: EnvoyproxyEnv,
}

/// The Envoy quota service (RLQS): how assignments are made and kept. Its
/// policies are the configuration's `quota_buckets`; `--shadow-mode` and
/// the failure policy apply to it too.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Envoy quota service (RLQS)")]
pub struct QuotaConfig {
    /// How long an assignment holds at an Envoy unless renewed, in whole
    /// seconds (Envoy ignores fractions). Renewed at the Envoy's reports
    /// (every 5 s in Envoy 1.40) or the rebalance tick, by half-way through
    /// it; when the
    /// service is gone, the Envoy falls back to its
    /// expired_assignment_behavior this long after the last one.
    #[arg(long, env = "RATELIMITD_QUOTA_ASSIGNMENT_TTL", default_value = "15s",
          value_parser = whole_seconds)]
    pub quota_assignment_ttl: Duration,

    /// A bucket an Envoy has not reported for this long is dropped: its
    /// share is freed and the Envoy told to abandon it.
    #[arg(long, env = "RATELIMITD_QUOTA_SUBSCRIBER_TIMEOUT", default_value = "15s",
          value_parser = positive_duration)]
    pub quota_subscriber_timeout: Duration,

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
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub quota_max_buckets_per_stream: usize,

    /// Most buckets all Envoy streams of this instance may subscribe to
    /// together (about 1.4 KiB each on the embedded store); reports of more
    /// are ignored (and counted).
    #[arg(long, env = "RATELIMITD_QUOTA_MAX_BUCKETS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub quota_max_buckets: usize,
}

/// Bounds on what one peer, connection or request may hold or ask.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitsConfig {
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
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_connections: usize,

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
          value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// How often to PING an HTTP/2 connection that sends nothing, to find
    /// dead peers ("0s": never).
    #[arg(long, env = "RATELIMITD_HTTP2_KEEPALIVE_INTERVAL", default_value = "30s",
          value_parser = humantime::parse_duration)]
    pub http2_keepalive_interval: Duration,

    /// How long a PING may go unanswered before the connection is closed.
    #[arg(long, env = "RATELIMITD_HTTP2_KEEPALIVE_TIMEOUT", default_value = "10s",
          value_parser = positive_duration)]
    pub http2_keepalive_timeout: Duration,

    /// Idle time before TCP keepalive probes start on a connection ("0s":
    /// off).
    #[arg(long, env = "RATELIMITD_TCP_KEEPALIVE", default_value = "60s",
          value_parser = humantime::parse_duration)]
    pub tcp_keepalive: Duration,

    /// Most descriptors one ShouldRateLimit may carry (more:
    /// INVALID_ARGUMENT). Envoy sends a handful.
    #[arg(long, env = "RATELIMITD_MAX_DESCRIPTORS", default_value_t = RequestBounds::DEFAULT_MAX_DESCRIPTORS,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_descriptors: usize,

    /// Most entries one descriptor may carry (more: INVALID_ARGUMENT).
    #[arg(long, env = "RATELIMITD_MAX_DESCRIPTOR_ENTRIES", default_value_t = RequestBounds::DEFAULT_MAX_ENTRIES,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_descriptor_entries: usize,

    /// Longest descriptor entry key or value, in bytes (longer:
    /// INVALID_ARGUMENT).
    #[arg(long, env = "RATELIMITD_MAX_DESCRIPTOR_ENTRY_BYTES", default_value_t = RequestBounds::DEFAULT_MAX_ENTRY_BYTES,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_descriptor_entry_bytes: usize,

    /// Most limits one CheckLimit may carry in `limits` (more:
    /// INVALID_ARGUMENT). Every limit of a request is decided in one Redis
    /// script when its keys share a node; 64 is what one script decides.
    #[arg(long, env = "RATELIMITD_MAX_LIMITS_PER_REQUEST", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_limits_per_request: usize,

    /// Most requests one CheckLimits batch may carry (more:
    /// INVALID_ARGUMENT for the whole call), as gubernator bounds its
    /// batches.
    #[arg(long, env = "RATELIMITD_MAX_BATCH_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_batch_size: usize,
}

/// Logs and metrics.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryConfig {
    /// Serve Prometheus metrics at http://<this address>/metrics. Unset:
    /// no metrics endpoint.
    #[arg(long, env = "RATELIMITD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Least severe log level written; RUST_LOG, when set, wins.
    #[arg(long, env = "RATELIMITD_LOG_LEVEL", value_enum, default_value = "info")]
    pub log_level: LogLevel,

    /// Log line format.
    #[arg(
        long,
        env = "RATELIMITD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// A Redis URL as given. Its `Debug` hides every credential in it (see
/// [`redacted_url`]), so a whole [`Config`] can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL, credentials and all, for connecting.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for RedisUrl {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<String> for RedisUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl std::str::FromStr for RedisUrl {
    type Err = std::convert::Infallible;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Ok(Self(url.to_owned()))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redacted_url(&self.0))
    }
}

/// A secret (a password): its `Debug` is `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for using it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Self(secret)
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(secret: &str) -> Result<Self, Self::Err> {
        Ok(Self(secret.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Pairs whose values are secret (xDS headers carry tokens): its `Debug`
/// names only the keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(pub KeyValues);

impl fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// `key=value` (or `key:value`) pairs separated by commas; empty for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyValues(pub Vec<(String, String)>);

/// The parser of [`KeyValues`] split at `separator`.
fn key_values(separator: char) -> impl Fn(&str) -> Result<KeyValues, String> + Clone {
    move |text: &str| {
        text.split(',')
            .map(str::trim)
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                pair.split_once(separator)
                    .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
                    .filter(|(key, _)| !key.is_empty())
                    .ok_or_else(|| format!("{pair:?} is not key{separator}value"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(KeyValues)
    }
}

/// Which files of a configuration directory hold rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigFiles {
    /// `*.yaml` and `*.yml` directly in the directory.
    Yaml,
    /// Every file in the directory and below, whatever its name.
    All,
}

/// When envoyproxy/ratelimit's environment variables are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvoyproxyEnv {
    /// Read them when a variable only upstream uses is set.
    Auto,
    /// Always read them.
    Always,
    /// Never read them.
    Never,
}

/// The kinds of Redis deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RedisMode {
    /// One Redis server.
    Standalone,
    /// A Redis Cluster (the URLs are seed nodes).
    Cluster,
    /// A primary found through Sentinels (the URLs are sentinels).
    Sentinel,
}

impl Config {
    /// Everything the configuration names that is read from files (the
    /// Redis and xDS TLS material), read once, at start-up, here; an error
    /// names the file. (The gRPC server's own certificate is the exception:
    /// `tls::ServerTls` reads it, because it reloads it when it changes.)
    pub fn read_at_start(&self) -> Result<StartSettings, String> {
        let embedded = EmbeddedSettings {
            max_bytes: self.store.memory_max_bytes,
            sweep_interval: self.store.memory_sweep_interval,
        };
        let store = match self.redis_settings()? {
            Some(redis) => StoreSettings::Redis {
                redis: Box::new(redis),
                local: embedded,
            },
            None => StoreSettings::Embedded(embedded),
        };
        Ok(StartSettings {
            store,
            xds: self.xds_settings()?,
        })
    }

    /// The xDS configuration source, when one is configured.
    fn xds_settings(&self) -> Result<Option<XdsSettings>, String> {
        let Some(server) = &self.envoy.xds_server else {
            return Ok(None);
        };
        let tls = if self.envoy.xds_tls {
            Some(XdsTls {
                ca: self.envoy.xds_tls_ca.as_ref().map(read_pem).transpose()?,
                identity: match (&self.envoy.xds_tls_cert, &self.envoy.xds_tls_key) {
                    (Some(cert), Some(key)) => Some((read_pem(cert)?, read_pem(key)?)),
                    _ => None,
                },
                server_name: self.envoy.xds_tls_san.clone(),
            })
        } else {
            None
        };
        Ok(Some(XdsSettings {
            server: server.clone(),
            node_id: self.envoy.xds_node_id.clone(),
            node_metadata: self.envoy.xds_node_metadata.0.clone(),
            headers: self.envoy.xds_headers.0.0.clone(),
            tls,
            retry_interval: self.envoy.xds_retry_interval,
            retry_max: self.envoy.xds_retry_max.max(self.envoy.xds_retry_interval),
        }))
    }

    /// The command line and environment of this process, with
    /// envoyproxy/ratelimit's variables applied (see [`envoyproxy_env`]).
    /// Exits with clap's message on a bad flag.
    pub fn load() -> Result<(Self, envoyproxy_env::Report), String> {
        let matches = Self::command().get_matches();
        let environment: envoyproxy_env::Environment = std::env::vars().collect();
        Self::from_matches(&matches, &environment)
    }

    /// Like [`Config::load`], from given arguments and environment (tests).
    pub fn load_from(
        args: &[&str],
        environment: &envoyproxy_env::Environment,
    ) -> Result<(Self, envoyproxy_env::Report), String> {
        let matches = Self::command()
            .try_get_matches_from(args)
            .map_err(|err| err.to_string())?;
        Self::from_matches(&matches, environment)
    }

    fn from_matches(
        matches: &clap::ArgMatches,
        environment: &envoyproxy_env::Environment,
    ) -> Result<(Self, envoyproxy_env::Report), String> {
        let mut config = Self::from_arg_matches(matches).map_err(|err| err.to_string())?;
        let report = envoyproxy_env::apply(&mut config, matches, environment)?;
        Ok((config, report))
    }

    /// The Redis settings, when a Redis URL is configured.
    fn redis_settings(&self) -> Result<Option<RedisSettings>, String> {
        if self.store.redis_url.is_empty() {
            return Ok(None);
        }
        if self.store.redis_mode == RedisMode::Standalone && self.store.redis_url.len() > 1 {
            return Err(
                "--redis-url: a standalone Redis takes one URL (several are for \
                        --redis-mode cluster or sentinel)"
                    .into(),
            );
        }
        let tls = RedisTls {
            ca: self.store.redis_tls_ca.as_ref().map(read_pem).transpose()?,
            client: match (&self.store.redis_tls_cert, &self.store.redis_tls_key) {
                (Some(cert), Some(key)) => Some((read_pem(cert)?, read_pem(key)?)),
                _ => None,
            },
        };
        Ok(Some(RedisSettings {
            urls: self
                .store
                .redis_url
                .iter()
                .map(|url| url.as_str().to_owned())
                .collect(),
            topology: match self.store.redis_mode {
                RedisMode::Standalone => Topology::Standalone,
                RedisMode::Cluster => Topology::Cluster,
                RedisMode::Sentinel => Topology::Sentinel {
                    master: self.store.redis_sentinel_master.clone(),
                    sentinel_credentials: self
                        .store
                        .redis_sentinel_auth
                        .as_ref()
                        .map(|auth| Credentials::parse(auth.expose())),
                },
            },
            pool_size: usize::from(self.store.redis_pool_size),
            connect_timeout: self.store.redis_connect_timeout,
            command_timeout: self.store.redis_command_timeout,
            breaker_threshold: self.failure.redis_breaker_threshold,
            tls,
        }))
    }
}

/// What [`Config::read_at_start`] resolved.
pub struct StartSettings {
    /// The store to decide on.
    pub store: StoreSettings,
    /// The xDS source of the Envoy rules, if one is configured.
    pub xds: Option<XdsSettings>,
}

/// The store the configuration names. (No `Debug`: the Redis URLs in it
/// carry passwords; log them through [`redacted_url`].)
pub enum StoreSettings {
    /// The embedded store alone: state in this process.
    Embedded(EmbeddedSettings),
    /// Redis, with this instance's own embedded store for the `local`
    /// failure policy.
    Redis {
        /// The Redis deployment and its TLS (boxed: the variants' sizes
        /// differ by hundreds of bytes).
        redis: Box<RedisSettings>,
        /// The instance's own store, for `--failure-policy local`.
        local: EmbeddedSettings,
    },
}

/// The embedded store's bounds.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedSettings {
    /// Its memory budget.
    pub max_bytes: usize,
    /// How often expired state is swept out.
    pub sweep_interval: Duration,
}

/// A PEM file named by a flag, read at start; the error names it.
fn read_pem(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))
}

/// `text` (a Redis URL) with every secret in it replaced by `***`: the
/// password, a user name standing alone (redis-rs takes
/// `redis://secret@host` as a password), and `pass` / `password` query
/// values (`redis+unix:///path?pass=...`). A URL that does not parse is not
/// shown at all.
pub fn redacted_url(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        return "<a URL that does not parse>".into();
    };
    // Both setters fail only for URLs without a host, which hold no
    // credentials to hide.
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    } else if !url.username().is_empty() {
        let _ = url.set_username("***");
    }
    let secret = |name: &str| name == "pass" || name == "password";
    if url.query_pairs().any(|(name, _)| secret(&name)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if secret(&name) {
                    "***".into()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

/// A size such as `256MiB`, `1GB` or `65536`, in bytes; 0 allowed (off).
fn cache_bytes(text: &str) -> Result<usize, String> {
    let size: bytesize::ByteSize = text.parse()?;
    usize::try_from(size.as_u64()).map_err(|_| "too large".to_owned())
}

/// A size as [`cache_bytes`] reads it, at least 64 KiB (below that the
/// store's 64 shards hold almost nothing each).
fn byte_size(text: &str) -> Result<usize, String> {
    let bytes = cache_bytes(text)?;
    if bytes < 64 << 10 {
        return Err("must be at least 64KiB".into());
    }
    Ok(bytes)
}

/// A duration of whole seconds, at least one.
fn whole_seconds(text: &str) -> Result<Duration, String> {
    let duration = positive_duration(text)?;
    if duration.subsec_nanos() != 0 || duration.is_zero() {
        return Err("must be whole seconds, at least 1s (Envoy ignores fractions)".into());
    }
    Ok(duration)
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if duration.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_the_logs() {
        assert_eq!(
            redacted_url("redis://app:s3cret@127.0.0.1:6379/0"),
            "redis://app:***@127.0.0.1:6379/0"
        );
        assert_eq!(redacted_url("redis://:s3cret@h/0"), "redis://:***@h/0");
        assert_eq!(
            redacted_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redacted_url("rediss://s3cret@h:1"), "rediss://***@h:1");
        assert_eq!(
            redacted_url("redis+unix:///run/redis.sock?db=2&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=2&pass=***"
        );
        assert!(!redacted_url("redis://u:s3cret@[::1").contains("s3cret"));
        let config = Config::parse_from([
            "ratelimitd",
            "--redis-url",
            "redis://u:pw1@h:1/0,redis://u:pw2@h:2/0",
            "--redis-sentinel-auth",
            "sentinel:pw3",
            "--xds-headers",
            "authorization:Bearer pw4",
        ]);
        let logged = format!("{config:?}");
        for secret in ["pw1", "pw2", "pw3", "pw4"] {
            assert!(!logged.contains(secret), "{secret} in {logged}");
        }
        assert!(logged.contains("redis://u:***@h:1/0") && logged.contains("authorization"));
    }

    #[test]
    fn defaults_are_sensible_and_zero_timeouts_are_refused() {
        let config = Config::parse_from(["ratelimitd"]);
        assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(config.store.key_prefix, "ratelimitd:");
        assert!(matches!(
            config.read_at_start().unwrap().store,
            StoreSettings::Embedded(_)
        ));
        assert!(Config::try_parse_from(["ratelimitd", "--redis-command-timeout", "0s"]).is_err());
        assert!(Config::try_parse_from(["ratelimitd", "--redis-pool-size", "0"]).is_err());
    }
}
