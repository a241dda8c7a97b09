//! envoyproxy/ratelimit's environment variables, as one table: for each,
//! the flag of ours it sets and how its value converts, upstream's default,
//! or why it is refused, warned about or ignored. A deployment of upstream
//! starts ratelimitd unchanged: its variables become our flags before clap
//! parses ([`plan`]), so clap's own rules (types, ranges, flags that
//! require or exclude each other) judge them, and `--help` names them.
//!
//! When: only while upstream's variables are in use (`--envoyproxy-env
//! auto`: any variable that only upstream uses is set). Precedence: our own
//! flag (or `RATELIMITD_*` variable), when given, wins over a variable that
//! says the same and is an error beside one that says otherwise; where
//! neither is given, upstream's default applies where it differs from ours.

mod convert;
mod plan;

use clap::Command;

pub use self::convert::Upstream;
use self::convert::{
    go_bool, inverted_go_bool, listen, log_level, lowercase, metrics, number, path,
    positive_go_duration, redis, required_path, runtime_directory, text,
};
pub use self::plan::{
    Environment, EnvoyproxyEnv, Origins, ParseError, Parsed, Report, UpstreamError, parse,
    switches_upstream_on,
};

/// One of upstream's variables.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// Its name; ending in `*`, every variable with that prefix.
    pub name: &'static str,
    /// Upstream's default, as upstream's settings write it.
    pub default: &'static str,
}

/// A row of the table: some of upstream's variables and what they do here.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The variables the row reads.
    pub variables: &'static [Variable],
    /// Only when all of these hold (on other variables) does the row apply.
    pub when: &'static [When],
    /// What the variables do.
    pub effect: Effect,
}

/// A condition on another variable.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// The variable is a true Go boolean.
    True(&'static str),
    /// The variable is this value (any case).
    Is(&'static str, &'static str),
    /// The variable is anything but this value (any case), or unset.
    IsNot(&'static str, &'static str),
}

/// What a row's variables do.
#[derive(Clone, Copy)]
pub enum Effect {
    /// They set our flags: `convert` says to what (from the variables, or
    /// from upstream's defaults when none is set).
    Sets {
        /// Our flags (clap ids) that `convert` may set.
        flags: &'static [&'static str],
        /// How the value converts, for people.
        how: &'static str,
        /// The values may hold a password: error messages do not show them.
        secret: bool,
        /// The conversion.
        convert: Convert,
    },
    /// Set to any value `accepts` does not take, the start stops.
    Refuses {
        /// What is accepted.
        accepts: Accepts,
        /// What ratelimitd does instead.
        why: &'static str,
    },
    /// Accepted, but it changes nothing here where it would upstream: a
    /// warning at start says so.
    Warns {
        /// Why it has no effect.
        why: &'static str,
    },
    /// Accepted, with no effect and none needed (what it configures is off
    /// upstream too, or here works without it).
    Ignores {
        /// What is accepted.
        accepts: Accepts,
        /// Why nothing is lost.
        why: &'static str,
    },
}

impl std::fmt::Debug for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sets { flags, how, .. } => write!(f, "Sets({flags:?}: {how})"),
            Self::Refuses { accepts, why } => write!(f, "Refuses({accepts:?}: {why})"),
            Self::Warns { why } => write!(f, "Warns({why})"),
            Self::Ignores { accepts, why } => write!(f, "Ignores({accepts:?}: {why})"),
        }
    }
}

/// The values a checked variable may take.
#[derive(Debug, Clone, Copy)]
pub enum Accepts {
    /// Any.
    Any,
    /// Unset or empty.
    Nothing,
    /// A Go boolean.
    Bool,
    /// A false Go boolean (or unset).
    False,
    /// One of these (any case).
    OneOf(&'static [&'static str]),
}

/// A row's conversion: the settings of our flags it makes, or `None` when
/// the row does not apply after all.
pub type Convert = fn(&Upstream<'_>, &Row) -> Result<Option<Vec<Setting>>, UpstreamError>;

/// One flag of ours set from upstream's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Our flag's clap id.
    pub flag: &'static str,
    /// What it is set to.
    pub value: Value,
    /// `true`: a variable said so, and it counts as given (a default of
    /// upstream's otherwise, which our own flag simply overrides).
    pub given: bool,
    /// The variables it came from, for messages (`A/B`).
    pub from: String,
    /// The value may hold a password: messages do not show it.
    pub secret: bool,
}

/// A flag's value from upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// These values, as they would be written after the flag.
    Args(Vec<String>),
    /// Our flag must stay unset.
    Unset,
}

/// Names upstream shares with other software (platforms set `PORT`,
/// `REDIS_URL`, `LOG_LEVEL`): read when upstream's variables are in use,
/// but never the reason they are.
pub const SHARED_NAMES: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "REDIS_URL",
    "REDIS_AUTH",
];

const fn var(name: &'static str, default: &'static str) -> Variable {
    Variable { name, default }
}

/// A row that sets our `flags` from `variables` by `convert`.
const fn sets(
    variables: &'static [Variable],
    flags: &'static [&'static str],
    how: &'static str,
    convert: Convert,
) -> Row {
    Row {
        variables,
        when: &[],
        effect: Effect::Sets {
            flags,
            how,
            secret: false,
            convert,
        },
    }
}

impl Row {
    /// This row, only when `when` holds.
    const fn when(self, when: &'static [When]) -> Self {
        Self { when, ..self }
    }

    /// This row, its values kept out of messages.
    const fn secret(self) -> Self {
        match self.effect {
            Effect::Sets {
                flags,
                how,
                convert,
                ..
            } => Self {
                effect: Effect::Sets {
                    flags,
                    how,
                    secret: true,
                    convert,
                },
                ..self
            },
            _ => self,
        }
    }
}

/// A row that stops the start on what `accepts` does not take.
const fn refuses(variables: &'static [Variable], accepts: Accepts, why: &'static str) -> Row {
    Row {
        variables,
        when: &[],
        effect: Effect::Refuses { accepts, why },
    }
}

/// A row of variables that change nothing here, with a warning.
const fn warns(variables: &'static [Variable], why: &'static str) -> Row {
    Row {
        variables,
        when: &[],
        effect: Effect::Warns { why },
    }
}

/// A row of variables that change nothing here, needing no warning.
const fn ignores(variables: &'static [Variable], accepts: Accepts, why: &'static str) -> Row {
    Row {
        variables,
        when: &[],
        effect: Effect::Ignores { accepts, why },
    }
}

const XDS: When = When::Is("CONFIG_TYPE", "GRPC_XDS_SOTW");
const FILES: When = When::IsNot("CONFIG_TYPE", "GRPC_XDS_SOTW");
const SERVER_TLS: When = When::True("GRPC_SERVER_USE_TLS");
const XDS_TLS: When = When::True("CONFIG_GRPC_XDS_SERVER_USE_TLS");
const REDIS_TLS: When = When::True("REDIS_TLS");
const NO_STATSD: &str = "ratelimitd sends no statsd: set USE_STATSD=false and USE_PROMETHEUS=true";

/// Every variable upstream's settings read (src/settings/settings.go), and
/// what it does here.
pub const TABLE: &[Row] = &[
    // The gRPC listener.
    sets(
        &[var("GRPC_HOST", "0.0.0.0"), var("GRPC_PORT", "8081")],
        &["listen"],
        "host:port, resolved",
        listen,
    ),
    refuses(
        &[var("GRPC_UDS", "")],
        Accepts::Nothing,
        "ratelimitd serves gRPC on TCP only",
    ),
    ignores(
        &[var("GRPC_SERVER_USE_TLS", "false")],
        Accepts::Bool,
        "the switch of the three rows that follow",
    ),
    sets(
        &[var("GRPC_SERVER_TLS_CERT", "")],
        &["tls_cert"],
        "the path",
        required_path,
    )
    .when(&[SERVER_TLS]),
    sets(
        &[var("GRPC_SERVER_TLS_KEY", "")],
        &["tls_key"],
        "the path",
        required_path,
    )
    .when(&[SERVER_TLS]),
    sets(
        &[var("GRPC_CLIENT_TLS_CACERT", "")],
        &["tls_client_ca"],
        "the path",
        path,
    )
    .when(&[SERVER_TLS]),
    refuses(
        &[var("GRPC_CLIENT_TLS_SAN", "")],
        Accepts::Nothing,
        "client certificates are checked against the CA only, not a SAN",
    ),
    warns(
        &[
            var("GRPC_MAX_CONNECTION_AGE", "24h"),
            var("GRPC_MAX_CONNECTION_AGE_GRACE", "1h"),
        ],
        "connections are not closed for age (idle ones after --idle-timeout)",
    ),
    // The HTTP and debug listeners.
    refuses(
        &[var("HOST", "0.0.0.0"), var("PORT", "8080")],
        Accepts::Nothing,
        "ratelimitd has no HTTP side (/json, /healthcheck) yet: health is grpc.health.v1 on \
         the gRPC port",
    ),
    refuses(
        &[var("DEBUG_HOST", "0.0.0.0"), var("DEBUG_PORT", "6070")],
        Accepts::Nothing,
        "ratelimitd has no debug endpoint (/rlconfig, /stats): metrics are at --metrics-listen",
    ),
    // Logs.
    sets(
        &[var("LOG_LEVEL", "WARN")],
        &["log_level"],
        "logrus's names in any case (warning is warn; fatal and panic are error)",
        log_level,
    ),
    sets(
        &[var("LOG_FORMAT", "text")],
        &["log_format"],
        "text or json, any case",
        lowercase,
    ),
    // Where the rules come from.
    refuses(
        &[var("CONFIG_TYPE", "FILE")],
        Accepts::OneOf(&["FILE", "GRPC_XDS_SOTW"]),
        "the rules come from files (FILE) or an xDS server (GRPC_XDS_SOTW)",
    ),
    refuses(
        &[var("FORCE_START_WITHOUT_INITIAL_CONFIG", "false")],
        Accepts::False,
        "a configuration that cannot be read stops the start",
    ),
    refuses(
        &[var("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false")],
        Accepts::False,
        "health does not wait for a configuration",
    ),
    refuses(
        &[var("MERGE_DOMAIN_CONFIG", "false")],
        Accepts::False,
        "a domain must be defined in one file",
    ),
    sets(
        &[
            var("RUNTIME_ROOT", "/srv/runtime_data/current"),
            var("RUNTIME_SUBDIRECTORY", ""),
            var("RUNTIME_APPDIRECTORY", "config"),
        ],
        &["config", "config_files"],
        "ROOT/SUBDIRECTORY/APPDIRECTORY, every file below it (not by default beside our own \
         --xds-server)",
        runtime_directory,
    )
    .when(&[FILES]),
    sets(
        &[var("RUNTIME_IGNOREDOTFILES", "false")],
        &["config_dotfiles"],
        "negated",
        inverted_go_bool,
    )
    .when(&[FILES]),
    ignores(
        &[var("RUNTIME_WATCH_ROOT", "true")],
        Accepts::Bool,
        "the directory's content is polled, which sees a swap of the root and an edit in place \
         alike",
    ),
    sets(
        &[var("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")],
        &["xds_server"],
        "as it is; its default applies with CONFIG_TYPE=GRPC_XDS_SOTW",
        xds_server,
    )
    .when(&[XDS]),
    sets(
        &[var("CONFIG_GRPC_XDS_NODE_ID", "default")],
        &["xds_node_id"],
        "as it is",
        text,
    )
    .when(&[XDS]),
    sets(
        &[var("CONFIG_GRPC_XDS_NODE_METADATA", "")],
        &["xds_node_metadata"],
        "key=value,... as it is",
        text,
    )
    .when(&[XDS]),
    sets(
        &[var("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "")],
        &["xds_headers"],
        "name:value,... as it is",
        text,
    )
    .when(&[XDS])
    .secret(),
    sets(
        &[var("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false")],
        &["xds_tls"],
        "a Go boolean",
        go_bool,
    )
    .when(&[XDS]),
    sets(
        &[var("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "")],
        &["xds_tls_ca"],
        "the path",
        path,
    )
    .when(&[XDS, XDS_TLS]),
    sets(
        &[var("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "")],
        &["xds_tls_cert"],
        "the path",
        path,
    )
    .when(&[XDS, XDS_TLS]),
    sets(
        &[var("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "")],
        &["xds_tls_key"],
        "the path",
        path,
    )
    .when(&[XDS, XDS_TLS]),
    sets(
        &[var("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "")],
        &["xds_tls_san"],
        "the name",
        path,
    )
    .when(&[XDS, XDS_TLS]),
    sets(
        &[var("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s")],
        &["xds_retry_interval"],
        "a Go duration, more than zero",
        positive_go_duration,
    )
    .when(&[XDS]),
    sets(
        &[var("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s")],
        &["xds_retry_max"],
        "a Go duration, more than zero",
        positive_go_duration,
    )
    .when(&[XDS]),
    warns(
        &[var("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s")],
        "reconnecting backs off from --xds-retry-interval (CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)",
    ),
    warns(
        &[
            var("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5"),
            var("XDS_CLIENT_BACKOFF_JITTER", "true"),
        ],
        "reconnecting waits ±50% of its backoff, at random",
    ),
    warns(
        &[var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "")],
        "xDS responses of up to 64 MiB are read",
    ),
    // The store.
    sets(
        &[
            var("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            var("REDIS_SOCKET_TYPE", "unix"),
            var("REDIS_TYPE", "SINGLE"),
            var("REDIS_AUTH", ""),
            var("REDIS_TLS", "false"),
        ],
        &["redis_url", "redis_mode", "redis_sentinel_master"],
        "each address a URL (redis://, rediss:// with REDIS_TLS, redis+unix:// with \
         REDIS_SOCKET_TYPE=unix) with REDIS_AUTH in it; with REDIS_TYPE=sentinel, the first \
         entry is the master's name",
        redis,
    )
    .secret(),
    sets(
        &[var("REDIS_SENTINEL_AUTH", "")],
        &["redis_sentinel_auth"],
        "password or user:password; empty: sentinels without a password",
        text,
    )
    .when(&[When::Is("REDIS_TYPE", "sentinel")])
    .secret(),
    sets(
        &[var("REDIS_TLS_CACERT", "")],
        &["redis_tls_ca"],
        "the path",
        path,
    )
    .when(&[REDIS_TLS]),
    sets(
        &[var("REDIS_TLS_CLIENT_CERT", "")],
        &["redis_tls_cert"],
        "the path",
        path,
    )
    .when(&[REDIS_TLS]),
    sets(
        &[var("REDIS_TLS_CLIENT_KEY", "")],
        &["redis_tls_key"],
        "the path",
        path,
    )
    .when(&[REDIS_TLS]),
    refuses(
        &[var("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false")],
        Accepts::False,
        "TLS always verifies the server's name",
    ),
    sets(
        &[var("REDIS_POOL_SIZE", "10")],
        &["redis_pool_size"],
        "as it is",
        number,
    ),
    sets(
        &[var("REDIS_TIMEOUT", "10s")],
        &["redis_connect_timeout", "redis_command_timeout"],
        "a Go duration, more than zero, to both; upstream's 10 s default is not taken: Envoy's \
         rate limit filter gives up after 20 ms by default, and a decision held longer only \
         ties up a connection",
        positive_go_duration,
    ),
    refuses(
        &[var("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT")],
        Accepts::OneOf(&["WAIT"]),
        "a full pool waits, up to --redis-command-timeout",
    ),
    refuses(
        &[var("REDIS_PERSECOND", "false")],
        Accepts::False,
        "one Redis holds every limit",
    ),
    ignores(
        &[var("REDIS_PERSECOND_*", "")],
        Accepts::Any,
        "per-second Redis is off (REDIS_PERSECOND=true is refused)",
    ),
    refuses(
        &[var("BACKEND_TYPE", "redis")],
        Accepts::OneOf(&["redis"]),
        "the only backend is redis",
    ),
    ignores(
        &[var("MEMCACHE_*", "")],
        Accepts::Any,
        "the backend is Redis",
    ),
    warns(
        &[
            var("REDIS_PIPELINE_WINDOW", "0"),
            var("REDIS_PIPELINE_LIMIT", "0"),
        ],
        "each decision is one script call on a multiplexed connection",
    ),
    warns(
        &[var("REDIS_CLUSTER_PIPELINE_PARALLELISM", "1")],
        "cluster nodes are called in parallel",
    ),
    warns(
        &[var("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false")],
        "health follows a Redis probe every --health-interval",
    ),
    warns(
        &[
            var("REDIS_STARTUP_INITIAL_INTERVAL", "1s"),
            var("REDIS_STARTUP_MAX_INTERVAL", "30s"),
            var("REDIS_STARTUP_MAX_ELAPSED_TIME", "0"),
        ],
        "start-up does not wait for Redis; health says NOT_SERVING until it answers",
    ),
    // Keys and counting.
    sets(
        &[var("CACHE_KEY_PREFIX", "")],
        &["key_prefix"],
        "as it is",
        text,
    ),
    sets(
        &[var("LOCAL_CACHE_SIZE_IN_BYTES", "0")],
        &["local_cache_max_bytes"],
        "bytes",
        number,
    ),
    warns(
        &[var("EXPIRATION_JITTER_MAX_SECONDS", "300")],
        "keys expire exactly at their window's end",
    ),
    warns(
        &[var("NEAR_LIMIT_RATIO", "0.8")],
        "only upstream's near_limit statistic uses it",
    ),
    sets(
        &[var("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false")],
        &["envoy_count_denied_hits"],
        "negated",
        inverted_go_bool,
    ),
    // Answers.
    sets(
        &[var("SHADOW_MODE", "false")],
        &["shadow_mode"],
        "a Go boolean",
        go_bool,
    ),
    sets(
        &[var("QUOTA_MODE", "false")],
        &["envoy_quota_mode"],
        "a Go boolean",
        go_bool,
    ),
    sets(
        &[var("RESPONSE_DYNAMIC_METADATA", "false")],
        &["envoy_dynamic_metadata"],
        "a Go boolean",
        go_bool,
    ),
    sets(
        &[var("LIMIT_RESPONSE_HEADERS_ENABLED", "false")],
        &["envoy_limit_headers"],
        "a Go boolean",
        go_bool,
    ),
    sets(
        &[var("LIMIT_LIMIT_HEADER", "RateLimit-Limit")],
        &["envoy_limit_header"],
        "as it is",
        text,
    ),
    sets(
        &[var("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")],
        &["envoy_remaining_header"],
        "as it is",
        text,
    ),
    sets(
        &[var("LIMIT_RESET_HEADER", "RateLimit-Reset")],
        &["envoy_reset_header"],
        "as it is",
        text,
    ),
    // Statistics and tracing.
    sets(
        &[
            var("DISABLE_STATS", "false"),
            var("USE_PROMETHEUS", "false"),
            var("PROMETHEUS_ADDR", ":9090"),
            var("PROMETHEUS_PATH", "/metrics"),
        ],
        &["metrics_listen"],
        "none with DISABLE_STATS; with USE_PROMETHEUS, PROMETHEUS_ADDR (`:port` is every \
         address), served at /metrics only",
        metrics,
    ),
    refuses(
        &[var("PROMETHEUS_MAPPER_YAML", "")],
        Accepts::Nothing,
        "metrics have fixed names (docs/deployment.md)",
    ),
    warns(
        &[var("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false")],
        "response times are not exported under upstream's names",
    ),
    refuses(&[var("USE_STATSD", "true")], Accepts::False, NO_STATSD),
    refuses(
        &[var("USE_DOG_STATSD", "false")],
        Accepts::False,
        "ratelimitd sends no statsd: use USE_PROMETHEUS=true",
    ),
    ignores(
        &[
            var("STATSD_*", ""),
            var("USE_DOG_STATSD_*", ""),
            var("DOG_STATSD_MOGRIFIER*", ""),
        ],
        Accepts::Any,
        "statsd is not sent",
    ),
    warns(
        &[var("EXTRA_TAGS", ""), var("STATS_FLUSH_INTERVAL", "10s")],
        "metrics are served for Prometheus, without extra tags",
    ),
    refuses(
        &[var("TRACING_ENABLED", "false")],
        Accepts::False,
        "ratelimitd exports no traces",
    ),
    ignores(&[var("TRACING_*", "")], Accepts::Any, "tracing is off"),
    ignores(
        &[var("CONFIG_GRPC_XDS_*", ""), var("XDS_CLIENT_*", "")],
        Accepts::Any,
        "not a variable this version of upstream reads",
    ),
];

/// The xDS server: CONFIG_GRPC_XDS_SERVER_URL or its default, given either
/// way (CONFIG_TYPE=GRPC_XDS_SOTW asked for it), so that it conflicts with
/// a --config of ours.
fn xds_server(upstream: &Upstream<'_>, row: &Row) -> Result<Option<Vec<Setting>>, UpstreamError> {
    Ok(text(upstream, row)?.map(|settings| {
        settings
            .into_iter()
            .map(|setting| Setting {
                given: true,
                ..setting
            })
            .collect()
    }))
}

/// `command` with each flag's help naming the upstream variables that set
/// it, so that `--help` speaks both vocabularies.
pub fn annotate(command: Command) -> Command {
    let mut by_flag: Vec<(&str, Vec<&str>)> = Vec::new();
    for row in TABLE {
        if let Effect::Sets { flags, .. } = row.effect {
            for flag in flags {
                let names = row.variables.iter().map(|variable| variable.name);
                match by_flag.iter_mut().find(|(known, _)| known == flag) {
                    Some((_, variables)) => variables.extend(names),
                    None => by_flag.push((flag, names.collect())),
                }
            }
        }
    }
    by_flag
        .into_iter()
        .fold(command, |command, (flag, variables)| {
            let note = format!("[envoyproxy/ratelimit: {}]", variables.join(", "));
            command.mut_arg(flag, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                let long = arg.get_long_help().map(ToString::to_string);
                let arg = arg.help(format!("{help} {note}"));
                match long {
                    Some(long) => arg.long_help(format!("{long}\n\n{note}")),
                    None => arg,
                }
            })
        })
}
