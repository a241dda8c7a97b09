//! A Redis Sentinel group of the test's own: a primary, a replica and 3
//! sentinels (quorum 2), plain or secured ([`Security`]); its primary
//! killed and the failover awaited. A primary is judged down after 1 s
//! (`down-after-milliseconds`), so failovers take seconds, and TILT mode
//! (after a stall of the machine) lasts 3 s, not Redis's 30.

use std::collections::HashMap;

use super::access::{Access, Secured};
use super::directives::{Directive, as_config, directive, path_arg};
use super::process::{Nodes, RedisProcess};
use super::queries::{answers_as_primary, await_caught_up, info_field, replica_link_up};
use super::security::{Security, SentinelPassword, Setup, acl_user};
use crate::common::wait::settle;

/// The name the sentinels monitor the primary under.
pub(crate) const MASTER_NAME: &str = "mymaster";

/// How long a sentinel stays in TILT mode, in milliseconds: three of its
/// PINGs (one a second), so that what it acts on afterwards was seen after
/// the stall that caused it. Redis's own 30 s outlasts
/// [`crate::common::wait::PATIENCE`]: one stall of a loaded machine, and no
/// failover would happen in time.
const TILT_PERIOD_MS: &str = "3000";

/// A primary, a replica and 3 sentinels (quorum 2) of our own.
pub(crate) struct RedisSentinel {
    /// Declared first: dropped first, so no sentinel watches the data nodes
    /// die and tries to fail over while the harness goes.
    sentinels: Nodes,
    /// Started as primary (0) and replica (1); after a failover the roles
    /// are swapped: ask [`RedisSentinel::primary_port`].
    data: Nodes,
    /// What gets a client past the sentinels (the data nodes' is the
    /// setup's).
    sentinel_access: Access,
    setup: Setup,
}

impl RedisSentinel {
    /// Starts the primary, a replica of it (and waits until it is in sync),
    /// then 3 sentinels monitoring it with quorum 2, 1 s down-after, 3 s
    /// failover timeout and 3 s TILT period, and waits until every sentinel
    /// sees the primary up, the replica in sync and the 2 other sentinels.
    pub(crate) async fn start() -> Self {
        Self::start_with(Security::default()).await
    }

    /// As [`RedisSentinel::start`], secured by `security`:
    ///
    /// - a password: the data nodes demand it (`requirepass`, and
    ///   `masterauth` so that the replica gets in), the sentinels give it to
    ///   them (`sentinel auth-pass`), and the sentinels demand it too
    ///   (`requirepass` in sentinel mode), or none, or one of their own, as
    ///   `security.sentinels` says;
    /// - TLS: every process, data node or sentinel, on a TLS port only
    ///   (`port 0`, `tls-port`), replication and the sentinels' links to
    ///   the data nodes and to each other over TLS too (`tls-replication
    ///   yes`), with certificates made for the test
    ///   ([`crate::common::tls::write_certificates`]).
    /// - an ACL user: the data nodes demand it (`user NAME on >PASSWORD ~*
    ///   &* +@all`, the default user off, and `masteruser`/`masterauth` so
    ///   that the replica gets in), the sentinels log in as it (`sentinel
    ///   auth-user`, `sentinel auth-pass`), and the sentinels demand it too
    ///   (the same `user` line and `user default off` in sentinel.conf, and
    ///   `sentinel sentinel-user`/`sentinel-pass` so that they get into each
    ///   other).
    ///
    /// [`RedisSentinel::sentinel_urls`] then carry the data nodes' password
    /// (and the user) and use `rediss://`; [`RedisSentinel::sentinel_auth`]
    /// is what the sentinels demand.
    pub(crate) async fn start_with(security: Security) -> Self {
        let setup = Setup::new("Redis Sentinel", security);
        let sentinel_access = match &setup.security().sentinels {
            SentinelPassword::Same => setup.access().clone(),
            SentinelPassword::Open => setup.access().with_password(None),
            SentinelPassword::Own(password) => setup.access().with_password(Some(password.clone())),
        };
        let primary = setup
            .start_data_node("sentinel primary".to_owned(), "primary", |_| Vec::new())
            .await;
        let primary_port = primary.port().to_string();
        let replica = setup
            .start_data_node("sentinel replica".to_owned(), "replica", |_| {
                vec![directive(&["replicaof", "127.0.0.1", &primary_port])]
            })
            .await;
        let (primary_port, replica_port) = (primary.port(), replica.port());
        settle("the replica to be in sync", || {
            replica_link_up(setup.access(), replica_port)
        })
        .await;
        let mut sentinels = Vec::new();
        for index in 0..3 {
            let sentinel = start_sentinel(&setup, &sentinel_access, index, primary_port).await;
            sentinels.push(sentinel);
        }
        let group = Self {
            sentinels: Nodes::new("sentinel", sentinels),
            data: Nodes::new("data node", vec![primary, replica]),
            sentinel_access,
            setup,
        };
        settle("the sentinels to agree", || {
            group.agreement(primary_port, replica_port)
        })
        .await;
        group
    }

    /// Why the sentinels do not yet all see `primary` up with `replica` in
    /// sync and each other, if they do not.
    async fn agreement(&self, primary: u16, replica: u16) -> Result<(), String> {
        for port in self.sentinel_ports() {
            let master = self.monitored_primary(port).await?;
            let field = |name: &str| master.get(name).map(String::as_str).unwrap_or("");
            let expected = [
                ("port", primary.to_string()),
                ("flags", "master".to_owned()),
                ("num-slaves", "1".to_owned()),
                ("num-other-sentinels", "2".to_owned()),
            ];
            for (name, wanted) in expected {
                if field(name) != wanted {
                    return Err(format!("sentinel {port} reports {name} {:?}", field(name)));
                }
            }
            let replicas: Vec<HashMap<String, String>> = self
                .sentinel_access
                .query(
                    port,
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME),
                )
                .await?;
            let in_sync = replicas.iter().any(|seen| {
                seen.get("port") == Some(&replica.to_string())
                    && seen.get("flags").map(String::as_str) == Some("slave")
                    && seen.get("master-link-status").map(String::as_str) == Some("ok")
            });
            if !in_sync {
                return Err(format!("sentinel {port} sees the replicas as {replicas:?}"));
            }
        }
        Ok(())
    }

    /// Waits until the replica has everything the primary has written so
    /// far, as [`crate::common::redis::RedisCluster::await_replicated`]
    /// does.
    pub(crate) async fn await_replicated(&self) {
        await_caught_up(self.setup.access(), || async move {
            let primary = self.primary_port().await;
            Ok(self
                .data
                .answering_ports()
                .into_iter()
                .filter(|port| *port != primary)
                .map(|replica| (primary, replica))
                .collect())
        })
        .await;
    }

    /// The `redis://127.0.0.1:port` of each sentinel, as ratelimitd takes
    /// them: started [`RedisSentinel::start_with`] a password (or an ACL
    /// user), the data nodes' is in each URL
    /// (`redis://:PASSWORD@127.0.0.1:port`, percent-encoded), and with TLS
    /// they are `rediss://`. What the sentinels demand themselves is
    /// [`RedisSentinel::sentinel_auth`].
    pub(crate) fn sentinel_urls(&self) -> Vec<String> {
        let access = self.setup.access();
        self.sentinel_ports()
            .into_iter()
            .map(|port| access.url(port))
            .collect()
    }

    /// What the sentinels themselves demand, as `--redis-sentinel-auth`
    /// (upstream's REDIS_SENTINEL_AUTH) takes it: `password` or
    /// `user:password`; `None` for sentinels that demand nothing.
    pub(crate) fn sentinel_auth(&self) -> Option<String> {
        self.sentinel_access.auth()
    }

    pub(crate) fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.ports()
    }

    /// The name the primary is monitored under (`mymaster`).
    pub(crate) fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// The primary's port as the first sentinel that answers says
    /// (`SENTINEL get-master-addr-by-name`).
    pub(crate) async fn primary_port(&self) -> u16 {
        let mut last_error = String::from("no sentinel");
        for port in self.sentinel_ports() {
            match self.primary_named_by(port).await {
                Ok(primary) => return primary,
                Err(why) => last_error = why,
            }
        }
        panic!("no sentinel says where the primary is: {last_error}");
    }

    /// The ports of the primary and replica started, killed ones too.
    pub(crate) fn data_ports(&self) -> Vec<u16> {
        self.data.ports()
    }

    /// A connection to the current primary (logged in, over TLS if need
    /// be).
    pub(crate) async fn primary_connection(&self) -> redis::aio::MultiplexedConnection {
        let port = self.primary_port().await;
        self.setup
            .access()
            .connect(port)
            .await
            .unwrap_or_else(|why| panic!("cannot connect to the primary on {port}: {why}"))
    }

    /// SIGKILLs the current primary, as in a crash, and returns its port.
    /// The sentinels promote the replica after about 1 s: see
    /// [`RedisSentinel::await_failover`].
    pub(crate) async fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port().await;
        self.data.get_mut(port).kill();
        port
    }

    /// SIGSTOPs every sentinel, as a stalled machine (a paused virtual
    /// machine, a starved host) stops every process at once.
    pub(crate) fn freeze_sentinels(&self) {
        for port in self.sentinel_ports() {
            self.sentinels.get(port).freeze();
        }
    }

    /// SIGCONT after [`RedisSentinel::freeze_sentinels`]. A sentinel whose
    /// timer did not run for over 2 s (its `tilt-trigger`) enters TILT mode:
    /// it keeps watching but acts on nothing (no failover) for a while.
    pub(crate) fn thaw_sentinels(&self) {
        for port in self.sentinel_ports() {
            self.sentinels.get(port).thaw();
        }
    }

    /// How many sentinels have entered TILT mode so far (logged `+tilt`).
    pub(crate) fn sentinels_tilted(&self) -> usize {
        self.sentinel_ports()
            .into_iter()
            .filter(|port| self.sentinels.get(*port).logged("+tilt"))
            .count()
    }

    /// Waits until every sentinel names a primary other than `old_port`,
    /// no longer down, and that node answers `ROLE` as a primary. Returns
    /// its port.
    pub(crate) async fn await_failover(&self, old_port: u16) -> u16 {
        settle(
            &format!("the sentinels to replace the primary on {old_port}"),
            || async move {
                let mut agreed = None;
                for port in self.sentinel_ports() {
                    let primary = self.primary_named_by(port).await?;
                    if primary == old_port {
                        let tilt = self.tilt_note(port).await;
                        return Err(format!("sentinel {port} still names {old_port}{tilt}"));
                    }
                    if agreed.is_some_and(|agreed| agreed != primary) {
                        return Err(format!("sentinels name {agreed:?} and {primary}"));
                    }
                    agreed = Some(primary);
                    let master = self.monitored_primary(port).await?;
                    let flags = master.get("flags").map(String::as_str).unwrap_or("");
                    if flags != "master" {
                        return Err(format!("sentinel {port} flags the new primary {flags:?}"));
                    }
                }
                let primary = agreed.ok_or("no sentinel")?;
                answers_as_primary(self.setup.access(), primary).await?;
                Ok(primary)
            },
        )
        .await
    }

    /// For messages: whether the sentinel on `port` says it is in TILT mode,
    /// where it fails nothing over.
    async fn tilt_note(&self, port: u16) -> &'static str {
        let info = self
            .sentinel_access
            .query::<String>(port, redis::cmd("INFO").arg("sentinel"))
            .await;
        match info {
            Ok(info) if info_field(&info, "sentinel_tilt") == Some("1") => " (in TILT mode)",
            _ => "",
        }
    }

    /// What the sentinel on `port` says of the primary it monitors
    /// (`SENTINEL MASTER`).
    async fn monitored_primary(&self, port: u16) -> Result<HashMap<String, String>, String> {
        self.sentinel_access
            .query(port, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME))
            .await
    }

    /// The primary's port according to the sentinel on `port`.
    async fn primary_named_by(&self, port: u16) -> Result<u16, String> {
        let address: Vec<String> = self
            .sentinel_access
            .query(
                port,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME),
            )
            .await?;
        match address.as_slice() {
            [_, primary] => primary
                .parse()
                .map_err(|_| format!("sentinel {port} names port {primary:?}")),
            _ => Err(format!("sentinel {port} answers {address:?}")),
        }
    }
}

impl Secured for RedisSentinel {
    fn access(&self) -> &Access {
        self.setup.access()
    }
}

/// Starts sentinel `index`, monitoring the primary on `primary_port`,
/// demanding what `access` gets past. A sentinel rewrites its configuration
/// file, so each has its own, written anew for each port tried.
async fn start_sentinel(
    setup: &Setup,
    access: &Access,
    index: usize,
    primary_port: u16,
) -> RedisProcess {
    let dir = setup.dir().join(format!("sentinel{index}"));
    let config_path = dir.join("sentinel.conf");
    let primary_port = primary_port.to_string();
    let sentinel = RedisProcess::start(
        format!("sentinel {index}"),
        dir,
        access.cli_args(true),
        |port| {
            let mut directives = setup.listen(port);
            directives.extend([
                directive(&[
                    "sentinel",
                    "monitor",
                    MASTER_NAME,
                    "127.0.0.1",
                    &primary_port,
                    "2",
                ]),
                directive(&["sentinel", "down-after-milliseconds", MASTER_NAME, "1000"]),
                directive(&["sentinel", "failover-timeout", MASTER_NAME, "3000"]),
                directive(&["sentinel", "parallel-syncs", MASTER_NAME, "1"]),
            ]);
            directives.extend(sentinel_auth(setup.security(), access));
            std::fs::write(&config_path, as_config(&directives)).expect("write sentinel.conf");
            vec![path_arg(&config_path), "--sentinel".to_owned()]
        },
    )
    .await;
    // A sentinel whose timer has not run for 2 s (a loaded machine stalled)
    // enters TILT mode: it watches but does not act. How long is no setting
    // of sentinel.conf, only of `SENTINEL DEBUG`.
    access
        .query::<()>(
            sentinel.port(),
            redis::cmd("SENTINEL")
                .arg("DEBUG")
                .arg("tilt-period")
                .arg(TILT_PERIOD_MS),
        )
        .await
        .unwrap_or_else(|why| panic!("sentinel {index}: SENTINEL DEBUG tilt-period: {why}"));
    sentinel
}

/// How a sentinel gets into the data nodes secured by `security`, and what
/// it demands itself (what `access` gets past): the ACL user, both ways;
/// or the data nodes' password, and its own if it has one.
fn sentinel_auth(security: &Security, access: &Access) -> Vec<Directive> {
    if let Some((user, password)) = &security.acl_user {
        vec![
            directive(&["sentinel", "auth-user", MASTER_NAME, user]),
            directive(&["sentinel", "auth-pass", MASTER_NAME, password]),
            directive(&["sentinel", "sentinel-user", user]),
            directive(&["sentinel", "sentinel-pass", password]),
            acl_user(user, password),
            directive(&["user", "default", "off"]),
        ]
    } else if let Some(password) = &security.password {
        let mut directives = vec![directive(&["sentinel", "auth-pass", MASTER_NAME, password])];
        if let Some(own) = access.password() {
            directives.push(directive(&["requirepass", own]));
        }
        directives
    } else {
        Vec::new()
    }
}
