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
            .map_or(0, |since| since.as_micros() as Micros);
        // A clock step backwards must not shorten anyone's window. Writing
        // only when time moved on spares threads deciding within the same
        // microsecond from taking the line from each other.
        let previous = self.latest.load(Ordering::Relaxed);
        if wall <= previous {
            return previous;
        }
        let previous = self.latest.fetch_max(wall, Ordering::Relaxed);
        previous.max(wall)
    }
}

/// A clock that moves only when told: for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}
