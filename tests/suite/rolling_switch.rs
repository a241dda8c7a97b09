//! A Deployment rolling from envoyproxy/ratelimit's image to ratelimitd's:
//! under upstream's variables, an Envoy fixed-window limit is named and
//! counted in Redis exactly as upstream's code does it (`INCRBY` on
//! `<CACHE_KEY_PREFIX><domain>_<key>_<value>_<window start>`, then
//! `EXPIRE`), so old and new pods share one count, both ways.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::rls::{descriptor, with_hits};
use common::{RedisServer, ServerProcess};
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use redis::aio::MultiplexedConnection;
use tonic::transport::Channel;

const RULES: &str = "domain: rolling\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
const PREFIX: &str = "rl_";
const HOUR: u64 = 3600;

/// The start of the hour now is in, in seconds, after waiting out the
/// hour's last 20 s (so the test's steps all fall in one window).
async fn this_hour() -> u64 {
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
    };
    let into_hour = now().as_secs_f64() % HOUR as f64;
    if into_hour > (HOUR - 20) as f64 {
        tokio::time::sleep(Duration::from_secs_f64(HOUR as f64 - into_hour + 0.2)).await;
    }
    now().as_secs() / HOUR * HOUR
}

/// What upstream's `fixedRateLimitCacheImpl.DoLimit` sends for one hit of
/// `hits` on `key`: `INCRBY`, then `EXPIRE` of the unit's seconds plus
/// jitter, in one pipeline.
async fn upstream_counts(redis: &mut MultiplexedConnection, key: &str, hits: u64) -> u64 {
    let (count,): (u64,) = redis::pipe()
        .cmd("INCRBY")
        .arg(key)
        .arg(hits)
        .cmd("EXPIRE")
        .arg(key)
        .arg(HOUR + 17)
        .ignore()
        .query_async(redis)
        .await
        .expect("INCRBY and EXPIRE");
    count
}

/// What upstream would read of `key` (its `GET` with
/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): the count, and its time to
/// live.
async fn read(redis: &mut MultiplexedConnection, key: &str) -> (Option<u64>, i64) {
    redis::pipe()
        .cmd("GET")
        .arg(key)
        .cmd("TTL")
        .arg(key)
        .query_async(redis)
        .await
        .expect("GET and TTL")
}

async fn hit(
    client: &mut RateLimitServiceClient<Channel>,
    user: &str,
    hits: u64,
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: "rolling".into(),
        descriptors: vec![with_hits(descriptor(&[("user", user)]), hits)],
        hits_addend: 0,
    };
    client
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

fn status(response: &RateLimitResponse) -> (Code, u32) {
    let status: &DescriptorStatus = &response.statuses[0];
    (status.code(), status.limit_remaining)
}

/// A value no earlier run used.
fn fresh(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("{name}{nanos}")
}

#[tokio::test]
async fn upstream_and_ratelimitd_pods_share_one_count() {
    let redis = RedisServer::start().await;
    let mut connection = redis.connection().await;
    let runtime = tempfile::tempdir().expect("runtime root");
    let config = runtime.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&config).expect("runtime directories");
    std::fs::write(config.join("rolling.yaml"), RULES).expect("rules");
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let root = runtime.path().to_str().expect("utf-8 path");
    let server = ServerProcess::builder()
        .env(&[
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("RUNTIME_ROOT", root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("CACHE_KEY_PREFIX", PREFIX),
        ])
        .upstream_way()
        .start()
        .await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let hour = this_hour().await;

    // An upstream pod counted first: ratelimitd carries on from its count.
    let alice = fresh("alice");
    let key = format!("{PREFIX}rolling_user_{alice}_{hour}");
    assert_eq!(upstream_counts(&mut connection, &key, 3).await, 3);
    assert_eq!(status(&hit(&mut client, &alice, 1).await), (Code::Ok, 6));
    // ...and upstream reads ratelimitd's hit on the same key, which lives
    // at least the rest of the window.
    let (count, ttl) = read(&mut connection, &key).await;
    assert_eq!(count, Some(4));
    assert!(ttl > 0 && ttl <= HOUR as i64 + 17, "TTL {ttl}");
    // Upstream takes it to the limit: ratelimitd denies, and counts the
    // denied hit as upstream does.
    assert_eq!(upstream_counts(&mut connection, &key, 6).await, 10);
    assert_eq!(
        status(&hit(&mut client, &alice, 1).await),
        (Code::OverLimit, 0)
    );
    assert_eq!(read(&mut connection, &key).await.0, Some(11));

    // ratelimitd counted first: upstream's key holds the count, and
    // upstream's next hit lands on it.
    let bob = fresh("bob");
    let key = format!("{PREFIX}rolling_user_{bob}_{hour}");
    assert_eq!(status(&hit(&mut client, &bob, 2).await), (Code::Ok, 8));
    let (count, ttl) = read(&mut connection, &key).await;
    assert_eq!(count, Some(2));
    assert!(ttl > 0 && ttl <= HOUR as i64, "TTL {ttl}");
    assert_eq!(upstream_counts(&mut connection, &key, 5).await, 7);
    assert_eq!(status(&hit(&mut client, &bob, 1).await), (Code::Ok, 2));

    // Nothing else was written: no key of ratelimitd's own layout.
    let keys = redis.keys().await;
    assert!(
        keys.iter()
            .all(|key| key.starts_with(PREFIX) && !key.contains('{')),
        "{keys:?}"
    );
    server.terminate().await;
}
