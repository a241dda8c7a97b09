//! The traffic shapes' arrivals, each algorithm's exact admissions under
//! them, and every bound of a run refused naming its field.

use super::*;
use crate::pb::ratelimitd::v1::limit::Algorithm as Of;

fn ms(millis: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: millis / 1000,
        nanos: (millis % 1000) as i32 * 1_000_000,
    })
}

fn traffic(shape: PbShape, rate: f64, duration_ms: i64) -> pb::SimulatedTraffic {
    pb::SimulatedTraffic {
        shape: shape as i32,
        rate,
        duration: ms(duration_ms),
        period: None,
        cost: None,
    }
}

fn limit(algorithm: Of) -> pb::Limit {
    pb::Limit {
        algorithm: Some(algorithm),
        ..Default::default()
    }
}

fn fixed(limit_: u64, window_ms: i64) -> pb::Limit {
    limit(Of::FixedWindow(pb::FixedWindow {
        limit: limit_,
        window: ms(window_ms),
    }))
}

fn request(
    limits: Vec<pb::Limit>,
    traffic: pb::SimulatedTraffic,
    step_ms: Option<i64>,
) -> pb::SimulateRequest {
    pb::SimulateRequest {
        limits,
        traffic: Some(traffic),
        step: step_ms.and_then(ms),
    }
}

fn run(request: pb::SimulateRequest) -> pb::SimulateResponse {
    simulation(request).expect("a valid run").run()
}

/// Every algorithm at `per_second` a second, no burst beyond it.
fn all_five(per_second: u64) -> Vec<pb::Limit> {
    vec![
        fixed(per_second, 1000),
        limit(Of::SlidingWindow(pb::SlidingWindow {
            limit: per_second,
            window: ms(1000),
        })),
        limit(Of::TokenBucket(pb::TokenBucket {
            capacity: per_second,
            refill_per_second: per_second as f64,
        })),
        limit(Of::Gcra(pb::Gcra {
            rate: per_second,
            period: ms(1000),
            burst: 1,
        })),
        limit(Of::SlidingWindowCounter(pb::SlidingWindowCounter {
            limit: per_second,
            window: ms(1000),
        })),
    ]
}

#[test]
fn steady_traffic_is_evenly_spaced_from_zero() {
    let run = simulation(request(
        vec![fixed(1, 1000)],
        traffic(PbShape::Steady, 50.0, 1000),
        None,
    ))
    .unwrap();
    let arrivals = run.traffic.arrivals();
    assert_eq!(arrivals.len(), 50);
    for (n, at) in arrivals.iter().enumerate() {
        assert_eq!(at.as_micros(), n as u64 * 20_000, "request {n}");
    }
    assert_eq!(run.run().sent, vec![5; 10]);
}

#[test]
fn bursts_send_the_steady_average_at_the_start_of_each_period() {
    let mut shape = traffic(PbShape::Bursts, 10.0, 2000);
    shape.period = ms(500);
    let answer = run(request(vec![fixed(1, 1000)], shape, None));
    let mut expected = vec![0; 20];
    for burst in [0, 5, 10, 15] {
        expected[burst] = 5;
    }
    assert_eq!(answer.sent, expected);
}

#[test]
fn a_ramp_rises_from_nothing_to_the_rate() {
    let answer = run(request(
        vec![fixed(1, 1000)],
        traffic(PbShape::Ramp, 100.0, 1000),
        None,
    ));
    // 100 t² / 2 requests by t: 50 at the end, which is not sent.
    assert_eq!(answer.sent.iter().sum::<u32>(), 49);
    assert_eq!(answer.sent, vec![0, 1, 3, 3, 5, 5, 7, 7, 9, 9]);
}

#[test]
fn a_sawtooth_repeats_its_ramp_every_period() {
    let mut shape = traffic(PbShape::Sawtooth, 100.0, 1000);
    shape.period = ms(500);
    let answer = run(request(vec![fixed(1, 1000)], shape, None));
    // 100 τ² requests τ into a tooth: 1 by 0.1 s, 4 by 0.2 s, ... 25 at its
    // end, which is the next tooth's start (and, for the last, past the end).
    assert_eq!(answer.sent, vec![0, 3, 5, 7, 9, 1, 3, 5, 7, 9]);
    assert_eq!(answer.sent.iter().sum::<u32>(), 49);
}

#[test]
fn a_fixed_window_of_ten_a_second_admits_exactly_ten_a_window_under_fifty() {
    let answer = run(request(
        vec![fixed(10, 1000)],
        traffic(PbShape::Steady, 50.0, 5000),
        Some(1000),
    ));
    let limit = &answer.limits[0];
    assert_eq!(answer.sent, vec![50; 5]);
    assert_eq!(limit.admitted, vec![10; 5]);
    assert_eq!(limit.denied, vec![40; 5]);
    assert_eq!((limit.admitted_total, limit.denied_total), (50, 200));
    assert_eq!(
        (limit.algorithm.as_str(), limit.limit),
        ("fixed_window", 10)
    );
}

#[test]
fn the_sliding_log_and_gcra_hold_ten_a_second_exactly() {
    let answer = run(request(
        all_five(10),
        traffic(PbShape::Steady, 50.0, 3000),
        Some(1000),
    ));
    let by = |name: &str| {
        answer
            .limits
            .iter()
            .find(|limit| limit.algorithm == name)
            .unwrap()
    };
    // The log admits the first ten, then one as each leaves the window.
    assert_eq!(by("sliding_window").admitted, vec![10, 10, 10]);
    // One every 100 ms, from zero.
    assert_eq!(by("gcra").admitted, vec![10, 10, 10]);
    // The bucket starts full: ten at once, then ten a second refilled.
    let bucket = &by("token_bucket").admitted;
    assert!(bucket[0] >= 19 && bucket[1..] == [10, 10], "{bucket:?}");
    for limit in &answer.limits {
        let sent: u32 = answer.sent.iter().sum();
        assert_eq!(limit.admitted_total + limit.denied_total, sent);
    }
}

#[test]
fn traffic_under_every_limit_is_all_admitted_and_remaining_is_seen_at_each_step() {
    let answer = run(request(
        all_five(10),
        traffic(PbShape::Steady, 5.0, 2000),
        Some(500),
    ));
    for limit in &answer.limits {
        assert_eq!(limit.denied_total, 0, "{}", limit.algorithm);
        assert_eq!(limit.admitted_total, 10, "{}", limit.algorithm);
        assert_eq!(limit.remaining.len(), 4);
        assert!(limit.remaining.iter().all(|&left| left <= 10), "{limit:?}");
    }
    let fixed_window = &answer.limits[0];
    // Anchored at zero: 3 spent by 0.5 s, 5 by 1 s; then a new window.
    assert_eq!(fixed_window.remaining[0], 7);
}

#[test]
fn a_limits_own_cost_and_the_traffics_cost_are_spent() {
    let mut costly = traffic(PbShape::Steady, 10.0, 1000);
    costly.cost = Some(2);
    let mut own = fixed(10, 1000);
    own.cost = Some(5);
    let answer = run(request(vec![fixed(10, 1000), own], costly, Some(1000)));
    assert_eq!(answer.limits[0].admitted, vec![5]);
    assert_eq!(answer.limits[1].admitted, vec![2]);
}

/// A request the other cases break one field of.
fn good() -> pb::SimulateRequest {
    request(
        vec![fixed(10, 1000)],
        traffic(PbShape::Steady, 10.0, 1000),
        None,
    )
}

/// Each case is refused naming `field`, its rule saying `rule`.
fn assert_refused(cases: Vec<(pb::SimulateRequest, &str, &str)>) {
    for (request, field, rule) in cases {
        let err = simulation(request.clone()).unwrap_err();
        assert_eq!(err.field, field, "{request:?}: {err}");
        assert!(err.rule.contains(rule), "{request:?}: {err}");
    }
}

#[test]
fn bounds_of_the_request_and_the_shape_are_refused_naming_the_field() {
    assert_refused(vec![
        (
            pb::SimulateRequest {
                traffic: None,
                ..good()
            },
            "traffic",
            "is required",
        ),
        (
            pb::SimulateRequest {
                limits: vec![],
                ..good()
            },
            "limits",
            "1 to 10",
        ),
        (
            pb::SimulateRequest {
                limits: vec![fixed(1, 1000); MAX_LIMITS + 1],
                ..good()
            },
            "limits",
            "at most 10",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Unspecified, 1.0, 1000),
                None,
            ),
            "traffic.shape",
            "STEADY",
        ),
    ]);
}

#[test]
fn bounds_of_the_traffics_rate_and_duration_are_refused_naming_the_field() {
    assert_refused(vec![
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, f64::NAN, 1000),
                None,
            ),
            "traffic.rate",
            "finite positive",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, 0.0, 1000),
                None,
            ),
            "traffic.rate",
            "finite positive",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, 1e5, 2000),
                None,
            ),
            "traffic.rate",
            "at most 100000",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, 1e300, 2000),
                None,
            ),
            "traffic.rate",
            "at most 100000",
        ),
        (
            request(vec![fixed(1, 1000)], traffic(PbShape::Steady, 1.0, 0), None),
            "traffic.duration",
            "positive",
        ),
    ]);
}

#[test]
fn bounds_of_the_period_and_the_step_are_refused_naming_the_field() {
    assert_refused(vec![
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, 1.0, 3_600_001),
                None,
            ),
            "traffic.duration",
            "at most 1h",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Bursts, 1.0, 1000),
                None,
            ),
            "traffic.period",
            "required for BURSTS",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                pb::SimulatedTraffic {
                    period: ms(100),
                    ..traffic(PbShape::Ramp, 1.0, 1000)
                },
                None,
            ),
            "traffic.period",
            "BURSTS and SAWTOOTH only",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                pb::SimulatedTraffic {
                    period: ms(2000),
                    ..traffic(PbShape::Sawtooth, 1.0, 1000)
                },
                None,
            ),
            "traffic.period",
            "at most 1s",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, 1.0, 20_000),
                Some(1),
            ),
            "step",
            "at most 10000",
        ),
        (
            request(
                vec![fixed(1, 1000)],
                traffic(PbShape::Steady, 1.0, 1000),
                None,
            )
            .with_step(prost_types::Duration {
                seconds: 0,
                nanos: 1_500_000,
            }),
            "step",
            "whole number of milliseconds",
        ),
    ]);
}

#[test]
fn bounds_of_the_limits_are_refused_naming_the_field() {
    assert_refused(vec![
        (
            request(
                vec![fixed(0, 1000)],
                traffic(PbShape::Steady, 1.0, 1000),
                None,
            ),
            "limits[0].fixed_window.limit",
            "at least 1",
        ),
        (
            request(
                vec![pb::Limit {
                    key: "k".into(),
                    ..fixed(1, 1000)
                }],
                traffic(PbShape::Steady, 1.0, 1000),
                None,
            ),
            "limits[0].key",
            "must be empty",
        ),
        (
            request(
                vec![pb::Limit::default()],
                traffic(PbShape::Steady, 1.0, 1000),
                None,
            ),
            "limits[0].algorithm",
            "is required",
        ),
        (
            request(
                vec![pb::Limit {
                    name: "no spaces".into(),
                    ..fixed(1, 1000)
                }],
                traffic(PbShape::Steady, 1.0, 1000),
                None,
            ),
            "limits[0].name",
            "ASCII letters",
        ),
    ]);
}

trait WithStep {
    fn with_step(self, step: prost_types::Duration) -> Self;
}

impl WithStep for pb::SimulateRequest {
    fn with_step(self, step: prost_types::Duration) -> Self {
        Self {
            step: Some(step),
            ..self
        }
    }
}

#[test]
fn the_largest_run_stays_within_its_bounds() {
    let answer = run(request(
        all_five(1000),
        traffic(PbShape::Steady, 100.0, 999_000),
        None,
    ));
    assert_eq!(answer.sent.len(), 9990);
    assert_eq!(answer.sent.iter().sum::<u32>(), 99_900);
}
