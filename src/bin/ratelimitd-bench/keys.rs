//! The caller keys a run's requests name: one hot key, keys drawn uniformly,
//! keys drawn by a Zipf distribution, or every key in turn.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;
use rand_distr::{Distribution, Zipf};

use crate::options::{KeyPattern, Options};

/// The keys, built once, and how to draw one.
pub(crate) struct Keys {
    names: Vec<String>,
    draw: Draw,
}

enum Draw {
    Hot,
    Uniform,
    Zipf(Zipf<f64>),
    /// The next key in turn, shared by every worker.
    Sequence(AtomicUsize),
}

impl Keys {
    pub(crate) fn new(options: &Options) -> Result<Self, String> {
        let count = match options.keys {
            KeyPattern::Hot => 1,
            KeyPattern::Uniform | KeyPattern::Zipf | KeyPattern::Sequence => options.key_count,
        };
        let draw = match options.keys {
            KeyPattern::Hot => Draw::Hot,
            KeyPattern::Uniform => Draw::Uniform,
            KeyPattern::Zipf => Draw::Zipf(
                Zipf::new(count as f64, options.zipf_exponent)
                    .map_err(|err| format!("--zipf-exponent: {err}"))?,
            ),
            KeyPattern::Sequence => Draw::Sequence(AtomicUsize::new(0)),
        };
        let names = (0..count)
            .map(|i| format!("{}{i}", options.key_prefix))
            .collect();
        Ok(Self { names, draw })
    }

    /// The next key a worker sends.
    pub(crate) fn draw(&self, rng: &mut impl Rng) -> &str {
        let index = match &self.draw {
            Draw::Hot => 0,
            Draw::Uniform => rng.random_range(0..self.names.len()),
            // Zipf draws 1..=n as a float; the most likely key is index 0.
            Draw::Zipf(zipf) => (zipf.sample(rng) as usize).saturating_sub(1),
            Draw::Sequence(next) => next.fetch_add(1, Ordering::Relaxed) % self.names.len(),
        };
        self.names
            .get(index)
            .or(self.names.last())
            .map_or("", String::as_str)
    }

    /// A short description for the report.
    pub(crate) fn describe(&self, options: &Options) -> String {
        match options.keys {
            KeyPattern::Hot => format!("one hot key ({})", self.names[0]),
            KeyPattern::Uniform => format!("uniform over {} keys", self.names.len()),
            KeyPattern::Sequence => format!("each of {} keys in turn", self.names.len()),
            KeyPattern::Zipf => format!(
                "zipf (s = {}) over {} keys",
                options.zipf_exponent,
                self.names.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    fn keys(args: &[&str]) -> Keys {
        let options = Options::parse_from(std::iter::once("bench").chain(args.iter().copied()));
        Keys::new(&options).unwrap()
    }

    #[test]
    fn zipf_favours_the_first_keys_and_stays_in_range() {
        let keys = keys(&["--keys", "zipf", "--key-count", "100", "--key-prefix", "k"]);
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = [0u32; 100];
        for _ in 0..100_000 {
            let key = keys.draw(&mut rng);
            let index: usize = key[1..].parse().unwrap();
            counts[index] += 1;
        }
        // With s = 1, key 0 is drawn about twice as often as key 1 and ten
        // times as often as key 9.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((1.8..2.2).contains(&ratio), "ratio {ratio}, {counts:?}");
        assert!(counts[0] > 5 * counts[9], "{counts:?}");
        assert!(counts[99] > 0, "the last key is drawn too");
    }

    #[test]
    fn hot_is_one_key_and_uniform_covers_all() {
        let hot = keys(&["--keys", "hot", "--key-prefix", "h"]);
        let mut rng = SmallRng::seed_from_u64(1);
        assert!((0..100).all(|_| hot.draw(&mut rng) == "h0"));
        let uniform = keys(&["--key-count", "10", "--key-prefix", "u"]);
        let seen: std::collections::HashSet<&str> =
            (0..1000).map(|_| uniform.draw(&mut rng)).collect();
        assert_eq!(seen.len(), 10);
    }

    #[test]
    fn sequence_names_every_key_once_before_any_twice() {
        let keys = keys(&[
            "--keys",
            "sequence",
            "--key-count",
            "3",
            "--key-prefix",
            "s",
        ]);
        let mut rng = SmallRng::seed_from_u64(1);
        let drawn: Vec<&str> = (0..7).map(|_| keys.draw(&mut rng)).collect();
        assert_eq!(drawn, ["s0", "s1", "s2", "s0", "s1", "s2", "s0"]);
    }
}
