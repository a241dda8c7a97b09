"""Failed calls: a RatelimitdError carrying the gRPC status code."""

import socket
import time

import grpc
import pytest

from ratelimitd_client import AsyncClient, Client, RatelimitdError
from ratelimitd_client import _client as client_module
from ratelimitd_client._pb import ratelimit_pb2

from conftest import start_ratelimitd

FIXED = {"limit": 5, "window_ms": 1000}
DOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_no_server_is_unavailable(dead_address):
    with Client(dead_address, deadline=1.0) as client, pytest.raises(RatelimitdError) as raised:
        client.check("k", **FIXED)
    assert raised.value.code in DOWN
    assert raised.value.code.name in str(raised.value)


async def test_no_server_is_unavailable_async(dead_address):
    async with AsyncClient(dead_address, deadline=1.0) as client:
        with pytest.raises(RatelimitdError) as raised:
            await client.check("k", **FIXED)
    assert raised.value.code in DOWN


@pytest.fixture
def silent_address():
    """A port that takes TCP connections and never says anything."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def test_a_silent_server_runs_out_the_deadline(silent_address):
    with Client(silent_address, deadline=0.2) as client:
        started = time.monotonic()
        with pytest.raises(RatelimitdError) as raised:
            client.check("k", **FIXED)
        took = time.monotonic() - started
    assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.15 < took < 2


async def test_a_silent_server_runs_out_the_deadline_async(silent_address):
    async with AsyncClient(silent_address) as client:
        with pytest.raises(RatelimitdError) as raised:
            await client.check("k", **FIXED, deadline=0.2)
    assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_server_refusal_keeps_its_code_and_message(client, monkeypatch):
    # The clients check everything the server would; send what they never would.
    monkeypatch.setattr(
        client_module, "build_request", lambda key, **_: ratelimit_pb2.CheckLimitRequest(key=key)
    )
    with pytest.raises(RatelimitdError) as raised:
        client.check("k", **FIXED)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "algorithm" in raised.value.details


def test_the_client_recovers_when_ratelimitd_comes_back(tmp_path, key):
    server = start_ratelimitd(tmp_path)
    port = int(server.address.rsplit(":", 1)[1])
    with Client(server.address, deadline=1.0) as client:
        assert client.check(key, **FIXED).allowed
        assert server.stop() == 0
        with pytest.raises(RatelimitdError) as raised:
            client.check(key, **FIXED)
        assert raised.value.code in DOWN
        server = start_ratelimitd(tmp_path, port=port)
        try:
            # Reconnect backoff is capped at 2 s (DEFAULT_CHANNEL_OPTIONS).
            give_up = time.monotonic() + 5
            while True:
                try:
                    assert client.check(key, **FIXED).allowed
                    break
                except RatelimitdError:
                    assert time.monotonic() < give_up, "the client did not reconnect within 5 s"
                    time.sleep(0.05)
        finally:
            server.stop()
