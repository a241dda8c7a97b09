//! How a client gets into a Redis the harness started ([`Access`]: the
//! password or ACL user, and for TLS the test CA and client certificate),
//! as URLs, as `redis-cli` arguments and as redis crate clients; and the
//! [`Secured`] accessors every topology offers its tests.

use std::path::Path;

use super::directives::path_arg;
use super::security::Security;
use crate::common::tls::TlsFiles;

/// What every topology started here offers a test about how to get in:
/// one implementation of each accessor, over the topology's [`Access`].
pub(crate) trait Secured {
    /// How clients get in (the data nodes', for a Sentinel group).
    fn access(&self) -> &Access;

    /// The PEM files, for a topology started with TLS.
    fn tls_files(&self) -> &TlsFiles {
        self.access()
            .tls_files()
            .expect("started with TLS (start_with / with_tls)")
    }

    /// The test CA that signed every certificate.
    fn ca_cert_path(&self) -> &Path {
        &self.tls_files().ca_cert
    }

    /// A client certificate signed by the test CA.
    fn client_cert_path(&self) -> &Path {
        &self.tls_files().client_cert
    }

    /// The key of [`Secured::client_cert_path`].
    fn client_key_path(&self) -> &Path {
        &self.tls_files().client_key
    }
}

/// What a client needs to get past a node of a secured topology: the
/// password (`requirepass`), or the ACL user and its password, and, for
/// TLS, the test CA and client certificate. The default is a plain node
/// that asks for nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Access {
    /// The ACL user to log in as; `None` for the default user.
    user: Option<String>,
    /// The password of `user`, or of the default user.
    password: Option<String>,
    tls: Option<TlsFiles>,
}

impl Access {
    /// The ACL user if there is one (the default user is off then), or
    /// else the password.
    pub(crate) fn new(security: &Security, tls: Option<&TlsFiles>) -> Self {
        let (user, password) = match &security.acl_user {
            Some((user, password)) => (Some(user.clone()), Some(password.clone())),
            None => (None, security.password.clone()),
        };
        Self {
            user,
            password,
            tls: tls.cloned(),
        }
    }

    /// The same, with the default user's `password` instead (for sentinels
    /// that demand their own, or none).
    pub(crate) fn with_password(&self, password: Option<String>) -> Self {
        Self {
            password,
            ..self.clone()
        }
    }

    /// The same TLS, without user or password.
    pub(crate) fn anonymous(&self) -> Self {
        Self {
            tls: self.tls.clone(),
            ..Self::default()
        }
    }

    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The credentials as upstream's REDIS_AUTH and our
    /// `--redis-sentinel-auth` write them: `password` or `user:password`;
    /// `None` when nothing is demanded.
    pub(crate) fn auth(&self) -> Option<String> {
        let password = self.password.as_deref()?;
        Some(match &self.user {
            Some(user) => format!("{user}:{password}"),
            None => password.to_owned(),
        })
    }

    pub(crate) fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// `redis://` or, for TLS, `rediss://`, with the user and password
    /// (percent-encoded) if there are any.
    pub(crate) fn url(&self, port: u16) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let user = self.user.as_deref().map(percent_encode).unwrap_or_default();
        let credentials = self
            .password
            .as_deref()
            .map(|password| format!("{user}:{}@", percent_encode(password)))
            .unwrap_or_default();
        format!("{scheme}://{credentials}127.0.0.1:{port}")
    }

    /// The test CA to trust and the client certificate to show, for the
    /// redis crate; `None` without TLS.
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        let files = self.tls.as_ref()?;
        let read = |path: &Path| {
            std::fs::read(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
        };
        install_crypto_provider();
        Some(redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&files.client_cert),
                client_key: read(&files.client_key),
            }),
            root_cert: Some(read(&files.ca_cert)),
        })
    }

    /// A connection to 127.0.0.1:`port` that gets past it (the redis
    /// crate's default timeouts apply: 1 s to connect, 500 ms for an answer,
    /// so a frozen node makes a query fail instead of hang).
    pub(crate) async fn connect(
        &self,
        port: u16,
    ) -> Result<redis::aio::MultiplexedConnection, String> {
        let client = match self.certificates() {
            Some(certificates) => redis::Client::build_with_tls(self.url(port), certificates),
            None => redis::Client::open(self.url(port)),
        };
        client
            .map_err(|err| err.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|err| format!("connect to port {port}: {err}"))
    }

    /// One command on a fresh connection to 127.0.0.1:`port`.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        command: &redis::Cmd,
    ) -> Result<T, String> {
        let mut connection = self.connect(port).await?;
        command
            .query_async(&mut connection)
            .await
            .map_err(|err| format!("port {port}: {err}"))
    }

    /// The `redis-cli` arguments that get past it: TLS with the CA, and if
    /// `credentials`, the client certificate and the password or user too.
    pub(crate) fn cli_args(&self, credentials: bool) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        if let Some(files) = &self.tls {
            args.extend(["--tls".to_owned(), "--cacert".to_owned()]);
            args.push(path_arg(&files.ca_cert));
            if credentials {
                args.extend(["--cert".to_owned(), path_arg(&files.client_cert)]);
                args.extend(["--key".to_owned(), path_arg(&files.client_key)]);
            }
        }
        if credentials {
            if let Some(user) = &self.user {
                args.extend(["--user".to_owned(), user.clone()]);
            }
            if let Some(password) = &self.password {
                args.extend(["--pass".to_owned(), password.clone()]);
            }
        }
        args
    }
}

/// rustls wants one process-wide crypto provider; ratelimitd installs
/// `ring` when it starts, and so does the harness before its own first TLS
/// connection.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Userinfo for a URL: everything but unreserved characters escaped.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
