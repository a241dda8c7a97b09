"""The two clients, `Client` (blocking) and `AsyncClient` (asyncio): one
gRPC channel each, `check()` that asks ratelimitd's CheckLimit (one limit,
several, or a named policy) and `check_many()` its CheckLimits (a batch).
A policy checked often on one key is decided in-process from a lease
(`_lease.py`), unless `leases=False`.

Both check their arguments before any I/O (`ValueError`), give over-limit as
a `Decision` with `allowed=False`, and turn every failed call into a
`RatelimitdError` carrying the gRPC status code (a batch item's failure too,
in that item's place).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from ._lease import (
    DEFAULT_LEASE_THRESHOLD,
    UNKNOWN,
    AsyncLeases,
    LeaseBook,
    LeaseStats,
    ThreadedLeases,
    check_threshold,
    leases_enabled,
)
from ._pb import ratelimit_pb2_grpc
from ._request import (
    MAX_QUANTITY,
    Decision,
    Limit,
    RatelimitdError,
    batch_results,
    build_batch,
    build_request,
    check_deadline,
    decision,
)

#: Where ratelimitd is when neither `address` nor RATELIMITD_ADDRESS says.
DEFAULT_ADDRESS = "127.0.0.1:50051"
#: Seconds a check() may take before it fails with DEADLINE_EXCEEDED: 3x
#: ratelimitd's default --redis-command-timeout (100 ms), so that when Redis
#: is slow the server's own failure policy answers first (a decision marked
#: `degraded`), and the caller's fail-open (the middleware's
#: on_service_error="allow") is the last resort, not the usual path. A
#: decision on loopback takes well under a millisecond. The Node client has
#: the same default.
DEFAULT_DEADLINE = 0.3
#: The environment the clients read when not told otherwise (the Node
#: client reads the same).
ADDRESS_ENV = "RATELIMITD_ADDRESS"
TLS_ENV = "RATELIMITD_TLS"
TLS_CA_ENV = "RATELIMITD_TLS_CA"
TLS_CERT_ENV = "RATELIMITD_TLS_CERT"
TLS_KEY_ENV = "RATELIMITD_TLS_KEY"
#: gRPC backs off up to 120 s between reconnects by default: after an outage
#: of ratelimitd, calls would keep failing long after it is back.
DEFAULT_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


_monotonic = time.monotonic


def _channel_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return list({**dict(DEFAULT_CHANNEL_OPTIONS), **dict(options)}.items())


def _by_policy_alone(
    policy: str | None,
    cost: Any,
    type: str,
    limit: Any,
    window_ms: Any,
    capacity: Any,
    refill_rate: Any,
    burst: Any,
    failure_policy: Any,
    limits: Any,
) -> bool:
    """Whether a check names a policy and a valid cost and nothing else (no
    parameters of its own, no failure policy): one a lease may decide."""
    return (
        policy is not None
        and cost.__class__ is int
        and 0 <= cost <= MAX_QUANTITY
        and type == "fixed_window"
        and limit is None
        and window_ms is None
        and capacity is None
        and refill_rate is None
        and burst is None
        and failure_policy is None
        and limits is None
    )


def resolve_address(address: str | None) -> str:
    """`address`, else $RATELIMITD_ADDRESS, else DEFAULT_ADDRESS."""
    if address is None:
        address = os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    if not isinstance(address, str) or not address:
        raise ValueError(f"address must be a non-empty str such as '127.0.0.1:50051' (got {address!r})")
    return address


def credentials_from_env() -> grpc.ChannelCredentials | None:
    """TLS as the environment asks, or None (plaintext):

    - RATELIMITD_TLS=1 (or true): TLS, trusting the system's roots;
    - RATELIMITD_TLS_CA: a PEM file of the CA to trust instead (implies TLS);
    - RATELIMITD_TLS_CERT and RATELIMITD_TLS_KEY: the client's certificate
      and key, for a server with --tls-client-ca (mutual TLS; implies TLS).

    RATELIMITD_TLS=0 (or false, or unset) without the others: plaintext."""
    flag = os.environ.get(TLS_ENV, "").strip().lower()
    if flag not in ("", "0", "false", "1", "true"):
        raise ValueError(f"{TLS_ENV} must be 1, true, 0 or false (got {os.environ[TLS_ENV]!r})")
    ca, cert, key = (os.environ.get(name) or None for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV))
    if (cert is None) != (key is None):
        raise ValueError(f"{TLS_CERT_ENV} and {TLS_KEY_ENV} go together (mutual TLS): set both or neither")
    if flag in ("0", "false"):
        if ca or cert:
            raise ValueError(f"{TLS_ENV}={os.environ[TLS_ENV]} but {TLS_CA_ENV} or {TLS_CERT_ENV} is set")
        return None
    if flag == "" and not (ca or cert):
        return None

    def read(name: str, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as err:
            raise ValueError(f"{name}={path}: cannot read it: {err.strerror}") from None

    return grpc.ssl_channel_credentials(
        root_certificates=read(TLS_CA_ENV, ca),
        private_key=read(TLS_KEY_ENV, key),
        certificate_chain=read(TLS_CERT_ENV, cert),
    )


class Client:
    """Blocking client; thread-safe (one channel shared by all threads).

    `address`: default $RATELIMITD_ADDRESS, else 127.0.0.1:50051.
    `credentials` (e.g. `grpc.ssl_channel_credentials(...)`) for a server
    started with --tls-cert; without, TLS as RATELIMITD_TLS, RATELIMITD_TLS_CA,
    RATELIMITD_TLS_CERT and RATELIMITD_TLS_KEY say (`credentials_from_env`),
    else plaintext. `options`: gRPC channel arguments, over
    DEFAULT_CHANNEL_OPTIONS.

    `leases` (default: on, unless RATELIMITD_LEASES=off): a policy checked
    `lease_threshold` times a second or more on one key (default 20) is
    decided in-process, from units the server has spent for this client
    ahead of time, renewed by a background thread over one stream;
    `lease_stats()` counts how. `leases=False`: every check is a CheckLimit.
    """

    def __init__(
        self,
        address: str | None = None,
        deadline: float = DEFAULT_DEADLINE,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        leases: bool | None = None,
        lease_threshold: float = DEFAULT_LEASE_THRESHOLD,
    ) -> None:
        self.address = address = resolve_address(address)
        self.deadline = check_deadline(deadline)
        threshold = check_threshold(lease_threshold)
        #: Whether policies checked often are decided from leases.
        self.leases = leases_enabled(leases)
        if credentials is None:
            credentials = credentials_from_env()
        options = _channel_options(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(address, options)
        else:
            self._channel = grpc.secure_channel(address, credentials, options)
        stub = ratelimit_pb2_grpc.RateLimiterStub(self._channel)
        self._check_limit = stub.CheckLimit
        self._check_limits = stub.CheckLimits
        self._book = LeaseBook(threshold) if self.leases else None
        self._leases = ThreadedLeases(self._book, self._channel) if self._book else None

    def check(
        self,
        key: str,
        *,
        type: str = "fixed_window",
        limit: int | None = None,
        window_ms: int | None = None,
        capacity: int | None = None,
        refill_rate: float | None = None,
        burst: int | None = None,
        cost: int = 1,
        failure_policy: str | None = None,
        deadline: float | None = None,
        limits: Sequence[Limit | Mapping[str, Any]] | None = None,
        policy: str | None = None,
    ) -> Decision:
        """May `key` spend `cost` units now?

        `type`, by the server's names (the short aliases in brackets):
        - `"fixed_window"` (`"fixed"`, the default): `limit` per `window_ms`;
        - `"sliding_window"` (`"sliding"`): at most `limit` in any `window_ms`;
        - `"token_bucket"` (`"token"`): `capacity` tokens, refilled at
          `refill_rate` per second;
        - `"gcra"`: `limit` per `window_ms` sustained, `burst` at once
          (default: limit);
        - `"sliding_window_counter"`: about `limit` per `window_ms`, from two
          counts.

        `cost=0` looks without spending. `failure_policy` ("fail-closed",
        "fail-open", "local", as the server's --failure-policy) overrides the
        server's for when Redis cannot answer. `deadline` (seconds)
        overrides the client's.

        Instead of `type` and its parameters: `limits`, several limits
        (`Limit`s, or dicts of their arguments) decided together, all or
        nothing; or `policy`, the name of a policy in the server's policies
        file (one it does not know: RatelimitdError NOT_FOUND). The Decision
        then answers for them all, and its `limits` holds each one's part.
        A policy checked often on one key is decided from the client's
        lease on it when it has one (see the class), with no call.
        """
        book = self._book
        local = UNKNOWN
        if book is not None and _by_policy_alone(
            policy, cost, type, limit, window_ms, capacity, refill_rate, burst, failure_policy, limits
        ):
            # The book checked the key and policy of a pair it knows when it
            # first saw them: a hot pair's check is decided before building
            # (and checking) a request it will not send.
            with book.lock:
                local, wake, _ = book.decide(policy, key, cost, _monotonic(), known=True)
            if wake:
                self._leases.wake()  # type: ignore[union-attr]
            if local is not None and local is not UNKNOWN:
                return local
        request = build_request(
            key,
            type=type,
            limit=limit,
            window_ms=window_ms,
            capacity=capacity,
            refill_rate=refill_rate,
            burst=burst,
            cost=cost,
            failure_policy=failure_policy,
            limits=limits,
            policy=policy,
        )
        if local is UNKNOWN and policy is not None and book is not None:
            with book.lock:
                local, wake, _ = book.decide(policy, request.key, request.cost, _monotonic())
            if wake:
                self._leases.wake()  # type: ignore[union-attr]
            if local is not None:
                return local
        timeout = self.deadline if deadline is None else check_deadline(deadline)
        try:
            response = self._check_limit(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RatelimitdError.from_rpc_error(err) from None
        return decision(response)

    def check_many(
        self, items: Sequence[Mapping[str, Any]], *, deadline: float | None = None
    ) -> list[Decision | RatelimitdError]:
        """Many independent checks in one call: `items` are dicts of
        `check()`'s arguments, `key` included (`deadline` is the call's).

        One result per item, in order: its Decision, or the RatelimitdError
        the server answered for it (e.g. NOT_FOUND for an unknown policy),
        returned in its place, not raised. A bad item raises ValueError
        before anything is sent; a call that fails as a whole (ratelimitd
        down, more items than its --max-batch-size) raises RatelimitdError.
        """
        request = build_batch(items)
        timeout = self.deadline if deadline is None else check_deadline(deadline)
        try:
            response = self._check_limits(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RatelimitdError.from_rpc_error(err) from None
        return batch_results(response, len(request.requests))

    def lease_stats(self) -> dict[str, int]:
        """How checks by policy were decided, since the client was made:
        `local_allowed` and `local_denied` (from leases, with no call),
        `fallbacks` (a hot policy and key sent to CheckLimit: no units yet,
        spent, expired, the stream down), and the stream's `asks` (first
        asks and renewals), `grants` (that carried units), `errors`
        (grants refusing a policy, or the server busy), `releases` and
        `streams` (opened); `held`: the units held now. All 0 with leases
        off."""
        if self._book is None:
            return LeaseStats().as_dict()
        with self._book.lock:
            return self._book.stats_now(time.monotonic())

    def close(self) -> None:
        """Gives back the units the client holds, ends the lease stream and
        its thread, and closes the channel."""
        if self._leases is not None:
            self._leases.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client, with the same arguments and results as `Client`.

    It may be created anywhere, even before an event loop runs (e.g. at
    import time, in a middleware's constructor): the channel is opened on the
    first check(), in the loop that runs it. gRPC's asyncio channels belong
    to one loop, so a check() from another loop (a second test, a second
    TestClient) opens a new channel there. Leases as `Client`'s, renewed by
    a task on the channel's loop.
    """

    def __init__(
        self,
        address: str | None = None,
        deadline: float = DEFAULT_DEADLINE,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        leases: bool | None = None,
        lease_threshold: float = DEFAULT_LEASE_THRESHOLD,
    ) -> None:
        self.address = resolve_address(address)
        self.deadline = check_deadline(deadline)
        threshold = check_threshold(lease_threshold)
        #: Whether policies checked often are decided from leases.
        self.leases = leases_enabled(leases)
        self._book = LeaseBook(threshold) if self.leases else None
        self._leases = AsyncLeases(self._book) if self._book else None
        self._credentials = credentials if credentials is not None else credentials_from_env()
        self._options = _channel_options(options)
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stub: ratelimit_pb2_grpc.RateLimiterStub | None = None

    def _stub_for_loop(self) -> ratelimit_pb2_grpc.RateLimiterStub:
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.address, self._options)
            else:
                self._channel = grpc.aio.secure_channel(self.address, self._credentials, self._options)
            self._loop = loop
            self._stub = ratelimit_pb2_grpc.RateLimiterStub(self._channel)
            if self._leases is not None:
                self._leases.forget_loop()
        return self._stub

    async def check(
        self,
        key: str,
        *,
        type: str = "fixed_window",
        limit: int | None = None,
        window_ms: int | None = None,
        capacity: int | None = None,
        refill_rate: float | None = None,
        burst: int | None = None,
        cost: int = 1,
        failure_policy: str | None = None,
        deadline: float | None = None,
        limits: Sequence[Limit | Mapping[str, Any]] | None = None,
        policy: str | None = None,
    ) -> Decision:
        """May `key` spend `cost` units now? As `Client.check` (a leased
        policy included)."""
        book = self._book
        local = UNKNOWN
        if book is not None and _by_policy_alone(
            policy, cost, type, limit, window_ms, capacity, refill_rate, burst, failure_policy, limits
        ):
            # As in Client.check: a pair the book knows is decided first.
            self._stub_for_loop()
            with book.lock:
                local, wake, awaited = book.decide(policy, key, cost, _monotonic(), known=True)
            if local is not UNKNOWN:
                if wake:
                    self._leases.wake(self._channel)  # type: ignore[union-attr, arg-type]
                if local is not None:
                    if wake or awaited:
                        await asyncio.sleep(0)  # as below
                    return local
        request = build_request(
            key,
            type=type,
            limit=limit,
            window_ms=window_ms,
            capacity=capacity,
            refill_rate=refill_rate,
            burst=burst,
            cost=cost,
            failure_policy=failure_policy,
            limits=limits,
            policy=policy,
        )
        stub = self._stub_for_loop()
        if local is UNKNOWN and policy is not None and book is not None:
            with book.lock:
                local, wake, awaited = book.decide(policy, request.key, request.cost, _monotonic())
            if wake:
                self._leases.wake(self._channel)  # type: ignore[union-attr, arg-type]
            if local is not None:
                if wake or awaited:
                    # A local decision awaits nothing: let the stream's task
                    # send the ask, or read its grant, now, even when the
                    # caller decides many in a row without awaiting
                    # anything else.
                    await asyncio.sleep(0)
                return local
        timeout = self.deadline if deadline is None else check_deadline(deadline)
        try:
            response = await stub.CheckLimit(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RatelimitdError.from_rpc_error(err) from None
        return decision(response)

    async def check_many(
        self, items: Sequence[Mapping[str, Any]], *, deadline: float | None = None
    ) -> list[Decision | RatelimitdError]:
        """Many independent checks in one call. As `Client.check_many`."""
        request = build_batch(items)
        timeout = self.deadline if deadline is None else check_deadline(deadline)
        try:
            response = await self._stub_for_loop().CheckLimits(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RatelimitdError.from_rpc_error(err) from None
        return batch_results(response, len(request.requests))

    def lease_stats(self) -> dict[str, int]:
        """How checks by policy were decided: as `Client.lease_stats`."""
        if self._book is None:
            return LeaseStats().as_dict()
        with self._book.lock:
            return self._book.stats_now(time.monotonic())

    async def close(self) -> None:
        """Gives back the units the client holds, ends the lease stream and
        its task, and closes the channel opened in the running loop (if
        any). The client may be used again: a check() opens a new channel."""
        if self._leases is not None:
            await self._leases.close()
        channel, self._channel, self._loop, self._stub = self._channel, None, None, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
