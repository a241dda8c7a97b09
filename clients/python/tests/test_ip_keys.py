"""The default key, by the rule both clients follow: the table of
clients/test-vectors/ip-keys.json (which the Node client's suite reads too)
through ip_key, then the middleware's default key end to end against a real
ratelimitd: an IPv4 client is one key whether the server reports it as
`127.0.0.1` or `::ffff:127.0.0.1`, and an IPv6 client is keyed by its /56."""

import re

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client import AsyncClient, ip_key
from ratelimitd_client.asgi import Limiter, RateLimitMiddleware, client_ip

from conftest import assert_readme_states, shared_vectors

# A generous deadline: a timeout would let the request through uncounted.
DEADLINE = 2.0


VECTORS_TABLE = shared_vectors("ip-keys.json")


def test_the_readme_states_the_rule_of_the_shared_table_word_for_word():
    assert_readme_states(VECTORS_TABLE["rule"])


@pytest.mark.parametrize("vector", VECTORS_TABLE["cases"], ids=lambda vector: vector["case"])
def test_ip_key(vector):
    if "ipv6_subnet" in vector:
        assert ip_key(vector["address"], vector["ipv6_subnet"]) == vector["key"]
    else:
        assert ip_key(vector["address"]) == vector["key"]


@pytest.mark.parametrize("ipv6_subnet", VECTORS_TABLE["invalid_ipv6_subnet"], ids=repr)
def test_an_invalid_ipv6_subnet_is_an_error_naming_it(ipv6_subnet):
    with pytest.raises(ValueError, match="ipv6_subnet must be"):
        ip_key("2001:db8::1", ipv6_subnet)
    with pytest.raises(ValueError, match="ipv6_subnet must be"):
        Limiter(ipv6_subnet=ipv6_subnet)


def test_masking_off_is_none_or_false():
    assert ip_key("2001:db8::1", None) == ip_key("2001:db8::1", False) == "2001:db8::1"


def test_what_is_not_an_address_is_left_as_it_is():
    assert ip_key(None) is None  # type: ignore[arg-type]
    assert ip_key(3232235777) == 3232235777  # type: ignore[arg-type]  # ipaddress would take it


def test_ipv6_subnet_is_the_default_keys_option_only():
    with pytest.raises(ValueError, match="ipv6_subnet applies to the default key"):
        Limiter(lambda request: "k", ipv6_subnet=64)
    with pytest.raises(ValueError, match="ipv6_subnet applies to the default key"):
        Limiter(key_func=lambda request: "k", ipv6_subnet=None)


def test_without_a_peer_the_default_key_is_unknown():
    class NoPeer:
        client = None

    assert client_ip(NoPeer()) == "unknown"  # type: ignore[arg-type]


class Recording(AsyncClient):
    """An AsyncClient that keeps the keys it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys: list[str] = []

    async def check(self, key, **kwargs):
        self.keys.append(key)
        return await super().check(key, **kwargs)


async def ok(request):
    return PlainTextResponse("ok")


def limited_app(client: AsyncClient, prefix: str, **options) -> Starlette:
    """One limit of 2 a minute on the default key, as two servers of one
    app would have it (the same namespace)."""
    app = Starlette(routes=[Route("/", ok)])
    app.add_middleware(
        RateLimitMiddleware, client=client, prefix=prefix, limit=2, window_ms=60_000, **options
    )
    return app


async def statuses(app: Starlette, *hosts: str) -> list[int]:
    """One request from each host (the ASGI scope's client), in turn."""
    codes = []
    for port, host in enumerate(hosts, start=40000):
        transport = httpx.ASGITransport(app=app, client=(host, port))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            codes.append((await http.get("/")).status_code)
    return codes


@pytest.fixture
async def recording(ratelimitd):
    client = Recording(ratelimitd.address, DEADLINE)
    yield client
    await client.close()


async def test_an_ipv4_client_is_one_counter_as_127_0_0_1_and_as_ffff_127_0_0_1(recording, key):
    # A dual-stack server reports IPv4 clients as ::ffff:a.b.c.d.
    app = limited_app(recording, f"{key}:")
    assert await statuses(app, "::ffff:127.0.0.1", "127.0.0.1", "::FFFF:7f00:1", "127.0.0.1") == [
        200,
        200,
        429,
        429,
    ]
    assert len(set(recording.keys)) == 1 and recording.keys[0].endswith(":127.0.0.1"), recording.keys
    # Another IPv4 client has its own counter: unmapped before any masking.
    assert await statuses(app, "::ffff:127.0.0.2") == [200]


async def test_two_ipv6_clients_of_one_56_share_one_counter(recording, key):
    app = limited_app(recording, f"{key}:")
    one_56 = ["2001:db8:abcd:1234::1", "2001:DB8:ABCD:12FF:FFFF:FFFF:FFFF:FFFF", "2001:db8:abcd:1200::9"]
    assert await statuses(app, *one_56) == [200, 200, 429]
    assert recording.keys[0].endswith(":2001:db8:abcd:1200::/56")
    assert len(set(recording.keys)) == 1, recording.keys
    # The next /56 has its own.
    assert await statuses(app, "2001:db8:abcd:1300::1") == [200]


async def test_the_prefix_length_and_masking_off(recording, key):
    by_64 = limited_app(recording, f"{key}:", ipv6_subnet=64)
    whole = limited_app(recording, f"{key}:", ipv6_subnet=None)
    await statuses(by_64, "2001:db8:abcd:1234:5678::1")
    await statuses(whole, "2001:DB8:0:0:0:0:0:1", "::ffff:127.0.0.1")
    assert [re.sub(r"^.*?rl-[0-9a-f]{8}:", "", k) for k in recording.keys] == [
        "2001:db8:abcd:1234::/64",
        "2001:db8::1",
        "127.0.0.1",
    ]
