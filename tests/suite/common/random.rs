//! A small seeded generator (xorshift64*) for the differential tests, so
//! that a failing sequence replays from its seed.

pub(crate) struct Random(u64);

impl Random {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
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

    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.upto(items.len() as u64 - 1) as usize]
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.upto(99) < percent
    }
}
