//! One limit of an Envoy descriptor: a configured `rate_limit` (or an
//! entry of `rate_limits`), or the limit Envoy sent with a descriptor. What
//! it does is one of three things, and only a limit that counts carries an
//! algorithm; a rate and a period exist only where the rule has them.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::registry::{Kind, Rate, WindowStart};
use crate::limit::InvalidArgument;
use crate::spec::Unit;
use crate::stats::{self, RuleStats};

/// Envoy's fixed windows are aligned to the unit (a minute starts at :00),
/// as envoyproxy/ratelimit counts, where `CheckLimit`'s start at the key's
/// first request: every Envoy rule builds its algorithm with this.
const ENVOY_WINDOW_START: WindowStart = WindowStart::Epoch;

/// Where a rule was written, for logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// The file, relative to the configuration directory.
    pub file: String,
    /// The line (1-based) of the descriptor.
    pub line: u64,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// `unit` × `unit_multiplier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    unit: Unit,
    multiplier: NonZeroU32,
}

impl Period {
    /// One `unit`.
    pub fn of(unit: Unit) -> Self {
        Self {
            unit,
            multiplier: NonZeroU32::MIN,
        }
    }

    /// A `unit` written as `unit_text` (`None` if it names no unit), times
    /// `unit_multiplier` (1 unless written; at least 1). The error is the
    /// reason, as upstream words it.
    pub fn parse(
        unit: Option<Unit>,
        unit_text: &str,
        multiplier: Option<u32>,
    ) -> Result<Self, String> {
        let Some(unit) = unit else {
            return Err(format!("invalid rate limit unit '{unit_text}'"));
        };
        let multiplier = NonZeroU32::new(multiplier.unwrap_or(1))
            .ok_or_else(|| "unit_multiplier must be at least 1".to_owned())?;
        Ok(Self { unit, multiplier })
    }

    /// The unit.
    pub fn unit(self) -> Unit {
        self.unit
    }

    /// `unit_multiplier`.
    pub fn multiplier(self) -> u32 {
        self.multiplier.get()
    }

    /// The period in seconds.
    pub fn seconds(self) -> u64 {
        self.unit.seconds() * u64::from(self.multiplier.get())
    }

    /// The period: `unit` × `unit_multiplier`.
    pub fn window(self) -> Duration {
        Duration::from_secs(self.seconds())
    }
}

/// A rule that counts: at least one request per period, and the algorithm
/// that counts them (built from the two, so they always agree).
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    requests_per_unit: NonZeroU32,
    period: Period,
    algorithm: Algorithm,
}

impl Counted {
    /// `requests_per_unit` per `period` under `kind`; the error names the
    /// algorithm's parameter (see [`Kind::build`]).
    pub fn new(
        kind: Kind,
        requests_per_unit: NonZeroU32,
        period: Period,
    ) -> Result<Self, InvalidArgument> {
        let rate = Rate::new(u64::from(requests_per_unit.get()), period.window());
        Ok(Self {
            requests_per_unit,
            period,
            algorithm: kind.build(rate, ENVOY_WINDOW_START)?,
        })
    }

    /// `requests_per_unit`.
    pub fn requests_per_unit(&self) -> u32 {
        self.requests_per_unit.get()
    }

    /// `unit` × `unit_multiplier`.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
}

/// What a rule does with the requests it governs.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// `unlimited: true`: never limited, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, never counted. Its
    /// period is what responses report (and when it "resets").
    Blocked(Period),
    /// Counted on the store.
    Counted(Counted),
}

impl Limit {
    /// `requests_per_unit` per `period` under `kind`: blocked at 0, as
    /// upstream reads it.
    pub fn rate(
        requests_per_unit: u32,
        period: Period,
        kind: Kind,
    ) -> Result<Self, InvalidArgument> {
        Ok(match NonZeroU32::new(requests_per_unit) {
            None => Self::Blocked(period),
            Some(requests) => Self::Counted(Counted::new(kind, requests, period)?),
        })
    }

    /// What responses report of it: requests per unit (0 when blocked) and
    /// the period; `None` for an unlimited rule, which reports no limit.
    pub fn reported(&self) -> Option<(u32, Period)> {
        match self {
            Self::Unlimited => None,
            Self::Blocked(period) => Some((0, *period)),
            Self::Counted(counted) => Some((counted.requests_per_unit(), counted.period)),
        }
    }
}

/// What one configured descriptor gives every limit it holds.
#[derive(Debug, Default)]
pub struct DescriptorSettings {
    /// `shadow_mode`: decided and counted, but never denies.
    pub shadow: bool,
    /// `quota_mode`: over the limit, it denies the request only when every
    /// quota descriptor of the request is over.
    pub quota: bool,
    /// `metadata`, attached to the response's dynamic metadata when the
    /// descriptor passes (with RESPONSE_DYNAMIC_METADATA).
    pub metadata: Option<prost_types::Struct>,
    /// The descriptor's place in its file, one `key` or `key_value` per
    /// level below the domain: the key of upstream's statistics for it
    /// (empty for a limit Envoy sent, which has no place in the
    /// configuration).
    pub stats_key: Vec<String>,
    /// How upstream names its statistics per request.
    pub naming: StatsNaming,
    /// The statistics `stats_key` names, made on first use (statistics
    /// are on by then).
    stats: StatsSlot,
}

/// Whether a descriptor's statistics are named after a request's values,
/// as upstream names them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatsNaming {
    /// `detailed_metric`: every entry's key and value.
    pub detailed: bool,
    /// Some level on the way to it, matched by a wildcard or by its key
    /// alone, has `value_to_metric`: the request's value names it.
    pub value_to_metric: bool,
}

impl StatsNaming {
    /// Named after the request's values, in some way.
    pub fn per_request(self) -> bool {
        self.detailed || self.value_to_metric
    }
}

impl DescriptorSettings {
    /// The settings a descriptor writes.
    pub fn new(
        shadow: bool,
        quota: bool,
        metadata: Option<prost_types::Struct>,
        stats_key: Vec<String>,
    ) -> Self {
        Self {
            shadow,
            quota,
            metadata,
            stats_key,
            naming: StatsNaming::default(),
            stats: StatsSlot::default(),
        }
    }

    /// These settings, their statistics named `naming`.
    pub fn named(self, naming: StatsNaming) -> Self {
        Self { naming, ..self }
    }

    /// Upstream's statistics for this descriptor in `domain`; `None` when
    /// statistics are off or for a limit with no place in the
    /// configuration.
    pub fn upstream_stats(&self, domain: &str) -> Option<&Arc<RuleStats>> {
        if self.stats_key.is_empty() {
            return None;
        }
        self.stats
            .0
            .get_or_init(|| stats::rule(&self.static_key(domain)))
            .as_ref()
    }

    /// The key upstream names this descriptor's statistics by in `domain`
    /// when no request's value does: `<domain>.<key or key_value>...`.
    pub fn static_key(&self, domain: &str) -> String {
        let mut key = domain.to_owned();
        for level in &self.stats_key {
            key.push('.');
            key.push_str(level);
        }
        key
    }
}

/// Upstream-named statistics, once made: a cache, left out of `Debug`.
#[derive(Default)]
struct StatsSlot(OnceLock<Option<Arc<RuleStats>>>);

impl fmt::Debug for StatsSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StatsSlot")
    }
}

/// What a configuration writes of one limit besides its rate.
#[derive(Debug, Default)]
pub struct Written {
    /// `name`: reported in `current_limit` and targeted by `replaces`.
    pub name: Option<String>,
    /// The names of rules this one replaces within the same request.
    pub replaces: Vec<String>,
    /// Extension `count_denied_hits`.
    pub count_denied_hits: bool,
    /// Its 1-based place among its descriptor's limits, when it has
    /// several.
    pub position: Option<usize>,
    /// Where it was written.
    pub source: Source,
}

/// One limit of a descriptor, with the settings of the descriptor that
/// holds it.
#[derive(Debug)]
pub struct Rule {
    limit: Limit,
    name: Option<String>,
    replaces: Vec<String>,
    count_denied_hits: bool,
    policy_id: String,
    source: Source,
    descriptor: Arc<DescriptorSettings>,
}

impl Rule {
    /// A limit of a configured descriptor. Its policy id (for the IETF
    /// headers) is its name, else the descriptor's path in the
    /// configuration, with `#<position>` when it is one of several.
    pub fn configured(limit: Limit, descriptor: Arc<DescriptorSettings>, written: Written) -> Self {
        let policy_id = written.name.clone().unwrap_or_else(|| {
            let path = descriptor.stats_key.join(".");
            match written.position {
                Some(position) => format!("{path}#{position}"),
                None => path,
            }
        });
        Self {
            limit,
            name: written.name,
            replaces: written.replaces,
            count_denied_hits: written.count_denied_hits,
            policy_id,
            source: written.source,
            descriptor,
        }
    }

    /// The limit Envoy sent with a descriptor, as upstream treats it: an
    /// aligned fixed window (blocked at 0), never in shadow mode, with no
    /// place in the configuration.
    pub fn overriding(requests_per_unit: u32, unit: Unit) -> Result<Self, InvalidArgument> {
        let limit = Limit::rate(requests_per_unit, Period::of(unit), Kind::FixedWindow)?;
        let written = Written {
            source: Source {
                file: "request limit override".into(),
                line: 0,
            },
            ..Written::default()
        };
        let mut rule = Self::configured(limit, Arc::default(), written);
        rule.policy_id = "override".into();
        Ok(rule)
    }

    /// What it does.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Its `name`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The names it replaces within the same request.
    pub fn replaces(&self) -> &[String] {
        &self.replaces
    }

    /// Extension `count_denied_hits`: a request this rule governs is
    /// decided each descriptor on its own, a fixed window counting denied
    /// hits too, so a report Envoy sends after the response always counts.
    pub fn count_denied_hits(&self) -> bool {
        self.count_denied_hits
    }

    /// Its id in the IETF `RateLimit-Policy` header.
    pub fn policy_id(&self) -> &str {
        &self.policy_id
    }

    /// Where it was written.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// What its descriptor gives it.
    pub fn descriptor(&self) -> &DescriptorSettings {
        &self.descriptor
    }

    /// Its descriptor's `shadow_mode`.
    pub fn shadow(&self) -> bool {
        self.descriptor.shadow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_requests_block_and_only_counted_rules_hold_an_algorithm() {
        let minute = Period::of(Unit::Minute);
        assert_eq!(
            Limit::rate(0, minute, Kind::Gcra),
            Ok(Limit::Blocked(minute))
        );
        let Ok(Limit::Counted(counted)) = Limit::rate(5, minute, Kind::FixedWindow) else {
            panic!("counted");
        };
        let Algorithm::FixedWindow(window) = counted.algorithm() else {
            panic!("a fixed window");
        };
        assert!(window.is_aligned(), "Envoy's windows are aligned");
        assert_eq!(Limit::Counted(counted).reported(), Some((5, minute)));
        assert_eq!(Limit::Unlimited.reported(), None);
    }

    #[test]
    fn periods_read_unit_and_multiplier() {
        let period = Period::parse(Some(Unit::Minute), "minute", Some(5)).unwrap();
        assert_eq!(period.window(), Duration::from_secs(300));
        assert_eq!(
            Period::parse(None, "fortnight", None).unwrap_err(),
            "invalid rate limit unit 'fortnight'"
        );
        assert_eq!(
            Period::parse(Some(Unit::Second), "second", Some(0)).unwrap_err(),
            "unit_multiplier must be at least 1"
        );
    }

    #[test]
    fn policy_ids_name_the_limit_or_its_place() {
        let descriptor = Arc::new(DescriptorSettings::new(
            false,
            false,
            None,
            vec!["api".into(), "tier_gold".into()],
        ));
        let id = |name: Option<&str>, position| {
            let written = Written {
                name: name.map(str::to_owned),
                position,
                ..Written::default()
            };
            Rule::configured(Limit::Unlimited, descriptor.clone(), written)
                .policy_id()
                .to_owned()
        };
        assert_eq!(id(None, None), "api.tier_gold");
        assert_eq!(id(None, Some(2)), "api.tier_gold#2");
        assert_eq!(id(Some("burst"), Some(2)), "burst");
        let overriding = Rule::overriding(3, Unit::Hour).unwrap();
        assert_eq!(overriding.policy_id(), "override");
        assert!(!overriding.shadow() && overriding.descriptor().stats_key.is_empty());
    }
}
