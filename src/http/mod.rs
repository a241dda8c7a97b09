//! The HTTP/1.1 side, on axum: one way to serve a router on a listener
//! until told to stop ([`Served`]), and the routers of the two listeners
//! envoyproxy/ratelimit has. The service listener ([`service_routes`]):
//! `/healthcheck` (following [`crate::health`]) and `/json` ([`json`]);
//! a feature of its own adds its routes to it with `Router::merge`. The
//! debug listener: [`debug`].

pub mod debug;
pub mod json;
pub mod options;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use self::options::HttpOptions;
use crate::api::envoy::EnvoyService;
use crate::health::Health;

/// The plain-text content type Go's `net/http` gives a text answer.
pub const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// A router served on a listener, until [`Served::stop`].
pub struct Served {
    name: &'static str,
    address: Option<SocketAddr>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Served {
    /// Serves `router` on `listener` (`name` says which, in logs).
    pub fn start(name: &'static str, listener: TcpListener, router: Router) -> Self {
        let address = listener.local_addr().ok();
        match address {
            Some(address) => info!(%address, "serving {name}"),
            None => info!("serving {name} (local address unknown)"),
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(err) = serve.await {
                warn!(%err, "{name} listener failed");
            }
        });
        Self {
            name,
            address,
            stop,
            task,
        }
    }

    /// Where it serves.
    pub fn address(&self) -> Option<SocketAddr> {
        self.address
    }

    /// Stops accepting, lets requests in flight finish for up to `grace`,
    /// then drops what is left.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(());
        let abort = self.task.abort_handle();
        if tokio::time::timeout(grace, self.task).await.is_err() {
            warn!(
                name = self.name,
                ?grace,
                "requests still in flight; stopping anyway"
            );
            abort.abort();
        }
    }
}

/// The service listener's routes: `/healthcheck` and `/json` (with bodies
/// of up to `max_body` bytes); any other path is 404, as upstream's. A
/// feature adds its own routes with `merge` (a router without a fallback
/// of its own).
pub fn service_routes(health: Health, envoy: EnvoyService, max_body: usize) -> Router {
    let for_json = health.clone();
    Router::new()
        .route("/healthcheck", any(move || healthcheck(health.clone())))
        .merge(json::routes(envoy, for_json, max_body))
        .fallback(|| async { not_found() })
}

/// Go's `http.NotFound`, as upstream's router answers an unknown path.
fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [
            (CONTENT_TYPE, TEXT_PLAIN),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        "404 page not found\n",
    )
        .into_response()
}

/// As envoyproxy/ratelimit answers it: 200 `OK` while serving, else 500
/// with no body. Any method.
async fn healthcheck(health: Health) -> Response {
    if health.serving() {
        (StatusCode::OK, [(CONTENT_TYPE, TEXT_PLAIN)], "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// An answer that is only a status, as Go's `http.Error` writes one: the
/// status's text and a newline, as plain text.
pub fn status_only(status: StatusCode) -> Response {
    let text = format!("{}\n", status.canonical_reason().unwrap_or("Error"));
    (
        status,
        [
            (CONTENT_TYPE, TEXT_PLAIN),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        text,
    )
        .into_response()
}
