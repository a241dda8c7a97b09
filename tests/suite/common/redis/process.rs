//! The one way the tests start a `redis-server`: on a free loopback port, in
//! a folder of its own (working directory, data, `redis.log`, and
//! `stderr.log` for what it says before its log is open), awaited until it
//! answers as itself, and killed when dropped, frozen or not. Every
//! topology (a single server, a cluster, a sentinel group) is made of
//! these; [`Nodes`] finds one of a topology by its port.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::queries::{cli, info_field};
use crate::common::process::{ChildProcess, free_port};
use crate::common::wait::PATIENCE;

/// One `redis-server`.
pub(crate) struct RedisProcess {
    /// Which one, in messages: "cluster node 3".
    name: String,
    /// Its own folder: working directory, data, `redis.log`, `stderr.log`.
    dir: PathBuf,
    port: u16,
    /// The `redis-server` arguments, kept to restart it the same way.
    args: Vec<String>,
    /// What `redis-cli` needs besides host and port to be let in.
    cli_args: Vec<String>,
    child: Option<ChildProcess>,
}

impl RedisProcess {
    /// Starts `redis-server` in `dir` with the arguments `args` makes for a
    /// free port, and waits until it answers as itself (its `process_id`,
    /// asked with `redis-cli` and `cli_args`). A port taken between the
    /// choice and the bind (by another test, or by an outgoing connection)
    /// is not a failure: another port is tried. Panics with what the server
    /// logged if it does not start.
    pub(crate) async fn start(
        name: String,
        dir: PathBuf,
        cli_args: Vec<String>,
        mut args: impl FnMut(u16) -> Vec<String>,
    ) -> Self {
        const ATTEMPTS: usize = 5;
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|err| panic!("create {}: {err}", dir.display()));
        let mut attempt = 1;
        loop {
            for log in ["redis.log", "stderr.log"] {
                let _ = std::fs::remove_file(dir.join(log));
            }
            let port = free_port();
            let mut process = Self {
                name: name.clone(),
                dir: dir.clone(),
                port,
                args: args(port),
                cli_args: cli_args.clone(),
                child: None,
            };
            match process.launch().await {
                Ok(()) => return process,
                Err(log) if log.contains("Address already in use") && attempt < ATTEMPTS => {
                    attempt += 1;
                }
                Err(log) if log.contains("tls-port") => panic!(
                    "the installed redis-server has no TLS (it must be built with \
                     BUILD_TLS=yes, as Debian's redis-server is):\n{log}"
                ),
                Err(log) => panic!("{name} did not start:\n{log}"),
            }
        }
    }

    /// Spawns the process and waits until it answers `INFO server` with its
    /// own process id (a server that failed to bind could otherwise be
    /// mistaken for whatever holds the port).
    async fn launch(&mut self) -> Result<(), String> {
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))
            .unwrap_or_else(|err| panic!("open stderr.log in {}: {err}", self.dir.display()));
        let stdout = stderr.try_clone().expect("duplicate the stderr.log handle");
        let child = Command::new("redis-server")
            .args(&self.args)
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot start redis-server ({err}); the tests need Redis 7 with \
                     redis-cli: install it with `apt-get install redis-server`"
                )
            });
        let pid = child.id().to_string();
        self.child = Some(ChildProcess::from(child));
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.as_mut().and_then(ChildProcess::exited) {
                self.child = None;
                return Err(format!("{} exited ({status}):\n{}", self.name, self.log()));
            }
            if let Ok(info) = cli(self.port, &self.cli_args, &["INFO", "server"]).await
                && info_field(&info, "process_id") == Some(pid.as_str())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "{} did not answer on port {} within {PATIENCE:?}:\n{}",
                    self.name,
                    self.port,
                    self.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts again on the same port with the same arguments.
    pub(crate) async fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        if let Err(log) = self.launch().await {
            panic!(
                "{} did not restart on port {}:\n{log}",
                self.name, self.port
            );
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildProcess::pid)
    }

    /// Running and not frozen.
    pub(crate) fn is_answering(&self) -> bool {
        self.child.as_ref().is_some_and(|child| !child.is_frozen())
    }

    /// SIGKILL, as in a crash.
    pub(crate) fn kill(&mut self) {
        self.child = None;
    }

    /// SIGSTOP: connections stay open, nothing answers, as on a hung host.
    pub(crate) fn freeze(&self) {
        self.running().freeze();
    }

    /// SIGCONT after [`RedisProcess::freeze`].
    pub(crate) fn thaw(&self) {
        self.running().thaw();
    }

    /// Runs `redis-cli COMMAND...` against it with `args` (what gets past
    /// it, or less).
    pub(crate) async fn cli(&self, args: &[String], command: &[&str]) -> Result<String, String> {
        cli(self.port, args, command).await
    }

    /// `redis-cli` arguments that get past it.
    pub(crate) fn cli_args(&self) -> &[String] {
        &self.cli_args
    }

    /// Whether its log has `text` in it so far.
    pub(crate) fn logged(&self, text: &str) -> bool {
        self.log().contains(text)
    }

    fn running(&self) -> &ChildProcess {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.name))
    }

    /// What it logged, for failure messages.
    fn log(&self) -> String {
        ["stderr.log", "redis.log"]
            .iter()
            .filter_map(|name| std::fs::read_to_string(self.dir.join(name)).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The processes of one topology, in the order they were started.
pub(crate) struct Nodes {
    /// What they are, in messages: "cluster node".
    kind: &'static str,
    processes: Vec<RedisProcess>,
}

impl Nodes {
    pub(crate) fn new(kind: &'static str, processes: Vec<RedisProcess>) -> Self {
        Self { kind, processes }
    }

    /// Every port, killed nodes' too.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.processes.iter().map(RedisProcess::port).collect()
    }

    /// The ports of the nodes still answering (neither killed nor frozen).
    pub(crate) fn answering_ports(&self) -> Vec<u16> {
        self.processes
            .iter()
            .filter(|node| node.is_answering())
            .map(RedisProcess::port)
            .collect()
    }

    /// Where the node on `port` stands in the starting order.
    pub(crate) fn index_of(&self, port: u16) -> Option<usize> {
        self.processes.iter().position(|node| node.port == port)
    }

    /// The process id of the node on `port`, while it runs.
    pub(crate) fn pid_of(&self, port: u16) -> Option<u32> {
        self.index_of(port)
            .and_then(|index| self.processes[index].pid())
    }

    pub(crate) fn get(&self, port: u16) -> &RedisProcess {
        let index = self.expect_index(port);
        &self.processes[index]
    }

    pub(crate) fn get_mut(&mut self, port: u16) -> &mut RedisProcess {
        let index = self.expect_index(port);
        &mut self.processes[index]
    }

    fn expect_index(&self, port: u16) -> usize {
        self.index_of(port)
            .unwrap_or_else(|| panic!("no {} of ours on port {port}", self.kind))
    }
}
