//! Exactness under concurrency: 300 simultaneous `CheckLimit` calls on one
//! key with limit 100 admit exactly 100, for every algorithm, whether they
//! arrive through two ratelimitd processes sharing one Redis (each on three
//! worker threads, each thread with its connections to Redis) or through
//! one server on the embedded store (on one runtime, or on three threads).

use crate::common;

use common::{
    RedisServer, ServerProcess, TestServer, assert_exactly_100_of_300_for_every_algorithm,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    // Timeouts generous enough that a slow CI machine answers every call.
    let flags = [
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "10s",
        "--worker-threads",
        "3",
    ];
    let servers = [
        ServerProcess::builder().flags(&flags).start().await,
        ServerProcess::builder().flags(&flags).start().await,
    ];
    let mut clients = Vec::new();
    for server in &servers {
        // Several connections per server, so calls really run in parallel.
        for _ in 0..4 {
            clients.push(server.client().await);
        }
    }
    assert_exactly_100_of_300_for_every_algorithm(&clients).await;
    // Four connections to each server spread over its three threads, and
    // each thread talks to Redis on a connection of its own.
    let connections = redis.cli(&["CLIENT", "LIST"]).await.expect("CLIENT LIST");
    let theirs = connections
        .lines()
        .filter(|line| !line.contains("cmd=client"))
        .count();
    assert!(
        theirs >= 6,
        "three threads on each of two servers should each hold a Redis connection:\n{connections}"
    );
    redis.assert_every_key_expires().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_store_on_three_threads_admits_exactly_the_limit() {
    let server = ServerProcess::builder()
        .flags(&["--worker-threads", "3"])
        .start()
        .await;
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(server.client().await);
    }
    assert_exactly_100_of_300_for_every_algorithm(&clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_store_admits_exactly_the_limit() {
    let server = TestServer::memory().await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.client().await);
    }
    assert_exactly_100_of_300_for_every_algorithm(&clients).await;
    server.stop().await;
}
