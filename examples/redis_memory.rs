//! Measures the Redis memory one limit's key takes, per algorithm, with
//! `MEMORY USAGE key SAMPLES 0` (exact, every element counted).
//!
//! Run against a Redis you choose (it writes keys under its own prefix and
//! deletes them after; it never flushes):
//!
//! ```text
//! cargo run --example redis_memory -- redis://127.0.0.1:6390/0
//! ```

use std::time::Duration;

use ratelimitd::algorithm::{
    Algorithm, FixedWindow, Gcra, LimitRequest, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use ratelimitd::limit::CallerKey;
use ratelimitd::limiter::{Limiter, Store, storage_key};
use ratelimitd::store::{RedisSettings, RedisStore, Topology};

const PREFIX: &str = "ratelimitd-memory-example:";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: redis_memory REDIS_URL (e.g. redis://127.0.0.1:6390/0)")?;
    let store = RedisStore::new(&RedisSettings {
        urls: vec![url.clone()],
        topology: Topology::Standalone,
        sentinel: Default::default(),
        pool_size: 1,
        connect_timeout: Duration::from_secs(2),
        command_timeout: Duration::from_secs(10),
        breaker_threshold: 3,
        batch_calls: 64,
        tls: Default::default(),
    })?;
    let limiter = Limiter::new(Store::Redis(store), PREFIX);
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;

    let hour = Duration::from_secs(3600);
    println!("| algorithm | units spent | key bytes (MEMORY USAGE) |");
    println!("|---|---|---|");
    for (spent, limit) in [(1, 1000), (10, 1000), (100, 1000), (1000, 1000)] {
        let cases = [
            Algorithm::FixedWindow(FixedWindow::new(limit, hour)?),
            Algorithm::SlidingWindow(SlidingWindow::new(limit, hour)?),
            Algorithm::TokenBucket(TokenBucket::new(limit, 0.1)?),
            // 1000 an hour, bursts of 1000.
            Algorithm::Gcra(Gcra::new(limit, hour, limit)?),
            Algorithm::SlidingWindowCounter(SlidingWindowCounter::new(limit, hour)?),
        ];
        for algorithm in cases {
            // One request per unit, as callers spend them.
            let caller_key = format!("user{spent}");
            let request = LimitRequest {
                key: CallerKey::new(caller_key.clone())?,
                algorithm,
                cost: 1,
                shadow: false,
            };
            for _ in 0..spent {
                limiter.check(&request, None).await?;
            }
            let key = storage_key(PREFIX, &algorithm, &request.key);
            let bytes: i64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut redis)
                .await?;
            println!("| {} | {spent} | {bytes} |", algorithm.name());
            let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut redis).await?;
        }
    }
    Ok(())
}
