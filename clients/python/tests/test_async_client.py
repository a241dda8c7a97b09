"""AsyncClient against a real ratelimitd: the same cases as test_client.py."""

import asyncio

import pytest

from ratelimitd_client import AsyncClient

from cases import LIMITS, SHORT, assert_costs, assert_five_then_denied


@pytest.fixture
async def aclient(ratelimitd):
    async with AsyncClient(ratelimitd.address, deadline=2.0) as client:
        yield client


@pytest.mark.parametrize("algorithm", LIMITS)
async def test_allows_the_limit_then_denies(aclient, key, algorithm):
    case = LIMITS[algorithm]
    decisions = [await aclient.check(key, **case["params"]) for _ in range(6)]
    assert_five_then_denied(decisions, case["retry_max_ms"])


@pytest.mark.parametrize("algorithm", LIMITS)
async def test_costs(aclient, key, algorithm):
    params = LIMITS[algorithm]["params"]
    assert_costs(*[await aclient.check(key, **params, cost=cost) for cost in (3, 3, 2, 0, 6)])


@pytest.mark.parametrize("algorithm", SHORT)
async def test_retrying_after_retry_after_passes(aclient, key, algorithm):
    params = SHORT[algorithm]
    assert [(await aclient.check(key, **params)).allowed for _ in range(3)] == [True, True, False]
    denied = await aclient.check(key, **params)
    assert not denied.allowed and 0 < denied.retry_after_ms <= 150
    await asyncio.sleep(denied.retry_after_ms / 1000)  # the wait the server asked for
    assert (await aclient.check(key, **params)).allowed


async def test_concurrent_checks_never_exceed_the_limit(aclient, key):
    decisions = await asyncio.gather(*(aclient.check(key, limit=10, window_ms=10_000) for _ in range(50)))
    assert sum(d.allowed for d in decisions) == 10
    assert sorted(d.remaining for d in decisions if d.allowed) == list(range(10))


def test_one_client_serves_successive_event_loops(ratelimitd, key):
    # As under pytest, or a TestClient per test: each asyncio.run is a new loop.
    client = AsyncClient(ratelimitd.address, deadline=2.0)
    remaining = [asyncio.run(client.check(key, limit=5, window_ms=10_000)).remaining for _ in range(3)]
    assert remaining == [4, 3, 2]
