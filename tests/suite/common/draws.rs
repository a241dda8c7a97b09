//! Random sequences for the differential tests (the twins, the batches),
//! made and shrunk by proptest. A sequence is a [`Tape`]: the draws of its
//! set-up and of each step, which the test reads through [`Draws`] as it
//! goes, so its generators read as before while proptest, on a failure,
//! shrinks the tape to fewer steps and smaller draws (a draw shrinks
//! towards zero: the first choice of each). A part read past its end reads
//! zeros.
//!
//! [`check`] runs the cases from a fixed seed, so a run (CI's too) replays
//! exactly; `PROPTEST_RNG_SEED=<number>` runs them from another, e.g.
//! `PROPTEST_RNG_SEED=7 cargo test --all-features --test suite twins::`.
//! Failures are not persisted to a file: the seed alone replays them.

use std::ops::RangeInclusive;

use proptest::collection::vec;
use proptest::prelude::{Strategy, any};
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// The seed of every run unless `PROPTEST_RNG_SEED` names another.
const SEED: u64 = 0x7177_5eed;

/// At most this many shrinking steps (each a run of the whole sequence).
const MOST_SHRINK_RUNS: u32 = 2048;

/// One random sequence: the draws of its set-up, and of each step.
#[derive(Clone, Debug)]
pub(crate) struct Tape {
    pub(crate) setup: Vec<u64>,
    pub(crate) steps: Vec<Vec<u64>>,
}

/// Tapes of `steps` steps, each part of `draws` draws (no fewer than its
/// set-up or a step reads, or the rest read as zeros).
pub(crate) fn tapes(steps: RangeInclusive<usize>, draws: usize) -> impl Strategy<Value = Tape> {
    let part = || vec(any::<u64>(), draws);
    (part(), vec(part(), steps)).prop_map(|(setup, steps)| Tape { setup, steps })
}

/// Reads one part of a [`Tape`], draw by draw.
pub(crate) struct Draws<'a> {
    part: &'a [u64],
    at: usize,
}

impl<'a> Draws<'a> {
    pub(crate) fn new(part: &'a [u64]) -> Self {
        Self { part, at: 0 }
    }

    fn next(&mut self) -> u64 {
        let drawn = self.part.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        drawn
    }

    /// In `0..=most`.
    pub(crate) fn upto(&mut self, most: u64) -> u64 {
        match most.checked_add(1) {
            Some(span) => self.next() % span,
            None => self.next(),
        }
    }

    /// In `least..=most`.
    pub(crate) fn between(&mut self, least: u64, most: u64) -> u64 {
        least + self.upto(most - least)
    }

    /// One of `items` (the first, once shrunk).
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        let last = u64::try_from(items.len() - 1).expect("a short list");
        items[usize::try_from(self.upto(last)).expect("an index")]
    }

    /// True `percent` times in a hundred (false, once shrunk).
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        99 - self.upto(99) < percent
    }
}

/// Runs `test` on `cases` values of `strategy`, from the fixed seed (or
/// `PROPTEST_RNG_SEED`'s); on a failure, panics with the message of the
/// smallest failing value proptest shrank it to, and the seed.
pub(crate) fn check<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), String>,
) {
    // Config::default() reads PROPTEST_RNG_SEED when it is set.
    let seed = match Config::default().rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => SEED,
    };
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: MOST_SHRINK_RUNS,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, |value| test(value).map_err(TestCaseError::fail)) {
        Ok(()) => {}
        Err(TestError::Fail(reason, _)) => {
            panic!("{reason}\n(shrunk; seed {seed}: PROPTEST_RNG_SEED={seed} replays it)")
        }
        Err(TestError::Abort(reason)) => panic!("aborted: {reason} (seed {seed})"),
    }
}
