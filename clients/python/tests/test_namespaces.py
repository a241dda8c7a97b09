"""Namespaces: each limiter counts on its own, by a prefix derived from its
options (the same as the Node client derives); `name` shares on purpose."""

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client import Limit
from ratelimitd_client._namespace import canonical_text, derived_prefix, namespace, number
from ratelimitd_client.asgi import Limiter, RateLimitMiddleware

DEADLINE = 2.0


def test_the_shared_test_vectors():
    # Both clients' suites assert these.
    assert canonical_text(type="fixed_window", limit=5, window_ms=10_000) == "limit:fixed_window:5:10000"
    assert namespace(None, type="fixed_window", limit=5, window_ms=10_000) == "rl-b45cbbb3:"
    assert derived_prefix("policy:free-tier") == "rl-db734f2a:"
    assert namespace(None, policy="free-tier") == "rl-db734f2a:"
    assert namespace("checkout", limit=5, window_ms=10_000) == "checkout:"


def test_canonical_texts():
    # Aliases are their algorithm; parameters in the proto's field order.
    assert canonical_text(type="fixed", limit=5, window_ms=10_000) == "limit:fixed_window:5:10000"
    assert canonical_text(type="token", capacity=10, refill_rate=2.5) == "limit:token_bucket:10:2.5"
    assert canonical_text(type="token_bucket", capacity=10, refill_rate=10.0) == "limit:token_bucket:10:10"
    assert canonical_text(type="gcra", limit=5, window_ms=1000) == "limit:gcra:5:1000:5"
    assert canonical_text(type="gcra", limit=5, window_ms=1000, burst=9) == "limit:gcra:5:1000:9"
    assert canonical_text(type="sliding_window_counter", limit=3, window_ms=60_000) == (
        "limit:sliding_window_counter:3:60000"
    )
    assert (
        canonical_text(
            limits=[
                Limit(name="1s", type="token", capacity=10, refill_rate=10),
                {"limit": 1000, "window_ms": 3_600_000, "key": "ip:203.0.113.7"},
            ]
        )
        == "limits:1s=token_bucket:10:10,=fixed_window:1000:3600000@ip:203.0.113.7"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2.5, "2.5"),
        (10.0, "10"),
        (0.1, "0.1"),
        (1 / 3, "0.3333333333333333"),
        (1e-7, "1e-7"),
        (1e21, "1e+21"),
    ],
)
def test_numbers_as_javascript_writes_them(value, text):
    assert number(value) == text


def test_names_are_checked():
    for bad in ("", "a b", "é", "n" * 65):
        with pytest.raises(ValueError, match="name must be 1 to 64 ASCII letters"):
            namespace(bad)


def limited_app(*limiters_and_rules):
    """One route per (limiter, rule options); every request's key is "k"."""
    routes = []
    for i, (limiter, options) in enumerate(limiters_and_rules):

        @limiter.limit(**options)
        async def endpoint(request):
            return PlainTextResponse("ok")

        routes.append(Route(f"/{i}", endpoint))
    app = Starlette(routes=routes)
    for limiter in {id(lim): lim for lim, _ in limiters_and_rules}.values():
        app.add_middleware(RateLimitMiddleware, limiter=limiter)
    return app


async def statuses(app, path, n):
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return [(await client.get(path)).status_code for _ in range(n)]


async def test_different_limits_on_one_key_count_apart(ratelimitd, key):
    one = Limiter(lambda request: "k", address=ratelimitd.address, deadline=DEADLINE, prefix=key)
    two = Limiter(lambda request: "k", address=ratelimitd.address, deadline=DEADLINE, prefix=key)
    app = limited_app((one, {"limit": 2, "window_ms": 60_000}), (two, {"limit": 3, "window_ms": 60_000}))
    assert await statuses(app, "/0", 3) == [200, 200, 429]
    # The 3-a-minute limiter has its own counter: nothing of it was spent.
    assert await statuses(app, "/1", 4) == [200, 200, 200, 429]


async def test_the_same_name_shares_and_different_names_count_apart(ratelimitd, key):
    limiter = Limiter(lambda request: "k", address=ratelimitd.address, deadline=DEADLINE, prefix=key)
    app = limited_app(
        (limiter, {"limit": 3, "window_ms": 60_000, "name": "checkout"}),
        (limiter, {"limit": 3, "window_ms": 60_000, "name": "checkout"}),
        (limiter, {"limit": 3, "window_ms": 60_000, "name": "search"}),
    )
    assert await statuses(app, "/0", 2) == [200, 200]
    assert await statuses(app, "/1", 2) == [200, 429]  # one left of the shared three
    assert await statuses(app, "/2", 3) == [200] * 3


async def test_identical_unnamed_limits_agree(ratelimitd, key):
    # As two processes of one app would: the derived namespace is the same.
    first = Limiter(lambda request: "k", address=ratelimitd.address, deadline=DEADLINE, prefix=key)
    second = Limiter(lambda request: "k", address=ratelimitd.address, deadline=DEADLINE, prefix=key)
    app = limited_app((first, {"limit": 2, "window_ms": 60_000}), (second, {"limit": 2, "window_ms": 60_000}))
    assert await statuses(app, "/0", 1) == [200]
    assert await statuses(app, "/1", 2) == [200, 429]


async def test_the_key_sent_is_prefix_namespace_key(ratelimitd, key):
    from ratelimitd_client import AsyncClient

    class Recording(AsyncClient):
        keys: list[str] = []

        async def check(self, key, **kwargs):
            self.keys.append(key)
            return await super().check(key, **kwargs)

    client = Recording(ratelimitd.address, DEADLINE)
    limiter = Limiter(lambda request: "user7", client=client, prefix="app1:")
    app = limited_app(
        (limiter, {"limit": 5, "window_ms": 10_000}),
        (limiter, {"limit": 5, "window_ms": 10_000, "name": "n"}),
    )
    await statuses(app, "/0", 1)
    await statuses(app, "/1", 1)
    assert client.keys == ["app1:rl-b45cbbb3:user7", "app1:n:user7"]
