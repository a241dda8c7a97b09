//! The mapping language's tests: globs, regular expressions, types,
//! drops, escaping, and upstream's default mapping on upstream's names.

use super::*;

fn series(mapping: &Mapping, name: &str, kind: StatKind) -> (String, Vec<(String, String)>) {
    match mapping.map(name, kind) {
        Mapped::Series(series) => (series.name, series.labels),
        Mapped::Drop => panic!("{name} dropped"),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn globs_capture_whole_segments_and_come_before_regexes() {
    let mapping = Mapping::parse(
        "mappings:\n\
         - match: 'a\\.(.*)'\n  match_type: regex\n  name: from_regex\n\
         - match: a.*.c\n  name: glob_$1\n  labels: {xx: '${1}', yy: 'k_$1_$9'}\n\
         - match: a.*.*\n  name: second\n",
    )
    .unwrap();
    // statsd_exporter reads `$1_$9` as one reference, not a number: gone.
    assert_eq!(
        series(&mapping, "a.b.c", StatKind::Counter),
        ("glob_b".into(), labels(&[("xx", "b"), ("yy", "k_")]))
    );
    // The first glob that matches wins; a glob beats an earlier regex.
    assert_eq!(series(&mapping, "a.b.d", StatKind::Counter).0, "second");
    // More segments than any glob: the regex, unanchored.
    assert_eq!(
        series(&mapping, "a.b.c.d", StatKind::Counter).0,
        "from_regex"
    );
}

#[test]
fn types_narrow_and_drop_drops() {
    let mapping = Mapping::parse(
        "mappings:\n\
         - match: x.*\n  match_metric_type: gauge\n  name: gauge_$1\n\
         - match: 'x\\.(.*)'\n  match_type: regex\n  match_metric_type: counter\n  name: counter_$1\n\
         - match: 'x\\.(.*)'\n  match_type: regex\n  name: any_$1\n\
         - match: drop.*\n  action: drop\n  name: dropped\n\
         - match: t.*\n  name: timer\n  timer_type: histogram\n  scale: 0.001\n",
    )
    .unwrap();
    assert_eq!(series(&mapping, "x.y", StatKind::Gauge).0, "gauge_y");
    assert_eq!(series(&mapping, "x.y", StatKind::Counter).0, "counter_y");
    assert_eq!(series(&mapping, "x.y", StatKind::Timer).0, "any_y");
    assert_eq!(mapping.map("drop.me", StatKind::Counter), Mapped::Drop);
    let Mapped::Series(timer) = mapping.map("t.q", StatKind::Timer) else {
        panic!("mapped");
    };
    assert_eq!(timer.scale, Some(0.001));
    assert_eq!(timer.buckets.as_deref(), Some(&DEFAULT_BUCKETS[..]));
    assert_eq!(
        mapping.histograms(),
        [(
            HistogramName::Full("timer".into()),
            DEFAULT_BUCKETS.to_vec()
        )]
    );
}

#[test]
fn unmapped_names_are_escaped_as_statsd_exporter_does() {
    assert_eq!(
        escape("ratelimit.service.rate_limit.d.k_v.total_hits"),
        "ratelimit_service_rate_limit_d_k_v_total_hits"
    );
    assert_eq!(escape("1abc"), "_1abc");
    assert_eq!(escape("a--b-c"), "a_b_c");
    assert_eq!(escape("a.__tag=v/é"), "a___tag_v__");
    let empty = Mapping::parse("mappings: []\n").unwrap();
    assert_eq!(series(&empty, "a.b-c", StatKind::Gauge).0, "a_b_c");
}

#[test]
fn bad_mappings_are_refused_with_their_reason() {
    for (text, reason) in [
        ("mappings:\n- match: a.b\n", "didn't set a metric name"),
        ("mappings:\n- match: a..b\n  name: x\n", "invalid match"),
        ("mappings:\n- match: a*b\n  name: x\n", "invalid match"),
        (
            "mappings:\n- match: '('\n  match_type: regex\n  name: x\n",
            "invalid regex",
        ),
        (
            "mappings:\n- match: a\n  name: x\n  labels: {a: b}\n",
            "invalid label key",
        ),
        (
            "mappings:\n- match: a\n  name: x\n  action: keep\n",
            "invalid action",
        ),
        ("mappings:\n- match: a\n  name: x-y\n", "not a valid name"),
        (
            "mappings:\n- match: a\n  name: x\n  colour: red\n",
            "not a statsd_exporter mapping",
        ),
    ] {
        let err = Mapping::parse(text).unwrap_err().to_string();
        assert!(err.contains(reason), "{text}: {err}");
    }
}

#[test]
fn upstreams_default_mapping_names_upstreams_statistics() {
    let mapping = Mapping::parse(super::super::options::DEFAULT_MAPPING).unwrap();
    let rule = "ratelimit.service.rate_limit";
    assert_eq!(
        series(
            &mapping,
            &format!("{rule}.d.k_v.total_hits"),
            StatKind::Counter
        ),
        (
            "ratelimit_service_rate_limit_total_hits".into(),
            labels(&[("domain", "d"), ("key1", "k_v")])
        )
    );
    assert_eq!(
        series(
            &mapping,
            &format!("{rule}.d.a_1.b.c.near_limit"),
            StatKind::Counter
        ),
        (
            "ratelimit_service_rate_limit_near_limit".into(),
            labels(&[("domain", "d"), ("key1", "a_1"), ("key2", "b")])
        )
    );
    // Unanchored, as upstream's: a two-level key's local-cache statistic
    // is counted under over_limit too; a one-level key's is left unmapped.
    assert_eq!(
        series(
            &mapping,
            &format!("{rule}.d.a.b.over_limit_with_local_cache"),
            StatKind::Counter
        )
        .0,
        "ratelimit_service_rate_limit_over_limit"
    );
    assert_eq!(
        series(
            &mapping,
            &format!("{rule}.d.a.over_limit_with_local_cache"),
            StatKind::Counter
        )
        .0,
        "ratelimit_service_rate_limit_d_a_over_limit_with_local_cache"
    );
}

#[test]
fn upstreams_default_mapping_names_the_server_and_service_statistics() {
    let mapping = Mapping::parse(super::super::options::DEFAULT_MAPPING).unwrap();
    assert_eq!(
        series(
            &mapping,
            "ratelimit_server.ShouldRateLimit.total_requests",
            StatKind::Counter
        ),
        (
            "ratelimit_service_total_requests".into(),
            labels(&[("grpc_method", "ShouldRateLimit")])
        )
    );
    let Mapped::Series(time) = mapping.map(
        "ratelimit_server.ShouldRateLimit.response_time",
        StatKind::Timer,
    ) else {
        panic!("mapped");
    };
    assert_eq!(
        (time.name.as_str(), time.scale),
        ("ratelimit_service_response_time_seconds", Some(0.001))
    );
    assert_eq!(
        series(
            &mapping,
            "ratelimit.service.call.should_rate_limit.redis_error",
            StatKind::Counter
        )
        .1,
        labels(&[("err_type", "redis_error")])
    );
    // A gauge is not what the counter mapping matches.
    assert_eq!(
        series(
            &mapping,
            "ratelimit.service.config_load_success",
            StatKind::Gauge
        )
        .0,
        "ratelimit_service_config_load_success"
    );
}
