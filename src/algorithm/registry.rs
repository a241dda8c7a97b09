//! The algorithms by name: the one place that knows each algorithm's name,
//! its tag, its Lua source, which parameters it takes, and how a face's
//! limit (so many units per period, maybe a burst) becomes its validated
//! parameters. Every face, the policies file and the load generator build
//! their algorithms here. Its one list of them makes [`Kind`], [`ENTRIES`],
//! [`Algorithm`], the per-key state and every match over them (see
//! `variants.rs`), and every list of the algorithms elsewhere (the script's
//! dispatch, the metrics, the benchmarks) is made from [`ENTRIES`]. How
//! each is stated in protobuf is the gRPC layer's (`pb::algorithm`).

pub use super::parameters::{Mark, Parameters, Rate, ScriptValue, Shown, WindowStart};

use super::Spend;
use super::variants::algorithms;
use crate::limit::{Decision, InvalidArgument, Micros};
use crate::store::MemoryChange;

// Every algorithm, in the order error messages list them. The tags are
// storage-key tags too: a deployment's counters live under them, so an
// existing tag never changes. (`$` first: see `algorithms!`.)
algorithms! {$
    /// At most the limit per window.
    FixedWindow(fixed_window::FixedWindow) {
        name: "fixed_window", tag: "fw", takes_burst: false, counts_denied_hits: true,
    }
    /// At most the limit within any span of the window (a log of spends).
    SlidingWindow(sliding_window::SlidingWindow) {
        name: "sliding_window", tag: "sl", takes_burst: false, counts_denied_hits: false,
    }
    /// A bucket of the burst (default: the limit), refilled at the limit
    /// per period.
    TokenBucket(token_bucket::TokenBucket) {
        name: "token_bucket", tag: "tb", takes_burst: true, counts_denied_hits: false,
    }
    /// The limit per period sustained, up to the burst (default: the limit)
    /// at once.
    Gcra(gcra::Gcra) {
        name: "gcra", tag: "gc", takes_burst: true, counts_denied_hits: false,
    }
    /// About the limit per sliding window, from two aligned counts.
    SlidingWindowCounter(sliding_window_counter::SlidingWindowCounter) {
        name: "sliding_window_counter", tag: "sc", takes_burst: false, counts_denied_hits: false,
    }
}

/// One algorithm as the rest of the service knows it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Which algorithm.
    pub kind: Kind,
    /// The name files, protobuf field paths, logs and metrics use; also
    /// the name of its Lua function (and, with `_refund`, of the function
    /// that takes a spend back).
    pub name: &'static str,
    /// Its tag: the script's name for it, and the tag in its storage keys
    /// (see `algorithm::key_tag` for the fixed window's two other modes).
    pub tag: &'static str,
    /// Its Lua source: the decision function, then, after
    /// [`REFUND_PART`], the refund function.
    pub lua: &'static str,
    /// Whether a burst apart from the limit means anything to it.
    pub takes_burst: bool,
    /// Whether it counts a cost it denies when told to
    /// (`algorithm::Spend::Always`), as envoyproxy/ratelimit counts hits.
    pub counts_denied_hits: bool,
}

/// The line in each algorithm's Lua source that starts its refund part:
/// only the refund script defines what follows it, so the decision script
/// does no work for it.
pub const REFUND_PART: &str = "\n-- Refund (refund.lua's part):\n";

/// What every algorithm's Lua function relies on, defined before them.
pub const SPEND_LUA: &str = include_str!("spend.lua");

impl Kind {
    /// How many algorithms there are: the length of every per-algorithm
    /// array.
    pub const COUNT: usize = Self::ALL.len();

    /// Its registry entry.
    pub const fn entry(self) -> &'static Entry {
        &ENTRIES[self as usize]
    }

    /// Its place in [`Kind::ALL`], for arrays indexed by algorithm.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name files, protobuf field paths, logs and metrics use.
    pub const fn name(self) -> &'static str {
        self.entry().name
    }

    /// Its tag: the script's name for it, and its storage keys' tag.
    pub const fn tag(self) -> &'static str {
        self.entry().tag
    }

    /// The algorithm named `name` exactly, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Every name, comma-separated, `last` before the last one:
    /// `names(" or ")` is "fixed_window, …, gcra or sliding_window_counter".
    pub fn names(last: &str) -> String {
        listed(&Self::ALL.map(Self::name), last)
    }

    /// Whether a burst apart from the limit means anything to it.
    pub const fn takes_burst(self) -> bool {
        self.entry().takes_burst
    }

    /// Which algorithm `algorithm` is.
    pub fn of(algorithm: &Algorithm) -> Self {
        algorithm.kind_of()
    }

    /// `rate` under this algorithm:
    /// - fixed_window, sliding_window, sliding_window_counter: at most
    ///   `limit` per `per` (a fixed window starting as `start` says);
    /// - token_bucket: `burst` tokens (default `limit`), refilled at
    ///   `limit / per`;
    /// - gcra: `limit` per `per` sustained, `burst` (default `limit`) at
    ///   once.
    ///
    /// The error names the parameter that broke its rule in the
    /// algorithm's own terms (`limit`, `window`, `capacity`,
    /// `refill_per_second`, `rate`, `period`, `burst`); each face maps
    /// those to its own fields.
    pub fn build(self, rate: Rate, start: WindowStart) -> Result<Algorithm, InvalidArgument> {
        if rate.burst.is_some() && !self.takes_burst() {
            return Err(burst_refused(self.name()));
        }
        self.build_from(rate, start)
    }
}

/// The error for a burst given to an algorithm that takes none.
pub fn burst_refused(name: &str) -> InvalidArgument {
    let bursting: Vec<&str> = Kind::ALL
        .into_iter()
        .filter(|kind| kind.takes_burst())
        .map(Kind::name)
        .collect();
    InvalidArgument::new(
        "burst",
        format!(
            "applies to {} only (this limit is {name})",
            listed(&bursting, " and ")
        ),
    )
}

/// `names` comma-separated, `last` before the last one.
fn listed(names: &[&str], last: &str) -> String {
    match names.split_last() {
        Some((final_name, [])) => (*final_name).to_owned(),
        Some((final_name, others)) => format!("{}{last}{final_name}", others.join(", ")),
        None => String::new(),
    }
}

/// What every algorithm's parameters say, whichever algorithm it is.
impl Algorithm {
    /// Which algorithm this is.
    pub fn kind(&self) -> Kind {
        Kind::of(self)
    }

    /// A short stable name, for logs and metrics: [`Kind::name`].
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The limit or capacity in force.
    pub fn limit(&self) -> u64 {
        with_parameters!(self, p => p.limit())
    }

    /// How long its state matters: the window; a token bucket's time to
    /// fill from empty; GCRA's burst of intervals. Tests step time by it.
    pub fn span(&self) -> Micros {
        with_parameters!(self, p => p.span())
    }
}

impl Kind {
    /// `rate` under this algorithm in every way it keeps its state, each
    /// its own storage key tag: the fixed window anchored, aligned, and
    /// aligned in a key named by its window; every other algorithm in its
    /// one way. For tests that must cover each (tests/suite/twins.rs).
    pub fn layouts(self, rate: Rate) -> Result<Vec<Algorithm>, InvalidArgument> {
        let first = self.build(rate, WindowStart::FirstRequest)?;
        let Algorithm::FixedWindow(_) = first else {
            return Ok(vec![first]);
        };
        let aligned = self.build(rate, WindowStart::Epoch)?;
        let Algorithm::FixedWindow(fixed) = aligned else {
            return Ok(vec![first, aligned]);
        };
        Ok(vec![
            first,
            aligned,
            Algorithm::FixedWindow(fixed.aligned_by_name()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn lists_read_as_a_sentence_at_any_length() {
        assert_eq!(listed(&[], " and "), "");
        assert_eq!(listed(&["gcra"], " and "), "gcra");
        assert_eq!(listed(&["a", "b"], " and "), "a and b");
        assert_eq!(listed(&["a", "b", "c"], " or "), "a, b or c");
    }

    #[test]
    fn names_round_trip_and_list_in_order() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(Kind::from_name("leaky"), None);
        assert_eq!(
            Kind::names(" or "),
            "fixed_window, sliding_window, token_bucket, gcra or sliding_window_counter"
        );
        assert_eq!(
            burst_refused("sliding_window").to_string(),
            "burst: applies to token_bucket and gcra only (this limit is sliding_window)"
        );
    }

    #[test]
    fn only_the_envoy_face_aligns_its_fixed_windows() {
        let build = |start| Kind::FixedWindow.build(Rate::new(5, SECOND), start);
        let Ok(Algorithm::FixedWindow(anchored)) = build(WindowStart::FirstRequest) else {
            panic!("a fixed window");
        };
        let Ok(Algorithm::FixedWindow(aligned)) = build(WindowStart::Epoch) else {
            panic!("a fixed window");
        };
        assert!(!anchored.is_aligned() && aligned.is_aligned());
    }

    #[test]
    fn a_rate_becomes_each_algorithms_parameters() {
        let per_minute = Rate::new(60, Duration::from_secs(60));
        let Ok(Algorithm::TokenBucket(bucket)) =
            Kind::TokenBucket.build(per_minute, WindowStart::FirstRequest)
        else {
            panic!("a token bucket");
        };
        assert_eq!((bucket.capacity(), bucket.refill_per_second()), (60, 1.0));
        let bursty = Rate {
            burst: Some(3),
            ..Rate::new(10, SECOND)
        };
        let Ok(Algorithm::Gcra(gcra)) = Kind::Gcra.build(bursty, WindowStart::FirstRequest) else {
            panic!("gcra");
        };
        assert_eq!(
            (gcra.burst(), gcra.interval()),
            (3, Micros::from_millis(100))
        );
        let err = Kind::SlidingWindow
            .build(bursty, WindowStart::FirstRequest)
            .unwrap_err();
        assert_eq!(err.field, "burst");
        let err = Kind::TokenBucket
            .build(Rate::new(1, Duration::ZERO), WindowStart::FirstRequest)
            .unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.rule.as_str()),
            ("window", "must be positive")
        );
    }

    #[test]
    fn layouts_cover_each_way_of_keeping_state() {
        let rate = Rate::new(4, Duration::from_millis(500));
        let mut modes = Vec::new();
        for kind in Kind::ALL {
            for algorithm in kind.layouts(rate).unwrap() {
                assert_eq!(algorithm.kind(), kind);
                assert!(algorithm.span() > Micros::ZERO, "{algorithm:?}");
                if let Algorithm::FixedWindow(fixed) = algorithm {
                    modes.push(fixed.mode());
                }
            }
        }
        use crate::algorithm::FixedWindowMode::{Aligned, AlignedByName, Anchored};
        assert_eq!(modes, [Anchored, Aligned, AlignedByName]);
        let gcra = Kind::Gcra
            .layouts(Rate {
                burst: Some(2),
                ..rate
            })
            .unwrap();
        assert_eq!(gcra[0].span(), Micros::from_millis(250));
    }
}
