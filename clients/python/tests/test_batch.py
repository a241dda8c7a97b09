"""check_many (CheckLimits) against a real ratelimitd: each item answered on
its own, an item's error in its place; both clients."""

import grpc
import pytest

from ratelimitd_client import AsyncClient, Client, Decision, RatelimitdError


def batch(key):
    return [
        {"key": key, "limit": 2, "window_ms": 10_000},
        {"key": key, "policy": "no-such-tier"},
        {"key": f"{key}:other", "policy": "free-tier", "cost": 3},
        {"key": key, "limit": 2, "window_ms": 10_000},
    ]


def assert_answered_each_on_its_own(results):
    assert [type(r) for r in results] == [Decision, RatelimitdError, Decision, Decision]
    first, unknown, policy, again = results
    assert unknown.code == grpc.StatusCode.NOT_FOUND and "'no-such-tier'" in unknown.details
    assert policy.allowed and [s.remaining for s in policy.limits] == [7, 997]
    # Two items on one counter, each spending (the server may decide them
    # concurrently, so either may come first).
    assert first.allowed and again.allowed
    assert sorted([first.remaining, again.remaining]) == [0, 1]


def test_a_batch_answers_each_item_on_its_own(policy_server, key):
    with Client(policy_server.address, deadline=2.0) as client:
        assert_answered_each_on_its_own(client.check_many(batch(key)))
        # The batch's decisions spent: the third check on the key is denied.
        (denied,) = client.check_many([{"key": key, "limit": 2, "window_ms": 10_000}])
    assert not denied.allowed


async def test_a_batch_answers_each_item_on_its_own_async(policy_server, key):
    async with AsyncClient(policy_server.address, deadline=2.0) as client:
        assert_answered_each_on_its_own(await client.check_many(batch(key)))


def test_several_limits_in_a_batch(client, key):
    limits = [{"name": "a", "limit": 1, "window_ms": 10_000}, {"name": "b", "limit": 5, "window_ms": 10_000}]
    results = client.check_many([{"key": key, "limits": limits}] * 2)
    # One of the two passed, the other spent nothing on "b".
    assert sorted(r.allowed for r in results) == [False, True]
    assert [[s.remaining for s in r.limits] for r in results if not r.allowed] == [[0, 4]]


def test_a_batch_over_the_servers_bound_fails_as_a_whole(client, key):
    # --max-batch-size defaults to 1000: the call is refused, nothing decided.
    items = [{"key": key, "limit": 1, "window_ms": 10_000, "cost": 0}] * 1001
    with pytest.raises(RatelimitdError) as raised:
        client.check_many(items)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-batch-size" in raised.value.details


def test_a_batch_to_no_server_fails_as_a_whole(dead_address):
    with Client(dead_address, deadline=1.0) as client, pytest.raises(RatelimitdError) as raised:
        client.check_many([{"key": "k", "limit": 1, "window_ms": 1000}])
    assert raised.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
