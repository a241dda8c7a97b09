//! Logging: tracing-subscriber writing text or JSON lines to stderr, at the
//! configured level unless `RUST_LOG` sets a filter; a throttle for
//! warnings a peer could repeat; and the options of logs and metrics.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// Logs and metrics.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryOptions {
    /// Serve Prometheus metrics at http://<this address>/metrics. Unset:
    /// no metrics endpoint.
    #[arg(long, env = "RATELIMITD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Least severe log level written; RUST_LOG, when set, wins.
    #[arg(long, env = "RATELIMITD_LOG_LEVEL", value_enum, default_value = "info")]
    pub log_level: LogLevel,

    /// Log line format.
    #[arg(
        long,
        env = "RATELIMITD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The least severe level written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Debugging detail.
    Debug,
    /// The default: start, stop, reloads.
    Info,
    /// Only what needs attention.
    Warn,
    /// Only failures.
    Error,
}

impl LogLevel {
    fn directive(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// Installs the global subscriber. Call once, at start.
pub fn init(format: LogFormat, level: LogLevel) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level.directive()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Lets a warning out at most once per interval, counting those held back.
#[derive(Debug)]
pub(crate) struct WarnThrottle {
    every: Duration,
    /// When the last warning went out, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnThrottle {
    /// At most one warning per `every`.
    pub(crate) const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Runs `log` (given how many warnings were held back since the last
    /// one) unless a warning went out within the interval.
    pub(crate) fn warn(&self, log: impl FnOnce(u64)) {
        let now = Instant::now();
        let suppressed = {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (warned_at, suppressed) = &mut *state;
            if warned_at.is_some_and(|at| now.duration_since(at) < self.every) {
                *suppressed += 1;
                return;
            }
            *warned_at = Some(now);
            std::mem::take(suppressed)
        };
        log(suppressed);
    }
}
