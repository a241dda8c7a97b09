//! The sockets the server serves on, bound before anything else starts so
//! that a taken port stops the start at once, naming its flag. The gRPC
//! socket is bound but not yet listening: its port is reserved (and can be
//! written to `--address-file`) while connections to it are refused, until
//! the server is ready to answer (with xDS rules, once the first
//! configuration came).

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

use crate::config::Config;

/// Connections waiting to be accepted on the gRPC port, at most.
pub(super) const BACKLOG: u32 = 1024;

/// A port that cannot be had.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address} (--{flag}): {source}: {}", remedy(.flag))]
pub struct BindError {
    /// The flag naming the address.
    pub flag: &'static str,
    /// The address.
    pub address: SocketAddr,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// The server's sockets.
pub struct Listeners {
    /// gRPC: bound, listening only once the server is ready.
    pub(super) grpc: TcpSocket,
    /// HTTP (`/healthcheck`, `/json`), when on.
    pub http: Option<TcpListener>,
    /// The debug endpoints, when on.
    pub debug: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses `config` names.
    pub async fn bind(config: &Config) -> Result<Self, BindError> {
        // The HTTP and debug listeners first: a gRPC port the system
        // chooses (port 0) is then never one of theirs. Bound the other way
        // round, the gRPC socket (bound, not yet listening) could be given
        // the very port named for HTTP, which would then listen on it first
        // and leave the gRPC port unable to.
        let http = listen("http-listen", config.http.http_listen.0).await?;
        let debug = listen("debug-listen", config.http.debug_listen.0).await?;
        let grpc = reserve(config.listener.listen).map_err(|source| BindError {
            flag: "listen",
            address: config.listener.listen,
            source,
        })?;
        Ok(Self { grpc, http, debug })
    }

    /// The gRPC port's address (the port the system chose, for port 0).
    pub fn grpc_address(&self) -> io::Result<SocketAddr> {
        self.grpc.local_addr()
    }

    /// The HTTP listener's address, when on.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The debug listener's address, when on.
    pub fn debug_address(&self) -> Option<SocketAddr> {
        self.debug.as_ref().and_then(|l| l.local_addr().ok())
    }
}

/// What to do about an address that cannot be had, for the flag naming it:
/// a port already taken is the usual case (a second instance on one host),
/// and only gRPC's listener is needed.
fn remedy(flag: &str) -> String {
    match flag {
        "http-listen" => "the HTTP listener (JSON API, web console, health) is optional: give it \
                          another address (--http-listen 127.0.0.1:8081) or turn it off \
                          (--http-listen '')"
            .to_owned(),
        "listen" => "give gRPC another address (--listen 127.0.0.1:50052), or port 0 to have \
                     the system choose one (--address-file writes which)"
            .to_owned(),
        other => format!("give it another address, or turn it off (--{other} '')"),
    }
}

/// A socket bound to `address`, not listening.
fn reserve(address: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As a listener bound the usual way: a restart may bind again while
    // the last process's connections linger in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    Ok(socket)
}

/// A listener on `address` when there is one; `flag` names it in errors.
async fn listen(
    flag: &'static str,
    address: Option<SocketAddr>,
) -> Result<Option<TcpListener>, BindError> {
    let Some(address) = address else {
        return Ok(None);
    };
    TcpListener::bind(address)
        .await
        .map(Some)
        .map_err(|source| BindError {
            flag,
            address,
            source,
        })
}
