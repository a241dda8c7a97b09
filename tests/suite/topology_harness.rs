//! The Redis topologies of `tests/common/redis/` do what the tests
//! built on them assume: the cluster spreads keys over its three primaries
//! and survives losing one, the sentinels replace a killed primary (after a
//! stall of the machine too), and the password, ACL and TLS servers let in
//! only who they should. Each test prints how long its topology took to
//! start and to fail over.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::redis::{RedisCluster, RedisSentinel, RedisServer, Role, Secured};
use common::{PATIENCE, eventually};

/// The answer to `PING` on a plain connection to `url`, or the error.
/// Waiting up to [`PATIENCE`] for it, not the redis crate's 500 ms: on a
/// stalled machine a refusal would otherwise come back as "timed out".
async fn ping(url: &str) -> Result<String, String> {
    let client = redis::Client::open(url).map_err(|err| err.to_string())?;
    let patient = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(PATIENCE))
        .set_response_timeout(Some(PATIENCE));
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&patient)
        .await
        .map_err(|err| err.to_string())?;
    redis::cmd("PING")
        .query_async::<String>(&mut connection)
        .await
        .map_err(|err| err.to_string())
}

#[tokio::test]
async fn the_cluster_spreads_keys_over_every_primary() {
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    eprintln!("cluster: started in {:?}", started.elapsed());

    let nodes = cluster.nodes().await;
    assert_eq!(nodes.len(), 6, "{nodes:?}");
    let primaries = cluster.primaries().await;
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    assert_eq!(
        primaries
            .iter()
            .map(|node| node.slot_count())
            .sum::<usize>(),
        common::redis::CLUSTER_SLOTS
    );
    let replicas = cluster.replicas().await;
    assert_eq!(replicas.len(), 3, "{replicas:?}");
    for replica in &replicas {
        let primary = replica
            .primary_id
            .as_deref()
            .expect("a replica has a primary");
        assert!(
            primaries.iter().any(|node| node.id == primary),
            "replica {} follows {primary}, not one of the primaries",
            replica.port
        );
    }
    assert!(nodes.iter().all(|node| node.pid.is_some()));
    assert_eq!(cluster.urls().len(), 6);

    let mut connection = cluster.connection().await;
    for i in 0..300 {
        let key = format!("{{tenant-{i}}}:requests");
        redis::cmd("SET")
            .arg(&key)
            .arg(i)
            .arg("EX")
            .arg(60)
            .exec_async(&mut connection)
            .await
            .unwrap_or_else(|err| panic!("SET {key} through the cluster client: {err}"));
    }
    let spread = cluster.keys_per_primary().await;
    eprintln!("cluster: 300 keys spread as (port, keys) {spread:?}");
    assert_eq!(spread.len(), 3);
    assert_eq!(spread.iter().map(|(_, keys)| keys).sum::<u64>(), 300);
    assert!(spread.iter().all(|(_, keys)| *keys > 0), "{spread:?}");

    // Without the cluster client: find the key's node by its slot.
    let key = "{tenant-7}:requests";
    let owner = cluster.primary_for_key(key).await;
    assert!(owner.owns_slot(cluster.slot_of(key).await));
    let mut direct = cluster.node_connection(owner.port).await;
    let value: i64 = redis::cmd("GET")
        .arg(key)
        .query_async(&mut direct)
        .await
        .expect("GET on the key's own primary");
    assert_eq!(value, 7);
    let elsewhere = primaries
        .iter()
        .find(|node| node.port != owner.port)
        .expect("another primary");
    let refused = redis::cmd("GET")
        .arg(key)
        .query_async::<Option<i64>>(&mut cluster.node_connection(elsewhere.port).await)
        .await
        .expect_err("another primary redirects");
    assert_eq!(
        refused.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
    );
}

#[tokio::test]
async fn a_replica_takes_over_from_a_killed_cluster_primary() {
    let mut cluster = RedisCluster::start().await;
    let first = cluster.primaries().await.remove(0);
    let key = (0..)
        .map(|i| format!("{{k{i}}}:window"))
        .find(|key| first.owns_slot(crc16_slot(key)))
        .expect("some key falls in the first primary's slots");
    assert_eq!(cluster.slot_of(&key).await, crc16_slot(&key));
    let mut connection = cluster.connection().await;
    redis::cmd("SET")
        .arg(&key)
        .arg(41)
        .exec_async(&mut connection)
        .await
        .expect("SET before the failover");
    // Replication is asynchronous: make sure the replica has the write.
    cluster.await_replicated().await;
    let replica = cluster
        .replicas()
        .await
        .into_iter()
        .find(|node| node.primary_id.as_ref() == Some(&first.id))
        .expect("the first primary's replica");
    let mut reading = cluster.node_connection(replica.port).await;
    redis::cmd("READONLY")
        .exec_async(&mut reading)
        .await
        .expect("READONLY");
    let copy: Option<i64> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut reading)
        .await
        .expect("GET on the replica");
    assert_eq!(copy, Some(41));

    let killed = cluster.kill_primary(0).await;
    assert_eq!(killed.port, first.port);
    let started = Instant::now();
    let promoted = cluster.await_failover(&killed).await;
    eprintln!(
        "cluster: port {} took over from {} in {:?}",
        promoted.port,
        killed.port,
        started.elapsed()
    );
    assert_ne!(promoted.port, killed.port);
    assert_eq!(promoted.role, Role::Primary);
    assert!(promoted.slots.iter().eq(killed.slots.iter()));
    assert_eq!(cluster.urls().len(), 5);
    assert!(
        cluster
            .nodes()
            .await
            .iter()
            .any(|node| node.port == killed.port && node.pid.is_none() && node.is_failing())
    );

    // The client made before the failover finds the new primary itself.
    // (Reads only until it does: a write retried across the failover may
    // be applied twice.)
    let started = Instant::now();
    eventually("the old cluster connection to answer again", || {
        let mut connection = connection.clone();
        let key = key.clone();
        async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<i64>>(&mut connection)
                .await
                .is_ok()
        }
    })
    .await;
    eprintln!(
        "cluster: the old client answered again {:?} after the failover",
        started.elapsed()
    );
    let value: i64 = redis::cmd("INCR")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .expect("INCR through the old connection after the failover");
    assert_eq!(value, 42, "the write before the kill survived");
    let mut fresh = cluster.connection().await;
    let value: i64 = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut fresh)
        .await
        .expect("GET through a new connection after the failover");
    assert_eq!(value, 42);

    // The killed node comes back as a replica of the one that replaced it.
    cluster.restart_node(killed.port).await;
    cluster.await_healthy().await;
    let back = cluster
        .nodes()
        .await
        .into_iter()
        .find(|node| node.port == killed.port)
        .expect("the restarted node");
    assert_eq!(back.role, Role::Replica);
    assert_eq!(back.primary_id.as_deref(), Some(promoted.id.as_str()));
}

#[tokio::test]
async fn a_frozen_cluster_primary_is_replaced_and_rejoins_as_a_replica() {
    let cluster = RedisCluster::start().await;
    let hung = cluster.primaries().await.remove(1);
    cluster.freeze(hung.port);
    assert_eq!(cluster.urls().len(), 5, "a frozen node is no seed");
    let started = Instant::now();
    let promoted = cluster.await_failover(&hung).await;
    eprintln!(
        "cluster: port {} took over from the frozen {} in {:?}",
        promoted.port,
        hung.port,
        started.elapsed()
    );
    assert_ne!(promoted.port, hung.port);

    cluster.thaw(hung.port);
    let started = Instant::now();
    cluster.await_healthy().await;
    eprintln!(
        "cluster: the thawed node rejoined in {:?}",
        started.elapsed()
    );
    let back = cluster
        .nodes()
        .await
        .into_iter()
        .find(|node| node.port == hung.port)
        .expect("the thawed node");
    assert_eq!(back.role, Role::Replica);
    assert_eq!(back.primary_id.as_deref(), Some(promoted.id.as_str()));
}

#[tokio::test]
async fn dropping_a_harness_kills_even_a_frozen_server() {
    let redis = RedisServer::with_password("pw").await;
    let pid = redis.pid().expect("running");
    let dir = redis.dir().to_owned();
    redis.freeze();
    drop(redis);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "redis-server {pid} outlived its harness"
    );
    assert!(!dir.exists(), "{} outlived its harness", dir.display());
}

#[tokio::test]
async fn the_sentinels_promote_the_replica_of_a_killed_primary() {
    let started = Instant::now();
    let mut group = RedisSentinel::start().await;
    eprintln!("sentinel: started in {:?}", started.elapsed());
    assert_eq!(group.master_name(), "mymaster");
    assert_eq!(group.sentinel_urls().len(), 3);
    let old = group.primary_port().await;
    assert_eq!(old, group.data_ports()[0]);
    let mut primary = group.primary_connection().await;
    redis::cmd("SET")
        .arg("bucket")
        .arg(9)
        .exec_async(&mut primary)
        .await
        .expect("SET on the primary");
    let replicated: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(PATIENCE.as_millis() as u64)
        .query_async(&mut primary)
        .await
        .expect("WAIT");
    assert_eq!(replicated, 1);
    group.await_replicated().await;

    assert_eq!(group.kill_primary().await, old);
    let started = Instant::now();
    let new = group.await_failover(old).await;
    eprintln!(
        "sentinel: port {new} took over from {old} in {:?}",
        started.elapsed()
    );
    assert_ne!(new, old);
    assert_eq!(new, group.data_ports()[1]);
    assert_eq!(group.primary_port().await, new);
    let mut primary = group.primary_connection().await;
    let value: i64 = redis::cmd("INCR")
        .arg("bucket")
        .query_async(&mut primary)
        .await
        .expect("INCR on the new primary");
    assert_eq!(value, 10);
}

#[tokio::test]
async fn the_sentinels_fail_over_after_the_machine_stalls() {
    /// Longer than the sentinels' `tilt-trigger` (2 s without their timer).
    const STALL: Duration = Duration::from_secs(3);
    let mut group = RedisSentinel::start().await;
    let old = group.kill_primary().await;
    // A loaded machine may stop every process for seconds at once; here only
    // the sentinels, which is what they notice. The stall is a length of
    // time, not a condition anything could signal.
    group.freeze_sentinels();
    tokio::time::sleep(STALL).await;
    group.thaw_sentinels();
    eventually("every sentinel to enter TILT mode after the stall", || {
        let tilted = group.sentinels_tilted();
        async move { tilted == 3 }
    })
    .await;
    let started = Instant::now();
    let new = group.await_failover(old).await;
    eprintln!(
        "sentinel: port {new} took over from {old} in {:?} after the stall",
        started.elapsed()
    );
    assert_eq!(new, group.data_ports()[1]);
}

#[tokio::test]
async fn a_password_redis_refuses_anonymous_clients() {
    let started = Instant::now();
    let redis = RedisServer::with_password("s3cret pass/word").await;
    eprintln!("password: started in {:?}", started.elapsed());
    let refused = ping(&redis.url_without_credentials())
        .await
        .expect_err("PING without the password");
    assert!(refused.contains("NOAUTH"), "{refused}");
    assert_eq!(ping(&redis.url()).await.as_deref(), Ok("PONG"));
    let answer: String = redis::cmd("PING")
        .query_async(&mut redis.connection().await)
        .await
        .expect("PING on the logged-in connection");
    assert_eq!(answer, "PONG");
    let anonymous = redis.cli_anonymous(&["PING"]).await.expect("redis-cli");
    assert!(anonymous.contains("NOAUTH"), "{anonymous}");
    assert_eq!(
        redis.cli(&["PING"]).await.expect("redis-cli").trim(),
        "PONG"
    );
}

#[tokio::test]
async fn an_acl_redis_lets_in_only_its_user() {
    let redis = RedisServer::with_acl_user("ratelimitd", "limits").await;
    let refused = ping(&redis.url_without_credentials())
        .await
        .expect_err("PING without logging in");
    assert!(refused.contains("NOAUTH"), "{refused}");
    let wrong = ping(&format!(
        "redis://ratelimitd:nope@127.0.0.1:{}/0",
        redis.port()
    ))
    .await
    .expect_err("PING with a wrong password");
    assert!(wrong.to_lowercase().contains("authentication"), "{wrong}");
    assert_eq!(ping(&redis.url()).await.as_deref(), Ok("PONG"));
    // What a rate limiter runs: scripts on keys with expiry.
    let count: i64 = redis::Script::new(
        "local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n",
    )
    .key("user:1")
    .arg(60_000)
    .invoke_async(&mut redis.connection().await)
    .await
    .expect("a script as the ACL user");
    assert_eq!(count, 1);
    assert_eq!(
        redis.cli(&["PING"]).await.expect("redis-cli").trim(),
        "PONG"
    );
}

#[tokio::test]
async fn a_tls_redis_answers_over_tls_only() {
    let started = Instant::now();
    let redis = RedisServer::with_tls().await;
    eprintln!("tls: started in {:?}", started.elapsed());
    assert!(redis.url().starts_with("rediss://127.0.0.1:"));
    for path in [
        redis.ca_cert_path(),
        redis.client_cert_path(),
        redis.client_key_path(),
        &redis.tls_files().server_cert,
        &redis.tls_files().server_key,
    ] {
        assert!(path.is_file(), "{} was written", path.display());
    }
    assert_eq!(
        redis.cli(&["PING"]).await.expect("redis-cli --tls").trim(),
        "PONG"
    );
    // A client certificate is optional here.
    assert_eq!(
        redis
            .cli_anonymous(&["PING"])
            .await
            .expect("redis-cli --tls")
            .trim(),
        "PONG"
    );
    // Plain TCP gets nowhere.
    let plain = format!("redis://127.0.0.1:{}/0", redis.port());
    assert!(ping(&plain).await.is_err());
}

#[tokio::test]
async fn a_tls_redis_can_require_a_client_certificate() {
    let redis = RedisServer::with_tls_client_auth().await;
    assert_eq!(
        redis
            .cli(&["PING"])
            .await
            .expect("redis-cli with the client certificate")
            .trim(),
        "PONG"
    );
    let refused = redis.cli_anonymous(&["PING"]).await;
    assert!(
        !refused
            .as_deref()
            .is_ok_and(|answer| answer.contains("PONG")),
        "no client certificate, yet: {refused:?}"
    );
}

/// The cluster hash slot of `key`, computed here (CRC16/XMODEM of the hash
/// tag, or of the whole key), to check the harness's `CLUSTER KEYSLOT`.
fn crc16_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}
