//! A `ShouldRateLimit` answer from the decisions: each descriptor's status
//! through its most restrictive limit, the overall code, upstream's and the
//! IETF's headers, and upstream's dynamic metadata. Pure: the time is
//! given, read once per request.

use smallvec::SmallVec;
use tracing::info;

use super::headers;
use super::metadata;
use super::plan::{Governed, Plan};
use super::settings::{EnvoySettings, LimitHeaderNames};
use crate::limit::{Decision, Micros, RetryAfter};
use crate::metrics;
use crate::pb::convert;
use crate::pb::envoy::config::core::v3::HeaderValue;
use crate::pb::envoy::service::ratelimit::v3 as rls;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit,
};
use crate::rules::{Period, Rule};
use crate::stats;

const MICROS_PER_SECOND: u64 = 1_000_000;

/// Each descriptor's answer, in order: most requests carry one or two.
pub(super) type Answers = SmallVec<[Answer; 2]>;

/// One descriptor's answer: its status, and which of its limits speaks for
/// it (the most restrictive; see [`most_restrictive`]).
pub(super) struct Answer {
    /// An index into [`Plan::parts`].
    pub(super) part: usize,
    /// The descriptor's status.
    pub(super) status: DescriptorStatus,
}

/// Each descriptor's answer, in order: the status of its most restrictive
/// limit, OVER_LIMIT if any of its limits is. `now` is the Unix time.
pub(super) fn answers(plan: &Plan, decisions: &[Decision], now: Micros) -> Answers {
    plan.descriptors
        .iter()
        .map(|range| {
            let parts = &plan.parts[range.clone()];
            let statuses: SmallVec<[DescriptorStatus; 2]> = parts
                .iter()
                .map(|part| status(part, decisions, now))
                .collect();
            let over = statuses.iter().any(|s| s.code() == Code::OverLimit);
            let chosen = most_restrictive(parts, &statuses, decisions);
            let mut status = statuses.into_iter().nth(chosen).unwrap_or_default();
            if over {
                status.code = Code::OverLimit as i32;
            }
            Answer {
                part: range.start + chosen,
                status,
            }
        })
        .collect()
}

/// The answer: OVER_LIMIT when a descriptor not in quota mode is over, or
/// when the request has quota descriptors and all are over (upstream's
/// rule), unless global shadow mode.
pub(super) fn response(
    plan: &Plan,
    request: &rls::RateLimitRequest,
    answers: Answers,
    decisions: &[Decision],
    settings: &EnvoySettings,
    now: Micros,
) -> rls::RateLimitResponse {
    // The limit that speaks for each descriptor.
    let speakers: SmallVec<[&Governed; 2]> = answers
        .iter()
        .map(|answer| &plan.parts[answer.part])
        .collect();
    let statuses: Vec<DescriptorStatus> = answers.into_iter().map(|answer| answer.status).collect();
    // Quota mode is a descriptor's setting: every limit of it shares it.
    let is_quota = |governed: &Governed| {
        governed
            .rule()
            .is_some_and(|rule| settings.in_quota_mode(rule))
    };
    let (mut limits_over, mut quotas, mut quotas_over) = (0, 0, 0);
    for (governed, status) in speakers.iter().zip(&statuses) {
        let over = status.code() == Code::OverLimit;
        if is_quota(governed) {
            quotas += 1;
            quotas_over += usize::from(over);
        } else {
            limits_over += usize::from(over);
        }
    }
    let over = limits_over > 0 || (quotas > 0 && quotas == quotas_over);
    log_shadow_denials(plan, decisions, settings);
    if over && settings.shadow_mode {
        stats::global_shadow_mode();
    }
    let overall = if over && !settings.shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let mut response = rls::RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        ..Default::default()
    };
    if settings.ratelimit_headers {
        response.response_headers_to_add = ietf_headers(&speakers, &response.statuses);
    }
    if let Some(names) = &settings.limit_headers {
        let upstream = upstream_headers(&speakers, &response.statuses, names, &is_quota, now);
        response.response_headers_to_add.extend(upstream);
    }
    if settings.dynamic_metadata {
        let passed = speakers
            .iter()
            .zip(&response.statuses)
            .filter(|(_, status)| status.code() != Code::OverLimit)
            .filter_map(|(governed, _)| governed.rule()?.descriptor().metadata.as_ref());
        response.dynamic_metadata = Some(metadata::response_metadata(request, passed));
    }
    response
}

/// Logs and counts every limit that would have denied but for shadow mode
/// (its own or global).
fn log_shadow_denials(plan: &Plan, decisions: &[Decision], settings: &EnvoySettings) {
    for governed in &plan.parts {
        if let Some(rule) = governed.rule()
            && governed.denies(decisions)
            && (rule.shadow() || settings.shadow_mode)
        {
            info!(rule = %rule.policy_id(), source = %rule.source(), "shadow mode: would have denied");
            metrics::shadow_decision(&plan.domain);
        }
    }
}

/// Which of one descriptor's limits (`parts`, with their `statuses`) is the
/// most restrictive, as an index into `parts`: of those that would deny,
/// the one back the latest; else the one with the fewest units left, ties
/// to the one back the latest; ties to the first. Without a limit, the
/// first unlimited part, else the first.
fn most_restrictive(
    parts: &[Governed],
    statuses: &[DescriptorStatus],
    decisions: &[Decision],
) -> usize {
    let reset =
        |status: &DescriptorStatus| status.duration_until_reset.map_or(0, |reset| reset.seconds);
    parts
        .iter()
        .zip(statuses)
        .enumerate()
        .filter(|(_, (_, status))| status.current_limit.is_some())
        .min_by_key(|(_, (part, status))| {
            let denies = part.denies(decisions);
            let remaining = if denies { 0 } else { status.limit_remaining };
            (!denies, remaining, std::cmp::Reverse(reset(status)))
        })
        .map(|(i, _)| i)
        .or_else(|| {
            parts
                .iter()
                .position(|part| matches!(part, Governed::Unlimited))
        })
        .unwrap_or(0)
}

/// One limit's status from its decision.
fn status(governed: &Governed, decisions: &[Decision], now: Micros) -> DescriptorStatus {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    match governed {
        Governed::Nothing => DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        },
        Governed::Unlimited => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        Governed::Blocked { rule, .. } => DescriptorStatus {
            code: code(governed.denies(decisions) && !rule.shadow()),
            current_limit: current_limit(rule),
            limit_remaining: 0,
            // A blocked rule keeps no state to ask the store about.
            duration_until_reset: rule
                .limit()
                .reported()
                .map(|(_, period)| whole_seconds(until_window_end(period, now))),
            quota: None,
        },
        Governed::Counted { rule, index, .. } => {
            let decision = &decisions[*index];
            // Denied: when this cost could pass again. Allowed: when the
            // limit is whole again.
            let reset = match (decision.is_allowed(), decision.retry_after()) {
                (false, RetryAfter::After(retry)) => retry,
                _ => decision.reset_after(),
            };
            DescriptorStatus {
                code: code(governed.denies(decisions) && !rule.shadow()),
                current_limit: current_limit(rule),
                limit_remaining: u32::try_from(decision.remaining()).unwrap_or(u32::MAX),
                duration_until_reset: Some(whole_seconds(reset)),
                quota: None,
            }
        }
    }
}

/// The limit a status reports: the rule's name, requests per unit and
/// unit (as upstream reports it, without the multiplier).
fn current_limit(rule: &Rule) -> Option<CurrentLimit> {
    let (requests_per_unit, period) = rule.limit().reported()?;
    Some(CurrentLimit {
        name: rule.name().unwrap_or_default().to_owned(),
        requests_per_unit,
        unit: rls::rate_limit_response::rate_limit::Unit::from(period.unit()) as i32,
    })
}

/// Rounded up to whole seconds: Envoy reads only the seconds, and a client
/// told "0" would retry too early.
fn whole_seconds(span: Micros) -> prost_types::Duration {
    let seconds = span.as_micros().div_ceil(MICROS_PER_SECOND);
    convert::micros_to_duration(Micros::from_micros(
        seconds.saturating_mul(MICROS_PER_SECOND),
    ))
}

/// Until the end of the current aligned window of `period`, at `now`.
fn until_window_end(period: Period, now: Micros) -> Micros {
    let window = Micros::from_secs(period.seconds());
    window * (now / window + 1) - now
}

/// Upstream's headers: limit, remaining and seconds to the end of the
/// unit, of the last descriptor over its limit (quota ones aside), else
/// of the first with the fewest left; each descriptor speaking through its
/// most restrictive limit.
fn upstream_headers(
    speakers: &[&Governed],
    statuses: &[DescriptorStatus],
    names: &LimitHeaderNames,
    is_quota: &dyn Fn(&Governed) -> bool,
    now: Micros,
) -> Vec<HeaderValue> {
    let limited = speakers
        .iter()
        .zip(statuses)
        .filter(|(_, status)| status.current_limit.is_some());
    let chosen = limited
        .clone()
        .filter(|(governed, status)| status.code() == Code::OverLimit && !is_quota(governed))
        .last()
        .or_else(|| limited.min_by_key(|(_, status)| status.limit_remaining));
    let Some((Some((requests_per_unit, period)), status)) = chosen
        .map(|(governed, status)| (governed.rule().and_then(|r| r.limit().reported()), status))
    else {
        return Vec::new();
    };
    let unit_seconds = period.unit().seconds();
    let now_seconds = now.as_secs();
    vec![
        header(&names.limit, requests_per_unit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(
            &names.reset,
            (unit_seconds - now_seconds % unit_seconds).to_string(),
        ),
    ]
}

/// `RateLimit-Policy` and `RateLimit` from the most restrictive
/// descriptor: the last one over its limit, else the first with the
/// fewest units left; each descriptor speaking through its most
/// restrictive limit.
fn ietf_headers(speakers: &[&Governed], statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let limited = speakers
        .iter()
        .zip(statuses)
        .filter_map(|(governed, status)| {
            let rule = governed.rule()?;
            Some((rule, rule.limit().reported()?, status))
        })
        .filter(|(_, _, status)| status.current_limit.is_some());
    let chosen = limited
        .clone()
        .rfind(|(_, _, status)| status.code() == Code::OverLimit)
        .or_else(|| limited.min_by_key(|(_, _, status)| status.limit_remaining));
    let Some((rule, (requests_per_unit, period), status)) = chosen else {
        return Vec::new();
    };
    let quota = headers::Quota {
        policy_id: rule.policy_id(),
        quota: u64::from(requests_per_unit),
        window_seconds: period.seconds(),
        remaining: u64::from(status.limit_remaining),
        reset_seconds: status
            .duration_until_reset
            .map_or(0, |reset| reset.seconds.max(0) as u64),
    };
    headers::header_fields(&quota)
        .into_iter()
        .map(|(key, value)| header(key, value))
        .collect()
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use crate::rules::{self, Rules};

    const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, name: per-second}\n      - {unit: minute, requests_per_unit: 5, name: per-minute}\n  - key: q\n    quota_mode: true\n    metadata: {tier: gold}\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: closed\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";

    /// 90.25 s after the epoch: 30 s into a minute, 0.75 s to a second.
    const NOW: Micros = Micros::from_micros(90_250_000);

    fn rules() -> Rules {
        rules::compile(&[("limits.yaml".into(), RULES.to_owned())]).unwrap()
    }

    fn request(keys: &[&str]) -> rls::RateLimitRequest {
        let descriptor = |key: &&str| RateLimitDescriptor {
            entries: vec![Entry {
                key: (*key).into(),
                value: "v".into(),
            }],
            ..Default::default()
        };
        rls::RateLimitRequest {
            domain: "d".into(),
            descriptors: keys.iter().map(descriptor).collect(),
            hits_addend: 0,
        }
    }

    fn allowed(remaining: u64, reset_seconds: u64) -> Decision {
        Decision::allowed(10, remaining, Micros::from_secs(reset_seconds))
    }

    fn denied(retry_seconds: u64) -> Decision {
        let retry_after = RetryAfter::After(Micros::from_secs(retry_seconds));
        Decision::denied(10, 0, Micros::from_secs(1), retry_after)
    }

    /// The answer to `keys` given each counted limit's decision.
    fn answer(
        keys: &[&str],
        decisions: &[Decision],
        settings: &EnvoySettings,
    ) -> rls::RateLimitResponse {
        let rules = rules();
        let request = request(keys);
        let plan = Plan::new(&rules, &request, settings, NOW).unwrap();
        assert_eq!(
            plan.requests.len(),
            decisions.len(),
            "one decision per counted limit"
        );
        let answers = answers(&plan, decisions, NOW);
        response(&plan, &request, answers, decisions, settings, NOW)
    }

    fn speaker(status: &DescriptorStatus) -> (&str, u32, i64) {
        let limit = status.current_limit.as_ref().expect("a limit speaks");
        let reset = status
            .duration_until_reset
            .map_or(-1, |reset| reset.seconds);
        (limit.name.as_str(), status.limit_remaining, reset)
    }

    #[test]
    fn the_fewest_left_speaks_for_a_descriptor_ties_to_the_latest_back() {
        let settings = EnvoySettings::default();
        let response = answer(&["a"], &[allowed(2, 1), allowed(4, 60)], &settings);
        assert_eq!(response.overall_code(), Code::Ok);
        assert_eq!(speaker(&response.statuses[0]), ("per-second", 2, 1));
        let response = answer(&["a"], &[allowed(2, 1), allowed(2, 30)], &settings);
        assert_eq!(speaker(&response.statuses[0]), ("per-minute", 2, 30));
    }

    #[test]
    fn a_denying_limit_speaks_the_latest_back_and_the_descriptor_is_over() {
        let settings = EnvoySettings::default();
        let response = answer(&["a"], &[denied(1), denied(50)], &settings);
        assert_eq!(response.overall_code(), Code::OverLimit);
        assert_eq!(response.statuses[0].code(), Code::OverLimit);
        assert_eq!(speaker(&response.statuses[0]), ("per-minute", 0, 50));
        let response = answer(&["a"], &[allowed(0, 1), denied(20)], &settings);
        assert_eq!(speaker(&response.statuses[0]), ("per-minute", 0, 20));
        // Global shadow mode decides the same, and answers OK.
        let shadow = EnvoySettings {
            shadow_mode: true,
            ..EnvoySettings::default()
        };
        let response = answer(&["a"], &[allowed(0, 1), denied(20)], &shadow);
        assert_eq!(response.overall_code(), Code::Ok);
        assert_eq!(response.statuses[0].code(), Code::OverLimit);
    }

    #[test]
    fn quota_descriptors_deny_only_when_every_one_is_over() {
        let decisions = [allowed(2, 1), allowed(4, 60), denied(9)];
        let every = EnvoySettings {
            quota_mode: true,
            ..EnvoySettings::default()
        };
        // `q` is a quota descriptor: alone in quota mode it is every one
        // of them; with QUOTA_MODE for all, `a` (allowed) is one too.
        for (settings, overall) in [
            (EnvoySettings::default(), Code::OverLimit),
            (every, Code::Ok),
        ] {
            let response = answer(&["a", "q"], &decisions, &settings);
            assert_eq!(response.overall_code(), overall, "{settings:?}");
        }
    }

    #[test]
    fn a_blocked_rule_is_over_until_the_end_of_its_window_by_the_given_time() {
        let response = answer(&["closed"], &[], &EnvoySettings::default());
        let status = &response.statuses[0];
        assert_eq!(status.code(), Code::OverLimit);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit()),
            (0, rls::rate_limit_response::rate_limit::Unit::Minute)
        );
        // 29.75 s to the end of the minute, rounded up.
        assert_eq!(speaker(status), ("", 0, 30));
    }

    #[test]
    fn upstream_headers_speak_for_the_last_over_else_the_fewest_left() {
        let settings = EnvoySettings {
            limit_headers: Some(LimitHeaderNames::short()),
            ..EnvoySettings::default()
        };
        let headers = |response: &rls::RateLimitResponse| -> Vec<(String, String)> {
            response
                .response_headers_to_add
                .iter()
                .map(|header| (header.key.clone(), header.value.clone()))
                .collect()
        };
        let pair = |key: &str, value: &str| (key.to_owned(), value.to_owned());
        let response = answer(
            &["a", "closed"],
            &[allowed(2, 1), allowed(4, 60)],
            &settings,
        );
        // The blocked rule: 0 of 0 left, reset at the end of its unit.
        assert_eq!(
            headers(&response),
            [pair("L", "0"), pair("R", "0"), pair("T", "30")]
        );
        let response = answer(&["a"], &[allowed(2, 1), allowed(4, 60)], &settings);
        assert_eq!(
            headers(&response),
            [pair("L", "3"), pair("R", "2"), pair("T", "1")]
        );
    }

    #[test]
    fn ietf_headers_name_the_most_restrictive_policy() {
        let settings = EnvoySettings {
            ratelimit_headers: true,
            ..EnvoySettings::default()
        };
        let response = answer(
            &["a", "q"],
            &[allowed(2, 1), allowed(4, 60), allowed(1, 3600)],
            &settings,
        );
        let values: Vec<&str> = response
            .response_headers_to_add
            .iter()
            .map(|header| header.value.as_str())
            .collect();
        assert_eq!(values, [r#""q";q=2;w=3600"#, r#""q";r=1;t=3600"#]);
    }

    #[test]
    fn metadata_comes_from_the_descriptors_that_passed() {
        let settings = EnvoySettings {
            dynamic_metadata: true,
            ..EnvoySettings::default()
        };
        let has_tier = |decision: Decision| {
            let response = answer(&["q"], &[decision], &settings);
            let metadata = response.dynamic_metadata.expect("metadata");
            metadata.fields.contains_key("metadata")
        };
        assert!(has_tier(allowed(1, 1)));
        assert!(!has_tier(denied(1)));
    }
}
