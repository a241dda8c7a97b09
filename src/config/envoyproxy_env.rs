//! envoyproxy/ratelimit's environment variables, read as aliases of our
//! flags, so a deployment of upstream starts ratelimitd unchanged.
//!
//! Rules, in order: a variable is read only when upstream's variables are in
//! use (`--envoyproxy-env auto`: any variable that only upstream uses is
//! set). Our own flag (or `RATELIMITD_*` variable), when given, wins over an
//! alias that says the same, and is an error beside one that says
//! otherwise. Where neither is given, upstream's default applies where it
//! differs from ours (listen address, Redis socket, no local cache, no key
//! prefix, denied hits counted, ...). A variable whose behaviour ratelimitd
//! does not have stops the start, naming it; a tuning knob without an
//! equivalent is accepted with a warning. docs/deployment.md has the table.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{
    Config, ConfigFiles, EnvoyproxyEnv, KeyValues, RedisMode, RedisUrl, Secret, SecretValues,
};
use crate::telemetry::{LogFormat, LogLevel};

/// Variable name to value.
pub type Environment = BTreeMap<String, String>;

/// What reading upstream's variables did, for the start-up log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Upstream's variables were in use (and its defaults applied).
    pub active: bool,
    /// The upstream variables that were set, by name.
    pub read: Vec<String>,
    /// Variables accepted without an equivalent here, with why.
    pub warnings: Vec<String>,
}

/// Names upstream shares with other software (platforms set `PORT`,
/// `REDIS_URL`, `LOG_LEVEL`): read when upstream's variables are in use,
/// but never the reason they are.
const SHARED_NAMES: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "REDIS_URL",
    "REDIS_AUTH",
];

/// Prefixes of upstream's variables beyond those read one by one below:
/// they configure a feature (per-second Redis, memcache, xDS, tracing,
/// statsd) that is off unless its switch is set, and the switch is checked.
const FEATURE_PREFIXES: &[&str] = &[
    "REDIS_PERSECOND_",
    "MEMCACHE_",
    "CONFIG_GRPC_XDS_",
    "XDS_CLIENT_",
    "TRACING_",
    "STATSD_",
    "USE_DOG_STATSD_",
    "DOG_STATSD_MOGRIFIER",
];

/// Every variable upstream's settings.go reads that is not a shared name or
/// under a feature prefix.
const UPSTREAM_NAMES: &[&str] = &[
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "USE_DOG_STATSD",
    "USE_STATSD",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_POOL_SIZE",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_SENTINEL_AUTH",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
];

/// Tuning knobs of upstream's Redis client, gRPC server and key expiry
/// that change no answer: accepted with a warning saying so.
const TUNING_NAMES: &[(&str, &str)] = &[
    (
        "REDIS_PIPELINE_WINDOW",
        "each decision is one script call on a multiplexed connection",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "each decision is one script call on a multiplexed connection",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "cluster nodes are called in parallel",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "health follows a Redis probe every --health-interval",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "start-up does not wait for Redis; health says NOT_SERVING until it answers",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "start-up does not wait for Redis; health says NOT_SERVING until it answers",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "start-up does not wait for Redis; health says NOT_SERVING until it answers",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "keys expire exactly at their window's end",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "connections are not closed for age (idle ones after --idle-timeout)",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are not closed for age (idle ones after --idle-timeout)",
    ),
    (
        "NEAR_LIMIT_RATIO",
        "only upstream's near_limit statistic uses it",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "response times are not exported under upstream's names",
    ),
];

/// Applies upstream's variables in `environment` to `config`; `matches`
/// says which of our flags were given. An error names the variable.
pub fn apply(
    config: &mut Config,
    matches: &ArgMatches,
    environment: &Environment,
) -> Result<Report, String> {
    let is_upstream_name = |name: &str| {
        UPSTREAM_NAMES.contains(&name)
            || FEATURE_PREFIXES
                .iter()
                .any(|prefix| name.starts_with(prefix))
    };
    let active = match config.envoy.envoyproxy_env {
        EnvoyproxyEnv::Never => false,
        EnvoyproxyEnv::Always => true,
        EnvoyproxyEnv::Auto => environment.keys().any(|name| is_upstream_name(name)),
    };
    if !active {
        return Ok(Report::default());
    }
    let mut aliases = Aliases {
        matches,
        environment,
        report: Report {
            active: true,
            read: environment
                .keys()
                .filter(|name| is_upstream_name(name) || SHARED_NAMES.contains(&name.as_str()))
                .cloned()
                .collect(),
            warnings: Vec::new(),
        },
    };
    aliases.refuse_unsupported()?;
    aliases.listener(config)?;
    aliases.logging(config)?;
    if aliases.xds_mode() {
        aliases.xds(config)?;
    } else {
        aliases.runtime(config)?;
    }
    aliases.redis(config)?;
    aliases.limits(config)?;
    aliases.statistics(config)?;
    if let (Some(path), Some(server)) = (&config.envoy.config, &config.envoy.xds_server) {
        return Err(format!(
            "rules from both {} and the xDS server {server}: set one (RUNTIME_ROOT or --config, \
             CONFIG_TYPE=GRPC_XDS_SOTW or --xds-server)",
            path.display()
        ));
    }
    for (name, why) in TUNING_NAMES {
        if let Some(value) = environment.get(*name) {
            aliases
                .report
                .warnings
                .push(format!("{name}={value} has no effect here: {why}"));
        }
    }
    Ok(aliases.report)
}

struct Aliases<'a> {
    matches: &'a ArgMatches,
    environment: &'a Environment,
    report: Report,
}

impl Aliases<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.environment.get(name).map(String::as_str)
    }

    /// A Go boolean (strconv.ParseBool), or `default` when unset.
    fn flag(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(format!("{name}={other}: not a boolean (true or false)")),
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        self.get(name)
            .map(|text| {
                text.trim()
                    .parse()
                    .map_err(|_| format!("{name}={text}: not a whole number in range"))
            })
            .transpose()
    }

    /// A Go duration (`10s`, `1m30s`, `250ms`; `0` is zero).
    fn duration(&self, name: &str) -> Result<Option<Duration>, String> {
        self.get(name)
            .map(|text| match text.trim() {
                "0" => Ok(Duration::ZERO),
                trimmed => humantime::parse_duration(trimmed)
                    .map_err(|err| format!("{name}={text}: not a duration ({err})")),
            })
            .transpose()
    }

    /// [`Aliases::duration`], which must be more than zero here.
    fn positive_duration(&self, name: &str) -> Result<Option<Duration>, String> {
        match self.duration(name)? {
            Some(duration) if duration.is_zero() => {
                Err(format!("{name}=0: must be more than zero"))
            }
            duration => Ok(duration),
        }
    }

    /// Was our flag `id` given, on the command line or as `RATELIMITD_*`?
    fn given(&self, id: &str) -> bool {
        matches!(
            self.matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    }

    /// `field` (our flag `id`) takes `value` from upstream variable `from`,
    /// unless our flag was given: then they must agree.
    fn alias<T: PartialEq + Debug>(
        &self,
        id: &str,
        field: &mut T,
        value: T,
        from: &str,
    ) -> Result<(), String> {
        if !self.given(id) {
            *field = value;
            return Ok(());
        }
        if *field != value {
            return Err(format!(
                "{from} says {value:?} but --{} says {:?}: set one of them",
                id.replace('_', "-"),
                field
            ));
        }
        Ok(())
    }

    /// Upstream's default for our flag `id`, where the flag was not given.
    fn default<T>(&self, id: &str, field: &mut T, value: T) {
        if !self.given(id) {
            *field = value;
        }
    }

    /// Upstream's behaviour that ratelimitd does not have: set to anything
    /// but upstream's default, the start stops.
    fn refuse_unsupported(&self) -> Result<(), String> {
        let refuse = |name: &str, why: &str| -> Result<(), String> {
            Err(format!(
                "{name} is set, but {why}; unset it to start ratelimitd"
            ))
        };
        let is_set = |name: &str| self.get(name).is_some_and(|value| !value.is_empty());
        for (name, why) in [
            ("GRPC_UDS", "ratelimitd serves gRPC on TCP only"),
            (
                "GRPC_CLIENT_TLS_SAN",
                "client certificates are checked against the CA only, not a SAN",
            ),
            (
                "HOST",
                "ratelimitd has no HTTP side (/json, /healthcheck) yet: health is grpc.health.v1 on the gRPC port",
            ),
            (
                "PORT",
                "ratelimitd has no HTTP side (/json, /healthcheck) yet: health is grpc.health.v1 on the gRPC port",
            ),
            (
                "DEBUG_HOST",
                "ratelimitd has no debug endpoint (/rlconfig, /stats): metrics are at --metrics-listen",
            ),
            (
                "DEBUG_PORT",
                "ratelimitd has no debug endpoint (/rlconfig, /stats): metrics are at --metrics-listen",
            ),
            (
                "PROMETHEUS_MAPPER_YAML",
                "metrics have fixed names (docs/deployment.md)",
            ),
        ] {
            if is_set(name) {
                return refuse(name, why);
            }
        }
        for (name, why) in [
            (
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
                "a configuration that cannot be read stops the start",
            ),
            (
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
                "health does not wait for a configuration",
            ),
            (
                "USE_STATSD",
                "ratelimitd sends no statsd: set USE_STATSD=false and USE_PROMETHEUS=true",
            ),
            (
                "USE_DOG_STATSD",
                "ratelimitd sends no statsd: use USE_PROMETHEUS=true",
            ),
            ("TRACING_ENABLED", "ratelimitd exports no traces"),
            (
                "MERGE_DOMAIN_CONFIG",
                "a domain must be defined in one file",
            ),
            ("REDIS_PERSECOND", "one Redis holds every limit"),
            (
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                "TLS always verifies the server's name",
            ),
        ] {
            if self.flag(name, false)? {
                return refuse(&format!("{name}=true"), why);
            }
        }
        if let Some(kind) = self.get("CONFIG_TYPE")
            && !kind.eq_ignore_ascii_case("FILE")
            && !kind.eq_ignore_ascii_case("GRPC_XDS_SOTW")
        {
            return Err(format!("CONFIG_TYPE={kind}: not FILE or GRPC_XDS_SOTW"));
        }
        if let Some(kind) = self.get("BACKEND_TYPE")
            && !kind.eq_ignore_ascii_case("redis")
        {
            return refuse(&format!("BACKEND_TYPE={kind}"), "the only backend is redis");
        }
        if let Some(behavior) = self.get("REDIS_POOL_ON_EMPTY_BEHAVIOR")
            && !behavior.eq_ignore_ascii_case("WAIT")
        {
            // Upstream refuses these too.
            return refuse(
                &format!("REDIS_POOL_ON_EMPTY_BEHAVIOR={behavior}"),
                "a full pool waits, up to --redis-command-timeout",
            );
        }
        Ok(())
    }

    fn listener(&self, config: &mut Config) -> Result<(), String> {
        let host = self.get("GRPC_HOST").unwrap_or("0.0.0.0");
        let port: u16 = self.number("GRPC_PORT")?.unwrap_or(8081);
        let listen = (host, port)
            .to_socket_addrs()
            .map_err(|err| format!("GRPC_HOST={host}: {err}"))?
            .next()
            .ok_or_else(|| format!("GRPC_HOST={host}: resolves to no address"))?;
        self.alias_or_default::<SocketAddr>(
            "listen",
            &mut config.listener.listen,
            listen,
            "GRPC_HOST/GRPC_PORT",
        )?;
        if self.flag("GRPC_SERVER_USE_TLS", false)? {
            let path = |name: &str| {
                self.get(name)
                    .filter(|path| !path.is_empty())
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("GRPC_SERVER_USE_TLS=true needs {name}"))
            };
            self.alias(
                "tls_cert",
                &mut config.listener.tls_cert,
                Some(path("GRPC_SERVER_TLS_CERT")?),
                "GRPC_SERVER_TLS_CERT",
            )?;
            self.alias(
                "tls_key",
                &mut config.listener.tls_key,
                Some(path("GRPC_SERVER_TLS_KEY")?),
                "GRPC_SERVER_TLS_KEY",
            )?;
            if let Some(ca) = self
                .get("GRPC_CLIENT_TLS_CACERT")
                .filter(|ca| !ca.is_empty())
            {
                self.alias(
                    "tls_client_ca",
                    &mut config.listener.tls_client_ca,
                    Some(PathBuf::from(ca)),
                    "GRPC_CLIENT_TLS_CACERT",
                )?;
            }
        }
        Ok(())
    }

    fn xds_mode(&self) -> bool {
        self.get("CONFIG_TYPE")
            .is_some_and(|kind| kind.eq_ignore_ascii_case("GRPC_XDS_SOTW"))
    }

    /// CONFIG_TYPE=GRPC_XDS_SOTW: the rules from an xDS server.
    fn xds(&self, config: &mut Config) -> Result<(), String> {
        let server = self
            .get("CONFIG_GRPC_XDS_SERVER_URL")
            .unwrap_or("localhost:18000");
        self.alias(
            "xds_server",
            &mut config.envoy.xds_server,
            Some(server.to_owned()),
            "CONFIG_GRPC_XDS_SERVER_URL",
        )?;
        if let Some(id) = self.get("CONFIG_GRPC_XDS_NODE_ID") {
            self.alias(
                "xds_node_id",
                &mut config.envoy.xds_node_id,
                id.to_owned(),
                "CONFIG_GRPC_XDS_NODE_ID",
            )?;
        }
        let pairs = |name: &str, separator: char| -> Result<Option<KeyValues>, String> {
            self.get(name)
                .map(|text| {
                    super::key_values(separator)(text).map_err(|err| format!("{name}: {err}"))
                })
                .transpose()
        };
        if let Some(metadata) = pairs("CONFIG_GRPC_XDS_NODE_METADATA", '=')? {
            self.alias(
                "xds_node_metadata",
                &mut config.envoy.xds_node_metadata,
                metadata,
                "CONFIG_GRPC_XDS_NODE_METADATA",
            )?;
        }
        if let Some(headers) = pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ':')? {
            self.alias(
                "xds_headers",
                &mut config.envoy.xds_headers,
                SecretValues(headers),
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            )?;
        }
        if self.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
            self.alias(
                "xds_tls",
                &mut config.envoy.xds_tls,
                true,
                "CONFIG_GRPC_XDS_SERVER_USE_TLS",
            )?;
            let file = |name: &str| {
                self.get(name)
                    .filter(|path| !path.is_empty())
                    .map(PathBuf::from)
            };
            if let Some(ca) = file("CONFIG_GRPC_XDS_SERVER_TLS_CACERT") {
                self.alias(
                    "xds_tls_ca",
                    &mut config.envoy.xds_tls_ca,
                    Some(ca),
                    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                )?;
            }
            match (file("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), file("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")) {
                (Some(cert), Some(key)) => {
                    self.alias("xds_tls_cert", &mut config.envoy.xds_tls_cert, Some(cert), "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")?;
                    self.alias("xds_tls_key", &mut config.envoy.xds_tls_key, Some(key), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")?;
                }
                (None, None) => {}
                _ => return Err("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together".into()),
            }
            if let Some(san) = self
                .get("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
                .filter(|san| !san.is_empty())
            {
                self.alias(
                    "xds_tls_san",
                    &mut config.envoy.xds_tls_san,
                    Some(san.to_owned()),
                    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
                )?;
            }
        }
        if let Some(interval) =
            self.positive_duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")?
        {
            self.alias(
                "xds_retry_interval",
                &mut config.envoy.xds_retry_interval,
                interval,
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            )?;
        }
        if let Some(max) = self.positive_duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
            self.alias(
                "xds_retry_max",
                &mut config.envoy.xds_retry_max,
                max,
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            )?;
        }
        Ok(())
    }

    fn logging(&self, config: &mut Config) -> Result<(), String> {
        match self.get("LOG_LEVEL") {
            Some(text) => {
                // logrus's level names, in any case.
                let level = match text.to_ascii_lowercase().as_str() {
                    "trace" => LogLevel::Trace,
                    "debug" => LogLevel::Debug,
                    "info" => LogLevel::Info,
                    "warn" | "warning" => LogLevel::Warn,
                    "error" | "fatal" | "panic" => LogLevel::Error,
                    _ => {
                        return Err(format!(
                            "LOG_LEVEL={text}: not a log level (debug, info, warn, error)"
                        ));
                    }
                };
                self.alias(
                    "log_level",
                    &mut config.telemetry.log_level,
                    level,
                    "LOG_LEVEL",
                )?;
            }
            None => self.default("log_level", &mut config.telemetry.log_level, LogLevel::Warn),
        }
        if let Some(text) = self.get("LOG_FORMAT") {
            let format = match text.to_ascii_lowercase().as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                _ => return Err(format!("LOG_FORMAT={text}: not text or json")),
            };
            self.alias(
                "log_format",
                &mut config.telemetry.log_format,
                format,
                "LOG_FORMAT",
            )?;
        }
        Ok(())
    }

    /// The rules live in `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`,
    /// every file below it, dotfiles too unless RUNTIME_IGNOREDOTFILES.
    /// RUNTIME_WATCH_ROOT changes nothing here: the content is polled, which
    /// sees a root symlink swap and an edit in place alike.
    fn runtime(&self, config: &mut Config) -> Result<(), String> {
        // Rules from our own --xds-server: no runtime directory by default.
        let named = [
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ]
        .iter()
        .any(|name| self.get(name).is_some());
        if config.envoy.xds_server.is_some() && !named {
            return Ok(());
        }
        let root = self
            .get("RUNTIME_ROOT")
            .unwrap_or("/srv/runtime_data/current");
        let subdirectory = self.get("RUNTIME_SUBDIRECTORY").unwrap_or("");
        let app = self.get("RUNTIME_APPDIRECTORY").unwrap_or("config");
        let path = PathBuf::from(root).join(subdirectory).join(app);
        let _ = self.flag("RUNTIME_WATCH_ROOT", true)?;
        self.alias_or_default(
            "config",
            &mut config.envoy.config,
            Some(path),
            "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
        )?;
        self.default(
            "config_files",
            &mut config.envoy.config_files,
            ConfigFiles::All,
        );
        let dotfiles = !self.flag("RUNTIME_IGNOREDOTFILES", false)?;
        self.alias_or_default(
            "config_dotfiles",
            &mut config.envoy.config_dotfiles,
            dotfiles,
            "RUNTIME_IGNOREDOTFILES",
        )?;
        Ok(())
    }

    fn redis(&self, config: &mut Config) -> Result<(), String> {
        let socket = self.get("REDIS_SOCKET_TYPE").unwrap_or("unix");
        let kind = self
            .get("REDIS_TYPE")
            .unwrap_or("SINGLE")
            .to_ascii_lowercase();
        let url = self
            .get("REDIS_URL")
            .unwrap_or("/var/run/nutcracker/ratelimit.sock");
        let auth = self.get("REDIS_AUTH").filter(|auth| !auth.is_empty());
        let tls = self.flag("REDIS_TLS", false)?;
        let mode = match kind.as_str() {
            "single" => RedisMode::Standalone,
            "cluster" => RedisMode::Cluster,
            "sentinel" => RedisMode::Sentinel,
            _ => {
                return Err(format!(
                    "REDIS_TYPE={kind}: not single, cluster or sentinel"
                ));
            }
        };
        let mut addresses: Vec<&str> = url.split(',').map(str::trim).collect();
        if mode == RedisMode::Sentinel {
            if addresses.len() < 2 {
                return Err(format!(
                    "REDIS_URL={url}: with REDIS_TYPE=sentinel, the master's name then the sentinels, \
                     as mymaster,host:port,..."
                ));
            }
            let master = addresses.remove(0).to_owned();
            self.alias(
                "redis_sentinel_master",
                &mut config.store.redis_sentinel_master,
                master,
                "REDIS_URL",
            )?;
        }
        let urls = addresses
            .iter()
            .map(|address| redis_url(address, socket, auth, tls).map(RedisUrl::from))
            .collect::<Result<Vec<_>, _>>()?;
        let names_redis = [
            "REDIS_URL",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_TLS",
        ]
        .iter()
        .any(|name| self.get(name).is_some());
        if names_redis {
            self.alias("redis_url", &mut config.store.redis_url, urls, "REDIS_URL")?;
            self.alias(
                "redis_mode",
                &mut config.store.redis_mode,
                mode,
                "REDIS_TYPE",
            )?;
        } else if !self.given("redis_url") {
            // Upstream's default: twemproxy's socket.
            config.store.redis_url = urls;
            config.store.redis_mode = mode;
        }
        if let Some(auth) = self.get("REDIS_SENTINEL_AUTH")
            && mode == RedisMode::Sentinel
        {
            self.alias(
                "redis_sentinel_auth",
                &mut config.store.redis_sentinel_auth,
                Some(Secret::from(auth.to_owned())),
                "REDIS_SENTINEL_AUTH",
            )?;
        }
        let file = |name: &str| {
            self.get(name)
                .filter(|path| !path.is_empty())
                .map(PathBuf::from)
        };
        if tls {
            if let Some(ca) = file("REDIS_TLS_CACERT") {
                self.alias(
                    "redis_tls_ca",
                    &mut config.store.redis_tls_ca,
                    Some(ca),
                    "REDIS_TLS_CACERT",
                )?;
            }
            match (file("REDIS_TLS_CLIENT_CERT"), file("REDIS_TLS_CLIENT_KEY")) {
                (Some(cert), Some(key)) => {
                    self.alias(
                        "redis_tls_cert",
                        &mut config.store.redis_tls_cert,
                        Some(cert),
                        "REDIS_TLS_CLIENT_CERT",
                    )?;
                    self.alias(
                        "redis_tls_key",
                        &mut config.store.redis_tls_key,
                        Some(key),
                        "REDIS_TLS_CLIENT_KEY",
                    )?;
                }
                (None, None) => {}
                _ => {
                    return Err("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into());
                }
            }
        }
        match self.number::<u16>("REDIS_POOL_SIZE")? {
            Some(0) => return Err("REDIS_POOL_SIZE=0: must be at least 1".into()),
            Some(size) => self.alias(
                "redis_pool_size",
                &mut config.store.redis_pool_size,
                size,
                "REDIS_POOL_SIZE",
            )?,
            None => self.default("redis_pool_size", &mut config.store.redis_pool_size, 10),
        }
        // Upstream's 10 s default is not taken: Envoy's rate limit filter
        // gives up after 20 ms by default, and a decision held longer only
        // ties up a connection (docs/deployment.md).
        if let Some(timeout) = self.positive_duration("REDIS_TIMEOUT")? {
            self.alias(
                "redis_connect_timeout",
                &mut config.store.redis_connect_timeout,
                timeout,
                "REDIS_TIMEOUT",
            )?;
            self.alias(
                "redis_command_timeout",
                &mut config.store.redis_command_timeout,
                timeout,
                "REDIS_TIMEOUT",
            )?;
        }
        Ok(())
    }

    fn limits(&self, config: &mut Config) -> Result<(), String> {
        match self.number::<usize>("LOCAL_CACHE_SIZE_IN_BYTES")? {
            Some(bytes) => self.alias(
                "local_cache_max_bytes",
                &mut config.store.local_cache_max_bytes,
                bytes,
                "LOCAL_CACHE_SIZE_IN_BYTES",
            )?,
            None => self.default(
                "local_cache_max_bytes",
                &mut config.store.local_cache_max_bytes,
                0,
            ),
        }
        match self.get("CACHE_KEY_PREFIX") {
            Some(prefix) => self.alias(
                "key_prefix",
                &mut config.store.key_prefix,
                prefix.to_owned(),
                "CACHE_KEY_PREFIX",
            )?,
            None => self.default("key_prefix", &mut config.store.key_prefix, String::new()),
        }
        let count_denied = !self.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?;
        self.alias_or_default(
            "envoy_count_denied_hits",
            &mut config.envoy.envoy_count_denied_hits,
            count_denied,
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        )?;
        let shadow = self.flag("SHADOW_MODE", false)?;
        self.alias_or_default(
            "shadow_mode",
            &mut config.envoy.shadow_mode,
            shadow,
            "SHADOW_MODE",
        )?;
        let quota = self.flag("QUOTA_MODE", false)?;
        self.alias_or_default(
            "envoy_quota_mode",
            &mut config.envoy.envoy_quota_mode,
            quota,
            "QUOTA_MODE",
        )?;
        let metadata = self.flag("RESPONSE_DYNAMIC_METADATA", false)?;
        self.alias_or_default(
            "envoy_dynamic_metadata",
            &mut config.envoy.envoy_dynamic_metadata,
            metadata,
            "RESPONSE_DYNAMIC_METADATA",
        )?;
        let headers = self.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)?;
        self.alias_or_default(
            "envoy_limit_headers",
            &mut config.envoy.envoy_limit_headers,
            headers,
            "LIMIT_RESPONSE_HEADERS_ENABLED",
        )?;
        for (name, id, field) in [
            (
                "LIMIT_LIMIT_HEADER",
                "envoy_limit_header",
                &mut config.envoy.envoy_limit_header,
            ),
            (
                "LIMIT_REMAINING_HEADER",
                "envoy_remaining_header",
                &mut config.envoy.envoy_remaining_header,
            ),
            (
                "LIMIT_RESET_HEADER",
                "envoy_reset_header",
                &mut config.envoy.envoy_reset_header,
            ),
        ] {
            if let Some(header) = self.get(name) {
                self.alias(id, field, header.to_owned(), name)?;
            }
        }
        Ok(())
    }

    /// `value` (from the variables `from`, `/`-separated) as an alias when
    /// any of them is set, else as upstream's default.
    fn alias_or_default<T: PartialEq + Debug>(
        &self,
        id: &str,
        field: &mut T,
        value: T,
        from: &str,
    ) -> Result<(), String> {
        if from.split('/').any(|name| self.get(name).is_some()) {
            self.alias(id, field, value, from)
        } else {
            self.default(id, field, value);
            Ok(())
        }
    }

    fn statistics(&self, config: &mut Config) -> Result<(), String> {
        if self.flag("DISABLE_STATS", false)? {
            return self.alias(
                "metrics_listen",
                &mut config.telemetry.metrics_listen,
                None,
                "DISABLE_STATS",
            );
        }
        if !self.flag("USE_PROMETHEUS", false)? {
            return Ok(());
        }
        if let Some(path) = self.get("PROMETHEUS_PATH")
            && path != "/metrics"
        {
            return Err(format!(
                "PROMETHEUS_PATH={path}: metrics are served at /metrics only"
            ));
        }
        let address = self.get("PROMETHEUS_ADDR").unwrap_or(":9090");
        // Go's ":9090" listens on every address.
        let full = if address.starts_with(':') {
            format!("0.0.0.0{address}")
        } else {
            address.to_owned()
        };
        let listen = full
            .to_socket_addrs()
            .map_err(|err| format!("PROMETHEUS_ADDR={address}: {err}"))?
            .next()
            .ok_or_else(|| format!("PROMETHEUS_ADDR={address}: resolves to no address"))?;
        self.alias(
            "metrics_listen",
            &mut config.telemetry.metrics_listen,
            Some(listen),
            "USE_PROMETHEUS/PROMETHEUS_ADDR",
        )
    }
}

/// What must be escaped in a URL's user or password.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One Redis address as upstream writes it (`host:port`, or a socket path
/// with REDIS_SOCKET_TYPE=unix), as a URL with REDIS_AUTH (`password` or
/// `user:password`) and REDIS_TLS in it. A `redis://` or `rediss://` URL is
/// taken as it is.
fn redis_url(address: &str, socket: &str, auth: Option<&str>, tls: bool) -> Result<String, String> {
    if address.contains("://") {
        if auth.is_some() {
            return Err(format!(
                "REDIS_URL={address} is a URL: put the credentials in it, not in REDIS_AUTH"
            ));
        }
        return Ok(address.to_owned());
    }
    let (user, password) = match auth {
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => (Some(user), Some(password)),
            None => (None, Some(auth)),
        },
        None => (None, None),
    };
    let escape = |text: &str| utf8_percent_encode(text, USERINFO).to_string();
    match socket.to_ascii_lowercase().as_str() {
        "unix" => {
            if tls {
                return Err("REDIS_TLS=true needs REDIS_SOCKET_TYPE=tcp".into());
            }
            let mut url = format!("redis+unix://{address}");
            let mut separator = '?';
            for (key, value) in [("user", user), ("pass", password)] {
                if let Some(value) = value {
                    url.push_str(&format!("{separator}{key}={}", escape(value)));
                    separator = '&';
                }
            }
            Ok(url)
        }
        "tcp" => {
            if address.is_empty() || !address.contains(':') {
                return Err(format!("REDIS_URL: {address:?} is not host:port"));
            }
            let scheme = if tls { "rediss" } else { "redis" };
            let credentials = match (user, password) {
                (Some(user), Some(password)) => format!("{}:{}@", escape(user), escape(password)),
                (None, Some(password)) => format!(":{}@", escape(password)),
                _ => String::new(),
            };
            Ok(format!("{scheme}://{credentials}{address}"))
        }
        other => Err(format!("REDIS_SOCKET_TYPE={other}: not tcp or unix")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str], variables: &[(&str, &str)]) -> Result<(Config, Report), String> {
        let environment = variables
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let args: Vec<&str> = std::iter::once("ratelimitd")
            .chain(args.iter().copied())
            .collect();
        Config::load_from(&args, &environment)
    }

    #[test]
    fn without_upstream_variables_ours_stay() {
        let (config, report) = load(&[], &[("PORT", "8080"), ("REDIS_URL", "x")]).unwrap();
        assert!(!report.active, "shared names alone do not switch");
        assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
        assert!(config.store.redis_url.is_empty());
        assert_eq!(config.store.key_prefix, "ratelimitd:");
        assert!(!config.envoy.envoy_count_denied_hits);
    }

    #[test]
    fn upstream_deployment_gets_upstream_defaults() {
        let (config, report) = load(
            &[],
            &[
                ("USE_STATSD", "false"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "127.0.0.1:6380"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_IGNOREDOTFILES", "true"),
            ],
        )
        .unwrap();
        assert!(report.active);
        assert_eq!(config.listener.listen.to_string(), "0.0.0.0:8081");
        assert_eq!(config.store.redis_url, ["redis://127.0.0.1:6380"]);
        assert_eq!(config.store.redis_mode, RedisMode::Standalone);
        assert_eq!(config.store.redis_pool_size, 10);
        assert_eq!(config.store.key_prefix, "");
        assert_eq!(config.store.local_cache_max_bytes, 0);
        assert!(config.envoy.envoy_count_denied_hits);
        assert_eq!(config.telemetry.log_level, LogLevel::Warn);
        assert_eq!(
            config.envoy.config,
            Some(PathBuf::from("/data/ratelimit/config"))
        );
        assert_eq!(config.envoy.config_files, ConfigFiles::All);
        assert!(!config.envoy.config_dotfiles);
    }

    #[test]
    fn defaults_without_redis_url_are_twemproxys_socket() {
        let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
        assert_eq!(
            config.store.redis_url,
            ["redis+unix:///var/run/nutcracker/ratelimit.sock"]
        );
        assert!(
            config.envoy.config_dotfiles,
            "upstream reads dotfiles by default"
        );
        assert_eq!(
            config.envoy.config,
            Some(PathBuf::from("/srv/runtime_data/current/config"))
        );
    }

    #[test]
    fn our_flag_wins_when_equal_and_conflicts_are_errors() {
        let (config, _) = load(
            &["--listen", "127.0.0.1:9000", "--key-prefix", "mine:"],
            &[
                ("GRPC_HOST", "127.0.0.1"),
                ("GRPC_PORT", "9000"),
                ("USE_STATSD", "false"),
            ],
        )
        .unwrap();
        assert_eq!(config.listener.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(
            config.store.key_prefix, "mine:",
            "our flag beats upstream's default"
        );
        let err = load(&["--listen", "127.0.0.1:9001"], &[("GRPC_PORT", "9000")]).unwrap_err();
        assert!(
            err.contains("GRPC_HOST/GRPC_PORT") && err.contains("--listen"),
            "{err}"
        );
        let err = load(&["--key-prefix", "a"], &[("CACHE_KEY_PREFIX", "b")]).unwrap_err();
        assert!(
            err.contains("CACHE_KEY_PREFIX") && err.contains("--key-prefix"),
            "{err}"
        );
    }

    #[test]
    fn redis_forms_become_urls() {
        let (config, _) = load(
            &[],
            &[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "mymaster,127.0.0.1:26379,127.0.0.1:26380"),
                ("REDIS_AUTH", "app:p@ss:w/rd"),
                ("REDIS_SENTINEL_AUTH", ""),
            ],
        )
        .unwrap();
        assert_eq!(config.store.redis_mode, RedisMode::Sentinel);
        assert_eq!(config.store.redis_sentinel_master, "mymaster");
        assert_eq!(
            config.store.redis_url,
            [
                "redis://app:p%40ss%3Aw%2Frd@127.0.0.1:26379",
                "redis://app:p%40ss%3Aw%2Frd@127.0.0.1:26380"
            ]
        );
        assert_eq!(
            config
                .store
                .redis_sentinel_auth
                .as_ref()
                .map(Secret::expose),
            Some("")
        );
        let (config, _) = load(
            &[],
            &[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_TYPE", "CLUSTER"),
                ("REDIS_URL", "a:1,b:2"),
                ("REDIS_TLS", "true"),
            ],
        )
        .unwrap();
        assert_eq!(config.store.redis_mode, RedisMode::Cluster);
        assert_eq!(config.store.redis_url, ["rediss://a:1", "rediss://b:2"]);
        let (config, _) = load(
            &[],
            &[
                ("USE_STATSD", "false"),
                ("REDIS_URL", "/tmp/r.sock"),
                ("REDIS_AUTH", "pw"),
            ],
        )
        .unwrap();
        assert_eq!(config.store.redis_url, ["redis+unix:///tmp/r.sock?pass=pw"]);
        let err = load(
            &[],
            &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "nocolon")],
        )
        .unwrap_err();
        assert!(err.contains("host:port"), "{err}");
    }

    #[test]
    fn what_cannot_be_honoured_stops_the_start_by_name() {
        for (name, value) in [
            ("USE_STATSD", "true"),
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("BACKEND_TYPE", "memcache"),
            ("REDIS_PERSECOND", "true"),
            ("MERGE_DOMAIN_CONFIG", "true"),
        ] {
            let err = load(&[], &[(name, value)]).unwrap_err();
            assert!(err.contains(name), "{name}: {err}");
        }
        let err = load(&[], &[("USE_STATSD", "false"), ("PORT", "8080")]).unwrap_err();
        assert!(err.contains("PORT"), "{err}");
        let err = load(&[], &[("SHADOW_MODE", "yes")]).unwrap_err();
        assert!(err.contains("SHADOW_MODE=yes"), "{err}");
    }

    #[test]
    fn tuning_knobs_are_accepted_with_a_warning() {
        let (_, report) = load(
            &[],
            &[("USE_STATSD", "false"), ("REDIS_PIPELINE_WINDOW", "150us")],
        )
        .unwrap();
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.contains("REDIS_PIPELINE_WINDOW")),
            "{report:?}"
        );
    }

    #[test]
    fn never_reads_nothing_and_prometheus_maps_to_metrics() {
        let (config, report) = load(
            &["--envoyproxy-env", "never"],
            &[("USE_STATSD", "true"), ("GRPC_PORT", "1")],
        )
        .unwrap();
        assert!(!report.active);
        assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
        let (config, _) =
            load(&[], &[("USE_STATSD", "false"), ("USE_PROMETHEUS", "true")]).unwrap();
        assert_eq!(
            config
                .telemetry
                .metrics_listen
                .map(|a| a.to_string())
                .as_deref(),
            Some("0.0.0.0:9090")
        );
    }

    #[test]
    fn xds_config_type_takes_the_rules_from_the_server() {
        let (config, _) = load(
            &[],
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit-0"),
                ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,pod=x"),
                (
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                    "authorization:Bearer t",
                ),
                ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "500ms"),
            ],
        )
        .unwrap();
        assert_eq!(config.envoy.xds_server.as_deref(), Some("localhost:18000"));
        assert_eq!(config.envoy.config, None, "no runtime directory with xDS");
        assert_eq!(config.envoy.xds_node_id, "ratelimit-0");
        assert_eq!(config.envoy.xds_node_metadata.0.len(), 2);
        assert_eq!(
            config.envoy.xds_headers.0.0,
            [("authorization".to_owned(), "Bearer t".to_owned())]
        );
        assert_eq!(config.envoy.xds_retry_interval, Duration::from_millis(500));
    }

    #[test]
    fn files_and_xds_together_are_an_error() {
        let (config, _) =
            load(&["--xds-server", "127.0.0.1:1"], &[("USE_STATSD", "false")]).unwrap();
        assert_eq!(
            config.envoy.config, None,
            "our --xds-server: no runtime directory"
        );
        let err = load(
            &["--xds-server", "127.0.0.1:1"],
            &[("RUNTIME_ROOT", "/data")],
        )
        .unwrap_err();
        assert!(err.contains("xDS"), "{err}");
        let err = load(&["--config", "/etc/x"], &[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap_err();
        assert!(err.contains("xDS"), "{err}");
    }
}
