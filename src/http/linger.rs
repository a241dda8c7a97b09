//! A lingering close for the HTTP listeners, as nginx and Go's `net/http`
//! do: when a connection closes, its write side is shut first (the answer
//! and a FIN go out) and what the client still sends is read and thrown
//! away, up to a bound in bytes and in time, before the socket is closed.
//! Without it, a server that answers early (a body over
//! `--max-request-bytes` gets 413 before it is read) closes a socket with
//! unread data, the kernel sends a reset, and a client that writes its
//! whole body before reading (Python's `urllib`, Node's `fetch`) sees a
//! broken pipe instead of the answer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::metrics;

/// The most a closing connection reads and throws away: past it the
/// client is not finishing a request body but streaming, and is cut off.
pub(crate) const MAX_DISCARDED_BYTES: u64 = 64 * 1024 * 1024;

/// How much is read at a time while draining.
const DRAIN_CHUNK: usize = 16 * 1024;

/// How a lingering close ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LingerEnd {
    /// The client closed its side: everything it sent was read.
    Closed,
    /// [`MAX_DISCARDED_BYTES`] were thrown away.
    ByteLimit,
    /// The time bound passed first.
    TimeLimit,
    /// Reading failed (the client reset the connection).
    Error,
}

impl LingerEnd {
    /// Its label in `ratelimitd_http_lingering_closes_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::ByteLimit => "byte_limit",
            Self::TimeLimit => "time_limit",
            Self::Error => "error",
        }
    }
}

enum State {
    /// Serving: reads and writes pass through.
    Open,
    /// Written side shut; reading and throwing away until the client
    /// closes or a bound is reached.
    Draining {
        deadline: Pin<Box<Sleep>>,
        discarded: u64,
    },
    /// Done lingering: the socket may close.
    Done,
}

/// A connection whose shutdown lingers (see the module's comment).
pub(crate) struct Lingering<S> {
    inner: S,
    state: State,
    /// Longest it lingers.
    linger: Duration,
}

impl<S> Lingering<S> {
    /// `inner`, lingering up to `linger` (and [`MAX_DISCARDED_BYTES`]) when
    /// it shuts down.
    pub(crate) fn new(inner: S, linger: Duration) -> Self {
        Self {
            inner,
            state: State::Open,
            linger,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Lingering<S> {
    /// Reads and throws away until the client closes, or a bound.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let State::Draining {
            deadline,
            discarded,
        } = &mut self.state
        else {
            return Poll::Ready(());
        };
        let mut chunk = [0u8; DRAIN_CHUNK];
        let end = loop {
            if deadline.as_mut().poll(cx).is_ready() {
                break LingerEnd::TimeLimit;
            }
            let mut buffer = ReadBuf::new(&mut chunk);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buffer) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => break LingerEnd::Error,
                Poll::Ready(Ok(())) if buffer.filled().is_empty() => break LingerEnd::Closed,
                Poll::Ready(Ok(())) => {
                    *discarded += buffer.filled().len() as u64;
                    if *discarded >= MAX_DISCARDED_BYTES {
                        break LingerEnd::ByteLimit;
                    }
                }
            }
        };
        // A client that closed at once, having sent nothing more, is the
        // ordinary end of a connection: only real lingering is counted.
        if *discarded > 0 || end != LingerEnd::Closed {
            metrics::http_lingering_close(end.label(), *discarded);
        }
        self.state = State::Done;
        Poll::Ready(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Lingering<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buffer)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, bytes)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let State::Open = this.state {
            // The answer and a FIN go out first; a socket already gone has
            // nothing to linger for.
            if ready!(Pin::new(&mut this.inner).poll_shutdown(cx)).is_err() {
                this.state = State::Done;
                return Poll::Ready(Ok(()));
            }
            this.state = State::Draining {
                deadline: Box::pin(tokio::time::sleep(this.linger)),
                discarded: 0,
            };
        }
        ready!(this.poll_drain(cx));
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn shutdown_sends_the_answer_then_reads_what_the_client_still_sends() {
        let (server, mut client) = tokio::io::duplex(1024);
        let mut server = Lingering::new(server, Duration::from_secs(5));
        server.write_all(b"answer").await.expect("write");
        let writer = tokio::spawn(async move {
            // Far more than the pipe holds: only a reading server lets it
            // all through.
            client.write_all(&[7u8; 100_000]).await.expect("the body");
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.expect("the answer");
            drop(client);
            answer
        });
        server.shutdown().await.expect("shutdown");
        assert_eq!(writer.await.expect("the client"), b"answer");
        assert!(matches!(server.state, State::Done));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_closes_is_let_go_after_the_time_bound() {
        let (server, _client) = tokio::io::duplex(1024);
        let mut server = Lingering::new(server, Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        server.shutdown().await.expect("shutdown");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
