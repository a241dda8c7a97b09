//! How many worker threads serve: `--worker-threads` (or tokio's own
//! `TOKIO_WORKER_THREADS`) when given; else the cores this process may use,
//! less one left to a Redis on the same host. And the runtimes that run
//! them: one per thread.

use std::io;
use std::num::NonZeroUsize;
use std::time::Duration;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::watch;

use crate::store::{StoreOptions, Topology};

/// The worker threads to start, and why that many (for the start-up log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerThreads {
    /// How many.
    pub count: NonZeroUsize,
    /// Where the number comes from.
    pub reason: &'static str,
}

impl WorkerThreads {
    /// The scheduler [`runtimes`](Self::runtimes) run, for the start-up log.
    pub fn scheduler(&self) -> &'static str {
        if self.count.get() == 1 {
            "current-thread"
        } else {
            "current-thread per worker thread"
        }
    }

    /// The runtimes: tokio's current-thread scheduler on each worker
    /// thread. The first is returned to be run on the calling thread (it
    /// also runs the background tasks and the HTTP listeners); the others
    /// each run on a thread of their own, started here, serving what
    /// [`crate::server::run_on_threads`] hands them until the
    /// [`ServingThreads`] returned is dropped.
    ///
    /// Why not tokio's multi-thread scheduler: it runs a task woken by the
    /// running task next (its LIFO slot), so a request's task that hands
    /// its response to its connection's task has that task write it at
    /// once: one write per response. The current-thread scheduler runs
    /// woken tasks in turn, so a connection writes every response finished
    /// since its last turn in one write. Under load on Redis, where
    /// responses finish together when a batch's reply comes, that is a
    /// quarter of the writes and about half the CPU per request. Each
    /// connection is then served by one thread; the connections are spread
    /// among the threads as they are accepted.
    pub fn runtimes(&self) -> io::Result<(Runtime, ServingThreads)> {
        crate::worker::set_count(self.count);
        let main = Builder::new_current_thread().enable_all().build()?;
        let (release, released) = watch::channel(());
        let mut handles = Vec::with_capacity(self.count.get() - 1);
        for index in 1..self.count.get() {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            handles.push(runtime.handle().clone());
            let mut released = released.clone();
            std::thread::Builder::new()
                .name(format!("ratelimitd-worker-{index}"))
                .spawn(move || {
                    crate::worker::enter(index);
                    // Runs what is spawned on it until the release is
                    // dropped; then drops the runtime, and its tasks.
                    runtime.block_on(async move { while released.changed().await.is_ok() {} });
                })?;
        }
        Ok((
            main,
            ServingThreads {
                others: handles,
                _release: release,
            },
        ))
    }
}

/// How often [`tick_timer`] ticks: well below the shortest timeout a call
/// sets (the Redis command timeout, 100 ms by default).
const TIMER_TICK: Duration = Duration::from_millis(10);

/// Ticks every [`TIMER_TICK`] on the runtime it is spawned on, for as long
/// as that runtime serves. Why: tokio's timer wakes its own thread (a
/// write to an eventfd: a system call) whenever a timer is set to fire
/// before the wake-up it planned when the thread last went idle. After an
/// idle moment with no timer pending, it planned none, so every timeout a
/// call sets from then until the thread next idles costs such a write: on
/// Redis with two threads under h2load, 0.6 writes per request. A timer
/// always due within 10 ms keeps every call's timeouts later than the
/// planned wake-up: 0.02 writes per request, and 3.5 µs less CPU per
/// request. Idle, it costs 100 wake-ups a second.
pub(crate) async fn tick_timer() {
    let mut tick = tokio::time::interval(TIMER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// The worker threads beside the one [`crate::server::run_on_threads`]
/// runs on, each running a runtime of its own; they end when this drops.
#[derive(Debug)]
pub struct ServingThreads {
    others: Vec<Handle>,
    _release: watch::Sender<()>,
}

impl ServingThreads {
    /// No thread beside the caller's: its runtime serves alone (a server
    /// started inside another program's runtime).
    pub fn none() -> Self {
        Self {
            others: Vec::new(),
            _release: watch::channel(()).0,
        }
    }

    /// Every serving runtime: the caller's, then the other threads'.
    /// Called on a runtime.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        std::iter::once(Handle::current())
            .chain(self.others.iter().cloned())
            .collect()
    }
}

/// The variable tokio reads when it chooses the number itself.
const TOKIO_WORKER_THREADS: &str = "TOKIO_WORKER_THREADS";

/// The worker threads for `store` given `--worker-threads` (`chosen`);
/// refused when `TOKIO_WORKER_THREADS` is set to anything but a positive
/// number.
pub fn worker_threads(
    chosen: Option<NonZeroUsize>,
    store: &StoreOptions,
) -> Result<WorkerThreads, String> {
    if chosen.is_none()
        && let Some(value) = std::env::var_os(TOKIO_WORKER_THREADS)
    {
        let count = value
            .to_str()
            .and_then(|text| text.trim().parse::<NonZeroUsize>().ok())
            .ok_or_else(|| {
                format!(
                    "{TOKIO_WORKER_THREADS} must be a number of threads, 1 or more (got {value:?})"
                )
            })?;
        return Ok(WorkerThreads {
            count,
            reason: TOKIO_WORKER_THREADS,
        });
    }
    // The affinity mask and the cgroup CPU quota, as the runtime itself
    // would count them.
    let cores = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
    Ok(threads_for(chosen, cores, redis_on_this_host(store)))
}

fn threads_for(
    chosen: Option<NonZeroUsize>,
    cores: NonZeroUsize,
    local_redis: bool,
) -> WorkerThreads {
    if let Some(count) = chosen {
        return WorkerThreads {
            count,
            reason: "--worker-threads",
        };
    }
    // A Redis on this host runs its commands on these cores: a worker
    // thread for every core would wake threads on the core Redis needs,
    // and each decision on Redis would cost more CPU, for fewer answered.
    match NonZeroUsize::new(cores.get() - 1) {
        Some(fewer) if local_redis => WorkerThreads {
            count: fewer,
            reason: "one per core this process may use, less one for the Redis on this host",
        },
        _ => WorkerThreads {
            count: cores,
            reason: "one per core this process may use",
        },
    }
}

/// Whether every Redis `store` names is on this host: a Unix socket or a
/// loopback address. Sentinels name where to ask for the primary, not
/// where it is, so a Sentinel setup never counts as local.
fn redis_on_this_host(store: &StoreOptions) -> bool {
    let urls = store
        .redis_url
        .iter()
        .chain(&store.redis_persecond_url)
        .map(|url| url.as_str());
    store.redis_mode != Topology::Sentinel
        && !store.redis_url.is_empty()
        && urls.into_iter().all(is_on_this_host)
}

fn is_on_this_host(url: &str) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    if matches!(url.scheme(), "unix" | "redis+unix") {
        return true;
    }
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        // A redis:// URL's host is not parsed as an address (the scheme
        // is not one the URL standard knows): it comes as a name.
        Some(url::Host::Domain(name)) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(count: usize) -> NonZeroUsize {
        NonZeroUsize::new(count).unwrap()
    }

    #[test]
    fn each_worker_thread_runs_a_current_thread_runtime_until_released() {
        use tokio::runtime::RuntimeFlavor;

        let threads = WorkerThreads {
            count: n(3),
            reason: "test",
        };
        let (main, others) = threads.runtimes().unwrap();
        assert_eq!(main.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        let handles = main.block_on(async { others.handles() });
        assert_eq!(handles.len(), 3, "the caller's and two more");
        let names: Vec<String> = main.block_on(async {
            let mut names = Vec::new();
            for handle in &handles {
                assert_eq!(handle.runtime_flavor(), RuntimeFlavor::CurrentThread);
                let name = handle
                    .spawn(async { std::thread::current().name().map(str::to_owned) })
                    .await
                    .unwrap();
                names.push(name.unwrap_or_default());
            }
            names
        });
        assert_eq!(names[1..], ["ratelimitd-worker-1", "ratelimitd-worker-2"]);
        assert_ne!(names[0], names[1], "the first is the caller's thread");
        // Released, a thread's runtime ends, and what it ran with it.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        handles[1].spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(others);
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
            "the task was dropped with its runtime"
        );
        assert_eq!(threads.scheduler(), "current-thread per worker thread");
    }

    #[test]
    fn a_chosen_number_is_kept() {
        let threads = threads_for(Some(n(3)), n(8), true);
        assert_eq!(threads.count, n(3));
        assert_eq!(threads.reason, "--worker-threads");
    }

    #[test]
    fn a_redis_on_this_host_is_left_a_core_unless_there_is_only_one() {
        assert_eq!(threads_for(None, n(2), true).count, n(1));
        assert_eq!(threads_for(None, n(8), true).count, n(7));
        assert_eq!(threads_for(None, n(1), true).count, n(1));
        assert_eq!(threads_for(None, n(2), false).count, n(2));
    }

    #[test]
    fn loopback_and_unix_socket_urls_are_this_host() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis://127.0.0.2:7000",
            "redis://localhost:6379",
            "rediss://user:pw@[::1]:6380",
            "redis+unix:///run/redis.sock",
            "unix:///run/redis.sock?db=1",
        ] {
            assert!(is_on_this_host(url), "{url}");
        }
        for url in [
            "redis://10.0.0.7:6379",
            "redis://redis.internal:6379",
            "redis://[2001:db8::1]:6379",
            "not a url",
        ] {
            assert!(!is_on_this_host(url), "{url}");
        }
    }

    #[test]
    fn every_redis_must_be_here_and_sentinels_never_count() {
        use clap::Parser;

        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            store: StoreOptions,
        }
        let store = |args: &[&str]| {
            Flags::try_parse_from(std::iter::once("ratelimitd").chain(args.iter().copied()))
                .unwrap()
                .store
        };
        assert!(!redis_on_this_host(&store(&[])), "the embedded store");
        assert!(redis_on_this_host(&store(&[
            "--redis-url",
            "redis://127.0.0.1:6379"
        ])));
        assert!(!redis_on_this_host(&store(&[
            "--redis-url",
            "redis://127.0.0.1:6379",
            "--redis-persecond-url",
            "redis://10.0.0.7:6379"
        ])));
        assert!(!redis_on_this_host(&store(&[
            "--redis-url",
            "redis://127.0.0.1:26379",
            "--redis-mode",
            "sentinel"
        ])));
    }
}
