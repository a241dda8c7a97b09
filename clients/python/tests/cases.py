"""What the sync and asyncio client tests share: the limits they run under
every algorithm, and the assertions on what ratelimitd answers."""

from ratelimitd_client import Decision

# Each allows 5 units, then denies until `retry_max_ms` at the latest.
LIMITS = {
    "fixed_window": {
        "params": {"type": "fixed_window", "limit": 5, "window_ms": 10_000},
        "retry_max_ms": 10_000,
    },
    "sliding_window": {
        "params": {"type": "sliding_window", "limit": 5, "window_ms": 10_000},
        "retry_max_ms": 10_000,
    },
    # 0.5 tokens/s: one token is back 2 s after the bucket runs dry.
    "token_bucket": {
        "params": {"type": "token_bucket", "capacity": 5, "refill_rate": 0.5},
        "retry_max_ms": 2_000,
    },
    # The short names are aliases of the server's.
    "fixed (alias)": {"params": {"type": "fixed", "limit": 5, "window_ms": 10_000}, "retry_max_ms": 10_000},
    "token (alias)": {"params": {"type": "token", "capacity": 5, "refill_rate": 0.5}, "retry_max_ms": 2_000},
    # 5 per 10 s, bursts of 5: one more every 2 s.
    "gcra": {"params": {"type": "gcra", "limit": 5, "window_ms": 10_000}, "retry_max_ms": 2_000},
}

# Short spans (2 units per 150 ms), for the tests that wait out a retry_after.
SHORT = {
    "fixed_window": {"type": "fixed_window", "limit": 2, "window_ms": 150},
    "sliding_window": {"type": "sliding_window", "limit": 2, "window_ms": 150},
    "token_bucket": {"type": "token_bucket", "capacity": 2, "refill_rate": 2 / 0.150},
    "gcra": {"type": "gcra", "limit": 2, "window_ms": 150},
}


def assert_five_then_denied(decisions: list[Decision], retry_max_ms: int) -> None:
    """Six requests of cost 1 on a fresh key of LIMITS."""
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0]
    assert {d.limit for d in decisions} == {5}
    assert [d.retry_after_ms for d in decisions[:5]] == [0] * 5
    denied = decisions[5]
    # Most of the span is still ahead: the requests took milliseconds.
    assert retry_max_ms / 2 < denied.retry_after_ms <= retry_max_ms
    assert 0 < denied.reset_after_ms <= 10_000
    assert not denied.cost_exceeds_limit
    assert not any(d.degraded for d in decisions)


def assert_costs(spend3, spend3_again, spend2, look, too_much) -> None:
    """Decisions for costs 3, 3, 2, 0 and 6 in a row on a fresh key of LIMITS."""
    assert (spend3.allowed, spend3.remaining) == (True, 2)
    # Denied: nothing spent, and a time when 3 units will fit.
    assert (spend3_again.allowed, spend3_again.remaining) == (False, 2)
    assert spend3_again.retry_after_ms > 0 and not spend3_again.cost_exceeds_limit
    assert (spend2.allowed, spend2.remaining) == (True, 0)
    # Cost 0 looks: nothing spent, remaining reported.
    assert (look.remaining, look.retry_after_ms) == (0, 0)
    # More than the limit can never pass: no retry time at all.
    assert (too_much.allowed, too_much.cost_exceeds_limit, too_much.retry_after_ms) == (False, True, None)
    assert too_much.remaining == 0
