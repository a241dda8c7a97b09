//! Exactness under concurrency: 300 simultaneous `CheckLimit` calls on one
//! key with limit 100 admit exactly 100, for every algorithm, whether they
//! arrive through two ratelimitd processes sharing one Redis or through one
//! server on the embedded store.

mod common;

use std::time::Duration;

use common::{
    RedisServer, ServerProcess, TestServer, fixed_window, request, sliding_window, token_bucket,
};
use futures::future::join_all;
use ratelimitd::pb::ratelimitd::v1 as pb;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;

const CALLS: usize = 300;
const LIMIT: u64 = 100;

/// Every algorithm with limit 100 and nothing coming back during the test
/// (the bucket refills one token in 1000 s).
fn every_algorithm() -> [pb::check_limit_request::Algorithm; 3] {
    [
        fixed_window(LIMIT, Duration::from_secs(60)),
        sliding_window(LIMIT, Duration::from_secs(60)),
        token_bucket(LIMIT, 0.001),
    ]
}

/// Fires all calls at once, spread round-robin over `clients`, and counts
/// the allowed ones. Every call must get an answer.
async fn allowed_count(
    clients: &[RateLimiterClient<Channel>],
    key: &str,
    algorithm: &pb::check_limit_request::Algorithm,
) -> usize {
    let calls = (0..CALLS).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        let request = request(key, *algorithm, None);
        tokio::spawn(async move { client.check_limit(request).await })
    });
    let mut allowed = 0;
    for result in join_all(calls).await {
        let response = result
            .expect("task")
            .expect("every call is answered")
            .into_inner();
        if response.allowed {
            allowed += 1;
        }
    }
    allowed
}

/// For each algorithm, on a key of its own: exactly [`LIMIT`] of [`CALLS`].
async fn assert_every_algorithm_admits_exactly_the_limit(clients: &[RateLimiterClient<Channel>]) {
    for (i, algorithm) in every_algorithm().iter().enumerate() {
        let key = format!("hot-{i}");
        assert_eq!(
            allowed_count(clients, &key, algorithm).await,
            LIMIT as usize,
            "{algorithm:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    // Timeouts generous enough that a slow CI machine answers every call.
    let flags = ["--redis-url", &url, "--redis-command-timeout", "10s"];
    let servers = [
        ServerProcess::start(&flags).await,
        ServerProcess::start(&flags).await,
    ];
    let mut clients = Vec::new();
    for server in &servers {
        // Several connections per server, so calls really run in parallel.
        for _ in 0..4 {
            clients.push(server.client().await);
        }
    }
    assert_every_algorithm_admits_exactly_the_limit(&clients).await;
    redis.assert_every_key_expires().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_store_admits_exactly_the_limit() {
    let server = TestServer::memory().await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.client().await);
    }
    assert_every_algorithm_admits_exactly_the_limit(&clients).await;
    server.stop().await;
}
