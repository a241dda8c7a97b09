//! A single `redis-server` of the test's own: plain, or demanding a
//! password, an ACL user or TLS ([`Security`]), or serving
//! envoyproxy/ratelimit's pinned self-signed certificate; killed, frozen,
//! thawed and restarted at will, and looked into (keys, script calls).

use std::path::Path;

use super::access::{Access, Secured};
use super::process::RedisProcess;
use super::queries::script_calls_in;
use super::security::{ClientCertificates, Security, Setup};
use crate::common::tls::TlsFiles;

/// One `redis-server`, killed when dropped.
pub(crate) struct RedisServer {
    process: RedisProcess,
    setup: Setup,
}

impl RedisServer {
    /// A plain server: anyone may do anything.
    pub(crate) async fn start() -> Self {
        Self::start_with(Security::default()).await
    }

    /// `requirepass password`. The password goes into [`RedisServer::url`]
    /// percent-encoded.
    pub(crate) async fn with_password(password: &str) -> Self {
        Self::start_with(Security {
            password: Some(password.to_owned()),
            ..Security::default()
        })
        .await
    }

    /// An ACL user `user` with `password`, allowed every command on every
    /// key; the default user is off, so nothing works without logging in.
    pub(crate) async fn with_acl_user(user: &str, password: &str) -> Self {
        Self::start_with(Security {
            acl_user: Some((user.to_owned(), password.to_owned())),
            ..Security::default()
        })
        .await
    }

    /// TLS only, a client certificate optional.
    pub(crate) async fn with_tls() -> Self {
        Self::start_with(Security {
            tls: Some(ClientCertificates::Optional),
            ..Security::default()
        })
        .await
    }

    /// TLS only, a client certificate signed by the test CA required.
    pub(crate) async fn with_tls_client_auth() -> Self {
        Self::start_with(Security {
            tls: Some(ClientCertificates::Required),
            ..Security::default()
        })
        .await
    }

    /// Any combination of the above.
    pub(crate) async fn start_with(security: Security) -> Self {
        Self::launch(Setup::new("redis-server", security)).await
    }

    /// TLS only, as upstream's stunnel recipe runs Redis: `dir/cert.pem`
    /// (from [`crate::common::tls::self_signed_ca_certificate`]) as its
    /// certificate, its CA and the client certificate it trusts, with
    /// `dir/key.pem`; asking clients for a certificate as `clients` says,
    /// and demanding `password` if given.
    pub(crate) async fn pinned(
        dir: &Path,
        clients: ClientCertificates,
        password: Option<&str>,
    ) -> Self {
        let security = Security {
            password: password.map(str::to_owned),
            tls: Some(clients),
            ..Security::default()
        };
        let files = TlsFiles::pinned(dir);
        Self::launch(Setup::with_certificates("redis-server", security, files)).await
    }

    async fn launch(setup: Setup) -> Self {
        let process = setup
            .start_data_node("redis-server".to_owned(), "redis", |_| Vec::new())
            .await;
        Self { process, setup }
    }

    pub(crate) fn port(&self) -> u16 {
        self.process.port()
    }

    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `redis://127.0.0.1:PORT/0`, with the credentials in it, or
    /// `rediss://` for TLS. For TLS a client must trust
    /// [`TlsFiles::ca_cert`]; the server certificate names `127.0.0.1` and
    /// `localhost`.
    pub(crate) fn url(&self) -> String {
        format!("{}/0", self.setup.access().url(self.port()))
    }

    /// [`RedisServer::url`] without the credentials.
    pub(crate) fn url_without_credentials(&self) -> String {
        format!("{}/0", self.setup.access().anonymous().url(self.port()))
    }

    /// A connection through [`RedisServer::url`], logged in (over TLS with
    /// the client certificate, for a TLS server).
    pub(crate) async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.setup
            .access()
            .connect(self.port())
            .await
            .unwrap_or_else(|why| panic!("cannot connect to the test redis: {why}"))
    }

    /// Empties this server (one the harness started, never the machine's
    /// own), so that a random case starts from nothing.
    pub(crate) async fn flush_all(&self) {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut self.connection().await)
            .await
            .expect("FLUSHALL on the test's own Redis");
    }

    /// Runs `redis-cli COMMAND...` logged in, over TLS with the client
    /// certificate if the server is TLS, and returns what it printed.
    /// `redis-cli` prints error replies (`NOAUTH ...`) there too, and still
    /// exits 0.
    pub(crate) async fn cli(&self, command: &[&str]) -> Result<String, String> {
        self.process.cli(self.process.cli_args(), command).await
    }

    /// As [`RedisServer::cli`] with no password, no user and no client
    /// certificate (only the CA, to trust the server).
    pub(crate) async fn cli_anonymous(&self, command: &[&str]) -> Result<String, String> {
        let args = self.setup.access().cli_args(false);
        self.process.cli(&args, command).await
    }

    /// SIGKILL: gone at once, as in a crash.
    pub(crate) fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts again on the same port, with the same settings and files, and
    /// waits until it answers.
    pub(crate) async fn restart(&mut self) {
        self.process.restart().await;
    }

    /// SIGSTOP: connections stay open but nothing answers, as in a hung host.
    pub(crate) fn freeze(&self) {
        self.process.freeze();
    }

    /// SIGCONT after [`RedisServer::freeze`].
    pub(crate) fn thaw(&self) {
        self.process.thaw();
    }

    /// Its temporary directory, removed when it is dropped.
    pub(crate) fn dir(&self) -> &Path {
        self.setup.dir()
    }

    /// Script calls (`EVALSHA` and `EVAL`) this Redis has run, from
    /// `INFO commandstats`.
    pub(crate) async fn script_calls(&self) -> u64 {
        let mut connection = self.connection().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .expect("INFO commandstats");
        script_calls_in(&info)
    }

    /// Every key in the database.
    pub(crate) async fn keys(&self) -> Vec<String> {
        let mut connection = self.connection().await;
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await
                .expect("SCAN");
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    /// Fails unless every key in the database will expire.
    pub(crate) async fn assert_every_key_expires(&self) {
        let mut connection = self.connection().await;
        for key in self.keys().await {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .expect("PTTL");
            // -2: expired between SCAN and PTTL, which is fine.
            assert!(ttl != -1, "key {key:?} has no TTL");
        }
    }
}

impl Secured for RedisServer {
    fn access(&self) -> &Access {
        self.setup.access()
    }
}
