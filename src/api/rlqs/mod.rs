//! Envoy's Rate Limit Quota Service (RLQS),
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`:
//! each Envoy reports, per bucket, the requests it allowed and denied; the
//! service answers with an assignment (a token bucket, allow all or deny
//! all) that the Envoy enforces by itself until the next one. The bucket's
//! policy (from the configuration's `quota_buckets`) gives its rate, which
//! the [`crate::quota`] ledger splits max-min fair among every Envoy
//! reporting it, through every ratelimitd instance on the same store.

mod assignment;
mod nudges;
mod options;
mod stream;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

pub use self::assignment::Assigned;
use self::nudges::Nudges;
pub use self::options::QuotaOptions;
use self::stream::QuotaStream;
use crate::limit::FailurePolicy;
use crate::metrics;
use crate::pb::envoy::service::rate_limit_quota::v3 as rlqs;
use crate::quota::{QuotaLedger, QuotaLedgers};
use crate::rules::RulesHandle;

/// Server-wide settings of the quota service.
#[derive(Debug, Clone)]
pub struct QuotaSettings {
    /// How long an assignment holds at an Envoy unless renewed (renewed
    /// at the Envoy's reports or the rebalance tick, by half-way through
    /// it: see `Shared::renew_after`).
    pub assignment_ttl: Duration,
    /// A bucket not reported for this long is dropped from its stream:
    /// its share freed, the Envoy told to abandon it.
    pub subscriber_timeout: Duration,
    /// What a subscriber wants beyond its demand, per mille.
    pub headroom_permille: u64,
    /// How often each stream drops the buckets Envoy stopped reporting and
    /// settles its contended buckets again.
    pub rebalance_interval: Duration,
    /// Most buckets one stream may subscribe to.
    pub max_buckets_per_stream: usize,
    /// Most buckets all streams of this instance may subscribe to together.
    pub max_buckets: usize,
    /// Most pairs in a `BucketId`.
    pub max_entries: usize,
    /// Most bytes in a `BucketId` key or value.
    pub max_entry_bytes: usize,
    /// Assignments are worked out and counted, and every Envoy is told to
    /// allow all.
    pub shadow_mode: bool,
    /// What answers while the store cannot.
    pub failure_policy: FailurePolicy,
    /// The prefix of every storage key.
    pub key_prefix: String,
}

/// What every stream of the service shares.
struct Shared {
    ledger: QuotaLedger,
    /// This instance's own ledger, for the `local` failure policy.
    local: Option<QuotaLedger>,
    rules: RulesHandle,
    settings: QuotaSettings,
    /// Names this instance's subscribers apart from other instances'.
    instance: String,
    next_stream: AtomicU64,
    /// Subscriptions held by all streams, at most `max_buckets`.
    subscriptions: AtomicUsize,
    nudges: Nudges,
    /// Turns true when the server shuts down.
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// How old an assignment may be before it is sent again: half its time
    /// to live, less one rebalance interval. The rebalance tick is what
    /// renews, so an assignment that is not yet due at one tick must still
    /// be sent by half its life at the next; with a time to live of only two
    /// intervals, that is every tick.
    fn renew_after(&self) -> Duration {
        (self.settings.assignment_ttl / 2).saturating_sub(self.settings.rebalance_interval)
    }

    /// Takes one of the instance's subscriptions, if any is left.
    fn take_subscription(&self) -> bool {
        self.subscriptions
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < self.settings.max_buckets).then_some(held + 1)
            })
            .is_ok()
    }

    /// Gives one back.
    fn give_back_subscription(&self) {
        self.subscriptions.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The quota service.
#[derive(Clone)]
pub struct QuotaService {
    shared: Arc<Shared>,
}

/// Responses queued per stream before the stream stops reading reports.
const RESPONSE_QUEUE: usize = 16;

impl QuotaService {
    /// A service settling shares on `ledgers` (the shared one, and for the
    /// `local` failure policy this instance's own), under the policies of
    /// `rules`. Its streams end when `shutdown` turns true.
    pub fn new(
        ledgers: QuotaLedgers,
        rules: RulesHandle,
        settings: QuotaSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let instance = format!("{:016x}", rand::random::<u64>());
        Self {
            shared: Arc::new(Shared {
                ledger: ledgers.shared,
                local: ledgers.own,
                rules,
                settings,
                instance,
                next_stream: AtomicU64::new(1),
                subscriptions: AtomicUsize::new(0),
                nudges: Nudges::default(),
                shutdown,
            }),
        }
    }

    /// The tonic service.
    pub fn into_server(
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
                    debug!(%status, stream = number, "quota stream broke");
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
