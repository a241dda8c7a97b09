//! Waiting in the tests: for a condition to hold ([`eventually`]), for a
//! topology to settle ([`settle`], which says what was still not so), and
//! for a fresh minute. Every wait gives up after [`PATIENCE`].

use std::time::{Duration, Instant};

/// How long a test waits for a condition (a server up, a status flipped)
/// before failing. Generous: CI machines are slow, and a passing test never
/// waits this long.
pub(crate) const PATIENCE: Duration = Duration::from_secs(15);

/// How often [`settle`] looks again. Each look at a Redis topology opens a
/// few loopback connections.
const SETTLE_POLL: Duration = Duration::from_millis(50);

/// How often [`eventually`] looks again.
const CONDITION_POLL: Duration = Duration::from_millis(20);

/// Polls `condition` until it holds or [`PATIENCE`] runs out.
pub(crate) async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(what, CONDITION_POLL, || {
        let holds = condition();
        async move { if holds.await { Ok(()) } else { Err(None) } }
    })
    .await;
}

/// Polls `observe` until it gives `Ok`, and returns that. Panics after
/// [`PATIENCE`] with the last `Err`, which says what was still not so.
pub(crate) async fn settle<T, F, Fut>(what: &str, mut observe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll(what, SETTLE_POLL, || {
        let observed = observe();
        async move { observed.await.map_err(Some) }
    })
    .await
}

/// Polls `observe` every `interval` until it gives `Ok`; panics after
/// [`PATIENCE`] with what `what` waited for and the last reason, if any.
async fn poll<T, F, Fut>(what: &str, interval: Duration, mut observe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Option<String>>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match observe().await {
            Ok(value) => return value,
            Err(why) => assert!(
                Instant::now() < deadline,
                "timed out after {PATIENCE:?} waiting for {what}{}",
                why.map(|why| format!(": {why}")).unwrap_or_default()
            ),
        }
        tokio::time::sleep(interval).await;
    }
}

/// Tests that count in windows aligned to the minute (as envoyproxy/ratelimit
/// does) must not cross a minute boundary halfway: waits for the next
/// minute when little of this one is left (a wall-clock boundary, not a
/// condition anything could signal).
pub(crate) async fn fresh_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let into_minute = now.as_secs_f64() % 60.0;
    if into_minute > 45.0 {
        tokio::time::sleep(Duration::from_secs_f64(60.0 - into_minute + 0.2)).await;
    }
}
