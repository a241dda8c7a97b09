"""ratelimitd_client.asgi's RateLimitMiddleware with one limit for the whole
app, end to end: a Starlette app behind it, driven through httpx's ASGI
transport, deciding with a real ratelimitd."""

import logging
import re

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client import AsyncClient, Limit
from ratelimitd_client.asgi import RateLimitMiddleware, sf_string

from app import create_app
from conftest import new_peer


async def ok(request):
    return PlainTextResponse("ok")


# A generous deadline: these tests are about responses, not latency (a
# timeout would be "allowed" under on_service_error="allow").
DEADLINE = 2.0


def limited_app(**middleware):
    if "client" not in middleware:
        middleware.setdefault("deadline", DEADLINE)
    app = Starlette(routes=[Route("/", ok)])
    app.add_middleware(RateLimitMiddleware, **middleware)
    return app


def http(app, peer):
    transport = httpx.ASGITransport(app=app, client=peer)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def test_the_basic_scenario_five_per_ten_seconds_then_429(ratelimitd, peer):
    # examples/app.py: fixed window, 5 requests per 10 s per client IP on /.
    async with http(create_app(ratelimitd.address, deadline=DEADLINE), peer) as client:
        responses = [await client.get("/") for _ in range(6)]

    assert [r.status_code for r in responses] == [200] * 5 + [429]
    for remaining, response in zip([4, 3, 2, 1, 0], responses[:5], strict=True):
        assert response.json() == {"hello": "world"}
        assert response.headers["RateLimit-Policy"] == '"default";q=5;w=10'
        assert re.fullmatch(rf'"default";r={remaining};t=(10|9)', response.headers["RateLimit"])
        assert "Retry-After" not in response.headers

    denied = responses[5]
    assert denied.json() == {"error": "Rate limit exceeded"}
    assert denied.headers["Content-Type"] == "application/json"
    assert 9 <= int(denied.headers["Retry-After"]) <= 10
    assert denied.headers["RateLimit-Policy"] == '"default";q=5;w=10'
    assert re.fullmatch(r'"default";r=0;t=(10|9)', denied.headers["RateLimit"])
    assert "RateLimit-Degraded" not in denied.headers


async def test_the_example_health_probe_is_never_limited(ratelimitd, peer):
    async with http(create_app(ratelimitd.address, deadline=DEADLINE), peer) as client:
        probes = [await client.get("/healthz") for _ in range(8)]
    assert {(r.status_code, "RateLimit" in r.headers) for r in probes} == {(200, False)}


async def test_clients_are_apart_by_ip(ratelimitd, peer):
    app = create_app(ratelimitd.address, deadline=DEADLINE)
    other = new_peer()  # another /56: another client
    async with http(app, peer) as first, http(app, other) as second:
        assert [(await first.get("/")).status_code for _ in range(6)][-1] == 429
        assert (await second.get("/")).status_code == 200


async def test_a_key_function_and_a_prefix(ratelimitd, peer, key):
    app = limited_app(
        address=ratelimitd.address,
        limit=2,
        window_ms=10_000,
        key_func=lambda request: request.headers.get("x-api-key", "anonymous"),
        prefix=key,
    )
    async with http(app, peer) as client:
        alice = [(await client.get("/", headers={"X-Api-Key": "alice"})).status_code for _ in range(3)]
        bob = (await client.get("/", headers={"X-Api-Key": "bob"})).status_code
    assert alice == [200, 200, 429] and bob == 200


async def test_a_token_bucket_and_a_shared_client(ratelimitd, peer):
    shared = AsyncClient(ratelimitd.address, deadline=2.0)
    app = limited_app(client=shared, type="token", capacity=3, refill_rate=0.1)
    async with http(app, peer) as client:
        responses = [await client.get("/") for _ in range(4)]
    await shared.close()
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    # w: an empty bucket takes 30 s to fill; Retry-After: 1 token in 10 s.
    assert responses[3].headers["RateLimit-Policy"] == '"default";q=3;w=30'
    assert 9 <= int(responses[3].headers["Retry-After"]) <= 10


async def test_a_cost_above_the_limit_has_no_retry_after(ratelimitd, peer):
    app = limited_app(address=ratelimitd.address, limit=5, window_ms=10_000, cost=lambda request: 6)
    async with http(app, peer) as client:
        response = await client.get("/")
    assert response.status_code == 429
    assert "Retry-After" not in response.headers
    assert response.headers["RateLimit"].startswith('"default";r=5;')


async def test_headers_can_be_left_out(ratelimitd, peer):
    app = limited_app(address=ratelimitd.address, limit=1, window_ms=10_000, headers=False)
    async with http(app, peer) as client:
        allowed, denied = [await client.get("/") for _ in range(2)]
    assert "RateLimit" not in allowed.headers and "RateLimit-Policy" not in allowed.headers
    assert denied.status_code == 429 and "Retry-After" in denied.headers
    assert "RateLimit" not in denied.headers


async def test_a_policy_the_eleventh_request_in_a_second_gets_429(policy_server, peer):
    # "free-tier" in the server's policies file: 10 per second, 1000 per hour.
    app = limited_app(address=policy_server.address, policy="free-tier")
    async with http(app, peer) as client:
        responses = [await client.get("/") for _ in range(11)]

    assert [r.status_code for r in responses] == [200] * 10 + [429]
    for remaining, response in zip(range(9, -1, -1), responses[:10], strict=True):
        assert response.text == "ok"
        # The most restrictive limit, the second's, named by its `per`; the
        # window is the server's (no `w`).
        assert response.headers["RateLimit-Policy"] == '"1s";q=10'
        assert response.headers["RateLimit"] == f'"1s";r={remaining};t=1'
        assert "Retry-After" not in response.headers

    denied = responses[10]
    assert denied.json() == {"error": "Rate limit exceeded"}
    assert denied.headers["Retry-After"] == "1"
    assert denied.headers["RateLimit-Policy"] == '"1s";q=10'
    assert denied.headers["RateLimit"] == '"1s";r=0;t=1'


async def test_a_policy_with_a_key_function(policy_server, peer, key):
    app = limited_app(
        address=policy_server.address,
        policy="free-tier",
        key_func=lambda request: request.headers["x-api-key"],
        prefix=key,
        cost=lambda request: 6,
    )
    async with http(app, peer) as client:
        alice = [await client.get("/", headers={"X-Api-Key": "alice"}) for _ in range(2)]
        bob = await client.get("/", headers={"X-Api-Key": "bob"})
    assert [r.status_code for r in alice] == [200, 429] and bob.status_code == 200
    assert alice[1].headers["RateLimit"] == '"1s";r=4;t=1'


async def test_several_limits_report_the_most_restrictive(ratelimitd, peer):
    app = limited_app(
        address=ratelimitd.address,
        limits=[
            {"name": "per-10s", "limit": 5, "window_ms": 10_000},
            Limit(name="per-hour", type="token", capacity=2, refill_rate=2 / 3600),
        ],
    )
    async with http(app, peer) as client:
        responses = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    # The hour's bucket has the fewest left, then denies: its name, q and w.
    assert {r.headers["RateLimit-Policy"] for r in responses} == {'"per-hour";q=2;w=3600'}
    assert re.fullmatch(r'"per-hour";r=1;t=(1800|1799)', responses[0].headers["RateLimit"])
    assert 1790 <= int(responses[2].headers["Retry-After"]) <= 1800


async def test_an_unknown_policy_is_the_servers_misconfiguration(policy_server, peer, caplog):
    # NOT_FOUND: handled as an outage of the limiter (logged, then on_service_error), not raised.
    allowing = limited_app(address=policy_server.address, policy="no-such-tier")
    denying = limited_app(address=policy_server.address, policy="no-such-tier", on_service_error="deny")
    with caplog.at_level(logging.WARNING, logger="ratelimitd_client.asgi"):
        async with http(allowing, peer) as client:
            allowed = [await client.get("/") for _ in range(2)]
        async with http(denying, peer) as client:
            refused = await client.get("/")
    assert [(r.status_code, r.text) for r in allowed] == [(200, "ok")] * 2
    assert "RateLimit" not in allowed[0].headers
    assert allowed[0].headers["RateLimit-Degraded"] == "error"
    assert refused.status_code == 503 and refused.json() == {"error": "Rate limiter unavailable"}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # one per middleware, not one per request
    assert "NOT_FOUND" in warnings[0] and "'no-such-tier'" in warnings[0]
    assert "allowing until the server's policies file defines it" in warnings[0]
    assert "refusing with 503" in warnings[1]


async def test_on_service_error_allow_lets_requests_through(dead_address, peer, caplog):
    app = limited_app(address=dead_address, limit=1, window_ms=10_000, on_service_error="allow")
    with caplog.at_level(logging.WARNING, logger="ratelimitd_client.asgi"):
        async with http(app, peer) as client:
            responses = [await client.get("/") for _ in range(3)]
    assert [(r.status_code, r.text) for r in responses] == [(200, "ok")] * 3
    assert "RateLimit" not in responses[0].headers
    assert {r.headers["RateLimit-Degraded"] for r in responses} == {"unavailable"}
    # One warning for the outage, not one per request.
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "UNAVAILABLE" in warnings[0] and "allowing" in warnings[0]


async def test_on_service_error_deny_answers_503(dead_address, peer):
    app = limited_app(address=dead_address, limit=1, window_ms=10_000, on_service_error="deny")
    async with http(app, peer) as client:
        response = await client.get("/")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limiter unavailable"}


def test_a_bad_limit_fails_at_start_up():
    app = Starlette()
    with pytest.raises(ValueError, match="limit must be 1 to"):
        RateLimitMiddleware(app, limit=0, window_ms=1000)
    with pytest.raises(ValueError, match="type='token' needs capacity and refill_rate"):
        RateLimitMiddleware(app, type="token")
    with pytest.raises(TypeError, match=r"policy_id is not an option: .* limits=\[Limit\(name="):
        RateLimitMiddleware(app, limit=1, window_ms=1000, policy_id="per-ip")
    with pytest.raises(TypeError, match="unknown option: windowMs"):
        RateLimitMiddleware(app, limit=1, windowMs=1000)
    with pytest.raises(ValueError, match="on_service_error must be 'allow' or 'deny'"):
        RateLimitMiddleware(app, limit=1, window_ms=1000, on_service_error="maybe")
    with pytest.raises(ValueError, match="limit and window_ms do not apply with policy="):
        RateLimitMiddleware(app, policy="free-tier", limit=1, window_ms=1000)
    with pytest.raises(ValueError, match="policy must be 1 to 64 ASCII"):
        RateLimitMiddleware(app, policy="free tier")
    with pytest.raises(ValueError, match=r"limits\[1\]: counts on the same counter as limits\[0\]"):
        RateLimitMiddleware(app, limits=[{"limit": 1, "window_ms": 1000}, {"limit": 9, "window_ms": 60_000}])


async def test_non_http_events_pass_through(dead_address):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    middleware = RateLimitMiddleware(
        app, address=dead_address, limit=1, window_ms=1000, on_service_error="deny"
    )
    for kind in ("lifespan", "websocket"):
        await middleware({"type": kind}, None, None)
    assert seen == ["lifespan", "websocket"]


def test_policy_ids_are_structured_field_strings():
    # The cases of src/api/envoy/headers.rs.
    assert sf_string('a"b\\c') == '"a\\"b\\\\c"'
    assert sf_string("ключ\n") == '"_____"'
