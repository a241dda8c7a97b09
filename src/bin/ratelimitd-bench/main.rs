//! `ratelimitd-bench`: the load generator. Drives ratelimitd's `CheckLimit`
//! (one limit or several per request) or `CheckLimits` (batches), any Envoy
//! RLS server's `ShouldRateLimit`, or Redis running ratelimitd's decision
//! script directly (the baseline), with one load, and reports decisions
//! per second, outcomes and an HDR histogram of latency.

mod keys;
mod options;
mod report;
mod run;
mod target;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::keys::Keys;
use crate::options::{Options, TargetKind};
use crate::report::{Progress, Summary};
use crate::run::{Measure, Plan};
use crate::target::Target;

fn main() -> ExitCode {
    let options = Options::parse();
    if let Err(err) = options.validate() {
        eprintln!("ratelimitd-bench: {err}");
        return ExitCode::from(2);
    }
    if options.print_batch_script {
        print!("{}", ratelimitd::limiter::script::decide_batch_source());
        return ExitCode::SUCCESS;
    }
    if options.print_envoy_config {
        return match target::envoy_config(&options) {
            Ok(config) => {
                print!("{config}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("ratelimitd-bench: {err}");
                ExitCode::from(2)
            }
        };
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = options.threads {
        runtime.worker_threads(threads.max(1));
    }
    let runtime = match runtime.build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("ratelimitd-bench: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(&options)) {
        Ok(summary) => {
            if options.json {
                println!("{}", summary.json());
            } else {
                println!("{}", summary.text());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("ratelimitd-bench: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(options: &Options) -> Result<Summary, String> {
    let algorithm = target::algorithm(options)?;
    let keys = Keys::new(options)?;
    let keys_described = keys.describe(options);
    let target = Target::connect(options).await?;
    let plan = Plan {
        concurrency: options.concurrency,
        batch: options.batch as usize,
        warm_up: options.warm_up,
        measure: match options.requests {
            Some(count) => Measure::Requests(count),
            None => Measure::For(options.duration),
        },
        rate: options.rate,
    };
    let progress = Arc::new(Progress::default());
    let shown = std::io::stderr().is_terminal().then(|| {
        let progress = Arc::clone(&progress);
        tokio::spawn(async move { progress.show().await })
    });
    let (tally, measured) = run::run(target, keys, &plan, progress).await;
    if let Some(shown) = shown {
        shown.abort();
        report::clear_progress();
    }
    let target = match options.target {
        TargetKind::CheckLimit if options.batch > 1 => format!(
            "check-limit at {}, batches of {} requests (CheckLimits)",
            options.address, options.batch
        ),
        TargetKind::CheckLimit => format!("check-limit at {}", options.address),
        TargetKind::ShouldRateLimit => format!(
            "should-rate-limit at {} (domain {})",
            options.address, options.domain
        ),
        TargetKind::RedisDirect => format!("redis-direct at {}", options.redis_url),
    };
    // With batches, what is in flight is calls, each of --batch requests.
    let calls = if options.batch > 1 { " calls" } else { "" };
    let load = match options.rate {
        Some(rate) => format!(
            "open loop at {rate} calls/s, at most {}{calls} in flight",
            options.concurrency
        ),
        None => format!("closed loop, {}{calls} in flight", options.concurrency),
    };
    Ok(Summary {
        setup: vec![
            ("target", target),
            (
                "limit",
                format!(
                    "{}{} {} per {}, cost {}",
                    several_limits(options),
                    algorithm.name(),
                    options.limit,
                    humantime::format_duration(options.window),
                    options.cost
                ),
            ),
            ("keys", keys_described),
            ("load", load),
            ("connections", options.connections.to_string()),
        ],
        warm_up: options.warm_up,
        measured,
        tally,
    })
}

/// How the report names `--limits` copies of the limit: "4 limits (l0..l3)
/// of ", or nothing for the one-limit form.
fn several_limits(options: &Options) -> String {
    if options.limits <= 1 {
        return String::new();
    }
    format!(
        "{} limits ({}..{}), all or nothing, each ",
        options.limits,
        target::limit_name(0),
        target::limit_name(options.limits - 1)
    )
}
