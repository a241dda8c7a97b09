//! What-if runs of the algorithms (`POST /v1/simulate`): limits and a
//! traffic pattern, decided by [`algorithm::decide_in_memory`] (the
//! embedded store's code, the twin of the Lua scripts) on a simulated
//! clock that starts at zero, with the embedded store's expiry; no sleeping,
//! no system time, nothing stored. The answer, per step of the simulated
//! time: requests sent, admitted and denied, and what remains at the step's
//! end, for each limit.
//!
//! Everything is bounded (at most 10 limits, 10 000 steps, 100 000
//! requests and an hour), so one run costs at most a few hundred thousand
//! decisions, and each bound broken is refused naming its field.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::{self, Spend, registry};
use crate::limit::{self, InvalidArgument, Micros};
use crate::pb::ratelimitd::v1 as pb;
use crate::pb::ratelimitd::v1::check_limit_request::Algorithm as PbAlgorithm;
use crate::pb::ratelimitd::v1::simulated_traffic::Shape as PbShape;
use crate::pb::{algorithm::from_proto, convert};
use crate::store::MemoryChange;

/// Most limits in one run.
pub(crate) const MAX_LIMITS: usize = 10;
/// Most steps in one answer (the traffic's duration over the step).
pub(crate) const MAX_STEPS: u64 = 10_000;
/// Most requests the traffic may send in one run.
pub(crate) const MAX_REQUESTS: u64 = 100_000;
/// Longest traffic.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3600);
/// The step when the request gives none.
pub(crate) const DEFAULT_STEP: Duration = Duration::from_millis(100);

/// A request arrives once the traffic's count reaches its number less
/// this: the counts are floating point, and an arrival due at an exact
/// microsecond must not slip to the next one by a rounding error.
const ARRIVAL_SLACK: f64 = 1e-6;

/// When requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Shape {
    /// `rate` per second, evenly spaced, the first at zero.
    Steady,
    /// `rate` × `period` at once at the start of every period.
    Bursts {
        /// Between bursts.
        period: Micros,
    },
    /// From 0 per second at zero up to `rate` at the end, linearly.
    Ramp,
    /// In each period, from 0 per second up to `rate`, then back to 0.
    Sawtooth {
        /// One tooth.
        period: Micros,
    },
}

/// A traffic pattern, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Traffic {
    /// Its shape.
    pub shape: Shape,
    /// Requests per second (at the top, for a ramp and a sawtooth).
    pub rate: f64,
    /// How long it lasts.
    pub duration: Micros,
}

impl Traffic {
    /// Requests sent from zero up to and including `at`, as a real number
    /// (request `n`, counting from 1, arrives when this reaches `n`).
    fn sent_by(&self, at: Micros) -> f64 {
        let seconds = |micros: Micros| micros.as_micros() as f64 / 1e6;
        match self.shape {
            // The first at zero.
            Shape::Steady => self.rate * seconds(at) + 1.0,
            Shape::Bursts { period } => {
                let bursts = (at / period + 1) as f64;
                (self.rate * seconds(period) * bursts).floor()
            }
            Shape::Ramp => {
                let t = seconds(at);
                self.rate * t * t / (2.0 * seconds(self.duration))
            }
            Shape::Sawtooth { period } => {
                let teeth = at / period;
                let into = seconds(at - period * teeth);
                let p = seconds(period);
                teeth as f64 * self.rate * p / 2.0 + self.rate * into * into / (2.0 * p)
            }
        }
    }

    /// How many requests it sends in all (those arriving before its end).
    pub(crate) fn requests(&self) -> u64 {
        let last = self.duration.saturating_sub(Micros::from_micros(1));
        let sent = (self.sent_by(last) + ARRIVAL_SLACK).floor();
        if sent.is_finite() && sent >= 0.0 {
            // Saturates for the absurd; the bound refuses those anyway.
            sent as u64
        } else {
            u64::MAX
        }
    }

    /// When each request arrives, in order: request `n` at the first
    /// microsecond by which `Traffic::sent_by` reaches `n`.
    pub(crate) fn arrivals(&self) -> Vec<Micros> {
        let count = self.requests();
        let end = self.duration.as_micros();
        let mut arrivals = Vec::with_capacity(count.min(MAX_REQUESTS) as usize);
        let mut from = 0u64;
        for n in 1..=count {
            let due = n as f64 - ARRIVAL_SLACK;
            // The first microsecond in [from, end) by which `due` is sent;
            // one exists, since `count` arrive before the end.
            let (mut low, mut high) = (from, end - 1);
            while low < high {
                let middle = low + (high - low) / 2;
                if self.sent_by(Micros::from_micros(middle)) >= due {
                    high = middle;
                } else {
                    low = middle + 1;
                }
            }
            arrivals.push(Micros::from_micros(low));
            from = low;
        }
        arrivals
    }
}

/// One limit of a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SimulatedLimit {
    /// Its name, if it has one.
    pub name: String,
    /// The algorithm and its parameters.
    pub algorithm: Algorithm,
    /// Units each request spends on it.
    pub cost: u64,
}

/// A run, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// The limits, each on its own counter.
    pub(crate) limits: Vec<SimulatedLimit>,
    /// What is sent.
    pub(crate) traffic: Traffic,
    /// The length of one step of the answer.
    pub step: Micros,
}

/// A duration that must be whole milliseconds from 1 ms to `max`; the
/// error names `field`.
fn millis(
    field: &str,
    value: Option<prost_types::Duration>,
    max: Duration,
) -> Result<Micros, InvalidArgument> {
    let duration = convert::required_duration(field, value)?;
    if duration.is_zero() {
        return Err(InvalidArgument::new(field, "must be positive"));
    }
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(InvalidArgument::new(
            field,
            "must be a whole number of milliseconds",
        ));
    }
    if duration > max {
        return Err(InvalidArgument::new(
            field,
            format!("must be at most {}", humantime::format_duration(max)),
        ));
    }
    Ok(Micros::from_duration(duration))
}

/// Validates a request into a run; the error names the field and the rule.
pub fn simulation(request: pb::SimulateRequest) -> Result<Simulation, InvalidArgument> {
    let (traffic, traffic_cost) = traffic(request.traffic)?;
    let step = match request.step {
        None => Micros::from_duration(DEFAULT_STEP),
        Some(step) => millis("step", Some(step), MAX_DURATION)?,
    };
    let steps = traffic.duration.as_micros().div_ceil(step.as_micros());
    if steps > MAX_STEPS {
        return Err(InvalidArgument::new(
            "step",
            format!(
                "makes {steps} steps of the duration: at most {MAX_STEPS} (take a longer step)"
            ),
        ));
    }
    if request.limits.is_empty() {
        return Err(InvalidArgument::new(
            "limits",
            format!("must hold 1 to {MAX_LIMITS} limits"),
        ));
    }
    if request.limits.len() > MAX_LIMITS {
        return Err(InvalidArgument::new(
            "limits",
            format!(
                "must hold at most {MAX_LIMITS} limits (got {})",
                request.limits.len()
            ),
        ));
    }
    let limits = request
        .limits
        .into_iter()
        .enumerate()
        .map(|(i, limit)| {
            simulated_limit(limit, traffic_cost).map_err(|err| err.within(&format!("limits[{i}]")))
        })
        .collect::<Result<_, _>>()?;
    Ok(Simulation {
        limits,
        traffic,
        step,
    })
}

/// The traffic of a request, and what each of its requests costs.
fn traffic(traffic: Option<pb::SimulatedTraffic>) -> Result<(Traffic, u64), InvalidArgument> {
    let traffic = traffic.ok_or_else(|| InvalidArgument::new("traffic", "is required"))?;
    let within = |err: InvalidArgument| err.within("traffic");
    let duration = millis("duration", traffic.duration, MAX_DURATION).map_err(within)?;
    let period = || {
        millis("period", traffic.period, duration.as_duration())
            .map_err(within)
            .map_err(|err| match traffic.period {
                Some(_) => err,
                None => InvalidArgument::new(err.field, "is required for BURSTS and SAWTOOTH"),
            })
    };
    let shape = match PbShape::try_from(traffic.shape) {
        Ok(PbShape::Steady) => Shape::Steady,
        Ok(PbShape::Ramp) => Shape::Ramp,
        Ok(PbShape::Bursts) => Shape::Bursts { period: period()? },
        Ok(PbShape::Sawtooth) => Shape::Sawtooth { period: period()? },
        Ok(PbShape::Unspecified) | Err(_) => {
            return Err(InvalidArgument::new(
                "traffic.shape",
                "must be STEADY, BURSTS, RAMP or SAWTOOTH",
            ));
        }
    };
    if traffic.period.is_some() && matches!(shape, Shape::Steady | Shape::Ramp) {
        return Err(InvalidArgument::new(
            "traffic.period",
            "applies to BURSTS and SAWTOOTH only",
        ));
    }
    let rate = traffic.rate;
    if !rate.is_finite() || rate <= 0.0 {
        return Err(InvalidArgument::new(
            "traffic.rate",
            format!("must be a finite positive number of requests per second (got {rate})"),
        ));
    }
    let traffic_cost = limit::cost(traffic.cost).map_err(within)?;
    let traffic = Traffic {
        shape,
        rate,
        duration,
    };
    let requests = traffic.requests();
    if requests > MAX_REQUESTS {
        return Err(InvalidArgument::new(
            "traffic.rate",
            format!(
                "sends {} requests over the duration: at most {MAX_REQUESTS} a run (lower the \
                 rate or the duration)",
                if requests == u64::MAX {
                    "too many".to_owned()
                } else {
                    requests.to_string()
                }
            ),
        ));
    }
    Ok((traffic, traffic_cost))
}

fn simulated_limit(limit: pb::Limit, traffic_cost: u64) -> Result<SimulatedLimit, InvalidArgument> {
    if !limit.name.is_empty() {
        limit::check_name("name", &limit.name)?;
    }
    if !limit.key.is_empty() {
        return Err(InvalidArgument::new(
            "key",
            "must be empty: each limit of a run counts on a simulated counter of its own",
        ));
    }
    let algorithm = limit.algorithm.map(PbAlgorithm::from).ok_or_else(|| {
        InvalidArgument::new(
            "algorithm",
            format!("is required: set one of {}", registry::Kind::names(", ")),
        )
    })?;
    let algorithm = from_proto(algorithm)?;
    let cost = match limit.cost {
        Some(cost) => limit::cost(Some(cost))?,
        None => traffic_cost,
    };
    Ok(SimulatedLimit {
        name: limit.name,
        algorithm,
        cost,
    })
}

/// One counter on the simulated clock, kept as the embedded store keeps a
/// key: its state, dropped once the time the algorithm wrote has come.
struct Counter<'a> {
    algorithm: &'a Algorithm,
    state: Option<algorithm::State>,
    expires_at: Micros,
}

impl Counter<'_> {
    fn decide(&mut self, now: Micros, cost: u64, spend: Spend) -> limit::Decision {
        if self.expires_at <= now {
            self.state = None;
            // A key the store does not hold starts out expiring now.
            self.expires_at = now;
        }
        let (decision, change) =
            algorithm::decide_in_memory(self.algorithm, &mut self.state, now, cost, spend);
        if let MemoryChange::Written { expires_at } = change {
            self.expires_at = expires_at;
        }
        decision
    }
}

/// A step's count: bounded by [`MAX_REQUESTS`], so it fits.
fn count(requests: u64) -> u32 {
    u32::try_from(requests).unwrap_or(u32::MAX)
}

impl Simulation {
    /// The number of steps of the answer.
    pub fn steps(&self) -> usize {
        self.traffic
            .duration
            .as_micros()
            .div_ceil(self.step.as_micros()) as usize
    }

    /// Runs every limit under the traffic: the answer.
    pub fn run(&self) -> pb::SimulateResponse {
        let steps = self.steps();
        let arrivals = self.traffic.arrivals();
        let step_of = |at: Micros| ((at / self.step) as usize).min(steps - 1);
        let mut sent = vec![0u64; steps];
        for &at in &arrivals {
            sent[step_of(at)] += 1;
        }
        let ends: Vec<Micros> = (1..=steps as u64)
            .map(|k| (self.step * k).min(self.traffic.duration))
            .collect();
        let limits = self
            .limits
            .iter()
            .map(|limit| self.run_one(limit, &arrivals, &ends))
            .collect();
        pb::SimulateResponse {
            step: prost_types::Duration::try_from(self.step.as_duration()).ok(),
            sent: sent.into_iter().map(count).collect(),
            limits,
        }
    }

    fn run_one(
        &self,
        limit: &SimulatedLimit,
        arrivals: &[Micros],
        ends: &[Micros],
    ) -> pb::SimulatedLimit {
        let mut counter = Counter {
            algorithm: &limit.algorithm,
            state: None,
            expires_at: Micros::ZERO,
        };
        let steps = ends.len();
        let (mut admitted, mut denied) = (vec![0u64; steps], vec![0u64; steps]);
        let mut remaining = Vec::with_capacity(steps);
        let mut next = arrivals.iter().peekable();
        for (k, &end) in ends.iter().enumerate() {
            while let Some(&&at) = next.peek() {
                if at >= end && k + 1 < steps {
                    break;
                }
                next.next();
                // Alone, as `CheckLimit` decides one limit: spent if allowed.
                if counter
                    .decide(at, limit.cost, Spend::IfAllowed)
                    .is_allowed()
                {
                    admitted[k] += 1;
                } else {
                    denied[k] += 1;
                }
            }
            // What a look at the step's end would be told.
            remaining.push(counter.decide(end, 0, Spend::Dry).remaining());
        }
        pb::SimulatedLimit {
            name: limit.name.clone(),
            algorithm: limit.algorithm.name().to_owned(),
            limit: limit.algorithm.limit(),
            admitted_total: count(admitted.iter().sum()),
            denied_total: count(denied.iter().sum()),
            admitted: admitted.into_iter().map(count).collect(),
            denied: denied.into_iter().map(count).collect(),
            remaining,
        }
    }
}

#[cfg(test)]
mod tests;
