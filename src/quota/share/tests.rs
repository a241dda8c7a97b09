//! The share twin's own cases: the split, growing and shrinking, the
//! hysteresis, silent subscribers, dead instances, and the entries' stored
//! form.

use super::*;

const PARAMS: ShareParams = ShareParams {
    capacity: 100_000_000,
    headroom_permille: 200,
    min_want: 1_000_000,
    lease_ms: 16_000,
    stale_ms: 15_000,
    hysteresis_permille: 50,
};

fn rps(n: u64) -> MicroRps {
    n * 1_000_000
}

#[test]
fn the_split_cuts_only_the_wants_above_an_equal_share_or_shares_the_spare() {
    assert_eq!(split(100, &mut [10, 100, 100]), Split::Level(45));
    assert_eq!(split(100, &mut [100, 100, 100]), Split::Level(33));
    assert_eq!(split(100, &mut [10, 20]), Split::Spare(35));
    assert_eq!(split(100, &mut []), Split::Spare(100));
}

#[test]
fn a_lone_subscriber_gets_everything_then_shares_as_others_come() {
    let mut entries = HashMap::new();
    let a = settle(&mut entries, "a", ShareOp::Report(None), &PARAMS, 1000, &[]);
    assert_eq!((a.grant, a.target), (rps(100), rps(100)));
    // b arrives: its fair share is half, but a holds everything.
    let b = settle(&mut entries, "b", ShareOp::Report(None), &PARAMS, 1001, &[]);
    assert_eq!((b.grant, b.target, b.subscribers), (0, rps(50), 2));
    // a reports a demand of 150/s: it shrinks to its fair half at once.
    let a = settle(
        &mut entries,
        "a",
        ShareOp::Report(Some(rps(150))),
        &PARAMS,
        2000,
        &[],
    );
    assert_eq!(a.grant, rps(50));
    // b grows into what a freed.
    let b = settle(&mut entries, "b", ShareOp::Report(None), &PARAMS, 2001, &[]);
    assert_eq!((b.grant, b.granted), (rps(50), rps(100)));
}

#[test]
fn a_small_demand_gets_its_want_and_the_rest_goes_to_the_others() {
    let mut entries = HashMap::new();
    settle(
        &mut entries,
        "small",
        ShareOp::Report(Some(rps(20))),
        &PARAMS,
        0,
        &[],
    );
    let big = settle(
        &mut entries,
        "big",
        ShareOp::Report(Some(rps(500))),
        &PARAMS,
        1,
        &[],
    );
    // small wants 24 (20 and 20% headroom); big is cut at 76.
    assert_eq!(big.target, rps(76));
    let small = settle(
        &mut entries,
        "small",
        ShareOp::Report(Some(rps(20))),
        &PARAMS,
        2,
        &[],
    );
    assert_eq!(small.grant, rps(24));
}

#[test]
fn grants_in_force_never_add_up_to_more_than_the_capacity() {
    let mut entries = HashMap::new();
    let mut now = 0;
    let demands = [None, Some(rps(300)), Some(rps(5)), Some(rps(60)), Some(0)];
    for round in 0..50u64 {
        for (i, demand) in demands.iter().enumerate() {
            let me = format!("s{}", (i as u64 + round) % 7);
            let op = if (round + i as u64).is_multiple_of(11) {
                ShareOp::Leave
            } else {
                ShareOp::Report(*demand)
            };
            let share = settle(&mut entries, &me, op, &PARAMS, now, &[]);
            assert!(share.granted <= PARAMS.capacity, "{share:?}");
            let in_force: u64 = entries
                .values()
                .filter(|entry| entry.expires_at > now)
                .map(|entry| entry.grant)
                .sum();
            assert!(in_force <= PARAMS.capacity, "{in_force} at {now}");
            now += 700;
        }
    }
}

#[test]
fn the_spare_is_shared_a_close_grant_is_kept_and_a_silent_subscriber_is_dropped() {
    let mut entries = HashMap::new();
    let report = |entries: &mut HashMap<String, Entry>, me: &str, demand: u64, now: Millis| {
        settle(
            entries,
            me,
            ShareOp::Report(Some(rps(demand))),
            &PARAMS,
            now,
            &[],
        )
    };
    // Two quiet ones (10/s, 12 with headroom): the spare 76 is split.
    report(&mut entries, "a", 10, 0);
    report(&mut entries, "b", 10, 1);
    let a = report(&mut entries, "a", 10, 2);
    assert_eq!((a.grant, a.target), (rps(50), rps(50)));
    let b = report(&mut entries, "b", 10, 3);
    assert_eq!(b.grant, rps(50));
    // a's fair share moves to 51.2: within 5%, it keeps 50.
    let a = report(&mut entries, "a", 12, 10);
    assert_eq!((a.grant, a.target), (rps(50), 51_200_000));
    // a wants 72: its share is 80, but b holds 50 until it settles.
    let a = report(&mut entries, "a", 60, 20);
    assert_eq!((a.grant, a.target), (rps(50), rps(80)));
    let b = report(&mut entries, "b", 10, 21);
    assert_eq!(b.grant, rps(20));
    let a = report(&mut entries, "a", 60, 22);
    assert_eq!(a.grant, rps(80));
    // Silent past both its stale time and its lease: b is dropped.
    let a = report(&mut entries, "a", 60, 21 + 16_000);
    assert_eq!((a.grant, a.subscribers), (rps(100), 1));
    assert!(!entries.contains_key("b"));
}

#[test]
fn the_entries_of_a_dead_instance_are_dropped_at_once() {
    let mut entries = HashMap::new();
    let dead = ["b".to_owned()];
    settle(&mut entries, "a:1", ShareOp::Report(None), &PARAMS, 0, &[]);
    settle(&mut entries, "b:1", ShareOp::Report(None), &PARAMS, 1, &[]);
    settle(&mut entries, "b:2", ShareOp::Report(None), &PARAMS, 2, &[]);
    // a holds everything; b's two are waiting for their share.
    let a = settle(&mut entries, "a:1", ShareOp::Report(None), &PARAMS, 3, &[]);
    assert_eq!((a.target, a.subscribers), (33_333_333, 3));
    // b is dead: its entries go, long before they would run out.
    let a = settle(
        &mut entries,
        "a:1",
        ShareOp::Report(None),
        &PARAMS,
        4,
        &dead,
    );
    assert_eq!((a.grant, a.subscribers), (rps(100), 1));
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["a:1"]);
    assert_eq!(instance_of("b:2"), Some("b"));
    assert_eq!(instance_of("nocolon"), None);
}

#[test]
fn entries_read_back_as_written() {
    let entry = Entry {
        demand: None,
        grant: 5,
        stale_at: 6,
        expires_at: 7,
    };
    assert_eq!(entry.encode(), "-1 5 6 7");
    assert_eq!(Entry::decode(&entry.encode()), Some(entry));
    assert_eq!(Entry::decode("1 2 3"), None);
    assert_eq!(Entry::decode("1 2 3 4 5"), None);
}
