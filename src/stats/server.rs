//! Upstream's gRPC server statistics: for each unary call of a method
//! upstream serves (`ShouldRateLimit`, and health's `Check`), one
//! `ratelimit_server.<method>.total_requests` and its response time in
//! whole milliseconds, `ratelimit_server.<method>.response_time`, as
//! upstream's interceptor counts them. A tower layer around the services.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::Either;

use tower::{Layer, Service};

use super::upstream::MethodStats;

/// The unary methods upstream serves, by path, and their names.
const METHODS: [(&str, &str); 2] = [
    (
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        "ShouldRateLimit",
    ),
    ("/grpc.health.v1.Health/Check", "Check"),
];

/// The method of `path` upstream counts, by name.
pub(crate) fn method_of(path: &str) -> Option<&'static str> {
    METHODS
        .iter()
        .find(|(known, _)| *known == path)
        .map(|(_, name)| *name)
}

/// Wraps a service in `Counted`.
#[derive(Clone, Default)]
pub(crate) struct ServerStatsLayer;

impl<S> Layer<S> for ServerStatsLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted { inner }
    }
}

/// A service whose calls of upstream's methods are counted and timed.
#[derive(Clone)]
pub(crate) struct Counted<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    /// Calls upstream does not count go through as they are; only counted
    /// ones pay for the timing future.
    type Future = Either<S::Future, BoxFuture<Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let stats: Option<MethodStats> = method_of(request.uri().path()).and_then(super::method);
        let call = self.inner.call(request);
        let Some(stats) = stats else {
            return Either::Left(call);
        };
        Either::Right(Box::pin(async move {
            let started = Instant::now();
            stats.total_requests.inc();
            let response = call.await;
            let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            stats.response_time.record_millis(millis);
            response
        }))
    }
}
