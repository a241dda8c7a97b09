//! The `ratelimitd` binary: parse the command line, start the runtime and
//! logging, bind the listeners (and say where gRPC's is, with
//! `--address-file`), serve until SIGTERM or Ctrl-C.

use std::path::Path;
use std::process::ExitCode;

use ratelimitd::config::Config;
use ratelimitd::config::upstream::Report;
use ratelimitd::server::threads::WorkerThreads;
use ratelimitd::server::{self, Listeners, ServingThreads};
use ratelimitd::telemetry;
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let (config, upstream) = match Config::load() {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("ratelimitd: {err}");
            return ExitCode::from(2);
        }
    };
    let threads =
        match server::threads::worker_threads(config.runtime.worker_threads, &config.store) {
            Ok(threads) => threads,
            Err(err) => {
                eprintln!("ratelimitd: {err}");
                return ExitCode::from(2);
            }
        };
    match threads.runtimes() {
        // The other threads end when `others` drops, after serving.
        Ok((main, others)) => main.block_on(serve(config, upstream, threads, &others)),
        Err(err) => {
            eprintln!("ratelimitd: cannot start the runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Starts logging, binds the listeners and serves until a shutdown signal.
async fn serve(
    config: Config,
    upstream: Report,
    threads: WorkerThreads,
    others: &ServingThreads,
) -> ExitCode {
    telemetry::init(config.telemetry.log_format, config.telemetry.log_level);
    info!(
        worker_threads = threads.count.get(),
        worker_threads_because = threads.reason,
        scheduler = threads.scheduler(),
        "ratelimitd {} starting",
        env!("CARGO_PKG_VERSION")
    );
    if upstream.active {
        // Warn: upstream's default level is WARN, and this changes defaults.
        warn!(
            variables = ?upstream.read,
            "envoyproxy/ratelimit's environment variables in use: their defaults apply where ours differ"
        );
    }
    for warning in &upstream.warnings {
        warn!("{warning}");
    }
    ratelimitd::incoming::raise_open_file_limit();
    let listeners = match Listeners::bind(&config).await {
        Ok(listeners) => listeners,
        Err(err) => {
            error!(%err, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    server::banner::announce(&config, &listeners);
    if let Some(path) = &config.listener.address_file {
        let written = listeners
            .grpc_address()
            .and_then(|address| write_whole(path, &format!("{address}\n")));
        if let Err(err) = written {
            error!(path = %path.display(), %err, "cannot write --address-file");
            return ExitCode::FAILURE;
        }
    }
    match server::run_on_threads(config, listeners, shutdown_signal(), others).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!(%err, "server failed");
            ExitCode::FAILURE
        }
    }
}

/// Writes `text` to `path` so that a reader sees all of it or nothing: to a
/// temporary file beside it, then renamed over it.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)
}

/// Resolves on the first SIGTERM (how orchestrators stop us) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            error!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("Ctrl-C received"),
        () = terminate => info!("SIGTERM received"),
    }
}
