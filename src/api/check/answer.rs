//! A `CheckLimit` answer from the decider's: one decision in the top-level
//! fields, or several with a status each and the overall answer spoken by
//! the most restrictive.

use crate::decider::{Answer, Label, Several};
use crate::limit::{Decision, Micros, RetryAfter};
use crate::pb::convert::micros_to_duration;
use crate::pb::ratelimitd::v1 as pb;

/// The protobuf form of a decision.
pub(crate) fn response(decision: &Decision) -> pb::CheckLimitResponse {
    let (retry_after, cost_exceeds_limit) = retry(decision);
    pb::CheckLimitResponse {
        allowed: decision.is_allowed(),
        limit: decision.limit(),
        remaining: decision.remaining(),
        reset_after: Some(micros_to_duration(decision.reset_after())),
        retry_after,
        cost_exceeds_limit,
        degraded: decision.is_degraded(),
        limits: Vec::new(),
        most_restrictive: 0,
    }
}

/// The protobuf form of an answer: one decision in the top-level fields,
/// or several with a status each.
pub(crate) fn answer(answer: &Answer) -> pb::CheckLimitResponse {
    match answer {
        Answer::One(decision) => response(decision),
        Answer::Several(several) => several_response(several),
    }
}

/// The answer to several limits decided together: one status each, and
/// the request's overall decision (see the proto's `CheckLimitResponse`),
/// the top-level fields speaking for the most restrictive limit.
fn several_response(several: &Several) -> pb::CheckLimitResponse {
    let allowed = several.is_allowed();
    let degraded = several.is_degraded();
    let chosen = several
        .most_restrictive()
        .and_then(|i| Some((i, several.decisions.get(i)?)));
    let Some((most_restrictive, top)) = chosen else {
        // No limits: `question` never builds such a request.
        return pb::CheckLimitResponse {
            allowed,
            degraded,
            ..Default::default()
        };
    };
    let (retry_after, cost_exceeds_limit) = if allowed {
        (Some(micros_to_duration(Micros::ZERO)), false)
    } else {
        retry(top)
    };
    let limits = several
        .labels
        .iter()
        .zip(&several.decisions)
        .map(|(label, decision)| status(label, decision))
        .collect();
    // The top-level fields speak for the most restrictive, but for the
    // request's own decision.
    pb::CheckLimitResponse {
        allowed,
        retry_after,
        cost_exceeds_limit,
        degraded,
        limits,
        most_restrictive: most_restrictive as u32,
        ..response(top)
    }
}

/// One limit's status among several: its decision, as [`response`]
/// states it, with its label.
pub(crate) fn status(label: &Label, decision: &Decision) -> pb::LimitStatus {
    let one = response(decision);
    pb::LimitStatus {
        name: label.name.clone(),
        shadow: label.shadow,
        allowed: one.allowed,
        limit: one.limit,
        remaining: one.remaining,
        reset_after: one.reset_after,
        retry_after: one.retry_after,
        cost_exceeds_limit: one.cost_exceeds_limit,
    }
}

/// A decision's `retry_after` and `cost_exceeds_limit`.
fn retry(decision: &Decision) -> (Option<prost_types::Duration>, bool) {
    match decision.retry_after() {
        RetryAfter::After(micros) => (Some(micros_to_duration(micros)), false),
        RetryAfter::Never => (None, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: RetryAfter = RetryAfter::After(Micros::ZERO);

    fn secs(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    #[test]
    fn never_is_an_unset_retry_after_and_a_flag() {
        let response = response(&Decision::denied(
            1,
            1,
            Micros::from_micros(1_500_000),
            RetryAfter::Never,
        ));
        assert!(response.cost_exceeds_limit);
        assert_eq!(response.retry_after, None);
        assert_eq!(response.reset_after, secs(1, 500_000_000));
    }

    /// An allowed decision (`retry` is then `After(0)`) or a denied one,
    /// whole again in `reset_us` microseconds.
    fn decided(allowed: bool, remaining: u64, reset_us: u64, retry: RetryAfter) -> Decision {
        let reset = Micros::from_micros(reset_us);
        if allowed {
            assert_eq!(retry, NOW, "an allowed decision waits for nothing");
            Decision::allowed(10, remaining, reset)
        } else {
            Decision::denied(10, remaining, reset, retry)
        }
    }

    /// The answer to limits labelled `labels` decided `decisions`.
    fn several_response(labels: &[Label], decisions: &[Decision]) -> pb::CheckLimitResponse {
        super::several_response(&Several {
            labels: labels.to_vec(),
            decisions: decisions.to_vec(),
        })
    }

    fn labels(shadows: &[bool]) -> Vec<Label> {
        shadows
            .iter()
            .enumerate()
            .map(|(i, &shadow)| Label {
                name: format!("l{i}"),
                shadow,
            })
            .collect()
    }

    #[test]
    fn allowed_the_fewest_left_speaks_ties_to_the_longest_reset() {
        let ok = NOW;
        let answer = several_response(
            &labels(&[false, false, false]),
            &[
                decided(true, 3, 1_000_000, ok),
                decided(true, 2, 1_000_000, ok),
                decided(true, 2, 5_000_000, ok),
            ],
        );
        assert!(answer.allowed);
        assert_eq!(answer.most_restrictive, 2);
        assert_eq!((answer.remaining, answer.reset_after), (2, secs(5, 0)));
        assert_eq!(answer.retry_after, secs(0, 0));
    }

    #[test]
    fn denied_the_longest_wait_speaks_and_never_is_longest() {
        let wait = |seconds: u64| RetryAfter::After(Micros::from_secs(seconds));
        let answer = several_response(
            &labels(&[false, false, false]),
            &[
                decided(false, 0, 9_000_000, wait(2)),
                decided(true, 0, 1_000_000, wait(0)),
                decided(false, 0, 1_000_000, wait(7)),
            ],
        );
        assert!(!answer.allowed);
        assert_eq!(answer.most_restrictive, 2, "an allowing limit never speaks");
        assert_eq!(answer.retry_after, secs(7, 0));
        let never = several_response(
            &labels(&[false, false]),
            &[
                decided(false, 0, 1, wait(3)),
                decided(false, 5, 1, RetryAfter::Never),
            ],
        );
        assert_eq!(never.most_restrictive, 1);
        assert!(never.cost_exceeds_limit);
        assert_eq!(never.retry_after, None);
    }

    #[test]
    fn a_shadow_limit_neither_denies_nor_speaks() {
        let answer = several_response(
            &labels(&[true, false]),
            &[
                decided(false, 0, 1, RetryAfter::After(Micros::from_secs(5))),
                decided(true, 4, 1, NOW),
            ],
        );
        assert!(answer.allowed);
        assert_eq!(answer.most_restrictive, 1);
        assert!(answer.limits[0].shadow && !answer.limits[0].allowed);
        // All in shadow: the statuses still name the most restrictive.
        let all = several_response(
            &labels(&[true, true]),
            &[
                decided(true, 4, 1, NOW),
                decided(false, 0, 1, RetryAfter::After(Micros::from_secs(5))),
            ],
        );
        assert!(all.allowed, "shadow limits never deny");
        assert_eq!(all.most_restrictive, 1);
    }
}
