//! What this instance hears of the others on a shared Redis: it beats,
//! learns which instances died (whose subscribers' demand every
//! settlement then leaves out, and whose shares every stream settles again
//! at once), and passes the others' nudges on to its own streams.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{info, warn};

use super::shared::Shared;
use crate::quota::presence::{Beat, Presence};
use crate::telemetry::WarnThrottle;

/// At most one warning per this of failed beats.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Beats every `shared.settings.beat_interval()` until the server shuts
/// down, from the first Envoy's subscription on: an instance that never
/// had one has no shares to hand on and stays off Redis (one whose lease
/// streams settle shares beats a quarter as often as the instance
/// timeout, reading no nudges). (It goes on
/// beating when its subscribers have gone: one that stopped and started
/// again would be taken for dead by the others, who would drop its new
/// subscribers' entries, until its next beat.)
pub(super) async fn follow(shared: Arc<Shared>, presence: Presence) {
    let mut shutdown = shared.shutdown.clone();
    let mut beats = tokio::time::interval(shared.settings.beat_interval());
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let failing = WarnThrottle::new(LOG_EVERY);
    // The first beat reads every nudge still kept: one written before it
    // (say, for a bucket subscribed here a moment ago) is not missed.
    let mut since = 0;
    let mut subscribed_once = false;
    // Only lease streams settle shares here: they read no nudges, and need
    // beats only often enough to stay alive to the others.
    let lease_beat = shared.settings.instance_timeout / 4;
    let mut last_beat: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = beats.tick() => {}
            changed = shutdown.changed() => if changed.is_err() || *shutdown.borrow() {
                return;
            },
        }
        subscribed_once = subscribed_once || shared.subscriptions.load(Ordering::Relaxed) > 0;
        let leases_only = !subscribed_once && shared.roster.in_use();
        if !subscribed_once && !leases_only {
            continue;
        }
        if leases_only && last_beat.is_some_and(|at| at.elapsed() < lease_beat) {
            continue;
        }
        last_beat = Some(tokio::time::Instant::now());
        match presence.beat(since).await {
            Ok(beat) => {
                since = beat.now_ms;
                take_in(&shared, beat);
            }
            // The ledger calls fail too, and answer with the failure
            // policy; the dead stay as last seen.
            Err(err) => failing.warn(|suppressed| {
                warn!(
                    %err,
                    suppressed,
                    "quota heartbeat failed: past --quota-instance-timeout the other instances \
                     take this one for dead and hand its Envoys' shares on (one warning per 10s)"
                );
            }),
        }
    }
}

/// Takes in what a beat learned.
fn take_in(shared: &Shared, beat: Beat) {
    let Beat { dead, nudged, .. } = beat;
    let newly_dead: Vec<&String> = {
        let known = shared.dead_instances();
        dead.iter().filter(|id| !known.contains(id)).collect()
    };
    if !newly_dead.is_empty() {
        info!(
            instances = ?newly_dead,
            "quota instances stopped beating: their Envoys' shares are handed on once those \
             Envoys subscribe again elsewhere, or their assignments run out"
        );
    }
    let any_newly_dead = !newly_dead.is_empty();
    shared.roster.set_dead(dead);
    if any_newly_dead {
        shared.nudges.nudge_all();
    }
    for (instance, key) in nudged {
        // This instance's own streams were nudged when it wrote them.
        if instance != shared.roster.instance() {
            shared.nudges.nudge(&key, 0);
        }
    }
}
