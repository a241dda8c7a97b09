//! The Envoy face over gRPC, without Envoy: envoyproxy/ratelimit's README
//! examples (ported as fixtures in tests/fixtures/ratelimit) give the
//! answers upstream documents, and the protocol details hold (hits, limit
//! overrides, shadow mode, headers, all-or-nothing across descriptors), and
//! so do our extensions to the files (algorithms, `unit_multiplier`,
//! `count_denied_hits`, several limits on one descriptor).
//!
//! Per-second and per-minute windows are aligned to the clock, as upstream;
//! assertions that need several units spent do it in one request (with
//! `hits_addend`) so that a window boundary cannot fall between two calls.

use crate::common;

use common::rls::{descriptor, with_hits};
use common::{RedisServer, TestServer};
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Code as GrpcCode;
use tonic::transport::Channel;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ratelimit");

type Client = RateLimitServiceClient<Channel>;

async fn start(extra: &[&str]) -> (TestServer, Client) {
    let mut flags = vec!["--config", FIXTURES];
    flags.extend_from_slice(extra);
    let server = TestServer::start(&flags).await;
    let client = RateLimitServiceClient::new(common::channel(server.address).await);
    (server, client)
}

async fn ask(
    client: &mut Client,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .unwrap_or_else(|status| panic!("ShouldRateLimit({domain}) failed: {status}"))
        .into_inner()
}

/// One descriptor's status.
async fn one(
    client: &mut Client,
    domain: &str,
    descriptor: RateLimitDescriptor,
) -> DescriptorStatus {
    let mut response = ask(client, domain, vec![descriptor]).await;
    assert_eq!(response.statuses.len(), 1);
    response.statuses.remove(0)
}

/// (code, requests_per_unit, unit, remaining) of a status with a limit.
fn limited(status: &DescriptorStatus) -> (Code, u32, Unit, u32) {
    let limit = status
        .current_limit
        .as_ref()
        .unwrap_or_else(|| panic!("no current_limit in {status:?}"));
    (
        status.code(),
        limit.requests_per_unit,
        limit.unit(),
        status.limit_remaining,
    )
}

fn unlimited(status: &DescriptorStatus) -> bool {
    status.code() == Code::Ok && status.current_limit.is_none()
}

#[tokio::test]
async fn example_1_limits_per_value() {
    let (server, mut client) = start(&[]).await;
    let users = one(
        &mut client,
        "mongo_cps",
        descriptor(&[("database", "users")]),
    )
    .await;
    assert_eq!(limited(&users), (Code::Ok, 500, Unit::Second, 499));
    let default = one(
        &mut client,
        "mongo_cps",
        descriptor(&[("database", "default")]),
    )
    .await;
    assert_eq!(limited(&default), (Code::Ok, 500, Unit::Second, 499));
    assert!(unlimited(
        &one(
            &mut client,
            "mongo_cps",
            descriptor(&[("database", "other")])
        )
        .await
    ));
    server.stop().await;
}

#[tokio::test]
async fn example_2_nested_descriptors_and_placeholders() {
    let (server, mut client) = start(&[]).await;
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let status = one(&mut client, "messaging", descriptor(&marketing)).await;
    assert_eq!(limited(&status), (Code::Ok, 5, Unit::Day, 4));
    let other = [("message_type", "marketing"), ("to_number", "2062222222")];
    let status = one(&mut client, "messaging", descriptor(&other)).await;
    assert_eq!(
        limited(&status),
        (Code::Ok, 5, Unit::Day, 4),
        "a counter per number"
    );
    let status = one(
        &mut client,
        "messaging",
        descriptor(&[("to_number", "2061111111")]),
    )
    .await;
    assert_eq!(limited(&status), (Code::Ok, 100, Unit::Day, 99));
    let placeholder = one(
        &mut client,
        "messaging",
        descriptor(&[("message_type", "marketing")]),
    )
    .await;
    assert!(
        unlimited(&placeholder),
        "a node without rate_limit has no limit"
    );

    // Both in one request: either over denies the request ("logical OR").
    let response = ask(
        &mut client,
        "messaging",
        vec![
            with_hits(descriptor(&[("to_number", "2063333333")]), 6),
            with_hits(
                descriptor(&[("message_type", "marketing"), ("to_number", "2063333333")]),
                6,
            ),
        ],
    )
    .await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    assert_eq!(
        limited(&response.statuses[0]),
        (Code::Ok, 100, Unit::Day, 100)
    );
    assert_eq!(limited(&response.statuses[1]).0, Code::OverLimit);
    server.stop().await;
}

#[tokio::test]
async fn example_3_exact_value_beats_key_only_and_zero_blocks() {
    let (server, mut client) = start(&[]).await;
    let status = one(
        &mut client,
        "edge_proxy_per_ip",
        descriptor(&[("remote_address", "50.0.0.1")]),
    )
    .await;
    assert_eq!(limited(&status), (Code::Ok, 10, Unit::Second, 9));
    let response = ask(
        &mut client,
        "edge_proxy_per_ip",
        vec![
            descriptor(&[("remote_address", "50.0.0.5")]),
            descriptor(&[("remote_address", "50.0.0.7")]),
        ],
    )
    .await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    assert_eq!(
        limited(&response.statuses[0]),
        (Code::OverLimit, 0, Unit::Second, 0)
    );
    // Denied by the blocked address, the other descriptor spent nothing.
    assert_eq!(
        limited(&response.statuses[1]),
        (Code::Ok, 10, Unit::Second, 10)
    );
    server.stop().await;
}

#[tokio::test]
async fn example_4_a_rule_applies_only_at_the_request_depth() {
    let (server, mut client) = start(&[]).await;
    let two_levels = [("key", "value"), ("subkey", "subvalue")];
    assert!(unlimited(
        &one(&mut client, "example4a", descriptor(&two_levels)).await
    ));
    let status = one(&mut client, "example4b", descriptor(&two_levels)).await;
    assert_eq!(limited(&status), (Code::Ok, 300, Unit::Second, 299));
    assert!(unlimited(
        &one(&mut client, "example4b", descriptor(&[("key", "value")])).await
    ));
    server.stop().await;
}

#[tokio::test]
async fn example_5_unlimited_is_never_counted() {
    let (server, mut client) = start(&[]).await;
    let ldap = one(&mut client, "internal", descriptor(&[("ldap", "cn=x")])).await;
    assert_eq!(ldap.code(), Code::Ok);
    assert_eq!(ldap.current_limit, None);
    assert_eq!(ldap.limit_remaining, u32::MAX);
    let azure = one(&mut client, "internal", descriptor(&[("azure", "vm")])).await;
    assert_eq!(limited(&azure), (Code::Ok, 100, Unit::Minute, 99));
    server.stop().await;
}

#[tokio::test]
async fn example_6_shadow_mode_counts_but_never_denies() {
    let (server, mut client) = start(&[]).await;
    let user_a = [("service", "auth-service"), ("user", "user-a")];
    let response = ask(
        &mut client,
        "example6",
        vec![with_hits(descriptor(&user_a), 11)],
    )
    .await;
    assert_eq!(response.overall_code(), Code::Ok);
    assert_eq!(
        limited(&response.statuses[0]),
        (Code::Ok, 10, Unit::Second, 10)
    );
    let user_b = [("service", "auth-service"), ("user", "user-b")];
    let response = ask(
        &mut client,
        "example6",
        vec![with_hits(descriptor(&user_b), 21)],
    )
    .await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    assert!(unlimited(
        &one(
            &mut client,
            "example6",
            descriptor(&[("service", "s"), ("user", "user-c")])
        )
        .await
    ));
    server.stop().await;
}

#[tokio::test]
async fn example_7_replaces_drops_the_named_rule_in_the_same_request() {
    let (server, mut client) = start(&[]).await;
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    let alone = one(&mut client, "example7", descriptor(&first)).await;
    assert_eq!(limited(&alone), (Code::Ok, 5, Unit::Second, 4));
    let response = ask(
        &mut client,
        "example7",
        vec![descriptor(&first), descriptor(&second)],
    )
    .await;
    assert!(
        unlimited(&response.statuses[0]),
        "replaced: {:?}",
        response.statuses[0]
    );
    assert_eq!(
        limited(&response.statuses[1]),
        (Code::Ok, 10, Unit::Second, 9)
    );
    server.stop().await;
}

#[tokio::test]
async fn example_8_detailed_metric_changes_no_limit() {
    let (server, mut client) = start(&[]).await;
    let status = one(
        &mut client,
        "example8",
        descriptor(&[("key1", "unspecified_value")]),
    )
    .await;
    assert_eq!(limited(&status), (Code::Ok, 10, Unit::Minute, 9));
    let status = one(&mut client, "example8", descriptor(&[("key1", "value1")])).await;
    assert_eq!(limited(&status), (Code::Ok, 20, Unit::Minute, 19));
    server.stop().await;
}

#[tokio::test]
async fn example_10_value_to_metric_changes_no_limit() {
    let (server, mut client) = start(&[]).await;
    let entries = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    let status = one(&mut client, "example10", descriptor(&entries)).await;
    assert_eq!(limited(&status), (Code::Ok, 60, Unit::Minute, 59));
    server.stop().await;
}

#[tokio::test]
async fn example_9_wildcards_match_prefixes_with_a_counter_per_value() {
    let (server, mut client) = start(&[]).await;
    let response = ask(
        &mut client,
        "example9",
        vec![
            with_hits(descriptor(&[("key1", "value1")]), 20),
            with_hits(descriptor(&[("key1", "value2")]), 20),
        ],
    )
    .await;
    assert_eq!(
        response.overall_code(),
        Code::Ok,
        "separate counters: {response:?}"
    );
    let status = one(&mut client, "example9", descriptor(&[("key1", "value")])).await;
    assert_eq!(limited(&status), (Code::Ok, 20, Unit::Minute, 19));
    assert!(unlimited(
        &one(&mut client, "example9", descriptor(&[("key1", "other")])).await
    ));
    server.stop().await;
}

#[tokio::test]
async fn share_threshold_makes_one_counter_for_a_wildcard() {
    let (server, mut client) = start(&[]).await;
    let domain = "share-threshold-test";
    let shared = ask(
        &mut client,
        domain,
        vec![
            with_hits(descriptor(&[("files", "files/a.pdf")]), 6),
            with_hits(descriptor(&[("files", "files/b.csv")]), 5),
        ],
    )
    .await;
    assert_eq!(
        shared.overall_code(),
        Code::OverLimit,
        "6 + 5 on one counter of 10"
    );
    let separate = ask(
        &mut client,
        domain,
        vec![
            with_hits(descriptor(&[("files_no_share", "files_no_share/a")]), 6),
            with_hits(descriptor(&[("files_no_share", "files_no_share/b")]), 5),
        ],
    )
    .await;
    assert_eq!(separate.overall_code(), Code::Ok);
    server.stop().await;
}

#[tokio::test]
async fn the_upstream_demo_configuration() {
    let (server, mut client) = start(&[]).await;
    let status = one(&mut client, "rl", descriptor(&[("foo", "foo")])).await;
    assert_eq!(limited(&status), (Code::Ok, 2, Unit::Minute, 1));
    let status = one(
        &mut client,
        "rl",
        descriptor(&[("foo", "foo"), ("bar", "bar")]),
    )
    .await;
    assert_eq!(limited(&status), (Code::Ok, 3, Unit::Minute, 2));
    let status = one(
        &mut client,
        "rl",
        descriptor(&[("foo", "foo"), ("bar", "banned")]),
    )
    .await;
    assert_eq!(limited(&status).0, Code::OverLimit);
    let status = one(
        &mut client,
        "rl",
        with_hits(descriptor(&[("foo", "f"), ("baz", "b")]), 2),
    )
    .await;
    assert_eq!(limited(&status), (Code::OverLimit, 1, Unit::Second, 1));
    let status = one(
        &mut client,
        "rl",
        with_hits(descriptor(&[("foo", "f"), ("baz", "shady")]), 2),
    )
    .await;
    assert_eq!(
        limited(&status),
        (Code::Ok, 1, Unit::Minute, 1),
        "shadow mode"
    );
    assert_eq!(
        one(&mut client, "rl", descriptor(&[("foo", "f"), ("bay", "x")]))
            .await
            .limit_remaining,
        u32::MAX
    );
    assert_eq!(
        one(&mut client, "rl", descriptor(&[("qux", "x")]))
            .await
            .limit_remaining,
        u32::MAX
    );
    let mock = [("source_cluster", "proxy"), ("destination_cluster", "mock")];
    assert_eq!(
        limited(&one(&mut client, "rl", descriptor(&mock)).await),
        (Code::Ok, 1, Unit::Minute, 0)
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_domains_pass_and_malformed_requests_are_refused() {
    let (server, mut client) = start(&[]).await;
    let response = ask(&mut client, "nobody", vec![descriptor(&[("a", "b")])]).await;
    assert_eq!(response.overall_code(), Code::Ok);
    assert!(unlimited(&response.statuses[0]));
    for (domain, descriptors, field) in [
        ("", vec![descriptor(&[("a", "b")])], "domain"),
        ("mongo_cps", vec![], "descriptors"),
    ] {
        let status = client
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: 0,
            })
            .await
            .expect_err(field);
        assert_eq!(status.code(), GrpcCode::InvalidArgument);
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{status:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn hits_come_from_the_request_or_the_descriptor() {
    let (server, mut client) = start(&[]).await;
    let users = descriptor(&[("database", "users")]);
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "mongo_cps".into(),
            descriptors: vec![users.clone(), with_hits(users.clone(), 0)],
            hits_addend: 3,
        })
        .await
        .expect("answer")
        .into_inner();
    // One key in one request: both descriptors are decided as one, spending
    // 3 (the request's) + 0 (the descriptor's own, which wins).
    assert_eq!(response.statuses[0].limit_remaining, 497);
    let look = one(&mut client, "mongo_cps", with_hits(users, 0)).await;
    assert_eq!(
        limited(&look),
        (Code::Ok, 500, Unit::Second, look.limit_remaining)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_limit_override_from_the_request_is_honoured() {
    let (server, mut client) = start(&[]).await;
    let mut overridden = descriptor(&[("database", "users")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: 3, // HOUR
    });
    let status = one(&mut client, "mongo_cps", overridden.clone()).await;
    assert_eq!(limited(&status), (Code::Ok, 7, Unit::Hour, 6));
    let unknown_domain = one(&mut client, "nobody", overridden.clone()).await;
    assert!(
        unlimited(&unknown_domain),
        "upstream ignores overrides for unknown domains"
    );
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: 0,
    });
    let status = client
        .should_rate_limit(RateLimitRequest {
            domain: "mongo_cps".into(),
            descriptors: vec![overridden],
            hits_addend: 0,
        })
        .await
        .expect_err("UNKNOWN unit");
    assert_eq!(status.code(), GrpcCode::InvalidArgument);
    assert!(
        status.message().starts_with("descriptors[0].limit.unit: "),
        "{status:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_but_reports_each_status() {
    let (server, mut client) = start(&["--shadow-mode"]).await;
    let response = ask(
        &mut client,
        "edge_proxy_per_ip",
        vec![descriptor(&[("remote_address", "50.0.0.5")])],
    )
    .await;
    assert_eq!(response.overall_code(), Code::Ok);
    assert_eq!(response.statuses[0].code(), Code::OverLimit);
    // Decisions are still counted: 10 per second spent in one request.
    let spent = one(
        &mut client,
        "edge_proxy_per_ip",
        with_hits(descriptor(&[("remote_address", "9.9.9.9")]), 10),
    )
    .await;
    assert_eq!(limited(&spent), (Code::Ok, 10, Unit::Second, 0));
    server.stop().await;
}

#[tokio::test]
async fn ietf_headers_describe_the_most_restrictive_descriptor() {
    let (server, mut client) = start(&["--envoy-ratelimit-headers"]).await;
    let response = ask(
        &mut client,
        "messaging",
        vec![
            descriptor(&[("to_number", "1")]),
            with_hits(
                descriptor(&[("message_type", "marketing"), ("to_number", "1")]),
                2,
            ),
        ],
    )
    .await;
    let headers: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert_eq!(
        headers[0],
        (
            "RateLimit-Policy",
            r#""message_type_marketing.to_number";q=5;w=86400"#
        )
    );
    let (name, value) = headers[1];
    assert_eq!(name, "RateLimit");
    let t: u64 = value
        .strip_prefix(r#""message_type_marketing.to_number";r=3;t="#)
        .unwrap_or_else(|| panic!("RateLimit: {value}"))
        .parse()
        .expect("t is a number");
    assert!((1..=86_400).contains(&t), "t={t}");
    // Without the flag: no headers.
    let (plain, mut plain_client) = start(&[]).await;
    let response = ask(
        &mut plain_client,
        "messaging",
        vec![descriptor(&[("to_number", "2")])],
    )
    .await;
    assert!(response.response_headers_to_add.is_empty());
    plain.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn extensions_sliding_window_token_bucket_gcra_and_unit_multiplier() {
    let (server, mut client) = start(&[]).await;
    let sliding = one(
        &mut client,
        "extensions",
        with_hits(descriptor(&[("sliding", "a")]), 3),
    )
    .await;
    assert_eq!(limited(&sliding), (Code::Ok, 3, Unit::Second, 0));
    let denied = one(&mut client, "extensions", descriptor(&[("sliding", "a")])).await;
    assert_eq!(denied.code(), Code::OverLimit);
    assert_eq!(denied.duration_until_reset.map(|d| d.seconds), Some(1));

    // 4 tokens, the whole bucket back in 2 s: one token per 0.5 s.
    let bucket = one(
        &mut client,
        "extensions",
        with_hits(descriptor(&[("bucket", "a")]), 4),
    )
    .await;
    assert_eq!(limited(&bucket), (Code::Ok, 4, Unit::Second, 0));
    let denied = one(&mut client, "extensions", descriptor(&[("bucket", "a")])).await;
    assert_eq!(denied.code(), Code::OverLimit);
    assert_eq!(denied.duration_until_reset.map(|d| d.seconds), Some(1));

    // A 30-second window, aligned to multiples of 30 s since the epoch.
    let thirty = one(
        &mut client,
        "extensions",
        descriptor(&[("thirty_seconds", "a")]),
    )
    .await;
    assert_eq!(limited(&thirty), (Code::Ok, 5, Unit::Second, 4));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let expected = 30.0 - now % 30.0;
    let reset = thirty.duration_until_reset.expect("reset").seconds as f64;
    let off = (reset - expected).abs();
    assert!(
        off <= 1.5 || off >= 28.5,
        "reset {reset} s, window end in {expected} s"
    );

    // GCRA: 5 at once, then one every 2 s.
    let cells = one(
        &mut client,
        "extensions",
        with_hits(descriptor(&[("cells", "a")]), 5),
    )
    .await;
    assert_eq!(limited(&cells), (Code::Ok, 5, Unit::Second, 0));
    let denied = one(&mut client, "extensions", descriptor(&[("cells", "a")])).await;
    assert_eq!(denied.code(), Code::OverLimit);
    assert_eq!(denied.duration_until_reset.map(|d| d.seconds), Some(2));
    server.stop().await;
}

#[tokio::test]
async fn on_redis_a_denied_request_spends_nothing_on_its_other_descriptors() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let (server, mut client) = start(&["--redis-url", &url]).await;
    let response = ask(
        &mut client,
        "messaging",
        vec![
            with_hits(descriptor(&[("to_number", "42")]), 6),
            with_hits(
                descriptor(&[("message_type", "marketing"), ("to_number", "42")]),
                6,
            ),
        ],
    )
    .await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    let look = one(
        &mut client,
        "messaging",
        with_hits(descriptor(&[("to_number", "42")]), 0),
    )
    .await;
    assert_eq!(limited(&look), (Code::Ok, 100, Unit::Day, 100));
    let allowed = ask(
        &mut client,
        "messaging",
        vec![
            with_hits(descriptor(&[("to_number", "42")]), 5),
            with_hits(
                descriptor(&[("message_type", "marketing"), ("to_number", "42")]),
                5,
            ),
        ],
    )
    .await;
    assert_eq!(allowed.overall_code(), Code::Ok);
    assert_eq!(allowed.statuses[0].limit_remaining, 95);
    assert_eq!(allowed.statuses[1].limit_remaining, 0);
    server.stop().await;
    redis.assert_every_key_expires().await;
}

/// Upstream's counting (`--envoy-count-denied-hits`, on when started by
/// upstream's variables unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT):
/// every descriptor counts its hits on its own, denied ones too, so
/// `limit_remaining` falls on a request another descriptor denied. On the
/// embedded store and on Redis alike.
#[tokio::test]
async fn counting_denied_hits_spends_on_every_descriptor_as_upstream() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    for store in [vec![], vec!["--redis-url", url.as_str()]] {
        let mut flags = vec!["--envoy-count-denied-hits"];
        flags.extend(store.iter().copied());
        let (server, mut client) = start(&flags).await;
        let both = |hits| {
            vec![
                with_hits(descriptor(&[("to_number", "42")]), hits),
                with_hits(
                    descriptor(&[("message_type", "marketing"), ("to_number", "42")]),
                    hits,
                ),
            ]
        };
        let denied = ask(&mut client, "messaging", both(6)).await;
        assert_eq!(denied.overall_code(), Code::OverLimit, "{store:?}");
        assert_eq!(limited(&denied.statuses[0]), (Code::Ok, 100, Unit::Day, 94));
        assert_eq!(
            limited(&denied.statuses[1]),
            (Code::OverLimit, 5, Unit::Day, 0)
        );
        let again = ask(&mut client, "messaging", both(1)).await;
        assert_eq!(again.overall_code(), Code::OverLimit);
        assert_eq!(
            again.statuses[0].limit_remaining, 93,
            "counted though denied"
        );
        server.stop().await;
    }
    redis.assert_every_key_expires().await;
}

/// Envoy's `apply_on_stream_done` reports the real cost after the response
/// and then asks with `hits_addend: 0` before the next request. Counting
/// denied hits records the late report even past the limit, so the next
/// look denies; without it (our default) the report over the remaining
/// quota is refused and spends nothing, so the look passes.
#[tokio::test]
async fn a_late_report_past_the_limit_binds_when_denied_hits_count() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    for (count_denied, look_after) in [(true, Code::OverLimit), (false, Code::Ok)] {
        let mut flags = vec!["--redis-url", url.as_str(), "--key-prefix"];
        let prefix = format!("late{count_denied}:");
        flags.push(&prefix);
        if count_denied {
            flags.push("--envoy-count-denied-hits");
        }
        let (server, mut client) = start(&flags).await;
        let marketing = || descriptor(&[("message_type", "marketing"), ("to_number", "7")]);
        let first = one(&mut client, "messaging", with_hits(marketing(), 0)).await;
        assert_eq!(first.code(), Code::Ok);
        let report = one(&mut client, "messaging", with_hits(marketing(), 9)).await;
        assert_eq!(report.code(), Code::OverLimit, "9 is past the limit of 5");
        let look = one(&mut client, "messaging", with_hits(marketing(), 0)).await;
        assert_eq!(look.code(), look_after, "count denied hits: {count_denied}");
        server.stop().await;
    }
    redis.assert_every_key_expires().await;
}

/// A denial answered from the local over-limit cache reads as one from
/// Redis: the same limit, nothing remaining, and the real time to reset
/// (upstream's integration test: 25 hits on a 20/minute key).
#[tokio::test]
async fn a_cached_denial_reports_what_redis_would() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("another.yaml"),
        "domain: another\ndescriptors:\n  - key: key2\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    )
    .expect("write config");
    let config = dir.path().to_str().expect("utf-8 path");
    let server = TestServer::start(&["--config", config, "--redis-url", &url]).await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    for i in 0..25u32 {
        let status = one(
            &mut client,
            "another",
            with_hits(descriptor(&[("key2", "v")]), 1),
        )
        .await;
        let (code, remaining) = if i < 20 {
            (Code::Ok, 19 - i)
        } else {
            (Code::OverLimit, 0)
        };
        assert_eq!(
            limited(&status),
            (code, 20, Unit::Minute, remaining),
            "hit {i}"
        );
        let reset = status.duration_until_reset.map_or(0, |d| d.seconds);
        assert!((1..=60).contains(&reset), "hit {i}: reset in {reset} s");
    }
    server.stop().await;
}

/// Upstream's `quota_mode` and `metadata` on descriptors, its dynamic
/// metadata (RESPONSE_DYNAMIC_METADATA) and its three headers
/// (LIMIT_RESPONSE_HEADERS_ENABLED): a quota descriptor over its limit
/// denies only when every quota descriptor of the request is over, and the
/// metadata of the descriptors that passed reaches the response.
#[tokio::test]
async fn quota_mode_metadata_and_upstream_headers() {
    use prost_types::value::Kind;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("quota.yaml"),
        "domain: quota\n\
         descriptors:\n\
         \x20 - key: plan\n\
         \x20   quota_mode: true\n\
         \x20   metadata: {tier: {name: gold}}\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 1}\n\
         \x20 - key: region\n\
         \x20   quota_mode: true\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 1}\n\
         \x20 - key: user\n\
         \x20   metadata: {checked: true}\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .expect("write config");
    let config = dir.path().to_str().expect("utf-8 path");
    let server = TestServer::start(&[
        "--config",
        config,
        "--envoy-dynamic-metadata",
        "--envoy-limit-headers",
    ])
    .await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let request = |plan_hits, region_hits| {
        vec![
            with_hits(descriptor(&[("plan", "p")]), plan_hits),
            with_hits(descriptor(&[("region", "r")]), region_hits),
            with_hits(descriptor(&[("user", "u")]), 1),
        ]
    };
    // The plan quota is over but the region quota is not: allowed.
    let response = ask(&mut client, "quota", request(2, 1)).await;
    assert_eq!(response.statuses[0].code(), Code::OverLimit);
    assert_eq!(response.overall_code(), Code::Ok, "one quota left: allowed");
    let metadata = response.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(
        metadata.fields["domain"].kind,
        Some(Kind::StringValue("quota".into()))
    );
    let Some(Kind::StructValue(passed)) = &metadata.fields["metadata"].kind else {
        panic!("metadata of the passed descriptors: {metadata:?}");
    };
    assert!(passed.fields.contains_key("checked"), "user passed");
    assert!(!passed.fields.contains_key("tier"), "plan was over");
    let headers: Vec<(String, String)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        headers[0],
        ("RateLimit-Limit".into(), "1".into()),
        "{headers:?}"
    );
    assert_eq!(headers[1], ("RateLimit-Remaining".into(), "0".into()));
    // Both quotas over: denied.
    let response = ask(&mut client, "quota", request(2, 2)).await;
    assert_eq!(response.overall_code(), Code::OverLimit, "every quota over");
    server.stop().await;
}

/// The rule-level extension `count_denied_hits: true`, under our own
/// flags: a rule Envoy charges after the response binds, while the rules
/// without it keep "denied spends nothing".
#[tokio::test]
async fn a_rule_may_count_denied_hits_on_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("late.yaml"),
        "domain: late\n\
         descriptors:\n\
         \x20 - key: charged_after\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 2, count_denied_hits: true}\n\
         \x20 - key: ordinary\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .expect("write config");
    let config = dir.path().to_str().expect("utf-8 path");
    let server = TestServer::start(&["--config", config]).await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    for (key, look_after) in [("charged_after", Code::OverLimit), ("ordinary", Code::Ok)] {
        let one_of = |hits| with_hits(descriptor(&[(key, "x")]), hits);
        assert_eq!(one(&mut client, "late", one_of(0)).await.code(), Code::Ok);
        let report = one(&mut client, "late", one_of(3)).await;
        assert_eq!(report.code(), Code::OverLimit, "{key}: 3 is past 2");
        let look = one(&mut client, "late", one_of(0)).await;
        assert_eq!(look.code(), look_after, "{key}");
    }
    server.stop().await;
}

/// The `rate_limits` extension: several limits on one descriptor.
const SEVERAL_LIMITS: &str = "domain: several\n\
     descriptors:\n\
     \x20 - key: api\n\
     \x20   rate_limits:\n\
     \x20     - {unit: second, requests_per_unit: 3, name: per_second}\n\
     \x20     - {unit: minute, requests_per_unit: 5, name: per_minute}\n\
     \x20 - key: blocked\n\
     \x20   rate_limit: {unit: second, requests_per_unit: 0}\n\
     \x20 - key: mixed\n\
     \x20   rate_limit: {unit: hour, requests_per_unit: 10, name: hourly}\n\
     \x20   rate_limits:\n\
     \x20     - {unit: day, requests_per_unit: 20}\n\
     \x20     - {unlimited: true}\n\
     \x20 - key: with_block\n\
     \x20   rate_limits:\n\
     \x20     - {unit: hour, requests_per_unit: 10}\n\
     \x20     - {unit: second, requests_per_unit: 0, name: closed}\n\
     \x20 - key: all_unlimited\n\
     \x20   rate_limits: [{unlimited: true}, {unlimited: true}]\n\
     \x20 - key: replacer\n\
     \x20   rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: hourly}]}\n";

/// A server on [`SEVERAL_LIMITS`] with both kinds of response headers, on
/// the embedded store or (given a URL) on Redis.
async fn start_several(dir: &tempfile::TempDir, redis_url: Option<&str>) -> (TestServer, Client) {
    std::fs::write(dir.path().join("several.yaml"), SEVERAL_LIMITS).expect("write config");
    let config = dir.path().to_str().expect("utf-8 path");
    let mut flags = vec![
        "--config",
        config,
        "--envoy-ratelimit-headers",
        "--envoy-limit-headers",
    ];
    if let Some(url) = redis_url {
        flags.extend(["--redis-url", url]);
    }
    let server = TestServer::start(&flags).await;
    let client = RateLimitServiceClient::new(common::channel(server.address).await);
    (server, client)
}

/// The value of the response header `name`.
fn header<'a>(response: &'a RateLimitResponse, name: &str) -> &'a str {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
        .unwrap_or_else(|| panic!("no {name} in {:?}", response.response_headers_to_add))
}

/// The `name` of a status's `current_limit`.
fn limit_name(status: &DescriptorStatus) -> &str {
    status
        .current_limit
        .as_ref()
        .map_or("(no limit)", |limit| limit.name.as_str())
}

/// Sleeps to just past the next whole second of the clock, where aligned
/// one-second windows start (a wall-clock boundary: nothing signals it).
async fn next_second() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let left = 1.0 - now.as_secs_f64().fract();
    tokio::time::sleep(std::time::Duration::from_secs_f64(left + 0.02)).await;
}

/// Three per second and five per minute on one descriptor: the fourth
/// request of a second is denied by the per-second limit and spends
/// nothing on the per-minute one; later the per-minute limit is the one
/// exhausted. Each status, and both kinds of headers, describe the most
/// restrictive limit. On the embedded store and on Redis.
#[tokio::test]
async fn several_limits_on_one_descriptor_report_the_most_restrictive() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    for redis_url in [None, Some(url.as_str())] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (server, mut client) = start_several(&dir, redis_url).await;
        let api = || descriptor(&[("api", "x")]);
        common::fresh_minute().await;
        next_second().await;
        for remaining in [2, 1, 0] {
            let status = one(&mut client, "several", api()).await;
            assert_eq!(
                limited(&status),
                (Code::Ok, 3, Unit::Second, remaining),
                "{redis_url:?}"
            );
            assert_eq!(limit_name(&status), "per_second");
        }
        let fourth = ask(&mut client, "several", vec![api()]).await;
        assert_eq!(fourth.overall_code(), Code::OverLimit, "{redis_url:?}");
        let status = &fourth.statuses[0];
        assert_eq!(limited(status), (Code::OverLimit, 3, Unit::Second, 0));
        assert_eq!(limit_name(status), "per_second");
        assert_eq!(status.duration_until_reset.map(|d| d.seconds), Some(1));
        assert_eq!(
            header(&fourth, "RateLimit-Policy"),
            r#""per_second";q=3;w=1"#
        );
        assert_eq!(header(&fourth, "RateLimit"), r#""per_second";r=0;t=1"#);
        assert_eq!(header(&fourth, "RateLimit-Limit"), "3");
        assert_eq!(header(&fourth, "RateLimit-Remaining"), "0");
        assert_eq!(header(&fourth, "RateLimit-Reset"), "1");

        // A new second: the per-second limit is whole again, and the
        // per-minute one shows that neither the denied fourth request nor
        // one denied by another descriptor spent on it (5 - 3 - 1 = 1).
        next_second().await;
        let with_blocked = ask(
            &mut client,
            "several",
            vec![api(), descriptor(&[("blocked", "b")])],
        )
        .await;
        assert_eq!(with_blocked.overall_code(), Code::OverLimit);
        assert_eq!(with_blocked.statuses[0].code(), Code::Ok);
        let allowed = ask(&mut client, "several", vec![api()]).await;
        assert_eq!(allowed.overall_code(), Code::Ok, "{redis_url:?}");
        let status = &allowed.statuses[0];
        assert_eq!(limited(status), (Code::Ok, 5, Unit::Minute, 1));
        assert_eq!(limit_name(status), "per_minute");
        assert_eq!(
            header(&allowed, "RateLimit-Policy"),
            r#""per_minute";q=5;w=60"#
        );
        assert!(
            header(&allowed, "RateLimit").starts_with(r#""per_minute";r=1;t="#),
            "{:?}",
            allowed.response_headers_to_add
        );
        assert_eq!(header(&allowed, "RateLimit-Limit"), "5");
        assert_eq!(header(&allowed, "RateLimit-Remaining"), "1");

        let last = one(&mut client, "several", api()).await;
        assert_eq!(limited(&last), (Code::Ok, 5, Unit::Minute, 0));
        let denied = ask(&mut client, "several", vec![api()]).await;
        assert_eq!(denied.overall_code(), Code::OverLimit, "{redis_url:?}");
        let status = &denied.statuses[0];
        assert_eq!(limited(status), (Code::OverLimit, 5, Unit::Minute, 0));
        assert_eq!(limit_name(status), "per_minute");
        let reset = status.duration_until_reset.map_or(0, |d| d.seconds);
        assert!((1..=60).contains(&reset), "reset in {reset} s");
        assert_eq!(
            header(&denied, "RateLimit-Policy"),
            r#""per_minute";q=5;w=60"#
        );
        assert_eq!(
            header(&denied, "RateLimit"),
            format!(r#""per_minute";r=0;t={reset}"#)
        );
        assert_eq!(header(&denied, "RateLimit-Limit"), "5");
        assert_eq!(header(&denied, "RateLimit-Remaining"), "0");
        server.stop().await;
    }
    redis.assert_every_key_expires().await;
}

/// In a list, an unlimited entry limits nothing, a blocked one blocks the
/// descriptor, and `replaces` drops the entry it names while the
/// descriptor keeps the others.
#[tokio::test]
async fn unlimited_blocked_and_replaced_limits_in_a_list() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, mut client) = start_several(&dir, None).await;
    let mixed = || descriptor(&[("mixed", "m")]);

    let status = one(&mut client, "several", mixed()).await;
    assert_eq!(limited(&status), (Code::Ok, 10, Unit::Hour, 9));
    assert_eq!(limit_name(&status), "hourly");
    // The hourly limit replaced: the daily one speaks, counted as before.
    let response = ask(
        &mut client,
        "several",
        vec![mixed(), descriptor(&[("replacer", "r")])],
    )
    .await;
    assert_eq!(response.overall_code(), Code::Ok);
    assert_eq!(
        limited(&response.statuses[0]),
        (Code::Ok, 20, Unit::Day, 18)
    );
    assert_eq!(limit_name(&response.statuses[0]), "");
    assert_eq!(
        header(&response, "RateLimit-Policy"),
        r#""mixed#2";q=20;w=86400"#,
        "an unnamed limit of several is told apart by its position"
    );

    let with_block = || descriptor(&[("with_block", "w")]);
    let blocked = one(&mut client, "several", with_block()).await;
    assert_eq!(limited(&blocked), (Code::OverLimit, 0, Unit::Second, 0));
    assert_eq!(limit_name(&blocked), "closed");
    let look = one(&mut client, "several", with_hits(with_block(), 0)).await;
    assert_eq!(look.code(), Code::Ok, "a look spends nothing, so passes");
    assert_eq!(
        limited(&look),
        (Code::Ok, 0, Unit::Second, 0),
        "the blocked limit has the fewest left"
    );

    let free = one(
        &mut client,
        "several",
        descriptor(&[("all_unlimited", "u")]),
    )
    .await;
    assert!(unlimited(&free));
    assert_eq!(free.limit_remaining, u32::MAX);
    server.stop().await;
}

/// Upstream files name their counters as before the `rate_limits`
/// extension: a single `rate_limit` keeps its storage key.
#[tokio::test]
async fn a_single_rate_limit_keeps_its_storage_key() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let (server, mut client) = start(&["--redis-url", &url]).await;
    // A day's window: the key outlives the test.
    let status = one(&mut client, "messaging", descriptor(&[("to_number", "1")])).await;
    assert_eq!(limited(&status), (Code::Ok, 100, Unit::Day, 99));
    server.stop().await;
    assert_eq!(
        redis.keys().await,
        ["ratelimitd:{rls:fa:9:messaging|9:to_number|1:1|w86400000}"]
    );
}
