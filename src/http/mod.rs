//! The HTTP/1.1 side, on axum: one way to serve a router on a listener
//! until told to stop (`Served`), and the routers of the two listeners.
//! The service listener (`service_routes`, every route of it in
//! [`Endpoint::ALL`]): the JSON API (`api`), `/healthz` and `/readyz`,
//! its OpenAPI document (`openapi`), and envoyproxy/ratelimit's
//! `/healthcheck` (following [`crate::health`]) and `/json` (`json`).
//! With an admin token, the admin API (`admin`) too.
//! The debug listener: [`debug`].

pub(crate) mod admin;
pub(crate) mod api;
pub(crate) mod body;
pub mod console;
pub(crate) mod debug;
pub(crate) mod json;
pub(crate) mod linger;
pub(crate) mod live;
pub(crate) mod openapi;
pub(crate) mod options;

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any, get, post};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub(crate) use self::body::BodyBounds;
use self::linger::Lingering;
pub use self::options::HttpOptions;
use crate::api::envoy::EnvoyService;
use crate::decider::Decider;
use crate::health::Health;

/// The plain-text content type Go's `net/http` gives a text answer.
pub(crate) const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// A router served on a listener, until [`Served::stop`].
pub(crate) struct Served {
    name: &'static str,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Served {
    /// Serves `router` on `listener` (`name` says which, in logs), over
    /// HTTP/1.1; a client must send a request's headers whole within
    /// `header_timeout` of starting them, or its connection is closed.
    /// A closing connection lingers as long (see [`linger`]): a client is
    /// given that long to send a request body anyway. The connections are
    /// served on `runtimes` in turn (the worker threads' runtimes).
    pub(crate) fn start(
        name: &'static str,
        listener: TcpListener,
        router: Router,
        header_timeout: Duration,
        runtimes: Vec<Handle>,
    ) -> Self {
        let address = listener.local_addr().ok();
        // The start-up lines say what each listener serves.
        match address {
            Some(address) => debug!(%address, "serving {name}"),
            None => debug!("serving {name} (local address unknown)"),
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(header_timeout);
        let task = tokio::spawn(serve(
            Listening {
                name,
                listener,
                runtimes,
            },
            router,
            http1,
            header_timeout,
            stopped,
        ));
        Self { name, stop, task }
    }

    /// Stops accepting, lets requests in flight finish for up to `grace`,
    /// then drops what is left.
    pub(crate) async fn stop(self, grace: Duration) {
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

/// A listener, and the runtimes its connections are served on in turn.
struct Listening {
    /// Which listener, for logs.
    name: &'static str,
    listener: TcpListener,
    /// At least one.
    runtimes: Vec<Handle>,
}

/// Accepts connections on `listener` and serves `router` on each until
/// `stopped`; then stops accepting, asks each connection to close once its
/// request in flight is answered, and returns when all have. (axum's own
/// `serve` sets no deadline on a request's headers: this is it, with one.)
async fn serve(
    Listening {
        name,
        listener,
        runtimes,
    }: Listening,
    router: Router,
    http1: hyper::server::conn::http1::Builder,
    linger: Duration,
    stopped: oneshot::Receiver<()>,
) {
    let (closing, close) = tokio::sync::watch::channel(false);
    // Dropped with this task (aborted past the grace): so are they.
    let mut connections = tokio::task::JoinSet::new();
    let mut stopped = std::pin::pin!(stopped);
    let mut turn = 0;
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // The caller's address, for the handlers that log it.
                    let router = tower::ServiceExt::map_request(
                        router.clone(),
                        move |mut request: axum::http::Request<hyper::body::Incoming>| {
                            request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                            request
                        },
                    );
                    let service = hyper_util::service::TowerToHyperService::new(router);
                    let http1 = http1.clone();
                    let mut close = close.clone();
                    // Out of this runtime's reactor, into the serving one's.
                    let Ok(stream) = stream.into_std() else {
                        continue;
                    };
                    let runtime = &runtimes[turn % runtimes.len()];
                    turn += 1;
                    connections.spawn_on(async move {
                        let Ok(stream) = TcpStream::from_std(stream) else {
                            return;
                        };
                        let io = hyper_util::rt::TokioIo::new(Lingering::new(stream, linger));
                        let connection = http1.serve_connection(io, service);
                        let mut connection = std::pin::pin!(connection);
                        let closing = async move {
                            // The guard it returns must not live across
                            // the graceful close below.
                            let _ = close.wait_for(|closing| *closing).await;
                        };
                        tokio::select! {
                            _ = connection.as_mut() => {}
                            () = closing => {
                                connection.as_mut().graceful_shutdown();
                                let _ = connection.await;
                            }
                        }
                    }, runtime);
                }
                // Out of file descriptors, or a connection reset before it
                // was accepted: the next accept may do.
                Err(err) => {
                    warn!(%err, "{name}: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
}

/// Defines [`Endpoint`] with [`Endpoint::ALL`] and [`Endpoint::path`] from
/// one list, so that no endpoint can be missing from the list the router
/// and the OpenAPI document are built from.
macro_rules! endpoints {
    (
        $(#[$meta:meta])*
        pub enum Endpoint {
            $($(#[doc = $doc:literal])* $name:ident => $path:literal,)*
        }
    ) => {
        $(#[$meta])*
        pub enum Endpoint {
            $($(#[doc = $doc])* $name,)*
        }

        impl Endpoint {
            /// All of them, in the order they are declared.
            pub const ALL: [Self; [$(stringify!($name)),*].len()] = [$(Self::$name),*];

            /// Its path.
            pub fn path(self) -> &'static str {
                match self {
                    $(Self::$name => $path,)*
                }
            }
        }
    };
}

endpoints! {
    /// Every route of the service listener. The router is built from
    /// [`Endpoint::ALL`] (`service_routes`) and so is the OpenAPI
    /// document (`openapi::document`): neither has a route the other
    /// lacks.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Endpoint {
        /// `POST /v1/check`: `api::check`.
        Check => "/v1/check",
        /// `POST /v1/check-many`: `api::check_many`.
        CheckMany => "/v1/check-many",
        /// `GET /healthz`: `api::healthz`.
        Healthz => "/healthz",
        /// `GET /readyz`: `api::readyz`.
        Readyz => "/readyz",
        /// `GET /openapi.json`: `openapi::document`.
        OpenApi => "/openapi.json",
        /// envoyproxy/ratelimit's `/json` (any method): `json`.
        Json => "/json",
        /// envoyproxy/ratelimit's `/healthcheck` (any method).
        Healthcheck => "/healthcheck",
        /// `POST /admin/v1/peek`: `admin`.
        AdminPeek => "/admin/v1/peek",
        /// `POST /admin/v1/reset`: `admin`.
        AdminReset => "/admin/v1/reset",
        /// `GET /admin/v1/rules`: `admin`.
        AdminRules => "/admin/v1/rules",
        /// `GET /admin/v1/policies`: `admin`.
        AdminPolicies => "/admin/v1/policies",
        /// `GET /admin/v1/quota-buckets`: `admin`.
        AdminQuotaBuckets => "/admin/v1/quota-buckets",
        /// `GET /admin/v1/config`: `admin`.
        AdminConfig => "/admin/v1/config",
        /// `POST /v1/simulate`: `console::simulate`.
        Simulate => "/v1/simulate",
        /// `GET /v1/console/live`: `live::live`.
        ConsoleLive => "/v1/console/live",
        /// `GET /`: the web console, `console::Page`.
        Console => "/",
    }
}

impl Endpoint {
    /// The admin API's: served only with an admin token.
    pub fn is_admin(self) -> bool {
        matches!(
            self,
            Self::AdminPeek
                | Self::AdminReset
                | Self::AdminRules
                | Self::AdminPolicies
                | Self::AdminQuotaBuckets
                | Self::AdminConfig
        )
    }

    /// Those a server serves: all with the admin API on, else all but
    /// the admin API's.
    pub fn served(admin: bool) -> impl Iterator<Item = Self> {
        Self::ALL
            .into_iter()
            .filter(move |endpoint| admin || !endpoint.is_admin())
    }
}

/// What the service listener serves.
pub(crate) struct ServiceParts {
    /// Whether the instance can decide.
    pub health: Health,
    /// Envoy's RLS, for `/json`.
    pub envoy: EnvoyService,
    /// The decision service, for `/v1` and the admin API.
    pub decider: Decider,
    /// How much a request's body may hold and how long it may take.
    pub bounds: BodyBounds,
    /// The admin API's, when it has a token; without, it is not served.
    pub admin: Option<admin::AdminParts>,
}

/// The service listener's routes ([`Endpoint::ALL`]); any other path is
/// 404, as upstream's. A feature adds its own routes with `merge` (a
/// router without a fallback of its own).
pub(crate) fn service_routes(parts: ServiceParts) -> Router {
    let api = api::Api {
        decider: parts.decider,
        health: parts.health.clone(),
        bounds: parts.bounds,
    };
    let admin = parts
        .admin
        .map(|admin| admin::Admin::new(admin, api.clone()));
    let simulator = console::Simulator::new(parts.bounds);
    let page = console::Page::new();
    // Built once: it describes the binary, which does not change.
    let document: Bytes = serde_json::to_vec(&openapi::document(admin.is_some()))
        .map(Bytes::from)
        .unwrap_or_else(|err| {
            warn!(%err, "cannot write the OpenAPI document");
            Bytes::new()
        });
    let route = |endpoint: Endpoint| -> Option<MethodRouter> {
        Some(match endpoint {
            Endpoint::Check => {
                let api = api.clone();
                post(move |headers: HeaderMap, body: Body| api::check(api.clone(), headers, body))
            }
            Endpoint::CheckMany => {
                let api = api.clone();
                post(move |headers: HeaderMap, body: Body| {
                    api::check_many(api.clone(), headers, body)
                })
            }
            Endpoint::Healthz => get(api::healthz),
            Endpoint::Readyz => {
                let health = parts.health.clone();
                get(move || api::readyz(health.clone()))
            }
            Endpoint::OpenApi => {
                let document = document.clone();
                get(move || {
                    let document = document.clone();
                    async move { ([(CONTENT_TYPE, api::JSON)], document).into_response() }
                })
            }
            Endpoint::Json => json::route(parts.envoy.clone(), parts.health.clone(), parts.bounds),
            Endpoint::Healthcheck => {
                let health = parts.health.clone();
                any(move || healthcheck(health.clone()))
            }
            Endpoint::AdminPeek
            | Endpoint::AdminReset
            | Endpoint::AdminRules
            | Endpoint::AdminPolicies
            | Endpoint::AdminQuotaBuckets
            | Endpoint::AdminConfig => return admin.as_ref()?.route(endpoint),
            Endpoint::Simulate => {
                let simulator = simulator.clone();
                post(move |headers: HeaderMap, body: Body| {
                    console::simulate(simulator.clone(), headers, body)
                })
            }
            Endpoint::ConsoleLive => {
                let health = parts.health.clone();
                get(move || live::live(health.clone()))
            }
            Endpoint::Console => {
                let page = page.clone();
                get(move || {
                    let page = page.clone();
                    async move { page.serve() }
                })
            }
        })
    };
    Endpoint::served(admin.is_some())
        .filter_map(|endpoint| Some((endpoint, route(endpoint)?)))
        .fold(Router::new(), |router, (endpoint, method)| {
            router.route(endpoint.path(), method)
        })
        .fallback(|| async { not_found() })
}

/// Go's `http.NotFound`, as upstream's router answers an unknown path.
pub(super) fn not_found() -> Response {
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
pub(crate) fn status_only(status: StatusCode) -> Response {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::api::envoy::EnvoySettings;
    use crate::limiter::{Limiter, Store};
    use crate::load_shed::DecisionSlots;
    use crate::rules::RulesHandle;
    use crate::store::{MemoryStore, SystemClock};

    /// The service listener's router without the admin API.
    fn router() -> Router {
        let store = Store::Memory(MemoryStore::new(Arc::new(SystemClock::default())));
        let limiter = Limiter::new(store, "t:");
        let envoy = EnvoyService::new(
            limiter.clone(),
            RulesHandle::default(),
            EnvoySettings::default(),
            DecisionSlots::new(4, 4),
        );
        service_routes(ServiceParts {
            health: Health::new(false),
            envoy,
            decider: Decider::new(limiter),
            bounds: BodyBounds {
                max_bytes: 1024,
                read_timeout: Duration::from_secs(1),
            },
            admin: None,
        })
    }

    /// Whether `path` gets the router's fallback, the answer to a path it
    /// has no route for.
    async fn falls_back(path: &str) -> bool {
        let request = Request::get(path).body(Body::empty()).expect("a request");
        let answer = router().oneshot(request).await.expect("an answer");
        if answer.status() != StatusCode::NOT_FOUND {
            return false;
        }
        let body = axum::body::to_bytes(answer.into_body(), 4096)
            .await
            .expect("the body");
        body.as_ref() == b"404 page not found\n"
    }

    #[tokio::test]
    async fn every_endpoint_listed_is_routed_and_nothing_else() {
        let mut paths: Vec<&str> = Endpoint::ALL.iter().map(|e| e.path()).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), Endpoint::ALL.len(), "one path per endpoint");
        for endpoint in Endpoint::served(false) {
            assert!(
                !falls_back(endpoint.path()).await,
                "{endpoint:?} is listed but not routed"
            );
        }
        for endpoint in Endpoint::ALL.into_iter().filter(|e| e.is_admin()) {
            assert!(
                falls_back(endpoint.path()).await,
                "{endpoint:?} is routed without an admin token"
            );
        }
        assert!(falls_back("/v1/unknown").await);
    }
}
