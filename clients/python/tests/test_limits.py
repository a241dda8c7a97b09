"""Several limits in one check, and named policies, against a real
ratelimitd: both clients, all or nothing."""

import time

import grpc
import pytest

from ratelimitd_client import AsyncClient, Client, Limit, LimitStatus, RatelimitdError

from conftest import start_ratelimitd, write_policies

HOUR_MS = 3_600_000


@pytest.fixture
def policy_client(policy_server):
    with Client(policy_server.address, deadline=2.0) as client:
        yield client


@pytest.fixture
async def policy_aclient(policy_server):
    async with AsyncClient(policy_server.address, deadline=2.0) as client:
        yield client


# --- several limits -------------------------------------------------------

# A Limit and a dict stand for each other.
TWO_LIMITS = [
    Limit(name="small", limit=2, window_ms=10_000),
    {"name": "big", "type": "fixed", "limit": 5, "window_ms": 10_000},
]


def assert_all_or_nothing(decisions, look):
    """Three checks of TWO_LIMITS on a fresh key, then a look (cost 0) at
    the big limit alone."""
    assert [d.allowed for d in decisions] == [True, True, False]
    assert [[s.remaining for s in d.limits] for d in decisions] == [[1, 4], [0, 3], [0, 3]]
    denied = decisions[2]
    assert [(s.name, s.allowed) for s in denied.limits] == [("small", False), ("big", True)]
    # The top level: the overall decision, and the numbers of the denying limit.
    assert denied.most_restrictive == 0
    assert (denied.limit, denied.remaining) == (2, 0)
    assert 5_000 < denied.retry_after_ms <= 10_000
    assert denied.limits[0].retry_after_ms == denied.retry_after_ms
    assert denied.limits[1].retry_after_ms == 0
    # Nothing was spent on "big" by the denied check: 3 left, not 2.
    assert look.allowed and look.limits[0].remaining == 3 and look.remaining == 3


def test_several_limits_are_all_or_nothing(client, key):
    decisions = [client.check(key, limits=TWO_LIMITS) for _ in range(3)]
    assert_all_or_nothing(decisions, client.check(key, limits=TWO_LIMITS[1:], cost=0))


async def test_several_limits_are_all_or_nothing_async(ratelimitd, key):
    async with AsyncClient(ratelimitd.address, deadline=2.0) as client:
        decisions = [await client.check(key, limits=TWO_LIMITS) for _ in range(3)]
        assert_all_or_nothing(decisions, await client.check(key, limits=TWO_LIMITS[1:], cost=0))


def test_an_allowed_check_reports_the_limit_with_the_fewest_units_left(client, key):
    limits = [
        Limit(name="per-10s", limit=5, window_ms=10_000),
        Limit(name="per-hour", type="token", capacity=3, refill_rate=3 / 3600),
    ]
    decision = client.check(key, limits=limits, cost=2)
    assert decision.allowed and decision.retry_after_ms == 0
    assert [(s.name, s.remaining, s.limit) for s in decision.limits] == [
        ("per-10s", 3, 5),
        ("per-hour", 1, 3),
    ]
    assert decision.most_restrictive == 1 and (decision.limit, decision.remaining) == (3, 1)
    assert decision.limits[1] == LimitStatus(
        name="per-hour",
        allowed=True,
        limit=3,
        remaining=1,
        reset_after_ms=decision.limits[1].reset_after_ms,
        retry_after_ms=0,
        cost_exceeds_limit=False,
        shadow=False,
    )


def test_a_denied_check_waits_for_the_last_limit(client, key):
    # Both deny the second request: it may pass once both allow, in ~1 h.
    limits = [Limit(name="second", limit=1, window_ms=1000), Limit(name="hour", limit=1, window_ms=HOUR_MS)]
    assert client.check(key, limits=limits).allowed
    denied = client.check(key, limits=limits)
    assert not denied.allowed and [s.allowed for s in denied.limits] == [False, False]
    assert denied.most_restrictive == 1
    assert HOUR_MS - 60_000 < denied.retry_after_ms <= HOUR_MS
    assert denied.limits[0].retry_after_ms <= 1000


def test_a_limit_on_its_own_key_is_shared_between_callers(client, key):
    # Each user 5 per 10 s, all users of one IP 1 per 10 s, and per-limit costs.
    ip = f"{key}:ip"

    def limits(user_cost):
        return [
            {"name": "user", "limit": 5, "window_ms": 10_000, "cost": user_cost},
            {"name": "ip", "key": ip, "limit": 1, "window_ms": 10_000},
        ]

    first = client.check(f"{key}:alice", limits=limits(2))
    assert first.allowed and [s.remaining for s in first.limits] == [3, 0]
    second = client.check(f"{key}:bob", limits=limits(2))
    assert not second.allowed
    assert [(s.name, s.allowed) for s in second.limits] == [("user", True), ("ip", False)]
    # Bob's own limit kept all 5: the IP's denial spent nothing on it.
    assert second.limits[0].remaining == 5
    assert client.check(f"{key}:bob", limits=limits(0), cost=0).limits[0].remaining == 5


def test_a_request_without_a_key_when_each_limit_has_its_own(client, key):
    limits = [
        {"key": f"{key}:user", "limit": 2, "window_ms": 10_000},
        {"key": f"{key}:ip", "limit": 1, "window_ms": 10_000},
    ]
    assert [s.remaining for s in client.check("", limits=limits).limits] == [1, 0]
    assert client.check(f"{key}:user", limit=2, window_ms=10_000, cost=0).remaining == 1  # the same counter


def test_a_cost_above_one_limit_can_never_pass(client, key):
    decision = client.check(key, limits=TWO_LIMITS, cost=3)
    assert not decision.allowed and decision.cost_exceeds_limit and decision.retry_after_ms is None
    assert [(s.cost_exceeds_limit, s.retry_after_ms is None) for s in decision.limits] == [
        (True, True),
        (False, False),
    ]


def test_the_one_limit_form_has_no_statuses(client, key):
    decision = client.check(key, limit=1, window_ms=1000)
    assert decision.limits == () and decision.most_restrictive == 0


# --- named policies -------------------------------------------------------


def assert_free_tier(decisions):
    """Eleven checks of "free-tier" (10 per second, 1000 per hour) on a
    fresh key within a second."""
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    assert [s.name for s in decisions[0].limits] == ["1s", "1h"]
    assert [d.remaining for d in decisions[:10]] == list(range(9, -1, -1))
    denied = decisions[10]
    assert [s.allowed for s in denied.limits] == [False, True]
    assert (denied.most_restrictive, denied.limit, denied.remaining) == (0, 10, 0)
    assert 0 < denied.retry_after_ms <= 1000
    # The hour limit spent 10, not 11: the denied check spent nothing.
    assert denied.limits[1].remaining == 990


def test_a_policy_from_the_servers_file(policy_client, key):
    assert_free_tier([policy_client.check(key, policy="free-tier") for _ in range(11)])


async def test_a_policy_from_the_servers_file_async(policy_aclient, key):
    assert_free_tier([await policy_aclient.check(key, policy="free-tier") for _ in range(11)])


def test_an_unknown_policy_is_not_found(policy_client, key):
    with pytest.raises(RatelimitdError) as raised:
        policy_client.check(key, policy="no-such-tier")
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert "'no-such-tier'" in raised.value.details
    assert str(raised.value).startswith("NOT_FOUND: ")


async def test_an_unknown_policy_is_not_found_async(policy_aclient, key):
    with pytest.raises(RatelimitdError) as raised:
        await policy_aclient.check(key, policy="no-such-tier")
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert "'no-such-tier'" in raised.value.details


def test_a_shadow_limit_is_reported_but_never_denies(policy_client, key):
    decisions = [policy_client.check(key, policy="watched") for _ in range(2)]
    assert all(d.allowed for d in decisions)
    assert [(s.name, s.shadow) for s in decisions[1].limits] == [("enforced", False), ("trial", True)]
    assert not decisions[1].limits[1].allowed  # it would have denied


def test_a_policy_takes_the_failure_policy_and_cost(policy_client, key):
    decision = policy_client.check(key, policy="free-tier", cost=4, failure_policy="fail-open")
    assert decision.allowed and [s.remaining for s in decision.limits] == [6, 996]


def test_a_policy_added_to_the_file_is_in_force_without_a_restart(tmp_path, key):
    server = start_ratelimitd(tmp_path, policies="policies: {}\n")
    try:
        with Client(server.address, deadline=2.0) as client:
            with pytest.raises(RatelimitdError) as raised:
                client.check(key, policy="pro")
            assert raised.value.code == grpc.StatusCode.NOT_FOUND
            write_policies(server.config_dir, "policies:\n  pro:\n    - {per: 1m, limit: 100}\n")
            give_up = time.monotonic() + 5
            while True:
                try:
                    decision = client.check(key, policy="pro")
                    break
                except RatelimitdError as err:
                    assert err.code == grpc.StatusCode.NOT_FOUND
                    assert time.monotonic() < give_up, "the new policy was not in force within 5 s"
                    time.sleep(0.05)
            assert decision.allowed and [(s.name, s.remaining) for s in decision.limits] == [("1m", 99)]
    finally:
        assert server.stop() == 0
