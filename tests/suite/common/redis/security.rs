//! How a Redis the harness starts lets clients in ([`Security`]: a password,
//! an ACL user, TLS), as `redis-server` directives, and the [`Setup`] every
//! topology starts its data nodes from: one temporary directory, the test
//! certificates, the [`Access`] that gets past them.

use std::path::Path;

use super::access::Access;
use super::directives::{Directive, as_args, data_node, directive, listen, path_arg};
use super::process::RedisProcess;
use crate::common::tls::{TlsFiles, write_certificates};

/// How a Redis (a single server, every node of a cluster, the data nodes
/// of a sentinel group) lets clients in.
#[derive(Debug, Clone, Default)]
pub(crate) struct Security {
    /// `requirepass`: the default user needs this password.
    pub(crate) password: Option<String>,
    /// A user with this name and password that may run every command on
    /// every key and channel (`user NAME on >PASSWORD ~* &* +@all`, the
    /// rules `ACL SETUSER` takes); the default user is switched off.
    pub(crate) acl_user: Option<(String, String)>,
    /// TLS only (the plain port is off), with certificates made for the
    /// test.
    pub(crate) tls: Option<ClientCertificates>,
    /// With `password`, for a Sentinel group: what the sentinels
    /// themselves demand, when not the data nodes' password.
    pub(crate) sentinels: SentinelPassword,
}

/// What the sentinels of a group started with a password demand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum SentinelPassword {
    /// The data nodes' password.
    #[default]
    Same,
    /// No password.
    Open,
    /// A password of their own.
    Own(String),
}

/// Whether a TLS Redis asks clients for a certificate
/// (`tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientCertificates {
    /// `no`: a client is not asked for one.
    NotAsked,
    /// `optional`: a client may show one (signed by the test CA) or not.
    Optional,
    /// `yes`: a client without one is refused.
    Required,
}

/// The directives that make a data node demand `security` and reach its
/// peers (its primary) through it: the password as `requirepass` and
/// `masterauth`, or the ACL user with the default user off and
/// `masteruser`/`masterauth`.
pub(crate) fn data_node_auth(security: &Security) -> Vec<Directive> {
    if let Some((user, password)) = &security.acl_user {
        vec![
            acl_user(user, password),
            directive(&["user", "default", "off"]),
            directive(&["masteruser", user]),
            directive(&["masterauth", password]),
        ]
    } else if let Some(password) = &security.password {
        vec![
            directive(&["requirepass", password]),
            directive(&["masterauth", password]),
        ]
    } else {
        Vec::new()
    }
}

/// `user NAME on >PASSWORD ~* &* +@all`: every command on every key and
/// channel.
pub(crate) fn acl_user(user: &str, password: &str) -> Directive {
    let rule = format!(">{password}");
    directive(&["user", user, "on", &rule, "~*", "&*", "+@all"])
}

/// TLS with `files`: the server certificate, the client certificate shown
/// to peers (`tls-client-cert-file`: the server certificate is for servers
/// only), the CA, replication over TLS, and a client certificate from
/// others as `clients` says.
pub(crate) fn tls(clients: ClientCertificates, files: &TlsFiles) -> Vec<Directive> {
    let mut directives: Vec<Directive> = [
        ("tls-cert-file", &files.server_cert),
        ("tls-key-file", &files.server_key),
        ("tls-client-cert-file", &files.client_cert),
        ("tls-client-key-file", &files.client_key),
        ("tls-ca-cert-file", &files.ca_cert),
    ]
    .into_iter()
    .map(|(name, file)| directive(&[name, &path_arg(file)]))
    .collect();
    let auth_clients = match clients {
        ClientCertificates::NotAsked => "no",
        ClientCertificates::Optional => "optional",
        ClientCertificates::Required => "yes",
    };
    directives.push(directive(&["tls-replication", "yes"]));
    directives.push(directive(&["tls-auth-clients", auth_clients]));
    directives
}

/// What a topology started with a [`Security`] stands on: its temporary
/// directory (a folder in it for each process, and `tls/` for the test
/// certificates), and what gets a client past its data nodes.
pub(crate) struct Setup {
    security: Security,
    access: Access,
    /// Last: the processes in it are gone before it is removed.
    dir: tempfile::TempDir,
}

impl Setup {
    /// A fresh directory for `what`, with certificates made for the test
    /// in `tls/` if `security` wants TLS.
    pub(crate) fn new(what: &str, security: Security) -> Self {
        let dir = tempfile::tempdir()
            .unwrap_or_else(|err| panic!("temporary directory for {what}: {err}"));
        let files = security
            .tls
            .map(|_| write_certificates(&dir.path().join("tls")));
        Self::in_dir(dir, security, files)
    }

    /// As [`Setup::new`], with these certificates instead of new ones.
    pub(crate) fn with_certificates(what: &str, security: Security, files: TlsFiles) -> Self {
        let dir = tempfile::tempdir()
            .unwrap_or_else(|err| panic!("temporary directory for {what}: {err}"));
        Self::in_dir(dir, security, Some(files))
    }

    fn in_dir(dir: tempfile::TempDir, security: Security, files: Option<TlsFiles>) -> Self {
        Self {
            access: Access::new(&security, files.as_ref()),
            security,
            dir,
        }
    }

    pub(crate) fn security(&self) -> &Security {
        &self.security
    }

    /// What gets a client past the data nodes.
    pub(crate) fn access(&self) -> &Access {
        &self.access
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directives that make a process of this topology listen on
    /// `port` over TLS or not, and demand the TLS client certificate as the
    /// security says.
    pub(crate) fn listen(&self, port: u16) -> Vec<Directive> {
        let mut directives = listen(port, self.access.tls_files().is_some());
        if let (Some(clients), Some(files)) = (self.security.tls, self.access.tls_files()) {
            directives.extend(tls(clients, files));
        }
        directives
    }

    /// Starts a data node `name` in the folder `folder`: on a free port,
    /// demanding the security, no persistence, plus what `extra` adds for
    /// its port (cluster or replication settings).
    pub(crate) async fn start_data_node(
        &self,
        name: String,
        folder: &str,
        mut extra: impl FnMut(u16) -> Vec<Directive>,
    ) -> RedisProcess {
        RedisProcess::start(
            name,
            self.dir().join(folder),
            self.access.cli_args(true),
            |port| {
                let mut directives = self.listen(port);
                directives.extend(data_node_auth(&self.security));
                directives.extend(data_node());
                directives.extend(extra(port));
                as_args(&directives)
            },
        )
        .await
    }
}
