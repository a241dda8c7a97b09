//! Every list of the algorithms made from the algorithm registry, checked
//! to hold each registered algorithm: the scripts' branches and sources,
//! the metrics' slots, the protobuf messages (in proto/ and in the
//! conversion), and the admin API's view. A test module of the crate
//! rather than of `algorithm`, which knows nothing of the lists' owners.

use std::collections::HashSet;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::registry::{ENTRIES, Kind, Rate, WindowStart};
use crate::algorithm::{Spend, decide_in_memory, key_tag};
use crate::http::admin::lists::algorithm_entry;
use crate::limit::Micros;
use crate::limiter::script::lua::{
    ALGORITHMS_LUA, ALGORITHMS_WITH_REFUNDS_LUA, DECIDE_LUA, REFUND_PART_LUA, defines,
};
use crate::pb::algorithm::{StatedWindow, from_proto, to_proto};

/// Each registered algorithm, built from one rate.
fn each_algorithm() -> impl Iterator<Item = (Kind, Algorithm)> {
    let rate = Rate::new(10, Duration::from_secs(2));
    Kind::ALL.into_iter().map(move |kind| {
        let built = kind.build(rate, WindowStart::FirstRequest);
        (kind, built.expect("valid parameters"))
    })
}

#[test]
fn the_registry_lists_each_algorithm_once_in_kinds_order() {
    assert_eq!(ENTRIES.len(), Kind::COUNT);
    for (i, kind) in Kind::ALL.into_iter().enumerate() {
        assert_eq!(kind.index(), i, "{kind:?}'s metrics slot");
        assert_eq!(kind.entry().kind, kind);
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
        let same_tag = ENTRIES.iter().filter(|e| e.tag == kind.tag()).count();
        assert_eq!(same_tag, 1, "tag {} is shared", kind.tag());
    }
}

#[test]
fn every_script_has_a_branch_and_a_function_for_each_algorithm() {
    for kind in Kind::ALL {
        let (name, tag) = (kind.name(), kind.tag());
        let decides = format!("algorithm == '{tag}' then\n    return {name}(key, now, limit,");
        assert!(DECIDE_LUA.contains(&decides), "decide.lua has no {name}");
        let refunds =
            format!("algorithm == '{tag}' then\n    refunded = refunded + {name}_refund(");
        assert!(
            REFUND_PART_LUA.contains(&refunds),
            "refund.lua has no {name}"
        );
        assert!(defines(ALGORITHMS_LUA, name, "("), "{name}'s function");
        assert!(defines(ALGORITHMS_WITH_REFUNDS_LUA, name, "_refund("));
        // The decision script does no work for refunds.
        assert!(!defines(ALGORITHMS_LUA, name, "_refund("), "{name}_refund");
    }
}

#[test]
fn each_algorithm_decides_in_memory_and_is_shown_by_name() {
    for (kind, algorithm) in each_algorithm() {
        assert_eq!(algorithm.kind(), kind);
        let mut state = None;
        let (decision, _) =
            decide_in_memory(&algorithm, &mut state, Micros::ZERO, 1, Spend::IfAllowed);
        assert!(decision.is_allowed(), "{}", kind.name());
        assert!(state.is_some(), "{} kept no state", kind.name());
        let shown = serde_json::to_value(algorithm_entry(&algorithm)).expect("JSON");
        assert_eq!(shown["name"], kind.name());
        let parameters = ["window", "refillPerSecond", "interval"];
        assert!(
            parameters.iter().any(|field| !shown[field].is_null()),
            "the admin API shows no parameter of {}: {shown}",
            kind.name()
        );
    }
}

#[test]
fn each_algorithm_has_a_protobuf_message_and_a_stated_window() {
    let rate = Rate::new(10, Duration::from_secs(2));
    for (kind, algorithm) in each_algorithm() {
        let stated = to_proto(kind, rate);
        assert_eq!(from_proto(stated), Ok(algorithm));
        assert_eq!(stated.window_seconds(), Some(2), "{}", kind.name());
    }
}

/// The fields of `oneof algorithm` in `message`, as proto/ writes them.
fn oneof_fields(proto: &str, message: &str) -> Vec<String> {
    let start = proto
        .find(&format!("message {message} {{"))
        .unwrap_or_else(|| panic!("no message {message}"));
    let oneof = start
        + proto[start..]
            .find("oneof algorithm {")
            .unwrap_or_else(|| panic!("{message} has no oneof algorithm"));
    let end = oneof + proto[oneof..].find('}').expect("the oneof ends");
    proto[oneof..end]
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_proto_states_exactly_the_registered_algorithms() {
    let proto = include_str!("../proto/ratelimitd/v1/ratelimit.proto");
    let names: Vec<&str> = Kind::ALL.map(Kind::name).to_vec();
    assert_eq!(oneof_fields(proto, "CheckLimitRequest"), names);
    assert_eq!(oneof_fields(proto, "Limit"), names);
}

#[test]
fn storage_tags_stay_as_deployments_stored_them() {
    let rate = Rate::new(10, Duration::from_secs(2));
    let tags: Vec<&str> = Kind::ALL
        .into_iter()
        .flat_map(|kind| kind.layouts(rate).expect("valid parameters"))
        .map(|algorithm| key_tag(&algorithm))
        .collect();
    let distinct: HashSet<&str> = tags.iter().copied().collect();
    assert_eq!(distinct.len(), tags.len(), "a tag shared: {tags:?}");
    // Deployments keep their counters under these: an algorithm added
    // later adds a tag after them.
    assert_eq!(tags[..7], ["fw", "fa", "fn", "sl", "tb", "gc", "sc"]);
}
