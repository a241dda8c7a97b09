//! The load itself: workers sending calls (one request each, or a batch)
//! closed loop (next call when the last is answered) or open loop (calls
//! start on a schedule, latency counted from the scheduled start), through
//! a warm-up and then a measured duration or call count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;

use crate::keys::Keys;
use crate::report::{Progress, Tally};
use crate::target::Target;

/// How much load, for how long.
pub(crate) struct Plan {
    pub concurrency: u32,
    /// Requests per call, each with a key of its own.
    pub batch: usize,
    pub warm_up: Duration,
    pub measure: Measure,
    /// Requests started per second (open loop), or `None` (closed loop).
    pub rate: Option<f64>,
}

pub(crate) enum Measure {
    For(Duration),
    /// This many calls.
    Requests(u64),
}

/// What the workers share.
struct Shared {
    target: Target,
    keys: Keys,
    progress: Arc<Progress>,
    batch: usize,
    started: Instant,
    measure_from: Instant,
    /// Calls starting at or after this are not sent.
    deadline: Option<Instant>,
    /// With `Measure::Requests`: how many measured calls may start.
    budget: Option<u64>,
    claimed: AtomicU64,
    /// Open loop: one start instant every `period`, numbered.
    period: Option<Duration>,
    next_slot: AtomicU64,
}

/// Runs the plan; returns the merged tally and the measured time.
pub(crate) async fn run(
    target: Target,
    keys: Keys,
    plan: &Plan,
    progress: Arc<Progress>,
) -> (Tally, Duration) {
    let started = Instant::now();
    let measure_from = started + plan.warm_up;
    let (deadline, budget) = match plan.measure {
        Measure::For(duration) => (Some(measure_from + duration), None),
        Measure::Requests(count) => (None, Some(count)),
    };
    let shared = Arc::new(Shared {
        target,
        keys,
        progress,
        batch: plan.batch.max(1),
        started,
        measure_from,
        deadline,
        budget,
        claimed: AtomicU64::new(0),
        period: plan.rate.map(|rate| Duration::from_secs_f64(1.0 / rate)),
        next_slot: AtomicU64::new(0),
    });
    let workers: Vec<_> = (0..plan.concurrency as usize)
        .map(|worker| tokio::spawn(work(Arc::clone(&shared), worker)))
        .collect();
    let mut tally = Tally::new();
    let mut last_answer = measure_from;
    for worker in workers {
        // A worker only ends by returning; a panic would be a bug here.
        if let Ok((worker_tally, worker_last)) = worker.await {
            tally.merge(worker_tally);
            last_answer = last_answer.max(worker_last);
        }
    }
    (tally, last_answer.saturating_duration_since(measure_from))
}

/// One worker: sends until the plan is done; returns what it measured and
/// when its last measured answer came.
async fn work(shared: Arc<Shared>, worker: usize) -> (Tally, Instant) {
    let mut rng = SmallRng::seed_from_u64(worker as u64);
    let mut tally = Tally::new();
    let mut last_answer = shared.measure_from;
    // Reused from call to call: the keys borrow from `shared`.
    let mut keys: Vec<&str> = Vec::with_capacity(shared.batch);
    loop {
        let scheduled = match shared.period {
            Some(period) => {
                let slot = shared.next_slot.fetch_add(1, Ordering::Relaxed);
                let at = shared.started + period.mul_f64(slot as f64);
                if shared.deadline.is_some_and(|deadline| at >= deadline) {
                    break;
                }
                tokio::time::sleep_until(at).await;
                at
            }
            None => Instant::now(),
        };
        if shared
            .deadline
            .is_some_and(|deadline| scheduled >= deadline)
        {
            break;
        }
        let measured = scheduled >= shared.measure_from;
        if measured
            && let Some(budget) = shared.budget
            && shared.claimed.fetch_add(1, Ordering::Relaxed) >= budget
        {
            break;
        }
        keys.clear();
        keys.extend((0..shared.batch).map(|_| shared.keys.draw(&mut rng)));
        let outcomes = shared.target.call(worker, &keys).await;
        let answered = Instant::now();
        shared.progress.count(&outcomes);
        if measured {
            tally.record(outcomes, answered - scheduled);
            last_answer = answered;
        }
    }
    (tally, last_answer)
}
