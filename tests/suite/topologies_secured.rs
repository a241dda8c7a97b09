//! ratelimitd on a Redis Cluster and on a Sentinel group that demand a
//! password or an ACL user, or speak only TLS (a private CA, and a client
//! certificate): one ratelimitd process on each, and a fixed window of 2
//! admits exactly 2 of 3 calls.

use crate::common;

use common::ServerProcess;
use common::redis::{RedisCluster, RedisSentinel, Secured, Security, SentinelPassword};

const PASSWORD: &str = "s3cret p@ss";

fn password() -> Security {
    Security {
        password: Some(PASSWORD.to_owned()),
        ..Security::default()
    }
}

/// Exactly two of three allowed on a fresh key.
async fn decides_exactly(server: &ServerProcess) {
    common::assert_two_of_three_admitted(&mut server.client().await, "k").await;
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

/// The flags for `sentinel`: the URLs with the primary's credentials, and
/// the sentinels' own, if they demand any, in `--redis-sentinel-auth`.
fn sentinel_flags(sentinel: &RedisSentinel) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        "--redis-mode".into(),
        "sentinel".into(),
        "--redis-url".into(),
        sentinel.sentinel_urls().join(","),
        "--redis-sentinel-master".into(),
        sentinel.master_name().into(),
        "--redis-command-timeout".into(),
        "10s".into(),
    ];
    if let Some(auth) = sentinel.sentinel_auth() {
        flags.push(format!("--redis-sentinel-auth={auth}"));
    }
    flags
}

async fn start(flags: &[String]) -> ServerProcess {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    ServerProcess::builder().flags(&flags).start().await
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

/// Sentinels with no password, or one of their own, beside a primary with
/// one: the URLs carry the primary's, which never goes to the sentinels;
/// `--redis-sentinel-auth` carries the sentinels' (upstream's REDIS_AUTH
/// and REDIS_SENTINEL_AUTH), and unset or empty, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinels_with_credentials_of_their_own() {
    for (sentinels, empty_flag) in [
        (SentinelPassword::Open, false),
        (SentinelPassword::Open, true),
        (SentinelPassword::Own("sentinel pw".into()), false),
    ] {
        let sentinel = RedisSentinel::start_with(Security {
            sentinels,
            ..password()
        })
        .await;
        let mut flags = sentinel_flags(&sentinel);
        assert!(flags[3].contains('@'), "the primary's password in the URLs");
        if empty_flag {
            flags.push("--redis-sentinel-auth=".into());
        }
        let server = start(&flags).await;
        decides_exactly(&server).await;
        server.terminate().await;
    }
}

const ACL_USER: &str = "limiter";
const ACL_PASSWORD: &str = "s3cret";

fn acl_user() -> Security {
    Security {
        acl_user: Some((ACL_USER.to_owned(), ACL_PASSWORD.to_owned())),
        ..Security::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_with_an_acl_user() {
    let cluster = RedisCluster::start_with(acl_user()).await;
    let server = start(&cluster_flags(&cluster)).await;
    decides_exactly(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_with_an_acl_user() {
    let sentinel = RedisSentinel::start_with(acl_user()).await;
    let server = start(&sentinel_flags(&sentinel)).await;
    decides_exactly(&server).await;
}

fn tls() -> Security {
    Security {
        tls: Some(common::redis::ClientCertificates::Optional),
        ..Security::default()
    }
}

/// The flags that give ratelimitd the harness's CA and client certificate.
fn tls_flags(ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Vec<String> {
    let path = |file: &std::path::Path| file.to_string_lossy().into_owned();
    vec![
        "--redis-tls-ca".into(),
        path(ca),
        "--redis-tls-cert".into(),
        path(cert),
        "--redis-tls-key".into(),
        path(key),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_over_tls() {
    let cluster = RedisCluster::start_with(tls()).await;
    let mut flags = cluster_flags(&cluster);
    flags.extend(tls_flags(
        cluster.ca_cert_path(),
        cluster.client_cert_path(),
        cluster.client_key_path(),
    ));
    let server = start(&flags).await;
    decides_exactly(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_over_tls() {
    let sentinel = RedisSentinel::start_with(tls()).await;
    let mut flags = sentinel_flags(&sentinel);
    flags.extend(tls_flags(
        sentinel.ca_cert_path(),
        sentinel.client_cert_path(),
        sentinel.client_key_path(),
    ));
    let server = start(&flags).await;
    decides_exactly(&server).await;
}
