"""ratelimitd_client.asgi's Limiter: per-route limits by decorator, exempt
routes and paths, default limits, async key and cost functions given the
Starlette Request, limit strings, under every algorithm, against a real
ratelimitd."""

import asyncio
import re

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from ratelimitd_client import ALGORITHMS
from ratelimitd_client.asgi import Limiter, RateLimitMiddleware, parse_limits

from conftest import new_peer

DEADLINE = 2.0


def http(app, peer):
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=peer), base_url="http://testserver"
    )


def app_of(limiter, routes):
    app = Starlette(routes=routes)
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    return app


async def statuses(client, path, n, **kwargs):
    return [(await client.get(path, **kwargs)).status_code for _ in range(n)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_five_per_ten_seconds_under_every_algorithm(ratelimitd, peer, key, algorithm):
    limiter = Limiter(address=ratelimitd.address, deadline=DEADLINE, prefix=key)

    @limiter.limit("5/10 seconds", type=algorithm)
    async def limited(request):
        return PlainTextResponse("ok")

    async with http(app_of(limiter, [Route("/", limited)]), peer) as client:
        responses = [await client.get("/") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert [r.headers["RateLimit"].split(";")[1] for r in responses] == [f"r={n}" for n in (4, 3, 2, 1, 0, 0)]
    assert {r.headers["RateLimit-Policy"] for r in responses} == {'"default";q=5;w=10'}
    assert 1 <= int(responses[5].headers["Retry-After"]) <= 10
    assert limiter.stats.as_dict() == {"decided": 6, "denied": 1, "fail_open": 0, "fail_closed": 0}


async def test_limited_exempt_and_undecorated_routes(ratelimitd, peer, key):
    limiter = Limiter(address=ratelimitd.address, deadline=DEADLINE, prefix=key)

    @limiter.limit("2 per 10 seconds")
    async def limited(request):
        return PlainTextResponse("limited")

    @limiter.exempt
    async def healthz(request):
        return PlainTextResponse("ok")

    async def free(request):
        return PlainTextResponse("free")

    app = app_of(limiter, [Route("/", limited), Route("/healthz", healthz), Route("/free", free)])
    async with http(app, peer) as client:
        assert await statuses(client, "/", 3) == [200, 200, 429]
        probes = [await client.get("/healthz") for _ in range(5)]
        assert await statuses(client, "/free", 5) == [200] * 5
    assert {(r.status_code, "RateLimit" in r.headers) for r in probes} == {(200, False)}
    # Only the limited route asked ratelimitd.
    assert limiter.stats.decided == 3


async def test_default_limits_exempt_paths_and_mounts(ratelimitd, peer, key):
    limiter = Limiter(
        address=ratelimitd.address,
        deadline=DEADLINE,
        prefix=key,
        default_limits="1/minute",
        exempt_paths=["/metrics", "/internal/*"],
    )

    async def endpoint(request):
        return PlainTextResponse(request.url.path)

    @limiter.limit("3/minute")
    async def mounted(request):
        return PlainTextResponse("mounted")

    app = app_of(
        limiter,
        [
            Route("/a", endpoint),
            Route("/metrics", endpoint),
            Route("/internal/x", endpoint),
            Mount("/api", routes=[Route("/items/{id}", mounted)]),
        ],
    )
    async with http(app, peer) as client:
        assert await statuses(client, "/a", 2) == [200, 429]  # the default
        assert await statuses(client, "/metrics", 3) == [200] * 3
        assert await statuses(client, "/internal/x", 3) == [200] * 3
        # The mounted route's own limit, found through the Mount.
        assert await statuses(client, "/api/items/7", 4) == [200, 200, 200, 429]
        # A path no route matches: the default, on the counter "/a" spent.
        assert (await client.get("/nowhere")).status_code == 429


async def test_async_key_func_and_cost_get_the_request(ratelimitd, peer, key):
    seen = []

    async def api_key(request: Request) -> str:
        await asyncio.sleep(0)
        seen.append(type(request).__name__)
        return request.headers.get("x-api-key", "anonymous")

    async def weight(request: Request) -> int:
        return int(request.query_params.get("weight", "1"))

    limiter = Limiter(api_key, address=ratelimitd.address, deadline=DEADLINE, prefix=key)

    @limiter.limit(limit=5, window_ms=60_000, cost=weight)
    async def limited(request):
        return PlainTextResponse("ok")

    async with http(app_of(limiter, [Route("/", limited)]), peer) as client:
        alice = [
            await client.get("/", params={"weight": w}, headers={"X-Api-Key": "alice"}) for w in (3, 2, 1)
        ]
        bob = await client.get("/", params={"weight": "5"}, headers={"X-Api-Key": "bob"})
    assert [r.status_code for r in alice] == [200, 200, 429]
    assert alice[1].headers["RateLimit"].startswith('"default";r=0;')
    assert bob.status_code == 200
    assert set(seen) == {"Request"}


async def test_a_sync_key_func_per_route_and_a_policy(policy_server, peer, key):
    limiter = Limiter(address=policy_server.address, deadline=DEADLINE, prefix=key)

    @limiter.limit(policy="free-tier", key_func=lambda request: request.headers["x-user"], cost=6)
    async def limited(request):
        return PlainTextResponse("ok")

    async with http(app_of(limiter, [Route("/", limited)]), peer) as client:
        alice = [await client.get("/", headers={"X-User": "alice"}) for _ in range(2)]
        bob = await client.get("/", headers={"X-User": "bob"})
    assert [r.status_code for r in alice] == [200, 429] and bob.status_code == 200
    assert alice[1].headers["RateLimit"] == '"1s";r=4;t=1'


async def test_several_limits_in_one_string(ratelimitd, peer, key):
    limiter = Limiter(address=ratelimitd.address, deadline=DEADLINE, prefix=key)

    @limiter.limit("3/second; 4/hour")
    async def limited(request):
        return PlainTextResponse("ok")

    async with http(app_of(limiter, [Route("/", limited)]), peer) as client:
        first = [await client.get("/") for _ in range(3)]
        await asyncio.sleep(1.1)
        second = [await client.get("/") for _ in range(2)]
    assert [r.status_code for r in first + second] == [200, 200, 200, 200, 429]
    # Denied by the hour: its id (the limit string's name for it), q and w,
    # and a Retry-After of most of an hour.
    assert second[1].headers["RateLimit-Policy"] == '"1h";q=4;w=3600'
    assert int(second[1].headers["Retry-After"]) > 3000


async def test_stacked_decorators_each_count(ratelimitd, peer, key):
    limiter = Limiter(address=ratelimitd.address, deadline=DEADLINE, prefix=key)

    @limiter.limit("5/minute")
    @limiter.limit("2/minute", key_func=lambda request: "everyone")
    async def limited(request):
        return PlainTextResponse("ok")

    other = new_peer()
    app = app_of(limiter, [Route("/", limited)])
    async with http(app, peer) as first, http(app, other) as second:
        assert await statuses(first, "/", 2) == [200, 200]
        # The shared "everyone" limit is spent, whoever asks.
        assert await statuses(second, "/", 1) == [429]


def test_limit_strings():
    assert parse_limits("5/10 seconds") == [(5, 10_000)]
    assert parse_limits("5 per 10 seconds") == [(5, 10_000)]
    assert parse_limits("100/minute") == [(100, 60_000)]
    assert parse_limits("10/s;1000 per 1 hour, 5/2d") == [(10, 1000), (1000, 3_600_000), (5, 172_800_000)]
    for bad in ("5", "5/fortnight", "five/second", "5//s", ""):
        with pytest.raises(ValueError, match="is not a limit such as '5/10 seconds'"):
            parse_limits(bad)


def test_bad_limits_fail_at_decoration():
    limiter = Limiter()
    with pytest.raises(ValueError, match="is not a limit such as"):
        limiter.limit("5 every 10 seconds")
    with pytest.raises(ValueError, match="limit must be 1 to"):
        limiter.limit("0/second")
    with pytest.raises(ValueError, match="limit cannot be combined with a limit string"):
        limiter.limit("5/second", limit=5)
    with pytest.raises(ValueError, match="type 'sliding_counter' is not an algorithm name"):
        limiter.limit("5/second", type="sliding_counter")
    with pytest.raises(ValueError, match="on_service_error must be 'allow' or 'deny'"):
        Limiter(on_service_error="fail_open")
    with pytest.raises(ValueError, match="give them to the Limiter, not beside limiter="):
        RateLimitMiddleware(Starlette(), limiter=limiter, limit=5, window_ms=1000)


async def test_key_func_must_give_a_key(ratelimitd, peer):
    limiter = Limiter(lambda request: "", address=ratelimitd.address, deadline=DEADLINE)

    @limiter.limit("5/second")
    async def limited(request):
        return PlainTextResponse("ok")

    async with http(app_of(limiter, [Route("/", limited)]), peer) as client:
        with pytest.raises(ValueError, match=re.escape("key_func(request) must return a non-empty str")):
            await client.get("/")


class Opaque:
    """An ASGI app whose routes the middleware cannot see before routing
    (as FastAPI's included routers in recent versions)."""

    def __init__(self, app):
        self._app = app

    async def __call__(self, scope, receive, send):
        await self._app(scope, receive, send)


async def test_a_route_hidden_from_the_middleware_checks_its_limit_when_called(ratelimitd, peer, key):
    limiter = Limiter(address=ratelimitd.address, deadline=DEADLINE, prefix=key)

    @limiter.limit("2/minute")
    async def hidden(request):
        return PlainTextResponse(f"hidden {request.path_params['id']}")

    @limiter.limit("1/minute", name="sync-hidden")
    def hidden_sync(request):  # a sync endpoint: still run in the thread pool
        return PlainTextResponse("sync")

    inner = Starlette(routes=[Route("/items/{id}", hidden), Route("/sync", hidden_sync)])
    app = app_of(limiter, [Mount("/v2", app=Opaque(inner))])
    async with http(app, peer) as client:
        responses = [await client.get("/v2/items/9") for _ in range(3)]
        sync = [await client.get("/v2/sync") for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].text == "hidden 9"
    assert responses[0].headers["RateLimit"].startswith('"default";r=1;')
    assert responses[2].json() == {"error": "Rate limit exceeded"}
    assert 50 <= int(responses[2].headers["Retry-After"]) <= 60
    assert [r.status_code for r in sync] == [200, 429] and sync[0].text == "sync"
    assert limiter.stats.as_dict() == {"decided": 5, "denied": 2, "fail_open": 0, "fail_closed": 0}
