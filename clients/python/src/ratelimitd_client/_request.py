"""What the sync and asyncio clients share: checking arguments, the table of
algorithms, and the conversions between protobuf and Python. No I/O here.

Arguments are checked here, before any call, against the same rules the
server applies (docs/api.md, "Input rules"), so a mistake is a `ValueError` naming
the argument at the line that made it, not an INVALID_ARGUMENT later.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration

from ._pb import ratelimit_pb2 as pb

# The server's bounds (src/limit.rs).
MAX_KEY_BYTES = 1024
MAX_QUANTITY = 10**15
MAX_SLIDING_WINDOW_LIMIT = 100_000
MAX_WINDOW_MS = 366 * 24 * 60 * 60 * 1000
# A limit's or a policy's name (src/limit.rs, check_name).
MAX_NAME_BYTES = 64
_NAME = re.compile(r"[A-Za-z0-9_.-]+")

_T = TypeVar("_T")


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
    #: For a check with `limits=` or `policy=`: each limit's part, in order
    #: (a policy's in its file's order). Empty for one limit. The fields
    #: above then answer for the request as a whole: `allowed` only if every
    #: limit allows (and if not, none spent anything); `retry_after_ms` until
    #: every limit would allow (None if one never would); `limit`,
    #: `remaining` and `reset_after_ms` those of `limits[most_restrictive]`.
    limits: tuple[LimitStatus, ...] = ()
    #: Which of `limits` the top-level `limit`, `remaining` and
    #: `reset_after_ms` describe: the denying limit with the longest wait,
    #: else the one with the fewest units left. 0 for one limit.
    most_restrictive: int = 0


@dataclass(frozen=True)
class LimitStatus:
    """One limit's part of a decision on several (`Decision.limits`).
    Durations as in `Decision`."""

    #: The limit's name; "" if it has none.
    name: str
    #: Whether this limit alone allows the cost. When the request as a whole
    #: is denied, no limit spent anything, whatever this says.
    allowed: bool
    limit: int
    #: Units left on this limit after the decision.
    remaining: int
    reset_after_ms: int
    #: 0 when this limit allows; else until it would; None when it never will.
    retry_after_ms: int | None
    #: The cost exceeds this limit itself.
    cost_exceeds_limit: bool
    #: A policy limit in shadow mode: decided and reported, never denies.
    shadow: bool


_new_object = object.__new__
_set_attribute = object.__setattr__


def frozen_instance(cls: type[_T], fields: dict[str, Any]) -> _T:
    """The frozen dataclass `cls` with `fields` (all of them, in order; the
    dict becomes the instance's own), equal to `cls(**fields)`. Made without
    `__init__`, which sets each field through object.__setattr__ (a frozen
    dataclass's rule) and would take most of a leased decision's time."""
    instance = _new_object(cls)
    _set_attribute(instance, "__dict__", fields)
    return instance


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

    @classmethod
    def from_status(cls, status: Any) -> RatelimitdError:
        """From a google.rpc.Status (a CheckLimits item's error)."""
        return cls(_STATUS_CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message)


#: google.rpc.Code number → grpc.StatusCode.
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


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
    return pb.SlidingWindowCounter(limit=_quantity("limit", limit, MAX_QUANTITY), window=_window(window_ms))


#: `type=` → algorithm, by the server's own names (the proto's oneof fields,
#: the policies file's and the Envoy YAML's `algorithm:`). Adding one is a
#: proto field, a builder and a row.
ALGORITHMS: dict[str, Algorithm] = {
    "fixed_window": Algorithm(
        "fixed_window",
        ("limit", "window_ms"),
        _fixed_window,
        lambda limit, window_ms: window_ms / 1000,
    ),
    "sliding_window": Algorithm(
        "sliding_window",
        ("limit", "window_ms"),
        _sliding_window,
        lambda limit, window_ms: window_ms / 1000,
    ),
    "token_bucket": Algorithm(
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
    "sliding_window_counter": Algorithm(
        "sliding_window_counter",
        ("limit", "window_ms"),
        _sliding_window_counter,
        lambda limit, window_ms: window_ms / 1000,
    ),
}

#: The short names (`fixed`, `sliding`, `token`), kept as aliases (the Node client takes the same).
ALGORITHM_ALIASES = {
    "fixed": "fixed_window",
    "sliding": "sliding_window",
    "token": "token_bucket",
}

#: Spellings that were removed (0.x, unpublished): an error names the right one.
_REMOVED_ALGORITHMS = {
    "sliding_counter": "sliding_window_counter",
    "slidingCounter": "sliding_window_counter",
    "slidingWindowCounter": "sliding_window_counter",
    "fixedWindow": "fixed_window",
    "slidingWindow": "sliding_window",
    "tokenBucket": "token_bucket",
}

#: `failure_policy=` → the proto's FailurePolicy (None: the server's own),
#: spelt as the server's --failure-policy values.
FAILURE_POLICIES = {
    "fail-closed": pb.FAIL_CLOSED,
    "fail-open": pb.FAIL_OPEN,
    "local": pb.LOCAL,
}

_REMOVED_FAILURE_POLICIES = {
    "fail_closed": "fail-closed",
    "fail_open": "fail-open",
    "failClosed": "fail-closed",
    "failOpen": "fail-open",
}


def canonical_algorithm(type: Any) -> str:
    """The server's name of algorithm `type` (an alias resolved), or a
    ValueError that lists them (and names the right one for a removed
    spelling)."""
    if isinstance(type, str):
        if type in ALGORITHMS:
            return type
        if type in ALGORITHM_ALIASES:
            return ALGORITHM_ALIASES[type]
        if type in _REMOVED_ALGORITHMS:
            raise ValueError(f"type {type!r} is not an algorithm name: use {_REMOVED_ALGORITHMS[type]!r}")
    aliases = ", ".join(f"{alias!r} ({name})" for alias, name in ALGORITHM_ALIASES.items())
    raise ValueError(
        f"type must be one of {', '.join(map(repr, ALGORITHMS))}, or the aliases {aliases} (got {type!r})"
    )


def failure_policy_value(failure_policy: Any) -> int:
    """The proto's FailurePolicy for `failure_policy`, or a ValueError."""
    if isinstance(failure_policy, str):
        if failure_policy in FAILURE_POLICIES:
            return FAILURE_POLICIES[failure_policy]
        if failure_policy in _REMOVED_FAILURE_POLICIES:
            raise ValueError(
                f"failure_policy {failure_policy!r} is not a failure policy: use "
                f"{_REMOVED_FAILURE_POLICIES[failure_policy]!r} (the server's --failure-policy names)"
            )
    raise ValueError(
        f"failure_policy must be one of {', '.join(map(repr, FAILURE_POLICIES))} or None "
        f"(got {failure_policy!r})"
    )


# --- building a request ---------------------------------------------------

#: check()'s keyword arguments that parameterize one limit's algorithm.
_ALGORITHM_ARGUMENTS = ("limit", "window_ms", "capacity", "refill_rate", "burst")


@dataclass(frozen=True)
class Limit:
    """One limit of a check with several: `check(key, limits=[Limit(...), ...])`.

    `type` and its parameters as `check()`'s. `name` (optional; 1 to 64
    ASCII letters, digits, '_', '-' and '.') comes back in its `LimitStatus`
    and gives it a counter of its own; `key` (default: the request's) is the
    key it counts on; `cost` (default: the request's) the units it spends.
    Checked when made: a ValueError names the argument. A dict of the same
    keyword arguments may stand for a Limit wherever one is taken.
    """

    type: str = "fixed_window"
    limit: int | None = None
    window_ms: int | None = None
    capacity: int | None = None
    refill_rate: float | None = None
    burst: int | None = None
    name: str | None = None
    key: str | None = None
    cost: int | None = None
    # The protobuf form, built (and so checked) once.
    _message: pb.Limit = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        message = pb.Limit()
        algorithm_field, algorithm = _algorithm(
            self.type, {name: getattr(self, name) for name in _ALGORITHM_ARGUMENTS}
        )
        # Kept by the server's name: `Limit(type="fixed")` is `Limit(type="fixed_window")`.
        object.__setattr__(self, "type", canonical_algorithm(self.type))
        getattr(message, algorithm_field).CopyFrom(algorithm)
        if self.name is not None:
            message.name = _name("name", self.name)
        if self.key is not None:
            message.key = _key("key", self.key)
        if self.cost is not None:
            message.cost = _quantity("cost", self.cost, MAX_QUANTITY, lowest=0)
        object.__setattr__(self, "_message", message)

    def span_seconds(self) -> float:
        """The span in seconds its limit covers (as `Algorithm.span_seconds`)."""
        algorithm = ALGORITHMS[self.type]
        return algorithm.span_seconds(**{name: getattr(self, name) for name in algorithm.params})


_LIMIT_ARGUMENTS = tuple(f.name for f in fields(Limit) if f.init)


def build_request(
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
    limits: Sequence[Limit | Mapping[str, Any]] | None = None,
    policy: str | None = None,
) -> pb.CheckLimitRequest:
    """The CheckLimitRequest for these arguments (those of `Client.check`),
    or a ValueError naming what is wrong."""
    # With limits, key may be "" when each limit has its own (_limits checks).
    request = pb.CheckLimitRequest(key=key if limits is not None and key == "" else _key("key", key))
    given = {
        "limit": limit,
        "window_ms": window_ms,
        "capacity": capacity,
        "refill_rate": refill_rate,
        "burst": burst,
    }
    if limits is None and policy is None:
        algorithm_field, algorithm = _algorithm(type, given)
        getattr(request, algorithm_field).CopyFrom(algorithm)
    else:
        _check_one_form(type, given, limits, policy)
        if policy is not None:
            request.policy = _name("policy", policy)
        else:
            request.limits.extend(one._message for one in _limits(key, limits))

    request.cost = _quantity("cost", cost, MAX_QUANTITY, lowest=0)
    if failure_policy is not None:
        request.failure_policy = failure_policy_value(failure_policy)
    return request


def _key(name: str, key: Any) -> str:
    if not isinstance(key, str):
        raise ValueError(f"{name} must be a str (got {key!r})")
    try:
        key_bytes = len(key.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise ValueError(f"{name} must be valid UTF-8 text: {err}") from None
    if not 1 <= key_bytes <= MAX_KEY_BYTES:
        raise ValueError(f"{name} must be 1 to {MAX_KEY_BYTES} bytes of UTF-8 (got {key_bytes})")
    return key


def _name(argument: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_BYTES:
        raise ValueError(
            f"{argument} must be 1 to {MAX_NAME_BYTES} ASCII letters, digits, '_', '-' and '.' (got {name!r})"
        )
    return name


def _algorithm(type: Any, given: dict[str, Any]) -> tuple[str, Any]:
    """The oneof field and message of `type` with the arguments `given`."""
    algorithm = ALGORITHMS[canonical_algorithm(type)]
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
    return algorithm.field, message


def _check_one_form(type: Any, given: dict[str, Any], limits: Any, policy: Any) -> None:
    """A request sets one algorithm, or limits, or a policy: never two."""
    if limits is not None and policy is not None:
        raise ValueError(
            "limits and policy cannot be combined: a request sets one algorithm, or limits, or a policy"
        )
    stray = [name for name, value in given.items() if value is not None]
    if type not in ("fixed_window", "fixed"):  # the default: the one-limit form's type
        stray.insert(0, "type")
    if stray:
        form, whose = (
            ("limits", "each limit has its own")
            if limits is not None
            else ("policy", "the policy's limits are in the server's policies file")
        )
        raise ValueError(
            f"{' and '.join(stray)} do{'es' if len(stray) == 1 else ''} not apply with {form}=: {whose}"
        )


def _limits(key: str, limits: Any) -> list[Limit]:
    """Each of `limits` as a Limit, checked as the server would: names
    unique, no two unnamed limits on one counter (same key and type), a key
    of its own for each when the request's is ""."""
    if isinstance(limits, str | bytes | Mapping | Limit) or not isinstance(limits, Sequence):
        raise ValueError(f"limits must be a list of Limit or dict (got {limits!r})")
    if not limits:
        raise ValueError("limits must hold at least one limit")
    checked: list[Limit] = []
    names: dict[str, int] = {}
    counters: dict[tuple[str, str], int] = {}
    for i, item in enumerate(limits):
        try:
            one = _as_limit(item)
        except ValueError as err:
            raise ValueError(f"limits[{i}]: {err}") from None
        if one.key is None and not key:
            raise ValueError(f"limits[{i}]: key is required when the request has no key")
        if one.name is not None:
            if one.name in names:
                raise ValueError(
                    f"limits[{i}]: name {one.name!r} is already the name of limits[{names[one.name]}]"
                )
            names[one.name] = i
        else:
            counter = (one.key or key, one.type)
            if counter in counters:
                raise ValueError(
                    f"limits[{i}]: counts on the same counter as limits[{counters[counter]}] (same key and "
                    "type): give one of them a name, or its own key"
                )
            counters[counter] = i
        checked.append(one)
    return checked


def _as_limit(item: Any) -> Limit:
    if isinstance(item, Limit):
        return item
    if not isinstance(item, Mapping):
        raise ValueError(f"must be a Limit or a dict of its arguments (got {item!r})")
    _check_known(item, _LIMIT_ARGUMENTS, "Limit")
    return Limit(**item)


def _check_known(arguments: Mapping[Any, Any], takes: tuple[str, ...], of: str) -> None:
    unknown = [name for name in arguments if name not in takes]
    if unknown:
        verb = "is not an argument" if len(unknown) == 1 else "are not arguments"
        raise ValueError(f"{' and '.join(map(repr, unknown))} {verb} of {of}, which takes {', '.join(takes)}")


def build_batch(items: Sequence[Mapping[str, Any]]) -> pb.CheckLimitsRequest:
    """The CheckLimitsRequest for `Client.check_many(items)`: each item a
    dict of `check()`'s arguments, `key` included. A ValueError names the
    item (`items[3]: ...`)."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise ValueError(f"items must be a list of dicts of check() arguments (got {items!r})")
    if not items:
        raise ValueError("items must hold at least one request")
    batch = pb.CheckLimitsRequest()
    for i, item in enumerate(items):
        try:
            batch.requests.append(_item_request(item))
        except ValueError as err:
            raise ValueError(f"items[{i}]: {err}") from None
    return batch


def _item_request(item: Any) -> pb.CheckLimitRequest:
    if not isinstance(item, Mapping):
        raise ValueError(f"must be a dict of check() arguments (got {item!r})")
    _check_known(item, _CHECK_ARGUMENTS, "check() in a batch")
    if "key" not in item:
        raise ValueError("needs a key")
    return build_request(**item)


_CHECK_ARGUMENTS = tuple(inspect.signature(build_request).parameters)


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
        limits=tuple(_limit_status(status) for status in response.limits),
        most_restrictive=response.most_restrictive,
    )


def _limit_status(status: pb.LimitStatus) -> LimitStatus:
    return LimitStatus(
        name=status.name,
        allowed=status.allowed,
        limit=status.limit,
        remaining=status.remaining,
        reset_after_ms=_ceil_ms(status.reset_after),
        retry_after_ms=_ceil_ms(status.retry_after) if status.HasField("retry_after") else None,
        cost_exceeds_limit=status.cost_exceeds_limit,
        shadow=status.shadow,
    )


def batch_results(response: pb.CheckLimitsResponse, count: int) -> list[Decision | RatelimitdError]:
    """One Decision or RatelimitdError per item of a batch of `count`, in order."""
    if len(response.results) != count:
        raise RatelimitdError(
            grpc.StatusCode.INTERNAL,
            f"ratelimitd answered {len(response.results)} results for {count} requests",
        )
    results: list[Decision | RatelimitdError] = []
    for result in response.results:
        match result.WhichOneof("result"):
            case "response":
                results.append(decision(result.response))
            case "error":
                results.append(RatelimitdError.from_status(result.error))
            case _:
                results.append(RatelimitdError(grpc.StatusCode.UNKNOWN, "ratelimitd answered no result"))
    return results


def _ceil_ms(duration: Duration) -> int:
    nanos = duration.seconds * 1_000_000_000 + duration.nanos
    return -(-nanos // 1_000_000)
