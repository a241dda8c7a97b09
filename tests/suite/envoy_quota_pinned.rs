//! What Envoy 1.40's rate limit quota filter (marked work in progress
//! upstream) actually does where it differs from its API's documentation,
//! pinned down against the real binary with a probe RLQS server that
//! records every report and answers as each test says. ratelimitd's quota
//! service is shaped by these (src/api/rlqs/assignment.rs, the README's
//! "What Envoy 1.40's quota filter does"); if an Envoy upgrade changes one,
//! its test fails here first.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::envoy::{Envoy, EnvoyPorts, drive};
use common::http::start_upstream;
use futures::Stream;
use ratelimitd::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, RequestsPerTimeUnit, Strategy,
};
use ratelimitd::pb::envoy::r#type::v3::{RateLimitStrategy, RateLimitUnit, TokenBucket};
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, QuotaAssignmentAction,
};
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// One bucket's usage as reported: its id, allowed, denied, and the
/// elapsed time.
type Usage = (HashMap<String, String>, u64, u64, Option<Duration>);

/// A report as the probe received it.
#[derive(Debug, Clone)]
struct Received {
    at: Instant,
    domain: String,
    buckets: Vec<Usage>,
}

/// An RLQS server that records every report and answers each bucket's
/// first report with `answer`.
#[derive(Clone)]
struct Probe {
    received: Arc<Mutex<Vec<Received>>>,
    answer: Option<QuotaAssignmentAction>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for Probe {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let mut inbound = request.into_inner();
        let (responses, outbound) = mpsc::channel(16);
        let probe = self.clone();
        tokio::spawn(async move {
            let mut answered: Vec<HashMap<String, String>> = Vec::new();
            while let Ok(Some(reports)) = inbound.message().await {
                let buckets: Vec<_> = reports
                    .bucket_quota_usages
                    .iter()
                    .map(|usage| {
                        (
                            usage.bucket_id.clone().unwrap_or_default().bucket,
                            usage.num_requests_allowed,
                            usage.num_requests_denied,
                            usage.time_elapsed.and_then(|d| Duration::try_from(d).ok()),
                        )
                    })
                    .collect();
                let mut actions = Vec::new();
                for (bucket, ..) in &buckets {
                    if let (false, Some(answer)) = (answered.contains(bucket), &probe.answer) {
                        answered.push(bucket.clone());
                        actions.push(BucketAction {
                            bucket_id: Some(BucketId {
                                bucket: bucket.clone(),
                            }),
                            bucket_action: Some(
                                bucket_action::BucketAction::QuotaAssignmentAction(*answer),
                            ),
                        });
                    }
                }
                probe.received.lock().unwrap().push(Received {
                    at: Instant::now(),
                    domain: reports.domain,
                    buckets,
                });
                if !actions.is_empty() {
                    let response = RateLimitQuotaResponse {
                        bucket_action: actions,
                    };
                    if responses.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
            }
        });
        let outbound = futures::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|message| (message, outbound))
        });
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// Starts the probe on a port of its own; its port and what it received.
async fn start_probe(answer: Option<QuotaAssignmentAction>) -> (u16, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the probe");
    let port = listener.local_addr().expect("its address").port();
    let received = Arc::new(Mutex::new(Vec::new()));
    let probe = Probe {
        received: received.clone(),
        answer,
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RateLimitQuotaServiceServer::new(probe))
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("the probe runs");
    });
    (port, received)
}

/// Envoy on the example configuration, talking to the probe, logging the
/// quota filter at debug level to `log`.
async fn envoy(probe: u16, upstream: u16, edit: &[(&str, &str)], log: &Path) -> Envoy {
    let log = log.to_string_lossy().into_owned();
    Envoy::start_quota(
        EnvoyPorts {
            ratelimitd: probe,
            upstream,
        },
        edit,
        &[
            "--log-path",
            &log,
            // Written out at once, not every 10 s.
            "--file-flush-interval-msec",
            "100",
            "--component-log-level",
            "misc:error,rate_limit_quota:debug",
        ],
    )
    .await
}

fn assignment(strategy: Strategy, ttl_seconds: i64) -> QuotaAssignmentAction {
    QuotaAssignmentAction {
        assignment_time_to_live: Some(prost_types::Duration {
            seconds: ttl_seconds,
            nanos: 0,
        }),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    }
}

fn token_bucket(max_tokens: u32, tokens_per_fill: u32, fill: prost_types::Duration) -> Strategy {
    Strategy::TokenBucket(TokenBucket {
        max_tokens,
        tokens_per_fill: Some(tokens_per_fill),
        fill_interval: Some(fill),
    })
}

#[tokio::test]
async fn reports_come_every_five_seconds_whatever_reporting_interval_says() {
    let (probe, received) = start_probe(None).await;
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let edge = envoy(
        probe,
        upstream,
        &[("reporting_interval: 5s", "reporting_interval: 1s")],
        &dir.path().join("envoy.log"),
    )
    .await;
    let first = edge.get("/", &[]).await;
    assert_eq!(first.status, 200, "no assignment: allowed");
    common::eventually("three reports", || async {
        received.lock().unwrap().len() >= 3
    })
    .await;
    let reports = received.lock().unwrap().clone();
    // The first: at once, that bucket alone, its one request, no time.
    let api = HashMap::from([("name".to_owned(), "api".to_owned())]);
    assert_eq!(reports[0].domain, "quota-example");
    assert_eq!(
        reports[0].buckets,
        vec![(api.clone(), 1, 0, Some(Duration::ZERO))]
    );
    // Then every 5 s, not every 1 s, the domain in each, the bucket
    // reported with no traffic.
    let gap = reports[2].at - reports[1].at;
    assert!(
        (Duration::from_millis(4500)..Duration::from_millis(5600)).contains(&gap),
        "{gap:?} between reports"
    );
    assert_eq!(reports[2].domain, "quota-example");
    assert_eq!(reports[2].buckets[0].0, api);
    assert_eq!((reports[2].buckets[0].1, reports[2].buckets[0].2), (0, 0));
}

#[tokio::test]
async fn requests_per_time_unit_is_ignored_with_a_log_line() {
    let answer = assignment(
        Strategy::RequestsPerTimeUnit(RequestsPerTimeUnit {
            requests_per_time_unit: 5,
            time_unit: RateLimitUnit::Second as i32,
        }),
        60,
    );
    let (probe, received) = start_probe(Some(answer)).await;
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("envoy.log");
    let edge = envoy(probe, upstream, &[], &log).await;
    assert_eq!(edge.get("/", &[]).await.status, 200);
    common::eventually("the first report", || async {
        !received.lock().unwrap().is_empty()
    })
    .await;
    let load = drive(edge.port, 20, 3, &[]).await;
    assert_eq!((load.admitted, load.denied), (60, 0), "5/s is not enforced");
    let says = "RequestsPerTimeUnit rate limit strategies are not yet supported in RLQS";
    common::eventually("Envoy to say so in its log", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(says)
    })
    .await;
}

#[tokio::test]
async fn a_fill_interval_under_a_second_does_not_limit_and_one_second_does() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let mut admitted = Vec::new();
    for nanos in [500_000_000, 0] {
        let fill = prost_types::Duration {
            seconds: if nanos == 0 { 1 } else { 0 },
            nanos,
        };
        let (probe, received) = start_probe(Some(assignment(token_bucket(5, 5, fill), 60))).await;
        let edge = envoy(
            probe,
            upstream,
            &[],
            &dir.path().join(format!("{nanos}.log")),
        )
        .await;
        edge.get("/", &[]).await;
        common::eventually("the first report", || async {
            !received.lock().unwrap().is_empty()
        })
        .await;
        // Past the bucket's first (full) tokens.
        let load = drive(edge.port, 20, 4, &[]).await;
        admitted.push(load.admitted_rate(1, 4));
    }
    assert_eq!(admitted[0], 20.0, "0.5 s: unlimited ({admitted:?})");
    assert!(
        (4.0..=7.0).contains(&admitted[1]),
        "1 s: 5/s ({admitted:?})"
    );
}

#[tokio::test]
async fn a_zero_time_to_live_expires_at_once() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let mut statuses = Vec::new();
    for (ttl, settled) in [(0, 429), (60, 200)] {
        let allow = Strategy::BlanketRule(BlanketRule::AllowAll as i32);
        let (probe, received) = start_probe(Some(assignment(allow, ttl))).await;
        let edge = envoy(probe, upstream, &[], &dir.path().join(format!("{ttl}.log"))).await;
        edge.get("/", &[]).await;
        common::eventually("the first report", || async {
            !received.lock().unwrap().is_empty()
        })
        .await;
        common::eventually("the assignment to be applied", || async {
            edge.get("/", &[]).await.status == settled
        })
        .await;
        let load = drive(edge.port, 20, 2, &[]).await;
        statuses.push((load.admitted, load.denied));
    }
    // TTL 0: the allow-all expires at once, and the example's expired
    // behaviour (deny all for 60 s) answers; TTL 60: allowed.
    assert_eq!(statuses, [(0, 40), (40, 0)]);
}
