//! Envoy's external rate limit service, `envoy.service.ratelimit.v3`
//! `RateLimitService/ShouldRateLimit`, over the same limiter and algorithms
//! as `CheckLimit`: each request descriptor is matched to a configured rule
//! (envoyproxy/ratelimit's format and matching), and all the descriptors of
//! one request are decided together, so a request denied by one descriptor
//! spends nothing on the others.
//!
//! A descriptor may carry several limits (the `rate_limits` extension, see
//! [`config_file`]): each is one more limit in that same all-or-nothing
//! decision, and the descriptor's one `DescriptorStatus` reports the most
//! restrictive of them (the one that denies, the latest back when several
//! do; else the one with the fewest units left, ties to the latest back),
//! `OVER_LIMIT` if any of them is over. The response headers and upstream's
//! per-rule statistics read each descriptor through that same limit, so a
//! descriptor's hits are counted once, as upstream counts them.

pub mod config_file;
pub mod headers;
pub mod metadata;
pub mod quota_policies;
pub mod rules;
pub mod source;
pub mod upstream_stats;
pub mod xds;

use std::ops::Range;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::{Request, Response, Status};
use tracing::{debug, info};

use self::rules::{Limit, Rule, Rules, Source, Unit};
use self::source::RulesHandle;
use crate::algorithm;
use crate::algorithm::registry::{Kind, Rate, WindowStart};
use crate::error::Error;
use crate::incoming;
use crate::limit::{self, CallerKey, Decision, LimitRequest, RetryAfter};
use crate::limiter::Limiter;
use crate::limiter::script::MAX_LIMITS_PER_SCRIPT;
use crate::load_shed::DecisionSlots;
use crate::metrics::{self, Api};
use crate::pb::convert;
use crate::pb::envoy::config::core::v3::HeaderValue;
use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::pb::envoy::service::ratelimit::v3 as rls;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit, rate_limit::Unit as RlsUnit,
};

/// Server-wide settings of the Envoy face.
#[derive(Debug, Clone, Default)]
pub struct EnvoySettings {
    /// Global shadow mode: decide, count and log, but always answer OK.
    pub shadow_mode: bool,
    /// Add the IETF `RateLimit-Policy` and `RateLimit` headers.
    pub ratelimit_headers: bool,
    /// Each descriptor counted on its own, denied hits too (upstream's
    /// default); otherwise a denied request spends nothing.
    pub count_denied_hits: bool,
    /// Every descriptor in quota mode (upstream's QUOTA_MODE).
    pub quota_mode: bool,
    /// Attach upstream's dynamic metadata to each response.
    pub dynamic_metadata: bool,
    /// Upstream's three headers (LIMIT_RESPONSE_HEADERS_ENABLED), by these
    /// names: limit, remaining, reset.
    pub limit_headers: Option<LimitHeaderNames>,
    /// The most one request may ask.
    pub bounds: RequestBounds,
}

impl EnvoySettings {
    /// Is `rule` in quota mode: its own `quota_mode`, or QUOTA_MODE for all?
    fn in_quota_mode(&self, rule: &Rule) -> bool {
        rule.quota || self.quota_mode
    }
}

/// The names of upstream's response headers.
#[derive(Debug, Clone)]
pub struct LimitHeaderNames {
    /// The header naming the limit (`RateLimit-Limit` by default).
    pub limit: String,
    /// The header naming what remains.
    pub remaining: String,
    /// The header naming the seconds to the reset.
    pub reset: String,
}

/// The most one `ShouldRateLimit` may ask, so that no single request can
/// hold a core or Redis for long: beyond any bound the request is refused
/// with `INVALID_ARGUMENT` naming it, before anything is matched or
/// written. Envoy sends a handful of descriptors of a few entries each.
#[derive(Debug, Clone, Copy)]
pub struct RequestBounds {
    /// Descriptors per request.
    pub max_descriptors: usize,
    /// Entries per descriptor.
    pub max_entries: usize,
    /// Of each entry's key and of its value.
    pub max_entry_bytes: usize,
}

impl RequestBounds {
    /// Upstream sends a handful; this leaves room and, one limit each,
    /// fits one script.
    pub const DEFAULT_MAX_DESCRIPTORS: usize = MAX_LIMITS_PER_SCRIPT;
    /// Entries per descriptor unless `--max-descriptor-entries` says.
    pub const DEFAULT_MAX_ENTRIES: usize = 16;
    /// Bytes per entry key or value unless `--max-descriptor-entry-bytes` says.
    pub const DEFAULT_MAX_ENTRY_BYTES: usize = 4096;

    fn check(&self, request: &rls::RateLimitRequest) -> Result<(), limit::InvalidArgument> {
        if request.descriptors.len() > self.max_descriptors {
            return Err(limit::InvalidArgument::new(
                "descriptors",
                format!(
                    "at most {} per request (--max-descriptors), got {}",
                    self.max_descriptors,
                    request.descriptors.len()
                ),
            ));
        }
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.len() > self.max_entries {
                return Err(limit::InvalidArgument::new(
                    format!("descriptors[{i}].entries"),
                    format!(
                        "at most {} per descriptor (--max-descriptor-entries), got {}",
                        self.max_entries,
                        descriptor.entries.len()
                    ),
                ));
            }
            for (j, entry) in descriptor.entries.iter().enumerate() {
                for (part, text) in [("key", &entry.key), ("value", &entry.value)] {
                    if text.len() > self.max_entry_bytes {
                        return Err(limit::InvalidArgument::new(
                            format!("descriptors[{i}].entries[{j}].{part}"),
                            format!(
                                "at most {} bytes (--max-descriptor-entry-bytes), got {}",
                                self.max_entry_bytes,
                                text.len()
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Default for RequestBounds {
    fn default() -> Self {
        Self {
            max_descriptors: Self::DEFAULT_MAX_DESCRIPTORS,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_entry_bytes: Self::DEFAULT_MAX_ENTRY_BYTES,
        }
    }
}

/// The `RateLimitService` implementation.
#[derive(Clone)]
pub struct EnvoyService {
    limiter: Limiter,
    rules: RulesHandle,
    settings: EnvoySettings,
    slots: DecisionSlots,
}

impl EnvoyService {
    /// The service, deciding on `limiter` by the rules `rules` holds now, each call holding one of `slots`.
    pub fn new(
        limiter: Limiter,
        rules: RulesHandle,
        settings: EnvoySettings,
        slots: DecisionSlots,
    ) -> Self {
        Self {
            limiter,
            rules,
            settings,
            slots,
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> rls::rate_limit_service_server::RateLimitServiceServer<Self> {
        rls::rate_limit_service_server::RateLimitServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let _in_flight = self.slots.enter(incoming::peer_ip(request.extensions()))?;
        let request = request.into_inner();
        let answered = self.decide(&request).await;
        metrics::upstream_request(match &answered {
            Ok(_) => None,
            Err(Error::Store(_)) => Some("redis_error"),
            Err(Error::InvalidArgument(_) | Error::NotFound(_)) => Some("service_error"),
        });
        Ok(Response::new(answered?))
    }
}

impl EnvoyService {
    async fn decide(
        &self,
        request: &rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, Error> {
        self.settings.bounds.check(request)?;
        let rules = self.rules.current();
        let plan = Plan::new(&rules, request, &self.settings)?;
        let decisions = if plan.requests.is_empty() {
            Vec::new()
        } else if plan.count_denied_hits {
            self.limiter.check_each(&plan.requests, None).await?
        } else {
            self.limiter.check_all(&plan.requests, None).await?
        };
        for (request, decision) in plan.requests.iter().zip(&decisions) {
            metrics::decision(Api::Envoy, request.algorithm.name(), decision);
        }
        let answers = plan.answers(&decisions);
        plan.record_upstream_stats(&answers, &decisions, plan.count_denied_hits);
        let response = plan.response(request, answers, &decisions, &self.settings);
        debug!(
            domain = %request.domain,
            overall = ?response.overall_code(),
            "decided"
        );
        Ok(response)
    }
}

/// What governs one limit of a descriptor.
enum Governed {
    /// No rule: OK, not counted.
    Nothing,
    Unlimited,
    /// `requests_per_unit: 0`: over the limit whenever it spends.
    Blocked {
        rule: Arc<Rule>,
        cost: u64,
    },
    /// Decided on the store as `requests[index]`, for `hits`.
    Counted {
        rule: Arc<Rule>,
        index: usize,
        hits: u64,
    },
}

/// One request's descriptors, matched and ready for the limiter.
struct Plan {
    /// The request's domain: configured, if any rule matched.
    domain: String,
    /// Counted as upstream counts: by `--envoy-count-denied-hits`, or
    /// because a rule it matched says `count_denied_hits`.
    count_denied_hits: bool,
    /// Every limit of every descriptor, descriptor after descriptor.
    parts: Vec<Governed>,
    /// Per request descriptor, in order: its limits in `parts`, at least
    /// one (a `Nothing` for a descriptor no rule governs).
    descriptors: Vec<Range<usize>>,
    requests: Vec<LimitRequest>,
}

/// One descriptor's answer: its status, and which of its limits speaks for
/// it (the most restrictive; see [`most_restrictive`]).
struct Answer {
    /// An index into [`Plan::parts`].
    part: usize,
    status: DescriptorStatus,
}

impl Plan {
    fn new(
        rules: &Rules,
        request: &rls::RateLimitRequest,
        settings: &EnvoySettings,
    ) -> Result<Self, limit::InvalidArgument> {
        let global_shadow = settings.shadow_mode;
        if request.domain.is_empty() {
            return Err(limit::InvalidArgument::new("domain", "must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(limit::InvalidArgument::new(
                "descriptors",
                "must not be empty",
            ));
        }
        let mut matched = Vec::with_capacity(request.descriptors.len());
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let field = |name: &str| format!("descriptors[{i}].{name}");
            let cost = limit::cost(Some(match descriptor.hits_addend {
                // Present wins, and 0 only looks.
                Some(hits) => hits,
                None => u64::from(request.hits_addend.max(1)),
            }))
            .map_err(|err| limit::InvalidArgument::new(field("hits_addend"), err.rule))?;
            let limits = match_descriptor(rules, &request.domain, descriptor, &field)?;
            matched.push((limits, cost));
        }
        // A rule named in another matched rule's `replaces` is dropped.
        let replaced: Vec<&str> = matched
            .iter()
            .flat_map(|(limits, _)| limits)
            .flat_map(|(rule, _)| rule.replaces.iter().map(String::as_str))
            .collect();
        let mut parts = Vec::with_capacity(matched.len());
        let mut descriptors = Vec::with_capacity(matched.len());
        let mut requests = Vec::new();
        for (limits, cost) in &matched {
            let first = parts.len();
            if limits.is_empty() {
                parts.push(Governed::Nothing);
            }
            for (rule, counter_key) in limits {
                if rule
                    .name
                    .as_deref()
                    .is_some_and(|name| replaced.contains(&name))
                {
                    parts.push(Governed::Nothing);
                    continue;
                }
                parts.push(match &rule.limit {
                    Limit::Unlimited => Governed::Unlimited,
                    Limit::Blocked => Governed::Blocked {
                        rule: rule.clone(),
                        cost: *cost,
                    },
                    Limit::Counted(algorithm) => {
                        // A quota descriptor does not deny the others' spending
                        // on its own: the response decides (see `response`).
                        let quota = settings.in_quota_mode(rule);
                        requests.push(LimitRequest {
                            key: CallerKey::envoy(counter_key.clone()),
                            algorithm: *algorithm,
                            cost: *cost,
                            shadow: rule.shadow || global_shadow || quota,
                        });
                        Governed::Counted {
                            rule: rule.clone(),
                            index: requests.len() - 1,
                            hits: *cost,
                        }
                    }
                });
            }
            descriptors.push(first..parts.len());
        }
        let count_denied_hits = settings.count_denied_hits
            || parts
                .iter()
                .any(|g| rule_of(g).is_some_and(|rule| rule.count_denied_hits));
        // A blocked limit that denies the request: the others only look,
        // so they spend nothing (unless each is counted on its own).
        let blocked = !count_denied_hits
            && parts.iter().any(|g| {
                matches!(g, Governed::Blocked { rule, cost }
                if *cost > 0 && !rule.shadow && !global_shadow && !settings.in_quota_mode(rule))
            });
        if blocked {
            for request in &mut requests {
                request.cost = 0;
            }
        }
        Ok(Self {
            domain: request.domain.clone(),
            count_denied_hits,
            parts,
            descriptors,
            requests,
        })
    }

    /// Each descriptor's answer, in order: the status of its most
    /// restrictive limit, OVER_LIMIT if any of its limits is.
    fn answers(&self, decisions: &[Decision]) -> Vec<Answer> {
        self.descriptors
            .iter()
            .map(|range| {
                let parts = &self.parts[range.clone()];
                let statuses: Vec<DescriptorStatus> =
                    parts.iter().map(|part| status(part, decisions)).collect();
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

    /// The answer: OVER_LIMIT when a descriptor not in quota mode is over,
    /// or when the request has quota descriptors and all are over
    /// (upstream's rule), unless global shadow mode.
    fn response(
        &self,
        request: &rls::RateLimitRequest,
        answers: Vec<Answer>,
        decisions: &[Decision],
        settings: &EnvoySettings,
    ) -> rls::RateLimitResponse {
        // The limit that speaks for each descriptor.
        let speakers: Vec<&Governed> = answers
            .iter()
            .map(|answer| &self.parts[answer.part])
            .collect();
        let statuses: Vec<DescriptorStatus> =
            answers.into_iter().map(|answer| answer.status).collect();
        // Quota mode is a descriptor's setting: every limit of it shares it.
        let is_quota = |governed: &Governed| {
            rule_of(governed).is_some_and(|rule| settings.in_quota_mode(rule))
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
        for governed in &self.parts {
            if let Some(rule) = rule_of(governed)
                && denied(governed, decisions)
                && (rule.shadow || settings.shadow_mode)
            {
                info!(rule = %rule.policy_id, source = %rule.source, "shadow mode: would have denied");
                metrics::shadow_decision(&self.domain);
            }
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
            response.response_headers_to_add.extend(upstream_headers(
                &speakers,
                &response.statuses,
                names,
                &is_quota,
            ));
        }
        if settings.dynamic_metadata {
            let passed = speakers
                .iter()
                .zip(&response.statuses)
                .filter(|(_, status)| status.code() != Code::OverLimit)
                .filter_map(|(governed, _)| rule_of(governed)?.metadata.as_ref());
            response.dynamic_metadata = Some(metadata::response_metadata(request, passed));
        }
        response
    }

    /// Each matched descriptor's hits, under upstream's statistics names,
    /// as its most restrictive limit saw them: every limit of a descriptor
    /// shares its statistics names, and upstream counts a descriptor's
    /// hits once.
    fn record_upstream_stats(
        &self,
        answers: &[Answer],
        decisions: &[Decision],
        counted_denied: bool,
    ) {
        for governed in answers.iter().map(|answer| &self.parts[answer.part]) {
            let Some(rule) = rule_of(governed) else {
                continue;
            };
            // Nothing is worked out when nothing would export it.
            let Some(counters) = metrics::UpstreamRuleCounters::get(
                &rule.upstream_counters.0,
                &self.domain,
                &rule.stats_key,
            ) else {
                continue;
            };
            let hits = match governed {
                Governed::Counted { index, hits, .. } => {
                    let spent = counted_denied
                        && matches!(&rule.limit, Limit::Counted(algorithm) if algorithm::counts_denied_hits(algorithm));
                    upstream_stats::rule_hits(
                        u64::from(rule.requests_per_unit),
                        *hits,
                        &decisions[*index],
                        rule.shadow,
                        spent,
                    )
                }
                Governed::Blocked { cost, .. } => upstream_stats::RuleHits {
                    total: *cost,
                    over: *cost,
                    shadow: if rule.shadow { *cost } else { 0 },
                    ..Default::default()
                },
                Governed::Nothing | Governed::Unlimited => continue,
            };
            counters.record(&hits);
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
            let denies = denied(part, decisions);
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

/// Upstream's headers: limit, remaining and seconds to the end of the
/// unit, of the last descriptor over its limit (quota ones aside), else
/// of the first with the fewest left; each descriptor speaking through its
/// most restrictive limit.
fn upstream_headers(
    speakers: &[&Governed],
    statuses: &[DescriptorStatus],
    names: &LimitHeaderNames,
    is_quota: &dyn Fn(&Governed) -> bool,
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
    let Some((Some(rule), status)) = chosen.map(|(governed, status)| (rule_of(governed), status))
    else {
        return Vec::new();
    };
    let unit_seconds = rule.unit.seconds();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    vec![
        header(&names.limit, rule.requests_per_unit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(
            &names.reset,
            (unit_seconds - now % unit_seconds).to_string(),
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
        .filter_map(|(governed, status)| Some((rule_of(governed)?, status)))
        .filter(|(_, status)| status.current_limit.is_some());
    let chosen = limited
        .clone()
        .rfind(|(_, status)| status.code() == Code::OverLimit)
        .or_else(|| limited.min_by_key(|(_, status)| status.limit_remaining));
    let Some((rule, status)) = chosen else {
        return Vec::new();
    };
    let quota = headers::Quota {
        policy_id: &rule.policy_id,
        quota: u64::from(rule.requests_per_unit),
        window_seconds: rule.window().as_secs(),
        remaining: u64::from(status.limit_remaining),
        reset_seconds: status
            .duration_until_reset
            .map_or(0, |reset| reset.seconds.max(0) as u64),
    };
    headers::header_fields(&quota)
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_owned(),
            value,
            ..Default::default()
        })
        .collect()
}

fn rule_of(governed: &Governed) -> Option<&Arc<Rule>> {
    match governed {
        Governed::Blocked { rule, .. } | Governed::Counted { rule, .. } => Some(rule),
        Governed::Nothing | Governed::Unlimited => None,
    }
}

/// Would this limit deny the request, shadow mode aside?
fn denied(governed: &Governed, decisions: &[Decision]) -> bool {
    match governed {
        Governed::Blocked { cost, .. } => *cost > 0,
        Governed::Counted { index, .. } => !decisions[*index].allowed,
        Governed::Nothing | Governed::Unlimited => false,
    }
}

/// The rules for one descriptor, each with the name of its counter: the
/// request's own limit override if it has one (only for a configured
/// domain, as upstream; it stands for all the configured limits), else the
/// configured rules. Empty when nothing governs it.
fn match_descriptor(
    rules: &Rules,
    domain: &str,
    descriptor: &RateLimitDescriptor,
    field: &dyn Fn(&str) -> String,
) -> Result<Vec<(Arc<Rule>, String)>, limit::InvalidArgument> {
    if !rules.has_domain(domain) {
        return Ok(Vec::new());
    }
    let entries: Vec<(String, String)> = descriptor
        .entries
        .iter()
        .map(|entry| (entry.key.clone(), entry.value.clone()))
        .collect();
    if let Some(limit) = &descriptor.limit {
        let rule = override_rule(limit.requests_per_unit, limit.unit).ok_or_else(|| {
            limit::InvalidArgument::new(
                field("limit.unit"),
                "must be one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR",
            )
        })?;
        let values: Vec<&str> = entries.iter().map(|(_, value)| value.as_str()).collect();
        let key = counter_key(domain, &entries, &values, &rule);
        return Ok(vec![(Arc::new(rule), key)]);
    }
    let Some(found) = rules.find(domain, &entries) else {
        return Ok(Vec::new());
    };
    // Two limits of one descriptor differ in window or algorithm (checked
    // at load), so their storage keys differ though these names may not.
    Ok(found
        .rules
        .iter()
        .map(|rule| {
            let key = counter_key(domain, &entries, &found.counter_values, rule);
            (rule.clone(), key)
        })
        .collect())
}

/// The rule for a limit Envoy sent with the descriptor: an aligned fixed
/// window, never in shadow mode, as upstream treats it.
fn override_rule(requests_per_unit: u32, unit: i32) -> Option<Rule> {
    // envoy.type.v3.RateLimitUnit, with WEEK = 7 as in the rls enum.
    let unit = match unit {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        7 => Unit::Week,
        _ => return None,
    };
    let mut rule = Rule {
        name: None,
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        limit: Limit::Blocked,
        replaces: Vec::new(),
        shadow: false,
        quota: false,
        metadata: None,
        stats_key: Vec::new(),
        upstream_counters: Default::default(),
        count_denied_hits: false,
        policy_id: "override".into(),
        source: Source {
            file: "request limit override".into(),
            line: 0,
        },
    };
    if requests_per_unit > 0 {
        // A unit is at most 365 days and the limit fits: always valid.
        let rate = Rate::new(u64::from(requests_per_unit), rule.window());
        let fixed = Kind::FixedWindow.build(rate, WindowStart::Epoch).ok()?;
        rule.limit = Limit::Counted(fixed);
    }
    Some(rule)
}

/// The counter's name: the domain, every entry's key and counted value, and
/// the window, each length-prefixed so that no two descriptors share a name
/// by accident of their characters.
fn counter_key(domain: &str, entries: &[(String, String)], values: &[&str], rule: &Rule) -> String {
    let mut key = String::new();
    let mut push = |part: &str| {
        key.push_str(&part.len().to_string());
        key.push(':');
        key.push_str(part);
        key.push('|');
    };
    push(domain);
    for ((entry_key, _), value) in entries.iter().zip(values) {
        push(entry_key);
        push(value);
    }
    key.push_str(&format!("w{}", rule.window().as_millis()));
    key
}

/// One limit's status from its decision.
fn status(governed: &Governed, decisions: &[Decision]) -> DescriptorStatus {
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
        Governed::Blocked { rule, .. } => {
            let over = denied(governed, decisions) && !rule.shadow;
            DescriptorStatus {
                code: if over { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: Some(current_limit(rule)),
                limit_remaining: 0,
                duration_until_reset: Some(whole_seconds(micros_to_window_end(rule))),
                quota: None,
            }
        }
        Governed::Counted { rule, index, .. } => {
            let decision = &decisions[*index];
            let over = denied(governed, decisions) && !rule.shadow;
            // Denied: when this cost could pass again. Allowed: when the
            // limit is whole again.
            let reset = match (decision.allowed, decision.retry_after) {
                (false, RetryAfter::After(retry)) => retry,
                _ => decision.reset_after,
            };
            DescriptorStatus {
                code: if over { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: Some(current_limit(rule)),
                limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(whole_seconds(reset)),
                quota: None,
            }
        }
    }
}

fn current_limit(rule: &Rule) -> CurrentLimit {
    let unit = match rule.unit {
        Unit::Second => RlsUnit::Second,
        Unit::Minute => RlsUnit::Minute,
        Unit::Hour => RlsUnit::Hour,
        Unit::Day => RlsUnit::Day,
        Unit::Week => RlsUnit::Week,
        Unit::Month => RlsUnit::Month,
        Unit::Year => RlsUnit::Year,
    };
    CurrentLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: rule.requests_per_unit,
        unit: unit as i32,
    }
}

/// Rounded up to whole seconds: Envoy reads only the seconds, and a client
/// told "0" would retry too early.
fn whole_seconds(micros: u64) -> prost_types::Duration {
    convert::micros_to_duration(micros.div_ceil(1_000_000).saturating_mul(1_000_000))
}

/// Until the end of the rule's current aligned window, by this machine's
/// clock (a blocked rule keeps no state to ask the store about).
fn micros_to_window_end(rule: &Rule) -> u64 {
    let window = rule.window().as_micros() as u64;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64);
    window - now % window
}
