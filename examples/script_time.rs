//! Measures how long Redis spends in one decision script at the bounds a
//! caller can reach: a sliding-log cost as large as its limit, a denial and a
//! call on a log of 100 000 entries, a call after 100 000 entries left the
//! window, and one ShouldRateLimit-sized script of 64 limits (the most one
//! script decides). Redis's own count (`INFO commandstats`, microseconds
//! inside the script) after `CONFIG RESETSTAT`, so the network is not in it.
//!
//! Run against a Redis you choose (it writes keys under its own prefix and
//! deletes them after; it never flushes, but it does reset that Redis's
//! command statistics). It takes about 25 s, most of it waiting for a
//! window to pass:
//!
//! ```text
//! cargo run --release --example script_time -- redis://127.0.0.1:6390/0
//! ```

use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt, TryStreamExt};
use ratelimitd::algorithm::{
    Algorithm, FixedWindow, Gcra, LimitRequest, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use ratelimitd::limit::CallerKey;
use ratelimitd::limiter::{Limiter, Store, storage_key};
use ratelimitd::store::{RedisSettings, RedisStore, Topology};
use redis::aio::MultiplexedConnection;

const PREFIX: &str = "ratelimitd-script-time-example:";

type Error = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: script_time REDIS_URL (e.g. redis://127.0.0.1:6390/0)")?;
    let store = RedisStore::new(&RedisSettings {
        urls: vec![url.clone()],
        topology: Topology::Standalone,
        sentinel: Default::default(),
        pool_size: 8,
        connect_timeout: Duration::from_secs(2),
        command_timeout: Duration::from_secs(10),
        breaker_threshold: 3,
        batch_calls: 64,
        tls: Default::default(),
    })?;
    // No denial cache: every question goes to Redis.
    let limiter = &Limiter::new(Store::Redis(store), PREFIX);
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    println!("| script | Redis time per call |");
    println!("|---|---|");

    // Each on a key of its own.
    let big = &(0..100)
        .map(|i| {
            sliding(
                &format!("big-{i}"),
                100_000,
                Duration::from_secs(60),
                100_000,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let next_big = &std::cell::Cell::new(0);
    report(
        &mut redis,
        "sliding log, cost 100 000 of 100 000",
        100,
        || async move {
            limiter
                .check(&big[next_big.replace(next_big.get() + 1)], None)
                .await?;
            Ok(())
        },
    )
    .await?;

    // A log of 99 999 entries of one unit each, in a 10 s window, limit
    // 100 000: cost 2 is denied.
    let window = Duration::from_secs(10);
    let started = Instant::now();
    let one = &sliding("full", 100_000, window, 1)?;
    spend_many(limiter, one, 99_999).await?;
    let filled = Instant::now();
    println!("(99 999 entries written in {:?})", filled - started);
    let denied = &LimitRequest {
        cost: 2,
        ..one.clone()
    };
    report(
        &mut redis,
        "sliding log of 99 999 entries, denial",
        100,
        || async move {
            limiter.check(denied, None).await?;
            Ok(())
        },
    )
    .await?;
    let look = &LimitRequest {
        cost: 0,
        ..one.clone()
    };
    report(
        &mut redis,
        "sliding log of 99 999 entries, look",
        100,
        || async move {
            limiter.check(look, None).await?;
            Ok(())
        },
    )
    .await?;

    // Keep the key alive past the entries' window with one later entry,
    // then call once they have all left.
    tokio::time::sleep_until((filled + window / 2).into()).await;
    limiter.check(one, None).await?;
    tokio::time::sleep_until((filled + window + Duration::from_millis(300)).into()).await;
    report(
        &mut redis,
        "sliding log after 99 999 entries left the window (prunes 128)",
        100,
        || async move {
            limiter.check(one, None).await?;
            Ok(())
        },
    )
    .await?;

    // 64 limits in one script, each on its own key (an Envoy request at the
    // per-script cap): spending, and denied on the last limit.
    for (name, make) in algorithms() {
        let mut requests = Vec::new();
        for i in 0..64 {
            requests.push(LimitRequest {
                key: CallerKey::new(format!("{name}-{i}"))?,
                algorithm: make(1_000_000)?,
                cost: 1,
                shadow: false,
            });
        }
        let requests = &requests;
        report(
            &mut redis,
            &format!("64 limits, {name}, allowed"),
            100,
            || async move {
                limiter.check_all(requests, None).await?;
                Ok(())
            },
        )
        .await?;
    }

    for key in big.iter().chain([one]) {
        let _: i64 = redis::cmd("DEL")
            .arg(storage_key(PREFIX, &key.algorithm, &key.key))
            .query_async(&mut redis)
            .await?;
    }
    for (name, make) in algorithms() {
        for i in 0..64 {
            let key = CallerKey::new(format!("{name}-{i}"))?;
            let _: i64 = redis::cmd("DEL")
                .arg(storage_key(PREFIX, &make(1_000_000)?, &key))
                .query_async(&mut redis)
                .await?;
        }
    }
    Ok(())
}

type MakeAlgorithm = fn(u64) -> Result<Algorithm, ratelimitd::limit::InvalidArgument>;

fn algorithms() -> [(&'static str, MakeAlgorithm); 5] {
    [
        ("fixed_window", |limit| {
            Ok(Algorithm::FixedWindow(FixedWindow::new(
                limit,
                Duration::from_secs(3600),
            )?))
        }),
        ("sliding_window", |_| {
            Ok(Algorithm::SlidingWindow(SlidingWindow::new(
                100_000,
                Duration::from_secs(3600),
            )?))
        }),
        ("token_bucket", |limit| {
            Ok(Algorithm::TokenBucket(TokenBucket::new(limit, 1.0)?))
        }),
        ("gcra", |limit| {
            Ok(Algorithm::Gcra(Gcra::new(
                limit,
                Duration::from_secs(3600),
                limit,
            )?))
        }),
        ("sliding_window_counter", |limit| {
            Ok(Algorithm::SlidingWindowCounter(SlidingWindowCounter::new(
                limit,
                Duration::from_secs(3600),
            )?))
        }),
    ]
}

fn sliding(key: &str, limit: u64, window: Duration, cost: u64) -> Result<LimitRequest, Error> {
    Ok(LimitRequest {
        key: CallerKey::new(key.into())?,
        algorithm: Algorithm::SlidingWindow(SlidingWindow::new(limit, window)?),
        cost,
        shadow: false,
    })
}

/// `count` spending calls, 64 in flight.
async fn spend_many(limiter: &Limiter, request: &LimitRequest, count: usize) -> Result<(), Error> {
    stream::iter(0..count)
        .map(|_| limiter.check(request, None))
        .buffer_unordered(64)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(())
}

/// Runs `call` `times` times after resetting Redis's statistics and prints
/// the script's mean time per call inside Redis.
async fn report<F, Fut>(
    redis: &mut MultiplexedConnection,
    what: &str,
    times: usize,
    mut call: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(redis)
        .await?;
    for _ in 0..times {
        call().await?;
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    let (calls, usec) = info
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            let field = |name: &str| -> Option<f64> {
                line.split(&format!("{name}="))
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            };
            Some((field("calls")?, field("usec")?))
        })
        .fold((0.0, 0.0), |(c, u), (calls, usec)| (c + calls, u + usec));
    if calls == 0.0 {
        return Err(format!("{what}: no script call counted").into());
    }
    println!("| {what} | {:.0} µs |", usec / calls);
    Ok(())
}
