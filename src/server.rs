//! Builds the store and the tonic router (our API, health, reflection) from
//! a [`Config`], and serves on a bound listener until `shutdown` resolves.
//! Taking the listener and the shutdown future from the caller lets tests
//! start a server on port 0 and stop it at will.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::api::check::{CheckBounds, CheckService};
use crate::api::envoy::{EnvoyService, EnvoySettings, LimitHeaderNames, RequestBounds, xds};
use crate::api::rlqs::{QuotaService, QuotaSettings};
use crate::config::{
    Config, ConfigFiles, EmbeddedSettings, StartSettings, StoreSettings, redacted_url,
};
use crate::drain::DrainLayer;
use crate::error::StoreError;
use crate::health;
use crate::incoming::{self, IncomingSettings};
use crate::limit::FailurePolicy;
use crate::limiter::{DenialCache, Limiter, Store};
use crate::load_shed::DecisionSlots;
use crate::metrics;
use crate::quota::{MemoryLedger, QuotaLedger};
use crate::rules::{ConfigError, ConfigSource, FileSelection, RulesHandle};
use crate::store::{MemoryStore, RedisStore, SystemClock};
use crate::tls::{ServerTls, TlsError, TlsSettings};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A configuration file could not be loaded.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A file the configuration names could not be read, or the Redis
    /// settings cannot work.
    #[error("configuration: {0}")]
    Files(String),
    /// The metrics exporter could not start.
    #[error("metrics: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// Reflection could not be built.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The limiter `store` names: on Redis (with this instance's own embedded
/// store for the `local` failure policy) or on the embedded store alone.
/// Must run inside a tokio runtime (embedded stores start their eviction
/// task).
pub fn build_limiter(config: &Config, store: &StoreSettings) -> Result<Limiter, StoreError> {
    let embedded = |settings: &EmbeddedSettings| {
        let memory =
            MemoryStore::with_max_bytes(Arc::new(SystemClock::default()), settings.max_bytes);
        memory.spawn_sweeper(settings.sweep_interval);
        memory
    };
    match store {
        StoreSettings::Redis { redis, local } => {
            info!(
                urls = ?redis.urls.iter().map(|url| redacted_url(url)).collect::<Vec<_>>(),
                topology = ?redis.topology,
                failure_policy = ?config.failure.failure_policy,
                "using Redis"
            );
            let store = Store::Redis(RedisStore::new(redis)?);
            Ok(Limiter::new(store, config.store.key_prefix.clone())
                .with_failure_policy(config.failure.failure_policy, embedded(local))
                .with_denial_cache(DenialCache::new(
                    config.store.local_cache_size,
                    config.store.local_cache_max_bytes,
                )))
        }
        StoreSettings::Embedded(settings) => {
            warn!(
                "no --redis-url: using the embedded in-memory store; limits are NOT shared \
                 between ratelimitd instances and are lost on restart"
            );
            Ok(Limiter::new(
                Store::Memory(embedded(settings)),
                config.store.key_prefix.clone(),
            ))
        }
    }
}

/// The quota ledgers on the limiter's store: on Redis, with this
/// process's own ledger for the `local` failure policy; or, on the
/// embedded store, this process's own alone.
fn quota_ledgers(store: &Store) -> (QuotaLedger, Option<QuotaLedger>) {
    let own = || QuotaLedger::Memory(MemoryLedger::new(Arc::new(SystemClock::default())));
    match store {
        Store::Redis(redis) => (QuotaLedger::Redis(redis.clone()), Some(own())),
        Store::Memory(_) => (own(), None),
    }
}

/// The TLS the configuration names, if any: a certificate and key
/// (reloaded when they change), and with a client CA, mutual TLS.
fn server_tls(config: &Config) -> Result<Option<ServerTls>, TlsError> {
    let (Some(cert), Some(key)) = (&config.listener.tls_cert, &config.listener.tls_key) else {
        return Ok(None);
    };
    ServerTls::load(TlsSettings {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: config.listener.tls_client_ca.clone(),
        client_san: config.listener.tls_client_san.clone(),
        reload_interval: config.listener.tls_reload_interval,
    })
    .map(Some)
}

/// Serves on `listener` until `shutdown` resolves; then health turns
/// NOT_SERVING, no new calls are accepted, and calls in flight finish before
/// this returns (waiting at most the configured grace, so a client holding a
/// stream open cannot keep the process alive).
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    // rustls (TLS to clients and to Redis) needs one crypto provider for
    // the process; a second call finds it installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Everything that can refuse to start comes before any task is spawned.
    let tls = server_tls(&config)?;
    let StartSettings { store, xds } = config.read_at_start().map_err(ServeError::Files)?;
    if let Some(listen) = config.telemetry.metrics_listen {
        metrics::install(listen)?;
        info!(%listen, "serving Prometheus metrics at /metrics");
    }
    let (rules, config_watch) = match &config.envoy.config {
        Some(path) => {
            let selection = FileSelection {
                every_file: config.envoy.config_files == ConfigFiles::All,
                dotfiles: config.envoy.config_dotfiles,
            };
            let (source, rules) = ConfigSource::load(path.clone(), selection)?;
            let rules = RulesHandle::new(rules);
            let watch =
                tokio::spawn(source.watch(rules.clone(), config.envoy.config_poll_interval));
            (rules, Some(watch))
        }
        None => match xds {
            Some(xds) => {
                info!(server = %xds.server, node = %xds.node_id, "Envoy rules from xDS");
                let rules = RulesHandle::default();
                (rules.clone(), Some(tokio::spawn(xds::watch(xds, rules))))
            }
            None => (RulesHandle::default(), None),
        },
    };
    let limiter = build_limiter(&config, &store)?;
    let per_peer = config
        .limits
        .max_concurrent_requests_per_peer
        .unwrap_or(
            config.limits.max_concurrent_requests - config.limits.max_concurrent_requests / 10,
        )
        .max(1);
    let slots = DecisionSlots::new(
        config.limits.max_concurrent_requests as usize,
        per_peer as usize,
    );
    let (quota_shutdown, quota_shutdown_watch) = tokio::sync::watch::channel(false);
    let (quota_ledger, local_quota_ledger) = quota_ledgers(limiter.store());
    let quota = QuotaService::new(
        quota_ledger,
        local_quota_ledger,
        rules.clone(),
        QuotaSettings {
            assignment_ttl: config.quota.quota_assignment_ttl,
            subscriber_timeout: config.quota.quota_subscriber_timeout,
            rebalance_interval: config.quota.quota_rebalance_interval,
            headroom_permille: u64::from(config.quota.quota_headroom) * 10,
            max_buckets_per_stream: config.quota.quota_max_buckets_per_stream,
            max_buckets: config.quota.quota_max_buckets,
            max_entries: config.limits.max_descriptor_entries,
            max_entry_bytes: config.limits.max_descriptor_entry_bytes,
            shadow_mode: config.envoy.shadow_mode,
            failure_policy: config.failure.failure_policy,
            key_prefix: config.store.key_prefix.clone(),
        },
        quota_shutdown_watch,
    );
    let check_rules = rules.clone();
    let check_bounds = CheckBounds {
        max_limits: config.limits.max_limits_per_request,
        max_batch: config.limits.max_batch_size,
    };
    let envoy = EnvoyService::new(
        limiter.clone(),
        rules,
        EnvoySettings {
            shadow_mode: config.envoy.shadow_mode,
            ratelimit_headers: config.envoy.envoy_ratelimit_headers,
            count_denied_hits: config.envoy.envoy_count_denied_hits,
            quota_mode: config.envoy.envoy_quota_mode,
            dynamic_metadata: config.envoy.envoy_dynamic_metadata,
            limit_headers: config.envoy.envoy_limit_headers.then(|| LimitHeaderNames {
                limit: config.envoy.envoy_limit_header.clone(),
                remaining: config.envoy.envoy_remaining_header.clone(),
                reset: config.envoy.envoy_reset_header.clone(),
            }),
            bounds: RequestBounds {
                max_descriptors: config.limits.max_descriptors,
                max_entries: config.limits.max_descriptor_entries,
                max_entry_bytes: config.limits.max_descriptor_entry_bytes,
            },
        },
        slots.clone(),
    );

    let (reporter, health_service) = tonic_health::server::health_reporter();
    health::report(&reporter, ServingStatus::NotServing).await;
    // With a policy that answers without Redis, the instance can serve
    // while Redis is down.
    let serves_without_store = config.failure.failure_policy != FailurePolicy::FailClosed;
    let health_task = tokio::spawn(health::watch(
        limiter.store().clone(),
        reporter.clone(),
        config.failure.health_interval,
        serves_without_store,
    ));

    // Both versions of reflection: v1 for current tools, v1alpha for those
    // still widely installed (grpcurl 1.8, Python's grpcio-reflection).
    // The services are named: the descriptors also hold the xDS service
    // the configuration source is a client of, which is not served.
    let reflection = |itself: &'static str| {
        [
            "ratelimitd.v1.RateLimiter",
            "envoy.service.ratelimit.v3.RateLimitService",
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
            "grpc.health.v1.Health",
            itself,
        ]
        .into_iter()
        .fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, service| builder.with_service_name(service),
        )
    };
    let (reflection_v1, reflection_v1alpha) = if config.listener.reflection {
        (
            Some(reflection("grpc.reflection.v1.ServerReflection").build_v1()?),
            Some(reflection("grpc.reflection.v1alpha.ServerReflection").build_v1alpha()?),
        )
    } else {
        info!("reflection off (--reflection=false)");
        (None, None)
    };

    match listener.local_addr() {
        Ok(address) => info!(%address, "serving gRPC"),
        Err(err) => info!(%err, "serving gRPC (local address unknown)"),
    }
    let shutting_down = incoming::ShutdownStarted::default();
    let tls_watch = tls.as_ref().map(|tls| tokio::spawn(tls.watch()));
    let incoming = incoming::connections(
        listener,
        IncomingSettings {
            max_connections: config.limits.max_connections,
            tcp_keepalive: nonzero(config.limits.tcp_keepalive),
            idle_timeout: nonzero(config.limits.idle_timeout),
            shutting_down: shutting_down.clone(),
        },
        tls.as_ref().map(ServerTls::acceptor),
    );
    let draining = Arc::new(Notify::new());
    let stop = {
        let draining = draining.clone();
        async move {
            shutdown.await;
            // Before tonic sends GOAWAY: from now on a connection closes as
            // soon as it has no call in flight.
            let _ = shutting_down.set(Instant::now());
            info!("shutting down: health NOT_SERVING, finishing calls in flight");
            health_task.abort();
            if let Some(config_watch) = config_watch {
                config_watch.abort();
            }
            if let Some(tls_watch) = tls_watch {
                tls_watch.abort();
            }
            health::report(&reporter, ServingStatus::NotServing).await;
            // Quota streams never finish by themselves: end them, so the
            // Envoys reconnect to another instance.
            let _ = quota_shutdown.send(true);
            draining.notify_one();
        }
    };
    let max_request = config.limits.max_request_bytes as usize;
    let builder = Server::builder()
        .timeout(config.limits.request_timeout)
        .max_concurrent_streams(config.limits.max_concurrent_streams)
        .http2_keepalive_interval(nonzero(config.limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(config.limits.http2_keepalive_timeout));
    let serve = builder
        .layer(DrainLayer)
        .add_service(health_service)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(
            CheckService::new(limiter, slots, check_rules, check_bounds)
                .into_server()
                .max_decoding_message_size(max_request),
        )
        .add_service(envoy.into_server().max_decoding_message_size(max_request))
        .add_service(quota.into_server().max_decoding_message_size(max_request))
        .serve_with_incoming_shutdown(incoming, stop);
    let grace = config.listener.shutdown_grace;
    let grace_expired = async move {
        draining.notified().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = serve => result?,
        () = grace_expired => warn!(?grace, "calls still in flight after the grace period; stopping anyway"),
    }
    info!("stopped");
    Ok(())
}

/// `None` for a zero duration: the flags' "0s" for "off".
fn nonzero(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}
