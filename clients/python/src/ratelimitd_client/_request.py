"""What the sync and asyncio clients share: checking arguments, the table of
algorithms, and the conversions between protobuf and Python. No I/O here.

Arguments are checked here, before any call, against the same rules the
server applies (README "Input rules"), so a mistake is a `ValueError` naming
the argument at the line that made it, not an INVALID_ARGUMENT later.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from ._pb import ratelimit_pb2 as pb

# The server's bounds (src/limit.rs).
MAX_KEY_BYTES = 1024
MAX_QUANTITY = 10**15
MAX_SLIDING_WINDOW_LIMIT = 100_000
MAX_WINDOW_MS = 366 * 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class Decision:
    """ratelimitd's answer. Being over the limit is a decision
    (`allowed=False`), not an exception.

    Durations are whole milliseconds, rounded up from the server's
    microseconds, so waiting `retry_after_ms` is never too early.
    """

    allowed: bool
    #: The limit (or bucket capacity) in force.
    limit: int
    #: Units left after this decision.
    remaining: int
    #: Until the key is back to its full quota (0 when it is full).
    reset_after_ms: int
    #: 0 when allowed; else until this cost would be allowed. None when it
    #: never will be (see cost_exceeds_limit).
    retry_after_ms: int | None
    #: cost > limit: denied, spends nothing, and always will be denied.
    cost_exceeds_limit: bool
    #: Redis could not decide and the failure policy answered instead.
    degraded: bool


class RatelimitdError(Exception):
    """The call failed: no decision was made. `code` is the gRPC status
    (`grpc.StatusCode.UNAVAILABLE`, `DEADLINE_EXCEEDED`, ...), `details` the
    server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> RatelimitdError:
        # Sync errors are grpc.Call objects, asyncio ones AioRpcError: both
        # have code() and details().
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code, details or "")


# --- the algorithms -------------------------------------------------------


@dataclass(frozen=True)
class Algorithm:
    """One `type=`: the CheckLimitRequest oneof field it sets, the check()
    keyword arguments it requires, how they become its message, and the span
    in seconds its limit covers (the window; for a bucket, the time an empty
    one takes to fill), e.g. for a RateLimit-Policy header's `w`."""

    field: str
    params: tuple[str, ...]
    build: Callable[..., Any]
    span_seconds: Callable[..., float]
    #: Keyword arguments it takes but does not require.
    optional: tuple[str, ...] = ()


def _fixed_window(limit: int, window_ms: int) -> pb.FixedWindow:
    return pb.FixedWindow(limit=_quantity("limit", limit, MAX_QUANTITY), window=_window(window_ms))


def _sliding_window(limit: int, window_ms: int) -> pb.SlidingWindow:
    return pb.SlidingWindow(
        limit=_quantity("limit", limit, MAX_SLIDING_WINDOW_LIMIT), window=_window(window_ms)
    )


def _token_bucket(capacity: int, refill_rate: float) -> pb.TokenBucket:
    capacity = _quantity("capacity", capacity, MAX_QUANTITY)
    if isinstance(refill_rate, bool) or not isinstance(refill_rate, int | float):
        raise ValueError(f"refill_rate must be a number of tokens per second (got {refill_rate!r})")
    if not math.isfinite(refill_rate) or refill_rate <= 0:
        raise ValueError(f"refill_rate must be finite and positive (got {refill_rate!r})")
    if capacity / refill_rate > MAX_WINDOW_MS / 1000:
        raise ValueError(
            f"refill_rate {refill_rate!r} is too slow: refilling {capacity} tokens would take "
            "more than 366 days"
        )
    return pb.TokenBucket(capacity=capacity, refill_per_second=float(refill_rate))


def _gcra(limit: int, window_ms: int, burst: int | None = None) -> pb.Gcra:
    limit = _quantity("limit", limit, MAX_QUANTITY)
    burst = limit if burst is None else _quantity("burst", burst, MAX_QUANTITY)
    return pb.Gcra(rate=limit, period=_window(window_ms), burst=burst)


def _sliding_window_counter(limit: int, window_ms: int) -> pb.SlidingWindowCounter:
    return pb.SlidingWindowCounter(
        limit=_quantity("limit", limit, MAX_QUANTITY), window=_window(window_ms)
    )


#: `type=` → algorithm. Adding one is a proto field, a builder and a row.
ALGORITHMS: dict[str, Algorithm] = {
    "fixed": Algorithm(
        "fixed_window",
        ("limit", "window_ms"),
        _fixed_window,
        lambda limit, window_ms: window_ms / 1000,
    ),
    "sliding": Algorithm(
        "sliding_window",
        ("limit", "window_ms"),
        _sliding_window,
        lambda limit, window_ms: window_ms / 1000,
    ),
    "token": Algorithm(
        "token_bucket",
        ("capacity", "refill_rate"),
        _token_bucket,
        lambda capacity, refill_rate: capacity / refill_rate,
    ),
    # `limit` per `window_ms` sustained, bursts of `burst` (default: limit).
    "gcra": Algorithm(
        "gcra",
        ("limit", "window_ms"),
        _gcra,
        lambda limit, window_ms, burst=None: window_ms / 1000,
        optional=("burst",),
    ),
    "sliding_counter": Algorithm(
        "sliding_window_counter",
        ("limit", "window_ms"),
        _sliding_window_counter,
        lambda limit, window_ms: window_ms / 1000,
    ),
}

#: `failure_policy=` → the proto's FailurePolicy (None: the server's own).
FAILURE_POLICIES = {
    "fail_closed": pb.FAIL_CLOSED,
    "fail_open": pb.FAIL_OPEN,
    "local": pb.LOCAL,
}


# --- building a request ---------------------------------------------------


def build_request(
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
) -> pb.CheckLimitRequest:
    """The CheckLimitRequest for these arguments (those of `Client.check`),
    or a ValueError naming what is wrong."""
    if not isinstance(key, str):
        raise ValueError(f"key must be a str (got {key!r})")
    try:
        key_bytes = len(key.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise ValueError(f"key must be valid UTF-8 text: {err}") from None
    if not 1 <= key_bytes <= MAX_KEY_BYTES:
        raise ValueError(f"key must be 1 to {MAX_KEY_BYTES} bytes of UTF-8 (got {key_bytes})")

    algorithm = ALGORITHMS.get(type) if isinstance(type, str) else None
    if algorithm is None:
        raise ValueError(f"type must be one of {', '.join(map(repr, ALGORITHMS))} (got {type!r})")
    given = {
        "limit": limit,
        "window_ms": window_ms,
        "capacity": capacity,
        "refill_rate": refill_rate,
        "burst": burst,
    }
    missing = [name for name in algorithm.params if given[name] is None]
    if missing:
        raise ValueError(f"type={type!r} needs {' and '.join(missing)}")
    takes = algorithm.params + algorithm.optional
    extra = [name for name, value in given.items() if value is not None and name not in takes]
    if extra:
        raise ValueError(
            f"{' and '.join(extra)} do{'es' if len(extra) == 1 else ''} not apply to type={type!r}, "
            f"which takes {' and '.join(takes)}"
        )
    message = algorithm.build(
        **{name: given[name] for name in takes if given[name] is not None or name in algorithm.params}
    )

    request = pb.CheckLimitRequest(key=key, cost=_quantity("cost", cost, MAX_QUANTITY, lowest=0))
    getattr(request, algorithm.field).CopyFrom(message)
    if failure_policy is not None:
        if failure_policy not in FAILURE_POLICIES:
            raise ValueError(
                f"failure_policy must be one of {', '.join(map(repr, FAILURE_POLICIES))} or None "
                f"(got {failure_policy!r})"
            )
        request.failure_policy = FAILURE_POLICIES[failure_policy]
    return request


def _quantity(name: str, value: Any, highest: int, lowest: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int (got {value!r})")
    if not lowest <= value <= highest:
        raise ValueError(f"{name} must be {lowest} to {highest} (got {value})")
    return value


def _window(window_ms: Any) -> Duration:
    window_ms = _quantity("window_ms", window_ms, MAX_WINDOW_MS)
    return Duration(seconds=window_ms // 1000, nanos=window_ms % 1000 * 1_000_000)


def check_deadline(deadline: Any) -> float:
    """A deadline in seconds: finite and positive."""
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        raise ValueError(f"deadline must be a number of seconds (got {deadline!r})")
    if not math.isfinite(deadline) or deadline <= 0:
        raise ValueError(f"deadline must be finite and positive (got {deadline!r})")
    return float(deadline)


# --- reading the response -------------------------------------------------


def decision(response: pb.CheckLimitResponse) -> Decision:
    return Decision(
        allowed=response.allowed,
        limit=response.limit,
        remaining=response.remaining,
        reset_after_ms=_ceil_ms(response.reset_after),
        retry_after_ms=_ceil_ms(response.retry_after) if response.HasField("retry_after") else None,
        cost_exceeds_limit=response.cost_exceeds_limit,
        degraded=response.degraded,
    )


def _ceil_ms(duration: Duration) -> int:
    nanos = duration.seconds * 1_000_000_000 + duration.nanos
    return -(-nanos // 1_000_000)
