//! The Envoy face's options: where its rules come from (a configuration
//! directory or an xDS server, never both) and how it answers; and the
//! settings they become at start, with the xDS TLS files read.

use std::path::PathBuf;
use std::time::Duration;

use super::xds::{XdsSettings, XdsTls};
use super::{EnvoySettings, KeyLayout, LimitHeaderNames, RequestBounds};
use crate::config_error::ConfigError;
use crate::options::{
    KeyValues, SecretValues, key_values, positive_duration, read_identity, read_optional_pem,
    secret_values,
};
use crate::rules::FileSelection;

/// The Envoy face: where its rules come from (files or xDS) and how it answers.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Envoy rules")]
pub struct EnvoyOptions {
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
    #[arg(long, env = "RATELIMITD_CONFIG_DOTFILES", num_args = 0..=1, require_equals = true)]
    pub config_dotfiles: bool,

    /// How often to look for changes to --config.
    #[arg(long, env = "RATELIMITD_CONFIG_POLL_INTERVAL", default_value = "1s",
          value_parser = positive_duration)]
    pub config_poll_interval: Duration,

    /// Where the rules come from when not from --config.
    #[command(flatten)]
    pub xds: XdsOptions,

    /// Open the gRPC port without waiting for rules: with --xds-server,
    /// before the first configuration arrives (by default the port opens
    /// once one has, accepted or rejected); with --config, even when the
    /// configuration cannot be read at start (it is logged, and polling
    /// loads the first one that can).
    #[arg(long, env = "RATELIMITD_START_WITHOUT_RULES", num_args = 0..=1, require_equals = true)]
    pub start_without_rules: bool,

    /// Health (gRPC and /healthcheck) says SERVING only while rules holding
    /// at least one domain or policy are in force.
    #[arg(long, env = "RATELIMITD_HEALTH_REQUIRES_RULES", num_args = 0..=1, require_equals = true)]
    pub health_requires_rules: bool,

    /// Envoy face: decide, count and log as usual, but answer every request
    /// OK (descriptor statuses still say OVER_LIMIT where they are).
    #[arg(long, env = "RATELIMITD_SHADOW_MODE", num_args = 0..=1, require_equals = true)]
    pub shadow_mode: bool,

    /// Envoy face: add the IETF RateLimit-Policy and RateLimit headers
    /// (draft-ietf-httpapi-ratelimit-headers) to responses.
    #[arg(long, env = "RATELIMITD_ENVOY_RATELIMIT_HEADERS", num_args = 0..=1, require_equals = true)]
    pub envoy_ratelimit_headers: bool,

    /// Envoy face: a descriptor over its limit still spends its hits (as
    /// envoyproxy/ratelimit does unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT),
    /// and each descriptor is counted on its own. Off: a denied request
    /// spends nothing on any descriptor.
    #[arg(long, env = "RATELIMITD_ENVOY_COUNT_DENIED_HITS", num_args = 0..=1, require_equals = true)]
    pub envoy_count_denied_hits: bool,

    /// Envoy face: every descriptor is in quota mode (as `quota_mode: true`
    /// on each rule): the request is denied only when all its quota
    /// descriptors are over.
    #[arg(long, env = "RATELIMITD_ENVOY_QUOTA_MODE", num_args = 0..=1, require_equals = true)]
    pub envoy_quota_mode: bool,

    /// Envoy face: attach envoyproxy/ratelimit's dynamic metadata (domain,
    /// descriptors, hits, and the `metadata` of the rules that passed) to
    /// each response.
    #[arg(long, env = "RATELIMITD_ENVOY_DYNAMIC_METADATA", num_args = 0..=1, require_equals = true)]
    pub envoy_dynamic_metadata: bool,

    /// Envoy face: add envoyproxy/ratelimit's three headers (limit,
    /// remaining, reset seconds) of the most restrictive descriptor.
    #[arg(long, env = "RATELIMITD_ENVOY_LIMIT_HEADERS", num_args = 0..=1, require_equals = true)]
    pub envoy_limit_headers: bool,

    /// Envoy face: how limits that envoyproxy/ratelimit could count (a fixed
    /// window of one unit, alone on its descriptor) are named and counted
    /// in the store. `upstream`: as envoyproxy/ratelimit does, under
    /// --key-prefix, so that its instances and ratelimitd's share one count
    /// while a deployment moves from one to the other (docs/envoy.md).
    #[arg(
        long,
        env = "RATELIMITD_ENVOY_KEY_LAYOUT",
        value_enum,
        default_value = "ratelimitd"
    )]
    pub envoy_key_layout: KeyLayout,

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
}

/// The Envoy rules from an xDS management server.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct XdsOptions {
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
    #[arg(long, env = "RATELIMITD_XDS_HEADERS", value_parser = secret_values(':'),
          default_value = "")]
    pub xds_headers: SecretValues,

    /// Speak TLS to the xDS server (system roots, or --xds-tls-ca).
    #[arg(long, env = "RATELIMITD_XDS_TLS", num_args = 0..=1, require_equals = true)]
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
}

/// Which files of a configuration directory hold rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigFiles {
    /// `*.yaml` and `*.yml` directly in the directory.
    Yaml,
    /// Every file in the directory and below, whatever its name.
    All,
}

/// Where the Envoy rules (and the quota and CheckLimit policies beside
/// them) come from.
#[derive(Debug, Clone)]
pub enum RulesSource {
    /// Nowhere: every Envoy domain is unconfigured.
    None,
    /// A file or directory, polled for changes.
    Files {
        /// The file or directory.
        path: PathBuf,
        /// Which files of a directory.
        selection: FileSelection,
        /// How often it is polled.
        poll_interval: Duration,
    },
    /// An xDS management server.
    Xds(XdsSettings),
}

impl EnvoyOptions {
    /// How the Envoy face answers, within `bounds`.
    pub fn settings(&self, bounds: RequestBounds) -> EnvoySettings {
        EnvoySettings {
            shadow_mode: self.shadow_mode,
            ratelimit_headers: self.envoy_ratelimit_headers,
            count_denied_hits: self.envoy_count_denied_hits,
            quota_mode: self.envoy_quota_mode,
            dynamic_metadata: self.envoy_dynamic_metadata,
            limit_headers: self.envoy_limit_headers.then(|| LimitHeaderNames {
                limit: self.envoy_limit_header.clone(),
                remaining: self.envoy_remaining_header.clone(),
                reset: self.envoy_reset_header.clone(),
            }),
            bounds,
            key_layout: self.envoy_key_layout,
        }
    }

    /// Where the rules come from, with the xDS TLS files read (the error
    /// names the flag). Clap has made sure --config and --xds-server are
    /// not both given.
    pub fn rules_source(&self) -> Result<RulesSource, ConfigError> {
        if let Some(path) = &self.config {
            return Ok(RulesSource::Files {
                path: path.clone(),
                selection: FileSelection {
                    every_file: self.config_files == ConfigFiles::All,
                    dotfiles: self.config_dotfiles,
                },
                poll_interval: self.config_poll_interval,
            });
        }
        Ok(match self.xds.settings()? {
            Some(xds) => RulesSource::Xds(xds),
            None => RulesSource::None,
        })
    }
}

impl XdsOptions {
    /// The xDS source, when a server is named.
    fn settings(&self) -> Result<Option<XdsSettings>, ConfigError> {
        let Some(server) = &self.xds_server else {
            return Ok(None);
        };
        let tls = if self.xds_tls {
            Some(XdsTls {
                ca: read_optional_pem("xds_tls_ca", self.xds_tls_ca.as_deref())?,
                identity: read_identity(
                    ["xds_tls_cert", "xds_tls_key"],
                    [self.xds_tls_cert.as_deref(), self.xds_tls_key.as_deref()],
                )?,
                server_name: self.xds_tls_san.clone(),
            })
        } else {
            None
        };
        Ok(Some(XdsSettings {
            server: server.clone(),
            node_id: self.xds_node_id.clone(),
            node_metadata: self.xds_node_metadata.0.clone(),
            headers: self.xds_headers.0.0.clone(),
            tls,
            retry_interval: self.xds_retry_interval,
            retry_max: self.xds_retry_max.max(self.xds_retry_interval),
        }))
    }
}
