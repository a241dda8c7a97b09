//! Which of this instance's streams subscribe to which bucket, so that one
//! stream's change (a share freed, a newcomer starved) makes the others
//! settle again at once instead of at their Envoy's next report. (Other
//! instances hear of it through `quota::presence`, and `instances` passes
//! it on here.)

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;

/// A subscribed stream: its number, and where its nudges go.
type Subscriber = (u64, mpsc::Sender<String>);

/// Each bucket key's subscribed streams.
#[derive(Default)]
pub(super) struct Nudges {
    by_bucket: Mutex<HashMap<String, Vec<Subscriber>>>,
}

impl Nudges {
    /// Stream `stream` will hear of changes to `key` on `sender`.
    pub(super) fn subscribe(&self, key: &str, stream: u64, sender: &mpsc::Sender<String>) {
        let mut by_bucket = self
            .by_bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        by_bucket
            .entry(key.to_owned())
            .or_default()
            .push((stream, sender.clone()));
    }

    /// Stream `stream` no longer subscribes to `key`.
    pub(super) fn unsubscribe(&self, key: &str, stream: u64) {
        let mut by_bucket = self
            .by_bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(streams) = by_bucket.get_mut(key) {
            streams.retain(|(number, _)| *number != stream);
            if streams.is_empty() {
                by_bucket.remove(key);
            }
        }
    }

    /// Tells every other stream subscribed to `key` to settle it again. A
    /// stream whose queue is full misses the nudge: it settles at its next
    /// report anyway.
    pub(super) fn nudge(&self, key: &str, from: u64) {
        let by_bucket = self
            .by_bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (stream, sender) in by_bucket.get(key).into_iter().flatten() {
            if *stream != from {
                let _ = sender.try_send(key.to_owned());
            }
        }
    }
}

impl Nudges {
    /// Tells every stream to settle every bucket it subscribes to again (an
    /// instance died: its shares are free). A stream whose queue fills up
    /// settles the rest at its next rebalance.
    pub(super) fn nudge_all(&self) {
        let by_bucket = self
            .by_bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (key, streams) in by_bucket.iter() {
            for (_, sender) in streams {
                let _ = sender.try_send(key.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_reaches_the_other_subscribers_only() {
        let nudges = Nudges::default();
        let (one, mut one_rx) = mpsc::channel(4);
        let (two, mut two_rx) = mpsc::channel(4);
        nudges.subscribe("k", 1, &one);
        nudges.subscribe("k", 2, &two);
        nudges.subscribe("other", 2, &two);
        nudges.nudge("k", 1);
        assert_eq!(two_rx.try_recv().ok().as_deref(), Some("k"));
        assert!(one_rx.try_recv().is_err());
        nudges.unsubscribe("k", 2);
        nudges.nudge("k", 1);
        assert!(two_rx.try_recv().is_err());
        nudges.unsubscribe("k", 1);
        nudges.unsubscribe("other", 2);
        assert!(nudges.by_bucket.lock().unwrap().is_empty());
    }
}
