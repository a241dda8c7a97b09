//! Where the embedded store and this process's quota ledgers read the
//! time, and the script part through which Redis reads its own. Here a
//! trait lets unit tests drive the time by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::limit::Micros;

/// Redis's clock for every script that decides there: `now` from its
/// `TIME`, read once per call. The decision and quota scripts start with it.
pub const CLOCK_LUA: &str = include_str!("clock.lua");

/// The time, as the embedded store and the quota ledgers read it.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since the Unix epoch; never goes backwards.
    fn now(&self) -> Micros;
}

/// The system's wall clock, held from going backwards. Wall time rather than
/// a monotonic instant because windows aligned to the unit (a minute starting
/// at :00) need the epoch, as they do on Redis.
#[derive(Debug, Default)]
pub struct SystemClock {
    latest: AtomicU64,
}

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| Micros::from_duration(since).as_micros());
        // A clock step backwards must not shorten anyone's window. Writing
        // only when time moved on spares threads deciding within the same
        // microsecond from taking the line from each other.
        let previous = self.latest.load(Ordering::Relaxed);
        if wall <= previous {
            return Micros::from_micros(previous);
        }
        let previous = self.latest.fetch_max(wall, Ordering::Relaxed);
        Micros::from_micros(previous.max(wall))
    }
}

/// A clock that moves only when told: for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        self.0
            .fetch_add(Micros::from_duration(by).as_micros(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        Micros::from_micros(self.0.load(Ordering::SeqCst))
    }
}
