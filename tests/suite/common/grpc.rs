//! Talking gRPC to a ratelimitd under test: a channel, its health (asked
//! once, watched, or awaited), and a bare HTTP/2 hello for tests about
//! connections that go quiet.

use std::net::SocketAddr;

use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::eventually;

/// A plain-text channel to the server on `address`.
pub(crate) async fn channel(address: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to ratelimitd")
}

/// The health status of `service` at `address`, or `None` if it cannot be
/// asked.
pub(crate) async fn health_status(address: SocketAddr, service: &str) -> Option<ServingStatus> {
    let endpoint = Channel::from_shared(format!("http://{address}")).ok()?;
    let mut client = HealthClient::new(endpoint.connect().await.ok()?);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(response.into_inner().status).ok()
}

/// Waits until every health service name of the server at `address`
/// reports `wanted`.
pub(crate) async fn await_health(address: SocketAddr, wanted: ServingStatus) {
    for service in ratelimitd::health::SERVICE_NAMES {
        eventually(
            &format!("health of {service:?} to be {wanted:?}"),
            || async move { health_status(address, service).await == Some(wanted) },
        )
        .await;
    }
}

/// A `Health.Watch` stream for the whole server on `address`, and the first
/// status it sent.
pub(crate) async fn watch_health(
    address: SocketAddr,
) -> (ServingStatus, tonic::Streaming<HealthCheckResponse>) {
    let mut watch = HealthClient::new(channel(address).await)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch health")
        .into_inner();
    let first = watch.message().await.expect("no error").expect("a status");
    let status = ServingStatus::try_from(first.status).expect("a known status");
    (status, watch)
}

/// Opens a TCP connection to `address` and says only the HTTP/2 hello (the
/// preface and an empty SETTINGS), as a client that then goes quiet would.
pub(crate) async fn http2_hello(address: SocketAddr) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(
        &mut stream,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    )
    .await
    .expect("HTTP/2 preface");
    stream
}
