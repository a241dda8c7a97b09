//! The scripts' Lua text, put together at compile time from the algorithm
//! registry: every registered algorithm's Lua source, and one branch per
//! algorithm, by its tag, where `decide.lua` and `refund.lua` mark the
//! place. Nothing here runs per call: the text is fixed, so each script's
//! SHA is the same on every run.

use std::str;

use crate::algorithm::registry::{ENTRIES, Entry, Kind, REFUND_PART, SPEND_LUA};

/// `parts` joined into one string, at compile time.
macro_rules! joined {
    ($parts:expr) => {{
        const PARTS: &[&str] = $parts;
        const BYTES: [u8; joined_len(PARTS)] = join(PARTS);
        text(&BYTES)
    }};
}

/// The line of `decide.lua` and `refund.lua` that the algorithms' branches
/// replace.
const BRANCHES_GO_HERE: &str =
    "  -- limiter::script puts one branch per registered algorithm here.\n";

/// Every algorithm's decision function, with the spend constants they
/// share, in the registry's order; their refund functions are left out.
pub const ALGORITHMS_LUA: &str = joined!(&algorithm_parts(false));

/// Every algorithm's Lua source whole, decision and refund functions.
pub const ALGORITHMS_WITH_REFUNDS_LUA: &str = joined!(&algorithm_parts(true));

/// `decide.lua` with a branch per algorithm in `decide_limit`.
const DECIDE_PART_LUA: &str = joined!(&with_branches(
    include_str!("decide.lua"),
    "' then\n    return ",
    "(key, now, limit, cost, spend)\n",
));

/// The driver that decides a call's limits in a `Mode`; it needs the
/// algorithms ([`ALGORITHMS_LUA`]) and a clock defined above it.
pub const DECIDE_LUA: &str = joined!(&[DECIDE_PART_LUA, include_str!("single.lua")]);

/// The driver that decides many calls, each as [`DECIDE_LUA`] decides
/// one, in one script, on a standalone Redis; it needs the algorithms and a
/// clock defined above it.
pub const DECIDE_BATCH_LUA: &str = joined!(&[
    DECIDE_PART_LUA,
    include_str!("batch.lua"),
    include_str!("batch_keys.lua")
]);

/// [`DECIDE_BATCH_LUA`] for the calls waiting for one node of a Redis
/// Cluster, whose keys may hash to several slots of that node; it needs the
/// algorithms and a clock above it, and `NODE_BATCH_FLAGS` first.
pub const DECIDE_NODE_BATCH_LUA: &str = joined!(&[
    DECIDE_PART_LUA,
    include_str!("batch.lua"),
    include_str!("batch_node.lua")
]);

/// `refund.lua` with a branch per algorithm.
pub const REFUND_PART_LUA: &str = joined!(&with_branches(
    include_str!("refund.lua"),
    "' then\n    refunded = refunded + ",
    "_refund(key, p1, p2, p3, cost, mark)\n",
));

/// The length of `parts` joined.
const fn joined_len(parts: &[&str]) -> usize {
    let mut length = 0;
    let mut i = 0;
    while i < parts.len() {
        length += parts[i].len();
        i += 1;
    }
    length
}

/// `parts` joined, as bytes; `N` is their [`joined_len`].
const fn join<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut out = [0; N];
    let mut at = 0;
    let mut i = 0;
    while i < parts.len() {
        let part = parts[i].as_bytes();
        let mut j = 0;
        while j < part.len() {
            out[at] = part[j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    out
}

/// Joined parts of UTF-8 text, as text.
const fn text(bytes: &'static [u8]) -> &'static str {
    match str::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => panic!("joined Lua text is not UTF-8"),
    }
}

/// Where `needle` first starts in `haystack`.
const fn find(haystack: &str, needle: &str) -> Option<usize> {
    let (haystack, needle) = (haystack.as_bytes(), needle.as_bytes());
    let mut at = 0;
    while at + needle.len() <= haystack.len() {
        let mut j = 0;
        while j < needle.len() && haystack[at + j] == needle[j] {
            j += 1;
        }
        if j == needle.len() {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// `text` before and after byte `at`.
const fn split(text: &'static str, at: usize) -> (&'static str, &'static str) {
    let (before, after) = text.as_bytes().split_at(at);
    match (str::from_utf8(before), str::from_utf8(after)) {
        (Ok(before), Ok(after)) => (before, after),
        _ => panic!("a Lua source split inside a character"),
    }
}

/// An algorithm's decision function: its Lua source up to [`REFUND_PART`].
const fn decision_part(entry: &Entry) -> &'static str {
    match find(entry.lua, REFUND_PART) {
        Some(at) => split(entry.lua, at).0,
        None => panic!("an algorithm's Lua source has no refund part"),
    }
}

/// [`SPEND_LUA`], then each algorithm's source (whole, or its decision
/// part).
const fn algorithm_parts(with_refunds: bool) -> [&'static str; 1 + Kind::COUNT] {
    let mut parts = [SPEND_LUA; 1 + Kind::COUNT];
    let mut i = 0;
    while i < Kind::COUNT {
        parts[i + 1] = if with_refunds {
            ENTRIES[i].lua
        } else {
            decision_part(&ENTRIES[i])
        };
        i += 1;
    }
    parts
}

/// Parts per algorithm's branch: `if`, tag, `then`, name, call.
const BRANCH_PARTS: usize = 5;

/// `driver` with [`BRANCHES_GO_HERE`] replaced by one branch per
/// algorithm: `if algorithm == '<tag>' <then><name><call>`, the later
/// ones `elseif`.
const fn with_branches(
    driver: &'static str,
    then: &'static str,
    call: &'static str,
) -> [&'static str; 3 + BRANCH_PARTS * Kind::COUNT] {
    let Some(at) = find(driver, BRANCHES_GO_HERE) else {
        panic!("a driver has no place for the algorithms' branches");
    };
    let (before, rest) = split(driver, at);
    let after = split(rest, BRANCHES_GO_HERE.len()).1;
    let mut parts = [""; 3 + BRANCH_PARTS * Kind::COUNT];
    parts[0] = before;
    let mut i = 0;
    while i < Kind::COUNT {
        let at = 1 + BRANCH_PARTS * i;
        parts[at] = if i == 0 {
            "  if algorithm == '"
        } else {
            "  elseif algorithm == '"
        };
        parts[at + 1] = ENTRIES[i].tag;
        parts[at + 2] = then;
        parts[at + 3] = ENTRIES[i].name;
        parts[at + 4] = call;
        i += 1;
    }
    parts[1 + BRANCH_PARTS * Kind::COUNT] = "  end\n";
    parts[2 + BRANCH_PARTS * Kind::COUNT] = after;
    parts
}

/// Whether `lua` defines `local function <name><suffix>`.
pub const fn defines(lua: &'static str, name: &str, suffix: &str) -> bool {
    let mut rest = lua;
    while let Some(at) = find(rest, "local function ") {
        let after = split(rest, at + "local function ".len()).1;
        if starts_with(after, name) && starts_with(split(after, name.len()).1, suffix) {
            return true;
        }
        rest = after;
    }
    false
}

/// Whether `text` starts with `prefix`.
const fn starts_with(text: &str, prefix: &str) -> bool {
    let (text, prefix) = (text.as_bytes(), prefix.as_bytes());
    if text.len() < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if text[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

// Every algorithm's source defines the two functions its branches call:
// a missing one would fail only when a call reached it.
const _: () = {
    let mut i = 0;
    while i < Kind::COUNT {
        let entry = &ENTRIES[i];
        assert!(defines(decision_part(entry), entry.name, "("));
        assert!(defines(entry.lua, entry.name, "_refund("));
        i += 1;
    }
};
