//! Sheds calls beyond a server-wide number in flight: a call that finds
//! every slot taken gets `RESOURCE_EXHAUSTED` at once, instead of queueing
//! without bound while Redis is slow (a queue only turns a slow store into a
//! slow proxy and then a memory problem). A tower layer around every
//! service on the port.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::metrics;

/// Allows at most `limit` calls in flight across all connections.
#[derive(Clone)]
pub struct LoadShedLayer {
    slots: Arc<Semaphore>,
    limit: usize,
}

impl LoadShedLayer {
    pub fn new(limit: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadShed {
            inner,
            slots: self.slots.clone(),
            limit: self.limit,
        }
    }
}

#[derive(Clone)]
pub struct LoadShed<S> {
    inner: S,
    slots: Arc<Semaphore>,
    limit: usize,
}

/// A slot taken, counted in the in-flight gauge until dropped (also when a
/// client gives up and the call's future is dropped unfinished).
struct InFlight {
    _slot: OwnedSemaphorePermit,
}

impl InFlight {
    fn new(slot: OwnedSemaphorePermit) -> Self {
        metrics::in_flight(1.0);
        Self { _slot: slot }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::in_flight(-1.0);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for LoadShed<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let call = self.inner.call(request);
                let in_flight = InFlight::new(slot);
                Box::pin(async move {
                    let response = call.await;
                    // Held until the handler has answered (for a stream:
                    // until its headers are out), or the call is dropped.
                    drop(in_flight);
                    response
                })
            }
            Err(_) => {
                let status = tonic::Status::resource_exhausted(format!(
                    "more than {} calls in flight (--max-concurrent-requests)",
                    self.limit
                ));
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
