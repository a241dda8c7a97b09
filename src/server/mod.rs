//! Wires the subsystems into one server: each group of options becomes its
//! subsystem's settings, the store and the rules are set up, and the tonic
//! router (our API, Envoy's, the quota service, health, reflection; TLS)
//! serves on a bound listener until `shutdown` resolves. Taking the
//! listener and the shutdown future from the caller lets tests start a
//! server on port 0 and stop it at will.

pub mod bounds;
pub mod options;

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::api::check::CheckService;
use crate::api::envoy::options::RulesSource;
use crate::api::envoy::{EnvoyService, xds};
use crate::api::rlqs::QuotaService;
use crate::config::{Config, InvalidConfig};
use crate::drain::DrainLayer;
use crate::error::StoreError;
use crate::health;
use crate::incoming;
use crate::limit::FailurePolicy;
use crate::limiter::Limiter;
use crate::load_shed::DecisionSlots;
use crate::metrics;
use crate::rules::ConfigError;
use crate::rules::{ConfigSource, RulesHandle};
use crate::stats::{self, ServerStatsLayer};
use crate::tls::{ServerTls, TlsError};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The rules could not be loaded.
    #[error("configuration: {0}")]
    Rules(#[from] ConfigError),
    /// An option cannot work.
    #[error(transparent)]
    Options(#[from] InvalidConfig),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
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

/// The metrics endpoint and upstream's statistics, as configured: the
/// statistics' mapping read first, so that a bad one stops the start.
fn install_telemetry(config: &Config) -> Result<(), ServeError> {
    let Some(listen) = config.telemetry.metrics_listen else {
        stats::install(&config.stats, None);
        return Ok(());
    };
    let mapping = config.stats.mapping().map_err(|err| config.invalid(err))?;
    let histograms = mapping
        .histograms()
        .into_iter()
        .map(|(name, buckets)| {
            let matcher = match name {
                stats::mapper::HistogramName::Full(name) => {
                    metrics_exporter_prometheus::Matcher::Full(name)
                }
                stats::mapper::HistogramName::Prefix(prefix) => {
                    metrics_exporter_prometheus::Matcher::Prefix(prefix)
                }
            };
            (matcher, buckets)
        })
        .collect();
    metrics::install(listen, histograms)?;
    stats::install(&config.stats, Some(mapping));
    Ok(())
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
    let tls = config.tls.settings().map(ServerTls::load).transpose()?;
    let store = config.store_settings()?;
    let rules_source = config.rules_source()?;
    // Before the rules are loaded: loading them is counted.
    install_telemetry(&config)?;
    let (rules, rules_task) = follow_rules(rules_source)?;
    let limiter = config.limiter.build(&store)?;
    let (quota_shutdown, quota_shutdown_watch) = tokio::sync::watch::channel(false);
    let apis = Apis::new(&config, &limiter, rules, quota_shutdown_watch);
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health_task = watch_health(&config, &limiter, &reporter).await;
    let (reflection_v1, reflection_v1alpha) = reflection(config.listener.reflection)?;
    match listener.local_addr() {
        Ok(address) => info!(%address, "serving gRPC"),
        Err(err) => info!(%err, "serving gRPC (local address unknown)"),
    }
    let shutting_down = incoming::ShutdownStarted::default();
    let tls_task = tls.as_ref().map(|tls| tokio::spawn(tls.watch()));
    let incoming = incoming::connections(
        listener,
        config.bounds.connections(shutting_down.clone()),
        tls.as_ref().map(ServerTls::acceptor),
    );
    let draining = Arc::new(Notify::new());
    let stop = Stopping {
        shutting_down,
        tasks: [Some(health_task), rules_task, tls_task],
        reporter,
        quota_shutdown,
        draining: draining.clone(),
    }
    .after(shutdown);
    let max_request = config.bounds.max_request_bytes as usize;
    let serve = Server::builder()
        .timeout(config.bounds.request_timeout)
        .max_concurrent_streams(config.bounds.max_concurrent_streams)
        .http2_keepalive_interval(config.bounds.http2_keepalive_interval.get())
        .http2_keepalive_timeout(Some(config.bounds.http2_keepalive_timeout))
        .layer(DrainLayer)
        .layer(ServerStatsLayer)
        .add_service(health_service)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(
            apis.check
                .into_server()
                .max_decoding_message_size(max_request),
        )
        .add_service(
            apis.envoy
                .into_server()
                .max_decoding_message_size(max_request),
        )
        .add_service(
            apis.quota
                .into_server()
                .max_decoding_message_size(max_request),
        )
        .serve_with_incoming_shutdown(incoming, stop);
    let grace = config.listener.shutdown_grace;
    tokio::select! {
        result = serve => result?,
        () = grace_after(draining, grace) => warn!(?grace, "calls still in flight after the grace period; stopping anyway"),
    }
    info!("stopped");
    Ok(())
}

/// Reports NOT_SERVING until the stores are seen to answer, then follows
/// them (see [`health::watch`]): the task doing so.
async fn watch_health(
    config: &Config,
    limiter: &Limiter,
    reporter: &tonic_health::server::HealthReporter,
) -> JoinHandle<()> {
    health::report(reporter, ServingStatus::NotServing).await;
    // With a policy that answers without Redis, the instance can serve
    // while Redis is down.
    let serves_without_store = config.limiter.failure_policy != FailurePolicy::FailClosed;
    tokio::spawn(health::watch(
        limiter.stores(),
        reporter.clone(),
        config.store.health_interval,
        serves_without_store,
    ))
}

/// The three APIs on one limiter and one set of rules.
struct Apis {
    check: CheckService,
    envoy: EnvoyService,
    quota: QuotaService,
}

impl Apis {
    fn new(
        config: &Config,
        limiter: &Limiter,
        rules: RulesHandle,
        quota_shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let slots = DecisionSlots::new(
            config.bounds.max_concurrent_requests as usize,
            config.bounds.max_concurrent_requests_per_peer(),
        );
        let quota = QuotaService::new(
            limiter.store().quota_ledgers(),
            rules.clone(),
            config.quota.settings(
                &config.bounds.envoy_request(),
                config.envoy.shadow_mode,
                config.limiter.failure_policy,
                &config.limiter.key_prefix,
            ),
            quota_shutdown,
        );
        let check = CheckService::new(
            limiter.clone(),
            slots.clone(),
            rules.clone(),
            config.bounds.check_request(),
        );
        let envoy = EnvoyService::new(
            limiter.clone(),
            rules,
            config.envoy.settings(config.bounds.envoy_request()),
            slots,
        );
        Self {
            check,
            envoy,
            quota,
        }
    }
}

/// What a shutdown stops, in order.
struct Stopping {
    shutting_down: incoming::ShutdownStarted,
    /// Background tasks (health, rules, certificates), aborted.
    tasks: [Option<JoinHandle<()>>; 3],
    reporter: tonic_health::server::HealthReporter,
    quota_shutdown: tokio::sync::watch::Sender<bool>,
    /// Told when calls in flight start draining.
    draining: Arc<Notify>,
}

impl Stopping {
    /// Waits for `shutdown`, then stops: the future tonic serves until.
    async fn after(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        // Before tonic sends GOAWAY: from now on a connection closes as
        // soon as it has no call in flight.
        let _ = self.shutting_down.set(Instant::now());
        info!("shutting down: health NOT_SERVING, finishing calls in flight");
        self.tasks
            .into_iter()
            .flatten()
            .for_each(|task| task.abort());
        health::report(&self.reporter, ServingStatus::NotServing).await;
        // Quota streams never finish by themselves: end them, so the
        // Envoys reconnect to another instance.
        let _ = self.quota_shutdown.send(true);
        self.draining.notify_one();
    }
}

/// Resolves `grace` after calls started draining.
async fn grace_after(draining: Arc<Notify>, grace: std::time::Duration) {
    draining.notified().await;
    tokio::time::sleep(grace).await;
}

/// The rules from `source`, and the task that follows its changes: a
/// directory polled, or an xDS stream. A configuration that cannot be read
/// stops the start.
fn follow_rules(source: RulesSource) -> Result<(RulesHandle, Option<JoinHandle<()>>), ServeError> {
    Ok(match source {
        RulesSource::Files {
            path,
            selection,
            poll_interval,
        } => {
            let (source, rules) = ConfigSource::load(path, selection)?;
            let rules = RulesHandle::new(rules);
            let task = tokio::spawn(source.watch(rules.clone(), poll_interval));
            (rules, Some(task))
        }
        RulesSource::Xds(xds) => {
            info!(server = %xds.server, node = %xds.node_id, "Envoy rules from xDS");
            let rules = RulesHandle::default();
            (rules.clone(), Some(tokio::spawn(xds::watch(xds, rules))))
        }
        RulesSource::None => (RulesHandle::default(), None),
    })
}

/// Both versions of reflection, unless it is off: v1 for current tools,
/// v1alpha for those still widely installed (grpcurl 1.8, Python's
/// grpcio-reflection). The services are named: the descriptors also hold
/// the xDS service the configuration source is a client of, which is not
/// served.
#[allow(clippy::type_complexity)]
fn reflection(
    on: bool,
) -> Result<
    (
        Option<
            tonic_reflection::server::v1::ServerReflectionServer<
                impl tonic_reflection::server::v1::ServerReflection,
            >,
        >,
        Option<
            tonic_reflection::server::v1alpha::ServerReflectionServer<
                impl tonic_reflection::server::v1alpha::ServerReflection,
            >,
        >,
    ),
    ServeError,
> {
    if !on {
        info!("reflection off (--reflection=false)");
        return Ok((None, None));
    }
    let builder = |itself: &'static str| {
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
    Ok((
        Some(builder("grpc.reflection.v1.ServerReflection").build_v1()?),
        Some(builder("grpc.reflection.v1alpha.ServerReflection").build_v1alpha()?),
    ))
}
