//! What a run drives: ratelimitd's `CheckLimit` (one limit or several per
//! request) or `CheckLimits` (a batch of requests per call), an Envoy RLS
//! server's `ShouldRateLimit`, or Redis itself running ratelimitd's decision
//! script (the baseline), each reduced to "send one call for these keys, get
//! each request's allowed, denied or error".

use std::time::Duration;

use ratelimitd::algorithm::Algorithm;
use ratelimitd::algorithm::registry::WindowStart;
use ratelimitd::limit::CallerKey;
use ratelimitd::limiter::script::{self, Mode, ScriptLimit};
use ratelimitd::limiter::storage_key;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use ratelimitd::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient,
};
use ratelimitd::pb::ratelimitd::v1::{
    self as pb, CheckLimitRequest, CheckLimitsRequest, check_limit_result,
    rate_limiter_client::RateLimiterClient,
};
use redis::aio::MultiplexedConnection;
use tonic::transport::{Channel, Endpoint};

use crate::options::{Options, TargetKind};

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    /// A failed call, by kind (a gRPC code, or a Redis error kind).
    Error(String),
}

/// The answers to one call: one outcome per request it carried (one, or a
/// batch's).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Outcomes {
    pub allowed: u64,
    pub denied: u64,
    /// Failed requests by kind; empty (and not allocated) when none failed,
    /// which is the common case.
    pub errors: Vec<(String, u64)>,
}

impl Outcomes {
    fn one(outcome: Outcome) -> Self {
        let mut outcomes = Self::default();
        outcomes.add(outcome, 1);
        outcomes
    }

    fn add(&mut self, outcome: Outcome, count: u64) {
        match outcome {
            Outcome::Allowed => self.allowed += count,
            Outcome::Denied => self.denied += count,
            Outcome::Error(kind) => match self.errors.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += count,
                None => self.errors.push((kind, count)),
            },
        }
    }

    pub(crate) fn error_count(&self) -> u64 {
        self.errors.iter().map(|(_, n)| n).sum()
    }
}

/// A connected target; workers share it, each using connection
/// `worker % connections`.
pub(crate) enum Target {
    CheckLimit {
        clients: Vec<RateLimiterClient<Channel>>,
        /// Every request, but for its key: one limit, or `--limits` named
        /// ones.
        template: CheckLimitRequest,
    },
    ShouldRateLimit {
        clients: Vec<RateLimitServiceClient<Channel>>,
        domain: String,
        cost: u32,
    },
    RedisDirect {
        connections: Vec<MultiplexedConnection>,
        algorithm: Algorithm,
        key_prefix: String,
        cost: u64,
        timeout: Duration,
    },
}

impl Target {
    /// Opens the connections.
    pub(crate) async fn connect(options: &Options) -> Result<Self, String> {
        let algorithm = algorithm(options)?;
        let connections = options.connections as usize;
        match options.target {
            TargetKind::CheckLimit => {
                let channels = channels(options, connections).await?;
                Ok(Self::CheckLimit {
                    clients: channels.into_iter().map(RateLimiterClient::new).collect(),
                    template: check_limit_template(options),
                })
            }
            TargetKind::ShouldRateLimit => {
                let channels = channels(options, connections).await?;
                let cost = u32::try_from(options.cost)
                    .map_err(|_| "--cost: Envoy's hits_addend is at most 4294967295")?;
                Ok(Self::ShouldRateLimit {
                    clients: channels
                        .into_iter()
                        .map(RateLimitServiceClient::new)
                        .collect(),
                    domain: options.domain.clone(),
                    cost,
                })
            }
            TargetKind::RedisDirect => {
                let client = redis::Client::open(options.redis_url.as_str())
                    .map_err(|err| format!("--redis-url: {err}"))?;
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(options.timeout))
                    .set_response_timeout(Some(options.timeout));
                let mut opened = Vec::with_capacity(connections);
                for _ in 0..connections {
                    let connection = client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map_err(|err| format!("cannot connect to {}: {err}", options.redis_url))?;
                    opened.push(connection);
                }
                Ok(Self::RedisDirect {
                    connections: opened,
                    algorithm,
                    key_prefix: options.redis_key_prefix.clone(),
                    cost: options.cost,
                    timeout: options.timeout,
                })
            }
        }
    }

    /// Sends one call, one request per key of `keys`, on the worker's
    /// connection: a batch (`CheckLimits`) if there are several keys, which
    /// only `check-limit` is given.
    pub(crate) async fn call(&self, worker: usize, keys: &[&str]) -> Outcomes {
        // Options allow batches for check-limit only.
        let key = keys.first().copied().unwrap_or_default();
        match self {
            Self::CheckLimit { clients, template } => {
                check_limit(own(clients, worker), template, keys).await
            }
            Self::ShouldRateLimit {
                clients,
                domain,
                cost,
            } => Outcomes::one(should_rate_limit(own(clients, worker), domain, *cost, key).await),
            Self::RedisDirect {
                connections,
                algorithm,
                key_prefix,
                cost,
                timeout,
            } => {
                let limit = (algorithm, key_prefix.as_str(), *cost);
                let connection = own(connections, worker);
                Outcomes::one(redis_direct(connection, limit, key, *timeout).await)
            }
        }
    }
}

/// The worker's own of the run's connections (clients are cheap handles
/// onto one).
fn own<T: Clone>(all: &[T], worker: usize) -> T {
    all[worker % all.len()].clone()
}

/// One `CheckLimit` call for one key, or one `CheckLimits` call for
/// several.
async fn check_limit(
    mut client: RateLimiterClient<Channel>,
    template: &CheckLimitRequest,
    keys: &[&str],
) -> Outcomes {
    let request = |key: &str| CheckLimitRequest {
        key: key.to_owned(),
        ..template.clone()
    };
    if let [key] = keys {
        return Outcomes::one(match client.check_limit(request(key)).await {
            Ok(response) if response.get_ref().allowed => Outcome::Allowed,
            Ok(_) => Outcome::Denied,
            Err(status) => Outcome::Error(format!("grpc {:?}", status.code())),
        });
    }
    let batch = CheckLimitsRequest {
        requests: keys.iter().map(|key| request(key)).collect(),
    };
    let mut outcomes = Outcomes::default();
    match client.check_limits(batch).await {
        Ok(response) => {
            let results = response.into_inner().results;
            // Each item counts as a unary call's answer would, its error
            // under the same name.
            let answered = results.len() as u64;
            for result in results {
                let outcome = match result.result {
                    Some(check_limit_result::Result::Response(response)) => {
                        if response.allowed {
                            Outcome::Allowed
                        } else {
                            Outcome::Denied
                        }
                    }
                    Some(check_limit_result::Result::Error(status)) => {
                        Outcome::Error(format!("grpc {:?}", tonic::Code::from_i32(status.code)))
                    }
                    None => Outcome::Error("empty result".into()),
                };
                outcomes.add(outcome, 1);
            }
            // A server that answers fewer items than asked has failed the
            // rest; more would be counted above.
            let missing = (keys.len() as u64).saturating_sub(answered);
            if missing > 0 {
                outcomes.add(Outcome::Error("missing result".into()), missing);
            }
        }
        // The whole call failed: so did every request in it.
        Err(status) => outcomes.add(
            Outcome::Error(format!("grpc {:?}", status.code())),
            keys.len() as u64,
        ),
    }
    outcomes
}

/// One `ShouldRateLimit` call: `cost` hits on the descriptor `("key",
/// key)` of `domain`.
async fn should_rate_limit(
    mut client: RateLimitServiceClient<Channel>,
    domain: &str,
    cost: u32,
    key: &str,
) -> Outcome {
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "key".into(),
                value: key.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: cost,
    };
    match client.should_rate_limit(request).await {
        Ok(response) => match response.get_ref().overall_code() {
            Code::Ok => Outcome::Allowed,
            Code::OverLimit => Outcome::Denied,
            Code::Unknown => Outcome::Error("overall_code UNKNOWN".into()),
        },
        Err(status) => Outcome::Error(format!("grpc {:?}", status.code())),
    }
}

/// One call of ratelimitd's decision script for `key`: exactly what
/// ratelimitd sends for one `CheckLimit` call with `limit` (the algorithm,
/// the key prefix and the cost).
async fn redis_direct(
    mut connection: MultiplexedConnection,
    (algorithm, key_prefix, cost): (&Algorithm, &str, u64),
    key: &str,
    timeout: Duration,
) -> Outcome {
    let caller = match CallerKey::new(key.to_owned()) {
        Ok(caller) => caller,
        Err(err) => return Outcome::Error(format!("key: {err}")),
    };
    let key = storage_key(key_prefix, algorithm, &caller);
    let limit = ScriptLimit {
        key: &key,
        algorithm,
        cost,
        shadow: false,
    };
    let invocation = script::decide_call(Mode::Decide, &[limit]);
    let reply = tokio::time::timeout(
        timeout,
        invocation.invoke_async::<redis::Value>(&mut connection),
    )
    .await;
    match reply {
        Ok(Ok(reply)) => match script::decode(&[limit], &reply).as_deref() {
            Ok([decided]) if decided.decision.is_allowed() => Outcome::Allowed,
            Ok([_]) => Outcome::Denied,
            _ => Outcome::Error(format!("script replied {reply:?}")),
        },
        Ok(Err(err)) => Outcome::Error(format!("redis {:?}", err.kind())),
        Err(_) => Outcome::Error("timeout".into()),
    }
}

/// The limit every target applies ([`Options::rate`]), with `CheckLimit`'s
/// fixed windows, which start at a key's first request.
pub(crate) fn algorithm(options: &Options) -> Result<Algorithm, String> {
    options
        .algorithm
        .build(options.rate(), WindowStart::FirstRequest)
        .map_err(|err| err.to_string())
}

/// A `CheckLimit` request without its key: the run's limit in the
/// one-limit form, or `--limits` copies of it named `l0`, `l1`... (each a
/// counter of its own on the request's key), and `--cost` on the request.
fn check_limit_template(options: &Options) -> CheckLimitRequest {
    let algorithm = ratelimitd::pb::algorithm::to_proto(options.algorithm, options.rate());
    let cost = Some(options.cost);
    if options.limits <= 1 {
        return CheckLimitRequest {
            algorithm: Some(algorithm),
            cost,
            ..Default::default()
        };
    }
    let limits = (0..options.limits)
        .map(|i| pb::Limit {
            name: limit_name(i),
            // Empty: the request's key, so every limit counts the key drawn.
            key: String::new(),
            algorithm: Some(algorithm.into()),
            // Unset: the request's cost.
            cost: None,
        })
        .collect();
    CheckLimitRequest {
        limits,
        cost,
        ..Default::default()
    }
}

/// The name of limit `i` of a request with several.
pub(crate) fn limit_name(i: u32) -> String {
    format!("l{i}")
}

/// `connections` HTTP/2 connections to the server.
async fn channels(options: &Options, connections: usize) -> Result<Vec<Channel>, String> {
    let endpoint = Endpoint::from_shared(options.address.clone())
        .map_err(|err| format!("--address: {err}"))?
        .tcp_nodelay(true)
        .timeout(options.timeout)
        .connect_timeout(options.timeout);
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        // Each `connect` opens its own connection; clones would share one.
        let channel = endpoint
            .connect()
            .await
            .map_err(|err| format!("cannot connect to {}: {err}", options.address))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// Rules in envoyproxy/ratelimit's format (with ratelimitd's `algorithm` and
/// `unit_multiplier` extensions) that give `--domain` the run's limit for
/// the descriptor `("key", <any value>)`.
pub(crate) fn envoy_config(options: &Options) -> Result<String, String> {
    let window = options.window;
    if window.subsec_nanos() != 0 || window.as_secs() == 0 {
        return Err("--window must be whole seconds for Envoy rules".into());
    }
    let limit = u32::try_from(options.limit)
        .map_err(|_| "--limit: Envoy's requests_per_unit is at most 4294967295")?;
    let algorithm = options.algorithm.name();
    Ok(format!(
        "# ratelimitd-bench rules: {limit} per {seconds}s ({algorithm}) for every key.\n\
         domain: {domain}\n\
         descriptors:\n\
         \x20 - key: key\n\
         \x20   rate_limit:\n\
         \x20     algorithm: {algorithm}\n\
         \x20     unit: second\n\
         \x20     unit_multiplier: {seconds}\n\
         \x20     requests_per_unit: {limit}\n",
        seconds = window.as_secs(),
        domain = options.domain,
    ))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use ratelimitd::pb::ratelimitd::v1::check_limit_request;

    use super::*;

    fn template(args: &[&str]) -> CheckLimitRequest {
        let options = Options::parse_from(std::iter::once("bench").chain(args.iter().copied()));
        check_limit_template(&options)
    }

    #[test]
    fn one_limit_keeps_the_one_limit_form() {
        let request = template(&["--limit", "7", "--cost", "2"]);
        assert!(request.limits.is_empty());
        assert_eq!(request.cost, Some(2));
        let Some(check_limit_request::Algorithm::FixedWindow(window)) = request.algorithm else {
            panic!("{request:?}");
        };
        assert_eq!(window.limit, 7);
    }

    #[test]
    fn several_limits_are_named_copies_of_the_limit_on_the_request_key() {
        let request = template(&["--limits", "3", "--algorithm", "gcra", "--limit", "9"]);
        assert_eq!(request.algorithm, None);
        assert_eq!(request.cost, Some(1));
        let names: Vec<&str> = request.limits.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["l0", "l1", "l2"]);
        for limit in &request.limits {
            assert_eq!(limit.key, "");
            assert_eq!(limit.cost, None);
            let Some(pb::limit::Algorithm::Gcra(gcra)) = limit.algorithm else {
                panic!("{limit:?}");
            };
            assert_eq!((gcra.rate, gcra.burst), (9, 9));
        }
    }

    #[test]
    fn a_batch_item_failure_counts_under_its_kind() {
        let mut outcomes = Outcomes::default();
        outcomes.add(Outcome::Allowed, 1);
        outcomes.add(Outcome::Error("grpc Unavailable".into()), 2);
        outcomes.add(Outcome::Error("grpc Unavailable".into()), 1);
        outcomes.add(Outcome::Denied, 3);
        assert_eq!((outcomes.allowed, outcomes.denied), (1, 3));
        assert_eq!(outcomes.errors, [("grpc Unavailable".to_owned(), 3)]);
        assert_eq!(outcomes.error_count(), 3);
    }
}
