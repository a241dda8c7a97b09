//! What the web console's live view shows, kept in this process: decisions
//! per second over the last [`HISTORY_SECONDS`], allowed, denied and
//! degraded, per face, rule or policy, and algorithm (fed beside the
//! Prometheus counters, from the same decisions); the store's calls and
//! their latency per second; the quota service's subscribers and assigned
//! rates per policy; the lease holders of each leased policy with their
//! shares ([`leases`]); and the most denied keys, in a space-saving sketch
//! ([`sketch`]) of [`TOP_KEYS`] entries.
//!
//! Everything is bounded: series are labelled only by what the operator
//! configured (rules, policies, quota policies) or by fixed names (faces,
//! algorithms, stores), at most [`MAX_SERIES`] of them (the rest are
//! counted together as `(other)`); a caller's key only ever enters the
//! sketch or a lease holder's row (at most
//! [`leases::MAX_LEASE_HOLDERS`]), never a label.
//!
//! Off until [`install`] (the server does when its HTTP listener is on):
//! until then, recording is a check of a `OnceLock` and nothing else.

pub(crate) mod leases;
pub(crate) mod sketch;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use self::leases::Holders;
pub(crate) use self::leases::{HolderStats, LeaseHolder, LeasedPolicy};
use self::sketch::SpaceSaving;
use crate::algorithm::LimitRequest;
use crate::limit::{Decision, FailurePolicy};

/// Seconds of history kept.
pub(crate) const HISTORY_SECONDS: usize = 300;
/// Most series of decisions; past it, new ones count as `(other)`.
pub(crate) const MAX_SERIES: usize = 100;
/// Keys the denied-keys sketch keeps.
pub(crate) const TOP_KEYS: usize = 50;
/// Most quota policies shown.
const MAX_QUOTA_POLICIES: usize = 100;
/// What the series past [`MAX_SERIES`] are counted as.
pub(crate) const OTHER: &str = "(other)";

/// The recorder of this process, once installed.
static LIVE: OnceLock<Live> = OnceLock::new();

/// Turns the recorder on, telling it what the console shows of the
/// configuration: the failure policy in force and the stores' labels. A
/// second call changes nothing.
pub(crate) fn install(failure_policy: FailurePolicy, stores: Vec<&'static str>) {
    let _ = LIVE.set(Live::new(failure_policy, stores));
}

/// The recorder, when on.
pub(crate) fn get() -> Option<&'static Live> {
    LIVE.get()
}

/// The current second since the Unix epoch.
fn this_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Which face a decision came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Face {
    /// `CheckLimit` (over gRPC or `/v1/check`).
    CheckLimit,
    /// Envoy's `ShouldRateLimit` (over gRPC or `/json`).
    Envoy,
}

/// Where a decision's limit comes from, as far as the console labels it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin<'a> {
    /// Parameters the caller sent (`CheckLimit` with one limit or
    /// several, a limit Envoy sent with a descriptor).
    Request,
    /// A named policy of the policies file.
    Policy(&'a str),
    /// A configured Envoy rule: its domain and its id (its name, else its
    /// descriptor's path).
    Rule(&'a str, &'a str),
}

/// One decision, into the recorder when it is on.
pub(crate) fn decision(api: Face, origin: Origin<'_>, request: &LimitRequest, decision: &Decision) {
    if let Some(live) = get() {
        live.record(this_second(), api, origin, request, decision);
    }
}

/// One call to the store labelled `store`: how long it took, whether it
/// failed.
pub(crate) fn store_call(store: &'static str, took: Duration, failed: bool) {
    if let Some(live) = get() {
        live.store_call(this_second(), store, took, failed);
    }
}

/// A quota policy's subscribers on this instance, up or down.
pub(crate) fn quota_subscribers(domain: &str, policy: &str, delta: f64) {
    if let Some(live) = get() {
        live.quota(domain, policy, |quota| quota.subscribers += delta);
    }
}

/// The rate this instance assigned under a quota policy, up or down.
pub(crate) fn quota_assigned_rate(domain: &str, policy: &str, delta: f64) {
    if let Some(live) = get() {
        live.quota(domain, policy, |quota| quota.assigned_rate += delta);
    }
}

/// A lease stream's (`holder`) lease on `policy` and `key` after an ask
/// that kept it: what the console shows of it.
pub(crate) fn lease_holder(policy: &str, holder: &str, key: &str, stats: HolderStats) {
    if let Some(live) = get() {
        live.state().leases.update(policy, holder, key, stats);
    }
}

/// A lease stream's lease on `policy` and `key` is gone.
pub(crate) fn lease_gone(policy: &str, holder: &str, key: &str) {
    if let Some(live) = get() {
        live.state().leases.remove(policy, holder, key);
    }
}

/// What a series of decisions is labelled by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct SeriesKey {
    api: &'static str,
    /// `rule`, `policy` or `request`.
    origin: &'static str,
    /// The rule's `<domain>.<id>`, the policy's name; empty for a request's.
    name: String,
    algorithm: &'static str,
}

/// One second's counts.
#[derive(Debug, Default, Clone)]
struct Second {
    at: u64,
    /// By series number: allowed, denied, degraded.
    decisions: HashMap<usize, [u64; 3]>,
    /// By store label.
    store: BTreeMap<&'static str, StoreSecond>,
}

#[derive(Debug, Default, Clone, Copy)]
struct StoreSecond {
    calls: u64,
    failed: u64,
    total: Duration,
    slowest: Duration,
}

/// A quota policy's share on this instance.
#[derive(Debug, Default, Clone, Copy)]
struct Quota {
    subscribers: f64,
    assigned_rate: f64,
}

struct State {
    seconds: VecDeque<Second>,
    series: Vec<SeriesKey>,
    numbers: HashMap<SeriesKey, usize>,
    denied_keys: SpaceSaving,
    quota: BTreeMap<(String, String), Quota>,
    leases: Holders,
}

/// The recorder.
pub(crate) struct Live {
    failure_policy: FailurePolicy,
    stores: Vec<&'static str>,
    state: Mutex<State>,
}

impl Live {
    /// An empty recorder.
    pub(crate) fn new(failure_policy: FailurePolicy, stores: Vec<&'static str>) -> Self {
        Self {
            failure_policy,
            stores,
            state: Mutex::new(State {
                seconds: VecDeque::with_capacity(HISTORY_SECONDS + 1),
                series: Vec::new(),
                numbers: HashMap::new(),
                denied_keys: SpaceSaving::new(TOP_KEYS),
                quota: BTreeMap::new(),
                leases: Holders::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while recording leaves counts, never broken invariants.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one decision made in second `now`.
    pub(crate) fn record(
        &self,
        now: u64,
        api: Face,
        origin: Origin<'_>,
        request: &LimitRequest,
        decision: &Decision,
    ) {
        let api = match api {
            Face::CheckLimit => "check_limit",
            Face::Envoy => "envoy",
        };
        let (origin, name) = match origin {
            Origin::Request => ("request", String::new()),
            Origin::Policy(policy) => ("policy", policy.to_owned()),
            Origin::Rule(domain, id) => ("rule", format!("{domain}.{id}")),
        };
        let key = SeriesKey {
            api,
            origin,
            name,
            algorithm: request.algorithm.name(),
        };
        let outcome = if decision.is_degraded() {
            2
        } else if decision.is_allowed() {
            0
        } else {
            1
        };
        let mut state = self.state();
        let series = state.series_number(key);
        state.second(now).decisions.entry(series).or_default()[outcome] += 1;
        if !decision.is_allowed() {
            state.denied_keys.offer(request.key.as_str());
        }
    }

    /// Records one store call made in second `now`.
    pub(crate) fn store_call(&self, now: u64, store: &'static str, took: Duration, failed: bool) {
        let mut state = self.state();
        let second = state.second(now).store.entry(store).or_default();
        second.calls += 1;
        second.failed += u64::from(failed);
        second.total += took;
        second.slowest = second.slowest.max(took);
    }

    fn quota(&self, domain: &str, policy: &str, change: impl FnOnce(&mut Quota)) {
        let mut state = self.state();
        let key = (domain.to_owned(), policy.to_owned());
        if !state.quota.contains_key(&key) && state.quota.len() >= MAX_QUOTA_POLICIES {
            return;
        }
        change(state.quota.entry(key).or_default());
    }

    /// What the console shows, as of second `now`: the seconds from
    /// `now - HISTORY_SECONDS + 1` to `now`, oldest first, with `store_serving`
    /// (health's word on the store).
    pub(crate) fn view(&self, now: u64, store_serving: bool) -> LiveView {
        let state = self.state();
        let first = now.saturating_sub(HISTORY_SECONDS as u64 - 1);
        let times: Vec<u64> = (first..=now).collect();
        let (series, latency) = self.per_second(&state, first, now);
        LiveView {
            now,
            times,
            series,
            store: StoreView {
                serving: store_serving,
                stores: self.stores.iter().map(|s| (*s).to_owned()).collect(),
                latency,
            },
            failure_policy: match self.failure_policy {
                FailurePolicy::FailClosed => "FAIL_CLOSED",
                FailurePolicy::FailOpen => "FAIL_OPEN",
                FailurePolicy::Local => "LOCAL",
            }
            .to_owned(),
            quota: state
                .quota
                .iter()
                .map(|((domain, policy), quota)| QuotaShare {
                    domain: domain.clone(),
                    policy: policy.clone(),
                    subscribers: quota.subscribers.max(0.0).round() as u64,
                    assigned_requests_per_second: quota.assigned_rate.max(0.0),
                })
                .collect(),
            leases: state.leases.view(),
            top_denied_keys: state
                .denied_keys
                .top()
                .into_iter()
                .map(|hitter| DeniedKey {
                    key: hitter.key,
                    denied: hitter.count,
                    overestimate: hitter.overestimate,
                })
                .collect(),
        }
    }

    /// The decision series and the stores' calls, one value per second
    /// from `first` to `now`; series in order of their labels.
    fn per_second(
        &self,
        state: &State,
        first: u64,
        now: u64,
    ) -> (Vec<LiveSeries>, Vec<StoreLatency>) {
        let seconds = (now - first + 1) as usize;
        let mut series: Vec<LiveSeries> = state
            .series
            .iter()
            .map(|key| LiveSeries {
                api: key.api.to_owned(),
                origin: key.origin.to_owned(),
                name: key.name.clone(),
                algorithm: key.algorithm.to_owned(),
                allowed: vec![0; seconds],
                denied: vec![0; seconds],
                degraded: vec![0; seconds],
            })
            .collect();
        let mut latency: BTreeMap<&'static str, StoreLatency> = self
            .stores
            .iter()
            .map(|&store| (store, StoreLatency::new(store, seconds)))
            .collect();
        for second in state
            .seconds
            .iter()
            .filter(|second| (first..=now).contains(&second.at))
        {
            let i = (second.at - first) as usize;
            for (&number, counts) in &second.decisions {
                if let Some(series) = series.get_mut(number) {
                    series.allowed[i] = counts[0];
                    series.denied[i] = counts[1];
                    series.degraded[i] = counts[2];
                }
            }
            for (&store, calls) in &second.store {
                let line = latency
                    .entry(store)
                    .or_insert_with(|| StoreLatency::new(store, seconds));
                line.calls[i] = calls.calls;
                line.failed[i] = calls.failed;
                line.mean_seconds[i] = calls.total.as_secs_f64() / calls.calls.max(1) as f64;
                line.max_seconds[i] = calls.slowest.as_secs_f64();
            }
        }
        series.sort_by(|a, b| {
            (&a.api, &a.origin, &a.name, &a.algorithm).cmp(&(
                &b.api,
                &b.origin,
                &b.name,
                &b.algorithm,
            ))
        });
        (series, latency.into_values().collect())
    }
}

impl State {
    /// The number of `key`'s series, made if new (and there is room).
    fn series_number(&mut self, key: SeriesKey) -> usize {
        if let Some(&number) = self.numbers.get(&key) {
            return number;
        }
        let key = if self.series.len() < MAX_SERIES - 1 {
            key
        } else {
            // One place is kept for the rest, whatever they are.
            SeriesKey {
                api: OTHER,
                origin: OTHER,
                name: OTHER.to_owned(),
                algorithm: OTHER,
            }
        };
        if let Some(&number) = self.numbers.get(&key) {
            return number;
        }
        let number = self.series.len();
        self.series.push(key.clone());
        self.numbers.insert(key, number);
        number
    }

    /// Second `now`'s counts, begun if new; seconds past the history go.
    fn second(&mut self, now: u64) -> &mut Second {
        let newest = self.seconds.back().map(|second| second.at);
        match newest {
            Some(at) if at >= now => {}
            _ => {
                self.seconds.push_back(Second {
                    at: now,
                    ..Second::default()
                });
                while self
                    .seconds
                    .front()
                    .is_some_and(|second| second.at + HISTORY_SECONDS as u64 <= now)
                {
                    self.seconds.pop_front();
                }
            }
        }
        // A clock stepped back counts into the newest second kept.
        match self.seconds.iter().rposition(|second| second.at == now) {
            Some(place) => &mut self.seconds[place],
            None => self.seconds.back_mut().expect("a second was just pushed"),
        }
    }
}

/// `GET /v1/console/live`'s answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LiveView {
    /// The newest second, since the Unix epoch (still counting).
    pub now: u64,
    /// Each second shown, since the Unix epoch, oldest first: the last
    /// `HISTORY_SECONDS`, up to `now`. Every series below has one value per
    /// second.
    pub times: Vec<u64>,
    /// Decisions per second, per face, origin and algorithm.
    pub series: Vec<LiveSeries>,
    /// The store.
    pub store: StoreView,
    /// The failure policy in force when a request names none:
    /// `FAIL_CLOSED`, `FAIL_OPEN` or `LOCAL`.
    pub failure_policy: String,
    /// The quota service's policies on this instance.
    pub quota: Vec<QuotaShare>,
    /// The policies leased on this instance, in order of their names, with
    /// their holders: at most 200 holders in all.
    pub leases: Vec<LeasedPolicy>,
    /// The most denied keys since start, most first: at most 50, from a
    /// space-saving sketch (a count may be over by up to its `overestimate`).
    pub top_denied_keys: Vec<DeniedKey>,
}

/// Decisions per second of one face, origin and algorithm.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LiveSeries {
    /// `check_limit` or `envoy` (`(other)` for the series past the bound).
    pub api: String,
    /// `rule` (a configured Envoy rule), `policy` (a named policy) or
    /// `request` (parameters sent with the request).
    pub origin: String,
    /// The rule (`<domain>.<name or descriptor path>`) or the policy; empty
    /// for `request`.
    pub name: String,
    /// The algorithm.
    pub algorithm: String,
    /// Allowed, per second.
    pub allowed: Vec<u64>,
    /// Denied, per second.
    pub denied: Vec<u64>,
    /// Answered by the failure policy without the store, per second.
    pub degraded: Vec<u64>,
}

/// The store's health and latency.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoreView {
    /// Health's word: the store answers (or the failure policy answers
    /// without it).
    pub serving: bool,
    /// The stores: `embedded`, or the Redis ones (`main`, `per_second`).
    pub stores: Vec<String>,
    /// Calls and latency per second, per store (none for `embedded`, which
    /// is called in process).
    pub latency: Vec<StoreLatency>,
}

/// One store's calls per second.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoreLatency {
    /// The store.
    pub store: String,
    /// Calls, per second.
    pub calls: Vec<u64>,
    /// Failed calls, per second.
    pub failed: Vec<u64>,
    /// Mean latency in seconds, per second (0 without calls).
    pub mean_seconds: Vec<f64>,
    /// Longest call in seconds, per second.
    pub max_seconds: Vec<f64>,
}

impl StoreLatency {
    fn new(store: &str, seconds: usize) -> Self {
        Self {
            store: store.to_owned(),
            calls: vec![0; seconds],
            failed: vec![0; seconds],
            mean_seconds: vec![0.0; seconds],
            max_seconds: vec![0.0; seconds],
        }
    }
}

/// A quota policy's share on this instance.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QuotaShare {
    /// The domain.
    pub domain: String,
    /// The quota policy.
    pub policy: String,
    /// Envoy streams subscribed to it here.
    pub subscribers: u64,
    /// The rate assigned to them, requests per second.
    pub assigned_requests_per_second: f64,
}

/// A denied key.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeniedKey {
    /// The key as counted (a named limit's `<name>:<key>`, a policy's
    /// `<policy>/<limit>:<key>`, an Envoy descriptor's composed key).
    pub key: String,
    /// Denials counted.
    pub denied: u64,
    /// How much of `denied` may belong to keys it displaced.
    pub overestimate: u64,
}

#[cfg(test)]
mod tests;
