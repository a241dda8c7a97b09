//! The quota service (RLQS) over gRPC, driven as Envoy drives it: a bucket
//! is subscribed by its first report and assigned at once; a policy's rate
//! is split max-min fair among the streams reporting the bucket, on one
//! instance or several sharing Redis; a closed stream frees its share; a
//! silent bucket is abandoned; bad reports are ignored and counted while
//! the stream goes on; a reload reaches the next report; and a Redis
//! outage gets the configured failure policy.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::prometheus;
use common::quota::{QuotaStream, Told, bucket, usage};
use common::quota_policies::write_policies;
use common::{RedisServer, ServerProcess, TestServer, free_port};

const POLICIES: &str = "\
domain: edge
quota_buckets:
  - bucket_id: {name: api}
    rate_limit: {unit: second, requests_per_unit: 100}
  - bucket_id: {name: open}
    rate_limit: {unlimited: true}
  - bucket_id: {name: closed}
    rate_limit: {unit: second, requests_per_unit: 0}
  - bucket_id: {name: watched}
    rate_limit: {unit: second, requests_per_unit: 100}
    shadow_mode: true
quota_default:
  rate_limit: {unit: minute, requests_per_unit: 600, burst: 50}
";

async fn server(dir: &Path, extra: &[&str]) -> TestServer {
    let config = write_policies(dir, POLICIES);
    let mut flags = vec!["--config", &config];
    flags.extend_from_slice(extra);
    TestServer::start(&flags).await
}

/// A server in its own process, serving metrics at `127.0.0.1:metrics_port`
/// (one metrics recorder per process).
async fn server_with_metrics(dir: &Path, metrics_port: u16, extra: &[&str]) -> ServerProcess {
    let config = write_policies(dir, POLICIES);
    let listen = format!("127.0.0.1:{metrics_port}");
    let mut flags = vec!["--config", &config, "--metrics-listen", &listen];
    flags.extend_from_slice(extra);
    ServerProcess::builder().flags(&flags).start().await
}

/// A whole share of 100/s: 6000 a minute, a tenth of a second of burst.
const ALL_OF_100: Told = Told::TokenBucket(10, 6000, 60);
/// Half of it.
const HALF_OF_100: Told = Told::TokenBucket(5, 3000, 60);

#[tokio::test]
async fn a_new_bucket_is_assigned_its_policy_at_its_first_report() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &["--quota-assignment-ttl", "9s"]).await;
    let mut stream = QuotaStream::open(server.address).await;
    let api = bucket(&[("name", "api")]);
    stream.subscribe("edge", &api).await;
    let action = stream.next_one().await;
    assert_eq!(action.bucket, api, "the BucketId is echoed as sent");
    assert_eq!(action.told, ALL_OF_100);
    assert_eq!(action.ttl_seconds, Some(9));

    for (name, told) in [
        ("open", Told::AllowAll),
        ("closed", Told::DenyAll),
        // Shadow mode: worked out, but the Envoy is told to allow.
        ("watched", Told::AllowAll),
        // The default: 600 a minute, and the burst written.
        ("anything", Told::TokenBucket(50, 600, 60)),
    ] {
        let id = bucket(&[("name", name)]);
        stream.subscribe("edge", &id).await;
        let action = stream.next_one().await;
        assert_eq!((action.bucket, action.told), (id, told), "{name}");
    }
    server.stop().await;
}

#[tokio::test]
async fn two_envoys_on_one_instance_split_the_rate_and_a_closed_stream_frees_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &[]).await;
    let api = bucket(&[("name", "api")]);
    let mut first = QuotaStream::open(server.address).await;
    first.subscribe("edge", &api).await;
    assert_eq!(first.next_one().await.told, ALL_OF_100);

    // The second finds the whole rate held: it waits, the first is nudged
    // to its half, and the second grows into it, without a report.
    let mut second = QuotaStream::open(server.address).await;
    second.subscribe("edge", &api).await;
    assert_eq!(second.next_one().await.told, Told::DenyAll);
    assert_eq!(first.next_one().await.told, HALF_OF_100);
    assert_eq!(second.next_one().await.told, HALF_OF_100);

    // Max-min fair: the second reports 20/s (24 with headroom); the first
    // keeps wanting more and is given the other 76.
    second
        .send("edge", vec![usage(&api, 100, 0, Duration::from_secs(5))])
        .await;
    let told = second.until(&api, |_| true).await.told;
    assert_eq!(told.rate(), 24.0, "{told:?}");
    first
        .send("edge", vec![usage(&api, 250, 250, Duration::from_secs(5))])
        .await;
    let told = first.until(&api, |_| true).await.told;
    assert_eq!(told.rate(), 76.0, "{told:?}");

    // The second Envoy goes: the first is given everything, at once.
    drop(second);
    let told = first.until(&api, |told| told.rate() == 100.0).await.told;
    assert_eq!(told, ALL_OF_100);
    server.stop().await;
}

#[tokio::test]
async fn envoys_on_two_instances_share_one_rate_through_redis() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let one = server(dir.path(), &["--redis-url", &url]).await;
    let two = server(dir.path(), &["--redis-url", &url]).await;
    let api = bucket(&[("name", "api")]);
    let mut first = QuotaStream::open(one.address).await;
    let mut second = QuotaStream::open(two.address).await;
    first.subscribe("edge", &api).await;
    assert_eq!(first.next_one().await.told, ALL_OF_100);
    second.subscribe("edge", &api).await;
    assert_eq!(second.next_one().await.told, Told::DenyAll);
    // Across instances a share moves at the latest at the holder's next
    // report (tests/rlqs_instances.rs: sooner, when nudged).
    first
        .send("edge", vec![usage(&api, 500, 250, Duration::from_secs(5))])
        .await;
    assert_eq!(first.until(&api, |_| true).await.told, HALF_OF_100);
    second
        .send("edge", vec![usage(&api, 0, 750, Duration::from_secs(5))])
        .await;
    assert_eq!(second.until(&api, |_| true).await.told, HALF_OF_100);
    // The ledger is one hash with an expiry (beside the instances'
    // presence, tests/rlqs_instances.rs).
    let keys = redis.keys().await;
    assert!(
        keys.contains(&"ratelimitd:{rlq:edge|name=api}".to_owned()),
        "{keys:?}"
    );
    redis.assert_every_key_expires().await;
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn reports_over_the_size_bound_end_the_stream_out_of_range_and_warn_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path(), POLICIES);
    let server = ServerProcess::builder()
        .flags(&["--config", &config, "--max-request-bytes", "1024"])
        .logged()
        .start()
        .await;
    let long = "x".repeat(2000);
    let oversized = bucket(&[("name", long.as_str())]);
    for _ in 0..2 {
        let mut stream = QuotaStream::open(server.address).await;
        let api = bucket(&[("name", "api")]);
        stream.subscribe("edge", &api).await;
        assert_eq!(stream.next_one().await.told, ALL_OF_100);
        stream.subscribe("edge", &oversized).await;
        let status = stream
            .ending()
            .await
            .expect_err("the stream ends with an error, not OK");
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
        assert!(
            status
                .message()
                .contains("--max-request-bytes (1024 bytes)")
                && status.message().contains("found 20"),
            "the bound and the size named: {status:?}"
        );
    }
    let warning = "quota stream ended: usage reports over --max-request-bytes";
    common::eventually("the warning", || async { server.log().contains(warning) }).await;
    let log = server.log();
    assert_eq!(
        log.matches(warning).count(),
        1,
        "one warning per 10 s: {log}"
    );
    server.terminate().await;
}

#[tokio::test]
async fn bad_reports_are_ignored_and_counted_while_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let server = server_with_metrics(
        dir.path(),
        metrics_port,
        &[
            "--quota-max-buckets-per-stream",
            "2",
            "--max-descriptor-entries",
            "3",
            "--quota-assignment-ttl",
            "60s",
        ],
    )
    .await;
    let mut stream = QuotaStream::open(server.address).await;
    let api = bucket(&[("name", "api")]);
    // No domain yet: nothing can be assigned.
    stream
        .send("", vec![usage(&api, 1, 0, Duration::ZERO)])
        .await;
    // An empty BucketId, an empty value, too many pairs, absurd counts.
    let too_big = bucket(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]);
    stream
        .send(
            "edge",
            vec![
                usage(&bucket(&[]), 1, 0, Duration::ZERO),
                usage(&bucket(&[("name", "")]), 1, 0, Duration::ZERO),
                usage(&too_big, 1, 0, Duration::ZERO),
                usage(&api, u64::MAX, u64::MAX, Duration::from_secs(5)),
            ],
        )
        .await;
    let actions = stream.next().await;
    assert_eq!(actions.len(), 1, "only the good bucket: {actions:?}");
    assert_eq!((&actions[0].bucket, &actions[0].told), (&api, &ALL_OF_100));
    // Another domain on the same stream is refused; a third bucket is one
    // too many; the first two still work.
    stream
        .send("other", vec![usage(&api, 1, 0, Duration::ZERO)])
        .await;
    let open = bucket(&[("name", "open")]);
    let closed = bucket(&[("name", "closed")]);
    stream
        .send(
            "edge",
            vec![
                usage(&open, 1, 0, Duration::ZERO),
                usage(&closed, 1, 0, Duration::ZERO),
            ],
        )
        .await;
    let actions = stream.next().await;
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(
        (&actions[0].bucket, &actions[0].told),
        (&open, &Told::AllowAll)
    );
    let ignored = |reason: &'static str| async move {
        let (_, series) = prometheus::scrape(metrics_port).await;
        prometheus::value(
            &series,
            "ratelimitd_quota_reports_ignored_total",
            &[("reason", reason)],
        )
    };
    common::eventually("the ignored reports to be counted", || async {
        ignored("no_domain").await == 1.0
            && ignored("empty_bucket_id").await == 2.0
            && ignored("bucket_id_too_large").await == 1.0
            && ignored("domain_changed").await == 1.0
            && ignored("too_many_buckets").await == 1.0
    })
    .await;
    // A domain without quota policies gets no assignment, on its own stream.
    let unknown = QuotaStream::open(server.address).await;
    unknown.subscribe("nowhere", &api).await;
    common::eventually("the unknown domain to be counted", || async {
        ignored("unknown_domain").await == 1.0
    })
    .await;
    // Both streams are still read.
    unknown.subscribe("nowhere", &api).await;
    common::eventually("the second unknown report to be counted", || async {
        ignored("unknown_domain").await == 2.0
    })
    .await;
    stream
        .send("edge", vec![usage(&bucket(&[]), 1, 0, Duration::ZERO)])
        .await;
    common::eventually("the last bad report to be counted", || async {
        ignored("empty_bucket_id").await == 3.0
    })
    .await;
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn a_silent_bucket_is_abandoned_and_its_share_freed() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &["--quota-subscriber-timeout", "1s"]).await;
    let api = bucket(&[("name", "api")]);
    let mut quiet = QuotaStream::open(server.address).await;
    quiet.subscribe("edge", &api).await;
    assert_eq!(quiet.next_one().await.told, ALL_OF_100);
    let mut busy = QuotaStream::open(server.address).await;
    busy.subscribe("edge", &api).await;
    let _ = busy.until(&api, |told| *told == HALF_OF_100).await;
    let quiet_action = quiet.until(&api, |told| *told == Told::Abandon).await;
    assert_eq!(quiet_action.ttl_seconds, None);
    // The busy one keeps reporting and is given everything once the quiet
    // one is gone.
    let mut told = Told::DenyAll;
    for _ in 0..20 {
        busy.send("edge", vec![usage(&api, 60, 60, Duration::from_secs(1))])
            .await;
        if let Some(action) = busy.next().await.into_iter().find(|a| a.bucket == api) {
            told = action.told;
        }
        if told == ALL_OF_100 {
            break;
        }
    }
    assert_eq!(told, ALL_OF_100);
    server.stop().await;
}

#[tokio::test]
async fn a_reload_reaches_the_next_report() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &["--config-poll-interval", "100ms"]).await;
    let api = bucket(&[("name", "api")]);
    let mut stream = QuotaStream::open(server.address).await;
    stream.subscribe("edge", &api).await;
    assert_eq!(stream.next_one().await.told, ALL_OF_100);
    write_policies(
        dir.path(),
        &POLICIES.replace("requests_per_unit: 100}", "requests_per_unit: 50}"),
    );
    // Each report (of more than the rate) settles on the policy in force:
    // once the reload is in, the next one brings the new rate.
    let mut told = ALL_OF_100;
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while told != HALF_OF_100 {
        assert!(tokio::time::Instant::now() < deadline, "still {told:?}");
        stream
            .send("edge", vec![usage(&api, 1000, 0, Duration::from_secs(5))])
            .await;
        if let Some(actions) = stream.next_within(Duration::from_millis(200)).await {
            told = actions[0].told.clone();
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn redis_down_gets_the_failure_policy() {
    let mut redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let open = server(
        dir.path(),
        &["--redis-url", &url, "--failure-policy", "fail-open"],
    )
    .await;
    let local = server(
        dir.path(),
        &["--redis-url", &url, "--failure-policy", "local"],
    )
    .await;
    let closed = server(
        dir.path(),
        &["--redis-url", &url, "--failure-policy", "fail-closed"],
    )
    .await;
    redis.kill();
    let api = bucket(&[("name", "api")]);
    let mut on_open = QuotaStream::open(open.address).await;
    on_open.subscribe("edge", &api).await;
    assert_eq!(on_open.next_one().await.told, Told::AllowAll);
    let mut on_local = QuotaStream::open(local.address).await;
    on_local.subscribe("edge", &api).await;
    assert_eq!(on_local.next_one().await.told, ALL_OF_100);
    // Closed: nothing is assigned (the Envoy's own fallbacks decide); an
    // unlimited bucket needs no store and is still answered.
    let mut on_closed = QuotaStream::open(closed.address).await;
    on_closed.subscribe("edge", &api).await;
    let open_bucket = bucket(&[("name", "open")]);
    on_closed.subscribe("edge", &open_bucket).await;
    let action = on_closed.next_one().await;
    assert_eq!((action.bucket, action.told), (open_bucket, Told::AllowAll));
    open.stop().await;
    local.stop().await;
    closed.stop().await;
}

#[tokio::test]
async fn shutting_down_ends_the_streams() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &[]).await;
    let mut stream = QuotaStream::open(server.address).await;
    stream.subscribe("edge", &bucket(&[("name", "api")])).await;
    assert_eq!(stream.next_one().await.told, ALL_OF_100);
    let stopped = tokio::spawn(server.stop());
    assert!(stream.ends().await, "the stream ends at shutdown");
    tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("the server stops without waiting out its grace")
        .unwrap();
}

#[tokio::test]
async fn metrics_count_per_policy_never_per_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let server = server_with_metrics(dir.path(), metrics_port, &[]).await;
    let mut first = QuotaStream::open(server.address).await;
    let mut second = QuotaStream::open(server.address).await;
    // Two buckets of the default policy, one of `api` on two streams.
    let api = bucket(&[("name", "api")]);
    first.subscribe("edge", &api).await;
    assert_eq!(first.next_one().await.told, ALL_OF_100);
    second.subscribe("edge", &api).await;
    let _ = second.until(&api, |told| *told == HALF_OF_100).await;
    for user in ["user-1", "user-2"] {
        first
            .send(
                "edge",
                vec![usage(&bucket(&[("name", user)]), 7, 3, Duration::ZERO)],
            )
            .await;
        let _ = first.next().await;
    }
    let series = || async move { prometheus::scrape(metrics_port).await };
    common::eventually("the per-policy series", || async {
        let (_, series) = series().await;
        let api = [("domain", "edge"), ("policy", "name=api")];
        let default = [("domain", "edge"), ("policy", "default")];
        prometheus::value(&series, "ratelimitd_quota_subscribers", &api) == 2.0
            && prometheus::value(&series, "ratelimitd_quota_subscribers", &default) == 2.0
            && prometheus::value(
                &series,
                "ratelimitd_quota_assigned_requests_per_second",
                &api,
            ) == 100.0
            && prometheus::value(
                &series,
                "ratelimitd_quota_reported_requests_total",
                &[("policy", "default"), ("outcome", "denied")],
            ) == 6.0
    })
    .await;
    let (text, _) = series().await;
    assert!(
        !text.contains("user-1"),
        "a bucket's value is never a label"
    );
    // A stream gone takes its subscribers and rates with it.
    drop(second);
    common::eventually("the second stream's series to go", || async {
        let (_, series) = series().await;
        let api = [("domain", "edge"), ("policy", "name=api")];
        prometheus::value(&series, "ratelimitd_quota_subscribers", &api) == 1.0
            && prometheus::value(
                &series,
                "ratelimitd_quota_assigned_requests_per_second",
                &api,
            ) == 100.0
    })
    .await;
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn a_flood_of_distinct_buckets_stops_at_the_bounds_and_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let server = server_with_metrics(
        dir.path(),
        metrics_port,
        &[
            "--quota-max-buckets-per-stream",
            "3000",
            "--quota-max-buckets",
            "3500",
            "--quota-assignment-ttl",
            "60s",
        ],
    )
    .await;
    let mut stream = QuotaStream::open(server.address).await;
    let mut assigned = 0;
    for batch in 0..5 {
        let usages = (0..1000)
            .map(|i| {
                let user = format!("user-{}", batch * 1000 + i);
                usage(&bucket(&[("name", &user)]), 1, 0, Duration::ZERO)
            })
            .collect();
        let sent = std::time::Instant::now();
        stream.send("edge", usages).await;
        if batch < 3 {
            assigned += stream.next().await.len();
            eprintln!("batch {batch}: answered in {:?}", sent.elapsed());
        }
    }
    assert_eq!(assigned, 3000);
    common::eventually("the buckets past the bound to be counted", || async {
        let (_, series) = prometheus::scrape(metrics_port).await;
        prometheus::value(
            &series,
            "ratelimitd_quota_reports_ignored_total",
            &[("reason", "too_many_buckets")],
        ) == 2000.0
    })
    .await;
    // The stream still answers for the buckets it holds: another Envoy
    // takes half of one, and this one is told its half.
    let first = bucket(&[("name", "user-0")]);
    let mut other = QuotaStream::open(server.address).await;
    other.subscribe("edge", &first).await;
    let half = Told::TokenBucket(25, 300, 60);
    let _ = other.until(&first, |told| *told == half).await;
    let _ = stream.until(&first, |told| *told == half).await;
    // The instance holds at most 3500 in all: another stream gets the 499
    // left.
    let usages = (0..1000)
        .map(|i| {
            usage(
                &bucket(&[("name", &format!("other-{i}"))]),
                1,
                0,
                Duration::ZERO,
            )
        })
        .collect();
    other.send("edge", usages).await;
    assert_eq!(other.next().await.len(), 499);
    common::eventually(
        "the buckets past the instance's bound to be counted",
        || async {
            let (_, series) = prometheus::scrape(metrics_port).await;
            prometheus::value(
                &series,
                "ratelimitd_quota_reports_ignored_total",
                &[("reason", "too_many_buckets")],
            ) == 2501.0
        },
    )
    .await;
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn shares_the_failure_policy_answered_are_counted() {
    let mut redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let url = redis.url();
    let server = server_with_metrics(
        dir.path(),
        metrics_port,
        &["--redis-url", &url, "--failure-policy", "local"],
    )
    .await;
    redis.kill();
    let api = bucket(&[("name", "api")]);
    let mut stream = QuotaStream::open(server.address).await;
    stream.subscribe("edge", &api).await;
    assert_eq!(stream.next_one().await.told, ALL_OF_100);
    common::eventually("the degraded share to be counted", || async {
        let (_, series) = prometheus::scrape(metrics_port).await;
        prometheus::value(
            &series,
            "ratelimitd_quota_degraded_total",
            &[("domain", "edge"), ("policy", "name=api")],
        ) >= 1.0
    })
    .await;
    assert!(server.terminate().await.success());
}
