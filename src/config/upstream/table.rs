//! The table itself: every variable upstream's settings read, in the
//! order of upstream's settings, with what it does here, and the variables
//! deployments of upstream set beside them that upstream does not read. A
//! new variable of upstream's is one row here (and its test in
//! `config/tests.rs`).

use super::convert::{
    Upstream, go_bool, inverted_go_bool, listen, log_level, lowercase, mapping_milliseconds,
    metrics, mogrifiers, number, path, per_second_redis, positive_go_duration, redis,
    redis_tls_path, required_path, runtime_directory, statsd, text,
};
use super::{Accepts, Convert, Effect, Row, Setting, UpstreamError, Value, Variable, When};

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

/// A row of a Go boolean that other rows depend on.
const fn switches(variables: &'static [Variable], what: &'static str) -> Row {
    Row {
        variables,
        when: &[],
        effect: Effect::Switches { what },
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
const PER_SECOND: When = When::True("REDIS_PERSECOND");

/// How the Redis TLS files convert.
const TLS_PATH: &str = "the path, to the main Redis's flag with REDIS_TLS and to the per-second \
    one's with REDIS_PERSECOND and REDIS_PERSECOND_TLS (upstream reads one set of files for both)";

/// Every variable upstream's settings read (src/settings/settings.go), and
/// what it does here; and those that deployments set beside them though
/// upstream reads none (said at start). One row a line or two, so it reads
/// as a table.
#[rustfmt::skip]
pub const TABLE: &[Row] = &[
    // The gRPC listener.
    sets(&[var("GRPC_HOST", "0.0.0.0"), var("GRPC_PORT", "8081")], &["listen"],
        "host:port, resolved", listen),
    refuses(&[var("GRPC_UDS", "")], Accepts::Nothing, "ratelimitd serves gRPC on TCP only"),
    switches(&[var("GRPC_SERVER_USE_TLS", "false")], "TLS for gRPC clients (the four rows that follow)"),
    sets(&[var("GRPC_SERVER_TLS_CERT", "")], &["tls_cert"], "the path", required_path)
        .when(&[SERVER_TLS]),
    sets(&[var("GRPC_SERVER_TLS_KEY", "")], &["tls_key"], "the path", required_path)
        .when(&[SERVER_TLS]),
    sets(&[var("GRPC_CLIENT_TLS_CACERT", "")], &["tls_client_ca"], "the path", path)
        .when(&[SERVER_TLS]),
    sets(&[var("GRPC_CLIENT_TLS_SAN", "")], &["tls_client_san"],
        "a name (DNS or IP) the client certificate must carry", path)
        .when(&[SERVER_TLS]),
    // Not upstream's: Envoy Gateway sets it beside GRPC_SERVER_USE_TLS.
    warns(&[var("GRPC_SERVER_TLS_CA_CERT", "")],
        "envoyproxy/ratelimit does not read it either, so gRPC clients are not asked for a \
         certificate; GRPC_CLIENT_TLS_CACERT (--tls-client-ca) names the CA that would ask for \
         one"),
    warns(&[var("GRPC_MAX_CONNECTION_AGE", "24h"), var("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")],
        "connections are not closed for age (idle ones after --idle-timeout)"),
    // The HTTP and debug listeners.
    sets(&[var("HOST", "0.0.0.0"), var("PORT", "8080")], &["http_listen"],
        "host:port, resolved", listen),
    sets(&[var("DEBUG_HOST", "0.0.0.0"), var("DEBUG_PORT", "6070")], &["debug_listen"],
        "host:port, resolved (/rlconfig and /metrics; no pprof, no /stats)", listen),
    // Logs.
    sets(&[var("LOG_LEVEL", "WARN")], &["log_level"],
        "logrus's names in any case (warning is warn; fatal and panic are error)", log_level),
    sets(&[var("LOG_FORMAT", "text")], &["log_format"], "text or json, any case", lowercase),
    // Where the rules come from.
    refuses(&[var("CONFIG_TYPE", "FILE")], Accepts::OneOf(&["FILE", "GRPC_XDS_SOTW"]),
        "the rules come from files (FILE) or an xDS server (GRPC_XDS_SOTW)"),
    sets(&[var("FORCE_START_WITHOUT_INITIAL_CONFIG", "false")], &["start_without_rules"],
        "a Go boolean", go_bool),
    sets(&[var("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false")], &["health_requires_rules"],
        "a Go boolean", go_bool),
    refuses(&[var("MERGE_DOMAIN_CONFIG", "false")], Accepts::False,
        "a domain must be defined in one file"),
    sets(&[var("RUNTIME_ROOT", "/srv/runtime_data/current"), var("RUNTIME_SUBDIRECTORY", ""),
            var("RUNTIME_APPDIRECTORY", "config")], &["config", "config_files"],
        "ROOT/SUBDIRECTORY/APPDIRECTORY, every file below it (not by default beside our own \
         --xds-server)", runtime_directory)
        .when(&[FILES]),
    sets(&[var("RUNTIME_IGNOREDOTFILES", "false")], &["config_dotfiles"], "negated",
        inverted_go_bool)
        .when(&[FILES]),
    ignores(&[var("RUNTIME_WATCH_ROOT", "true")], Accepts::Bool,
        "the directory's content is polled, which sees a swap of the root and an edit in place \
         alike"),
    sets(&[var("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")], &["xds_server"],
        "as it is, or upstream's default", xds_server)
        .when(&[XDS]),
    sets(&[var("CONFIG_GRPC_XDS_NODE_ID", "default")], &["xds_node_id"], "as it is", text)
        .when(&[XDS]),
    sets(&[var("CONFIG_GRPC_XDS_NODE_METADATA", "")], &["xds_node_metadata"],
        "key=value,... as it is", text)
        .when(&[XDS]),
    sets(&[var("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "")], &["xds_headers"],
        "name:value,... as it is", text)
        .when(&[XDS]).secret(),
    sets(&[var("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false")], &["xds_tls"], "a Go boolean", go_bool)
        .when(&[XDS]),
    sets(&[var("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "")], &["xds_tls_ca"], "the path", path)
        .when(&[XDS, XDS_TLS]),
    sets(&[var("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "")], &["xds_tls_cert"], "the path", path)
        .when(&[XDS, XDS_TLS]),
    sets(&[var("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "")], &["xds_tls_key"], "the path", path)
        .when(&[XDS, XDS_TLS]),
    sets(&[var("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "")], &["xds_tls_san"], "the name", path)
        .when(&[XDS, XDS_TLS]),
    sets(&[var("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s")], &["xds_retry_interval"],
        "a Go duration, more than zero", positive_go_duration)
        .when(&[XDS]),
    sets(&[var("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s")], &["xds_retry_max"],
        "a Go duration, more than zero", positive_go_duration)
        .when(&[XDS]),
    warns(&[var("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s")],
        "reconnecting backs off from --xds-retry-interval \
         (CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)"),
    warns(&[var("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5"), var("XDS_CLIENT_BACKOFF_JITTER", "true")],
        "reconnecting waits ±50% of its backoff, at random"),
    warns(&[var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "")], "xDS responses of up to 64 MiB are read"),
    // The store.
    sets(&[var("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"), var("REDIS_SOCKET_TYPE", "unix"),
            var("REDIS_TYPE", "SINGLE"), var("REDIS_AUTH", ""), var("REDIS_TLS", "false")],
        &["redis_url", "redis_mode", "redis_sentinel_master"],
        "each address a URL (redis://, rediss:// with REDIS_TLS, redis+unix:// with \
         REDIS_SOCKET_TYPE=unix) with REDIS_AUTH in it; with REDIS_TYPE=sentinel, the first entry \
         is the master's name", redis)
        .secret(),
    sets(&[var("REDIS_SENTINEL_AUTH", "")], &["redis_sentinel_auth"],
        "password or user:password; empty: sentinels without a password", text)
        .when(&[When::Is("REDIS_TYPE", "sentinel")]).secret(),
    sets(&[var("REDIS_TLS_CACERT", "")], &["redis_tls_ca", "redis_persecond_tls_ca"],
        TLS_PATH, redis_tls_path),
    sets(&[var("REDIS_TLS_CLIENT_CERT", "")], &["redis_tls_cert", "redis_persecond_tls_cert"],
        TLS_PATH, redis_tls_path),
    sets(&[var("REDIS_TLS_CLIENT_KEY", "")], &["redis_tls_key", "redis_persecond_tls_key"],
        TLS_PATH, redis_tls_path),
    refuses(&[var("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false")], Accepts::False,
        "TLS always verifies the server's name"),
    sets(&[var("REDIS_POOL_SIZE", "10")], &["redis_pool_size"], "as it is", number),
    sets(&[var("REDIS_TIMEOUT", "10s")], &["redis_connect_timeout", "redis_command_timeout"],
        "a Go duration, more than zero, to both; upstream's 10 s default is not taken: Envoy's \
         rate limit filter gives up after 20 ms by default, and a decision held longer only ties \
         up a connection", positive_go_duration),
    refuses(&[var("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT")], Accepts::OneOf(&["WAIT"]),
        "a full pool waits, up to --redis-command-timeout"),
    // The per-second Redis.
    switches(&[var("REDIS_PERSECOND", "false")],
        "a second Redis for the rules whose unit is second (the rows that follow)"),
    sets(&[var("REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock"),
            var("REDIS_PERSECOND_SOCKET_TYPE", "unix"), var("REDIS_PERSECOND_TYPE", "SINGLE"),
            var("REDIS_PERSECOND_AUTH", ""), var("REDIS_PERSECOND_TLS", "false")],
        &["redis_persecond_url", "redis_persecond_mode", "redis_persecond_sentinel_master"],
        "as REDIS_URL and its companions are (rediss:// with REDIS_PERSECOND_TLS, \
         redis+unix:// with REDIS_PERSECOND_SOCKET_TYPE=unix, REDIS_PERSECOND_AUTH in it)",
        per_second_redis)
        .when(&[PER_SECOND]).secret(),
    sets(&[var("REDIS_PERSECOND_SENTINEL_AUTH", "")], &["redis_persecond_sentinel_auth"],
        "password or user:password; empty: sentinels without a password", text)
        .when(&[PER_SECOND, When::Is("REDIS_PERSECOND_TYPE", "sentinel")]).secret(),
    sets(&[var("REDIS_PERSECOND_POOL_SIZE", "10")], &["redis_persecond_pool_size"], "as it is",
        number)
        .when(&[PER_SECOND]),
    warns(&[var("REDIS_PERSECOND_TIMEOUT", "10s")],
        "the per-second Redis waits as long as the main one (REDIS_TIMEOUT, \
         --redis-connect-timeout and --redis-command-timeout)"),
    refuses(&[var("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT")], Accepts::OneOf(&["WAIT"]),
        "a full pool waits, up to --redis-command-timeout"),
    warns(&[var("REDIS_PERSECOND_PIPELINE_WINDOW", "0"), var("REDIS_PERSECOND_PIPELINE_LIMIT", "0")],
        "each decision is one script call on a multiplexed connection"),
    warns(&[var("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1")],
        "cluster nodes are called in parallel"),
    refuses(&[var("BACKEND_TYPE", "redis")], Accepts::OneOf(&["redis"]),
        "the only backend is redis"),
    ignores(&[var("MEMCACHE_*", "")], Accepts::Any, "the backend is Redis"),
    warns(&[var("REDIS_PIPELINE_WINDOW", "0"), var("REDIS_PIPELINE_LIMIT", "0")],
        "each decision is one script call on a multiplexed connection"),
    warns(&[var("REDIS_CLUSTER_PIPELINE_PARALLELISM", "1")], "cluster nodes are called in parallel"),
    sets(&[var("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false")], &["health_follows_store"],
        "a Go boolean; health then follows a Redis probe every --health-interval, \
         not the pool's open connections", go_bool),
    warns(&[var("REDIS_STARTUP_INITIAL_INTERVAL", "1s"), var("REDIS_STARTUP_MAX_INTERVAL", "30s"),
            var("REDIS_STARTUP_MAX_ELAPSED_TIME", "0")],
        "start-up does not wait for Redis; health says NOT_SERVING until it answers"),
    // Keys and counting.
    sets(&[var("CACHE_KEY_PREFIX", "")], &["key_prefix", "envoy_key_layout"],
        "as it is; and Envoy's fixed windows named and counted as upstream's, so that both share \
         one count while a deployment moves over (--envoy-key-layout upstream)", cache_keys),
    sets(&[var("LOCAL_CACHE_SIZE_IN_BYTES", "0")], &["local_cache_max_bytes"], "bytes", number),
    warns(&[var("EXPIRATION_JITTER_MAX_SECONDS", "300")],
        "no jitter is added: a counter named as upstream's lives one unit from its last count, \
         other keys expire at their window's end"),
    warns(&[var("NEAR_LIMIT_RATIO", "0.8")], "only upstream's near_limit statistic uses it"),
    sets(&[var("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false")], &["envoy_count_denied_hits"],
        "negated", inverted_go_bool),
    // Answers.
    sets(&[var("SHADOW_MODE", "false")], &["shadow_mode"], "a Go boolean", go_bool),
    sets(&[var("QUOTA_MODE", "false")], &["envoy_quota_mode"], "a Go boolean", go_bool),
    sets(&[var("RESPONSE_DYNAMIC_METADATA", "false")], &["envoy_dynamic_metadata"],
        "a Go boolean", go_bool),
    sets(&[var("LIMIT_RESPONSE_HEADERS_ENABLED", "false")], &["envoy_limit_headers"],
        "a Go boolean", go_bool),
    sets(&[var("LIMIT_LIMIT_HEADER", "RateLimit-Limit")], &["envoy_limit_header"], "as it is",
        text),
    sets(&[var("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")], &["envoy_remaining_header"],
        "as it is", text),
    sets(&[var("LIMIT_RESET_HEADER", "RateLimit-Reset")], &["envoy_reset_header"], "as it is",
        text),
    // Statistics and tracing.
    sets(&[var("DISABLE_STATS", "false"), var("USE_PROMETHEUS", "false"),
            var("PROMETHEUS_ADDR", ":9090"), var("PROMETHEUS_PATH", "/metrics")],
        &["metrics_listen"],
        "none with DISABLE_STATS; with USE_PROMETHEUS, PROMETHEUS_ADDR (`:port` is every \
         address), served at /metrics only", metrics),
    sets(&[var("PROMETHEUS_MAPPER_YAML", "")], &["stats_mapping"],
        "the path (a statsd_exporter mapping)", path)
        .when(&[When::True("USE_PROMETHEUS")]),
    sets(&[var("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false")],
        &["stats_mapping_milliseconds"],
        "a Go boolean; with upstream's default mapping only, as upstream", mapping_milliseconds),
    sets(&[var("USE_STATSD", "true"), var("USE_DOG_STATSD", "false"), var("STATSD_HOST", "localhost"),
            var("STATSD_PORT", "8125")], &["statsd_address", "statsd_dogstatsd"],
        "STATSD_HOST:STATSD_PORT unless USE_STATSD and USE_DOG_STATSD are false or DISABLE_STATS \
         is true; refused with USE_PROMETHEUS or both, as upstream", statsd),
    sets(&[var("USE_DOG_STATSD_MOGRIFIERS", "")], &["statsd_mogrifier"],
        "each named one from DOG_STATSD_MOGRIFIER_<name>_PATTERN, _NAME and _TAGS", mogrifiers)
        .when(&[When::True("USE_DOG_STATSD")]),
    sets(&[var("EXTRA_TAGS", "")], &["stats_tags"], "key:value,... as it is", text),
    sets(&[var("STATS_FLUSH_INTERVAL", "10s")], &["statsd_flush_interval"],
        "a Go duration, more than zero", positive_go_duration),
    warns(&[var("STATSD_PROTOCOL", "tcp")],
        "statsd is sent over UDP (statsd_exporter and the Datadog agent listen on UDP)"),
    ignores(&[var("STATSD_*", ""), var("USE_DOG_STATSD_*", ""), var("DOG_STATSD_MOGRIFIER*", "")],
        Accepts::Any, "read by the rows above, or not read by upstream either"),
    refuses(&[var("TRACING_ENABLED", "false")], Accepts::False, "ratelimitd exports no traces"),
    ignores(&[var("TRACING_*", "")], Accepts::Any, "tracing is off"),
    ignores(&[var("CONFIG_GRPC_XDS_*", ""), var("XDS_CLIENT_*", "")], Accepts::Any,
        "not a variable this version of upstream reads"),
];

/// The key prefix (CACHE_KEY_PREFIX or upstream's empty default), and
/// upstream's key layout for Envoy's fixed windows, as a default of ours
/// (our own --envoy-key-layout, when given, wins).
fn cache_keys(upstream: &Upstream<'_>, row: &Row) -> Result<Option<Vec<Setting>>, UpstreamError> {
    let mut settings = text(upstream, row)?.unwrap_or_default();
    settings.push(Setting {
        flag: "envoy_key_layout",
        value: Value::Args(vec!["upstream".into()]),
        given: false,
        from: row.variables[0].name.to_owned(),
        secret: false,
    });
    Ok(Some(settings))
}

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
