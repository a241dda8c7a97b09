"""Rate-limit an ASGI app (Starlette, FastAPI) with ratelimitd: a middleware,
and a slowapi-style `Limiter` whose decorators give routes their limits.

    from ratelimitd_client.asgi import Limiter, RateLimitMiddleware

    limiter = Limiter()                      # key: the client's IP

    @limiter.limit("5/10 seconds")           # or limit=5, window_ms=10_000, type="gcra", ...
    async def hello(request): ...

    @limiter.exempt                          # health probes are never limited
    async def healthz(request): ...

    app.add_middleware(RateLimitMiddleware, limiter=limiter)

Or one limit for the whole app: `app.add_middleware(RateLimitMiddleware,
limit=5, window_ms=10_000)` (any of `Limiter.limit`'s options).

Each limited HTTP request spends `cost` units of its key (`key_func(request)`,
sync or async, given a Starlette `Request`), in the limiter's namespace:
- allowed: the app answers, with the IETF `RateLimit-Policy` and `RateLimit`
  headers added (as ratelimitd's Envoy face writes them);
- denied: 429 `{"error": "Rate limit exceeded"}` with `Retry-After` (seconds,
  rounded up; absent when the cost exceeds the limit) and the same headers;
- ratelimitd unreachable, too slow or failing (NOT_FOUND for a policy the
  server does not define included): `on_service_error="allow"` (the
  default) lets the request through, visibly: a `RateLimit-Degraded:
  <timeout|unavailable|error>` response header, the `on_degraded(request,
  info)` hook, `limiter.stats.fail_open`, and a warning logged at most once
  per 10 s; `"deny"` answers 503 `{"error": "Rate limiter unavailable"}`
  (`stats.fail_closed`). A decision the server itself marked `degraded`
  (its failure policy answered for Redis) gets `RateLimit-Degraded: store`
  and the hook too. INVALID_ARGUMENT is a bug in the app's arguments: raised.

Needs Starlette (`pip install 'ratelimitd-client[asgi]'`). Only HTTP
requests are limited; websocket and lifespan events pass through.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import grpc

try:
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Match
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "ratelimitd_client.asgi needs Starlette: pip install 'ratelimitd-client[asgi]'"
    ) from err

from ._client import DEFAULT_DEADLINE, AsyncClient
from ._ip import DEFAULT_IPV6_SUBNET, check_ipv6_subnet, ip_key
from ._lease import DEFAULT_LEASE_THRESHOLD
from ._namespace import namespace
from ._request import (
    ALGORITHMS,
    MAX_KEY_BYTES,
    Decision,
    Limit,
    RatelimitdError,
    build_request,
    canonical_algorithm,
)

__all__ = [
    "Degraded",
    "Limiter",
    "RateLimitMiddleware",
    "Stats",
    "client_ip",
    "ip_key",
    "parse_limits",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
KeyFunc = Callable[[Request], "str | Awaitable[str]"]
CostFunc = Callable[[Request], "int | Awaitable[int]"]

# At most one warning per this many seconds while ratelimitd keeps failing.
WARN_INTERVAL = 10.0

logger = logging.getLogger("ratelimitd_client.asgi")


def client_ip(request: Request, ipv6_subnet: int | None = DEFAULT_IPV6_SUBNET) -> str:
    """The default key: the peer's address as the ASGI server reports it
    (behind a proxy, the proxy's unless the server rewrites it: uvicorn
    `--proxy-headers --forwarded-allow-ips=...`), as `ip_key` writes it:
    an IPv4-mapped address as its IPv4 address, another IPv6 address as
    its /56 (`ipv6_subnet`; as a Limiter's key, the Limiter's
    `ipv6_subnet`). "unknown" without a peer (a Unix socket)."""
    return ip_key(request.client.host, ipv6_subnet) if request.client else "unknown"


@dataclass
class Stats:
    """Counters to export (e.g. as Prometheus counters), per Limiter.

    `decided`: requests ratelimitd answered (allowed or denied; a decision
    the server marked degraded included); `denied`: of those, answered 429;
    `fail_open`: requests let through because ratelimitd could not be asked
    (on_service_error="allow"); `fail_closed`: requests answered 503 for
    that reason (on_service_error="deny")."""

    decided: int = 0
    denied: int = 0
    fail_open: int = 0
    fail_closed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "decided": self.decided,
            "denied": self.denied,
            "fail_open": self.fail_open,
            "fail_closed": self.fail_closed,
        }


@dataclass(frozen=True)
class Degraded:
    """What `on_degraded(request, info)` is told about a request let through
    without a full decision. `reason`: "timeout" (no answer within the
    deadline), "unavailable" (ratelimitd down or shedding), "error" (any
    other failure, e.g. a policy the server does not define), or "store"
    (ratelimitd answered, but its failure policy decided because Redis
    could not). `error` is the RatelimitdError (None for "store"),
    `decision` the server's Decision (only for "store"), `key` the key sent."""

    reason: str
    key: str
    error: RatelimitdError | None = None
    decision: Decision | None = None


# --- limit strings ---------------------------------------------------------

_UNITS_MS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}
_LIMIT_STRING = re.compile(r"\s*(\d+)\s*(?:/|per\b)\s*(\d+)?\s*([a-z]+)\s*", re.IGNORECASE)


def parse_limits(text: str) -> list[tuple[int, int]]:
    """slowapi's limit strings: "5/10 seconds", "5 per 10 seconds",
    "100/minute", "10/s"; several joined by ";" or ",". Each as (limit,
    window_ms)."""
    if not isinstance(text, str):
        raise ValueError(f"a limit string must be a str such as '5/10 seconds' (got {text!r})")
    parsed = []
    for part in re.split(r"[;,]", text):
        match = _LIMIT_STRING.fullmatch(part)
        unit = match and _UNITS_MS.get(match[3].lower())
        if not match or unit is None:
            raise ValueError(
                f"{part.strip()!r} is not a limit such as '5/10 seconds', '5 per minute' or '100/hour' "
                f"(units: ms, second, minute, hour, day)"
            )
        parsed.append((int(match[1]), int(match[2] or 1) * unit))
    return parsed


def _span_label(window_ms: int) -> str:
    """A name for a window, as the policies file's `per`: 10s, 1m, 2h, 1d."""
    for unit, ms in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if window_ms % ms == 0:
            return f"{window_ms // ms}{unit}"
    return f"{window_ms}ms"


def _from_string(text: str, type: str) -> dict[str, Any]:
    """`Limiter.limit`'s keyword arguments for a limit string and an algorithm."""
    type = canonical_algorithm(type)

    def one(limit: int, window_ms: int) -> dict[str, Any]:
        if type == "token_bucket":  # `limit` tokens, all back within the window
            return {"type": type, "capacity": limit, "refill_rate": limit * 1000 / window_ms}
        return {"type": type, "limit": limit, "window_ms": window_ms}

    parsed = parse_limits(text)
    if len(parsed) == 1:
        return one(*parsed[0])
    return {"limits": [{"name": _span_label(window), **one(limit, window)} for limit, window in parsed]}


# --- rules -----------------------------------------------------------------


@dataclass
class _Rule:
    """One limit (or set of limits, or policy) as the middleware applies it:
    checked at start-up, with its namespace, header values and options."""

    params: dict[str, Any]
    cost: int | CostFunc
    key_func: KeyFunc | None
    namespace: str
    window_seconds: list[int]
    on_service_error: str | None


def _rule(
    text: str | None = None,
    *,
    type: str = "fixed_window",
    limit: int | None = None,
    window_ms: int | None = None,
    capacity: int | None = None,
    refill_rate: float | None = None,
    burst: int | None = None,
    limits: Sequence[Limit | Mapping[str, Any]] | None = None,
    policy: str | None = None,
    failure_policy: str | None = None,
    cost: int | CostFunc = 1,
    key_func: KeyFunc | None = None,
    name: str | None = None,
    on_service_error: str | None = None,
    **unknown: Any,
) -> _Rule:
    if "policy_id" in unknown:
        raise TypeError(
            "policy_id is not an option: the headers' id is the name of the limit they describe; "
            "to choose it, name the limit: limits=[Limit(name=..., ...)]"
        )
    if unknown:
        raise TypeError(f"unknown option{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    params: dict[str, Any] = {
        "type": type,
        "limit": limit,
        "window_ms": window_ms,
        "capacity": capacity,
        "refill_rate": refill_rate,
        "burst": burst,
        "limits": limits,
        "policy": policy,
    }
    if text is not None:
        given = [k for k, v in params.items() if v is not None and k != "type"]
        if given:
            raise ValueError(f"{' and '.join(given)} cannot be combined with a limit string ({text!r})")
        params.update(_from_string(text, type))
    if on_service_error not in (None, "allow", "deny"):
        raise ValueError(f"on_service_error must be 'allow' or 'deny' (got {on_service_error!r})")
    # A mistake in the limits is a ValueError now, at start-up, not on every request.
    build_request(
        "start-up check", **params, failure_policy=failure_policy, cost=0 if callable(cost) else cost
    )
    if params["limits"] is not None:  # as Limits, so dicts are not checked again per request
        params["limits"] = [one if isinstance(one, Limit) else Limit(**one) for one in params["limits"]]
    else:
        params["type"] = canonical_algorithm(params["type"])
    checked = params["limits"]
    window_seconds: list[int] = []
    if checked is not None:
        window_seconds = [math.ceil(one.span_seconds()) for one in checked]
    elif policy is None:
        algorithm = ALGORITHMS[params["type"]]
        window_seconds = [math.ceil(algorithm.span_seconds(**{p: params[p] for p in algorithm.params}))]
    space = namespace(name, **params)
    params["failure_policy"] = failure_policy
    return _Rule(
        params=params,
        cost=cost,
        key_func=key_func,
        namespace=space,
        window_seconds=window_seconds,
        on_service_error=on_service_error,
    )


# --- the limiter -------------------------------------------------------------


class Limiter:
    """The limits of an app's routes, and how to apply them.

    - `key_func(request)`: who is limited (sync or async; default
      `client_ip`); `ipv6_subnet`: how `client_ip` keys an IPv6 client, by
      its network of that many bits (1 to 128, default 56), or whole
      (None or False); IPv4-mapped addresses are keyed as IPv4 either way;
    - `default_limits`: a limit string ("100/minute") or a dict of
      `limit()`'s options, for every route without a `@limiter.limit` of
      its own (None: those are not limited);
    - `exempt_paths`: paths never limited (health probes, metrics): exact
      paths, or prefixes ending in `*` ("/internal/*");
    - `on_service_error`: "allow" (default: fail open, visibly) or "deny"
      (503); `on_degraded(request, info)`: called (sync or async) for each
      request let through without a full decision (`Degraded`);
    - `headers`: add `RateLimit-Policy` / `RateLimit` (default True);
    - `prefix`: put before every key, before the namespace;
    - `client`: an `AsyncClient` to share; else one is made from `address`
      (default $RATELIMITD_ADDRESS, else 127.0.0.1:50051; TLS from
      RATELIMITD_TLS*), `deadline` (seconds, default 0.3), `leases` and
      `lease_threshold` (a hot `policy` decided in-process from a lease:
      on by default unless RATELIMITD_LEASES=off; see `AsyncClient`).

    `stats` counts the outcomes (`Stats`). Apply it with
    `app.add_middleware(RateLimitMiddleware, limiter=limiter)`.
    """

    def __init__(
        self,
        key_func: KeyFunc = client_ip,
        *,
        address: str | None = None,
        deadline: float = DEFAULT_DEADLINE,
        client: AsyncClient | None = None,
        leases: bool | None = None,
        lease_threshold: float = DEFAULT_LEASE_THRESHOLD,
        default_limits: str | Mapping[str, Any] | None = None,
        exempt_paths: Iterable[str] = (),
        on_service_error: str = "allow",
        on_degraded: Callable[[Request, Degraded], Any] | None = None,
        headers: bool = True,
        prefix: str = "",
        ipv6_subnet: int | None = DEFAULT_IPV6_SUBNET,
    ) -> None:
        if on_service_error not in ("allow", "deny"):
            raise ValueError(f"on_service_error must be 'allow' or 'deny' (got {on_service_error!r})")
        if not callable(key_func):
            raise ValueError(f"key_func must be a function of the request (got {key_func!r})")
        self.ipv6_subnet = check_ipv6_subnet(ipv6_subnet)
        if key_func is not client_ip and ipv6_subnet != DEFAULT_IPV6_SUBNET:
            raise ValueError(
                "ipv6_subnet applies to the default key (client_ip) only; with your own key_func, "
                "call ip_key(request.client.host, ipv6_subnet=...) in it"
            )
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a str (got {prefix!r})")
        self.key_func = key_func
        if client is not None and (leases is not None or lease_threshold != DEFAULT_LEASE_THRESHOLD):
            raise ValueError("leases and lease_threshold are the client's: give them to the AsyncClient")
        self.client = client or AsyncClient(address, deadline, leases=leases, lease_threshold=lease_threshold)
        self.on_service_error = on_service_error
        self.on_degraded = on_degraded
        self.headers = headers
        self.prefix = prefix
        self.stats = Stats()
        self._default: list[_Rule] = []
        if isinstance(default_limits, str):
            self._default = [_rule(default_limits)]
        elif default_limits is not None:
            self._default = [_rule(**default_limits)]
        paths = [exempt_paths] if isinstance(exempt_paths, str) else list(exempt_paths)
        self._exempt_paths = {p for p in paths if not p.endswith("*")}
        self._exempt_prefixes = tuple(p[:-1] for p in paths if p.endswith("*"))
        self._routes: dict[Any, list[_Rule]] = {}
        self._exempt: set[Any] = set()
        self._last_warning = -math.inf
        self._suppressed = 0
        self._current: ContextVar[_RequestState] = ContextVar(f"ratelimitd-limiter-{id(self)}")

    def limit(self, limit_string: str | None = None, /, **options: Any) -> Callable[[Any], Any]:
        """A decorator giving a route (its endpoint function or class) a
        limit: a string ("5/10 seconds", "5 per minute", "10/s;1000/h"),
        with `type=` to pick the algorithm (default "fixed_window"), or the
        options of `Client.check` (`type`, `limit`, `window_ms`, `capacity`,
        `refill_rate`, `burst`, `limits`, `policy`, `failure_policy`), and
        `cost` (int, or a function of the request, sync or async), `key_func`
        (instead of the limiter's), `name` (the namespace: routes with the
        same name share counters), `on_service_error`. Stack several: each is checked in turn.

        The decorator may go above or below the framework's (`@app.get(...)`):
        the middleware finds the route before the app runs, and where it
        cannot (a router it cannot look into), the endpoint (wrapped, its
        signature kept) checks its limits when called."""
        rule = _rule(limit_string, **options)

        def decorate(endpoint: Any) -> Any:
            if getattr(endpoint, "_ratelimitd_limiter", None) is self:  # stacked: one wrapper
                endpoint._ratelimitd_rules.insert(0, rule)
                return endpoint
            if not inspect.isfunction(endpoint):  # e.g. an HTTPEndpoint class: as it is
                self._routes.setdefault(endpoint, []).insert(0, rule)
                return endpoint
            rules = [rule]
            limited = self._wrap(endpoint, rules)
            self._routes[endpoint] = self._routes[limited] = rules
            return limited

        return decorate

    def exempt(self, endpoint: Any) -> Any:
        """A decorator: this route is never limited, default_limits or not."""
        self._exempt.add(endpoint)
        return endpoint

    # -- per request --

    def _rules_for(self, scope: Scope) -> tuple[bool, list[_Rule]]:
        """The limits of the route this request goes to, and whether that
        route was found (False: the default limits, and the route's
        decorator, if any, decides when the endpoint is called)."""
        path = scope.get("path", "")
        if path in self._exempt_paths or (self._exempt_prefixes and path.startswith(self._exempt_prefixes)):
            return True, []
        endpoint = _endpoint(scope)
        if endpoint is not None:
            for candidate in (endpoint, inspect.unwrap(endpoint)):
                if candidate in self._exempt:
                    return True, []
                if candidate in self._routes:
                    return True, self._routes[candidate]
        return False, self._default

    async def _decide(
        self, rules: list[_Rule], state: _RequestState
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]] | None:
        """Checks `rules` for the request: None if it may go on (its headers
        then in `state.headers`), else the refusal (status, body, headers)."""
        request = state.request
        reported: tuple[_Rule, Decision] | None = None
        degraded: list[tuple[str, Degraded]] = []
        for rule in rules:
            key = await self._key(rule, request)
            cost = await _maybe_await(rule.cost(request)) if callable(rule.cost) else rule.cost
            try:
                decision = await self.client.check(key, **rule.params, cost=cost)
            except RatelimitdError as err:
                # A bug in these arguments, not an outage: raised. (NOT_FOUND,
                # a policy missing from the server's file, is the server's
                # configuration: handled as an outage.)
                if err.code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                if (rule.on_service_error or self.on_service_error) == "deny":
                    self.stats.fail_closed += 1
                    self._warn(err, "refusing with 503")
                    return 503, {"error": "Rate limiter unavailable"}, []
                self._warn(err, "allowing")
                degraded.append((_reason(err), Degraded(_reason(err), key, error=err)))
                continue
            if decision.degraded:
                degraded.append(("store", Degraded("store", key, decision=decision)))
            if not decision.allowed:
                self.stats.decided += 1
                self.stats.denied += 1
                headers = _headers(self, rule, decision) + _degraded_header(degraded)
                if decision.retry_after_ms is not None:
                    retry = math.ceil(decision.retry_after_ms / 1000)
                    headers.append((b"retry-after", str(retry).encode()))
                return 429, {"error": "Rate limit exceeded"}, headers
            # The headers describe the limit the caller is closest to.
            if reported is None or decision.remaining < reported[1].remaining:
                reported = (rule, decision)

        if reported is not None:
            self.stats.decided += 1
        if any(reason != "store" for reason, _ in degraded):
            self.stats.fail_open += 1
        for _, info in degraded:
            await self._degraded(request, info)
        state.headers = _headers(self, *reported) if reported is not None else []
        state.headers += _degraded_header(degraded)
        return None

    def _wrap(self, endpoint: Callable[..., Any], rules: list[_Rule]) -> Callable[..., Any]:
        """The endpoint, checking `rules` itself when called if the
        middleware could not see, before routing, which route the request
        goes to (a router it cannot look into, e.g. FastAPI's included
        routers in recent versions). Async, whatever the endpoint: a sync
        one runs in the thread pool, as the framework would run it; the
        signature stays the endpoint's (`__wrapped__`), for FastAPI."""
        is_async = inspect.iscoroutinefunction(endpoint)

        @functools.wraps(endpoint)
        async def limited(*args: Any, **kwargs: Any) -> Any:
            state = self._current.get(None)
            if state is not None and not state.handled:
                state.handled = True
                refusal = await self._decide(rules, state)
                if refusal is not None:
                    status, body, headers = refusal
                    return JSONResponse(body, status, {k.decode(): v.decode() for k, v in headers})
            if is_async:
                return await endpoint(*args, **kwargs)
            return await run_in_threadpool(endpoint, *args, **kwargs)

        limited._ratelimitd_rules = rules  # type: ignore[attr-defined]
        limited._ratelimitd_limiter = self  # type: ignore[attr-defined]
        return limited

    async def _key(self, rule: _Rule, request: Request) -> str:
        key_func = rule.key_func or self.key_func
        if key_func is client_ip:  # the default key, by this limiter's ipv6_subnet
            key = client_ip(request, self.ipv6_subnet)
        else:
            key = await _maybe_await(key_func(request))
        if not isinstance(key, str) or not key:
            raise ValueError(f"key_func(request) must return a non-empty str (got {key!r})")
        key = self.prefix + rule.namespace + key
        if len(key.encode()) > MAX_KEY_BYTES:
            key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
        return key

    def _warn(self, err: RatelimitdError, action: str) -> None:
        # The first failure at once, then one line per WARN_INTERVAL with the
        # count in between, so an outage cannot flood the log.
        now = time.monotonic()
        if now - self._last_warning < WARN_INTERVAL:
            self._suppressed += 1
            return
        more = f" (and {self._suppressed} more failures since the last warning)" if self._suppressed else ""
        self._last_warning, self._suppressed = now, 0
        if err.code == grpc.StatusCode.NOT_FOUND:
            action += " until the server's policies file defines it"
        logger.warning("ratelimitd could not decide (%s); %s%s", err, action, more)

    async def _degraded(self, request: Request, info: Degraded) -> None:
        if self.on_degraded is None:
            return
        try:
            await _maybe_await(self.on_degraded(request, info))
        except Exception:  # the hook's failure must not fail the request
            logger.exception("on_degraded raised")


def _reason(err: RatelimitdError) -> str:
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return "unavailable"
    return "error"


def _endpoint(scope: Scope) -> Any:
    """The endpoint the app's router will pick for this request (None if no
    route matches), found before routing from the Starlette app
    (`scope["app"]`), through Mounts."""
    routes = getattr(scope.get("app"), "routes", None)
    return _find_endpoint(routes, scope) if routes else None


def _find_endpoint(routes: Sequence[Any], scope: Scope) -> Any:
    for route in routes:
        try:
            match, child = route.matches(scope)
        except Exception:  # a route of another kind: not ours to judge
            continue
        if match != Match.FULL:
            continue
        inner = getattr(route, "routes", None)
        if inner is not None and not hasattr(route, "endpoint"):  # a Mount or Host
            return _find_endpoint(inner, {**scope, **child})
        return getattr(route, "endpoint", None)
    return None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# --- the middleware ----------------------------------------------------------


class RateLimitMiddleware:
    """`app.add_middleware(RateLimitMiddleware, limiter=limiter)` applies a
    `Limiter`'s route limits. Without `limiter`, the keyword arguments are
    one limit for every route: `Limiter.limit`'s options (`limit=5,
    window_ms=10_000`, `policy="free-tier"`, `limits=[...]`, `cost`,
    `name`, ...) and `Limiter`'s (`key_func`, `ipv6_subnet`, `address`,
    `deadline`, `client`, `leases`, `lease_threshold`, `exempt_paths`,
    `on_service_error`, `on_degraded`, `headers`, `prefix`). Its limiter
    (and `stats`) is `.limiter`."""

    _LIMITER_OPTIONS = (
        "key_func",
        "ipv6_subnet",
        "address",
        "deadline",
        "client",
        "leases",
        "lease_threshold",
        "exempt_paths",
        "on_service_error",
        "on_degraded",
        "headers",
        "prefix",
    )

    def __init__(self, app: ASGIApp, *, limiter: Limiter | None = None, **options: Any) -> None:
        self.app = app
        if limiter is None:
            limiter_options = {k: options.pop(k) for k in self._LIMITER_OPTIONS if k in options}
            rule = _rule(**options)
            limiter = Limiter(**limiter_options)
            limiter._default = [rule]
        elif options:
            raise ValueError(f"{', '.join(options)}: give them to the Limiter, not beside limiter=")
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limiter = self.limiter
        request = Request(scope, receive)
        found, rules = limiter._rules_for(scope)
        # What the endpoint's decorator reads if this lookup could not see
        # the route (see Limiter._wrap), and the headers to add.
        state = _RequestState(request, handled=found)
        if rules:
            refusal = await limiter._decide(rules, state)
            if refusal is not None:
                await send_json(send, *refusal)
                return
        token = limiter._current.set(state)
        try:
            await self.app(scope, receive, _adding_headers(send, state))
        finally:
            limiter._current.reset(token)


@dataclass
class _RequestState:
    request: Request
    #: The route's own limits (or its exemption) are settled.
    handled: bool
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def _headers(limiter: Limiter, rule: _Rule, decision: Decision) -> list[tuple[bytes, bytes]]:
    if not limiter.headers:
        return []
    item = sf_string(policy_id(decision))
    policy = f"{item};q={decision.limit}"
    if 0 <= decision.most_restrictive < len(rule.window_seconds):
        policy += f";w={rule.window_seconds[decision.most_restrictive]}"
    reset = math.ceil(decision.reset_after_ms / 1000)
    return [
        (b"ratelimit-policy", policy.encode()),
        (b"ratelimit", f"{item};r={decision.remaining};t={reset}".encode()),
    ]


def policy_id(decision: Decision) -> str:
    """The id of the RateLimit-Policy and RateLimit item: the name of the
    limit the decision describes, as ratelimitd reports it (a policy's limit
    without a name by its `per`); without one, "default", or "default#<n>"
    for the n-th of several. Each limit keeps one id whichever is the most
    restrictive, as the draft's items identify one quota each; the Node
    client follows the same rule (clients/test-vectors/policy-ids.json)."""
    statuses = decision.limits
    i = decision.most_restrictive
    if not statuses or not 0 <= i < len(statuses):
        return "default"
    if statuses[i].name:
        return statuses[i].name
    return f"default#{i + 1}" if len(statuses) > 1 else "default"


def _degraded_header(degraded: list[tuple[str, Degraded]]) -> list[tuple[bytes, bytes]]:
    if not degraded:
        return []
    # The client's own fail-open first: it says more than the store's.
    reasons = sorted({reason for reason, _ in degraded}, key=lambda r: r == "store")
    return [(b"ratelimit-degraded", reasons[0].encode())]


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


def _adding_headers(send: Send, state: _RequestState) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and state.headers:
            message = {**message, "headers": [*message.get("headers", ()), *state.headers]}
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
