//! Decisions per second of the embedded (in-memory) store, in process:
//! `Limiter::check` as the server calls it, for every registered algorithm,
//! on one thread and on two threads sharing one limiter, over 10 000 keys.
//!
//! Run with `cargo bench --bench embedded_store`. The requirement is at
//! least 2 million decisions per second on one core.

use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use ratelimitd::algorithm::registry::{Kind, Rate, WindowStart};
use ratelimitd::algorithm::{Algorithm, LimitRequest};
use ratelimitd::limit::{CallerKey, Decision};
use ratelimitd::limiter::{DEFAULT_KEY_PREFIX, Limiter, Store};
use ratelimitd::store::{MemoryStore, SystemClock};

/// Distinct caller keys: far more than shards, and state (a few MB for the
/// sliding window's logs) beyond one core's L2 cache, as on a busy server.
const KEYS: usize = 10_000;

/// Visits every key once per cycle, but not in creation order, so shards
/// and hash buckets are hit in no pattern the hardware could learn.
const STRIDE: usize = 7_919;

const THREADS: usize = 2;

/// 100 per second per key, under each algorithm the registry knows (a
/// token bucket of 100 refilled at 100 a second). At 2 million decisions a
/// second over `KEYS` keys each is asked 200 times a second, so about half
/// are allowed and half denied (and the buckets both spend and refill);
/// the mix is printed after each benchmark, since it moves with the speed.
fn algorithms() -> [(&'static str, Algorithm); Kind::COUNT] {
    let rate = Rate::new(100, Duration::from_secs(1));
    Kind::ALL.map(|kind| {
        let algorithm = kind
            .build(rate, WindowStart::FirstRequest)
            .expect("valid parameters");
        (kind.name(), algorithm)
    })
}

/// The limiter a server without `--redis-url` builds, less the sweeper
/// (which needs a tokio runtime; with a fixed key set nothing piles up).
fn limiter() -> Limiter {
    let memory = MemoryStore::new(Arc::new(SystemClock::default()));
    Limiter::new(Store::Memory(memory), DEFAULT_KEY_PREFIX)
}

/// Built before timing, so that neither key formatting nor cloning counts.
fn requests(algorithm: Algorithm) -> Vec<LimitRequest> {
    (0..KEYS)
        .map(|i| LimitRequest {
            key: CallerKey::new(format!("user-{:05}", i * STRIDE % KEYS)).expect("valid key"),
            algorithm,
            cost: 1,
            shadow: false,
        })
        .collect()
}

/// One decision, polled once in place: the memory store never waits, so
/// one poll completes it and no runtime is measured. Pinned where it is
/// built rather than handed to an executor by value, which would copy the
/// whole future (its Redis states included) on every call.
#[inline]
fn decide(limiter: &Limiter, request: &LimitRequest) -> Decision {
    let mut context = Context::from_waker(Waker::noop());
    match pin!(limiter.check(request, None)).poll(&mut context) {
        Poll::Ready(decided) => decided.expect("the embedded store does not fail"),
        Poll::Pending => panic!("the embedded store waited"),
    }
}

/// `count` decisions cycling through `requests` from `start`; returns how
/// many were allowed, so that the work cannot be optimised away and the mix
/// can be checked.
fn run(limiter: &Limiter, requests: &[LimitRequest], start: usize, count: u64) -> u64 {
    let mut next = start % requests.len();
    let mut allowed = 0;
    for _ in 0..count {
        allowed += u64::from(decide(limiter, black_box(&requests[next])).is_allowed());
        next += 1;
        if next == requests.len() {
            next = 0;
        }
    }
    allowed
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        // One iteration is one decision, in total over all threads.
        .throughput(Throughput::Elements(1));
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("single_thread");
    configure(&mut group);
    for (name, algorithm) in algorithms() {
        let limiter = limiter();
        let requests = requests(algorithm);
        let mut decided = 0;
        let mut allowed = 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                allowed += run(&limiter, &requests, decided as usize, iters);
                let elapsed = started.elapsed();
                decided += iters;
                elapsed
            })
        });
        report_mix("single_thread", name, decided, allowed);
    }
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    configure(&mut group);
    for (name, algorithm) in algorithms() {
        let limiter = limiter();
        let requests = requests(algorithm);
        let mut decided = 0;
        let mut allowed = 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                // Same keys on both threads, half a cycle apart: they meet
                // on shards as a server's connections would, not on one key
                // in lock step.
                let started = Instant::now();
                allowed += thread::scope(|scope| {
                    let workers: Vec<_> = (0..THREADS)
                        .map(|t| {
                            let share = iters / THREADS as u64
                                + u64::from((t as u64) < iters % THREADS as u64);
                            let start = decided as usize + t * KEYS / THREADS;
                            let (limiter, requests) = (&limiter, &requests);
                            scope.spawn(move || run(limiter, requests, start, share))
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|worker| worker.join().expect("a benchmark thread panicked"))
                        .sum::<u64>()
                });
                let elapsed = started.elapsed();
                decided += iters;
                elapsed
            })
        });
        report_mix("two_threads", name, decided, allowed);
    }
    group.finish();
}

/// A benchmark that only allowed (or only denied) would measure half the
/// code; say which it was.
fn report_mix(group: &str, name: &str, decided: u64, allowed: u64) {
    if decided > 0 {
        println!(
            "{group}/{name}: {decided} decisions, {:.0}% allowed",
            allowed as f64 * 100.0 / decided as f64
        );
    }
}

criterion_group!(benches, single_thread, two_threads);
criterion_main!(benches);
