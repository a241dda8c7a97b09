//! The gRPC listener's options: where to serve, how long shutdown serves
//! on and then waits, and whether reflection is on; and the threads that
//! serve.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use crate::options::{DurationOrOff, duration_or_off, positive_duration};

/// Where and how gRPC is served.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Listener and TLS")]
pub struct ListenerOptions {
    /// Address to serve gRPC on.
    #[arg(long, env = "RATELIMITD_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Once the gRPC listener is bound, write its address (`host:port`) to
    /// this file: with `--listen 127.0.0.1:0`, how a supervisor or a test
    /// learns the port the system chose (with --xds-server it takes
    /// connections once the first configuration came). Written whole (to a temporary file
    /// beside it, then renamed), so a reader never sees half of it.
    #[arg(long, env = "RATELIMITD_ADDRESS_FILE")]
    pub address_file: Option<PathBuf>,

    /// After SIGTERM, how long to go on serving gRPC as usual while health
    /// already says NOT_SERVING (gRPC health, and 500 at /healthcheck), so
    /// that load balancers and Kubernetes stop sending calls before the
    /// port closes. `0s`: close at once.
    #[arg(long, env = "RATELIMITD_SHUTDOWN_DELAY", default_value = "0s",
          value_parser = duration_or_off)]
    pub shutdown_delay: DurationOrOff,

    /// After SIGTERM (and --shutdown-delay), longest wait for calls in
    /// flight before exiting anyway.
    #[arg(long, env = "RATELIMITD_SHUTDOWN_GRACE", default_value = "10s",
          value_parser = positive_duration)]
    pub shutdown_grace: Duration,

    /// Serve gRPC server reflection (grpcurl, grpcui and alike list and call
    /// the services without the .proto files). `--reflection=false` removes
    /// it.
    #[arg(long, env = "RATELIMITD_REFLECTION", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub reflection: bool,
}

/// The threads that serve.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Runtime")]
pub struct RuntimeOptions {
    /// Threads that serve calls and talk to the stores, each running its
    /// own runtime; each new connection goes to the thread with the fewest
    /// open, and is served by it alone. Default: as many as the cores this
    /// process may use (its CPU affinity and cgroup quota), less one when
    /// every Redis named is on this host (a loopback address or a Unix
    /// socket). Where other busy processes (Envoy, the application) share
    /// those cores, give ratelimitd as many as the cores it has to itself.
    #[arg(long, env = "RATELIMITD_WORKER_THREADS")]
    pub worker_threads: Option<NonZeroUsize>,
}
