//! Sends the costliest ShouldRateLimit the default bounds let through, one
//! at a time, and reports the mean and worst round trip; read the server's
//! CPU time from /proc before and after to get its CPU per request. Run
//! against a ratelimitd started with `--config tests/fixtures/ratelimit`
//! (whose `example9` domain gives each `key1: value*` value a counter):
//!
//! ```text
//! cargo run --release --example worst_request -- http://127.0.0.1:50051 wide 200
//! ```
//!
//! Shapes: `wide` is 64 descriptors (the default cap) of one 4096-byte
//! entry (the default cap), each a counter of its own, 256 KiB in all;
//! `deep` is 64 descriptors of 16 entries (the default cap) of 1000-byte
//! values, just under the 1 MiB request cap, only the first entry matching a
//! rule.

use std::time::{Duration, Instant};

use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: worst_request ADDRESS wide|deep COUNT";
    let address = args.next().ok_or(usage)?;
    let shape = args.next().ok_or(usage)?;
    let count: usize = args.next().ok_or(usage)?.parse()?;
    let mut client = RateLimitServiceClient::connect(address)
        .await?
        .max_encoding_message_size(2 << 20);
    let (mut total, mut worst) = (Duration::ZERO, Duration::ZERO);
    for round in 0..count {
        let descriptors = (0..64)
            .map(|i| {
                let counted = Entry {
                    key: "key1".into(),
                    value: format!("value-{round}-{i}-{}", "v".repeat(4000)),
                };
                let entries = match shape.as_str() {
                    "wide" => vec![counted],
                    "deep" => std::iter::once(Entry {
                        value: counted.value[..1000].to_owned(),
                        ..counted
                    })
                    .chain((1..16).map(|j| Entry {
                        key: format!("extra{j}"),
                        value: "x".repeat(1000),
                    }))
                    .collect(),
                    _ => panic!("{usage}"),
                };
                RateLimitDescriptor {
                    entries,
                    ..Default::default()
                }
            })
            .collect();
        let request = RateLimitRequest {
            domain: "example9".into(),
            descriptors,
            hits_addend: 1,
        };
        let sent = Instant::now();
        client.should_rate_limit(request).await?;
        let took = sent.elapsed();
        total += took;
        worst = worst.max(took);
    }
    println!(
        "{count} {shape} requests: mean {:?}, worst {worst:?}",
        total / count as u32
    );
    Ok(())
}
