//! The rows of upstream's statistics variables: which sink they choose,
//! statsd's address, tags, flush interval, DogStatsD and its mogrifiers,
//! the Prometheus mapping, and the combinations upstream refuses.

use std::path::PathBuf;
use std::time::Duration;

use super::load;

#[test]
fn statsd_is_upstreams_default_sink() {
    // Any upstream variable, USE_STATSD unset: statsd to localhost:8125.
    let (config, _) = load(&[], &[("REDIS_POOL_SIZE", "4")]).unwrap();
    let stats = &config.stats;
    assert_eq!(stats.statsd_address.as_deref(), Some("localhost:8125"));
    assert!(!stats.statsd_dogstatsd);
    assert_eq!(stats.statsd_flush_interval, Duration::from_secs(10));
    let (config, _) = load(
        &[],
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd.local"),
            ("STATSD_PORT", "9125"),
            ("EXTRA_TAGS", "cluster:a,zone:b"),
            ("STATS_FLUSH_INTERVAL", "250ms"),
        ],
    )
    .unwrap();
    let stats = &config.stats;
    assert_eq!(stats.statsd_address.as_deref(), Some("statsd.local:9125"));
    assert_eq!(stats.statsd_flush_interval, Duration::from_millis(250));
    assert_eq!(
        stats.stats_tags.0,
        [("cluster".into(), "a".into()), ("zone".into(), "b".into())]
    );
    // Our own flag wins over upstream's default.
    let (config, _) = load(
        &["--statsd-address", "127.0.0.1:1"],
        &[("REDIS_POOL_SIZE", "4")],
    )
    .unwrap();
    assert_eq!(config.stats.statsd_address.as_deref(), Some("127.0.0.1:1"));
    let err = load(&[], &[("STATS_FLUSH_INTERVAL", "0s")]).unwrap_err();
    assert!(err.contains("STATS_FLUSH_INTERVAL"), "{err}");
    let err = load(&[], &[("STATSD_PORT", "many")]).unwrap_err();
    assert!(err.contains("STATSD_PORT=many"), "{err}");
}

#[test]
fn one_sink_at_a_time_as_upstream() {
    let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(config.stats.statsd_address, None);
    let (config, _) = load(&[], &[("DISABLE_STATS", "true")]).unwrap();
    assert_eq!(config.stats.statsd_address, None);
    for both in [
        &[("USE_PROMETHEUS", "true")][..],
        &[("USE_DOG_STATSD", "true")],
        &[
            ("USE_STATSD", "false"),
            ("USE_DOG_STATSD", "true"),
            ("USE_PROMETHEUS", "true"),
        ],
    ] {
        let err = load(&[], both).unwrap_err();
        assert!(err.contains("more than one stats sink"), "{both:?}: {err}");
    }
}

#[test]
fn dogstatsd_takes_its_mogrifiers() {
    let (config, _) = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("USE_DOG_STATSD", "true"),
            ("USE_DOG_STATSD_MOGRIFIERS", "DESC,ALL"),
            (
                "DOG_STATSD_MOGRIFIER_DESC_PATTERN",
                r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)$",
            ),
            (
                "DOG_STATSD_MOGRIFIER_DESC_NAME",
                "ratelimit.service.rate_limit.$2",
            ),
            ("DOG_STATSD_MOGRIFIER_DESC_TAGS", "descriptor:$1"),
            ("DOG_STATSD_MOGRIFIER_ALL_PATTERN", ".*"),
            ("DOG_STATSD_MOGRIFIER_ALL_NAME", "x"),
        ],
    )
    .unwrap();
    let stats = &config.stats;
    assert!(stats.statsd_dogstatsd);
    assert_eq!(stats.statsd_address.as_deref(), Some("localhost:8125"));
    let written: Vec<String> = stats
        .statsd_mogrifier
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        written,
        [
            r"pattern=^ratelimit\.service\.rate_limit\.(.*)\.(.*)$;name=ratelimit.service.rate_limit.$2;tags=descriptor:$1",
            "pattern=.*;name=x",
        ]
    );
    let err = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("USE_DOG_STATSD", "true"),
            ("USE_DOG_STATSD_MOGRIFIERS", "NOPE"),
        ],
    )
    .unwrap_err();
    assert!(err.contains("DOG_STATSD_MOGRIFIER_NOPE_PATTERN"), "{err}");
}

#[test]
fn prometheus_takes_a_mapping_file_or_milliseconds() {
    let prometheus = [("USE_STATSD", "false"), ("USE_PROMETHEUS", "true")];
    let mut with_file = prometheus.to_vec();
    with_file.extend([
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
    ]);
    let (config, _) = load(&[], &with_file).unwrap();
    assert_eq!(
        config.stats.stats_mapping,
        Some(PathBuf::from("/etc/statsd-exporter/conf.yaml"))
    );
    assert!(
        !config.stats.stats_mapping_milliseconds,
        "ignored beside a file, as upstream"
    );
    let mut milliseconds = prometheus.to_vec();
    milliseconds.push(("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"));
    let (config, _) = load(&[], &milliseconds).unwrap();
    assert!(config.stats.stats_mapping_milliseconds);
    let mapping = config.stats.mapping().unwrap();
    let time = mapping.map(
        "ratelimit_server.ShouldRateLimit.response_time",
        crate::stats::mapper::StatKind::Timer,
    );
    let crate::stats::mapper::Mapped::Series(time) = time else {
        panic!("mapped");
    };
    assert_eq!(time.scale, None, "milliseconds: no scale");
    // Without USE_PROMETHEUS, the file is not read.
    let (config, _) = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("PROMETHEUS_MAPPER_YAML", "/x.yaml"),
        ],
    )
    .unwrap();
    assert_eq!(config.stats.stats_mapping, None);
    let (_, report) = load(&[], &[("USE_STATSD", "false"), ("STATSD_PROTOCOL", "tcp")]).unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("STATSD_PROTOCOL")),
        "{report:?}"
    );
}

#[test]
fn a_bad_mapping_file_names_the_flag_and_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conf.yaml");
    std::fs::write(&path, "mappings:\n- match: a..b\n  name: x\n").unwrap();
    let path = path.to_string_lossy().into_owned();
    let (config, _) = load(&["--stats-mapping", &path], &[]).unwrap();
    let err = config
        .invalid(config.stats.mapping().unwrap_err())
        .to_string();
    assert!(
        err.contains("--stats-mapping") && err.contains("mappings[0]: invalid match"),
        "{err}"
    );
}
