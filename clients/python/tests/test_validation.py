"""Arguments are checked before any call: a ValueError naming the problem,
whichever client, and nothing sent (the clients here point at no server)."""

import math

import pytest

from ratelimitd_client import AsyncClient, Client, Limit, build_request

FIXED = {"type": "fixed", "limit": 5, "window_ms": 1000}
SECOND = {"limit": 5, "window_ms": 1000}

BAD = [
    # (arguments to check(), what the message says)
    ({"key": "", **FIXED}, "key must be 1 to 1024 bytes"),
    ({"key": "é" * 513, **FIXED}, r"key must be 1 to 1024 bytes of UTF-8 \(got 1026\)"),
    ({"key": "\ud800", **FIXED}, "key must be valid UTF-8"),
    ({"key": b"user", **FIXED}, "key must be a str"),
    (
        {"key": "k", "type": "leaky", "limit": 1, "window_ms": 1},
        "type must be one of 'fixed_window', 'sliding_window', 'token_bucket', 'gcra', "
        "'sliding_window_counter', or the aliases 'fixed' \\(fixed_window\\), 'sliding' "
        "\\(sliding_window\\), 'token' \\(token_bucket\\) \\(got 'leaky'\\)",
    ),
    # Removed spellings name the right one.
    (
        {"key": "k", "type": "sliding_counter", "limit": 1, "window_ms": 1},
        "type 'sliding_counter' is not an algorithm name: use 'sliding_window_counter'",
    ),
    (
        {"key": "k", "type": "slidingCounter", "limit": 1, "window_ms": 1},
        "use 'sliding_window_counter'",
    ),
    (
        {"key": "k", "limits": [{"type": "tokenBucket", "capacity": 1, "refill_rate": 1}]},
        r"limits\[0\]: type 'tokenBucket' is not an algorithm name: use 'token_bucket'",
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
        "failure_policy must be one of 'fail-closed', 'fail-open', 'local' or None",
    ),
    (
        {"key": "k", **FIXED, "failure_policy": "fail_open"},
        "failure_policy 'fail_open' is not a failure policy: use 'fail-open'",
    ),
    (
        {"key": "k", **FIXED, "failure_policy": "fail_closed"},
        "failure_policy 'fail_closed' is not a failure policy: use 'fail-closed'",
    ),
    # One form: an algorithm, or limits, or a policy.
    (
        {"key": "k", "limits": [SECOND], "policy": "free"},
        "limits and policy cannot be combined: a request sets one algorithm, or limits, or a policy",
    ),
    (
        {"key": "k", **FIXED, "policy": "free"},
        "limit and window_ms do not apply with policy=: the policy's limits are in the server's",
    ),
    ({"key": "k", "type": "token", "limits": [SECOND]}, "type does not apply with limits=: each limit"),
    ({"key": "k", "burst": 3, "limits": [SECOND]}, "burst does not apply with limits="),
    # Limits: each checked as check()'s arguments are, named by its index.
    ({"key": "k", "limits": []}, "limits must hold at least one limit"),
    ({"key": "k", "limits": SECOND}, "limits must be a list of Limit or dict"),
    ({"key": "k", "limits": Limit(**SECOND)}, "limits must be a list of Limit or dict"),
    ({"key": "k", "limits": [5]}, r"limits\[0\]: must be a Limit or a dict of its arguments \(got 5\)"),
    (
        {"key": "k", "limits": [SECOND, {"limit": 0, "window_ms": 1000}]},
        r"limits\[1\]: limit must be 1 to 1000000000000000 \(got 0\)",
    ),
    (
        {"key": "k", "limits": [{"type": "token"}]},
        r"limits\[0\]: type='token' needs capacity and refill_rate",
    ),
    (
        {"key": "k", "limits": [{**SECOND, "window": 1}]},
        r"limits\[0\]: 'window' is not an argument of Limit, which takes type, limit, window_ms",
    ),
    ({"key": "k", "limits": [{**SECOND, "key": ""}]}, r"limits\[0\]: key must be 1 to 1024 bytes"),
    ({"key": "k", "limits": [{**SECOND, "cost": -1}]}, r"limits\[0\]: cost must be 0 to"),
    (
        {"key": "k", "limits": [{**SECOND, "name": "per second"}]},
        r"limits\[0\]: name must be 1 to 64 ASCII letters, digits, '_', '-' and '.' \(got 'per second'\)",
    ),
    ({"key": "k", "limits": [{**SECOND, "name": "é"}]}, r"limits\[0\]: name must be 1 to 64 ASCII"),
    ({"key": "k", "limits": [{**SECOND, "name": "n" * 65}]}, r"limits\[0\]: name must be 1 to 64"),
    ({"key": "k", "limits": [{**SECOND, "name": ""}]}, r"limits\[0\]: name must be 1 to 64"),
    (
        {"key": "k", "limits": [{**SECOND, "name": "a"}, {**SECOND, "name": "a"}]},
        r"limits\[1\]: name 'a' is already the name of limits\[0\]",
    ),
    (
        {"key": "k", "limits": [SECOND, {"limit": 9, "window_ms": 60_000}]},
        r"limits\[1\]: counts on the same counter as limits\[0\] \(same key and type\): give one of them "
        "a name, or its own key",
    ),
    (
        {"key": "k", "limits": [{**SECOND, "key": "u"}, {**SECOND, "key": "u"}]},
        r"limits\[1\]: counts on the same counter as limits\[0\]",
    ),
    (
        {"key": "k", "limits": [{**SECOND, "key": "k"}, SECOND]},
        r"limits\[1\]: counts on the same counter as limits\[0\]",
    ),
    (
        {"key": "", "limits": [{**SECOND, "key": "ip:1"}, {**SECOND, "name": "n"}]},
        r"limits\[1\]: key is required when the request has no key",
    ),
    ({"key": None, "limits": [{**SECOND, "key": "ip:1"}]}, r"key must be a str \(got None\)"),
    # Policies: a name the server could know.
    (
        {"key": "k", "policy": ""},
        r"policy must be 1 to 64 ASCII letters, digits, '_', '-' and '.' \(got ''\)",
    ),
    ({"key": "k", "policy": "free tier"}, "policy must be 1 to 64 ASCII"),
    ({"key": "k", "policy": "p" * 65}, "policy must be 1 to 64 ASCII"),
    ({"key": "k", "policy": b"free"}, "policy must be 1 to 64 ASCII"),
    ({"key": "", "policy": "free"}, "key must be 1 to 1024 bytes"),
    ({"key": "k", "policy": "free", "cost": -1}, "cost must be 0 to"),
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


def test_a_limit_is_checked_when_made():
    with pytest.raises(ValueError, match="limit must be 1 to"):
        Limit(limit=0, window_ms=1000)
    with pytest.raises(ValueError, match="refill_rate does not apply to type='fixed_window'"):
        Limit(limit=1, window_ms=1000, refill_rate=1)
    with pytest.raises(ValueError, match="name must be 1 to 64"):
        Limit(limit=1, window_ms=1000, name="a:b")
    arguments = {"type": "gcra", "limit": 10, "window_ms": 1000, "burst": 20, "name": "v1_burst-x.y"}
    limit = Limit(**arguments, key="ip:1", cost=0)
    # A value: equal to (and hashed as) another with the same arguments, frozen.
    assert limit == Limit(**arguments, key="ip:1", cost=0) != Limit(**arguments)
    assert hash(limit) == hash(Limit(**arguments, key="ip:1", cost=0))
    with pytest.raises(AttributeError):
        limit.limit = 5


BAD_BATCHES = [
    # (items for check_many(), what the message says)
    ([], "items must hold at least one request"),
    ({"key": "k", **FIXED}, "items must be a list of dicts of check"),
    ("k", "items must be a list of dicts of check"),
    ([("k", FIXED)], r"items\[0\]: must be a dict of check\(\) arguments"),
    ([{"key": "k", **FIXED}, FIXED], r"items\[1\]: needs a key"),
    ([{"key": "k", **FIXED, "limit": 0}], r"items\[0\]: limit must be 1 to"),
    (
        [{"key": "k", **FIXED, "deadline": 1}],
        r"items\[0\]: 'deadline' is not an argument of check\(\) in a batch, which takes key, type",
    ),
    (
        [{"key": "k", "policy": "free", "limits": [SECOND]}],
        r"items\[0\]: limits and policy cannot be combined",
    ),
    (
        [{"key": "k", "limits": [SECOND, SECOND]}],
        r"items\[0\]: limits\[1\]: counts on the same counter as limits\[0\]",
    ),
]


@pytest.mark.parametrize(("items", "message"), BAD_BATCHES)
async def test_bad_batches_raise_before_any_call(items, message, dead_address):
    with Client(dead_address) as client, pytest.raises(ValueError, match=message):
        client.check_many(items)
    async with AsyncClient(dead_address) as client:
        with pytest.raises(ValueError, match=message):
            await client.check_many(items)


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


def test_the_edges_of_several_limits_are_accepted():
    # Unnamed limits on one key apart by type, or by key; named ones by name.
    request = build_request(
        "k",
        limits=[
            {"type": "fixed", "limit": 1, "window_ms": 1},
            {"type": "sliding", "limit": 1, "window_ms": 1},
            {"type": "fixed", "limit": 1, "window_ms": 1, "key": "other"},
            {"type": "fixed", "limit": 1, "window_ms": 1, "name": "n" * 64, "cost": 0},
            Limit(type="fixed", limit=1, window_ms=1, name="n2"),
        ],
        cost=10**15,
        failure_policy="local",
    )
    assert [(one.name, one.key, one.WhichOneof("algorithm")) for one in request.limits] == [
        ("", "", "fixed_window"),
        ("", "", "sliding_window"),
        ("", "other", "fixed_window"),
        ("n" * 64, "", "fixed_window"),
        ("n2", "", "fixed_window"),
    ]
    assert not request.limits[0].HasField("cost") and request.limits[3].HasField("cost")
    assert request.WhichOneof("algorithm") is None and request.cost == 10**15
    # The request's key may be "" when every limit has its own.
    keyless = build_request(
        "", limits=[{"limit": 1, "window_ms": 1, "key": "a"}, {"limit": 1, "window_ms": 1, "key": "b"}]
    )
    assert (keyless.key, [one.key for one in keyless.limits]) == ("", ["a", "b"])
    policy = build_request("k", policy="Free-tier_2.0", cost=0)
    assert (policy.policy, policy.cost, len(policy.limits)) == ("Free-tier_2.0", 0, 0)
    assert policy.WhichOneof("algorithm") is None
    # type="fixed" is check()'s default, so it may stand beside a policy.
    assert build_request("k", type="fixed", policy="p").policy == "p"


def test_a_window_becomes_a_whole_millisecond_duration():
    window = build_request("k", type="fixed", limit=1, window_ms=10_250).fixed_window.window
    assert (window.seconds, window.nanos) == (10, 250_000_000)
