//! How to reach Redis and how long to wait for it: the deployment the URLs
//! name, the logins, the TLS material and the pool's bounds. The store's
//! options (`options`) make them; the store (`redis`) and its connection
//! managers (`managers`) use them.

use std::time::Duration;

/// Which kind of Redis deployment the URLs name (`--redis-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    /// One server (the first URL).
    Standalone,
    /// A Redis Cluster; the URLs are seed nodes, the rest is discovered and
    /// followed through resharding and failover.
    Cluster,
    /// Sentinels (the URLs) watching a primary (see
    /// --redis-sentinel-master); the pool follows failovers.
    Sentinel,
}

/// With [`Topology::Sentinel`]: which primary the sentinels are asked for,
/// and how to log in to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sentinel {
    /// The primary's name at the sentinels.
    pub master: String,
    /// The sentinels' own credentials (`None`: none are sent to them).
    /// Those in the URLs are the primary's and its replicas', never the
    /// sentinels'.
    pub credentials: Option<Credentials>,
}

impl Default for Sentinel {
    /// `mymaster`, the name Redis's own sentinel.conf uses, and sentinels
    /// without a password.
    fn default() -> Self {
        Self {
            master: "mymaster".into(),
            credentials: None,
        }
    }
}

/// A user (or the default one) and a password (or none).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Credentials {
    /// The ACL user (`None`: the default user).
    pub user: Option<String>,
    /// The password (`None`: none).
    pub password: Option<String>,
}

impl Credentials {
    /// Upstream's form: `password`, `user:password`, or empty for none.
    pub fn parse(auth: &str) -> Self {
        match auth.split_once(':') {
            _ if auth.is_empty() => Self::default(),
            Some((user, password)) => Self {
                user: Some(user.to_owned()),
                password: Some(password.to_owned()),
            },
            None => Self {
                user: None,
                password: Some(auth.to_owned()),
            },
        }
    }
}

/// Logs show the user, never the password.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// One URL, or several for Cluster seeds or Sentinels.
    pub urls: Vec<String>,
    /// What `urls` name.
    pub topology: Topology,
    /// With [`Topology::Sentinel`], the primary and the sentinels' login.
    pub sentinel: Sentinel,
    /// Connections per pool.
    pub pool_size: usize,
    /// The longest a new connection may take.
    pub connect_timeout: Duration,
    /// The longest one decision may take, from asking the pool for a
    /// connection to reading the script's reply.
    pub command_timeout: Duration,
    /// Failures in a row that open the circuit breaker.
    pub breaker_threshold: u32,
    /// The most calls one batch script call carries (1: no batches).
    pub batch_calls: usize,
    /// For `rediss://`: certificates other than the system's.
    pub tls: RedisTls,
}

/// TLS material for a `rediss://` Redis, as PEM bytes.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// CA certificates to trust instead of the system's.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key, for Redis's `tls-auth-clients`.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key material stays out of logs.
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}
