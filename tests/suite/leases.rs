//! Leases over `ratelimitd.v1.Leases/Lease`, asked by a plain gRPC client:
//! only policies whose limits all say `lease: true` are leased; a lease's
//! units are spent in the store before they are handed out, so however
//! many streams on however many instances lease a limit, it never grants
//! more than the limit allows; a bucket and a window take back what a
//! release returns; grants shrink to single units as a limit runs out,
//! leaving the last units to every client; shares follow demand across
//! instances; the lease metrics count what was leased, renewed, returned
//! and lapsed; and bad asks,
//! oversize messages, floods of leases and of streams, and a store that is gone are
//! refused or bounded.

use crate::common;

use std::time::{Duration, Instant};

use common::leases::{LeaseStream, ask};
use common::{RedisServer, ServerProcess, TestServer, free_port, prometheus};
use ratelimitd::pb::ratelimitd::v1 as pb;
use tonic::Code;

const POLICIES: &str = "\
policies:
  window:
    - {per: 1m, limit: 500, lease: true}
  bucket:
    - {per: 1m, limit: 100, algorithm: token_bucket, lease: true, lease_max_duration: 10s}
  shared:
    - {per: 1s, limit: 1000, algorithm: gcra, scope: policy, lease: true}
  mixed:
    - {per: 1m, limit: 100, lease: true}
    - {name: hourly, per: 1h, limit: 1000}
  plain:
    - {per: 1m, limit: 100}
  draining:
    - {per: 1m, limit: 6000, scope: policy, lease: true, lease_max_duration: 1s}
";

fn config_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("config directory");
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).expect("write");
    let path = dir.path().to_string_lossy().into_owned();
    (dir, path)
}

fn seconds(duration: Option<prost_types::Duration>) -> f64 {
    let duration = duration.expect("a duration");
    duration.seconds as f64 + f64::from(duration.nanos) / 1e9
}

fn refusal(grant: &pb::LeaseGrant) -> (Code, &str) {
    let error = grant
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("refused: {grant:?}"));
    (Code::from_i32(error.code), error.message.as_str())
}

async fn check(server: &TestServer, policy: &str, key: &str) -> pb::CheckLimitResponse {
    server
        .client()
        .await
        .check_limit(pb::CheckLimitRequest {
            key: key.into(),
            policy: policy.into(),
            ..Default::default()
        })
        .await
        .expect("CheckLimit answers")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_policy_whose_limits_are_all_leasable_is_leased() {
    let (_dir, path) = config_dir();
    let server = TestServer::start(&["--config", &path]).await;
    let mut stream = LeaseStream::open(server.address).await;
    let grants = stream
        .exchange(vec![
            ask("mixed", "k"),
            ask("plain", "k"),
            ask("nowhere", "k"),
            ask("window", ""),
            pb::LeaseAsk {
                demand: f64::NAN,
                ..ask("window", "k")
            },
            ask("window", "k"),
        ])
        .await
        .expect("grants");
    let (code, message) = refusal(&grants[0]);
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        message.contains("policy")
            && message.contains("'mixed' has limit 'hourly' without `lease: true`"),
        "{message}"
    );
    let (code, message) = refusal(&grants[1]);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("'plain' has limit '1m'"), "{message}");
    let (code, message) = refusal(&grants[2]);
    assert_eq!(code, Code::NotFound);
    assert!(message.contains("'nowhere'"), "{message}");
    let (code, message) = refusal(&grants[3]);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.starts_with("key"), "{message}");
    let (code, message) = refusal(&grants[4]);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.starts_with("demand"), "{message}");
    // The bad asks beside it did not stop the good one.
    let good = &grants[5];
    assert!(good.error.is_none(), "{good:?}");
    assert!(good.units > 0, "{good:?}");
    server.stop().await;
}

/// One client alone on a window of 500 a minute drains it in leases, as
/// CheckLimit would, and is then told to deny until the window ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_alone_leases_the_whole_window_and_no_more() {
    let redis = RedisServer::start().await;
    let (_dir, path) = config_dir();
    let server = TestServer::start(&["--config", &path, "--redis-url", &redis.url()]).await;
    let mut stream = LeaseStream::open(server.address).await;
    let started = Instant::now();
    let (mut granted, mut last) = (0, 0);
    let empty = loop {
        let grant = stream
            .ask(pb::LeaseAsk {
                demand: 1000.0,
                admitted: last,
                ..ask("window", "tenant")
            })
            .await;
        assert!(grant.error.is_none(), "{grant:?}");
        if grant.units == 0 {
            break grant;
        }
        assert!(seconds(grant.valid_for) <= 5.0, "{grant:?}");
        assert_eq!(
            grant.limits[0].remaining,
            500 - granted - grant.units,
            "{grant:?}"
        );
        granted += grant.units;
        last = grant.units;
    };
    assert_eq!(granted, 500, "every unit leased, none twice");
    let retry_after = seconds(empty.retry_after);
    assert!(
        retry_after > 0.0 && retry_after <= 60.0 - started.elapsed().as_secs_f64() + 1.0,
        "deny until the window ends: {empty:?}"
    );
    let after = check(&server, "window", "tenant").await;
    assert!(!after.allowed && after.remaining == 0, "{after:?}");
    server.stop().await;
}

/// Eight streams on two instances sharing one Redis lease a window of 500
/// a minute while CheckLimit spends it too: every unit is spent once, by
/// a lease or a call, and what Redis has left is exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_calls_on_two_instances_spend_each_unit_once() {
    let redis = RedisServer::start().await;
    let (_dir, path) = config_dir();
    let url = redis.url();
    let flags = ["--config", path.as_str(), "--redis-url", url.as_str()];
    let servers = [
        TestServer::start(&flags).await,
        TestServer::start(&flags).await,
    ];
    let mut streams = Vec::new();
    for i in 0..8 {
        streams.push(LeaseStream::open(servers[i % 2].address).await);
    }
    let until = Instant::now() + Duration::from_secs(2);
    let leasing = streams.into_iter().map(|mut stream| async move {
        let (mut granted, mut last) = (0, 0);
        while Instant::now() < until {
            let grant = stream
                .ask(pb::LeaseAsk {
                    demand: 200.0,
                    admitted: last,
                    ..ask("window", "tenant")
                })
                .await;
            assert!(grant.error.is_none(), "{grant:?}");
            granted += grant.units;
            last = grant.units;
            if grant.units == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        granted
    });
    let mut caller = servers[1].client().await;
    let calling = async move {
        let mut allowed = 0;
        while Instant::now() < until {
            let answer = caller
                .check_limit(pb::CheckLimitRequest {
                    key: "tenant".into(),
                    policy: "window".into(),
                    ..Default::default()
                })
                .await
                .expect("CheckLimit answers")
                .into_inner();
            allowed += u64::from(answer.allowed);
        }
        allowed
    };
    let (leased, called) = tokio::join!(futures::future::join_all(leasing), calling);
    let leased: u64 = leased.iter().sum();
    let last = check(&servers[0], "window", "tenant").await;
    let spent = leased + called + u64::from(last.allowed);
    assert!(
        leased > 0 && called > 0,
        "both spent: {leased} leased, {called} called"
    );
    assert_eq!(
        spent,
        500 - last.remaining,
        "{leased} leased and {called} called: each unit spent once"
    );
    for server in servers {
        server.stop().await;
    }
}

/// A token bucket and a fixed window take back what a release returns (at
/// most what was granted and not reported spent), on Redis and on the
/// embedded store, and the release leaves nothing leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_and_a_window_take_back_what_a_release_returns() {
    let redis = RedisServer::start().await;
    let (_dir, path) = config_dir();
    let on_redis = ["--config", &path, "--redis-url", &redis.url()];
    for server in [
        TestServer::start(&on_redis).await,
        TestServer::start(&["--config", &path]).await,
    ] {
        a_release_is_taken_back(&server, "bucket", 100).await;
        a_release_is_taken_back(&server, "window", 500).await;
        server.stop().await;
    }
}

/// A lease of `policy` (one limit of `limit`), 10 of its units spent and
/// the rest released: only those 10 and two checks stay spent (a bucket
/// may refill a unit or two meanwhile).
async fn a_release_is_taken_back(server: &TestServer, policy: &str, limit: u64) {
    let mut stream = LeaseStream::open(server.address).await;
    let grant = stream.ask(ask(policy, "k")).await;
    let units = grant.units;
    assert!(units >= 10, "{policy}: {grant:?}");
    let after_lease = check(server, policy, "k").await;
    assert!(
        after_lease.remaining <= limit - units - 1 + 1,
        "{policy}: {after_lease:?}"
    );
    // It spent 10, gives the rest back, and claims far more: only what it
    // was granted and did not spend comes back.
    let released = stream
        .ask(pb::LeaseAsk {
            release: true,
            admitted: 10,
            held: 10_000,
            ..ask(policy, "k")
        })
        .await;
    assert!(
        released.error.is_none() && released.units == 0,
        "{policy}: {released:?}"
    );
    let after_release = check(server, policy, "k").await;
    let expected = limit - 10 - 1 - 1;
    assert!(
        after_release.remaining >= expected && after_release.remaining <= expected + 2,
        "{policy}: {units} leased, 10 spent, the rest returned: {after_release:?}"
    );
}

/// What one grant took: the client's index, its units, and what the limit
/// had left before it (what the grant says is left, and its units).
#[derive(Debug, Clone, Copy)]
struct Took {
    client: usize,
    units: u64,
    left: u64,
}

/// Two clients lease one window, each held to its share (half of 100 a
/// second, in leases of a second: 50 units); then a CheckLimit caller
/// spends the window down to 60 units, not much over a lease. From there
/// each grant takes at most half of what is left: the grants halve down to
/// single units, both clients get units to the very end, and together they
/// take exactly the 60, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_shrink_to_single_units_as_a_window_runs_out() {
    let redis = RedisServer::start().await;
    let (_dir, path) = config_dir();
    let server = TestServer::start(&[
        "--config",
        &path,
        "--redis-url",
        &redis.url(),
        "--lease-settle-interval",
        "100ms",
    ])
    .await;
    let mut streams = [
        LeaseStream::open(server.address).await,
        LeaseStream::open(server.address).await,
    ];
    let greedy = || pb::LeaseAsk {
        demand: 1000.0,
        ..ask("draining", "any")
    };
    // Shares settled: each client has had a grant of over a third of its
    // lease (its share is half of 100/s, for a second).
    let deadline = Instant::now() + common::PATIENCE;
    let mut settled = [false; 2];
    while settled != [true; 2] {
        assert!(Instant::now() < deadline, "shares never settled");
        for (stream, settled) in streams.iter_mut().zip(&mut settled) {
            let grant = stream.ask(greedy()).await;
            assert!(grant.error.is_none(), "{grant:?}");
            *settled |= grant.units >= 20;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Each says it holds a whole lease while its allowance fills up again
    // (its share accrues a lease's worth in a lease's time, a second), so
    // that both start the end of the window able to take a lease.
    let full = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < full {
        for stream in &mut streams {
            let grant = stream
                .ask(pb::LeaseAsk {
                    held: 1000,
                    ..greedy()
                })
                .await;
            assert!(grant.error.is_none() && grant.units == 0, "{grant:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = check(&server, "draining", "any").await.remaining;
    let drained = server
        .client()
        .await
        .check_limit(pb::CheckLimitRequest {
            key: "any".into(),
            policy: "draining".into(),
            cost: Some(left - 60),
            ..Default::default()
        })
        .await
        .expect("CheckLimit answers")
        .into_inner();
    assert!(drained.allowed && drained.remaining == 60, "{drained:?}");

    let mut took: Vec<Took> = Vec::new();
    let mut empty = [false; 2];
    while empty != [true; 2] {
        assert!(Instant::now() < deadline, "not drained: {took:?}");
        for (client, stream) in streams.iter_mut().enumerate() {
            let grant = stream.ask(greedy()).await;
            assert!(grant.error.is_none(), "{grant:?}");
            let Some(after) = grant.limits.first() else {
                // Held to its share for a moment: nothing was spent.
                continue;
            };
            empty[client] = grant.units == 0 && after.remaining == 0;
            if grant.units > 0 {
                took.push(Took {
                    client,
                    units: grant.units,
                    left: after.remaining + grant.units,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        took.iter().map(|t| t.units).sum::<u64>(),
        60,
        "the last 60 units leased, each once: {took:?}"
    );
    for t in &took {
        assert!(
            t.units <= (t.left / 2).max(1),
            "a grant took more than half of what was left: {took:?}"
        );
    }
    let last = took.last().expect("grants");
    assert_eq!(
        (last.units, last.left),
        (1, 1),
        "the last unit alone: {took:?}"
    );
    for client in 0..2 {
        assert!(
            took.iter().any(|t| t.client == client && t.left <= 8),
            "client {client} got none of the last 8 units: {took:?}"
        );
    }
    let after = check(&server, "draining", "any").await;
    assert!(!after.allowed && after.remaining == 0, "{after:?}");
    server.stop().await;
}

/// The lease series of a scrape of `port`, for the `window` policy.
async fn lease_metrics(port: u16) -> [u64; 6] {
    let (_, series) = prometheus::scrape(port).await;
    let window = [("policy", "window")];
    let units = |outcome| {
        prometheus::value(
            &series,
            "ratelimitd_lease_units_total",
            &[("policy", "window"), ("outcome", outcome)],
        ) as u64
    };
    [
        prometheus::value(&series, "ratelimitd_lease_streams", &[]) as u64,
        prometheus::value(&series, "ratelimitd_leases_held", &window) as u64,
        units("leased"),
        units("returned"),
        units("lapsed"),
        prometheus::value(&series, "ratelimitd_lease_renewals_total", &window) as u64,
    ]
}

/// A lease granted, renewed with a report and released, and another one
/// whose stream ends while it holds units: the server's lease metrics say
/// exactly what was leased, renewed, returned and lapsed, what the client
/// reported deciding, and how many streams and leases are open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_metrics_count_grants_renewals_releases_and_lapses() {
    let (_dir, path) = config_dir();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = ServerProcess::builder()
        .flags(&["--config", &path, "--metrics-listen", &listen])
        .start()
        .await;
    let mut stream = LeaseStream::open(server.address).await;
    let first = stream.ask(ask("window", "k")).await.units;
    assert!(first > 10, "{first}");
    // It spent 10 and renews: topped up by what it spent.
    let second = stream
        .ask(pb::LeaseAsk {
            admitted: 10,
            held: first - 10,
            ..ask("window", "k")
        })
        .await
        .units;
    let leased = first + second;
    let [streams, held, units, returned, lapsed, renewals] = lease_metrics(port).await;
    assert_eq!(
        (streams, held, units, returned, lapsed, renewals),
        (1, 1, leased, 0, 0, 1),
        "one stream holding one lease of {first} and {second} units, renewed once"
    );
    // It spent 5 more and releases the rest.
    let released = stream
        .ask(pb::LeaseAsk {
            release: true,
            admitted: 5,
            denied: 2,
            held: leased - 15,
            ..ask("window", "k")
        })
        .await;
    assert!(released.error.is_none(), "{released:?}");
    let [_, held, units, returned, lapsed, renewals] = lease_metrics(port).await;
    assert_eq!(
        (held, units, returned, lapsed, renewals),
        (0, leased, leased - 15, 0, 1),
        "released: the {} units not spent returned",
        leased - 15
    );
    let (_, series) = prometheus::scrape(port).await;
    let decided = |outcome| {
        prometheus::value(
            &series,
            "ratelimitd_lease_client_decisions_total",
            &[("policy", "window"), ("outcome", outcome)],
        ) as u64
    };
    assert_eq!((decided("allowed"), decided("denied")), (15, 2));

    // A stream that ends holding a lease: its units lapse, unreported.
    let mut other = LeaseStream::open(server.address).await;
    let kept = other.ask(ask("window", "other")).await.units;
    assert!(kept > 0);
    drop(other);
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let [streams, held, units, returned, lapsed, _] = lease_metrics(port).await;
        if (streams, held) == (1, 0) {
            assert_eq!(
                (units, returned, lapsed),
                (leased + kept, leased - 15, kept),
                "the ended stream's {kept} units lapsed"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ended stream's lease never let go"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(stream);
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reports_more_than_it_was_granted_is_refused() {
    let (_dir, path) = config_dir();
    let server = TestServer::start(&["--config", &path]).await;
    let mut stream = LeaseStream::open(server.address).await;
    let grant = stream.ask(ask("window", "k")).await;
    let refused = stream
        .ask(pb::LeaseAsk {
            admitted: grant.units + 1,
            ..ask("window", "k")
        })
        .await;
    let (code, message) = refusal(&refused);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.starts_with("admitted"), "{message}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_are_bounded_and_oversize_messages_end_the_stream() {
    let (_dir, path) = config_dir();
    let server = TestServer::start(&[
        "--config",
        &path,
        "--lease-max",
        "3",
        "--lease-max-per-stream",
        "2",
        "--max-request-bytes",
        "4096",
    ])
    .await;
    let mut first = LeaseStream::open(server.address).await;
    let grants = first
        .exchange(vec![
            ask("window", "a"),
            ask("window", "b"),
            ask("window", "c"),
        ])
        .await
        .expect("grants");
    assert!(
        grants[0].error.is_none() && grants[1].error.is_none(),
        "{grants:?}"
    );
    let (code, message) = refusal(&grants[2]);
    assert_eq!(code, Code::ResourceExhausted);
    assert!(message.contains("--lease-max-per-stream"), "{message}");
    let mut second = LeaseStream::open(server.address).await;
    let grants = second
        .exchange(vec![ask("window", "d"), ask("window", "e")])
        .await
        .expect("grants");
    assert!(grants[0].error.is_none(), "{grants:?}");
    let (code, message) = refusal(&grants[1]);
    assert_eq!(code, Code::ResourceExhausted);
    assert!(message.contains("--lease-max"), "{message}");
    // A stream that ends gives its leases back to the server's bound.
    drop(first);
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let grant = second.ask(ask("window", "f")).await;
        if grant.error.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ended stream's leases let go: {grant:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let huge = vec![ask(&"w".repeat(8192), "k")];
    let status = second.exchange(huge).await.expect_err("over the bound");
    assert_eq!(status.code(), Code::OutOfRange, "{status}");
    assert!(status.message().contains("--max-request-bytes"), "{status}");
    server.stop().await;
}

/// A flood of lease streams is held to the bounds every call has: on one
/// connection at most `--max-concurrent-streams` at once, a further one
/// waiting for a place (and the connections from one address are capped by
/// `--max-connections-per-ip`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_beyond_a_connections_bound_waits_for_a_place() {
    let (_dir, path) = config_dir();
    let server = TestServer::start(&["--config", &path, "--max-concurrent-streams", "3"]).await;
    let channel = common::grpc::channel(server.address).await;
    let mut streams = Vec::new();
    for n in 0..3 {
        let mut stream = LeaseStream::on(channel.clone()).await;
        let grant = stream.ask(ask("window", &format!("flood-{n}"))).await;
        assert!(grant.error.is_none(), "{grant:?}");
        streams.push(stream);
    }
    let fourth = tokio::spawn(async move {
        let mut stream = LeaseStream::on(channel).await;
        stream.ask(ask("window", "flood-3")).await
    });
    // Nothing to await for something that must not happen: a while in
    // which a fourth stream beside three would have been answered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !fourth.is_finished(),
        "a fourth stream on the connection was served beside three"
    );
    drop(streams.pop());
    let grant = tokio::time::timeout(common::PATIENCE, fourth)
        .await
        .expect("served once a place is free")
        .expect("the stream's task");
    assert!(grant.error.is_none(), "{grant:?}");
    server.stop().await;
}

/// Two instances on one Redis, settling shares every tenth of a second:
/// the Redis and the configuration live as long as they are kept.
async fn two_instances_settling_quickly() -> (RedisServer, tempfile::TempDir, [TestServer; 2]) {
    let redis = RedisServer::start().await;
    let (dir, path) = config_dir();
    let url = redis.url();
    let flags = [
        "--config",
        path.as_str(),
        "--redis-url",
        url.as_str(),
        "--lease-settle-interval",
        "100ms",
    ];
    let servers = [
        TestServer::start(&flags).await,
        TestServer::start(&flags).await,
    ];
    (redis, dir, servers)
}

/// Two clients lease one policy-wide limit of 1000 a second from two
/// instances, each spending what it holds at its own demand: the one that
/// wants 100 a second gets about that, the one that wants 3000 gets the
/// rest, and together they never get more than the limit allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_follow_demand_across_instances() {
    let (_redis, _dir, servers) = two_instances_settling_quickly().await;
    let clients =
        [(3000.0, &servers[0]), (100.0, &servers[1])].map(|(demand, server)| async move {
            let mut stream = LeaseStream::open(server.address).await;
            let started = Instant::now();
            let (mut held, mut spent, mut measured) = (0u64, 0u64, 0u64);
            let (mut last, mut wanted) = (started, 0.0);
            while started.elapsed() < Duration::from_secs(3) {
                tokio::time::sleep(Duration::from_millis(25)).await;
                let now = Instant::now();
                // What its demand asked since, with what it could not
                // admit last time (a few ticks' worth at most).
                wanted = (wanted + demand * (now - last).as_secs_f64()).min(demand * 0.1);
                last = now;
                let admitted = (wanted as u64).min(held);
                wanted -= admitted as f64;
                held -= admitted;
                spent += admitted;
                if started.elapsed() > Duration::from_secs(1) {
                    measured += admitted;
                }
                let grant = stream
                    .ask(pb::LeaseAsk {
                        demand,
                        held,
                        admitted,
                        ..ask("shared", "any")
                    })
                    .await;
                assert!(grant.error.is_none(), "{grant:?}");
                held += grant.units;
            }
            (spent + held, measured as f64 / 2.0)
        });
    let results = futures::future::join_all(clients).await;
    let [(busy_granted, busy_rate), (quiet_granted, quiet_rate)] = results[..] else {
        panic!("two clients: {results:?}")
    };
    assert!(
        (75.0..=130.0).contains(&quiet_rate),
        "the quiet client spends about its demand: {quiet_rate}/s"
    );
    assert!(
        busy_rate >= 600.0,
        "the busy client gets most of the rest: {busy_rate}/s"
    );
    // GCRA's burst (1000) and its rate over the run, and a little for
    // the time the streams took to open.
    let granted = busy_granted + quiet_granted;
    assert!(granted <= 1000 + 3100, "{granted} granted in 3 s");
    for server in servers {
        server.stop().await;
    }
}

/// Four clients on two instances lease one policy-wide limit of 1000 a
/// second (leases of half a second), each spending what it holds at its
/// own demand, 1450 a second in all. Once their shares have settled, the
/// units they hold at once, unspent, never pass the limit's rate times a
/// lease's time: 500, half the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_held_at_once_stay_within_the_rate_times_a_lease() {
    let (_redis, _dir, servers) = two_instances_settling_quickly().await;
    let held = std::sync::Mutex::new(([0u64; 4], 0u64));
    let started = Instant::now();
    let settled = Duration::from_millis(1500);
    let clients = [600.0, 400.0, 300.0, 150.0]
        .into_iter()
        .enumerate()
        .map(|(client, demand)| {
            let (server, held) = (&servers[client % 2], &held);
            async move {
                let mut stream = LeaseStream::open(server.address).await;
                // Units held, as (valid until, units), oldest first.
                let mut tranches: std::collections::VecDeque<(Instant, u64)> = Default::default();
                let (mut last, mut wanted) = (Instant::now(), 0.0);
                while started.elapsed() < settled + Duration::from_secs(2) {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                    let now = Instant::now();
                    tranches.retain(|(until, _)| *until > now);
                    wanted = (wanted + demand * (now - last).as_secs_f64()).min(demand * 0.1);
                    last = now;
                    let mut admitted = 0;
                    while let Some((_, units)) = tranches.front_mut() {
                        let take = (*units).min(wanted as u64 - admitted);
                        *units -= take;
                        admitted += take;
                        if *units > 0 {
                            break;
                        }
                        tranches.pop_front();
                    }
                    wanted -= admitted as f64;
                    let holding: u64 = tranches.iter().map(|(_, units)| units).sum();
                    let sent = Instant::now();
                    let grant = stream
                        .ask(pb::LeaseAsk {
                            demand,
                            held: holding,
                            admitted,
                            ..ask("shared", "any")
                        })
                        .await;
                    assert!(grant.error.is_none(), "{grant:?}");
                    if grant.units > 0 {
                        let valid_for = Duration::from_secs_f64(seconds(grant.valid_for));
                        tranches.push_back((sent + valid_for, grant.units));
                    }
                    let mut held = held.lock().expect("the tally");
                    held.0[client] = holding + grant.units;
                    if started.elapsed() > settled {
                        held.1 = held.1.max(held.0.iter().sum());
                    }
                }
            }
        });
    futures::future::join_all(clients).await;
    let most = held.lock().expect("the tally").1;
    assert!(
        most <= 500,
        "{most} units held at once, over the rate times a lease"
    );
    assert!(
        most >= 100,
        "the clients held leases: at most {most} at once"
    );
    for server in servers {
        server.stop().await;
    }
}

/// With Redis gone, an ask is answered UNAVAILABLE within the Redis
/// timeout (100 ms by default), and nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_an_ask_is_unavailable() {
    let mut redis = RedisServer::start().await;
    let (_dir, path) = config_dir();
    let server = TestServer::start(&["--config", &path, "--redis-url", &redis.url()]).await;
    let mut stream = LeaseStream::open(server.address).await;
    let grant = stream.ask(ask("window", "k")).await;
    assert!(grant.units > 0, "{grant:?}");
    redis.kill();
    let asked = Instant::now();
    let grant = stream.ask(ask("window", "other")).await;
    let (code, _) = refusal(&grant);
    assert_eq!(code, Code::Unavailable, "{grant:?}");
    assert_eq!(grant.units, 0);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    server.stop().await;
}
