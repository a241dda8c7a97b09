"""Python client for ratelimitd: "may this key spend this much now?"

    from ratelimitd_client import Client

    with Client("127.0.0.1:50051") as limiter:
        d = limiter.check("user42", type="fixed", limit=5, window_ms=10_000)
        if not d.allowed:
            ...  # d.retry_after_ms until it would pass

`AsyncClient` is the same for asyncio (`await limiter.check(...)`).
Several limits at once: `check(key, limits=[Limit(...), ...])`; a policy of
the server's: `check(key, policy="free-tier")`; a batch: `check_many([...])`.

Without an address, the clients connect to $RATELIMITD_ADDRESS, else
127.0.0.1:50051 (TLS: RATELIMITD_TLS, RATELIMITD_TLS_CA, RATELIMITD_TLS_CERT,
RATELIMITD_TLS_KEY). Rate-limiting a Starlette or FastAPI app:
`ratelimitd_client.asgi` (`pip install 'ratelimitd-client[asgi]'`).

A policy checked often on one key is decided in-process from a lease of
units the server spent ahead for the client (`leases=False`, or
RATELIMITD_LEASES=off, turns that off; `lease_stats()` counts it).

Map: `_request.py` checks arguments and holds the algorithm table and the
protobuf conversions; `_client.py` the two clients, their address and TLS;
`_lease.py` leases (the book deciding from them, the stream's thread and task);
`_namespace.py` the middleware's key namespaces; `_ip.py` its default key
(`ip_key`: the client's address, one key per client); `asgi.py` the
middleware and the per-route Limiter; `_pb/` the stubs, generated at build
time from the package's copy of the protos (proto/).
"""

from ._client import (
    DEFAULT_ADDRESS,
    DEFAULT_DEADLINE,
    AsyncClient,
    Client,
    credentials_from_env,
    resolve_address,
)
from ._ip import ip_key
from ._lease import DEFAULT_LEASE_THRESHOLD
from ._request import (
    ALGORITHM_ALIASES,
    ALGORITHMS,
    FAILURE_POLICIES,
    Decision,
    Limit,
    LimitStatus,
    RatelimitdError,
    build_request,
    canonical_algorithm,
)

__all__ = [
    "ALGORITHM_ALIASES",
    "ALGORITHMS",
    "DEFAULT_ADDRESS",
    "DEFAULT_DEADLINE",
    "DEFAULT_LEASE_THRESHOLD",
    "FAILURE_POLICIES",
    "AsyncClient",
    "Client",
    "Decision",
    "Limit",
    "LimitStatus",
    "RatelimitdError",
    "build_request",
    "canonical_algorithm",
    "credentials_from_env",
    "ip_key",
    "resolve_address",
]
