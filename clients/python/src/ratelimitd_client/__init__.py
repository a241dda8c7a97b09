"""Python client for ratelimitd: "may this key spend this much now?"

    from ratelimitd_client import Client

    with Client("127.0.0.1:50051") as limiter:
        d = limiter.check("user42", type="fixed", limit=5, window_ms=10_000)
        if not d.allowed:
            ...  # d.retry_after_ms until it would pass

`AsyncClient` is the same for asyncio (`await limiter.check(...)`).
Several limits at once: `check(key, limits=[Limit(...), ...])`; a policy of
the server's: `check(key, policy="free-tier")`; a batch: `check_many([...])`.

Map: `_request.py` checks arguments and holds the algorithm table and the
protobuf conversions; `_client.py` the two clients; `_pb/` the stubs,
generated from the repository's proto/ at build time.
"""

from ._client import DEFAULT_ADDRESS, DEFAULT_DEADLINE, AsyncClient, Client
from ._request import (
    ALGORITHMS,
    FAILURE_POLICIES,
    Decision,
    Limit,
    LimitStatus,
    RatelimitdError,
    build_request,
)

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ADDRESS",
    "DEFAULT_DEADLINE",
    "FAILURE_POLICIES",
    "AsyncClient",
    "Client",
    "Decision",
    "Limit",
    "LimitStatus",
    "RatelimitdError",
    "build_request",
]
