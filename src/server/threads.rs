//! How many worker threads serve: `--worker-threads` (or tokio's own
//! `TOKIO_WORKER_THREADS`) when given; else the cores this process may use,
//! less one left to a Redis on the same host. And the runtime that runs
//! them.

use std::io;
use std::num::NonZeroUsize;

use tokio::runtime::{Builder, Runtime};

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
    /// The scheduler [`runtime`](Self::runtime) runs: `current-thread` for
    /// one thread, else `multi-thread`.
    pub fn scheduler(&self) -> &'static str {
        if self.count.get() == 1 {
            "current-thread"
        } else {
            "multi-thread"
        }
    }

    /// The runtime: tokio's current-thread scheduler for one thread, its
    /// multi-thread scheduler for more.
    pub fn runtime(&self) -> io::Result<Runtime> {
        let mut builder = if self.count.get() == 1 {
            // The multi-thread scheduler, even with one worker, runs a task
            // woken by the running task next (its LIFO slot). A request's
            // task that hands its response to its connection's task so has
            // that task write it at once: one write per response. The
            // current-thread scheduler runs woken tasks in turn, so a
            // connection writes every response finished since its last
            // turn in one write. Under load on Redis, where responses finish
            // together when a batch's reply comes, that is a quarter of the
            // writes and about half the CPU per request.
            Builder::new_current_thread()
        } else {
            let mut builder = Builder::new_multi_thread();
            builder.worker_threads(self.count.get());
            builder
        };
        builder.enable_all().build()
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
    fn one_thread_runs_the_current_thread_scheduler_and_more_the_multi_thread_one() {
        use tokio::runtime::RuntimeFlavor;

        let threads = |count| WorkerThreads {
            count: n(count),
            reason: "test",
        };
        let one = threads(1).runtime().unwrap();
        assert_eq!(one.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        assert_eq!(threads(1).scheduler(), "current-thread");
        let two = threads(2).runtime().unwrap();
        assert_eq!(two.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(two.metrics().num_workers(), 2);
        assert_eq!(threads(2).scheduler(), "multi-thread");
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
