//! Marks each call on the connection it came on (the [`Activity`] that
//! `incoming` gives every connection), from its arrival until its whole
//! answer has been handed to the connection (the response body's end) or
//! the call is dropped, so a connection knows when it is idle and, when the
//! server shuts down, when it may close. Streams that end only when the
//! client goes (`Health.Watch`, reflection) are marked as streams: they keep
//! a connection from idling out, but a shutdown ends them instead of
//! waiting. A tower layer around every service on the port.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame, SizeHint};
use tower::{Layer, Service};

use crate::incoming::{ActivityGuard, ConnectionInfo};

/// Methods whose calls are open-ended streams.
const STREAMING_PATHS: [&str; 3] = [
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Wraps a service in [`Drain`].
#[derive(Clone, Default)]
pub(crate) struct DrainLayer;

impl<S> Layer<S> for DrainLayer {
    type Service = Drain<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Drain { inner }
    }
}

/// A service whose calls are counted while in flight, so shutdown can wait for them.
#[derive(Clone)]
pub(crate) struct Drain<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Drain<S>
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
        let streaming = STREAMING_PATHS.contains(&request.uri().path());
        // Absent only for a connection not accepted by `incoming`.
        let guard = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|info| info.activity.enter(streaming));
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            Ok(match guard {
                Some(guard) => response.map(|body| {
                    tonic::body::Body::new(CountedBody {
                        inner: body,
                        _guard: guard,
                    })
                }),
                None => response,
            })
        })
    }
}

/// A response body that keeps its call marked until it has ended or is
/// dropped.
struct CountedBody {
    inner: tonic::body::Body,
    _guard: ActivityGuard,
}

impl HttpBody for CountedBody {
    type Data = <tonic::body::Body as HttpBody>::Data;
    type Error = <tonic::body::Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
