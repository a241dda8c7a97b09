"""Arguments are checked before any call: a ValueError naming the problem,
whichever client, and nothing sent (the clients here point at no server)."""

import math

import pytest

from ratelimitd_client import AsyncClient, Client, build_request

FIXED = {"type": "fixed", "limit": 5, "window_ms": 1000}

BAD = [
    # (arguments to check(), what the message says)
    ({"key": "", **FIXED}, "key must be 1 to 1024 bytes"),
    ({"key": "é" * 513, **FIXED}, r"key must be 1 to 1024 bytes of UTF-8 \(got 1026\)"),
    ({"key": "\ud800", **FIXED}, "key must be valid UTF-8"),
    ({"key": b"user", **FIXED}, "key must be a str"),
    (
        {"key": "k", "type": "leaky", "limit": 1, "window_ms": 1},
        "type must be one of 'fixed', 'sliding', 'token', 'gcra', 'sliding_counter'",
    ),
    ({"key": "k", "type": "fixed", "limit": 5}, "type='fixed' needs window_ms"),
    ({"key": "k", "type": "token"}, "type='token' needs capacity and refill_rate"),
    (
        {"key": "k", **FIXED, "capacity": 5},
        "capacity does not apply to type='fixed', which takes limit and window_ms",
    ),
    (
        {"key": "k", "type": "token", "capacity": 5, "refill_rate": 1, "limit": 5, "window_ms": 1},
        "limit and window_ms do not apply to type='token'",
    ),
    (
        {"key": "k", "type": "fixed", "limit": 0, "window_ms": 1000},
        r"limit must be 1 to 1000000000000000 \(got 0\)",
    ),
    (
        {"key": "k", "type": "fixed", "limit": 10**15 + 1, "window_ms": 1000},
        "limit must be 1 to 1000000000000000",
    ),
    ({"key": "k", "type": "fixed", "limit": 5.0, "window_ms": 1000}, r"limit must be an int \(got 5.0\)"),
    ({"key": "k", "type": "fixed", "limit": True, "window_ms": 1000}, "limit must be an int"),
    ({"key": "k", "type": "sliding", "limit": 100_001, "window_ms": 1000}, "limit must be 1 to 100000"),
    ({"key": "k", "type": "fixed", "limit": 5, "window_ms": 0}, "window_ms must be 1 to 31622400000"),
    ({"key": "k", "type": "fixed", "limit": 5, "window_ms": 366 * 86_400_000 + 1}, "window_ms must be 1 to"),
    ({"key": "k", "type": "fixed", "limit": 5, "window_ms": 1.5}, "window_ms must be an int"),
    (
        {"key": "k", "type": "token", "capacity": 5, "refill_rate": 0},
        "refill_rate must be finite and positive",
    ),
    (
        {"key": "k", "type": "token", "capacity": 5, "refill_rate": -1},
        "refill_rate must be finite and positive",
    ),
    ({"key": "k", "type": "token", "capacity": 5, "refill_rate": math.inf}, "refill_rate must be finite"),
    ({"key": "k", "type": "token", "capacity": 5, "refill_rate": math.nan}, "refill_rate must be finite"),
    ({"key": "k", "type": "token", "capacity": 5, "refill_rate": "1"}, "refill_rate must be a number"),
    (
        {"key": "k", "type": "token", "capacity": 10**9, "refill_rate": 0.001},
        "too slow: .* more than 366 days",
    ),
    ({"key": "k", **FIXED, "cost": -1}, "cost must be 0 to 1000000000000000"),
    ({"key": "k", **FIXED, "cost": 10**15 + 1}, "cost must be 0 to"),
    (
        {"key": "k", **FIXED, "failure_policy": "FAIL_OPEN"},
        "failure_policy must be one of 'fail_closed', 'fail_open', 'local'",
    ),
]


@pytest.mark.parametrize(("arguments", "message"), BAD)
def test_bad_arguments_raise_before_any_call(arguments, message, dead_address):
    arguments = dict(arguments)
    key = arguments.pop("key")
    with pytest.raises(ValueError, match=message):
        build_request(key, **arguments)
    with Client(dead_address) as client, pytest.raises(ValueError, match=message):
        client.check(key, **arguments)


async def test_the_async_client_checks_the_same(dead_address):
    async with AsyncClient(dead_address) as client:
        for arguments, message in BAD:
            arguments = dict(arguments)
            key = arguments.pop("key")
            with pytest.raises(ValueError, match=message):
                await client.check(key, **arguments)


@pytest.mark.parametrize("deadline", [0, -1, math.nan, math.inf, "1", True])
def test_bad_deadlines(deadline, dead_address):
    with pytest.raises(ValueError, match="deadline must be"):
        Client(dead_address, deadline=deadline)
    with pytest.raises(ValueError, match="deadline must be"):
        AsyncClient(dead_address, deadline=deadline)
    with Client(dead_address) as client, pytest.raises(ValueError, match="deadline must be"):
        client.check("k", **FIXED, deadline=deadline)


def test_the_edges_are_accepted():
    assert build_request("k" * 1024, type="fixed", limit=10**15, window_ms=366 * 86_400_000, cost=10**15)
    assert build_request("k", type="sliding", limit=100_000, window_ms=1, cost=0)
    request = build_request("ключ", type="token", capacity=5, refill_rate=1, failure_policy="local")
    assert request.token_bucket.capacity == 5 and request.token_bucket.refill_per_second == 1.0
    assert request.HasField("failure_policy")


def test_a_window_becomes_a_whole_millisecond_duration():
    window = build_request("k", type="fixed", limit=1, window_ms=10_250).fixed_window.window
    assert (window.seconds, window.nanos) == (10, 250_000_000)
