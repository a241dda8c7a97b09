//! The heaviest hitters of a stream of keys in bounded memory: the
//! space-saving algorithm (Metwally, Agrawal and El Abbadi, 2005). It keeps
//! at most `capacity` keys with a count each; a key not kept takes the
//! place of the one with the smallest count and inherits that count (its
//! possible overestimate, kept beside it). Every key seen more than
//! `total / capacity` times is kept, and no kept count is low by anything:
//! `count - overestimate <= true count <= count`.

use std::collections::HashMap;

/// One kept key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hitter {
    /// The key.
    pub key: String,
    /// Times seen, perhaps over by up to `overestimate`.
    pub count: u64,
    /// How much of `count` may belong to keys it replaced.
    pub overestimate: u64,
}

/// The sketch.
#[derive(Debug, Clone)]
pub(crate) struct SpaceSaving {
    capacity: usize,
    kept: Vec<Hitter>,
    /// Where each kept key is in `kept`.
    places: HashMap<String, usize>,
}

impl SpaceSaving {
    /// A sketch keeping at most `capacity` keys (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            kept: Vec::with_capacity(capacity),
            places: HashMap::with_capacity(capacity),
        }
    }

    /// Counts `key` once more.
    pub(crate) fn offer(&mut self, key: &str) {
        if let Some(&place) = self.places.get(key) {
            self.kept[place].count += 1;
            return;
        }
        if self.kept.len() < self.capacity {
            self.places.insert(key.to_owned(), self.kept.len());
            self.kept.push(Hitter {
                key: key.to_owned(),
                count: 1,
                overestimate: 0,
            });
            return;
        }
        // Full: the smallest count gives way. A linear scan, as the sketch
        // is small (tens of keys) and only a key not kept pays it.
        let Some((place, smallest)) = self
            .kept
            .iter()
            .enumerate()
            .min_by_key(|(_, hitter)| hitter.count)
            .map(|(place, hitter)| (place, hitter.count))
        else {
            return;
        };
        let gone = std::mem::replace(
            &mut self.kept[place],
            Hitter {
                key: key.to_owned(),
                count: smallest + 1,
                overestimate: smallest,
            },
        );
        self.places.remove(&gone.key);
        self.places.insert(key.to_owned(), place);
    }

    /// The kept keys, most counted first (ties by key, so the order is
    /// stable).
    pub(crate) fn top(&self) -> Vec<Hitter> {
        let mut top = self.kept.clone();
        top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        top
    }

    /// Forgets every key.
    #[cfg(test)]
    pub(crate) fn clear(&mut self) {
        self.kept.clear();
        self.places.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_capacity_every_count_is_exact() {
        let mut sketch = SpaceSaving::new(3);
        for key in ["a", "b", "a", "c", "a", "b"] {
            sketch.offer(key);
        }
        let top: Vec<(String, u64, u64)> = sketch
            .top()
            .into_iter()
            .map(|h| (h.key, h.count, h.overestimate))
            .collect();
        assert_eq!(
            top,
            vec![("a".into(), 3, 0), ("b".into(), 2, 0), ("c".into(), 1, 0)]
        );
    }

    #[test]
    fn a_newcomer_replaces_the_smallest_and_inherits_its_count_as_overestimate() {
        let mut sketch = SpaceSaving::new(2);
        for key in ["a", "a", "a", "b", "c"] {
            sketch.offer(key);
        }
        let top = sketch.top();
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].key.as_str(), top[0].count), ("a", 3));
        assert_eq!(
            (top[1].key.as_str(), top[1].count, top[1].overestimate),
            ("c", 2, 1)
        );
        // The replaced key is counted afresh when it comes back.
        sketch.offer("b");
        let b = sketch.top().into_iter().find(|h| h.key == "b").unwrap();
        assert_eq!((b.count, b.overestimate), (3, 2));
    }

    #[test]
    fn heavy_hitters_survive_a_long_tail_and_bounds_hold() {
        let mut sketch = SpaceSaving::new(20);
        let mut truth: HashMap<String, u64> = HashMap::new();
        // Three heavy keys among 5000 distinct light ones, interleaved.
        for i in 0..5000u64 {
            let light = format!("light-{i}");
            sketch.offer(&light);
            *truth.entry(light).or_default() += 1;
            for heavy in ["h1", "h2", "h3"] {
                if i % (1 + heavy.as_bytes()[1] as u64 - b'0' as u64) == 0 {
                    sketch.offer(heavy);
                    *truth.entry(heavy.to_owned()).or_default() += 1;
                }
            }
        }
        let top = sketch.top();
        assert_eq!(top.len(), 20);
        let names: Vec<&str> = top.iter().take(3).map(|h| h.key.as_str()).collect();
        assert_eq!(names, ["h1", "h2", "h3"]);
        for hitter in &top {
            let real = truth[&hitter.key];
            assert!(
                hitter.count - hitter.overestimate <= real && real <= hitter.count,
                "{hitter:?}: really {real}"
            );
        }
        sketch.clear();
        assert!(sketch.top().is_empty());
    }
}
