//! A request's body as the service listener reads it: at most a bound of
//! bytes (`--max-request-bytes`, as gRPC's), and all of it within
//! `--http-read-timeout` of the headers, so a client that sends slowly or
//! endlessly is told so rather than holding the connection.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::http::header::CONTENT_LENGTH;
use futures::StreamExt;

/// How much a body may hold and how long it may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyBounds {
    /// Most bytes.
    pub max_bytes: usize,
    /// Longest from the headers to the body's last byte.
    pub read_timeout: Duration,
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// It holds (or says it holds) more than the bound.
    #[error("must be at most {max_bytes} bytes (the server's --max-request-bytes)")]
    TooLarge {
        /// The bound.
        max_bytes: usize,
    },
    /// It did not all come within the deadline.
    #[error("must arrive whole within {0:?} (the server's --http-read-timeout)")]
    TooSlow(Duration),
    /// The connection failed while it came.
    #[error("could not be read: {0}")]
    Broken(String),
}

/// The whole body, within `bounds`. A `content-length` over the bound is
/// refused before a byte is read.
pub(crate) async fn read(
    body: Body,
    headers: &HeaderMap,
    bounds: BodyBounds,
) -> Result<Bytes, BodyError> {
    let too_large = BodyError::TooLarge {
        max_bytes: bounds.max_bytes,
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    if declared.is_some_and(|length| length > bounds.max_bytes as u64) {
        return Err(too_large);
    }
    match tokio::time::timeout(bounds.read_timeout, collect(body, bounds.max_bytes)).await {
        Ok(read) => read,
        Err(_) => Err(BodyError::TooSlow(bounds.read_timeout)),
    }
}

async fn collect(body: Body, max_bytes: usize) -> Result<Bytes, BodyError> {
    let mut chunks = body.into_data_stream();
    let mut whole = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|err| BodyError::Broken(err.to_string()))?;
        if whole.len() + chunk.len() > max_bytes {
            return Err(BodyError::TooLarge { max_bytes });
        }
        whole.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(whole))
}
