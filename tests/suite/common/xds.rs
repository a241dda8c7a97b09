//! A small Aggregated Discovery Service of the tests' own: it serves
//! go-control-plane's RateLimitConfig snapshots, the newest on every
//! stream, over plain gRPC, TLS or mutual TLS, records what its clients
//! sent and the certificates they presented, and stops (ending its
//! streams) at will.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use prost::Message;
use ratelimitd::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ratelimitd::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ratelimitd::pb::ratelimit::config::ratelimit::v3 as conf;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// What the test's management server has seen.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) requests: Vec<DiscoveryRequest>,
    pub(crate) tokens: Vec<String>,
    /// For each stream, the DER certificates its client presented over
    /// TLS (empty without TLS or without one).
    pub(crate) client_certificates: Vec<Vec<Vec<u8>>>,
}

/// One version of the configuration: `requests_per_unit` per hour for
/// `user`, with `unit` (HOUR unless a bad one is wanted).
pub(crate) fn snapshot(
    version: &str,
    requests_per_unit: u32,
    unit: conf::RateLimitUnit,
) -> (String, Vec<conf::RateLimitConfig>) {
    let config = conf::RateLimitConfig {
        name: "xds-config".into(),
        domain: "xds".into(),
        descriptors: vec![conf::RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(conf::RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit,
                name: "per-user".into(),
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    (version.to_owned(), vec![config])
}

/// The management server: serves the snapshot `current` holds (a version
/// and its configurations) on every stream, and each new one as it comes.
#[derive(Clone)]
pub(crate) struct TestAds {
    pub(crate) current: watch::Receiver<(String, Vec<conf::RateLimitConfig>)>,
    pub(crate) seen: Arc<Mutex<Seen>>,
    /// Turns false when this server instance stops: its streams end, as
    /// a process that exits ends them.
    pub(crate) alive: watch::Receiver<bool>,
}

impl TestAds {
    /// A server of `current`'s snapshots that has seen nothing yet.
    pub(crate) fn new(current: watch::Receiver<(String, Vec<conf::RateLimitConfig>)>) -> Self {
        Self {
            current,
            seen: Arc::new(Mutex::new(Seen::default())),
            alive: watch::channel(true).1,
        }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for TestAds {
    type StreamAggregatedResourcesStream = ResponseStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let token = request
            .metadata()
            .get("x-token")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let certificates = (request.peer_certs().iter())
            .flat_map(|certs| certs.iter().map(|cert| cert.to_vec()))
            .collect();
        {
            let mut seen = self.seen.lock().unwrap();
            seen.tokens.push(token);
            seen.client_certificates.push(certificates);
        }
        let mut incoming = request.into_inner();
        let mut current = self.current.clone();
        let mut alive = self.alive.clone();
        let seen = self.seen.clone();
        let (responses, outgoing) = mpsc::channel(8);
        tokio::spawn(async move {
            let mut nonce = 0u32;
            let mut send = |snapshot: &(String, Vec<conf::RateLimitConfig>)| {
                nonce += 1;
                DiscoveryResponse {
                    version_info: snapshot.0.clone(),
                    resources: snapshot
                        .1
                        .iter()
                        .map(|config| prost_types::Any {
                            type_url: TYPE_URL.into(),
                            value: config.encode_to_vec(),
                        })
                        .collect(),
                    type_url: TYPE_URL.into(),
                    nonce: nonce.to_string(),
                    ..Default::default()
                }
            };
            // The first request asks; the snapshot follows at once.
            match incoming.message().await {
                Ok(Some(first)) => seen.lock().unwrap().requests.push(first),
                _ => return,
            }
            let first = send(&current.borrow_and_update());
            if responses.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    message = incoming.message() => match message {
                        Ok(Some(request)) => seen.lock().unwrap().requests.push(request),
                        _ => return,
                    },
                    _ = async { alive.wait_for(|alive| !alive).await.is_ok() } => return,
                    changed = current.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let response = send(&current.borrow_and_update());
                        if responses.send(Ok(response)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stream = futures::stream::unfold(outgoing, |mut outgoing| async move {
            outgoing.recv().await.map(|item| (item, outgoing))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A running test management server; `stop` ends it and its streams.
pub(crate) struct Running {
    stop: oneshot::Sender<()>,
    alive: watch::Sender<bool>,
}

impl Running {
    pub(crate) fn stop(self) {
        let _ = self.alive.send(false);
        let _ = self.stop.send(());
    }
}

/// The management server on `address`, until stopped.
pub(crate) async fn serve(listener: TcpListener, ads: TestAds) -> Running {
    serve_over(listener, ads, None).await
}

/// A listener on `address` (port 0: one the system chooses) and its address.
pub(crate) async fn listen(address: &str) -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind(address)
        .await
        .expect("bind the test xDS server");
    let address = listener.local_addr().expect("its address");
    (listener, address)
}

/// As [`serve`], over TLS with this certificate and key when given.
pub(crate) async fn serve_over(
    listener: TcpListener,
    ads: TestAds,
    tls: Option<(Vec<u8>, Vec<u8>)>,
) -> Running {
    let tls = tls.map(|(cert, key)| {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key))
    });
    serve_tls(listener, ads, tls).await
}

/// As [`serve`], over mutual TLS as Envoy Gateway's xDS server: this
/// certificate and key, and a client certificate required of every client
/// and verified against `client_ca` (a handshake without one fails).
pub(crate) async fn serve_mutual_tls(
    listener: TcpListener,
    ads: TestAds,
    (cert, key): (Vec<u8>, Vec<u8>),
    client_ca: Vec<u8>,
) -> Running {
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert, key))
        .client_ca_root(tonic::transport::Certificate::from_pem(client_ca))
        .client_auth_optional(false);
    serve_tls(listener, ads, Some(tls)).await
}

async fn serve_tls(
    listener: TcpListener,
    mut ads: TestAds,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> Running {
    let address = listener.local_addr().expect("its address");
    let (stop, stopped) = oneshot::channel::<()>();
    let (alive, alive_now) = watch::channel(true);
    ads.alive = alive_now;
    tokio::spawn(async move {
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder
                .tls_config(tls)
                .expect("TLS for the test xDS server");
        }
        builder
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            })
            .await
            .expect("the test xDS server runs");
    });
    super::eventually("the test xDS server to listen", || async {
        tokio::net::TcpStream::connect(address).await.is_ok()
    })
    .await;
    Running { stop, alive }
}

/// `configs` served as version `version` on a port of its own, until the
/// returned server is stopped or dropped; and its address.
pub(crate) async fn serve_configs(
    version: &str,
    configs: Vec<conf::RateLimitConfig>,
) -> (
    Running,
    SocketAddr,
    watch::Sender<(String, Vec<conf::RateLimitConfig>)>,
) {
    let (listener, address) = listen("127.0.0.1:0").await;
    let (publish, current) = watch::channel((version.to_owned(), configs));
    (
        serve(listener, TestAds::new(current)).await,
        address,
        publish,
    )
}
