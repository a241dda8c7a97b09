//! Wires the subsystems into one server: each group of options becomes its
//! subsystem's settings, the store and the rules are set up, the HTTP
//! listeners start, and the tonic router (our API, Envoy's, the quota
//! service, health, reflection; TLS) serves on the gRPC port (opened once
//! the first xDS configuration came, unless told not to wait) until
//! `shutdown` resolves. Taking the bound sockets ([`Listeners`]) and the
//! shutdown future from the caller lets tests start a server on port 0 and
//! stop it at will.
//!
//! Shutdown, in order: health turns NOT_SERVING (gRPC health, and 500 at
//! `/healthcheck`); gRPC serves on as usual for `--shutdown-delay`; then no
//! new calls are accepted, and calls in flight finish (for at most the
//! grace); then the HTTP listeners stop.

pub mod banner;
pub mod bounds;
pub mod listeners;
pub mod options;
mod reflection;
mod serving;
pub mod threads;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tracing::{debug, error, info};

pub use self::listeners::{BindError, Listeners};
use self::serving::{Serving, Stopping};
pub use self::threads::ServingThreads;
use crate::api::check::CheckService;
use crate::api::envoy::options::RulesSource;
use crate::api::envoy::{EnvoyService, xds};
use crate::api::lease::LeaseService;
use crate::api::rlqs::QuotaService;
use crate::config::Config;
use crate::config_error::ConfigError;
use crate::decider::Decider;
use crate::drain::DrainLayer;
use crate::error::StoreError;
use crate::health::{self, Health};
use crate::http::{self, Served};
use crate::incoming;
use crate::lease::Leaser;
use crate::limit::FailurePolicy;
use crate::limiter::Limiter;
use crate::load_shed::DecisionSlots;
use crate::metrics;
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
    Rules(ConfigError),
    /// An option cannot work.
    #[error(transparent)]
    Options(#[from] ConfigError),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The metrics exporter could not start.
    #[error("metrics: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// Reflection could not be built.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC port could not be opened.
    #[error("cannot listen on the gRPC port (--listen): {0}")]
    Listen(#[source] std::io::Error),
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A worker thread's server ended abnormally.
    #[error("a worker thread's gRPC server failed: {0}")]
    Thread(#[source] tokio::task::JoinError),
}

/// The metrics recorder and upstream's statistics, as configured: the
/// statistics' mapping read first, so that a bad one stops the start. The
/// recorder is installed when something reads it (the metrics listener,
/// or the debug listener's `/metrics`), and its handle returned.
fn install_telemetry(config: &Config) -> Result<Option<PrometheusHandle>, ServeError> {
    let listen = config.telemetry.metrics_listen;
    if listen.is_none() && config.http.debug_listen.0.is_none() {
        stats::install(&config.stats, None);
        return Ok(None);
    }
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
    let handle = metrics::install(listen, histograms)?;
    stats::install(&config.stats, Some(mapping));
    Ok(Some(handle))
}

/// Serves on `listeners` until `shutdown` resolves, then stops in the
/// order the module's documentation gives; returns once calls in flight
/// have finished (waiting at most the configured grace, so a client
/// holding a stream open cannot keep the process alive). Serves on the
/// caller's runtime alone.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run_on_threads(config, listeners, shutdown, &ServingThreads::none()).await
}

/// [`run`], with gRPC connections spread among the caller's runtime and
/// those of `threads` (see [`threads::WorkerThreads::runtimes`]).
pub async fn run_on_threads(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    threads: &ServingThreads,
) -> Result<(), ServeError> {
    // rustls (TLS to clients and to Redis) needs one crypto provider for
    // the process; a second call finds it installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Everything that can refuse to start comes before any task is spawned.
    let tls = config.tls.settings().map(ServerTls::load).transpose()?;
    let store = config.store_settings()?;
    let rules_source = config.rules_source()?;
    let admin = AdminStart::read(&config, &rules_source)?;
    // Before the rules are loaded: loading them is counted.
    let metrics = install_telemetry(&config)?;
    let start_without_rules = config.envoy.start_without_rules;
    let waits_for_rules = matches!(rules_source, RulesSource::Xds(_)) && !start_without_rules;
    let (rules, rules_task) = follow_rules(rules_source, start_without_rules)?;
    let limiter = config.limiter.build(&store)?;
    if listeners.http.is_some() {
        // The web console's live view, served on the HTTP listener.
        let stores = limiter.stores().iter().map(|store| store.label()).collect();
        crate::live::install(config.limiter.failure_policy, stores);
    }
    let (quota_shutdown, quota_shutdown_watch) = watch::channel(false);
    let apis = Apis::new(&config, &limiter, rules.clone(), quota_shutdown_watch);
    let health = Health::new(config.envoy.health_requires_rules);
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let admin = admin.map(|admin| admin.parts(&config, &rules, &apis));
    let http_side = HttpSide::new(&config, &health, &apis, &rules, metrics, admin);
    let router = grpc_router(&config, apis, health_service)?;
    let mut background = Background::start(&config, &limiter, &health, &rules, reporter);
    background.tasks.extend(rules_task);
    background
        .tasks
        .extend(tls.as_ref().map(|tls| tokio::spawn(tls.watch())));
    let Listeners { grpc, http, debug } = listeners;
    let runtimes = threads.handles();
    let http_side = http_side.start((http, debug), config.http.http_read_timeout, &runtimes);
    let grace = config.listener.shutdown_grace;
    let mut shutdown = std::pin::pin!(shutdown);
    if waits_for_rules && !first_configuration(&rules, shutdown.as_mut()).await {
        health.stop();
        background.abort();
        background.grpc_health.abort();
        http_side.stop(grace).await;
        info!("stopped before the first configuration came");
        return Ok(());
    }
    let listener = grpc
        .listen(listeners::BACKLOG)
        .map_err(ServeError::Listen)?;
    log_opened(&listener, waits_for_rules);
    health.opened();
    let shutting_down = incoming::ShutdownStarted::default();
    let settings = config.bounds.connections(shutting_down.clone());
    let tls = tls.as_ref().map(ServerTls::acceptor);
    let stores = limiter.stores();
    let serving = Serving::start(listener, &settings, tls, &router, stores, &runtimes);
    let stop = Stopping {
        shutting_down,
        background,
        health,
        delay: config.listener.shutdown_delay.get(),
        quota_shutdown,
        draining: Arc::new(Notify::new()),
        stop_serving: serving.stop_serving.clone(),
    };
    serving.until(stop, shutdown, grace).await?;
    http_side.stop(grace).await;
    info!("stopped");
    Ok(())
}

/// Says the gRPC port is open. The start-up lines named it already: this
/// is news only when it waited for the first configuration.
fn log_opened(listener: &tokio::net::TcpListener, waited_for_rules: bool) {
    match listener.local_addr() {
        Ok(address) if waited_for_rules => info!(%address, "first configuration in: gRPC open"),
        Ok(address) => debug!(%address, "gRPC open"),
        Err(err) => info!(%err, "gRPC open (local address unknown)"),
    }
}

/// The admin API's token (its file read: an error stops the start) and
/// where the rules come from, before anything starts.
struct AdminStart {
    token: crate::options::Secret,
    rules_origin: String,
}

impl AdminStart {
    /// `None` without a token: no admin API.
    fn read(config: &Config, source: &RulesSource) -> Result<Option<Self>, ServeError> {
        let token = config
            .http
            .admin
            .token()
            .map_err(|err| config.invalid(err))?;
        let Some(token) = token else {
            return Ok(None);
        };
        let rules_origin = match source {
            RulesSource::None => "none".to_owned(),
            RulesSource::Files { path, .. } => format!("files {}", path.display()),
            RulesSource::Xds(xds) => format!("xds {}", xds.server),
        };
        Ok(Some(Self {
            token,
            rules_origin,
        }))
    }

    /// What the admin API serves.
    fn parts(self, config: &Config, rules: &RulesHandle, apis: &Apis) -> http::admin::AdminParts {
        http::admin::AdminParts {
            token: self.token,
            rules: rules.clone(),
            rules_origin: self.rules_origin,
            quota: apis.quota.clone(),
            effective: config.effective.clone(),
        }
    }
}

/// Waits until the rules source has delivered its first configuration
/// (put in force or rejected, as envoyproxy/ratelimit waits for its first
/// update): `true`; or until `shutdown` comes first: `false`.
async fn first_configuration(
    rules: &RulesHandle,
    shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> bool {
    let mut loads = rules.loads();
    info!("waiting for the first configuration from xDS before opening the gRPC port");
    tokio::select! {
        arrived = loads.wait_for(|loads| loads.arrived) => arrived.is_ok(),
        () = shutdown => false,
    }
}

/// The tasks that run beside the server.
struct Background {
    /// Tells gRPC health each change of health; ends by itself once it
    /// has told shutdown.
    grpc_health: JoinHandle<()>,
    /// The store probe, health following the rules, the rules source,
    /// certificate reloads: aborted at shutdown.
    tasks: Vec<JoinHandle<()>>,
}

impl Background {
    /// Health's tasks: the stores' probe (health is not serving until the
    /// stores are seen to answer, see [`health::watch`]), rules into health,
    /// health into gRPC health.
    fn start(
        config: &Config,
        limiter: &Limiter,
        health: &Health,
        rules: &RulesHandle,
        reporter: tonic_health::server::HealthReporter,
    ) -> Self {
        // With a policy that answers without Redis, the instance can serve
        // while Redis is down; without following the store, it stays up.
        let while_down = if config.limiter.failure_policy != FailurePolicy::FailClosed {
            health::WhileDown::PolicyAnswers
        } else if !config.store.health_follows_store {
            health::WhileDown::Unfollowed
        } else {
            health::WhileDown::NotServing
        };
        let probe = tokio::spawn(health::watch(
            limiter.stores(),
            health.clone(),
            config.store.health_interval,
            while_down,
        ));
        let rules = tokio::spawn(health::follow_rules(health.clone(), rules.loads()));
        Self {
            grpc_health: tokio::spawn(health::follow_in_grpc(health.clone(), reporter)),
            tasks: vec![probe, rules],
        }
    }

    /// Stops every task but gRPC health's.
    fn abort(&self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

/// The routers of the HTTP listeners, before they start.
struct HttpSide {
    service: Router,
    debug: Router,
}

/// The HTTP listeners, when on.
struct HttpServed {
    service: Option<Served>,
    debug: Option<Served>,
}

impl HttpSide {
    fn new(
        config: &Config,
        health: &Health,
        apis: &Apis,
        rules: &RulesHandle,
        metrics: Option<PrometheusHandle>,
        admin: Option<http::admin::AdminParts>,
    ) -> Self {
        let bounds = http::BodyBounds {
            max_bytes: config.bounds.max_request_bytes as usize,
            read_timeout: config.http.http_read_timeout,
        };
        Self {
            service: http::service_routes(http::ServiceParts {
                health: health.clone(),
                envoy: apis.envoy.clone(),
                decider: apis.decider.clone(),
                bounds,
                admin,
            }),
            debug: http::debug::routes(rules.clone(), metrics),
        }
    }

    /// Serves each router on its listener, when it has one, with
    /// `header_timeout` for a request's headers; the service listener's
    /// connections on `runtimes` in turn, the debug listener's on this one.
    fn start(
        self,
        (http, debug): (Option<TcpListener>, Option<TcpListener>),
        header_timeout: Duration,
        runtimes: &[Handle],
    ) -> HttpServed {
        HttpServed {
            service: http.map(|l| {
                Served::start(
                    "HTTP (/v1, /healthz, /readyz, /healthcheck, /json)",
                    l,
                    self.service,
                    header_timeout,
                    runtimes.to_vec(),
                )
            }),
            debug: debug.map(|l| {
                Served::start(
                    "debug endpoints",
                    l,
                    self.debug,
                    header_timeout,
                    vec![Handle::current()],
                )
            }),
        }
    }
}

impl HttpServed {
    /// Stops both, each waiting at most `grace` for requests in flight.
    async fn stop(self, grace: Duration) {
        for served in [self.service, self.debug].into_iter().flatten() {
            served.stop(grace).await;
        }
    }
}

/// The tonic router: health, reflection unless it is off, and the three
/// APIs, within the bounds.
fn grpc_router(
    config: &Config,
    apis: Apis,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Result<GrpcRouter, ServeError> {
    let (reflection_v1, reflection_v1alpha) = reflection::services(config.listener.reflection)?;
    let max_request = config.bounds.max_request_bytes as usize;
    Ok(Server::builder()
        .timeout(config.bounds.request_timeout)
        .max_concurrent_streams(config.bounds.max_concurrent_streams)
        .http2_keepalive_interval(config.bounds.http2_keepalive_interval.get())
        .http2_keepalive_timeout(Some(config.bounds.http2_keepalive_timeout))
        .layer(DrainLayer)
        .layer(ServerStatsLayer)
        .add_service(health)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(
            CheckService::new(apis.decider)
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
        .add_service(apis.lease.into_server()))
}

/// The tonic router, its layers named.
type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        ServerStatsLayer,
        tower::layer::util::Stack<DrainLayer, tower::layer::util::Identity>,
    >,
>;

/// The three APIs (`CheckLimit`'s through its decider) on one limiter and
/// one set of rules.
struct Apis {
    decider: Decider,
    envoy: EnvoyService,
    quota: QuotaService,
    lease: LeaseService,
}

impl Apis {
    fn new(
        config: &Config,
        limiter: &Limiter,
        rules: RulesHandle,
        quota_shutdown: watch::Receiver<bool>,
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
                config.bounds.max_request_bytes as usize,
                config.envoy.shadow_mode,
                config.limiter.failure_policy,
                &config.limiter.key_prefix,
            ),
            quota_shutdown.clone(),
        );
        let (roster, ledger) = quota.share_settling();
        let leaser = Arc::new(Leaser::new(
            limiter.clone(),
            rules.clone(),
            ledger,
            roster,
            config.lease.settings(),
        ));
        let lease = LeaseService::new(
            leaser,
            config.bounds.max_request_bytes as usize,
            quota_shutdown,
        );
        let decider = Decider::new(limiter.clone())
            .with_rules(rules.clone())
            .with_slots(slots.clone())
            .with_bounds(config.bounds.check_request());
        let envoy = EnvoyService::new(
            limiter.clone(),
            rules,
            config.envoy.settings(config.bounds.envoy_request()),
            slots,
        );
        Self {
            decider,
            envoy,
            quota,
            lease,
        }
    }
}

/// The rules from `source`, and the task that follows its changes: a
/// directory polled, or an xDS stream. A configuration that cannot be read
/// stops the start, unless `start_without_rules`: then it is logged, and
/// the poll loads the first one that can be.
fn follow_rules(
    source: RulesSource,
    start_without_rules: bool,
) -> Result<(RulesHandle, Option<JoinHandle<()>>), ServeError> {
    Ok(match source {
        RulesSource::Files {
            path,
            selection,
            poll_interval,
        } => {
            let (source, rules) = match ConfigSource::load(path.clone(), selection) {
                Ok((source, rules)) => (source, RulesHandle::new(rules)),
                Err(err) if start_without_rules => {
                    error!(%err, "the configuration cannot be read: starting without rules (--start-without-rules)");
                    stats::config_load(false);
                    let rules = RulesHandle::default();
                    rules.rejected();
                    (ConfigSource::pending(path, selection), rules)
                }
                Err(err) => return Err(ServeError::Rules(err)),
            };
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
