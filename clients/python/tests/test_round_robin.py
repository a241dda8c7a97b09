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


def admitted(client: Client, key: str) -> int:
    return sum(client.check(key, limit=3, window_ms=3_600_000).allowed for _ in range(10))


def test_round_robin_reaches_every_pod(two_pods, key):
    target, authority = two_pods
    with Client(target, options=ROUND_ROBIN + authority) as client:
        assert admitted(client, key) == 6


def test_without_it_one_pod_takes_every_call(two_pods, key):
    target, authority = two_pods
    with Client(target, options=authority) as client:
        assert admitted(client, key) == 3


async def test_the_async_client_takes_the_same_options(two_pods, key):
    target, authority = two_pods
    async with AsyncClient(target, options=ROUND_ROBIN + authority) as client:
        decisions = [await client.check(key, limit=3, window_ms=3_600_000) for _ in range(10)]
    assert sum(d.allowed for d in decisions) == 6
