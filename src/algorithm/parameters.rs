//! What every algorithm's parameters type says of itself, for the lists
//! made from the registry: the [`Parameters`] trait each algorithm's module
//! implements, and the terms it speaks in (a face's [`Rate`], the script's
//! values and mark, what the admin API shows).

use std::time::Duration;

use super::Spend;
use crate::limit::{Decision, InvalidArgument, Micros, Window};
use crate::store::MemoryChange;

/// What each algorithm's module says of its parameters type, for the
/// lists made from the registry: how the script is sent them, what marks a
/// spend the script may have to give back, and what the admin API shows.
/// `with_parameters!` reaches it from an [`Algorithm`](super::Algorithm).
pub trait Parameters: Sized {
    /// The in-memory state of one key under these parameters.
    type State;

    /// `rate` as these parameters, in the algorithm's own terms (see
    /// [`Kind::build`](super::registry::Kind::build)); `rate.burst` is one this algorithm takes.
    fn from_rate(rate: Rate, start: WindowStart) -> Result<Self, InvalidArgument>;

    /// The limit or capacity in force (see
    /// [`Algorithm::limit`](super::Algorithm::limit)).
    fn limit(&self) -> u64;

    /// The in-memory twin of its Lua function (see
    /// `algorithm::decide_in_memory`).
    fn decide(
        &self,
        state: &mut Option<Self::State>,
        now: Micros,
        cost: u64,
        spend: Spend,
    ) -> (Decision, MemoryChange);

    /// Its three parameters as the script reads them after its tag (see
    /// `decide.lua`).
    fn script_values(&self) -> [ScriptValue; 3];

    /// What the script replies as the mark of an allowed spend.
    fn mark(&self) -> Mark;

    /// The mark the script replies for an allowed spend that left `state`:
    /// the in-memory twin of that reply (0 where [`Parameters::mark`] is
    /// [`Mark::Unmarked`]).
    fn spend_mark(&self, state: &Self::State) -> u64;

    /// Gives `cost` units of a spend marked `mark` back to `state`: the
    /// in-memory twin of its refund function, for the algorithms whose
    /// units a lease gives back (the others' are never given back on the
    /// embedded store). Answers whether it gave them back.
    fn give_back(&self, _state: &mut Self::State, _cost: u64, _mark: u64) -> bool {
        false
    }

    /// Its parameters as the admin API shows them.
    fn shown(&self) -> Shown;

    /// How long its state matters (see
    /// [`Algorithm::span`](super::Algorithm::span)).
    fn span(&self) -> Micros;
}

/// One parameter as a script call sends it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScriptValue {
    /// A whole number.
    Whole(u64),
    /// A rate, in its shortest exact decimal form (which Lua's `tonumber`
    /// reads back to the same double).
    Rate(f64),
}

/// What the script's mark of an allowed spend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Nothing: the units are given back to the key as it is.
    Unmarked,
    /// The number of the window the units were counted in.
    Window,
    /// The end of the window the units were counted in (Unix milliseconds,
    /// as Redis keeps a key's expiry).
    WindowEnd,
    /// The stamp of the log entry the spend added.
    Entry,
}

/// An algorithm's parameters as the admin API shows them: those it has.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Shown {
    /// Its window.
    pub window: Option<Window>,
    /// A token bucket's refill rate.
    pub refill_per_second: Option<f64>,
    /// The time between requests at the sustained rate.
    pub interval: Option<Micros>,
}

/// Where a fixed window starts: the one parameter the faces choose apart,
/// each on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowStart {
    /// At the key's first spending request: `CheckLimit`'s, for its own
    /// parameters and its named policies alike.
    FirstRequest,
    /// At the multiples of the window since the Unix epoch (a minute starts
    /// at :00), as envoyproxy/ratelimit counts: the Envoy face's.
    Epoch,
}

/// A limit as the faces state it: `limit` units per `per`, and, for the
/// algorithms that take one ([`Kind::takes_burst`](super::registry::Kind::takes_burst)), a `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Units per `per`; a token bucket's capacity unless `burst` says.
    pub limit: u64,
    /// The window or period.
    pub per: Duration,
    /// A token bucket's capacity, or GCRA's burst; `None`: the limit.
    pub burst: Option<u64>,
}

impl Rate {
    /// `limit` per `per`, without a burst.
    pub fn new(limit: u64, per: Duration) -> Self {
        Self {
            limit,
            per,
            burst: None,
        }
    }
}
