"""The two clients, `Client` (blocking) and `AsyncClient` (asyncio): one
gRPC channel each, one `check()` that asks ratelimitd's CheckLimit.

Both check their arguments before any I/O (`ValueError`), give over-limit as
a `Decision` with `allowed=False`, and turn every failed call into a
`RatelimitdError` carrying the gRPC status code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from ._pb import ratelimit_pb2_grpc
from ._request import Decision, RatelimitdError, build_request, check_deadline, decision

DEFAULT_ADDRESS = "127.0.0.1:50051"
#: Seconds a check() may take before it fails with DEADLINE_EXCEEDED. A
#: decision on loopback takes well under a millisecond; the budget is short
#: so a stuck limiter cannot stall the caller, but above ratelimitd's default
#: --redis-command-timeout (100 ms), so that when Redis hangs the server's
#: failure policy (fail_open, local) answers before the client gives up.
#: The Node client has the same default.
DEFAULT_DEADLINE = 0.15
#: gRPC backs off up to 120 s between reconnects by default: after an outage
#: of ratelimitd, calls would keep failing long after it is back.
DEFAULT_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def _channel_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return list({**dict(DEFAULT_CHANNEL_OPTIONS), **dict(options)}.items())


class Client:
    """Blocking client; thread-safe (one channel shared by all threads).

    `credentials` (e.g. `grpc.ssl_channel_credentials(...)`) for a server
    started with --tls-cert; plaintext without. `options`: gRPC channel
    arguments, over DEFAULT_CHANNEL_OPTIONS.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        deadline: float = DEFAULT_DEADLINE,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.address = address
        self.deadline = check_deadline(deadline)
        options = _channel_options(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(address, options)
        else:
            self._channel = grpc.secure_channel(address, credentials, options)
        self._check_limit = ratelimit_pb2_grpc.RateLimiterStub(self._channel).CheckLimit

    def check(
        self,
        key: str,
        *,
        type: str = "fixed",
        limit: int | None = None,
        window_ms: int | None = None,
        capacity: int | None = None,
        refill_rate: float | None = None,
        burst: int | None = None,
        cost: int = 1,
        failure_policy: str | None = None,
        deadline: float | None = None,
    ) -> Decision:
        """May `key` spend `cost` units now?

        `type="fixed"` or `"sliding"` take `limit` and `window_ms`;
        `type="token"` takes `capacity` and `refill_rate` (tokens per
        second). `type="gcra"` takes `limit` and `window_ms`, and `burst`
        (default: limit); `type="sliding_counter"` takes `limit` and
        `window_ms`. `cost=0` looks without spending. `failure_policy`
        ("fail_closed", "fail_open", "local") overrides the server's for
        when Redis cannot answer. `deadline` (seconds) overrides the client's.
        """
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
        )
        timeout = self.deadline if deadline is None else check_deadline(deadline)
        try:
            response = self._check_limit(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RatelimitdError.from_rpc_error(err) from None
        return decision(response)

    def close(self) -> None:
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
    TestClient) opens a new channel there.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        deadline: float = DEFAULT_DEADLINE,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.address = address
        self.deadline = check_deadline(deadline)
        self._credentials = credentials
        self._options = _channel_options(options)
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._check_limit = None

    def _stub_call(self):
        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.address, self._options)
            else:
                self._channel = grpc.aio.secure_channel(self.address, self._credentials, self._options)
            self._loop = loop
            self._check_limit = ratelimit_pb2_grpc.RateLimiterStub(self._channel).CheckLimit
        return self._check_limit

    async def check(
        self,
        key: str,
        *,
        type: str = "fixed",
        limit: int | None = None,
        window_ms: int | None = None,
        capacity: int | None = None,
        refill_rate: float | None = None,
        burst: int | None = None,
        cost: int = 1,
        failure_policy: str | None = None,
        deadline: float | None = None,
    ) -> Decision:
        """May `key` spend `cost` units now? As `Client.check`."""
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
        )
        timeout = self.deadline if deadline is None else check_deadline(deadline)
        try:
            response = await self._stub_call()(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RatelimitdError.from_rpc_error(err) from None
        return decision(response)

    async def close(self) -> None:
        """Closes the channel opened in the running loop (if any)."""
        channel, self._channel, self._loop = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
