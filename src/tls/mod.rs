//! TLS for gRPC clients, terminated by our own accept loop: the server
//! certificate and key are read again whenever their files change (checked
//! every `--tls-reload-interval`; a pair that does not load keeps the one
//! in use, logged), and with `--tls-client-ca` clients must present a
//! certificate that CA signed, naming `--tls-client-san` when that is set
//! (envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN).
//!
//! `certificate` reads the pair and holds the one in use, `client_auth`
//! decides on client certificates, `server` puts them together into the
//! listener's acceptor; `verifier` is what our verifiers (also the Redis
//! client's, in `store::pinned_tls`) share.

mod certificate;
mod client_auth;
mod options;
mod server;
pub(crate) mod verifier;

pub(crate) use self::certificate::TlsError;
pub(crate) use self::options::TlsOptions;
pub(crate) use self::server::ServerTls;
