//! What a run drives: ratelimitd's `CheckLimit`, an Envoy RLS server's
//! `ShouldRateLimit`, or Redis itself running ratelimitd's decision script
//! (the baseline), each reduced to "send one request for this key, get
//! allowed, denied or an error".

use std::time::Duration;

use ratelimitd::limit::{
    Algorithm, CallerKey, FixedWindow, Gcra, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use ratelimitd::limiter::script::{self, Mode, ScriptLimit};
use ratelimitd::limiter::storage_key;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use ratelimitd::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient,
};
use ratelimitd::pb::ratelimitd::v1::{
    self as pb, CheckLimitRequest, check_limit_request, rate_limiter_client::RateLimiterClient,
};
use redis::aio::MultiplexedConnection;
use tonic::transport::{Channel, Endpoint};

use crate::options::{AlgorithmKind, Options, TargetKind};

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    /// A failed call, by kind (a gRPC code, or a Redis error kind).
    Error(String),
}

/// A connected target; workers share it, each using connection
/// `worker % connections`.
pub(crate) enum Target {
    CheckLimit {
        clients: Vec<RateLimiterClient<Channel>>,
        algorithm: check_limit_request::Algorithm,
        cost: u64,
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
                    algorithm: pb_algorithm(options, &algorithm),
                    cost: options.cost,
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

    /// Sends one request for `key` on the worker's connection.
    pub(crate) async fn call(&self, worker: usize, key: &str) -> Outcome {
        match self {
            Self::CheckLimit {
                clients,
                algorithm,
                cost,
            } => {
                // Clients are cheap handles onto the shared channel.
                let mut client = clients[worker % clients.len()].clone();
                let request = CheckLimitRequest {
                    key: key.to_owned(),
                    algorithm: Some(*algorithm),
                    cost: Some(*cost),
                    ..Default::default()
                };
                match client.check_limit(request).await {
                    Ok(response) if response.get_ref().allowed => Outcome::Allowed,
                    Ok(_) => Outcome::Denied,
                    Err(status) => Outcome::Error(format!("grpc {:?}", status.code())),
                }
            }
            Self::ShouldRateLimit {
                clients,
                domain,
                cost,
            } => {
                let mut client = clients[worker % clients.len()].clone();
                let request = RateLimitRequest {
                    domain: domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "key".into(),
                            value: key.to_owned(),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: *cost,
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
            Self::RedisDirect {
                connections,
                algorithm,
                key_prefix,
                cost,
                timeout,
            } => {
                let mut connection = connections[worker % connections.len()].clone();
                let caller = match CallerKey::new(key.to_owned()) {
                    Ok(caller) => caller,
                    Err(err) => return Outcome::Error(format!("key: {err}")),
                };
                // Exactly what ratelimitd sends for one CheckLimit call.
                let key = storage_key(key_prefix, algorithm, &caller);
                let limit = ScriptLimit {
                    key: &key,
                    algorithm,
                    cost: *cost,
                    shadow: false,
                };
                let invocation = script::decide_call(Mode::Decide, &[limit]);
                let reply = tokio::time::timeout(
                    *timeout,
                    invocation.invoke_async::<Vec<i64>>(&mut connection),
                )
                .await;
                match reply {
                    Ok(Ok(reply)) => match reply.first() {
                        Some(1) => Outcome::Allowed,
                        Some(0) => Outcome::Denied,
                        _ => Outcome::Error(format!("script replied {reply:?}")),
                    },
                    Ok(Err(err)) => Outcome::Error(format!("redis {:?}", err.kind())),
                    Err(_) => Outcome::Error("timeout".into()),
                }
            }
        }
    }
}

/// The limit every target applies: `--limit` per `--window` (a token bucket
/// holds `--limit` and refills it once per window).
pub(crate) fn algorithm(options: &Options) -> Result<Algorithm, String> {
    let invalid = |err: ratelimitd::limit::InvalidArgument| err.to_string();
    match options.algorithm {
        AlgorithmKind::FixedWindow => FixedWindow::new(options.limit, options.window)
            .map(Algorithm::FixedWindow)
            .map_err(invalid),
        AlgorithmKind::SlidingWindow => SlidingWindow::new(options.limit, options.window)
            .map(Algorithm::SlidingWindow)
            .map_err(invalid),
        AlgorithmKind::TokenBucket => {
            if options.window.is_zero() {
                return Err("--window must be positive".into());
            }
            let per_second = options.limit as f64 / options.window.as_secs_f64();
            TokenBucket::new(options.limit, per_second)
                .map(Algorithm::TokenBucket)
                .map_err(invalid)
        }
        AlgorithmKind::SlidingWindowCounter => {
            SlidingWindowCounter::new(options.limit, options.window)
                .map(Algorithm::SlidingWindowCounter)
                .map_err(invalid)
        }
        AlgorithmKind::Gcra => Gcra::new(options.limit, options.window, options.limit)
            .map(Algorithm::Gcra)
            .map_err(invalid),
    }
}

/// The same limit as `CheckLimit` states it.
fn pb_algorithm(options: &Options, algorithm: &Algorithm) -> check_limit_request::Algorithm {
    // `algorithm` was built from `--window`, which validation bounds to
    // 366 days: the conversion cannot fail.
    let window = prost_types::Duration::try_from(options.window).ok();
    match algorithm {
        Algorithm::FixedWindow(p) => check_limit_request::Algorithm::FixedWindow(pb::FixedWindow {
            limit: p.limit(),
            window,
        }),
        Algorithm::SlidingWindow(p) => {
            check_limit_request::Algorithm::SlidingWindow(pb::SlidingWindow {
                limit: p.limit(),
                window,
            })
        }
        Algorithm::TokenBucket(p) => check_limit_request::Algorithm::TokenBucket(pb::TokenBucket {
            capacity: p.capacity(),
            refill_per_second: p.refill_per_second(),
        }),
        Algorithm::SlidingWindowCounter(p) => {
            check_limit_request::Algorithm::SlidingWindowCounter(pb::SlidingWindowCounter {
                limit: p.limit(),
                window,
            })
        }
        // GCRA keeps only its interval; the request states rate and period.
        Algorithm::Gcra(p) => check_limit_request::Algorithm::Gcra(pb::Gcra {
            rate: options.limit,
            period: window,
            burst: p.burst(),
        }),
    }
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
    let algorithm = match options.algorithm {
        AlgorithmKind::FixedWindow => "fixed_window",
        AlgorithmKind::SlidingWindow => "sliding_window",
        AlgorithmKind::TokenBucket => "token_bucket",
        AlgorithmKind::Gcra => "gcra",
        AlgorithmKind::SlidingWindowCounter => "sliding_window_counter",
    };
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
