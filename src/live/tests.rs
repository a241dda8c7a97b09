//! The live recorder: counts land in their second and series, old seconds
//! leave the ring, series stay bounded, denials feed the sketch.

use std::time::Duration;

use super::*;
use crate::algorithm::{Algorithm, FixedWindow, Gcra};
use crate::limit::{CallerKey, Micros, RetryAfter};

fn request(key: &str, algorithm: Algorithm) -> LimitRequest {
    LimitRequest {
        key: CallerKey::new(key.into()).unwrap(),
        algorithm,
        cost: 1,
        shadow: false,
    }
}

fn fixed() -> Algorithm {
    Algorithm::FixedWindow(FixedWindow::new(5, Duration::from_secs(1)).unwrap())
}

fn allowed() -> Decision {
    Decision::allowed(5, 4, Micros::ZERO)
}

fn denied() -> Decision {
    Decision::denied(5, 0, Micros::ZERO, RetryAfter::After(Micros::ZERO))
}

const T: u64 = 1_700_000_000;

#[test]
fn decisions_are_counted_per_second_and_series() {
    let live = Live::new(FailurePolicy::FailOpen, vec!["main"]);
    let gcra = Algorithm::Gcra(Gcra::new(1, Duration::from_secs(1), 1).unwrap());
    for _ in 0..3 {
        live.record(
            T,
            Face::CheckLimit,
            Origin::Request,
            &request("a", fixed()),
            &allowed(),
        );
    }
    live.record(
        T,
        Face::CheckLimit,
        Origin::Request,
        &request("a", fixed()),
        &denied(),
    );
    live.record(
        T + 2,
        Face::CheckLimit,
        Origin::Policy("free"),
        &request("b", gcra),
        &denied(),
    );
    live.record(
        T + 2,
        Face::Envoy,
        Origin::Rule("web", "per_ip"),
        &request("c", fixed()),
        &allowed().marked_degraded(),
    );
    let view = live.view(T + 2, true);
    assert_eq!(view.times.len(), HISTORY_SECONDS);
    assert_eq!(view.times.last(), Some(&(T + 2)));
    let last = HISTORY_SECONDS - 1;
    let find = |origin: &str| view.series.iter().find(|s| s.origin == origin).unwrap();
    let request_series = find("request");
    assert_eq!(
        (
            request_series.api.as_str(),
            request_series.algorithm.as_str()
        ),
        ("check_limit", "fixed_window")
    );
    assert_eq!(request_series.allowed[last - 2], 3);
    assert_eq!(request_series.denied[last - 2], 1);
    assert_eq!(request_series.allowed[last], 0);
    let policy = find("policy");
    assert_eq!((policy.name.as_str(), policy.denied[last]), ("free", 1));
    let rule = find("rule");
    assert_eq!(
        (rule.name.as_str(), rule.degraded[last], rule.allowed[last]),
        ("web.per_ip", 1, 0)
    );
    assert_eq!(view.failure_policy, "FAIL_OPEN");
    assert!(view.store.serving);
    let keys: Vec<(&str, u64)> = view
        .top_denied_keys
        .iter()
        .map(|k| (k.key.as_str(), k.denied))
        .collect();
    assert_eq!(keys, [("a", 1), ("b", 1)]);
}

#[test]
fn seconds_older_than_the_history_leave_the_ring() {
    let live = Live::new(FailurePolicy::FailClosed, vec!["embedded"]);
    live.record(
        T,
        Face::CheckLimit,
        Origin::Request,
        &request("a", fixed()),
        &allowed(),
    );
    let later = T + HISTORY_SECONDS as u64;
    live.record(
        later,
        Face::CheckLimit,
        Origin::Request,
        &request("a", fixed()),
        &allowed(),
    );
    let view = live.view(later, false);
    assert_eq!(view.times[0], T + 1);
    assert_eq!(view.series[0].allowed.iter().sum::<u64>(), 1);
    assert_eq!(live.state().seconds.len(), 1, "the old second is dropped");
    assert!(!view.store.serving);
    assert_eq!(view.failure_policy, "FAIL_CLOSED");
}

#[test]
fn series_past_the_bound_count_together_as_other() {
    let live = Live::new(FailurePolicy::FailClosed, vec![]);
    for policy in 0..MAX_SERIES + 20 {
        let name = format!("p{policy}");
        live.record(
            T,
            Face::CheckLimit,
            Origin::Policy(&name),
            &request("a", fixed()),
            &allowed(),
        );
    }
    let view = live.view(T, true);
    assert_eq!(view.series.len(), MAX_SERIES);
    let other = view.series.iter().find(|s| s.name == OTHER).unwrap();
    assert_eq!(other.allowed[HISTORY_SECONDS - 1], 21);
}

#[test]
fn store_calls_and_quota_shares_are_shown() {
    let live = Live::new(FailurePolicy::Local, vec!["main"]);
    live.store_call(T, "main", Duration::from_millis(2), false);
    live.store_call(T, "main", Duration::from_millis(4), true);
    live.quota("d", "p", |q| q.subscribers += 2.0);
    live.quota("d", "p", |q| q.assigned_rate += 7.5);
    live.quota("d", "p", |q| q.subscribers -= 1.0);
    let view = live.view(T, true);
    let main = &view.store.latency[0];
    let last = HISTORY_SECONDS - 1;
    assert_eq!(
        (main.store.as_str(), main.calls[last], main.failed[last]),
        ("main", 2, 1)
    );
    assert!((main.mean_seconds[last] - 0.003).abs() < 1e-9);
    assert!((main.max_seconds[last] - 0.004).abs() < 1e-9);
    assert_eq!(view.quota.len(), 1);
    assert_eq!(view.quota[0].subscribers, 1);
    assert_eq!(view.quota[0].assigned_requests_per_second, 7.5);
}
