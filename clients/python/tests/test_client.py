"""The blocking Client against a real ratelimitd, for every algorithm."""

import time

import pytest

from ratelimitd_client import DEFAULT_DEADLINE, Client

from cases import LIMITS, SHORT, assert_costs, assert_five_then_denied


@pytest.mark.parametrize("algorithm", LIMITS)
def test_allows_the_limit_then_denies(client, key, algorithm):
    case = LIMITS[algorithm]
    decisions = [client.check(key, **case["params"]) for _ in range(6)]
    assert_five_then_denied(decisions, case["retry_max_ms"])


@pytest.mark.parametrize("algorithm", LIMITS)
def test_costs(client, key, algorithm):
    params = LIMITS[algorithm]["params"]
    assert_costs(*(client.check(key, **params, cost=cost) for cost in (3, 3, 2, 0, 6)))


@pytest.mark.parametrize("algorithm", SHORT)
def test_retrying_after_retry_after_passes(client, key, algorithm):
    params = SHORT[algorithm]
    assert [client.check(key, **params).allowed for _ in range(3)] == [True, True, False]
    denied = client.check(key, **params)
    assert not denied.allowed and 0 < denied.retry_after_ms <= 150
    time.sleep(denied.retry_after_ms / 1000)  # the wait the server asked for, no more
    assert client.check(key, **params).allowed


def test_one_key_under_two_algorithms_is_two_limits(client, key):
    assert not client.check(key, type="fixed", limit=1, window_ms=10_000, cost=2).allowed
    client.check(key, type="fixed", limit=1, window_ms=10_000)
    assert client.check(key, type="sliding", limit=1, window_ms=10_000).allowed
    assert client.check(key, type="token", capacity=1, refill_rate=1).allowed
    # An alias is its algorithm: the same counter.
    assert not client.check(key, type="fixed_window", limit=1, window_ms=10_000).allowed


def test_a_failure_policy_is_accepted(client, key):
    # The embedded store never fails, so the policy never answers: not degraded.
    decision = client.check(key, limit=1, window_ms=1000, failure_policy="fail-open")
    assert decision.allowed and not decision.degraded


def test_the_default_deadline_suffices_on_loopback(ratelimitd, key):
    with Client(ratelimitd.address) as client:
        assert client.deadline == DEFAULT_DEADLINE == 0.3
        client.check(key, limit=100, window_ms=10_000, deadline=2.0)  # connects
        assert all(client.check(key, limit=100, window_ms=10_000).allowed for _ in range(20))


def test_decisions_are_frozen(client, key):
    decision = client.check(key, limit=1, window_ms=1000)
    with pytest.raises(AttributeError):
        decision.allowed = False


def test_gcra_burst_is_apart_from_the_rate(client, key):
    # 1 per 10 s sustained, but 3 at once.
    params = {"type": "gcra", "limit": 1, "window_ms": 10_000, "burst": 3}
    decisions = [client.check(key, **params) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert decisions[0].limit == 3
    assert 0 < decisions[3].retry_after_ms <= 10_000


def test_sliding_counter_allows_the_limit_within_a_window(client, key):
    # An hour-long window: the checks never straddle two, so the estimate is exact.
    params = {"type": "sliding_window_counter", "limit": 3, "window_ms": 3_600_000}
    decisions = [client.check(key, **params) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert decisions[3].retry_after_ms > 0
