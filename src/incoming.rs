//! Accepts client connections (and, with TLS, does their handshakes,
//! several at once) and decides when each closes. At most
//! `--max-connections` are open at once (at the cap the listener waits, and
//! the kernel's backlog holds newcomers), and at most
//! `--max-connections-per-ip` from one client address (more are closed as
//! soon as they are accepted, counted, and warned about at most once every
//! ten seconds); each gets TCP keepalive and no
//! Nagle delay; accept errors (running out of file descriptors, mostly) are
//! logged at warn at most once a second and answered by backing off rather
//! than retrying in a busy loop. A connection is closed when it has had no
//! call and no stream for `--idle-timeout`, and, once the server is shutting
//! down, as soon as it has no call in flight (a health watch or reflection
//! stream does not hold it open). Also raises the process's open-file limit
//! at start, since every connection is one.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, info, warn};

use crate::metrics;
use crate::telemetry::WarnThrottle;

mod per_ip;
mod spread;

use per_ip::{PeerConnections, PeerSlot};
pub(crate) use spread::Share;
use spread::{Spread, ThreadSlot};

/// How connections are accepted and closed.
#[derive(Debug, Clone)]
pub(crate) struct IncomingSettings {
    /// Connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Connections open at once from one IP address; more are closed.
    pub max_connections_per_ip: usize,
    /// Idle time before TCP keepalive probes start (`None`: off).
    pub tcp_keepalive: Option<Duration>,
    /// A connection without calls or streams this long is closed.
    pub idle_timeout: Option<Duration>,
    /// When the server began shutting down, once it has.
    pub shutting_down: ShutdownStarted,
}

/// The instant a shutdown began, set once, read by every connection.
pub(crate) type ShutdownStarted = Arc<OnceLock<Instant>>;

/// How long a draining connection stays open after its last call ended, or
/// after the shutdown began, so that what was last sent (an answer, a
/// watcher's NOT_SERVING, GOAWAY) is written out before it goes.
const ANSWER_FLUSH: Duration = Duration::from_millis(100);

/// The first pause after a failed accept; doubled on each failure in a row.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// At most one warning per this long about failing accepts or the cap.
const WARN_EVERY: Duration = Duration::from_secs(1);
/// At most one warning per this long about connections refused per address.
const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(10);

/// Longest a TLS handshake may take; a client that has not finished by
/// then is dropped (it holds a place under the connection cap meanwhile,
/// and handshakes run concurrently, so slow ones hold up no one else).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections on `listener`, forever, and hands each, with its
/// places under the caps, to the one of `threads` serving threads that has
/// the fewest open: the loop to run (on any runtime; it ends when dropped)
/// and each thread's share, for [`connections`]. Accept errors are handled
/// here (tonic would retry them at once).
pub(crate) fn accept_among(
    listener: TcpListener,
    settings: &IncomingSettings,
    threads: usize,
) -> (
    impl Future<Output = ()> + Send + 'static,
    Vec<Share<Accepted>>,
) {
    let mut acceptor = Acceptor {
        listener,
        slots: Arc::new(Semaphore::new(settings.max_connections)),
        peers: PeerConnections::new(settings.max_connections_per_ip),
        settings: settings.clone(),
        backoff: FIRST_BACKOFF,
        warnings: WarnThrottle::new(WARN_EVERY),
        refusals: WarnThrottle::new(REFUSAL_WARN_EVERY),
    };
    // Exported at 0 from the start, so a rate over it needs no first refusal.
    metrics::connection_refused("per_ip", 0);
    let (mut spread, shares) = Spread::new(threads);
    let accepting = async move {
        loop {
            let (stream, slot) = acceptor.next().await;
            // Out of this runtime's reactor, into the serving thread's.
            match stream.into_std() {
                Ok(stream) => spread.hand(Accepted { stream, slot }, |accepted, thread| {
                    accepted.slot._thread = Some(thread);
                }),
                Err(err) => debug!(%err, "an accepted connection could not be handed on"),
            }
        }
    };
    (accepting, shares)
}

/// An accepted connection on its way to the thread that serves it.
pub(crate) struct Accepted {
    stream: std::net::TcpStream,
    slot: Slot,
}

/// The connections of one serving thread's `share`, over TLS with `tls`,
/// as they come. Never yields an error: a connection that cannot join this
/// thread's runtime, or fails its handshake, is dropped alone. Runs on the
/// serving thread's runtime, whose reactor then watches them.
pub(crate) fn connections(
    share: Share<Accepted>,
    settings: IncomingSettings,
    tls: Option<TlsAcceptor>,
) -> Pin<Box<dyn Stream<Item = Result<Connection, io::Error>> + Send>> {
    let handed = futures::stream::unfold(share, |mut share| async move {
        let handed = share.recv().await?;
        Some((handed, share))
    });
    let accepted = handed.filter_map(|Accepted { stream, slot }| {
        std::future::ready(match TcpStream::from_std(stream) {
            Ok(stream) => Some((stream, slot)),
            Err(err) => {
                debug!(%err, "an accepted connection could not join its thread's runtime");
                None
            }
        })
    });
    let concurrent = settings.max_connections;
    let Some(tls) = tls else {
        return Box::pin(accepted.map(move |(stream, slot)| {
            Ok(Connection::new(Transport::Plain(stream), slot, &settings))
        }));
    };
    Box::pin(
        accepted
            .map(move |(stream, slot)| {
                let tls = tls.clone();
                let settings = settings.clone();
                async move {
                    let peer = stream.peer_addr().ok();
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => Some(Ok(Connection::new(
                            Transport::Tls(Box::new(stream)),
                            slot,
                            &settings,
                        ))),
                        Ok(Err(err)) => {
                            debug!(?peer, %err, "TLS handshake failed");
                            None
                        }
                        Err(_) => {
                            debug!(?peer, "TLS handshake timed out");
                            None
                        }
                    }
                }
            })
            // As many at once as connections may be open: the cap is the
            // only bound, so slow handshakes never stall accepting.
            .buffer_unordered(concurrent)
            .filter_map(std::future::ready),
    )
}

struct Acceptor {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    peers: Arc<PeerConnections>,
    settings: IncomingSettings,
    backoff: Duration,
    /// Warnings about failing accepts or the cap.
    warnings: WarnThrottle,
    /// Warnings about connections refused per address.
    refusals: WarnThrottle,
}

/// A connection's places: under the cap, under its address's, and, once
/// handed to a serving thread, among that thread's.
pub(crate) struct Slot {
    _all: OwnedSemaphorePermit,
    _peer: PeerSlot,
    _thread: Option<ThreadSlot>,
}

impl Acceptor {
    /// The next TCP connection, with its places under the caps.
    async fn next(&mut self) -> (TcpStream, Slot) {
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let max_connections = self.settings.max_connections;
                self.warnings.warn(|suppressed| {
                    warn!(
                        max_connections,
                        suppressed,
                        "at the connection cap (--max-connections): new connections wait"
                    )
                });
                match self.slots.clone().acquire_owned().await {
                    Ok(slot) => slot,
                    // The semaphore is never closed.
                    Err(_) => unreachable!("connection slots closed"),
                }
            }
        };
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.backoff = FIRST_BACKOFF;
                    let Some(peer_slot) = self.peers.enter(peer.ip()) else {
                        self.refuse(stream, peer);
                        continue;
                    };
                    configure(&stream, &self.settings);
                    let slot = Slot {
                        _all: slot,
                        _peer: peer_slot,
                        _thread: None,
                    };
                    return (stream, slot);
                }
                // The peer gave up before we took it: nothing to wait for.
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(err) => {
                    metrics::accept_error();
                    let backoff = self.backoff;
                    self.warnings.warn(|suppressed| {
                        warn!(%err, ?backoff, suppressed, "cannot accept a connection; backing off")
                    });
                    tokio::time::sleep(backoff).await;
                    self.backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Closes `stream` at once: `peer`'s address has its most open.
    fn refuse(&mut self, stream: TcpStream, peer: std::net::SocketAddr) {
        drop(stream);
        metrics::connection_refused("per_ip", 1);
        let max_connections_per_ip = self.peers.limit();
        self.refusals.warn(|suppressed| {
            warn!(
                peer = %peer.ip(),
                max_connections_per_ip,
                suppressed,
                "too many connections from one address \
                 (--max-connections-per-ip): closed a new one"
            )
        });
    }
}

/// What a connection is doing, shared with the call-tracking layer through
/// the request's [`ConnectionInfo`].
#[derive(Debug)]
pub(crate) struct Activity {
    opened: Instant,
    /// Unary calls not yet fully answered: a shutdown waits for these.
    calls: AtomicUsize,
    /// Open-ended streams (health watch, reflection): they keep the
    /// connection from idling out, but a shutdown does not wait for them.
    streams: AtomicUsize,
    /// When a call or stream last started or ended, in ms since `opened`.
    changed_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            calls: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            changed_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.changed_ms.store(ms, Ordering::Release);
    }

    fn changed_at(&self) -> Instant {
        self.opened + Duration::from_millis(self.changed_ms.load(Ordering::Acquire))
    }

    /// Counts a call (or, with `streaming`, a stream) until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, streaming: bool) -> ActivityGuard {
        self.counter(streaming).fetch_add(1, Ordering::AcqRel);
        self.touch();
        ActivityGuard {
            activity: self.clone(),
            streaming,
        }
    }

    fn counter(&self, streaming: bool) -> &AtomicUsize {
        if streaming {
            &self.streams
        } else {
            &self.calls
        }
    }
}

/// One call or stream counted on its connection, until dropped.
pub(crate) struct ActivityGuard {
    activity: Arc<Activity>,
    streaming: bool,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.activity
            .counter(self.streaming)
            .fetch_sub(1, Ordering::AcqRel);
        self.activity.touch();
    }
}

/// What tonic puts in every request's extensions for our connections.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionInfo {
    /// The peer's and our address.
    pub tcp: TcpConnectInfo,
    /// When the connection last had a call, for the idle timeout.
    pub activity: Arc<Activity>,
}

/// The IP address a call came from, when it came on one of our connections.
pub(crate) fn peer_ip(extensions: &tonic::Extensions) -> Option<std::net::IpAddr> {
    let info = extensions.get::<ConnectionInfo>()?;
    info.tcp.remote_addr().map(|address| address.ip())
}

/// Keepalive and no Nagle delay; best effort: a socket that refuses an
/// option still serves.
fn configure(stream: &TcpStream, settings: &IncomingSettings) {
    let _ = stream.set_nodelay(true);
    if let Some(idle) = settings.tcp_keepalive {
        let keepalive = socket2::TcpKeepalive::new().with_time(idle);
        let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
    }
}

/// A connection's bytes: plain TCP, or TLS over it.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Transport {
    fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(stream) => stream,
            Self::Tls(stream) => stream.get_ref().0,
        }
    }
}

/// Forwards one `AsyncRead`/`AsyncWrite` call to whichever transport.
macro_rules! on_transport {
    ($transport:expr, $stream:ident => $call:expr) => {
        match $transport {
            Transport::Plain($stream) => $call,
            Transport::Tls($stream) => $call,
        }
    };
}

/// One accepted connection, holding its place under the cap until dropped.
pub(crate) struct Connection {
    stream: Transport,
    _slot: Slot,
    activity: Arc<Activity>,
    idle_timeout: Option<Duration>,
    shutting_down: ShutdownStarted,
    /// When to look again whether to close; `None` while nothing would.
    check: Option<Pin<Box<Sleep>>>,
}

impl Connection {
    fn new(stream: Transport, slot: Slot, settings: &IncomingSettings) -> Self {
        metrics::connections(1.0);
        Self {
            stream,
            _slot: slot,
            activity: Arc::new(Activity::new()),
            idle_timeout: settings.idle_timeout,
            shutting_down: settings.shutting_down.clone(),
            check: None,
        }
    }

    /// When this connection should close if nothing changes, or `None`.
    fn closes_at(&self) -> Option<Instant> {
        let activity = &self.activity;
        if activity.calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        let quiet_since = activity.changed_at();
        if let Some(&started) = self.shutting_down.get() {
            return Some(quiet_since.max(started) + ANSWER_FLUSH);
        }
        if activity.streams.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.idle_timeout.map(|idle| quiet_since + idle)
    }

    /// Whether to end the connection now; otherwise arms a timer for when
    /// a close falls due, or, while shutting down, to notice calls ending.
    /// Nothing else needs a timer: hyper reads the connection again when a
    /// shutdown starts (it writes GOAWAY) and as each call's answer flows.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let now = Instant::now();
            let draining = self.shutting_down.get().is_some();
            let next = match (self.closes_at(), draining) {
                (Some(at), _) if at <= now => return true,
                (Some(at), _) => at,
                (None, true) => now + ANSWER_FLUSH,
                (None, false) => {
                    self.check = None;
                    return false;
                }
            };
            let check = self
                .check
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next.into())));
            check.as_mut().reset(next.into());
            if check.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        metrics::connections(-1.0);
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo {
            tcp: self.stream.tcp().connect_info(),
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = on_transport!(&mut this.stream, stream => Pin::new(stream).poll_read(cx, buf));
        match read {
            Poll::Pending if this.poll_close(cx) => {
                // End of stream: hyper closes the connection, ending any
                // watch stream on it.
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_transport!(&mut self.get_mut().stream, stream => Pin::new(stream).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_transport!(&mut self.get_mut().stream, stream => Pin::new(stream).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        on_transport!(&self.stream, stream => stream.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_transport!(&mut self.get_mut().stream, stream => Pin::new(stream).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_transport!(&mut self.get_mut().stream, stream => Pin::new(stream).poll_shutdown(cx))
    }
}

/// Raises the soft limit on open files to the hard limit, so connections
/// run out at the hard limit rather than at a low default (often 1024), and
/// logs both.
pub fn raise_open_file_limit() {
    let before = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((soft, _)) => soft,
        Err(err) => {
            warn!(%err, "cannot read the open-file limit");
            return;
        }
    };
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(after) if after > before => {
            info!(
                before,
                after, "raised the open-file limit to its hard limit"
            )
        }
        Ok(after) => info!(
            open_files = after,
            "open-file limit already at its hard limit"
        ),
        Err(err) => warn!(%err, before, "cannot raise the open-file limit"),
    }
}
