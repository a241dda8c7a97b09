//! The command line, with a `RATELIMITD_*` environment fallback for every
//! flag, and envoyproxy/ratelimit's variables ([`upstream`]) applied before
//! clap parses: one [`Config`] gathering each subsystem's group of options
//! (each a `clap::Args` beside the subsystem that uses it, and a section of
//! `--help`). The groups turn their options into settings themselves;
//! errors name the flag, and the upstream variable when that is what set
//! it. Secrets are held in types whose `Debug` hides them, so the whole
//! configuration can be logged.

pub mod effective;
#[cfg(test)]
mod tests;
pub mod upstream;

use std::ffi::OsString;

use clap::{CommandFactory, Parser};

use self::effective::Effective;
use self::upstream::{Environment, EnvoyproxyEnv, Origins, ParseError, Report};
use crate::api::envoy::options::{EnvoyOptions, RulesSource};
use crate::api::rlqs::QuotaOptions;
use crate::config_error::ConfigError;
use crate::http::HttpOptions;
use crate::lease::LeaseOptions;
use crate::limiter::LimiterOptions;
use crate::server::bounds::BoundsOptions;
use crate::server::options::{ListenerOptions, RuntimeOptions};
use crate::stats::StatsOptions;
use crate::store::{StoreOptions, StoreSettings};
use crate::telemetry::TelemetryOptions;
use crate::tls::TlsOptions;

/// ratelimitd: answers "may this key spend this much now?" over gRPC.
///
/// Without --redis-url, state lives in this process (the embedded store) and
/// is not shared with other instances.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(version, about)]
pub struct Config {
    /// Where gRPC is served.
    #[command(flatten)]
    pub listener: ListenerOptions,

    /// TLS for gRPC clients.
    #[command(flatten)]
    pub tls: TlsOptions,

    /// Where HTTP (/healthcheck, /json) and the debug endpoints are served.
    #[command(flatten)]
    pub http: HttpOptions,

    /// Where counters live.
    #[command(flatten)]
    pub store: StoreOptions,

    /// How decisions are keyed, cached, and answered while Redis cannot.
    #[command(flatten)]
    pub limiter: LimiterOptions,

    /// The Envoy face.
    #[command(flatten)]
    pub envoy: EnvoyOptions,

    /// The Envoy quota service (RLQS).
    #[command(flatten)]
    pub quota: QuotaOptions,

    /// Leases for application servers.
    #[command(flatten)]
    pub lease: LeaseOptions,

    /// Bounds per peer, connection and request.
    #[command(flatten)]
    pub bounds: BoundsOptions,

    /// Logs and metrics.
    #[command(flatten)]
    pub telemetry: TelemetryOptions,

    /// The threads that serve.
    #[command(flatten)]
    pub runtime: RuntimeOptions,

    /// envoyproxy/ratelimit's statistics: statsd, and their Prometheus
    /// names.
    #[command(flatten)]
    pub stats: StatsOptions,

    /// Read envoyproxy/ratelimit's environment variables (REDIS_URL,
    /// RUNTIME_ROOT, ...; see docs/configuration.md) as aliases of these
    /// flags, with upstream's defaults where ours differ: `auto` when any
    /// variable only upstream uses is set, `always`, or `never`.
    #[arg(
        long,
        env = "RATELIMITD_ENVOYPROXY_ENV",
        value_enum,
        default_value = "auto",
        help_heading = "envoyproxy/ratelimit"
    )]
    pub envoyproxy_env: EnvoyproxyEnv,

    /// Which flags upstream's variables set, so that an error about one
    /// names them.
    #[arg(skip)]
    pub origins: Origins,

    /// Every flag's value and where it came from, secrets hidden (empty
    /// unless read by [`Config::load_from`]): what the admin API shows.
    #[arg(skip)]
    pub effective: Effective,
}

impl Config {
    /// The command ratelimitd parses: our flags, each naming the upstream
    /// variables that set it.
    pub fn annotated_command() -> clap::Command {
        upstream::annotate(Self::command())
    }

    /// The command line and environment of this process. A command line
    /// that does not parse (or asks for `--help`) exits with clap's
    /// message.
    pub fn load() -> Result<(Self, Report), ConfigError> {
        let environment: Environment = std::env::vars().collect();
        let args: Vec<OsString> = std::env::args_os().collect();
        match Self::load_from(&args, &environment) {
            Err(ConfigError::Parse(ParseError::Clap(err))) => err.exit(),
            loaded => loaded,
        }
    }

    /// Like [`Config::load`], from given arguments (the program's name
    /// first) and environment (the `RATELIMITD_*` variables are still read
    /// from the process's).
    pub fn load_from(
        args: &[impl Into<OsString> + Clone],
        environment: &Environment,
    ) -> Result<(Self, Report), ConfigError> {
        let args: Vec<OsString> = args.iter().cloned().map(Into::into).collect();
        let command = Self::annotated_command();
        let parsed = upstream::parse::<Self>(command.clone(), &args, environment)?;
        let mut config = parsed.options;
        config.effective = Effective::from_matches(&command, &parsed.matches, &parsed.origins);
        config.origins = parsed.origins;
        Ok((config, parsed.report))
    }

    /// The store the options name, its files read.
    pub fn store_settings(&self) -> Result<StoreSettings, ConfigError> {
        self.store.settings().map_err(|err| self.invalid(err))
    }

    /// Where the rules come from, the xDS TLS files read.
    pub fn rules_source(&self) -> Result<RulesSource, ConfigError> {
        self.envoy.rules_source().map_err(|err| self.invalid(err))
    }

    /// `error`, naming the upstream variables when they set its flag.
    pub fn invalid(&self, error: ConfigError) -> ConfigError {
        let set_by = error.flag().and_then(|flag| self.origins.of(flag));
        error.set_by(set_by)
    }
}
