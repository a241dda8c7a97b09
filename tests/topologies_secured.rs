//! ratelimitd on a Redis Cluster and on a Sentinel group that demand a
//! password: one ratelimitd process on each, and a fixed window of 2 admits
//! exactly 2 of 3 calls. (Over TLS both topologies start and the harness
//! gets through, but ratelimitd does not yet: its cluster pool does not give
//! the private CA to the nodes it connects to, and its sentinel pool
//! connects to a TLS primary in plain TCP; see `RedisStore::new`.)

mod common;

use std::time::Duration;

use common::topology::{RedisCluster, RedisSentinel, Security};
use common::{ServerProcess, check, fixed_window};

const PASSWORD: &str = "s3cret p@ss";

fn password() -> Security {
    Security {
        password: Some(PASSWORD.to_owned()),
        ..Security::default()
    }
}

/// Exactly two of three allowed on a fresh key.
async fn decides_exactly(server: &ServerProcess) {
    let mut client = server.client().await;
    let limit = fixed_window(2, Duration::from_secs(60));
    assert!(check(&mut client, "k", &limit, None).await.allowed);
    assert!(check(&mut client, "k", &limit, None).await.allowed);
    assert!(!check(&mut client, "k", &limit, None).await.allowed);
}

fn cluster_flags(cluster: &RedisCluster) -> Vec<String> {
    vec![
        "--redis-mode".into(),
        "cluster".into(),
        "--redis-url".into(),
        cluster.urls().join(","),
        "--redis-command-timeout".into(),
        "10s".into(),
    ]
}

fn sentinel_flags(sentinel: &RedisSentinel) -> Vec<String> {
    vec![
        "--redis-mode".into(),
        "sentinel".into(),
        "--redis-url".into(),
        sentinel.sentinel_urls().join(","),
        "--redis-sentinel-master".into(),
        sentinel.master_name().into(),
        "--redis-command-timeout".into(),
        "10s".into(),
    ]
}

async fn start(flags: &[String]) -> ServerProcess {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    ServerProcess::start(&flags).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_with_a_password() {
    let cluster = RedisCluster::start_with(password()).await;
    let server = start(&cluster_flags(&cluster)).await;
    decides_exactly(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_with_a_password() {
    let sentinel = RedisSentinel::start_with(password()).await;
    let server = start(&sentinel_flags(&sentinel)).await;
    decides_exactly(&server).await;
}
