//! The load generator's command line: what to drive, with what load, and
//! how to report it.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use ratelimitd::algorithm::registry::{Kind, Rate};
use ratelimitd::options::value_name;

/// Drives a rate-limit service (ratelimitd's `CheckLimit`, any Envoy RLS
/// server's `ShouldRateLimit`) or Redis itself, running ratelimitd's own
/// decision script, with the same load, and reports throughput, outcomes and
/// latency.
#[derive(Debug, Parser)]
#[command(name = "ratelimitd-bench", version)]
pub(crate) struct Options {
    /// What to drive.
    #[arg(long, value_enum, default_value_t = TargetKind::CheckLimit)]
    pub target: TargetKind,

    /// The gRPC server, for `check-limit` and `should-rate-limit`.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub address: String,

    /// The Redis, for `redis-direct`.
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    pub redis_url: String,

    /// For `redis-direct`: the storage-key prefix ratelimitd would use.
    #[arg(long, default_value = ratelimitd::limiter::DEFAULT_KEY_PREFIX)]
    pub redis_key_prefix: String,

    /// Calls in flight at once (workers).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// gRPC connections (HTTP/2) or Redis connections (multiplexed) the
    /// workers share, round robin.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,

    /// How long to measure, after the warm-up.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Measure this many calls instead of a duration (with `--batch`, each
    /// call decides `--batch` requests).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Load sent, and not measured, before measuring starts.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warm_up: Duration,

    /// Open loop: start calls at this many per second, whatever the
    /// answers' latency (latency counts from each call's scheduled start).
    /// Unset: closed loop, each worker sends its next call when the last is
    /// answered.
    #[arg(long)]
    pub rate: Option<f64>,

    #[arg(long, value_enum, default_value_t = Kind::FixedWindow)]
    pub algorithm: Kind,

    /// Requests per window; a token bucket's capacity; GCRA's burst.
    #[arg(long, default_value_t = 1000)]
    pub limit: u64,

    /// The window; a token bucket refills `limit` per window.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub window: Duration,

    /// Units each request spends.
    #[arg(long, default_value_t = 1)]
    pub cost: u64,

    /// For `check-limit`: limits per request. 1 asks the one-limit form
    /// (an algorithm on the request); N > 1 sends N limits in `limits`,
    /// named `l0` to `l{N-1}`, each the limit of `--algorithm`, `--limit`
    /// and `--window` on the request's key and each its own counter,
    /// decided together. The server takes at most its
    /// --max-limits-per-request.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub limits: u32,

    /// For `check-limit`: requests per call. 1 calls `CheckLimit`; N > 1
    /// calls `CheckLimits` with N requests, each drawing its own key. The
    /// server takes at most its --max-batch-size (default 1000).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,

    /// Which keys the requests name.
    #[arg(long, value_enum, default_value_t = KeyPattern::Uniform)]
    pub keys: KeyPattern,

    /// How many keys `uniform`, `zipf` and `sequence` draw from.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_count: u64,

    /// The exponent of `zipf` (1.0: the second key is drawn half as often as
    /// the first).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,

    /// Every caller key starts with this; change it between runs that must
    /// not share counters.
    #[arg(long, default_value = "bench:")]
    pub key_prefix: String,

    /// The Envoy domain, for `should-rate-limit` (its descriptor is
    /// `("key", <key>)`; `--print-envoy-config` writes the matching rules).
    #[arg(long, default_value = "bench")]
    pub domain: String,

    /// Deadline of each call.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// Tokio worker threads of this generator (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// Print ratelimitd rules (envoyproxy/ratelimit format) that give
    /// `--domain` the limit of `--algorithm`, `--limit` and `--window`, and
    /// exit.
    #[arg(long)]
    pub print_envoy_config: bool,

    /// Print the Lua script ratelimitd runs on a standalone Redis to decide
    /// many calls at once (its layout: `batch.lua`'s header), and exit.
    #[arg(long)]
    pub print_batch_script: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TargetKind {
    /// ratelimitd's `ratelimitd.v1.RateLimiter/CheckLimit`.
    CheckLimit,
    /// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
    ShouldRateLimit,
    /// ratelimitd's decision script, called on Redis by SHA: the baseline.
    RedisDirect,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum KeyPattern {
    /// One key for every request: a flood on one limit.
    Hot,
    /// `--key-count` keys, each as likely.
    Uniform,
    /// `--key-count` keys, the k-th drawn in proportion to 1/k^s.
    Zipf,
    /// `--key-count` keys in turn, each once before any twice: fills a
    /// store with that many live keys in as many requests.
    Sequence,
}

impl Options {
    /// Checks what clap cannot: values whose rules span several options.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(format!("--rate must be a positive number (got {rate})"));
        }
        if !(self.zipf_exponent.is_finite() && self.zipf_exponent > 0.0) {
            return Err(format!(
                "--zipf-exponent must be a positive number (got {})",
                self.zipf_exponent
            ));
        }
        if self.timeout.is_zero() {
            return Err("--timeout must be positive".into());
        }
        if self.requests.is_none() && self.duration.is_zero() {
            return Err("--duration must be positive (or give --requests)".into());
        }
        // Only ratelimitd's own API has several limits and batches: the
        // other targets would silently measure something else.
        for (flag, value) in [("--limits", self.limits), ("--batch", self.batch)] {
            if value == 1 {
                continue;
            }
            if self.print_envoy_config {
                return Err(format!(
                    "{flag} applies to --target check-limit; --print-envoy-config writes rules \
                     for one limit"
                ));
            }
            if self.target != TargetKind::CheckLimit {
                return Err(format!(
                    "{flag} applies to --target check-limit only (got --target {})",
                    self.target_name()
                ));
            }
        }
        Ok(())
    }

    /// The run's limit: `--limit` per `--window` (a token bucket holds
    /// `--limit` and refills it once per window; GCRA's burst is `--limit`).
    pub(crate) fn rate(&self) -> Rate {
        Rate::new(self.limit, self.window)
    }

    /// The target as given on the command line.
    pub(crate) fn target_name(&self) -> String {
        value_name(&self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(args: &[&str]) -> Result<(), String> {
        Options::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|err| err.to_string())?
            .validate()
    }

    #[test]
    fn limits_and_batches_are_for_check_limit_only() {
        assert_eq!(validate(&["--limits", "4", "--batch", "16"]), Ok(()));
        let err = validate(&["--batch", "16", "--target", "should-rate-limit"]).unwrap_err();
        assert_eq!(
            err,
            "--batch applies to --target check-limit only (got --target should-rate-limit)"
        );
        let err = validate(&["--limits", "2", "--target", "redis-direct"]).unwrap_err();
        assert!(
            err.starts_with("--limits applies to --target check-limit"),
            "{err}"
        );
        let err = validate(&["--limits", "2", "--print-envoy-config"]).unwrap_err();
        assert!(err.contains("--print-envoy-config"), "{err}");
        // One is the default, whatever the target.
        assert_eq!(
            validate(&["--batch", "1", "--target", "redis-direct"]),
            Ok(())
        );
        assert!(validate(&["--batch", "0"]).is_err());
    }
}
