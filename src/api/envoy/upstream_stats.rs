//! envoyproxy/ratelimit's per-rule statistics, computed from our
//! decisions: for each descriptor a configured rule (or the limit Envoy
//! sent with it) governs, its hits split as upstream splits them into
//! within the limit, near it (above 80% of it, upstream's default
//! NEAR_LIMIT_RATIO) and over it (and of those, the ones the local
//! over-limit cache answered), plus the hits a shadow-mode rule would have
//! denied. Recorded into the descriptor's statistics ([`crate::stats`]),
//! which the plan found as upstream names them.

use super::plan::{Governed, Plan};
use super::response::Answer;
use crate::algorithm;
use crate::limit::Decision;
use crate::rules::Limit;
pub(crate) use crate::stats::RuleHits;

/// Upstream's NEAR_LIMIT_RATIO default.
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// Each matched descriptor's hits, under upstream's statistics names, as
/// its most restrictive limit saw them: every limit of a descriptor shares
/// its statistics names, and upstream counts a descriptor's hits once.
pub(super) fn record(plan: &Plan, answers: &[Answer], decisions: &[Decision]) {
    for (descriptor, answer) in answers.iter().enumerate() {
        // Nothing is worked out when nothing would record it.
        let Some(stats) = plan.stats.get(descriptor).and_then(Option::as_ref) else {
            continue;
        };
        let governed = &plan.parts[answer.part];
        let Some(rule) = governed.rule() else {
            continue;
        };
        let hits = match (governed, rule.limit()) {
            (Governed::Counted { index, hits, .. }, Limit::Counted(counted)) => {
                let spent =
                    plan.count_denied_hits && algorithm::counts_denied_hits(counted.algorithm());
                rule_hits(
                    u64::from(counted.requests_per_unit()),
                    *hits,
                    &decisions[*index],
                    rule.shadow(),
                    spent,
                )
            }
            (Governed::Blocked { cost, .. }, _) => RuleHits {
                total: *cost,
                over: *cost,
                shadow: if rule.shadow() { *cost } else { 0 },
                ..Default::default()
            },
            _ => continue,
        };
        stats.record(&hits);
    }
}

/// The hits of a descriptor that asked for `hits` under a limit of `limit`
/// and got `decision`. `counted_denied`: a denied descriptor spent its hits
/// (counting denied hits), so `decision.remaining()` is what is left after.
pub(crate) fn rule_hits(
    limit: u64,
    hits: u64,
    decision: &Decision,
    shadow: bool,
    counted_denied: bool,
) -> RuleHits {
    let near_threshold = (limit as f64 * NEAR_LIMIT_RATIO).floor() as u64;
    let mut counted = RuleHits {
        total: hits,
        ..RuleHits::default()
    };
    if decision.is_from_local_cache() {
        counted.over = hits;
        counted.over_local_cache = hits;
        counted.shadow = if shadow { hits } else { 0 };
        return counted;
    }
    if decision.is_allowed() {
        let after = limit.saturating_sub(decision.remaining());
        let before = after.saturating_sub(hits);
        counted.within = hits;
        if after > near_threshold {
            counted.near = after - near_threshold.max(before);
        }
        return counted;
    }
    // Denied: `remaining` is what was left before these hits, unless they
    // were spent anyway; then all that is known is that they went over.
    let before = limit.saturating_sub(decision.remaining());
    if counted_denied || before >= limit {
        counted.over = hits;
    } else {
        counted.over = (before + hits).saturating_sub(limit);
        counted.near = limit - near_threshold.max(before);
    }
    if shadow {
        counted.shadow = hits;
    }
    counted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Micros, RetryAfter};

    fn decision(allowed: bool, remaining: u64) -> Decision {
        if allowed {
            Decision::allowed(10, remaining, Micros::ZERO)
        } else {
            Decision::denied(10, remaining, Micros::ZERO, RetryAfter::After(Micros::ZERO))
        }
    }

    #[test]
    fn hits_split_as_upstream_splits_them() {
        // 7 used, 2 more: both within, one above the threshold of 8.
        let hits = rule_hits(10, 2, &decision(true, 1), false, false);
        assert_eq!(
            (hits.total, hits.within, hits.near, hits.over),
            (2, 2, 1, 0)
        );
        // 9 used, 3 more: 1 near (to 10), 2 over.
        let hits = rule_hits(10, 3, &decision(false, 1), false, false);
        assert_eq!((hits.within, hits.near, hits.over), (0, 1, 2));
        // Already full: every hit is over; in shadow mode, counted there too.
        let hits = rule_hits(10, 4, &decision(false, 0), true, false);
        assert_eq!((hits.over, hits.near, hits.shadow), (4, 0, 4));
    }
}
