//! A quota service (RLQS) stream as an Envoy holds one: reports sent one
//! message at a time, assignments read as they come.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action;
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use ratelimitd::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use ratelimitd::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use tokio::sync::mpsc;
use tonic::Streaming;

use super::PATIENCE;

/// What a bucket was told, simplified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Told {
    AllowAll,
    DenyAll,
    /// max_tokens, tokens_per_fill, fill_interval seconds.
    TokenBucket(u32, u32, i64),
    Abandon,
}

impl Told {
    /// The rate of a token bucket, in requests per second (0 for deny all).
    pub(crate) fn rate(&self) -> f64 {
        match self {
            Self::TokenBucket(_, tokens, seconds) => f64::from(*tokens) / *seconds as f64,
            _ => 0.0,
        }
    }
}

/// One action, read: the bucket, what it was told, and the time to live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Action {
    pub(crate) bucket: HashMap<String, String>,
    pub(crate) told: Told,
    pub(crate) ttl_seconds: Option<i64>,
}

pub(crate) fn read(action: &BucketAction) -> Action {
    let bucket = action
        .bucket_id
        .as_ref()
        .expect("every action names its bucket")
        .bucket
        .clone();
    match action.bucket_action.as_ref().expect("an action") {
        bucket_action::BucketAction::AbandonAction(_) => Action {
            bucket,
            told: Told::Abandon,
            ttl_seconds: None,
        },
        bucket_action::BucketAction::QuotaAssignmentAction(assignment) => {
            let strategy = assignment
                .rate_limit_strategy
                .as_ref()
                .and_then(|s| s.strategy.as_ref())
                .expect("a strategy");
            let told = match strategy {
                Strategy::BlanketRule(rule) if *rule == BlanketRule::AllowAll as i32 => {
                    Told::AllowAll
                }
                Strategy::BlanketRule(_) => Told::DenyAll,
                Strategy::TokenBucket(bucket) => Told::TokenBucket(
                    bucket.max_tokens,
                    bucket.tokens_per_fill.expect("tokens_per_fill"),
                    bucket.fill_interval.expect("fill_interval").seconds,
                ),
                Strategy::RequestsPerTimeUnit(_) => {
                    panic!("Envoy 1.40 ignores requests_per_time_unit")
                }
            };
            Action {
                bucket,
                told,
                ttl_seconds: assignment.assignment_time_to_live.map(|ttl| ttl.seconds),
            }
        }
    }
}

/// A bucket id from pairs.
pub(crate) fn bucket(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// One bucket's usage.
pub(crate) fn usage(
    bucket: &HashMap<String, String>,
    allowed: u64,
    denied: u64,
    elapsed: Duration,
) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: bucket.clone(),
        }),
        time_elapsed: Some(prost_types::Duration {
            seconds: elapsed.as_secs() as i64,
            nanos: elapsed.subsec_nanos() as i32,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

/// An open stream.
pub(crate) struct QuotaStream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    responses: Streaming<RateLimitQuotaResponse>,
}

impl QuotaStream {
    pub(crate) async fn open(address: SocketAddr) -> Self {
        let mut client = RateLimitQuotaServiceClient::new(super::channel(address).await);
        let (reports, outbound) = mpsc::channel(16);
        let outbound = futures::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|message| (message, outbound))
        });
        let responses = client
            .stream_rate_limit_quotas(outbound)
            .await
            .expect("the stream opens")
            .into_inner();
        Self { reports, responses }
    }

    /// Sends one message.
    pub(crate) async fn send(&self, domain: &str, usages: Vec<BucketQuotaUsage>) {
        self.reports
            .send(RateLimitQuotaUsageReports {
                domain: domain.to_owned(),
                bucket_quota_usages: usages,
            })
            .await
            .expect("the stream takes reports");
    }

    /// Envoy's first report of a new bucket: one request, no time elapsed.
    pub(crate) async fn subscribe(&self, domain: &str, bucket: &HashMap<String, String>) {
        self.send(domain, vec![usage(bucket, 1, 0, Duration::ZERO)])
            .await;
    }

    /// The next response's actions (waits at most [`PATIENCE`]).
    pub(crate) async fn next(&mut self) -> Vec<Action> {
        let message = tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a response in time")
            .expect("no stream error")
            .expect("the stream goes on");
        message.bucket_action.iter().map(read).collect()
    }

    /// The next response's actions, if one comes within `wait`.
    pub(crate) async fn next_within(&mut self, wait: Duration) -> Option<Vec<Action>> {
        let message = tokio::time::timeout(wait, self.responses.message())
            .await
            .ok()?
            .expect("no stream error")
            .expect("the stream goes on");
        Some(message.bucket_action.iter().map(read).collect())
    }

    /// The next response, which must hold exactly one action.
    pub(crate) async fn next_one(&mut self) -> Action {
        let mut actions = self.next().await;
        assert_eq!(actions.len(), 1, "one action, not {:.2000?}", actions);
        actions.remove(0)
    }

    /// Reads responses until `bucket` is told something `wanted` accepts.
    pub(crate) async fn until(
        &mut self,
        bucket: &HashMap<String, String>,
        wanted: impl Fn(&Told) -> bool,
    ) -> Action {
        loop {
            for action in self.next().await {
                if &action.bucket == bucket && wanted(&action.told) {
                    return action;
                }
            }
        }
    }

    /// Whether the server ends the stream (within [`PATIENCE`]).
    pub(crate) async fn ends(&mut self) -> bool {
        matches!(
            tokio::time::timeout(PATIENCE, self.responses.message()).await,
            Ok(Ok(None) | Err(_))
        )
    }

    /// How the server ends the stream (within [`PATIENCE`]): `Ok(())` for
    /// grpc-status OK, else the status it sent.
    pub(crate) async fn ending(&mut self) -> Result<(), tonic::Status> {
        loop {
            match tokio::time::timeout(PATIENCE, self.responses.message())
                .await
                .expect("the stream ends in time")
            {
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    }
}
