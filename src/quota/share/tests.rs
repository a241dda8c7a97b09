//! The share twin's own cases: the split, growing and shrinking, the
//! hysteresis, silent subscribers, dead instances' orphans (held, run
//! out, released), and the entries' stored forms.

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

/// A third of 100/s.
const THIRD: MicroRps = 33_333_333;

/// The grants in force in `entries` at `now`, orphans' included.
fn in_force(entries: &HashMap<String, Entry>, now: Millis) -> MicroRps {
    entries
        .values()
        .filter(|entry| entry.expires_at > now)
        .map(|entry| entry.grant)
        .sum()
}

/// `me` reports a demand of 150/s at `now` with `dead` instances; the
/// grants in force stay within the capacity.
fn busy(entries: &mut HashMap<String, Entry>, me: &str, now: Millis, dead: &[&str]) -> Share {
    let dead: Vec<String> = dead.iter().map(|id| (*id).to_owned()).collect();
    let share = settle(
        entries,
        me,
        ShareOp::Report(Some(rps(150))),
        &PARAMS,
        now,
        &dead,
    );
    assert!(share.granted <= PARAMS.capacity, "{share:?}");
    assert!(in_force(entries, now) <= PARAMS.capacity, "{entries:?}");
    share
}

/// Three busy subscribers holding a third each, the last settled at 1002.
fn thirds(ids: [&str; 3]) -> HashMap<String, Entry> {
    let mut entries = HashMap::new();
    for (at, id) in [0, 1, 2, 1000, 1001, 1002]
        .into_iter()
        .zip(ids.iter().cycle())
    {
        busy(&mut entries, id, at, &[]);
    }
    assert!(
        entries.values().all(|entry| entry.grant == THIRD),
        "{entries:?}"
    );
    entries
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
    for round in 0..60u64 {
        // Now and then an instance dies for a while, its subscribers
        // orphaned (some of them go on settling, as an instance cut off
        // from the others' beats may).
        let dead: Vec<String> = match round % 20 {
            5..=9 => vec!["b"],
            12..=13 => vec!["a", "c"],
            _ => vec![],
        }
        .into_iter()
        .map(str::to_owned)
        .collect();
        for (i, demand) in demands.iter().enumerate() {
            let k = (i as u64 + round) % 7;
            let me = format!("{}:{k}", ["a", "b", "c"][(k % 3) as usize]);
            let op = if (round + i as u64).is_multiple_of(11) {
                ShareOp::Leave
            } else {
                ShareOp::Report(*demand)
            };
            let share = settle(&mut entries, &me, op, &PARAMS, now, &dead);
            assert!(share.granted <= PARAMS.capacity, "{share:?}");
            let in_force = in_force(&entries, now);
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
fn a_dead_instance_s_subscribers_stop_wanting_at_once_and_go_when_they_run_out() {
    let mut entries = HashMap::new();
    let dead = ["b".to_owned()];
    settle(&mut entries, "a:1", ShareOp::Report(None), &PARAMS, 0, &[]);
    settle(&mut entries, "b:1", ShareOp::Report(None), &PARAMS, 1, &[]);
    settle(&mut entries, "b:2", ShareOp::Report(None), &PARAMS, 2, &[]);
    // a holds everything; b's two are waiting for their share.
    let a = settle(&mut entries, "a:1", ShareOp::Report(None), &PARAMS, 3, &[]);
    assert_eq!((a.target, a.subscribers), (33_333_333, 3));
    // b is dead: its subscribers' wants go at once; they hold nothing, but
    // stay (orphans) until their grants would have run out.
    let a = settle(
        &mut entries,
        "a:1",
        ShareOp::Report(None),
        &PARAMS,
        4,
        &dead,
    );
    assert_eq!((a.grant, a.subscribers), (rps(100), 1));
    assert_eq!(entries.len(), 3);
    let a = settle(
        &mut entries,
        "a:1",
        ShareOp::Report(None),
        &PARAMS,
        2 + PARAMS.lease_ms,
        &dead,
    );
    assert_eq!((a.grant, a.subscribers), (rps(100), 1));
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["a:1"]);
    assert_eq!(instance_of("b:2"), Some("b"));
    assert_eq!(instance_of("nocolon"), None);
}

#[test]
fn an_orphan_s_grant_is_held_until_it_runs_out_then_taken_within_a_settlement() {
    let mut entries = thirds(["a:1", "a:2", "b:1"]);
    let runs_out = 1002 + PARAMS.lease_ms;
    // b is dead: a's two want half each now, but b:1's Envoy may still
    // enforce its third, so each keeps its own.
    for now in [6000, 12_000, runs_out - 1] {
        busy(&mut entries, "a:2", now - 1, &["b"]);
        let a = busy(&mut entries, "a:1", now, &["b"]);
        assert_eq!(
            (a.grant, a.target, a.subscribers, a.granted),
            (THIRD, rps(50), 2, 3 * THIRD)
        );
        assert!(entries.contains_key("b:1"));
    }
    // Its lease over, the grant is free.
    let a = busy(&mut entries, "a:1", runs_out, &["b"]);
    assert_eq!((a.grant, a.granted), (rps(50), rps(50) + THIRD));
    assert!(!entries.contains_key("b:1"));
    let a = busy(&mut entries, "a:2", runs_out + 1, &["b"]);
    assert_eq!((a.grant, a.granted), (rps(50), rps(100)));
}

#[test]
fn orphans_are_released_all_at_once_by_as_many_newcomers() {
    let mut entries = thirds(["a:1", "b:1", "b:2"]);
    // b is dead; one of its Envoys subscribes again on a (a:7): not enough.
    let newcomer = busy(&mut entries, "a:7", 3000, &["b"]);
    // (One µrps: what the three thirds leave.)
    assert_eq!((newcomer.grant, newcomer.target), (1, rps(50)));
    assert!(entries.contains_key("b:1") && entries.contains_key("b:2"));
    // The other, a:8: both orphans go, and their grants are free.
    let newcomer = busy(&mut entries, "a:8", 3500, &["b"]);
    assert_eq!((newcomer.grant, newcomer.granted), (THIRD, 2 * THIRD + 1));
    assert!(!entries.contains_key("b:1") && !entries.contains_key("b:2"));
    let newcomer = busy(&mut entries, "a:7", 3600, &["b"]);
    assert_eq!((newcomer.grant, newcomer.granted), (THIRD, 3 * THIRD));
}

#[test]
fn orphans_are_not_released_by_subscribers_older_than_their_last_settlement() {
    let mut entries = HashMap::new();
    busy(&mut entries, "b:1", 0, &[]);
    busy(&mut entries, "a:1", 1, &[]);
    // a:2 comes after b:1 first settled, but before it last did.
    busy(&mut entries, "a:2", 500, &[]);
    busy(&mut entries, "b:1", 1000, &[]);
    for (me, now) in [("a:2", 2000), ("a:1", 2001)] {
        let share = busy(&mut entries, me, now, &["b"]);
        assert!(entries.contains_key("b:1"), "{share:?}");
    }
    // Nor by a newcomer leaving, nor by one of the dead instance itself.
    let left = settle(
        &mut entries,
        "a:9",
        ShareOp::Leave,
        &PARAMS,
        3000,
        &["b".to_owned()],
    );
    assert_eq!(left.subscribers, 2);
    busy(&mut entries, "b:5", 3001, &["b"]);
    assert!(entries.contains_key("b:1"));
    // Two orphans now (b:5 one too, settled last at 3001): newcomers of a
    // live instance since then release them, once there are two.
    busy(&mut entries, "a:3", 3002, &["b"]);
    assert!(entries.contains_key("b:1") && entries.contains_key("b:5"));
    busy(&mut entries, "a:4", 3003, &["b"]);
    assert!(!entries.contains_key("b:1") && !entries.contains_key("b:5"));
}

#[test]
fn entries_read_back_as_written_and_in_the_four_number_form() {
    let entry = Entry {
        demand: None,
        grant: 5,
        stale_at: 6,
        expires_at: 7,
        since: 2,
        settled_at: 3,
    };
    assert_eq!(entry.encode(), "-1 5 6 7 2 3");
    assert_eq!(Entry::decode(&entry.encode()), Some(entry));
    // The four numbers alone: never a newcomer (since 0), and, if
    // orphaned, never released before its grant runs out (settled then).
    let four = Entry::decode("12 5 6 7").expect("the four-number form");
    assert_eq!(
        four,
        Entry {
            demand: Some(12),
            since: 0,
            settled_at: 7,
            ..entry
        }
    );
    for bad in [
        "1 2 3",
        "1 2 3 4 5",
        "1 2 3 4 5 6 7",
        "1 2 3 4 x 6",
        "1 2 3 4 5 ",
    ] {
        assert_eq!(Entry::decode(bad), None, "{bad:?}");
    }
}
