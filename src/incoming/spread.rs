//! Hands each accepted connection to the serving thread with the fewest
//! open, so that every thread's runtime serves its part of the clients.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tracing::error;

/// Connections handed to each serving thread and still open there.
#[derive(Debug)]
struct OpenByThread(Box<[AtomicUsize]>);

/// The sending side: where each new connection goes.
#[derive(Debug)]
pub(super) struct Spread<T> {
    threads: Vec<UnboundedSender<T>>,
    open: Arc<OpenByThread>,
    /// Threads whose share is no longer taken.
    gone: Vec<bool>,
    /// Where the search for the fewest starts: ties go round in turn.
    turn: usize,
}

/// One thread's share of the connections, as they are handed to it.
pub(crate) type Share<T> = UnboundedReceiver<T>;

/// One connection counted as open on its thread, until dropped.
#[derive(Debug)]
pub(super) struct ThreadSlot {
    open: Arc<OpenByThread>,
    thread: usize,
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        self.open.0[self.thread].fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T> Spread<T> {
    /// A spread among `threads` threads (at least one), and each one's share.
    pub(super) fn new(threads: usize) -> (Self, Vec<Share<T>>) {
        let (senders, shares) = (0..threads.max(1)).map(|_| unbounded_channel()).unzip();
        let open = (0..threads.max(1)).map(|_| AtomicUsize::new(0)).collect();
        let spread = Self {
            threads: senders,
            open: Arc::new(OpenByThread(open)),
            gone: vec![false; threads.max(1)],
            turn: 0,
        };
        (spread, shares)
    }

    /// Hands `connection` to the thread with the fewest open; `counted`
    /// puts the slot that counts it there into it first. A thread whose
    /// share is no longer taken (its server has stopped) is passed over;
    /// with none left, the connection is dropped.
    pub(super) fn hand(&mut self, mut connection: T, counted: impl Fn(&mut T, ThreadSlot)) {
        loop {
            let Some(thread) = self.fewest() else {
                error!("no serving thread takes connections: closed a new one");
                return;
            };
            self.open.0[thread].fetch_add(1, Ordering::AcqRel);
            counted(
                &mut connection,
                ThreadSlot {
                    open: self.open.clone(),
                    thread,
                },
            );
            match self.threads[thread].send(connection) {
                Ok(()) => {
                    self.turn = (thread + 1) % self.threads.len();
                    return;
                }
                Err(returned) => {
                    error!(thread, "a serving thread has stopped taking connections");
                    self.gone[thread] = true;
                    // Its slot is replaced on the next try.
                    connection = returned.0;
                }
            }
        }
    }

    /// The thread with the fewest open, the first from `turn` on a tie;
    /// `None` when every thread is gone.
    fn fewest(&self) -> Option<usize> {
        let count = self.threads.len();
        (0..count)
            .map(|step| (self.turn + step) % count)
            .filter(|&thread| !self.gone[thread])
            .min_by_key(|&thread| self.open.0[thread].load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in connection that keeps its thread slot.
    #[derive(Debug, Default)]
    struct Counted(Option<ThreadSlot>);

    fn put(connection: &mut Counted, slot: ThreadSlot) {
        connection.0 = Some(slot);
    }

    fn received(share: &mut Share<Counted>) -> Vec<Counted> {
        std::iter::from_fn(|| share.try_recv().ok()).collect()
    }

    #[test]
    fn connections_go_to_the_thread_with_the_fewest_open_in_turn_on_a_tie() {
        let (mut spread, mut shares) = Spread::new(3);
        let mut hand = |spread: &mut Spread<Counted>| {
            spread.hand(Counted::default(), put);
            shares.iter_mut().map(received).collect::<Vec<_>>()
        };
        let mut open = Vec::new();
        for expected in 0..3 {
            let got = hand(&mut spread);
            assert_eq!(
                got.iter().map(Vec::len).collect::<Vec<_>>()[expected],
                1,
                "in turn"
            );
            open.extend(got.into_iter().flatten());
        }
        // Thread 1's connection closes: the next goes there, out of turn.
        drop(open.remove(1));
        let got = hand(&mut spread);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [0, 1, 0]);
        open.extend(got.into_iter().flatten());
        // All even again: the turn goes on from the thread after it.
        let got = hand(&mut spread);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [0, 0, 1]);
    }

    #[test]
    fn a_thread_that_stopped_taking_connections_is_passed_over() {
        let (mut spread, mut shares) = Spread::new(2);
        drop(shares.remove(0));
        let mut kept = Vec::new();
        for _ in 0..3 {
            spread.hand(Counted::default(), put);
        }
        kept.extend(received(&mut shares[0]));
        assert_eq!(kept.len(), 3, "every connection to the thread left");
        assert_eq!(spread.open.0[1].load(Ordering::Acquire), 3);
        drop(kept);
        assert_eq!(
            spread.open.0[1].load(Ordering::Acquire),
            0,
            "closed ones are uncounted"
        );
        drop(shares);
        spread.hand(Counted::default(), put);
        assert_eq!(
            spread.fewest(),
            None,
            "none left: the connection was dropped"
        );
    }
}
