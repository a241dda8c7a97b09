//! Envoy's external rate limit service, `envoy.service.ratelimit.v3`
//! `RateLimitService/ShouldRateLimit`, over the same limiter and algorithms
//! as `CheckLimit`: each request descriptor is matched to a configured rule
//! (envoyproxy/ratelimit's format and matching, [`crate::rules`]), and all
//! the descriptors of one request are decided together, so a request denied
//! by one descriptor spends nothing on the others.
//!
//! A descriptor may carry several limits (the `rate_limits` extension, see
//! [`crate::rules::descriptors_file`]): each is one more limit in that same
//! all-or-nothing decision, and the descriptor's one `DescriptorStatus`
//! reports the most restrictive of them (the one that denies, the latest
//! back when several do; else the one with the fewest units left, ties to
//! the latest back), `OVER_LIMIT` if any of them is over. The response
//! headers and upstream's per-rule statistics read each descriptor through
//! that same limit, so a descriptor's hits are counted once, as upstream
//! counts them.
//!
//! A call flows: [`settings`] bounds the request, `plan` matches it,
//! the limiter decides, `response` answers, [`upstream_stats`] counts.

pub(crate) mod headers;
mod live;
pub(crate) mod metadata;
pub(crate) mod options;
mod plan;
mod response;
pub(crate) mod settings;
pub(crate) mod upstream_stats;
pub(crate) mod xds;

use std::net::IpAddr;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::debug;

use self::plan::Plan;
pub(crate) use self::settings::{EnvoySettings, KeyLayout, LimitHeaderNames, RequestBounds};
use crate::error::Error;
use crate::incoming;
use crate::limiter::Limiter;
use crate::load_shed::DecisionSlots;
use crate::metrics::{self, Api};
use crate::pb::envoy::service::ratelimit::v3 as rls;
use crate::rules::RulesHandle;
use crate::stats;
use crate::store::{Clock, SystemClock};

/// The `RateLimitService` implementation.
#[derive(Clone)]
pub(crate) struct EnvoyService {
    limiter: Limiter,
    rules: RulesHandle,
    settings: EnvoySettings,
    slots: DecisionSlots,
    /// What "now" is for what the store does not say: when a blocked rule's
    /// window ends, and upstream's reset header.
    clock: Arc<dyn Clock>,
}

impl EnvoyService {
    /// The service, deciding on `limiter` by the rules `rules` holds now, each call holding one of `slots`.
    pub(crate) fn new(
        limiter: Limiter,
        rules: RulesHandle,
        settings: EnvoySettings,
        slots: DecisionSlots,
    ) -> Self {
        Self {
            limiter,
            rules,
            settings,
            slots,
            clock: Arc::new(SystemClock::default()),
        }
    }

    /// The same service telling time by `clock`.
    #[cfg(test)]
    pub(crate) fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// The tonic server for this service.
    pub(crate) fn into_server(
        self,
    ) -> rls::rate_limit_service_server::RateLimitServiceServer<Self> {
        rls::rate_limit_service_server::RateLimitServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let peer = incoming::peer_ip(request.extensions());
        let response = self.answer(peer, &request.into_inner()).await?;
        Ok(Response::new(response))
    }
}

impl EnvoyService {
    /// `ShouldRateLimit`, whatever carries it (gRPC, or `/json`): a
    /// decision slot for `peer`, then `request` bounded, matched to the
    /// rules and decided, and upstream's error statistics counted.
    pub(crate) async fn answer(
        &self,
        peer: Option<IpAddr>,
        request: &rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, Error> {
        let _in_flight = self.slots.enter(peer)?;
        let answered = self.decide(request).await;
        // upstream's errors: `redis_error` on the store, `service_error`
        // for the rest.
        match &answered {
            Ok(_) => {}
            Err(Error::Store(_)) => stats::should_rate_limit_error(true),
            Err(Error::InvalidArgument(_) | Error::NotFound(_) | Error::Overloaded(_)) => {
                stats::should_rate_limit_error(false);
            }
        }
        answered
    }

    async fn decide(
        &self,
        request: &rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, Error> {
        self.settings.bounds.check(request)?;
        let rules = self.rules.current();
        // One instant for the whole call: the window a counter named by its
        // window counts in, and the resets the response reports.
        let now = self.clock.now();
        let plan = Plan::new(&rules, request, &self.settings, now)?;
        let decisions = if plan.requests.is_empty() {
            Vec::new()
        } else if plan.count_denied_hits {
            let (requests, routes) = (&plan.requests, &plan.routes);
            self.limiter
                .check_each_routed(requests, routes, None)
                .await?
        } else {
            let (requests, routes) = (&plan.requests, &plan.routes);
            self.limiter
                .check_all_routed(requests, routes, None)
                .await?
        };
        for (request, decision) in plan.requests.iter().zip(&decisions) {
            metrics::decision(Api::Envoy, request.algorithm.kind(), decision);
        }
        live::record(&plan, &decisions);
        let answers = response::answers(&plan, &decisions, now);
        upstream_stats::record(&plan, &answers, &decisions);
        let response = response::response(&plan, request, answers, &decisions, &self.settings, now);
        debug!(
            domain = %request.domain,
            overall = ?response.overall_code(),
            "decided"
        );
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limiter::Store;
    use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use crate::rules;
    use crate::store::{ManualClock, MemoryStore};

    #[tokio::test]
    async fn windows_and_resets_follow_the_clock_the_service_is_given() {
        let clock = Arc::new(ManualClock::default());
        // 30 s into a minute.
        clock.advance(Duration::from_secs(90));
        let limiter = Limiter::new(Store::Memory(MemoryStore::new(clock.clone())), "t:");
        let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
        let rules = rules::compile(&[("limits.yaml".into(), text.to_owned())]).unwrap();
        let settings = EnvoySettings {
            limit_headers: Some(LimitHeaderNames::short()),
            ..EnvoySettings::default()
        };
        let service = EnvoyService::new(
            limiter,
            RulesHandle::new(rules),
            settings,
            DecisionSlots::new(4, 4),
        )
        .with_clock(clock.clone());
        let request = rls::RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let ask = || async {
            let response = service.decide(&request).await.unwrap();
            let reset = response.response_headers_to_add[2].value.clone();
            (response.overall_code(), reset)
        };
        assert_eq!(ask().await, (Code::Ok, "30".to_owned()));
        assert_eq!(ask().await, (Code::Ok, "30".to_owned()));
        assert_eq!(ask().await, (Code::OverLimit, "30".to_owned()));
        // The next minute is a new window, on the store and in the headers.
        clock.advance(Duration::from_secs(30));
        assert_eq!(ask().await, (Code::Ok, "60".to_owned()));
    }
}
