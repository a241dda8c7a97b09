//! The floor under CheckLimit: a tonic server of ratelimitd's own API whose
//! CheckLimit answers "allowed" at once, with no validation, no limiter
//! and no store, on tokio's multi-thread runtime, which ratelimitd runs with
//! two worker threads or more (with one it runs the current-thread one).
//! Driven by the same load generator as ratelimitd, the difference is what
//! ratelimitd itself spends per decision above tonic, HTTP/2 and protobuf.
//! Given a Redis URL too, it first sends Redis one `PING` per CheckLimit,
//! through one redis-rs multiplexed connection: the floor under any tonic
//! service that makes one Redis round trip per request.
//!
//! ```text
//! cargo run --release --example echo_server -- 127.0.0.1:50061 [redis://127.0.0.1:6379] &
//! target/release/ratelimitd-bench --address 127.0.0.1:50061 --duration 10s
//! ```

use std::net::SocketAddr;

use ratelimitd::pb::ratelimitd::v1::rate_limiter_server::{RateLimiter, RateLimiterServer};
use ratelimitd::pb::ratelimitd::v1::{
    CheckLimitRequest, CheckLimitResponse, CheckLimitsRequest, CheckLimitsResponse,
};
use tonic::{Request, Response, Status};

/// Answers every CheckLimit "allowed", as a full limit of 1000 would,
/// after a Redis `PING` if it has a Redis.
struct Echo {
    redis: Option<redis::aio::MultiplexedConnection>,
}

#[tonic::async_trait]
impl RateLimiter for Echo {
    async fn check_limit(
        &self,
        _request: Request<CheckLimitRequest>,
    ) -> Result<Response<CheckLimitResponse>, Status> {
        if let Some(redis) = &self.redis {
            let _pong: String = redis::cmd("PING")
                .query_async(&mut redis.clone())
                .await
                .map_err(|err| Status::unavailable(err.to_string()))?;
        }
        Ok(Response::new(CheckLimitResponse {
            allowed: true,
            limit: 1000,
            remaining: 999,
            reset_after: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            retry_after: Some(prost_types::Duration::default()),
            ..CheckLimitResponse::default()
        }))
    }

    async fn check_limits(
        &self,
        _request: Request<CheckLimitsRequest>,
    ) -> Result<Response<CheckLimitsResponse>, Status> {
        Err(Status::unimplemented(
            "the echo server answers CheckLimit only",
        ))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50061".to_owned())
        .parse()?;
    let redis = match std::env::args().nth(2) {
        Some(url) => Some(
            redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        ),
        None => None,
    };
    eprintln!("echo server on {address}");
    // Small replies go out at once, as ratelimitd's do.
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(RateLimiterServer::new(Echo { redis }))
        .serve(address)
        .await?;
    Ok(())
}
