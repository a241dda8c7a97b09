"""Leases against a real ratelimitd whose policies file marks policies
`lease: true`: a hot policy and key is decided in-process from units the
server spent for the client, never admitting more than the limit; the
remaining count stays right for the RateLimit headers; `leases=False`
(or RATELIMITD_LEASES=off) sends every check to CheckLimit; a policy that
is not leasable keeps working per request; clients and threads sharing a
key stay within the limit together; a broken stream is survived and
reopened; a server killed under load leaves every check answering (from
the units held, then failing fast); units are given back when idle and on
close(), and a store outage is survived (on a Redis of the tests' own)."""

import asyncio
import contextlib
import dataclasses
import math
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import grpc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client import AsyncClient, Client, Decision, LimitStatus, RatelimitdError
from ratelimitd_client.asgi import Limiter, RateLimitMiddleware

from conftest import free_port, start_ratelimitd

# Windows long enough that none ends during a test: each test has its own
# key, so its own counters (a fixed window starts at its key's first spend).
LEASE_POLICIES = """\
policies:
  hot:
    - {per: 60s, limit: 500, lease: true}
  # Units given back come back to a token bucket (1000 an hour: refilling
  # about one every 4 s, so what a test sees is what was spent). Its units
  # outlive the 5 s after which an idle client gives them back.
  bucket:
    - {per: 1h, limit: 1000, algorithm: token_bucket, lease: true, lease_max_duration: 30s}
  two:
    - {per: 1h, limit: 5000, algorithm: token_bucket, lease: true, name: burst}
    - {per: 60s, limit: 500, lease: true, name: minute}
  # Not leasable: decided by CheckLimit, per request.
  cold:
    - {per: 60s, limit: 500}
  # Leases of half a second: units held when the server dies lapse soon.
  second:
    - {per: 1s, limit: 1000, algorithm: token_bucket, lease: true}
"""

DEADLINE = 2.0
# The longest a test waits for something the client does in the background.
WAIT = 15.0


@pytest.fixture(scope="module")
def lease_server(tmp_path_factory):
    server = start_ratelimitd(tmp_path_factory.mktemp("ratelimitd-leases"), policies=LEASE_POLICIES)
    yield server
    code = server.stop()
    assert code == 0, f"ratelimitd exited {code} on SIGTERM; its log:\n{server.log.read_text()}"


def start_redis(work, port: int | None = None) -> tuple[int, subprocess.Popen]:
    """A redis-server on a free loopback port (or `port`), nothing saved,
    answering PING."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is needed for the lease tests on Redis: install Redis", pytrace=False)
    port = port or free_port()
    with (work / f"redis-{port}.log").open("ab") as log:
        redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    wait_for(lambda: _redis_answers(port, redis), f"redis-server on port {port}")
    return port, redis


def stop_redis(redis: subprocess.Popen) -> None:
    redis.terminate()
    redis.wait(timeout=10)


@pytest.fixture(scope="module")
def redis_lease_server(tmp_path_factory):
    """A ratelimitd on a Redis of its own: units given back return to a
    token bucket there (the embedded store lets them come back with the
    refill instead)."""
    port, redis = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        server = start_ratelimitd(
            tmp_path_factory.mktemp("ratelimitd-leases-redis"),
            policies=LEASE_POLICIES,
            args=["--redis-url", f"redis://127.0.0.1:{port}/0"],
        )
        yield server
        code = server.stop()
        assert code == 0, f"ratelimitd exited {code} on SIGTERM; its log:\n{server.log.read_text()}"
    finally:
        stop_redis(redis)


def _redis_answers(port: int, redis: subprocess.Popen) -> bool:
    assert redis.poll() is None, f"redis-server exited {redis.returncode}"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"not within {timeout} s: {what}"
        time.sleep(0.002)


async def await_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.002)


def look(address: str, key: str, policy: str) -> int:
    """What the server says is left (a check that spends nothing, no lease)."""
    with Client(address, deadline=DEADLINE, leases=False) as client:
        return client.check(key, policy=policy, cost=0).remaining


def lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ratelimitd-leases"]


class Checks:
    """Checks in order, each with whether it was decided locally."""

    def __init__(self) -> None:
        self.decisions = []
        self.local = []

    def add(self, decision, local_before: int, local_after: int) -> None:
        self.decisions.append(decision)
        self.local.append(local_after > local_before)


def assert_hot_policy_decided_within_its_limit(checks: Checks, stats: dict, server_left: int) -> None:
    """2000 checks of `hot` (500 per 60 s) on a fresh key."""
    decisions = checks.decisions
    allowed = sum(d.allowed for d in decisions)
    assert 450 <= allowed <= 500, f"{allowed} allowed"
    # What the server has left, with what this client admitted, is within
    # the limit: no unit was admitted twice.
    assert allowed + server_left <= 500, (allowed, server_left)
    # Most were decided in-process, with no call.
    local = stats["local_allowed"] + stats["local_denied"]
    assert local >= 1500, stats
    assert local == sum(checks.local)
    assert stats["asks"] >= 1 and stats["grants"] >= 1 and stats["errors"] == 0, stats
    assert local + stats["fallbacks"] <= 2000
    # Every decision, local or not, is one CheckLimit could have given.
    for decision in decisions:
        assert decision.limit == 500 and not decision.degraded and not decision.cost_exceeds_limit
        assert [s.name for s in decision.limits] == ["60s"] and decision.most_restrictive == 0
        assert decision.limits[0].remaining == decision.remaining
        assert 0 < decision.reset_after_ms <= 60_000
        if decision.allowed:
            assert decision.retry_after_ms == 0 and decision.remaining >= 0
        else:
            assert decision.remaining == 0 and 0 < decision.retry_after_ms <= 60_000, decision
    assert_remaining_never_increases(checks)


def assert_remaining_never_increases(checks: Checks) -> None:
    """Allowed decisions' `remaining` goes down as units are spent. One
    exception: a CheckLimit answered while a grant was on its way counts the
    units the server has already spent for that grant as gone, and the next
    decision, from the grant, counts them as the client's."""
    allowed = [
        (d.remaining, local) for d, local in zip(checks.decisions, checks.local, strict=True) if d.allowed
    ]
    for i, ((before, _), (after, local)) in enumerate(zip(allowed, allowed[1:], strict=False)):
        if after > before:
            assert local and not allowed[i][1], f"remaining rose from {before} to {after} at check {i + 1}"
    spent_locally = [r for r, local in allowed if local]
    assert spent_locally == sorted(spent_locally, reverse=True)
    assert len(set(spent_locally)) == len(spent_locally), "two local decisions left the same remaining"


def test_a_hot_policy_is_decided_locally_never_over_its_limit(lease_server, key):
    checks = Checks()
    with Client(lease_server.address, deadline=DEADLINE) as client:
        assert client.leases
        for _ in range(2000):
            before = client.lease_stats()["local_allowed"] + client.lease_stats()["local_denied"]
            decision = client.check(key, policy="hot")
            stats = client.lease_stats()
            checks.add(decision, before, stats["local_allowed"] + stats["local_denied"])
        stats = client.lease_stats()
    assert_hot_policy_decided_within_its_limit(checks, stats, look(lease_server.address, key, "hot"))


async def test_a_hot_policy_is_decided_locally_never_over_its_limit_async(lease_server, key):
    checks = Checks()
    async with AsyncClient(lease_server.address, deadline=DEADLINE) as client:
        assert client.leases
        for _ in range(2000):
            before = client.lease_stats()["local_allowed"] + client.lease_stats()["local_denied"]
            decision = await client.check(key, policy="hot")
            stats = client.lease_stats()
            checks.add(decision, before, stats["local_allowed"] + stats["local_denied"])
        stats = client.lease_stats()
    assert_hot_policy_decided_within_its_limit(checks, stats, look(lease_server.address, key, "hot"))


async def test_concurrent_async_checks_never_exceed_the_limit(lease_server, key):
    async with AsyncClient(lease_server.address, deadline=DEADLINE) as client:
        decisions = []
        for _ in range(2):
            decisions += await asyncio.gather(*(client.check(key, policy="hot") for _ in range(500)))
        # The limit is spent. How soon the client hears so on its stream
        # depends on the machine's load: one check at a time until a check
        # is denied locally. From then on, until the window ends, every check
        # is: concurrent checks make no calls.
        give_up = time.monotonic() + WAIT
        while True:
            denied_before = client.lease_stats()["local_denied"]
            decisions.append(await client.check(key, policy="hot"))
            if client.lease_stats()["local_denied"] > denied_before:
                break
            assert time.monotonic() < give_up, f"no check denied locally within {WAIT} s: {client.lease_stats()}"
        local_before = client.lease_stats()
        for _ in range(2):
            decisions += await asyncio.gather(*(client.check(key, policy="hot") for _ in range(500)))
        stats = client.lease_stats()
    allowed = sum(d.allowed for d in decisions)
    assert 450 <= allowed <= 500, (allowed, stats)
    assert allowed + look(lease_server.address, key, "hot") <= 500
    assert stats["local_denied"] - local_before["local_denied"] == 1000, (local_before, stats)
    assert stats["fallbacks"] == local_before["fallbacks"], (local_before, stats)


def test_threads_sharing_a_client_never_exceed_the_limit(lease_server, key):
    results: list[bool] = []
    with Client(lease_server.address, deadline=DEADLINE) as client:

        def hammer() -> None:
            mine = [client.check(key, policy="hot").allowed for _ in range(400)]
            results.extend(mine)

        threads = [threading.Thread(target=hammer) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = client.lease_stats()
    allowed = sum(results)
    assert len(results) == 2000 and 450 <= allowed <= 500, allowed
    assert allowed + look(lease_server.address, key, "hot") <= 500
    assert stats["local_allowed"] + stats["local_denied"] >= 1000, stats


def test_clients_sharing_a_key_never_exceed_the_limit_together(lease_server, key):
    # Two processes' clients, one stream each: the server shares the
    # policy's rate between them, and spends every unit it grants.
    allowed = [0, 0]
    stats = [{}, {}]

    def run(i: int) -> None:
        with Client(lease_server.address, deadline=DEADLINE) as client:
            allowed[i] = sum(client.check(key, policy="hot").allowed for _ in range(1500))
            stats[i] = client.lease_stats()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(allowed) + look(lease_server.address, key, "hot") <= 500, (allowed, stats)
    assert sum(allowed) >= 250, (allowed, stats)
    assert all(s["local_allowed"] > 0 and s["errors"] == 0 for s in stats), stats


def test_a_policy_of_several_limits_reports_the_most_restrictive(lease_server, key):
    checks = Checks()
    with Client(lease_server.address, deadline=DEADLINE) as client:
        for _ in range(300):
            before = client.lease_stats()["local_allowed"]
            decision = client.check(key, policy="two")
            checks.add(decision, before, client.lease_stats()["local_allowed"])
    assert any(checks.local), "no check was decided locally"
    for decision in checks.decisions:
        assert decision.allowed
        assert [s.name for s in decision.limits] == ["burst", "minute"]
        # The minute's 500 run out before the hour's bucket of 5000.
        assert decision.most_restrictive == 1
        assert (decision.limit, decision.remaining) == (500, decision.limits[1].remaining)
        assert decision.limits[0].remaining > decision.limits[1].remaining
        assert decision.limits[0].limit == 5000
    assert_remaining_never_increases(checks)
    assert checks.decisions[-1].remaining >= 500 - 300 - 50  # 50: units held, unspent


def test_a_leased_decision_is_a_decision_like_any_other(lease_server, key):
    with Client(lease_server.address, deadline=DEADLINE) as client:
        for _ in range(100):
            client.check(key, policy="two")
        wait_for(lambda: client.lease_stats()["held"] > 0, "units held")
        local = client.lease_stats()["local_allowed"]
        leased = client.check(key, policy="two")
        assert client.lease_stats()["local_allowed"] == local + 1
    # Every field there, none more, frozen: as its constructor makes it.
    for made in (leased, *leased.limits):
        cls = type(made)
        rebuilt = cls(**{f.name: getattr(made, f.name) for f in dataclasses.fields(cls)})
        assert vars(made) == vars(rebuilt)
        assert made == rebuilt and hash(made) == hash(rebuilt) and repr(made) == repr(rebuilt)
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.remaining = 0
    assert isinstance(leased, Decision) and all(isinstance(s, LimitStatus) for s in leased.limits)


def test_leases_off_every_check_is_a_check_limit(lease_server, key):
    with Client(lease_server.address, deadline=DEADLINE, leases=False) as client:
        assert not client.leases
        decisions = [client.check(key, policy="hot") for _ in range(100)]
        assert all(v == 0 for v in client.lease_stats().values()), client.lease_stats()
    # Each check spent one unit at the server, and nothing more was spent.
    assert [d.remaining for d in decisions] == list(range(499, 399, -1))
    assert look(lease_server.address, key, "hot") == 400
    assert not lease_threads()


def test_leases_on_spend_ahead_at_the_server(lease_server, key):
    # The contrast with the test above: a lease's units are spent at the
    # server when granted, before the client admits them.
    with Client(lease_server.address, deadline=DEADLINE) as client:
        for _ in range(100):
            client.check(key, policy="hot")
        wait_for(lambda: client.lease_stats()["grants"] >= 1, "a grant")
        held = client.lease_stats()["held"]
        assert held > 0
        assert look(lease_server.address, key, "hot") < 400


@pytest.mark.parametrize("value", ["off", "0", "false", "OFF"])
async def test_leases_off_from_the_environment(lease_server, key, monkeypatch, value):
    monkeypatch.setenv("RATELIMITD_LEASES", value)
    with Client(lease_server.address, deadline=DEADLINE) as client:
        assert not client.leases
        assert [client.check(key, policy="hot").remaining for _ in range(30)] == list(range(499, 469, -1))
    async with AsyncClient(lease_server.address, deadline=DEADLINE) as aclient:
        assert not aclient.leases
        assert [(await aclient.check(key, policy="hot")).remaining for _ in range(30)] == list(
            range(469, 439, -1)
        )
        assert aclient.lease_stats()["asks"] == 0
    # An argument wins over the environment.
    with Client(lease_server.address, leases=True) as client:
        assert client.leases
    monkeypatch.setenv("RATELIMITD_LEASES", "on")
    with Client(lease_server.address) as client:
        assert client.leases
    assert AsyncClient(lease_server.address).leases  # no channel before a check


@pytest.mark.parametrize(
    ("arguments", "env", "message"),
    [
        ({"leases": "no"}, None, "leases must be True, False or None"),
        ({}, "maybe", "RATELIMITD_LEASES must be on, off, 1, 0, true or false"),
        ({"lease_threshold": 0}, None, "lease_threshold must be finite and positive"),
        ({"lease_threshold": float("inf")}, None, "lease_threshold must be finite and positive"),
        ({"lease_threshold": "20"}, None, "lease_threshold must be a number"),
    ],
)
def test_bad_lease_options_are_errors(monkeypatch, arguments, env, message):
    if env is not None:
        monkeypatch.setenv("RATELIMITD_LEASES", env)
    with pytest.raises(ValueError, match=message):
        Client("127.0.0.1:1", **arguments)
    with pytest.raises(ValueError, match=message):
        AsyncClient("127.0.0.1:1", **arguments)


def test_a_pair_leases_from_its_threshold(lease_server, key):
    with Client(lease_server.address, deadline=DEADLINE, lease_threshold=10) as client:
        started = time.monotonic()
        for _ in range(9):
            client.check(key, policy="hot")
        assert client.lease_stats()["asks"] == 0 and not lease_threads()
        client.check(key, policy="hot")  # the 10th
        took = time.monotonic() - started
        assert took < 1.0, f"10 checks took {took:.2f} s: the test needs them within a second"
        wait_for(lambda: client.lease_stats()["asks"] == 1, "the first ask")
        # Another policy on the key, another pair: cold until hot.
        client.check(key, policy="bucket")
        assert client.lease_stats()["asks"] == 1


def test_a_policy_that_is_not_leasable_keeps_working_per_request(lease_server, key):
    with Client(lease_server.address, deadline=DEADLINE) as client:
        first = [client.check(key, policy="cold") for _ in range(100)]
        # The one ask was refused: the policy is never asked for again.
        wait_for(lambda: client.lease_stats()["errors"] == 1, "the refusal")
        rest = [client.check(key, policy="cold") for _ in range(100)]
        stats = client.lease_stats()
    assert [d.remaining for d in first + rest] == list(range(499, 299, -1))
    assert stats["asks"] == 1 and stats["grants"] == 0
    assert stats["local_allowed"] == stats["local_denied"] == 0
    assert look(lease_server.address, key, "cold") == 300


def test_a_lease_refused_for_now_is_asked_again_later(tmp_path, key):
    # One lease per stream: a second hot key is refused RESOURCE_EXHAUSTED,
    # decided by CheckLimit meanwhile, and leased once the first is let go.
    server = start_ratelimitd(tmp_path, policies=LEASE_POLICIES, args=["--lease-max-per-stream", "1"])
    try:
        with Client(server.address, deadline=DEADLINE) as client:
            first = [client.check(f"{key}:1", policy="hot") for _ in range(50)]
            wait_for(lambda: client.lease_stats()["grants"] >= 1, "the first key's lease")
            second = [client.check(f"{key}:2", policy="hot") for _ in range(50)]
            wait_for(lambda: client.lease_stats()["errors"] >= 1, "the second key refused")
            local = client.lease_stats()["local_allowed"]
            more = [client.check(f"{key}:2", policy="hot") for _ in range(50)]
            # Per request: each spent one unit at the server.
            assert client.lease_stats()["local_allowed"] == local
            assert all(d.allowed for d in first + second + more)
            assert look(server.address, f"{key}:2", "hot") == 400
            # Once the first key is idle and given back, the second is
            # leased: the refusal was for now, not for the policy.
            wait_for(lambda: client.lease_stats()["releases"] >= 1, "the first key released", timeout=10)

            def leased() -> bool:
                client.check(f"{key}:2", policy="hot")
                return client.lease_stats()["local_allowed"] > local

            wait_for(leased, "the second key's lease")
    finally:
        assert server.stop() == 0


def test_close_gives_back_the_units_held(redis_lease_server, key):
    lease_server = redis_lease_server
    client = Client(lease_server.address, deadline=DEADLINE)
    for _ in range(100):
        client.check(key, policy="bucket")
    wait_for(lambda: client.lease_stats()["held"] > 0, "units held")
    wait_for(lambda: client.lease_stats()["asks"] == client.lease_stats()["grants"], "no ask in flight")
    held = client.lease_stats()["held"]
    while_held = look(lease_server.address, key, "bucket")
    assert while_held <= 1000 - 100 - held + 2  # 2: what refills during the test
    client.close()
    assert client.lease_stats()["releases"] == 1
    assert not lease_threads()
    # A token bucket takes given-back units back.
    after = look(lease_server.address, key, "bucket")
    assert 1000 - 100 - 1 <= after <= 1000 - 100 + 2, (while_held, held, after)


async def test_closing_an_async_client_gives_back_the_units_held(redis_lease_server, key):
    address = redis_lease_server.address
    client = AsyncClient(address, deadline=DEADLINE)
    for _ in range(100):
        await client.check(key, policy="bucket")
    await await_for(lambda: client.lease_stats()["held"] > 0, "units held")
    await client.close()
    stats = client.lease_stats()
    assert stats["releases"] == 1 and stats["held"] == 0, stats
    assert 1000 - 100 - 1 <= look(address, key, "bucket") <= 1000 - 100 + 2
    # The client may be used again, and leases again.
    give_up = time.monotonic() + WAIT
    while client.lease_stats()["local_allowed"] == stats["local_allowed"]:
        assert time.monotonic() < give_up, f"no new lease within {WAIT} s"
        await client.check(key, policy="bucket")
    await client.close()


def test_an_idle_pair_gives_its_units_back(redis_lease_server, key):
    lease_server = redis_lease_server
    with Client(lease_server.address, deadline=DEADLINE) as client:
        for _ in range(100):
            client.check(key, policy="bucket")
        wait_for(lambda: client.lease_stats()["held"] > 0, "units held")
        assert lease_threads()
        # Not checked for 5 s: released, and with nothing left to lease the
        # stream and its thread end.
        wait_for(lambda: client.lease_stats()["releases"] == 1, "the release", timeout=10)
        wait_for(lambda: not lease_threads(), "the lease thread to end")
        assert client.lease_stats()["held"] == 0
    after = look(lease_server.address, key, "bucket")
    assert 1000 - 100 - 1 <= after <= 1000 - 100 + 3, after


def test_a_broken_stream_is_survived_and_reopened(tmp_path, key):
    server = start_ratelimitd(tmp_path, policies=LEASE_POLICIES)
    port = int(server.address.rsplit(":", 1)[1])
    try:
        with Client(server.address, deadline=DEADLINE) as client:
            for _ in range(100):
                client.check(key, policy="bucket")
            wait_for(lambda: client.lease_stats()["held"] > 0, "units held")
            server.process.kill()  # no goodbye: the stream breaks
            server.process.wait()
            # The units held are still spent locally; then CheckLimit fails.
            local = client.lease_stats()["local_allowed"]
            assert client.check(key, policy="bucket").allowed
            assert client.lease_stats()["local_allowed"] == local + 1
            with pytest.raises(RatelimitdError) as failed:
                for _ in range(2000):
                    client.check(key, policy="bucket")
            assert failed.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert client.lease_stats()["held"] == 0

            server = start_ratelimitd(tmp_path, port=port, policies=LEASE_POLICIES)
            # Checks go through CheckLimit again, the stream is reopened,
            # and the pair is decided locally again.
            local = client.lease_stats()["local_allowed"]

            def leased_again() -> bool:
                try:
                    client.check(key, policy="bucket")
                except RatelimitdError:  # the channel has not reconnected yet
                    return False
                return client.lease_stats()["local_allowed"] > local

            wait_for(leased_again, "a lease on the new stream")
            assert client.lease_stats()["streams"] >= 2
            # The new stream's server was not told of what the old one granted.
            assert client.lease_stats()["errors"] == 0
    finally:
        assert server.stop() in (0, -9)


# Checkers of a killed server's client, each checking this often a second.
KILLED_CHECKERS = 3
KILLED_RATE = 100.0
# Longer than the test's bound on a check: a check that waited for its
# deadline fails the test rather than passing as a failure.
KILLED_DEADLINE = 5.0
# The longest a check may take once the server is dead: refused
# connections on loopback fail in well under a millisecond.
ANSWER_WITHIN = 1.0
# `second`'s leases last half a second from their ask, and a tenth for
# scheduling on a loaded machine.
LEASE_LAPSES = 0.6


class Outcomes:
    """Each check of a killed server's client: its checker, when it was
    asked and answered, and how (allowed, denied, or the error's code)."""

    def __init__(self) -> None:
        self.checks: list[tuple[int, float, float, str]] = []
        self.killed = math.inf

    def record(self, checker: int, asked: float, outcome: str) -> None:
        self.checks.append((checker, asked, time.monotonic(), outcome))

    def failed_after_kill(self, checker: int) -> int:
        return sum(
            1
            for c, asked, _, outcome in list(self.checks)
            if c == checker and asked > self.killed and outcome not in ("allowed", "denied")
        )

    def every_checker_failed(self) -> bool:
        """Each checker has seen its checks fail since the kill: none is stuck."""
        return all(self.failed_after_kill(c) >= 20 for c in range(KILLED_CHECKERS))

    def assert_answered_throughout(self) -> None:
        after = [(asked, done, outcome) for _, asked, done, outcome in self.checks if asked > self.killed]
        slowest = max(answered - asked for asked, answered, _ in after)
        assert slowest < ANSWER_WITHIN, f"a check took {slowest:.2f} s once the server was dead"
        outcomes = {outcome for _, _, outcome in after}
        assert outcomes <= {"allowed", "UNAVAILABLE"}, outcomes
        late = [
            asked - self.killed
            for asked, _, outcome in after
            if outcome == "allowed" and asked > self.killed + LEASE_LAPSES
        ]
        assert not late, f"allowed {len(late)} checks after the units held had lapsed: {late[:5]}"


def outcome_of(check: Callable[[], object]) -> str:
    try:
        return "allowed" if check().allowed else "denied"
    except RatelimitdError as err:
        return err.code.name


def test_a_killed_server_leaves_every_check_answering(tmp_path, key):
    server = start_ratelimitd(tmp_path, policies=LEASE_POLICIES)
    outcomes = Outcomes()
    stop = threading.Event()
    try:
        with Client(server.address, deadline=KILLED_DEADLINE) as client:

            def checker(n: int) -> None:
                while not stop.is_set():
                    asked = time.monotonic()
                    outcomes.record(n, asked, outcome_of(lambda: client.check(key, policy="second")))
                    stop.wait(1 / KILLED_RATE)

            threads = [threading.Thread(target=checker, args=(n,)) for n in range(KILLED_CHECKERS)]
            for thread in threads:
                thread.start()
            try:
                wait_for(lambda: client.lease_stats()["held"] > 0, "units held")
                server.process.kill()  # no goodbye: the stream breaks mid-lease
                server.process.wait()
                outcomes.killed = time.monotonic()
                wait_for(outcomes.every_checker_failed, "every checker's checks failing")
            finally:
                stop.set()
                for thread in threads:
                    thread.join(KILLED_DEADLINE * 2)
            assert not any(thread.is_alive() for thread in threads), "a check never returned"
            assert client.lease_stats()["local_allowed"] > 0
        outcomes.assert_answered_throughout()
    finally:
        assert server.stop() in (0, -9)


async def test_a_killed_server_leaves_every_async_check_answering(tmp_path, key):
    server = start_ratelimitd(tmp_path, policies=LEASE_POLICIES)
    outcomes = Outcomes()
    client = AsyncClient(server.address, deadline=KILLED_DEADLINE)
    stop = asyncio.Event()

    async def checker(n: int) -> None:
        while not stop.is_set():
            asked = time.monotonic()
            try:
                decision = await client.check(key, policy="second")
                outcome = "allowed" if decision.allowed else "denied"
            except RatelimitdError as err:
                outcome = err.code.name
            outcomes.record(n, asked, outcome)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1 / KILLED_RATE)

    tasks = [asyncio.create_task(checker(n)) for n in range(KILLED_CHECKERS)]
    try:
        await await_for(lambda: client.lease_stats()["held"] > 0, "units held")
        server.process.kill()
        server.process.wait()
        outcomes.killed = time.monotonic()
        await await_for(outcomes.every_checker_failed, "every checker's checks failing")
        stop.set()
        _, stuck = await asyncio.wait(tasks, timeout=KILLED_DEADLINE * 2)
        assert not stuck, "a check never returned"
        assert client.lease_stats()["local_allowed"] > 0
        outcomes.assert_answered_throughout()
    finally:
        for task in tasks:
            task.cancel()
        await client.close()
        assert server.stop() in (0, -9)


def test_a_store_outage_leaves_the_checks_to_the_failure_policy(tmp_path, key):
    port, redis = start_redis(tmp_path)
    server = start_ratelimitd(
        tmp_path,
        policies=LEASE_POLICIES,
        args=["--redis-url", f"redis://127.0.0.1:{port}/0", "--failure-policy", "fail-open"],
    )
    try:
        with Client(server.address, deadline=DEADLINE) as client:
            for _ in range(100):
                client.check(key, policy="bucket")
            wait_for(lambda: client.lease_stats()["held"] > 0, "units held")
            stop_redis(redis)
            # The units held are spent; then the asks are refused for now
            # (UNAVAILABLE: the policy stays leasable) and CheckLimit answers
            # by the server's failure policy.
            degraded = []

            def refused_for_now() -> bool:
                degraded.append(client.check(key, policy="bucket").degraded)
                return client.lease_stats()["errors"] >= 1 and client.lease_stats()["held"] == 0

            wait_for(refused_for_now, "an ask refused while Redis is down")
            assert degraded[0] is False  # from the units held
            assert client.check(key, policy="bucket").degraded  # by CheckLimit's failure policy

            _, redis = start_redis(tmp_path, port)
            local = client.lease_stats()["local_allowed"]

            def leased_again() -> bool:
                client.check(key, policy="bucket")
                return client.lease_stats()["local_allowed"] > local

            wait_for(leased_again, "a lease once Redis is back")
            assert client.lease_stats()["streams"] == 1
    finally:
        assert server.stop() == 0
        stop_redis(redis)


def test_one_async_client_leases_in_successive_event_loops(lease_server, key):
    client = AsyncClient(lease_server.address, deadline=DEADLINE)

    async def burst(key: str) -> dict:
        for _ in range(300):
            await client.check(key, policy="hot")
        return client.lease_stats()

    # As under pytest, or a TestClient per test: each asyncio.run is a new
    # loop, whose end cancels the stream's task.
    first = asyncio.run(burst(f"{key}:1"))
    second = asyncio.run(burst(f"{key}:2"))
    assert first["local_allowed"] > 100
    assert second["local_allowed"] - first["local_allowed"] > 100
    assert second["streams"] >= 2
    asyncio.run(client.close())


async def test_the_middleware_headers_on_a_leased_policy(lease_server, key):
    client = AsyncClient(lease_server.address, deadline=DEADLINE)
    limiter = Limiter(lambda request: key, client=client)

    @limiter.limit(policy="hot")
    async def hello(request):
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    transport = httpx.ASGITransport(app=app)
    responses, local = [], []
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        for _ in range(600):
            before = client.lease_stats()["local_allowed"] + client.lease_stats()["local_denied"]
            responses.append(await http.get("/"))
            stats = client.lease_stats()
            local.append(stats["local_allowed"] + stats["local_denied"] > before)
    await client.close()

    codes = [r.status_code for r in responses]
    assert 450 <= codes.count(200) <= 500 and codes.count(200) + codes.count(429) == 600
    # Once denied locally, denied. A 429 before a 200 can only be CheckLimit's
    # while a renewal was on its way, having spent what was left for it.
    first_local_429 = next(
        i for i, (code, was_local) in enumerate(zip(codes, local, strict=True)) if code == 429 and was_local
    )
    assert set(codes[first_local_429:]) == {429}
    early_429s = [i for i, c in enumerate(codes[:first_local_429]) if c == 429]
    assert not any(local[i] for i in early_429s) and len(early_429s) <= stats["asks"], early_429s
    assert sum(local) >= 400, stats
    assert limiter.stats.as_dict() == {
        "decided": 600,
        "denied": codes.count(429),
        "fail_open": 0,
        "fail_closed": 0,
    }
    remaining = []
    for response, was_local in zip(responses, local, strict=True):
        # A policy's header has no `w` (the windows are in the server's
        # file); the id is the limit's name, its `per`.
        assert response.headers["RateLimit-Policy"] == '"60s";q=500'
        item, r, t = response.headers["RateLimit"].split(";")
        assert item == '"60s"' and 1 <= int(t.removeprefix("t=")) <= 60
        remaining.append((int(r.removeprefix("r=")), was_local))
        assert "RateLimit-Degraded" not in response.headers
        if response.status_code == 429:
            assert r == "r=0" and 1 <= int(response.headers["Retry-After"]) <= 60
        else:
            assert "Retry-After" not in response.headers
    # As for the client: no rise, but from a CheckLimit answered while a
    # grant was on its way to the decision made from that grant.
    for i, ((before, _), (after, was_local)) in enumerate(zip(remaining, remaining[1:], strict=False)):
        assert after <= before or (was_local and not remaining[i][1]), (i, before, after)


def test_the_middleware_takes_the_lease_options(lease_server, monkeypatch):
    monkeypatch.delenv("RATELIMITD_LEASES", raising=False)
    assert Limiter(address=lease_server.address).client.leases
    assert not Limiter(address=lease_server.address, leases=False).client.leases
    limiter = Limiter(address=lease_server.address, lease_threshold=5)
    assert limiter.client.leases and limiter.client._book.threshold == 5
    middleware = RateLimitMiddleware(ok, policy="hot", address=lease_server.address, leases=False)
    assert not middleware.limiter.client.leases
    with pytest.raises(ValueError, match="give them to the AsyncClient"):
        Limiter(client=AsyncClient(lease_server.address), leases=False)
    monkeypatch.setenv("RATELIMITD_LEASES", "off")
    assert not Limiter(address=lease_server.address).client.leases


async def ok(request):
    return PlainTextResponse("ok")
