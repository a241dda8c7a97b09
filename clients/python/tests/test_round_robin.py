"""The README's Kubernetes setting ("In Kubernetes: every pod, not one"):
with the round_robin service config in `options`, a client spreads its
calls over every address its target names, and without it sends them all
to one. Two instances on one port, at 127.0.0.1 and 127.0.0.2, stand for
two pods behind a headless Service; each decides on its own embedded
store, so a limit of 3 admits 3 at each instance a client reaches. The
target lists both addresses (`ipv4:`) where a Kubernetes client names the
Service (`dns:///`): both resolve to a list of addresses for the same
policy."""

from __future__ import annotations

import json
import time

import pytest

from conftest import start_ratelimitd
from ratelimitd_client import AsyncClient, Client

ROUND_ROBIN = [("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]}))]


@pytest.fixture(scope="module")
def two_pods(tmp_path_factory):
    first = start_ratelimitd(tmp_path_factory.mktemp("pod-a"))
    port = int(first.address.rsplit(":", 1)[1])
    second = start_ratelimitd(tmp_path_factory.mktemp("pod-b"), port, host="127.0.0.2")
    # The target as gRPC writes a list of addresses; its authority is a
    # Service's name, as it would be with dns:///.
    target = f"ipv4:127.0.0.1:{port},127.0.0.2:{port}"
    authority = [("grpc.default_authority", f"ratelimitd-headless.tests.svc:{port}")]
    yield target, authority
    for server in (first, second):
        assert server.stop() == 0, server.log.read_text()


# Round robin spreads calls over the addresses whose connections are
# ready: the second may still be connecting when the first calls go out.
# So calls go on until `wanted` are admitted (or a deadline passes), and
# then some more, which must all be denied.
DEADLINE_S = 5.0
MORE_CALLS = 10


def admitted(client: Client, key: str, wanted: int) -> int:
    allowed = 0
    deadline = time.monotonic() + DEADLINE_S
    while allowed < wanted and time.monotonic() < deadline:
        allowed += client.check(key, limit=3, window_ms=3_600_000).allowed
    return allowed + sum(
        client.check(key, limit=3, window_ms=3_600_000).allowed for _ in range(MORE_CALLS)
    )


def test_round_robin_reaches_every_pod(two_pods, key):
    target, authority = two_pods
    with Client(target, options=ROUND_ROBIN + authority) as client:
        assert admitted(client, key, 6) == 6


def test_without_it_one_pod_takes_every_call(two_pods, key):
    target, authority = two_pods
    with Client(target, options=authority) as client:
        # Once 3 are admitted, the calls after them all reach the same pod.
        assert admitted(client, key, 3) == 3


async def test_the_async_client_takes_the_same_options(two_pods, key):
    target, authority = two_pods
    async with AsyncClient(target, options=ROUND_ROBIN + authority) as client:
        allowed = 0
        deadline = time.monotonic() + DEADLINE_S
        while allowed < 6 and time.monotonic() < deadline:
            allowed += (await client.check(key, limit=3, window_ms=3_600_000)).allowed
        for _ in range(MORE_CALLS):
            allowed += (await client.check(key, limit=3, window_ms=3_600_000)).allowed
    assert allowed == 6
