//! Which worker thread the caller runs on, for what is kept per thread so
//! that a thread's calls never wait on another thread: the Redis store's
//! batch queues and connection pools. Each worker thread runs a runtime of
//! its own (see `server::threads`), so a task stays on the thread it was
//! spawned on, and what it finds here stays true for it.

use std::cell::Cell;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many worker threads serve: 1 until the server's runtimes start.
static COUNT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// This thread's number among the worker threads; 0 on any other
    /// thread (the main one, the blocking pool's, a test's).
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// How many worker threads serve.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// The calling thread's number among the worker threads, below [`count`].
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Says how many worker threads serve: before any store is built, so that
/// each sizes its per-thread parts for them.
pub(crate) fn set_count(count: NonZeroUsize) {
    COUNT.store(count.get(), Ordering::Relaxed);
}

/// Makes the calling thread worker thread `index`.
pub(crate) fn enter(index: usize) {
    INDEX.with(|cell| cell.set(index));
}

/// One `T` for each worker thread, each used by its own thread.
#[derive(Debug)]
pub struct PerThread<T>(Box<[T]>);

impl<T> PerThread<T> {
    /// One `T` for each worker thread (one at least), each made by `make`.
    pub fn new(make: impl FnMut() -> T) -> Self {
        Self(std::iter::repeat_with(make).take(count().max(1)).collect())
    }

    /// [`PerThread::new`], with a `make` that may fail.
    pub fn try_new<E>(make: impl FnMut() -> Result<T, E>) -> Result<Self, E> {
        let parts = std::iter::repeat_with(make)
            .take(count().max(1))
            .collect::<Result<Box<[T]>, E>>()?;
        Ok(Self(parts))
    }

    /// The calling thread's.
    pub fn get(&self) -> &T {
        // Never empty: both constructors make one at least.
        &self.0[index() % self.0.len()]
    }

    /// Every thread's.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_gets_its_own_part() {
        let mut made = 0;
        let parts = PerThread(
            std::iter::repeat_with(|| {
                made += 1;
                made
            })
            .take(3)
            .collect(),
        );
        assert_eq!(*parts.get(), 1, "a thread that is no worker gets the first");
        let seen: Vec<usize> = (0..4)
            .map(|worker| {
                let parts = &parts;
                std::thread::scope(|scope| {
                    scope
                        .spawn(move || {
                            enter(worker);
                            *parts.get()
                        })
                        .join()
                        .unwrap()
                })
            })
            .collect();
        assert_eq!(seen, [1, 2, 3, 1], "by the thread's number, round");
        assert_eq!(parts.iter().count(), 3);
    }
}
