//! One `ShouldRateLimit` request matched against the rules in force: for
//! each descriptor, the limits that govern it (the configured rules, or the
//! limit Envoy sent with it), less those another matched rule `replaces`,
//! and the limit requests the limiter decides for the counted ones, their
//! counters named in the layout in force (`--envoy-key-layout`).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use smallvec::SmallVec;

use super::settings::{EnvoySettings, KeyLayout};
use crate::algorithm::{Algorithm, LimitRequest};
use crate::limit::{self, CallerKey, Decision, InvalidArgument, Micros};
use crate::limiter::Route;
use crate::pb::convert;
use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::rules::{Counted, DescriptorSettings, Limit, Period, Rule, Rules};
use crate::spec::Unit;
use crate::stats::{self, RuleStats};

/// What governs one limit of a descriptor.
pub(super) enum Governed {
    /// No rule: OK, not counted.
    Nothing,
    /// An `unlimited` rule: OK, not counted.
    Unlimited,
    /// `requests_per_unit: 0`: over the limit whenever it spends.
    Blocked {
        /// The blocked rule.
        rule: Arc<Rule>,
        /// What the descriptor asked to spend.
        cost: u64,
    },
    /// Decided on the store as `requests[index]`, for `hits`.
    Counted {
        /// The counted rule.
        rule: Arc<Rule>,
        /// Its request in [`Plan::requests`].
        index: usize,
        /// What the descriptor asked to spend.
        hits: u64,
    },
}

impl Governed {
    /// The rule, for a limit that has one that limits.
    pub(super) fn rule(&self) -> Option<&Arc<Rule>> {
        match self {
            Self::Blocked { rule, .. } | Self::Counted { rule, .. } => Some(rule),
            Self::Nothing | Self::Unlimited => None,
        }
    }

    /// Would this limit deny the request, shadow mode aside?
    pub(super) fn denies(&self, decisions: &[Decision]) -> bool {
        match self {
            Self::Blocked { cost, .. } => *cost > 0,
            Self::Counted { index, .. } => !decisions[*index].is_allowed(),
            Self::Nothing | Self::Unlimited => false,
        }
    }
}

/// One request's descriptors, matched and ready for the limiter.
pub(super) struct Plan {
    /// The request's domain.
    pub(super) domain: String,
    /// Counted as upstream counts: by `--envoy-count-denied-hits`, or
    /// because a rule it matched says `count_denied_hits`.
    pub(super) count_denied_hits: bool,
    /// Every limit of every descriptor, descriptor after descriptor.
    pub(super) parts: SmallVec<[Governed; 2]>,
    /// Per request descriptor, in order: its limits in `parts`, at least
    /// one (a `Nothing` for a descriptor no rule governs).
    pub(super) descriptors: SmallVec<[Range<usize>; 2]>,
    /// What the limiter decides: one per counted limit.
    pub(super) requests: SmallVec<[LimitRequest; 2]>,
    /// Per request descriptor, in order: upstream's statistics for it,
    /// when statistics are on and a limit governs it.
    pub(super) stats: Vec<Option<Arc<RuleStats>>>,
    /// The store of each of `requests`: the per-second one for a rule
    /// whose unit is second (whatever its multiplier), as upstream's
    /// REDIS_PERSECOND routes them.
    pub(super) routes: SmallVec<[Route; 2]>,
}

/// A descriptor's governing rules (the configured ones borrowed as they
/// are), what its counters' names start with, and what it spends.
struct Matched<'r> {
    rules: Cow<'r, [Arc<Rule>]>,
    names: CounterNames,
    cost: u64,
    stats: Option<Arc<RuleStats>>,
}

/// What the names of a descriptor's counters start with (the window
/// follows).
#[derive(Default)]
struct CounterNames {
    /// In ratelimitd's layout.
    ours: String,
    /// In envoyproxy/ratelimit's (`<domain>_<key>_<value>_`), with
    /// `--envoy-key-layout upstream`.
    upstream: Option<String>,
}

impl Plan {
    /// Matches every descriptor of `request` against `rules`, at `now`
    /// (the window a counter named by its window counts in).
    pub(super) fn new(
        rules: &Rules,
        request: &RateLimitRequest,
        settings: &EnvoySettings,
        now: Micros,
    ) -> Result<Self, InvalidArgument> {
        if request.domain.is_empty() {
            return Err(InvalidArgument::new("domain", "must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(InvalidArgument::new("descriptors", "must not be empty"));
        }
        let mut matched: SmallVec<[Matched<'_>; 2]> =
            SmallVec::with_capacity(request.descriptors.len());
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let field = |name: &str| format!("descriptors[{i}].{name}");
            let cost = limit::cost(Some(match descriptor.hits_addend {
                // Present wins, and 0 only looks.
                Some(hits) => hits,
                None => u64::from(request.hits_addend.max(1)),
            }))
            .map_err(|err| InvalidArgument::new(field("hits_addend"), err.rule))?;
            matched.push(match_descriptor(
                rules,
                &request.domain,
                descriptor,
                cost,
                settings.key_layout,
                &field,
            )?);
        }
        let mut plan = Self {
            domain: request.domain.clone(),
            count_denied_hits: false,
            parts: SmallVec::with_capacity(matched.len()),
            descriptors: SmallVec::with_capacity(matched.len()),
            requests: SmallVec::new(),
            stats: Vec::new(),
            routes: SmallVec::new(),
        };
        plan.govern(&matched, settings, now);
        // Without statistics every entry would be `None`: nothing to keep.
        if stats::enabled() {
            plan.stats = matched.into_iter().map(|matched| matched.stats).collect();
        }
        Ok(plan)
    }

    /// Each matched limit's part, and a request for each counted one. A
    /// rule named in another matched rule's `replaces` is dropped; a
    /// blocked limit that denies the request makes the others only look,
    /// so they spend nothing (unless each is counted on its own).
    fn govern(&mut self, matched: &[Matched<'_>], settings: &EnvoySettings, now: Micros) {
        let replaced: Vec<&str> = matched
            .iter()
            .flat_map(|matched| matched.rules.iter())
            .flat_map(|rule| rule.replaces().iter().map(String::as_str))
            .collect();
        for matched in matched {
            let first = self.parts.len();
            if matched.rules.is_empty() {
                self.parts.push(Governed::Nothing);
            }
            for rule in matched.rules.iter() {
                let part = if rule.name().is_some_and(|name| replaced.contains(&name)) {
                    Governed::Nothing
                } else {
                    self.part(rule, matched, settings, now)
                };
                self.parts.push(part);
            }
            self.descriptors.push(first..self.parts.len());
        }
        self.count_denied_hits = settings.count_denied_hits
            || self
                .parts
                .iter()
                .any(|part| part.rule().is_some_and(|rule| rule.count_denied_hits()));
        let blocked = !self.count_denied_hits
            && self.parts.iter().any(|part| {
                matches!(part, Governed::Blocked { rule, cost }
                    if *cost > 0 && !rule.shadow() && !settings.shadow_mode
                        && !settings.in_quota_mode(rule))
            });
        if blocked {
            for request in &mut self.requests {
                request.cost = 0;
            }
        }
    }

    /// The part of one of `matched`'s rules that stands, with its request
    /// if it counts.
    fn part(
        &mut self,
        rule: &Arc<Rule>,
        matched: &Matched<'_>,
        settings: &EnvoySettings,
        now: Micros,
    ) -> Governed {
        let (rule, cost) = (rule.clone(), matched.cost);
        let counted = match rule.limit() {
            Limit::Unlimited => return Governed::Unlimited,
            Limit::Blocked(_) => return Governed::Blocked { rule, cost },
            Limit::Counted(counted) => counted,
        };
        let (key, algorithm) = counter(matched, counted, now);
        // A quota descriptor does not deny the others' spending on its
        // own: the response decides.
        let quota = settings.in_quota_mode(&rule);
        self.requests.push(LimitRequest {
            key,
            algorithm,
            cost,
            shadow: rule.shadow() || settings.shadow_mode || quota,
        });
        self.routes.push(match counted.period().unit() {
            Unit::Second => Route::PerSecond,
            _ => Route::Main,
        });
        Governed::Counted {
            rule,
            index: self.requests.len() - 1,
            hits: cost,
        }
    }
}

/// The counter of one counted limit of `matched`, and the algorithm that
/// counts it. In envoyproxy/ratelimit's layout, a limit upstream's
/// configuration could say (alone on its descriptor, a fixed window of one
/// unit) is named as upstream names it, with the start of the window `now`
/// is in (in seconds, on this instance's clock, as upstream's), and
/// counted by that name; every other limit keeps ratelimitd's.
fn counter(matched: &Matched<'_>, counted: &Counted, now: Micros) -> (CallerKey, Algorithm) {
    let period = counted.period();
    if let (Some(prefix), Algorithm::FixedWindow(fixed), [_]) = (
        &matched.names.upstream,
        counted.algorithm(),
        &*matched.rules,
    ) && fixed.is_aligned()
        && period == Period::of(period.unit())
    {
        let unit = period.seconds();
        let start = now.as_secs() / unit * unit;
        return (
            CallerKey::upstream(format!("{prefix}{start}")),
            Algorithm::FixedWindow(fixed.aligned_by_name()),
        );
    }
    // Two limits of one descriptor differ in window or algorithm (checked
    // at load), so their storage keys differ though these names may not.
    let mut digits = itoa::Buffer::new();
    let window = digits.format(period.window().as_millis());
    let ours = &matched.names.ours;
    let mut name = String::with_capacity(ours.len() + 1 + window.len());
    name.push_str(ours);
    name.push('w');
    name.push_str(window);
    (CallerKey::envoy(name), *counted.algorithm())
}

/// The rules for one descriptor spending `cost`, what the names of their
/// counters start with (in `layout` too), and upstream's statistics for
/// it: the request's own limit override if it has one (only for a
/// configured domain, as upstream; it stands for all the configured
/// limits), else the configured rules. No rules when nothing governs it.
fn match_descriptor<'r>(
    rules: &'r Rules,
    domain: &str,
    descriptor: &'r RateLimitDescriptor,
    cost: u64,
    layout: KeyLayout,
    field: &dyn Fn(&str) -> String,
) -> Result<Matched<'r>, InvalidArgument> {
    let nothing = Matched {
        rules: Cow::Borrowed(&[]),
        names: CounterNames::default(),
        cost,
        stats: None,
    };
    if !rules.has_domain(domain) {
        stats::unknown_domain(domain);
        return Ok(nothing);
    }
    let entries: SmallVec<[(&str, &str); 4]> = descriptor
        .entries
        .iter()
        .map(|entry| (entry.key.as_str(), entry.value.as_str()))
        .collect();
    if let Some(limit) = &descriptor.limit {
        // A unit is at most 365 days and the limit fits: any known unit
        // makes a valid rule.
        let rule = convert::unit_from_proto(limit.unit)
            .and_then(|unit| Rule::overriding(limit.requests_per_unit, unit).ok())
            .ok_or_else(|| {
                InvalidArgument::new(
                    field("limit.unit"),
                    "must be one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR",
                )
            })?;
        let values: Vec<&str> = entries.iter().map(|&(_, value)| value).collect();
        let stats = stats::enabled()
            .then(|| stats::request_rule(&override_stats_key(domain, &entries)))
            .flatten();
        return Ok(Matched {
            rules: Cow::Owned(vec![Arc::new(rule)]),
            names: counter_names(domain, &entries, &values, layout),
            cost,
            stats,
        });
    }
    let Some(found) = rules.find(domain, &entries) else {
        return Ok(nothing);
    };
    let stats = found
        .rules
        .first()
        .and_then(|rule| rule_stats(rules, domain, &entries, rule.descriptor()));
    Ok(Matched {
        rules: Cow::Borrowed(found.rules),
        names: counter_names(domain, &entries, &found.counter_values, layout),
        cost,
        stats,
    })
}

/// Upstream's statistics for a descriptor of `entries` that `settings`'
/// descriptor governs: its own, unless upstream names them after the
/// request's values (`detailed_metric`, `value_to_metric`).
fn rule_stats(
    rules: &Rules,
    domain: &str,
    entries: &[(&str, &str)],
    settings: &DescriptorSettings,
) -> Option<Arc<RuleStats>> {
    if !stats::enabled() {
        return None;
    }
    if !settings.naming.per_request() {
        return settings.upstream_stats(domain).cloned();
    }
    let key = rules.request_stats_key(domain, entries, settings.naming.detailed)?;
    if key == settings.static_key(domain) {
        return settings.upstream_stats(domain).cloned();
    }
    stats::request_rule(&key)
}

/// Upstream's statistics key for a descriptor that carries its own limit:
/// the domain, then each entry's `key` or `key_value`.
fn override_stats_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = domain.to_owned();
    for (entry_key, value) in entries {
        key.push('.');
        key.push_str(entry_key);
        if !value.is_empty() {
            key.push('_');
            key.push_str(value);
        }
    }
    key
}

/// What the names of a descriptor's counters start with, in ratelimitd's
/// layout and, if `layout` says so, in upstream's.
fn counter_names(
    domain: &str,
    entries: &[(&str, &str)],
    values: &[&str],
    layout: KeyLayout,
) -> CounterNames {
    CounterNames {
        ours: counter_prefix(domain, entries, values),
        upstream: (layout == KeyLayout::Upstream)
            .then(|| upstream_counter_prefix(domain, entries, values)),
    }
}

/// envoyproxy/ratelimit's: the domain, `_`, then each entry's key, `_`,
/// its counted value, `_` (its window's start follows). Upstream's own
/// text, `_` in keys and values included, so two descriptors whose parts
/// run together as upstream's do share a counter as they do upstream.
fn upstream_counter_prefix(domain: &str, entries: &[(&str, &str)], values: &[&str]) -> String {
    let mut name = String::with_capacity(domain.len() + 1);
    name.push_str(domain);
    name.push('_');
    for ((key, _), value) in entries.iter().zip(values) {
        name.push_str(key);
        name.push('_');
        name.push_str(value);
        name.push('_');
    }
    name
}

/// What the names of a descriptor's counters start with (the window
/// follows): the domain, and every entry's key and counted value, each
/// length-prefixed so that no two descriptors share a name by accident of
/// their characters.
fn counter_prefix(domain: &str, entries: &[(&str, &str)], values: &[&str]) -> String {
    let parts = || {
        std::iter::once(domain).chain(
            entries
                .iter()
                .zip(values)
                .flat_map(|(&(entry_key, _), &value)| [entry_key, value]),
        )
    };
    // Each part, its length (at most 20 digits) and two marks: one
    // allocation.
    let room = parts().map(|part| part.len() + 22).sum::<usize>();
    let mut key = String::with_capacity(room);
    let mut digits = itoa::Buffer::new();
    for part in parts() {
        key.push_str(digits.format(part.len()));
        key.push(':');
        key.push_str(part);
        key.push('|');
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };

    const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 3}\n      - {unit: minute, requests_per_unit: 5, name: a-minute}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 9, replaces: [{name: a-minute}]}\n  - key: closed\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: open\n    rate_limit: {unlimited: true}\n";

    /// `request` matched against [`RULES`].
    fn plan(request: &RateLimitRequest, settings: &EnvoySettings) -> Result<Plan, InvalidArgument> {
        let rules = crate::rules::compile(&[("limits.yaml".into(), RULES.to_owned())]).unwrap();
        Plan::new(&rules, request, settings, Micros::from_secs(3_600_030))
    }

    /// A request of domain `d` with one descriptor of one entry per pair.
    fn request(pairs: &[(&str, &str)]) -> RateLimitRequest {
        let descriptor = |&(key, value): &(&str, &str)| RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        };
        RateLimitRequest {
            domain: "d".into(),
            descriptors: pairs.iter().map(descriptor).collect(),
            hits_addend: 0,
        }
    }

    #[test]
    fn each_descriptor_gets_its_parts_and_replaced_rules_drop_out() {
        let request = request(&[("a", "1"), ("b", "2"), ("nothing", "3"), ("open", "4")]);
        let plan = plan(&request, &EnvoySettings::default()).unwrap();
        assert_eq!(&plan.descriptors[..], [0..2, 2..3, 3..4, 4..5]);
        let kinds: Vec<&str> = plan
            .parts
            .iter()
            .map(|part| match part {
                Governed::Nothing => "nothing",
                Governed::Unlimited => "unlimited",
                Governed::Blocked { .. } => "blocked",
                Governed::Counted { .. } => "counted",
            })
            .collect();
        assert_eq!(
            kinds,
            ["counted", "nothing", "counted", "nothing", "unlimited"]
        );
        let keys: Vec<&str> = plan.requests.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["1:d|1:a|1:1|w1000", "1:d|1:b|1:2|w3600000"]);
        assert!(plan.requests.iter().all(|r| r.cost == 1 && !r.shadow));
    }

    #[test]
    fn upstreams_layout_names_what_upstream_could_say_as_upstream_does() {
        let upstream = EnvoySettings {
            key_layout: KeyLayout::Upstream,
            ..EnvoySettings::default()
        };
        let by_name = |request: &LimitRequest| {
            matches!(request.algorithm, Algorithm::FixedWindow(w)
                if w.mode() == crate::algorithm::FixedWindowMode::AlignedByName)
        };
        let mut request = request(&[("a", "1"), ("b", "2")]);
        let both = plan(&request, &upstream).unwrap();
        // `a` has two limits, which upstream's configuration cannot say:
        // ratelimitd's names.
        assert_eq!(
            both.requests[0].key,
            CallerKey::envoy("1:d|1:a|1:1|w1000".into())
        );
        assert!(!by_name(&both.requests[0]));
        // `b`'s one hourly limit: upstream's name, with the start of the
        // hour, counted by that name.
        assert_eq!(
            both.requests[1].key,
            CallerKey::upstream("d_b_2_3600000".into())
        );
        assert!(by_name(&both.requests[1]));
        // Envoy's own limit for a descriptor is named as upstream names it.
        request.descriptors.truncate(1);
        request.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 7,
            unit: 7,
        });
        let weekly = plan(&request, &upstream).unwrap();
        assert_eq!(
            weekly.requests[0].key,
            CallerKey::upstream("d_a_1_3024000".into())
        );
    }

    #[test]
    fn a_denying_blocked_rule_makes_the_others_only_look() {
        let request = request(&[("a", "1"), ("closed", "x")]);
        let looked = plan(&request, &EnvoySettings::default()).unwrap();
        assert!(looked.requests.iter().all(|r| r.cost == 0));
        assert!(looked.parts[2].denies(&[]));
        // Counted each on its own, upstream's way, the others still spend.
        let each = EnvoySettings {
            count_denied_hits: true,
            ..EnvoySettings::default()
        };
        let spent = plan(&request, &each).unwrap();
        assert!(spent.count_denied_hits);
        assert!(spent.requests.iter().all(|r| r.cost == 1));
    }

    #[test]
    fn an_override_stands_for_the_configured_limits_on_an_aligned_window() {
        let mut request = request(&[("a", "1")]);
        request.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 7,
            unit: 7,
        });
        let weekly = plan(&request, &EnvoySettings::default()).unwrap();
        assert_eq!(weekly.requests.len(), 1);
        assert_eq!(weekly.requests[0].key.as_str(), "1:d|1:a|1:1|w604800000");
        assert_eq!(weekly.requests[0].algorithm.limit(), 7);
        request.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 7,
            unit: 0,
        });
        let err = plan(&request, &EnvoySettings::default()).err().unwrap();
        assert_eq!(err.field, "descriptors[0].limit.unit");
    }

    #[test]
    fn an_empty_domain_or_request_and_a_huge_hits_addend_are_refused() {
        let field = |request: &RateLimitRequest| {
            plan(request, &EnvoySettings::default())
                .err()
                .unwrap()
                .field
        };
        let mut empty = request(&[]);
        assert_eq!(field(&empty), "descriptors");
        empty.domain.clear();
        assert_eq!(field(&empty), "domain");
        let mut huge = request(&[("a", "1")]);
        huge.descriptors[0].hits_addend = Some(limit::MAX_QUANTITY + 1);
        assert_eq!(field(&huge), "descriptors[0].hits_addend");
    }
}
