//! The store's options (`--redis-*`, `--redis-persecond-*`, `--memory-*`)
//! and what they become at start: Redis settings (the main Redis, and the
//! per-second one when given, each described the same way), with the TLS
//! files read, or the embedded store alone when no Redis URL is given. URLs
//! are logged with their credentials hidden.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Credentials, RedisSettings, RedisTls, Sentinel, Topology};
use crate::config_error::ConfigError;
use crate::options::{Secret, memory_budget, positive_duration, read_identity, read_optional_pem};

/// Where counters live: Redis (standalone, Cluster or Sentinel) or, without
/// --redis-url, the embedded store.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Store")]
pub struct StoreOptions {
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
    pub redis_mode: Topology,

    /// With --redis-mode sentinel: the name the sentinels monitor the
    /// primary under. Its password (not the sentinels', see
    /// --redis-sentinel-auth) and database come from the first URL.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_SENTINEL_MASTER",
        default_value = "mymaster"
    )]
    pub redis_sentinel_master: String,

    /// With --redis-mode sentinel: the sentinels' own credentials,
    /// `password` or `user:password` (unset or empty: none). The URLs'
    /// credentials are the primary's and its replicas', never sent to the
    /// sentinels.
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

    /// Most Redis connections held open at once, split evenly among the
    /// worker threads (at least one each): a thread's calls share its own.
    #[arg(long, env = "RATELIMITD_REDIS_POOL_SIZE", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub redis_pool_size: u16,

    /// A second Redis for the Envoy rules whose unit is second (files and
    /// xDS alike; every other limit stays on --redis-url), given as
    /// --redis-url is. Needs --redis-url. Timeouts, breaker, key prefix,
    /// local cache and failure policy are the main Redis's.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_PERSECOND_URL",
        value_delimiter = ',',
        help_heading = "Per-second store"
    )]
    pub redis_persecond_url: Vec<RedisUrl>,

    /// What --redis-persecond-url names, as --redis-mode.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_PERSECOND_MODE",
        value_enum,
        default_value = "standalone",
        requires = "redis_persecond_url",
        help_heading = "Per-second store"
    )]
    pub redis_persecond_mode: Topology,

    /// As --redis-sentinel-master, for the per-second Redis.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_PERSECOND_SENTINEL_MASTER",
        default_value = "mymaster",
        requires = "redis_persecond_url",
        help_heading = "Per-second store"
    )]
    pub redis_persecond_sentinel_master: String,

    /// As --redis-sentinel-auth, for the per-second Redis's sentinels.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_PERSECOND_SENTINEL_AUTH",
        requires = "redis_persecond_url",
        help_heading = "Per-second store"
    )]
    pub redis_persecond_sentinel_auth: Option<Secret>,

    /// As --redis-tls-ca, for a rediss:// per-second Redis.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_PERSECOND_TLS_CA",
        requires = "redis_persecond_url",
        help_heading = "Per-second store"
    )]
    pub redis_persecond_tls_ca: Option<PathBuf>,

    /// As --redis-tls-cert, for a rediss:// per-second Redis.
    #[arg(long, env = "RATELIMITD_REDIS_PERSECOND_TLS_CERT",
          requires_all = ["redis_persecond_tls_key", "redis_persecond_url"],
          help_heading = "Per-second store")]
    pub redis_persecond_tls_cert: Option<PathBuf>,

    /// The PEM private key of --redis-persecond-tls-cert.
    #[arg(
        long,
        env = "RATELIMITD_REDIS_PERSECOND_TLS_KEY",
        requires = "redis_persecond_tls_cert",
        help_heading = "Per-second store"
    )]
    pub redis_persecond_tls_key: Option<PathBuf>,

    /// Most connections to the per-second Redis held open at once (unset:
    /// --redis-pool-size), split among the worker threads as that one is.
    #[arg(long, env = "RATELIMITD_REDIS_PERSECOND_POOL_SIZE", requires = "redis_persecond_url",
          value_parser = clap::value_parser!(u16).range(1..), help_heading = "Per-second store")]
    pub redis_persecond_pool_size: Option<u16>,

    /// Longest wait to open a Redis connection.
    #[arg(long, env = "RATELIMITD_REDIS_CONNECT_TIMEOUT", default_value = "1s",
          value_parser = positive_duration)]
    pub redis_connect_timeout: Duration,

    /// Longest one decision may wait on Redis (pool, command and reply)
    /// before the call fails with UNAVAILABLE.
    #[arg(long, env = "RATELIMITD_REDIS_COMMAND_TIMEOUT", default_value = "100ms",
          value_parser = positive_duration)]
    pub redis_command_timeout: Duration,

    /// Redis failures in a row after which calls stop waiting on Redis (and
    /// the failure policy answers at once) until a health probe succeeds.
    /// On a Redis Cluster, counted per primary, for its keys only; a call
    /// every --redis-command-timeout then tries the node again.
    #[arg(long, env = "RATELIMITD_REDIS_BREAKER_THRESHOLD", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..),
          help_heading = "Failure policy")]
    pub redis_breaker_threshold: u32,

    /// The most decisions waiting for one Redis node that go out together,
    /// as one script call that decides each exactly as alone, in arrival
    /// order. Nothing waits for a batch to fill: a lone decision goes out
    /// at once. 1: every decision is a script call of its own.
    #[arg(long, env = "RATELIMITD_REDIS_BATCH_CALLS", default_value_t = 64,
          value_parser = clap::value_parser!(u8).range(1..=64))]
    pub redis_batch_calls: u8,

    /// How often health checks that the store answers.
    #[arg(long, env = "RATELIMITD_HEALTH_INTERVAL", default_value = "1s",
          value_parser = positive_duration, help_heading = "Failure policy")]
    pub health_interval: Duration,

    /// Health (gRPC and /healthcheck) follows the store: NOT_SERVING while
    /// it does not answer (unless the failure policy answers without it).
    /// Off: health waits for the store to answer once at start, then no
    /// longer follows it (the probe still runs and logs), so that a
    /// liveness probe on health does not restart instances over a Redis
    /// outage.
    #[arg(long, env = "RATELIMITD_HEALTH_FOLLOWS_STORE", default_value_t = true,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set, help_heading = "Failure policy")]
    pub health_follows_store: bool,

    /// How often the embedded store evicts expired keys.
    #[arg(long, env = "RATELIMITD_MEMORY_SWEEP_INTERVAL", default_value = "5s",
          value_parser = positive_duration)]
    pub memory_sweep_interval: Duration,

    /// Most memory the embedded store's keys may take (its estimate: keys,
    /// state, tables), e.g. `256MiB`. A write past it evicts what expired,
    /// then the keys closest to expiry.
    #[arg(long, env = "RATELIMITD_MEMORY_MAX_BYTES", default_value = "256MiB",
          value_parser = memory_budget)]
    pub memory_max_bytes: usize,
}

/// The store the options name. (No `Debug`: the Redis URLs in it carry
/// passwords; log them through [`redacted_url`].)
pub enum StoreSettings {
    /// The embedded store alone: state in this process.
    Embedded(EmbeddedSettings),
    /// Redis, with this instance's own embedded store for the `local`
    /// failure policy.
    Redis {
        /// The Redis deployment and its TLS (boxed: the variants' sizes
        /// differ by hundreds of bytes).
        redis: Box<RedisSettings>,
        /// The Redis for the Envoy rules whose unit is second, if one is
        /// given.
        per_second: Option<Box<RedisSettings>>,
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

impl StoreOptions {
    /// The store these options name, with its TLS files read (the error
    /// names the flag).
    pub fn settings(&self) -> Result<StoreSettings, ConfigError> {
        let embedded = EmbeddedSettings {
            max_bytes: self.memory_max_bytes,
            sweep_interval: self.memory_sweep_interval,
        };
        let redis = self.redis_settings(&self.main_redis())?;
        let per_second = self.redis_settings(&self.per_second_redis())?;
        Ok(match (redis, per_second) {
            (Some(redis), per_second) => StoreSettings::Redis {
                redis: Box::new(redis),
                per_second: per_second.map(Box::new),
                local: embedded,
            },
            (None, Some(_)) => {
                return Err(ConfigError::invalid(
                    "redis_persecond_url",
                    "a per-second Redis needs a main one (--redis-url): without it every limit \
                     is on the embedded store",
                ));
            }
            (None, None) => StoreSettings::Embedded(embedded),
        })
    }

    /// The main Redis, as its flags describe it.
    fn main_redis(&self) -> Described<'_> {
        Described {
            ids: RedisFlagIds {
                url: "redis_url",
                mode: "redis-mode",
                tls: ["redis_tls_ca", "redis_tls_cert", "redis_tls_key"],
            },
            urls: &self.redis_url,
            mode: self.redis_mode,
            master: &self.redis_sentinel_master,
            sentinel_auth: self.redis_sentinel_auth.as_ref(),
            tls: [
                self.redis_tls_ca.as_deref(),
                self.redis_tls_cert.as_deref(),
                self.redis_tls_key.as_deref(),
            ],
            pool_size: self.redis_pool_size,
        }
    }

    /// The per-second Redis, as its flags describe it.
    fn per_second_redis(&self) -> Described<'_> {
        Described {
            ids: RedisFlagIds {
                url: "redis_persecond_url",
                mode: "redis-persecond-mode",
                tls: [
                    "redis_persecond_tls_ca",
                    "redis_persecond_tls_cert",
                    "redis_persecond_tls_key",
                ],
            },
            urls: &self.redis_persecond_url,
            mode: self.redis_persecond_mode,
            master: &self.redis_persecond_sentinel_master,
            sentinel_auth: self.redis_persecond_sentinel_auth.as_ref(),
            tls: [
                self.redis_persecond_tls_ca.as_deref(),
                self.redis_persecond_tls_cert.as_deref(),
                self.redis_persecond_tls_key.as_deref(),
            ],
            pool_size: self
                .redis_persecond_pool_size
                .unwrap_or(self.redis_pool_size),
        }
    }

    /// The settings of the Redis `redis` describes, when it has a URL; the
    /// timeouts and the breaker are the store's, whichever Redis.
    fn redis_settings(&self, redis: &Described<'_>) -> Result<Option<RedisSettings>, ConfigError> {
        let ids = &redis.ids;
        if redis.urls.is_empty() {
            return Ok(None);
        }
        if redis.mode == Topology::Standalone && redis.urls.len() > 1 {
            return Err(ConfigError::invalid(
                ids.url,
                format!(
                    "a standalone Redis takes one URL (several are for --{} cluster or sentinel)",
                    ids.mode
                ),
            ));
        }
        let [ca, cert, key] = redis.tls;
        let tls = RedisTls {
            ca: read_optional_pem(ids.tls[0], ca)?,
            client: read_identity([ids.tls[1], ids.tls[2]], [cert, key])?,
        };
        Ok(Some(RedisSettings {
            urls: redis
                .urls
                .iter()
                .map(|url| url.as_str().to_owned())
                .collect(),
            topology: redis.mode,
            sentinel: Sentinel {
                master: redis.master.to_owned(),
                credentials: redis
                    .sentinel_auth
                    .map(|auth| Credentials::parse(auth.expose())),
            },
            pool_size: usize::from(redis.pool_size),
            connect_timeout: self.redis_connect_timeout,
            command_timeout: self.redis_command_timeout,
            breaker_threshold: self.redis_breaker_threshold,
            batch_calls: usize::from(self.redis_batch_calls),
            tls,
        }))
    }
}

/// The ids of the flags that describe one Redis, for errors.
struct RedisFlagIds {
    /// Its URLs' flag.
    url: &'static str,
    /// Its mode's flag, by its long name.
    mode: &'static str,
    /// Its TLS CA, certificate and key flags.
    tls: [&'static str; 3],
}

/// One Redis as its flags describe it: the main one, or the per-second
/// one, told apart only by their flags.
struct Described<'a> {
    ids: RedisFlagIds,
    urls: &'a [RedisUrl],
    mode: Topology,
    master: &'a str,
    sentinel_auth: Option<&'a Secret>,
    /// CA, certificate, key.
    tls: [Option<&'a Path>; 3],
    pool_size: u16,
}

/// A Redis URL as given. Its `Debug` hides every credential in it (see
/// [`redacted_url`]), so the whole configuration can be logged.
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

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redacted_url(&self.0))
    }
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
    }
}
