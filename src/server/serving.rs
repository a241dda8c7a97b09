//! Serves gRPC on every worker thread: the connections accepted on the
//! port are handed to the threads (see `incoming`), each thread's runtime
//! serves its own with a clone of the router, and a shutdown stops them
//! all, in the order the server's documentation gives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::{Background, GrpcRouter, ServeError, threads};
use crate::health::Health;
use crate::incoming::{self, IncomingSettings};
use crate::limiter::Store;

/// gRPC being served on every worker thread.
pub(super) struct Serving {
    /// Each thread's server.
    served: Vec<JoinHandle<Result<(), tonic::transport::Error>>>,
    /// Accepting connections and handing them on.
    accepting: JoinHandle<()>,
    /// Each thread's timer tick (see [`threads::tick_timer`]).
    ticking: Vec<JoinHandle<()>>,
    /// Tells every thread's server to stop accepting and drain.
    pub(super) stop_serving: watch::Sender<bool>,
}

impl Serving {
    /// Accepts on `listener` and serves `router` on each of `runtimes`,
    /// each having opened its connections to `stores` first.
    pub(super) fn start(
        listener: TcpListener,
        settings: &IncomingSettings,
        tls: Option<TlsAcceptor>,
        router: &GrpcRouter,
        stores: Vec<Store>,
        runtimes: &[Handle],
    ) -> Self {
        let (accepting, shares) = incoming::accept_among(listener, settings, runtimes.len());
        let (stop_serving, serving_stopped) = watch::channel(false);
        let mut ticking = Vec::with_capacity(runtimes.len());
        let served = runtimes
            .iter()
            .zip(shares)
            .enumerate()
            .map(|(thread, (runtime, share))| {
                let incoming = incoming::connections(share, settings.clone(), tls.clone());
                ticking.push(runtime.spawn(threads::tick_timer()));
                // Each thread has Redis connections of its own: opened now,
                // rather than within its first call's command timeout. The
                // caller's thread has its opened by the health probe.
                if thread > 0 {
                    let stores = stores.clone();
                    runtime.spawn(async move {
                        for store in &stores {
                            store.warm().await;
                        }
                    });
                }
                runtime.spawn(
                    router
                        .clone()
                        .serve_with_incoming_shutdown(incoming, stopped(serving_stopped.clone())),
                )
            })
            .collect();
        // Accepting ends when serving stops: new connections then find the
        // port closed, and try another instance at once.
        let accepting = tokio::spawn(async move {
            tokio::select! {
                () = accepting => {}
                () = stopped(serving_stopped) => {}
            }
        });
        Self {
            served,
            accepting,
            ticking,
            stop_serving,
        }
    }

    /// Serves until `shutdown`, then stops as `stop` says (which ends with
    /// every thread's server told to stop), and returns once calls in
    /// flight have finished, or `grace` after they started draining.
    pub(super) async fn until(
        self,
        stop: Stopping,
        shutdown: impl Future<Output = ()>,
        grace: Duration,
    ) -> Result<(), ServeError> {
        let draining = stop.draining.clone();
        let served = async {
            let ((), served) =
                tokio::join!(stop.after(shutdown), futures::future::join_all(self.served));
            served.into_iter().try_for_each(|served| {
                served
                    .map_err(ServeError::Thread)?
                    .map_err(ServeError::from)
            })
        };
        let result = tokio::select! {
            result = served => result,
            () = grace_after(draining, grace) => {
                warn!(?grace, "calls still in flight after the grace period; stopping anyway");
                Ok(())
            }
        };
        self.accepting.abort();
        self.ticking.iter().for_each(JoinHandle::abort);
        result
    }
}

/// What a shutdown stops, in order.
pub(super) struct Stopping {
    pub(super) shutting_down: incoming::ShutdownStarted,
    pub(super) background: Background,
    pub(super) health: Health,
    /// `--shutdown-delay`.
    pub(super) delay: Option<Duration>,
    pub(super) quota_shutdown: watch::Sender<bool>,
    /// Told when calls in flight start draining.
    pub(super) draining: Arc<Notify>,
    /// Tells every thread's server to stop accepting and drain.
    pub(super) stop_serving: watch::Sender<bool>,
}

impl Stopping {
    /// Waits for `shutdown`, then stops, in order; last, every thread's
    /// server stops accepting and drains.
    pub(super) async fn after(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        // First of all, so that load balancers stop sending calls here.
        self.health.stop();
        let _ = self.background.grpc_health.await;
        if let Some(delay) = self.delay {
            info!(
                ?delay,
                "shutting down: health NOT_SERVING; serving on for --shutdown-delay"
            );
            tokio::time::sleep(delay).await;
        }
        // Before tonic sends GOAWAY: from now on a connection closes as
        // soon as it has no call in flight.
        let _ = self.shutting_down.set(Instant::now());
        self.health.closed();
        info!("shutting down: health NOT_SERVING, finishing calls in flight");
        self.background.tasks.iter().for_each(JoinHandle::abort);
        // Quota streams never finish by themselves: end them, so the
        // Envoys reconnect to another instance.
        let _ = self.quota_shutdown.send(true);
        self.draining.notify_one();
        let _ = self.stop_serving.send(true);
    }
}

/// Resolves once `stop` says serving stops (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Resolves `grace` after calls started draining.
async fn grace_after(draining: Arc<Notify>, grace: Duration) {
    draining.notified().await;
    tokio::time::sleep(grace).await;
}
