//! What the harness asks a Redis it started, and how it reads the replies:
//! `INFO` fields, `ROLE`, replication offsets and links, and `redis-cli`
//! (run with a timeout, since a frozen server would hang it forever).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::access::Access;
use crate::common::wait::settle;

/// How long one `redis-cli` run may take before it is killed.
const CLI_TIMEOUT: Duration = Duration::from_secs(5);

/// A field of an `INFO` (or `CLUSTER INFO`) reply.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .split_once(':')
            .filter(|(name, _)| *name == field)
            .map(|(_, value)| value)
    })
}

/// Why the node on `port` is not a primary by its own word (what `ROLE`
/// says first: `master`, `slave` or `sentinel`), if it is not.
pub(crate) async fn answers_as_primary(access: &Access, port: u16) -> Result<(), String> {
    let reply: Vec<redis::Value> = access.query(port, &redis::cmd("ROLE")).await?;
    let role = match reply.first() {
        Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        Some(redis::Value::SimpleString(text)) => text.clone(),
        other => return Err(format!("port {port} answers ROLE with {other:?}")),
    };
    if role != "master" {
        return Err(format!("port {port} answers ROLE {role}"));
    }
    Ok(())
}

/// Why the replica on `port` has no live link to its primary, if it has
/// not.
pub(crate) async fn replica_link_up(access: &Access, port: u16) -> Result<(), String> {
    let replication: String = access
        .query(port, redis::cmd("INFO").arg("replication"))
        .await?;
    match info_field(&replication, "master_link_status") {
        Some("up") => Ok(()),
        link => Err(format!("replica {port} has master_link_status:{link:?}")),
    }
}

/// Waits until every replica has everything its primary has written so far
/// (its `slave_repl_offset` has reached the primary's `master_repl_offset`),
/// for the (primary, replica) ports that `pairs` lists at each look.
/// Replication is asynchronous: a write that a replica has not received yet
/// is lost when its primary is killed.
pub(crate) async fn await_caught_up<F, Fut>(access: &Access, mut pairs: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<(u16, u16)>, String>>,
{
    settle("the replicas to catch up with their primaries", || {
        let pairs = pairs();
        async move {
            for (primary, replica) in pairs.await? {
                caught_up(access, primary, replica).await?;
            }
            Ok(())
        }
    })
    .await;
}

/// Whether the replica on `replica` has received all that the primary on
/// `primary` has written (the primary's offset is read first).
async fn caught_up(access: &Access, primary: u16, replica: u16) -> Result<(), String> {
    let offset = |port: u16, field: &'static str| async move {
        let info: String = access
            .query(port, redis::cmd("INFO").arg("replication"))
            .await?;
        info_field(&info, field)
            .and_then(|value| value.parse::<u64>().ok())
            .ok_or_else(|| format!("no {field} in INFO replication of {port}"))
    };
    let written = offset(primary, "master_repl_offset").await?;
    let received = offset(replica, "slave_repl_offset").await?;
    if received < written {
        return Err(format!(
            "replica {replica} is at offset {received}, primary {primary} at {written}"
        ));
    }
    Ok(())
}

/// `redis-cli -h 127.0.0.1 -p PORT ARGS... COMMAND...`: what it printed.
/// `redis-cli` prints error replies (`NOAUTH ...`) there too, and still
/// exits 0.
pub(crate) async fn cli(port: u16, args: &[String], command: &[&str]) -> Result<String, String> {
    let mut all: Vec<String> = [
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--no-auth-warning",
    ]
    .map(str::to_owned)
    .to_vec();
    all.extend(args.iter().cloned());
    all.extend(command.iter().map(|word| (*word).to_owned()));
    run("redis-cli", all, CLI_TIMEOUT).await
}

/// Runs `program` off the async threads, killed if it takes longer than
/// `timeout`. `Ok` is its standard output when it exits 0; `Err` says what
/// went wrong, with everything it printed.
pub(crate) async fn run(
    program: &str,
    args: Vec<String>,
    timeout: Duration,
) -> Result<String, String> {
    let program = program.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot run {program} ({err}): install redis-tools"))?;
        let deadline = Instant::now() + timeout;
        // The outputs wanted here are small: they fit the pipes while the
        // program runs, so it is enough to read them once it has exited.
        while child.try_wait().map_err(|err| err.to_string())?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program} {args:?} took over {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let output = child.wait_with_output().map_err(|err| err.to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{program} {args:?} failed ({}):\n{stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    })
    .await
    .expect("the thread running a command")
}

/// Script calls (`EVALSHA` and `EVAL`) in an `INFO commandstats` reply.
pub(crate) fn script_calls_in(commandstats: &str) -> u64 {
    commandstats
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            let calls = line.split_once("calls=")?.1;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}
