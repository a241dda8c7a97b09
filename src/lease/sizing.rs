//! What a policy allows to be leased, and how big a lease is: from the
//! policy's leasable limits, a client's share of their rate, and what the
//! client already holds. Pure.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::limit::InvalidArgument;
use crate::policy::Policy;

/// What leasing a policy may hand out, from its limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Leasable {
    /// Units per second the policy sustains: the lowest of its limits'.
    pub rate: f64,
    /// The most units one lease holds: the lowest of its limits' bounds.
    pub max_units: u64,
    /// The longest a lease holds: the shortest of its limits' bounds.
    pub max_duration: Duration,
    /// Whether a limit is a window, whose units end with it.
    pub has_window: bool,
}

/// What `policy` allows to be leased; refused, naming the policy and the
/// limit, unless every limit says `lease: true`.
pub(crate) fn leasable(policy: &Policy) -> Result<Leasable, InvalidArgument> {
    let mut leasable = Leasable {
        rate: f64::INFINITY,
        max_units: u64::MAX,
        max_duration: Duration::MAX,
        has_window: false,
    };
    for limit in &policy.limits {
        let Some(bounds) = limit.lease else {
            return Err(InvalidArgument::new(
                "policy",
                format!(
                    "'{}' has limit '{}' without `lease: true`: only a policy whose limits \
                     the operator marked leasable can be leased (decide it with CheckLimit)",
                    policy.name, limit.name
                ),
            ));
        };
        leasable.rate = leasable.rate.min(sustained_rate(&limit.algorithm));
        leasable.max_units = leasable.max_units.min(bounds.max_units);
        leasable.max_duration = leasable.max_duration.min(bounds.max_duration);
        leasable.has_window |= matches!(limit.algorithm, Algorithm::FixedWindow(_));
    }
    Ok(leasable)
}

/// Units per second `algorithm` admits in the long run.
fn sustained_rate(algorithm: &Algorithm) -> f64 {
    match algorithm {
        Algorithm::FixedWindow(window) => {
            window.limit() as f64 / window.window().as_micros().as_duration().as_secs_f64()
        }
        Algorithm::TokenBucket(bucket) => bucket.refill_per_second(),
        Algorithm::Gcra(gcra) => 1.0 / gcra.interval().as_duration().as_secs_f64(),
        // Never leasable: the policies file refuses `lease` on them. They
        // would not bound the rate.
        Algorithm::SlidingWindow(_) | Algorithm::SlidingWindowCounter(_) => f64::INFINITY,
    }
}

/// A client's allowance: units accrue at its share's rate, up to the size
/// of its lease, and each grant draws on them; so a client that spends
/// faster than its share is held to it, however often it asks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Allowance {
    /// Units that may be granted now.
    pub units: f64,
    /// When `units` was last brought up to date.
    pub at: std::time::Instant,
}

impl Allowance {
    /// A new client's allowance: a whole lease, at once.
    pub(crate) fn full(size: f64, now: std::time::Instant) -> Self {
        Self {
            units: size,
            at: now,
        }
    }

    /// Accrues what `rate` (units per second) brought since it was last
    /// brought up to date, up to `size`.
    pub(crate) fn accrue(&mut self, rate: f64, size: f64, now: std::time::Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.units = (self.units + rate * elapsed).min(size);
        self.at = now;
    }
}

/// What a renewal does for a client whose lease is `size` units and that
/// holds `held`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TopUp {
    /// Spend this many units for it.
    Spend(u64),
    /// Nothing now: it holds enough.
    Enough,
    /// Nothing now: held to its share, it has had it; it may have more
    /// after this long (denying meanwhile, once its holding is spent).
    Wait(Duration),
}

/// The most of a lease a contended client waits to accrue before it is
/// topped up: three quarters, so that it renews a few times per lease
/// rather than for every unit its share accrues.
const CONTENDED_CHUNK: f64 = 0.75;

/// What tops up a lease of `size` units for a client holding `held`. Alone
/// (`share` is `None`), it gets what it lacks. Beside others, held to its
/// share (`Some((allowance, rate))`: what may be granted now, and how fast
/// that grows), it gets what it lacks once its allowance covers that or
/// three quarters of a lease, whichever is less; until then it waits. While
/// the limits run `low` (its last grant was cut to what they had left), it
/// gets what its allowance covers, however little: grants are small then
/// anyway, and waiting for a chunk would deny requests that the limits
/// and its share both allow.
pub(crate) fn top_up(size: f64, held: u64, share: Option<(f64, f64)>, low: bool) -> TopUp {
    let lacking = (size - held as f64).floor();
    if lacking < 1.0 {
        return TopUp::Enough;
    }
    let Some((allowance, rate)) = share else {
        return TopUp::Spend(lacking as u64);
    };
    let chunk = if low {
        1.0
    } else {
        (size * CONTENDED_CHUNK).floor()
    };
    let needed = lacking.min(chunk).max(1.0);
    if allowance >= needed {
        return TopUp::Spend(lacking.min(allowance.floor()) as u64);
    }
    let wait = if rate > 0.0 {
        ((needed - allowance) / rate).clamp(0.001, 3600.0)
    } else {
        3600.0
    };
    TopUp::Wait(Duration::from_secs_f64(wait))
}

/// Of the units a limit has left, the most one grant takes: half (and the
/// last one, when one is left). Every grant leaves at least as much as it
/// takes for the other clients leasing the limit and for `CheckLimit`
/// callers, so as the limit runs out successive grants halve down to single
/// units and then none: near the end of a window or in an empty bucket the
/// clients ask per request, and no client holds units that another could
/// have used. Half, rather than a part per client: a lease is at most a
/// quarter of the limit by default and held units at most half of it, so
/// while a limit has half or more left the rule takes nothing from a
/// lease's size and costs no store call; it bites only as the limit runs
/// low.
pub(crate) fn within_left(units: u64, left: u64) -> u64 {
    units.min((left / 2).max(1)).min(left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{LeaseBounds, PolicyLimit, Scope};
    use std::time::Instant;

    fn limit(name: &str, algorithm: Algorithm, lease: Option<LeaseBounds>) -> PolicyLimit {
        PolicyLimit {
            name: name.into(),
            algorithm,
            scope: Scope::Policy,
            shadow: false,
            lease,
        }
    }

    fn policy(limits: Vec<PolicyLimit>) -> Policy {
        Policy {
            name: "hot".into(),
            limits,
            source: "policies.yaml:1".into(),
        }
    }

    #[test]
    fn a_policy_leases_at_its_lowest_rate_within_its_tightest_bounds() {
        let bucket = crate::policy::model::algorithm(
            Some("token_bucket"),
            1000,
            Duration::from_secs(1),
            None,
        )
        .unwrap();
        let window =
            crate::policy::model::algorithm(None, 20_000, Duration::from_secs(60), None).unwrap();
        let leasable = leasable(&policy(vec![
            limit(
                "1s",
                bucket,
                Some(LeaseBounds::default_for(1000, Duration::from_secs(1))),
            ),
            limit(
                "1m",
                window,
                Some(LeaseBounds::default_for(20_000, Duration::from_secs(60))),
            ),
        ]))
        .unwrap();
        assert!((leasable.rate - 20_000.0 / 60.0).abs() < 1e-9);
        assert_eq!(leasable.max_units, 250);
        assert_eq!(leasable.max_duration, Duration::from_millis(500));
        assert!(leasable.has_window);
    }

    #[test]
    fn a_limit_not_marked_leasable_is_named_in_the_refusal() {
        let window =
            crate::policy::model::algorithm(None, 10, Duration::from_secs(1), None).unwrap();
        let err = leasable(&policy(vec![limit("1s", window, None)])).unwrap_err();
        assert_eq!(err.field, "policy");
        assert!(
            err.rule
                .contains("'hot' has limit '1s' without `lease: true`"),
            "{}",
            err.rule
        );
    }

    #[test]
    fn a_top_up_is_what_the_lease_lacks_within_the_allowance() {
        assert_eq!(top_up(100.0, 0, None, false), TopUp::Spend(100));
        assert_eq!(top_up(100.0, 30, None, false), TopUp::Spend(70));
        assert_eq!(top_up(100.0, 120, None, false), TopUp::Enough);
        let share = |allowance, rate| Some((allowance, rate));
        assert_eq!(
            top_up(100.0, 30, share(1000.0, 50.0), false),
            TopUp::Spend(70)
        );
        assert_eq!(top_up(100.0, 0, share(80.5, 50.0), false), TopUp::Spend(80));
        // Less than three quarters accrued: it waits for the rest.
        assert_eq!(
            top_up(100.0, 0, share(50.0, 50.0), false),
            TopUp::Wait(Duration::from_millis(500))
        );
        // Lacking little, it has it once that much accrued.
        assert_eq!(
            top_up(100.0, 90, share(10.0, 50.0), false),
            TopUp::Spend(10)
        );
        assert!(matches!(
            top_up(100.0, 0, share(0.0, 0.0), false),
            TopUp::Wait(_)
        ));
        // With the limits running low, whatever the allowance covers.
        assert_eq!(top_up(100.0, 0, share(50.0, 50.0), true), TopUp::Spend(50));
        assert_eq!(top_up(100.0, 0, share(1.5, 50.0), true), TopUp::Spend(1));
        assert_eq!(
            top_up(100.0, 0, share(0.5, 50.0), true),
            TopUp::Wait(Duration::from_millis(10))
        );
    }

    #[test]
    fn a_grant_takes_at_most_half_of_what_is_left_down_to_single_units() {
        assert_eq!(
            within_left(250, 20_000),
            250,
            "plenty left: the whole lease"
        );
        assert_eq!(within_left(250, 500), 250);
        assert_eq!(within_left(250, 300), 150);
        assert_eq!(within_left(250, 4), 2);
        assert_eq!(within_left(250, 3), 1);
        assert_eq!(within_left(250, 2), 1);
        assert_eq!(within_left(250, 1), 1, "the last unit, to whoever asks");
        assert_eq!(within_left(250, 0), 0);
        assert_eq!(within_left(0, 100), 0);
        // One client draining a limit alone: each grant takes half of what
        // is left, the last ones single units, and never one unit too many.
        let (mut left, mut grants) = (500u64, Vec::new());
        while left > 0 {
            let units = within_left(125, left);
            assert!(units >= 1 && units <= left - units + 1, "{units} of {left}");
            grants.push(units);
            left -= units;
        }
        assert_eq!(grants, [125, 125, 125, 62, 31, 16, 8, 4, 2, 1, 1]);
        assert_eq!(grants.iter().sum::<u64>(), 500);
    }

    #[test]
    fn an_allowance_accrues_at_the_share_up_to_the_lease() {
        let start = Instant::now();
        let mut allowance = Allowance::full(100.0, start);
        allowance.units -= 100.0;
        allowance.accrue(50.0, 100.0, start + Duration::from_millis(500));
        assert!((allowance.units - 25.0).abs() < 1e-6);
        allowance.accrue(50.0, 100.0, start + Duration::from_secs(60));
        assert_eq!(allowance.units, 100.0);
    }
}
