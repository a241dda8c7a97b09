//! Each decision of a `ShouldRateLimit` into the console's live view
//! ([`crate::live`]), labelled by the configured rule that asked for it
//! (bounded by the configuration) or as a limit the request sent.

use super::plan::{Governed, Plan};
use crate::limit::Decision;
use crate::live::{self, Face, Origin};

/// Records `decisions`, one per `plan.requests`.
pub(super) fn record(plan: &Plan, decisions: &[Decision]) {
    if live::get().is_none() {
        return;
    }
    for part in &plan.parts {
        let Governed::Counted { rule, index, .. } = part else {
            continue;
        };
        let (Some(request), Some(decision)) = (plan.requests.get(*index), decisions.get(*index))
        else {
            continue;
        };
        // A limit Envoy sent has no place in the configuration: its
        // descriptor's path is empty.
        let origin = if rule.descriptor().stats_key.is_empty() {
            Origin::Request
        } else {
            Origin::Rule(&plan.domain, rule.policy_id())
        };
        live::decision(Face::Envoy, origin, request, decision);
    }
}
