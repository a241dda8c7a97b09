"""The id of the RateLimit-Policy and RateLimit items, by the rule both
clients follow: the table of clients/test-vectors/policy-ids.json, which the
Node client's suite reads too, run through the middleware against a real
ratelimitd serving the table's policies."""

from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client.asgi import RateLimitMiddleware

from conftest import Server, assert_readme_states, shared_vectors, start_ratelimitd



VECTORS_TABLE = shared_vectors("policy-ids.json")


async def ok(request):
    return PlainTextResponse("ok")


def limited_app(**middleware):
    app = Starlette(routes=[Route("/", ok)])
    # A generous deadline: a timeout would let the request through without headers.
    app.add_middleware(RateLimitMiddleware, deadline=2.0, **middleware)
    return app


@pytest.fixture(scope="module")
def vectors_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_dir = tmp_path_factory.mktemp("ratelimitd-policy-ids")
    server = start_ratelimitd(log_dir, policies=VECTORS_TABLE["policies"])
    yield server
    code = server.stop()
    assert code == 0, f"ratelimitd exited {code} on SIGTERM; its log:\n{server.log.read_text()}"


def test_the_readme_states_the_rule_of_the_shared_table_word_for_word():
    assert_readme_states(VECTORS_TABLE["rule"])


@pytest.mark.parametrize("vector", VECTORS_TABLE["cases"], ids=lambda vector: vector["case"])
async def test_policy_id(vectors_server, peer, key, vector):
    app = limited_app(address=vectors_server.address, prefix=f"{key}:", **vector["limiter"])
    transport = httpx.ASGITransport(app=app, client=peer)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        response = await client.get("/")
    assert response.status_code == 200
    item = f'"{vector["id"]}";'
    policy, current = response.headers["RateLimit-Policy"], response.headers["RateLimit"]
    assert policy.startswith(f"{item}q={vector['q']}"), policy
    assert current.startswith(f"{item}r="), current
