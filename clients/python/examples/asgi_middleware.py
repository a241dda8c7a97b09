"""Rate-limit any ASGI app (Starlette, FastAPI, Quart, ...) with ratelimitd.

    app.add_middleware(RateLimitMiddleware, type="fixed", limit=5, window_ms=10_000)
    app.add_middleware(RateLimitMiddleware, policy="free-tier")   # the server's policies file
    app.add_middleware(RateLimitMiddleware, limits=[Limit(limit=10, window_ms=1000, name="1s"),
                                                    Limit(limit=1000, window_ms=3_600_000, name="1h")])

Every HTTP request spends `cost` units (1 by default) of its key, the
client's IP unless `key_func(scope)` says otherwise (under several limits or
a policy, all of them or none; the headers then describe the most
restrictive, and Retry-After is the wait until every limit allows):
- allowed: the app answers, with the IETF `RateLimit-Policy` and `RateLimit`
  headers added (as ratelimitd's Envoy face writes them);
- denied: 429 `{"error": "Rate limit exceeded"}` with `Retry-After` (seconds,
  rounded up; absent when the cost exceeds the limit, since waiting never
  helps) and the same headers; the app is not called;
- ratelimitd unreachable, too slow or failing: `on_service_error="allow"`
  (the default) lets the request through, `"deny"` answers 503
  `{"error": "Rate limiter unavailable"}`. Either way a warning is logged,
  at most one per 10 s. A `policy` the server does not know (NOT_FOUND) is
  a misconfiguration of the server's policies file, not of the app: it is
  handled the same way (logged, then allowed or 503). An INVALID_ARGUMENT
  is a bug in the app's arguments, not an outage: it is raised.

Pure ASGI: it needs nothing but ratelimitd_client, and only HTTP requests are
limited (websocket and lifespan events pass through). Behind a proxy, the
client IP is the proxy's unless the server rewrites it (uvicorn
`--proxy-headers --forwarded-allow-ips=...`) or `key_func` reads the header.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

import grpc

from ratelimitd_client import (
    ALGORITHMS,
    DEFAULT_ADDRESS,
    DEFAULT_DEADLINE,
    AsyncClient,
    Decision,
    Limit,
    RatelimitdError,
    build_request,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# ratelimitd takes keys of 1 to 1024 bytes; longer ones are hashed.
MAX_KEY_BYTES = 1024
# At most one warning per this many seconds while ratelimitd keeps failing.
WARN_INTERVAL = 10.0

logger = logging.getLogger("ratelimitd_client.asgi")


def client_ip(scope: Scope) -> str:
    """The default key: the peer's address as the ASGI server reports it."""
    client = scope.get("client")
    return client[0] if client else "unknown"


class RateLimitMiddleware:
    """Arguments:

    - `type`, `limit`, `window_ms`, `capacity`, `refill_rate`,
      `failure_policy`: as `Client.check`, checked here, at start-up;
    - or, instead of `type` and its parameters, `limits` (several, as
      `Client.check`'s) or `policy` (a policy name of the server's policies
      file; whether the server knows it shows at the first request);
    - `cost`: units per request, or a function `(scope) -> int`;
    - `key_func`: `(scope) -> str`, default `client_ip`; `prefix` is put
      before every key (to keep several limits on the same callers apart);
    - `on_service_error`: `"allow"` or `"deny"` (503), also for an unknown
      `policy`;
    - `headers`: add `RateLimit-Policy` / `RateLimit` (default True), whose
      policy id is `policy_id` (default: `policy`, else "default");
    - `client`: an `AsyncClient` to share; else one is made from `address`
      and `deadline`.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        type: str = "fixed",
        limit: int | None = None,
        window_ms: int | None = None,
        capacity: int | None = None,
        refill_rate: float | None = None,
        burst: int | None = None,
        failure_policy: str | None = None,
        limits: Sequence[Limit | Mapping[str, Any]] | None = None,
        policy: str | None = None,
        cost: int | Callable[[Scope], int] = 1,
        key_func: Callable[[Scope], str] = client_ip,
        prefix: str = "",
        on_service_error: str = "allow",
        headers: bool = True,
        policy_id: str | None = None,
        client: AsyncClient | None = None,
        address: str = DEFAULT_ADDRESS,
        deadline: float = DEFAULT_DEADLINE,
    ) -> None:
        if on_service_error not in ("allow", "deny"):
            raise ValueError(f"on_service_error must be 'allow' or 'deny' (got {on_service_error!r})")
        self.app = app
        self._params: dict[str, Any] = {
            "type": type,
            "limit": limit,
            "window_ms": window_ms,
            "capacity": capacity,
            "refill_rate": refill_rate,
            "burst": burst,
            "failure_policy": failure_policy,
            "limits": limits,
            "policy": policy,
        }
        # A mistake in the limits is a ValueError now, not on every request.
        build_request("start-up check", **self._params, cost=0 if callable(cost) else cost)
        # Checked: as Limits, so dicts are not checked again on every request.
        checked = None
        if limits is not None:
            checked = [one if isinstance(one, Limit) else Limit(**one) for one in limits]
        self._params["limits"] = checked
        self._cost = cost
        self._key_func = key_func
        self._prefix = prefix
        self._on_service_error = on_service_error
        self._client = client or AsyncClient(address, deadline)

        self._headers_on = headers
        self._policy_id = sf_string(policy_id if policy_id is not None else policy or "default")
        # The header's window `w`, per limit (limits[most_restrictive] is the
        # one reported): the window, or the time an empty bucket takes to
        # fill. A policy's limits are the server's: no `w`.
        self._window_seconds: list[int] = []
        if checked is not None:
            self._window_seconds = [math.ceil(one.span_seconds()) for one in checked]
        elif policy is None:
            algorithm = ALGORITHMS[type]
            span = algorithm.span_seconds(**{name: self._params[name] for name in algorithm.params})
            self._window_seconds = [math.ceil(span)]
        self._last_warning = -math.inf
        self._suppressed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = self._key(scope)
        cost = self._cost(scope) if callable(self._cost) else self._cost
        try:
            decision = await self._client.check(key, **self._params, cost=cost)
        except RatelimitdError as err:
            # A bug in these arguments, not an outage. (NOT_FOUND, a policy
            # missing from the server's file, is the server's configuration:
            # handled as an outage, below.)
            if err.code == grpc.StatusCode.INVALID_ARGUMENT:
                raise
            self._warn(err)
            if self._on_service_error == "allow":
                await self.app(scope, receive, send)
            else:
                await send_json(send, 503, {"error": "Rate limiter unavailable"}, [])
            return

        headers = self._headers(decision)
        if decision.allowed:
            await self.app(scope, receive, _adding_headers(send, headers) if headers else send)
            return
        if decision.retry_after_ms is not None:
            headers.append((b"retry-after", str(math.ceil(decision.retry_after_ms / 1000)).encode()))
        await send_json(send, 429, {"error": "Rate limit exceeded"}, headers)

    def _key(self, scope: Scope) -> str:
        key = self._key_func(scope)
        if not isinstance(key, str) or not key:
            raise ValueError(f"key_func(scope) must return a non-empty str (got {key!r})")
        key = self._prefix + key
        if len(key.encode()) > MAX_KEY_BYTES:
            key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
        return key

    def _headers(self, decision: Decision) -> list[tuple[bytes, bytes]]:
        if not self._headers_on:
            return []
        policy = f"{self._policy_id};q={decision.limit}"
        if self._window_seconds:
            policy += f";w={self._window_seconds[decision.most_restrictive]}"
        reset = math.ceil(decision.reset_after_ms / 1000)
        return [
            (b"ratelimit-policy", policy.encode()),
            (b"ratelimit", f"{self._policy_id};r={decision.remaining};t={reset}".encode()),
        ]

    def _warn(self, err: RatelimitdError) -> None:
        # The first failure at once, then one line per WARN_INTERVAL with the
        # count in between, so an outage cannot flood the log.
        now = time.monotonic()
        if now - self._last_warning < WARN_INTERVAL:
            self._suppressed += 1
            return
        more = f" (and {self._suppressed} more failures since the last warning)" if self._suppressed else ""
        self._last_warning, self._suppressed = now, 0
        action = "allowing" if self._on_service_error == "allow" else "refusing with 503"
        if err.code == grpc.StatusCode.NOT_FOUND:
            action += " until the server's policies file defines it"
        logger.warning("ratelimitd could not decide (%s); %s%s", err, action, more)


def sf_string(text: str) -> str:
    """A structured-field String (RFC 8941), as src/api/envoy/headers.rs
    writes it: quoted, `"` and `\\` escaped, anything outside printable
    ASCII as `_`."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        else:
            out.append("_")
    return '"' + "".join(out) + '"'


def _adding_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return send_with_headers


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
