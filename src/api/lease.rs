//! The lease service, `ratelimitd.v1.Leases/Lease`: one stream per client
//! process, on which it asks for, renews and releases leases on policies
//! (see [`crate::lease`]); each ask is answered by one grant, in order. A
//! stream that ends lets its leases go; a message over
//! `--max-request-bytes` ends it OUT_OF_RANGE.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use crate::api::check::status;
use crate::api::status::{code, item_status};
use crate::lease::book::Book;
use crate::lease::{Ask, Grant, Leaser};
use crate::limit::Micros;
use crate::metrics;
use crate::pb::convert::micros_to_duration;
use crate::pb::ratelimitd::v1 as pb;
use pb::leases_server::{Leases, LeasesServer};

/// Responses queued per stream before the stream stops reading asks.
const RESPONSE_QUEUE: usize = 16;

/// The lease service.
#[derive(Clone)]
pub(crate) struct LeaseService {
    leaser: Arc<Leaser>,
    next_stream: Arc<AtomicU64>,
    max_request_bytes: usize,
    shutdown: watch::Receiver<bool>,
}

impl LeaseService {
    /// Serves `leaser`'s leases; streams end when `shutdown` turns true.
    pub(crate) fn new(
        leaser: Arc<Leaser>,
        max_request_bytes: usize,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            leaser,
            next_stream: Arc::new(AtomicU64::new(1)),
            max_request_bytes,
            shutdown,
        }
    }

    /// The tonic service.
    pub(crate) fn into_server(self) -> LeasesServer<Self> {
        let max = self.max_request_bytes;
        LeasesServer::new(self).max_decoding_message_size(max)
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<pb::LeaseResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Leases for LeaseService {
    type LeaseStream = ResponseStream;

    async fn lease(
        &self,
        request: Request<Streaming<pb::LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let inbound = request.into_inner();
        let (responses, outbound) = mpsc::channel(RESPONSE_QUEUE);
        let number = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let subscriber = format!("{}:l{number}", self.leaser.instance());
        tokio::spawn(serve_stream(self.clone(), subscriber, inbound, responses));
        let outbound = futures::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|message| (message, outbound))
        });
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// Answers one stream's asks until the client goes, the stream breaks, or
/// the server shuts down; then lets its leases go.
async fn serve_stream(
    service: LeaseService,
    subscriber: String,
    mut inbound: Streaming<pb::LeaseRequest>,
    responses: mpsc::Sender<Result<pb::LeaseResponse, Status>>,
) {
    metrics::lease_streams(1.0);
    let mut book = Book::default();
    let mut shutdown = service.shutdown.clone();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let request = tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(status) => {
                    let status = stream_error(service.max_request_bytes, status);
                    let _ = responses.send(Err(status)).await;
                    break;
                }
            },
            () = responses.closed() => break,
            _ = shutdown.changed() => break,
        };
        let mut grants = Vec::with_capacity(request.asks.len());
        for wire in request.asks {
            let ask = ask_of(&wire);
            let granted = service.leaser.ask(&subscriber, &mut book, &ask).await;
            grants.push(grant(wire, granted));
        }
        if responses
            .send(Ok(pb::LeaseResponse { grants }))
            .await
            .is_err()
        {
            break;
        }
    }
    service.leaser.end_stream(&subscriber, &mut book).await;
    metrics::lease_streams(-1.0);
}

/// What ends a stream whose asks could not be read: a message over the
/// size bound is OUT_OF_RANGE, naming the bound; anything else ends it as
/// it came.
fn stream_error(max_request_bytes: usize, status: Status) -> Status {
    if status.code() != tonic::Code::OutOfRange {
        debug!(%status, "lease stream broke");
        return status;
    }
    metrics::lease_refused("out_of_range");
    Status::out_of_range(format!(
        "lease asks over --max-request-bytes ({max_request_bytes} bytes): {}",
        status.message()
    ))
}

/// The core's form of an ask.
fn ask_of(wire: &pb::LeaseAsk) -> Ask {
    Ask {
        policy: wire.policy.clone(),
        key: wire.key.clone(),
        demand: wire.demand,
        held: wire.held,
        admitted: wire.admitted,
        denied: wire.denied,
        fallbacks: wire.fallbacks,
        release: wire.release,
    }
}

/// The wire form of what `ask` got.
fn grant(ask: pb::LeaseAsk, granted: Result<Grant, crate::error::Error>) -> pb::LeaseGrant {
    let mut wire = pb::LeaseGrant {
        id: ask.id,
        policy: ask.policy,
        key: ask.key,
        ..Default::default()
    };
    match granted {
        Ok(grant) => {
            wire.units = grant.units;
            wire.valid_for = Some(duration(grant.valid_for));
            wire.limits = grant
                .limits
                .iter()
                .map(|(label, decision)| status(label, decision))
                .collect();
            wire.retry_after = grant.retry_after.map(duration);
            wire.renew_after = Some(duration(grant.renew_after));
        }
        Err(err) => {
            metrics::lease_refused(code_name(code(&err)));
            wire.error = Some(item_status(&err));
        }
    }
    wire
}

fn duration(duration: std::time::Duration) -> prost_types::Duration {
    micros_to_duration(Micros::from_duration(duration))
}

/// A refusal's label in the metrics.
fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::NotFound => "not_found",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::Unavailable => "unavailable",
        _ => "internal",
    }
}
