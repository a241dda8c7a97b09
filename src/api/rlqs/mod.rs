//! Envoy's Rate Limit Quota Service (RLQS),
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`:
//! each Envoy reports, per bucket, the requests it allowed and denied; the
//! service answers with an assignment (a token bucket, allow all or deny
//! all) that the Envoy enforces by itself until the next one. The bucket's
//! policy (from the configuration's `quota_buckets`) gives its rate, which
//! the [`crate::quota`] ledger splits max-min fair among every Envoy
//! reporting it, through every ratelimitd instance on the same store.
//!
//! `stream` serves one Envoy's stream, a `subscription` per bucket it
//! reports; `settle` settles them on the ledgers, `assignment` is what the
//! Envoy is told; `nudges` lets one stream's change reach the others,
//! `instances` what other instances on the same Redis do (died, nudged),
//! and `shared` is what every stream shares.

mod assignment;
mod instances;
mod nudges;
mod options;
mod settle;
mod shared;
mod stream;
mod subscription;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use self::nudges::Nudges;
pub(crate) use self::options::{QuotaOptions, QuotaSettings};
use self::shared::Shared;
use self::stream::QuotaStream;
use crate::metrics;
use crate::pb::envoy::service::rate_limit_quota::v3 as rlqs;
use crate::quota::presence::{Presence, Roster};
use crate::quota::{QuotaLedger, QuotaLedgers};
use crate::rules::RulesHandle;
use crate::telemetry::WarnThrottle;

/// The quota service.
#[derive(Clone)]
pub(crate) struct QuotaService {
    shared: Arc<Shared>,
}

/// At most one warning per this of the same stream error.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Responses queued per stream before the stream stops reading reports.
const RESPONSE_QUEUE: usize = 16;

impl QuotaService {
    /// A service settling shares on `ledgers` (the shared one, and for the
    /// `local` failure policy this instance's own), under the policies of
    /// `rules`. Its streams end when `shutdown` turns true. On Redis it
    /// beats and follows the other instances (a task of its own, until
    /// shutdown).
    pub(crate) fn new(
        ledgers: QuotaLedgers,
        rules: RulesHandle,
        settings: QuotaSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let roster = Roster::new();
        let presence = ledgers.shared.redis().map(|store| {
            Presence::new(
                store.clone(),
                &settings.key_prefix,
                roster.instance(),
                settings.instance_timeout,
                settings.beat_interval(),
                // By then every entry it wrote has run out by itself.
                settings.assignment_ttl + settings.subscriber_timeout + Duration::from_secs(1),
            )
        });
        let shared = Arc::new(Shared {
            ledger: ledgers.shared,
            local: ledgers.own,
            rules,
            settings,
            roster,
            next_stream: AtomicU64::new(1),
            subscriptions: AtomicUsize::new(0),
            nudges: Nudges::default(),
            presence: presence.clone(),
            shutdown,
            too_large: WarnThrottle::new(WARN_EVERY),
        });
        if let Some(presence) = presence {
            tokio::spawn(instances::follow(shared.clone(), presence));
        }
        Self { shared }
    }

    /// This instance's id among the instances on the same store, and how
    /// many bucket subscriptions its streams hold now: for the admin API.
    pub(crate) fn subscriptions(&self) -> (&str, usize) {
        (
            self.shared.roster.instance(),
            self.shared.subscriptions.load(Ordering::Relaxed),
        )
    }

    /// This instance's roster, and the ledger shares are settled on: for
    /// the lease streams, which settle their shares beside the quota
    /// service's.
    pub(crate) fn share_settling(&self) -> (Arc<Roster>, QuotaLedger) {
        (self.shared.roster.clone(), self.shared.ledger.clone())
    }

    /// The tonic service.
    pub(crate) fn into_server(
        self,
    ) -> rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer<Self> {
        rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer::new(self)
    }
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<rlqs::RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl rlqs::rate_limit_quota_service_server::RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ResponseStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<rlqs::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let inbound = request.into_inner();
        let (responses, outbound) = mpsc::channel(RESPONSE_QUEUE);
        let number = self.shared.next_stream.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(serve_stream(
            self.shared.clone(),
            number,
            inbound,
            responses,
        ));
        let outbound = futures::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|message| (message, outbound))
        });
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// Reads one stream's reports and answers them until the Envoy goes, the
/// stream breaks, or the server shuts down.
async fn serve_stream(
    shared: Arc<Shared>,
    number: u64,
    mut inbound: Streaming<rlqs::RateLimitQuotaUsageReports>,
    responses: mpsc::Sender<Result<rlqs::RateLimitQuotaResponse, Status>>,
) {
    metrics::quota_streams(1.0);
    let (nudge_sender, mut nudged) = mpsc::channel(64);
    let mut stream = QuotaStream::new(shared.clone(), number, nudge_sender);
    let mut shutdown = shared.shutdown.clone();
    let mut rebalance = tokio::time::interval(shared.settings.rebalance_interval);
    rebalance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutting_down = *shutdown.borrow();
    while !shutting_down {
        let actions = tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(reports)) => stream.on_reports(reports).await,
                Ok(None) => break,
                Err(status) => {
                    // Ended with its reason, not as if the Envoy had closed
                    // it (OK), should the Envoy still be listening.
                    let _ = responses.send(Err(stream_error(&shared, number, status))).await;
                    break;
                }
            },
            Some(key) = nudged.recv() => stream.on_nudge(key).await,
            _ = rebalance.tick() => stream.tick().await,
            () = responses.closed() => break,
            _ = shutdown.changed() => {
                shutting_down = true;
                Vec::new()
            }
        };
        if !actions.is_empty() {
            let response = rlqs::RateLimitQuotaResponse {
                bucket_action: actions,
            };
            if responses.send(Ok(response)).await.is_err() {
                break;
            }
        }
    }
    if shutting_down {
        stream.forget_all();
    } else {
        stream.leave_all().await;
    }
    metrics::quota_streams(-1.0);
}

/// What ends a stream whose reports could not be read: a report over the
/// size bound is OUT_OF_RANGE, naming the bound (and warned of, at most
/// once per [`WARN_EVERY`]); anything else (the Envoy went, the stream
/// broke) ends it as it came.
fn stream_error(shared: &Shared, number: u64, status: Status) -> Status {
    if status.code() != tonic::Code::OutOfRange {
        debug!(%status, stream = number, "quota stream broke");
        return status;
    }
    let limit = shared.settings.max_report_bytes;
    // tonic's message gives the size found: "…found N bytes, the limit is…".
    let message = format!(
        "usage reports over --max-request-bytes ({limit} bytes): {}",
        status.message()
    );
    shared.too_large.warn(|suppressed| {
        warn!(
            stream = number,
            limit,
            suppressed,
            detail = status.message(),
            "quota stream ended: usage reports over --max-request-bytes (one warning per 10s; \
             `suppressed` counts those held back)"
        );
    });
    Status::out_of_range(message)
}
