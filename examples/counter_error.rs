//! How far the sliding window counter (two weighted fixed-window counts)
//! strays from the exact sliding log, on generated traffic: both in-memory
//! twins (the same arithmetic as their Lua scripts) are fed the same
//! requests at the same instants, and the table compares what they admit.
//!
//!   cargo run --release --example counter_error

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use ratelimitd::algorithm::{SlidingWindow, SlidingWindowCounter};
use ratelimitd::algorithm::{sliding_window, sliding_window_counter};
use ratelimitd::limit::Micros;

const LIMIT: u64 = 100;
/// One second, in microseconds: the generated traffic counts in those.
const WINDOW: u64 = 1_000_000;
const SECONDS: u64 = 600;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let log = SlidingWindow::new(LIMIT, Duration::from_micros(WINDOW))?;
    let counter = SlidingWindowCounter::new(LIMIT, Duration::from_micros(WINDOW))?;
    println!(
        "limit {LIMIT} per {} s, {SECONDS} s of traffic per pattern\n",
        WINDOW / 1_000_000
    );
    println!(
        "| traffic | requests | admitted by the log | admitted by the counter | difference | decisions that differ | most admitted by the counter in any 1 s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, arrivals) in patterns() {
        let (mut log_state, mut counter_state) = (None, None);
        let (mut log_admitted, mut counter_admitted, mut differ) = (0u64, 0u64, 0u64);
        let mut admitted_at = Vec::new();
        for &at in &arrivals {
            let now = Micros::from_micros(at);
            let by_log = sliding_window::decide(&log, &mut log_state, now, 1, true).0;
            let by_counter =
                sliding_window_counter::decide(&counter, &mut counter_state, now, 1, true).0;
            log_admitted += u64::from(by_log.is_allowed());
            counter_admitted += u64::from(by_counter.is_allowed());
            differ += u64::from(by_log.is_allowed() != by_counter.is_allowed());
            if by_counter.is_allowed() {
                admitted_at.push(at);
            }
        }
        let difference = (counter_admitted as f64 - log_admitted as f64) / log_admitted as f64;
        println!(
            "| {name} | {} | {log_admitted} | {counter_admitted} | {:+.2}% | {:.2}% | {} |",
            arrivals.len(),
            difference * 100.0,
            differ as f64 * 100.0 / arrivals.len() as f64,
            most_in_any_window(&admitted_at),
        );
    }
    Ok(())
}

/// Arrival instants (microseconds, ascending) for each kind of traffic.
fn patterns() -> Vec<(&'static str, Vec<u64>)> {
    let mut rng = SmallRng::seed_from_u64(2026);
    vec![
        ("steady, 0.8 × limit (Poisson)", poisson(&mut rng, 0.8)),
        ("steady, 1.5 × limit (Poisson)", poisson(&mut rng, 1.5)),
        ("steady, 5 × limit (Poisson)", poisson(&mut rng, 5.0)),
        ("bursts: 150 within 20 ms, every 0.5–2 s", bursts(&mut rng)),
        ("adversarial: 100 at each window's end", adversarial()),
    ]
}

fn poisson(rng: &mut SmallRng, load: f64) -> Vec<u64> {
    let per_micro = load * LIMIT as f64 / WINDOW as f64;
    let gaps = Exp::new(per_micro).expect("positive rate");
    let mut now = WINDOW as f64 * 10.0;
    let end = now + (SECONDS * 1_000_000) as f64;
    let mut arrivals = Vec::new();
    while now < end {
        now += gaps.sample(rng);
        arrivals.push(now as u64);
    }
    arrivals
}

fn bursts(rng: &mut SmallRng) -> Vec<u64> {
    let mut start = WINDOW * 10;
    let end = start + SECONDS * 1_000_000;
    let mut arrivals = Vec::new();
    while start < end {
        let mut burst: Vec<u64> = (0..150)
            .map(|_| start + rng.random_range(0..20_000))
            .collect();
        burst.sort_unstable();
        arrivals.extend(burst);
        start += rng.random_range(500_000..2_000_000);
    }
    arrivals
}

/// The counter's worst case: everything at the very end of each window, so
/// the next window's estimate weighs it as if spread evenly.
fn adversarial() -> Vec<u64> {
    let mut arrivals = Vec::new();
    for window in 10..10 + SECONDS {
        let end = (window + 1) * WINDOW;
        // The last millisecond of a window, then the rest of the next one.
        arrivals.extend((0..100).map(|i| end - 1000 + i * 10));
        arrivals.extend((1..100).map(|i| end + i * 9_000));
    }
    arrivals.sort_unstable();
    arrivals
}

/// The most instants in any span of one window.
fn most_in_any_window(admitted_at: &[u64]) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (last, &at) in admitted_at.iter().enumerate() {
        while admitted_at[first] + WINDOW <= at {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most
}
