"""Failing open is visible: with ratelimitd stopped (or silent, or its Redis
down), a request let through carries `RateLimit-Degraded`, the
`on_degraded` hook is called, and `limiter.stats` counts it; "deny" answers
503 and counts `fail_closed`."""

import logging
import socket

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client import DEFAULT_DEADLINE, RatelimitdError, ip_key
from ratelimitd_client.asgi import Degraded, Limiter, RateLimitMiddleware

from conftest import free_port, start_ratelimitd


def http(app, peer):
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=peer), base_url="http://testserver"
    )


def limited_app(limiter, rule="5/10 seconds"):
    @limiter.limit(rule)
    async def limited(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", limited)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    return app


def test_the_default_deadline_is_three_times_the_servers_redis_timeout():
    assert DEFAULT_DEADLINE == 0.3
    assert Limiter().client.deadline == 0.3


async def test_a_stopped_server_fails_open_visibly(tmp_path, peer, caplog):
    server = start_ratelimitd(tmp_path)
    calls = []

    async def on_degraded(request, info):
        calls.append((request.url.path, info))

    limiter = Limiter(address=server.address, deadline=1.0, on_degraded=on_degraded)
    denying = Limiter(address=server.address, deadline=1.0, on_service_error="deny")
    app, closed = limited_app(limiter), limited_app(denying)
    try:
        async with http(app, peer) as client:
            before = await client.get("/")
    finally:
        assert server.stop() == 0
    assert before.status_code == 200 and "RateLimit-Degraded" not in before.headers
    assert calls == []

    with caplog.at_level(logging.WARNING, logger="ratelimitd_client.asgi"):
        async with http(app, peer) as client:
            after = [await client.get("/") for _ in range(3)]
        async with http(closed, peer) as client:
            refused = await client.get("/")

    assert [(r.status_code, r.text) for r in after] == [(200, "ok")] * 3
    assert {r.headers["RateLimit-Degraded"] for r in after} == {"unavailable"}
    assert "RateLimit" not in after[0].headers
    assert [path for path, _ in calls] == ["/"] * 3
    info = calls[0][1]
    assert isinstance(info, Degraded) and info.reason == "unavailable"
    assert isinstance(info.error, RatelimitdError) and info.decision is None
    assert info.key == f"rl-b45cbbb3:{ip_key(peer[0])}"
    assert limiter.stats.as_dict() == {"decided": 1, "denied": 0, "fail_open": 3, "fail_closed": 0}

    assert refused.status_code == 503 and refused.json() == {"error": "Rate limiter unavailable"}
    assert "RateLimit-Degraded" not in refused.headers
    assert denying.stats.as_dict() == {"decided": 0, "denied": 0, "fail_open": 0, "fail_closed": 1}
    # The warning, once per limiter, not once per request.
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "allowing" in warnings[0] and "refusing with 503" in warnings[1]


@pytest.fixture
def silent_address():
    """A port that takes TCP connections and never says anything."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


async def test_a_silent_server_is_a_timeout(silent_address, peer):
    reasons = []
    limiter = Limiter(
        address=silent_address, deadline=0.2, on_degraded=lambda request, info: reasons.append(info.reason)
    )
    async with http(limited_app(limiter), peer) as client:
        response = await client.get("/")
    assert response.status_code == 200 and response.headers["RateLimit-Degraded"] == "timeout"
    assert reasons == ["timeout"] and limiter.stats.fail_open == 1


async def test_a_hook_that_raises_does_not_fail_the_request(dead_address, peer, caplog):
    def broken(request, info):
        raise RuntimeError("exporter down")

    limiter = Limiter(address=dead_address, deadline=1.0, on_degraded=broken)
    with caplog.at_level(logging.ERROR, logger="ratelimitd_client.asgi"):
        async with http(limited_app(limiter), peer) as client:
            response = await client.get("/")
    assert response.status_code == 200 and response.headers["RateLimit-Degraded"] == "unavailable"
    assert any("on_degraded raised" in r.getMessage() for r in caplog.records)


async def test_the_servers_own_failure_policy_is_store(tmp_path, peer):
    # A ratelimitd whose Redis is down answers through its failure policy,
    # marked degraded: the request passes with the RateLimit headers too.
    server = start_ratelimitd(
        tmp_path, args=["--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--failure-policy", "fail-open"]
    )
    infos = []
    try:
        limiter = Limiter(
            address=server.address, deadline=2.0, on_degraded=lambda r, info: infos.append(info)
        )
        async with http(limited_app(limiter), peer) as client:
            response = await client.get("/")
    finally:
        server.stop()
    assert response.status_code == 200
    assert response.headers["RateLimit-Degraded"] == "store"
    assert "RateLimit" in response.headers
    assert [info.reason for info in infos] == ["store"] and infos[0].decision.degraded
    assert infos[0].error is None
    assert limiter.stats.as_dict() == {"decided": 1, "denied": 0, "fail_open": 0, "fail_closed": 0}
