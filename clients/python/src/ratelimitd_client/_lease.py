"""Leases: a hot policy decided in-process, from units ratelimitd has already
spent for this client (the Leases stream of proto/ratelimitd/v1/lease.proto).

How a client uses them, per (policy, key) of `check(key, policy=...)`:

1. It counts the calls over a sliding second. At `lease_threshold` a second
   the pair is hot: the client opens its one Leases stream (lazily) and asks
   for units. Until a grant comes, calls go to CheckLimit as always.
2. A grant's units are a tranche, valid until `valid_for` after the client
   SENT the ask. A call whose cost the unexpired units cover spends them (the
   earliest-expiring first) and is allowed with no call at all; its
   `remaining` is the lowest `remaining` of the grant's limit statuses plus
   the units still held. A grant with `retry_after` (the policy has nothing
   left for this client) denies calls locally until then, and while the
   renewal sent at that time is on its way. Anything else
   (units spent, expired, none yet, the stream down) goes to CheckLimit.
3. In the background, never in a call's way, it renews: when `renew_after`
   has passed, when under a quarter of the lease is left (of what was held
   once the last grant was in), or when a call found too few units; each
   ask reports what it holds, the demand, and what it admitted, denied and
   sent to CheckLimit since the previous one.
4. A pair not checked for IDLE_RELEASE seconds gives back what it holds
   (`release`); `close()` gives back everything and ends the stream.

A grant refusing the policy (INVALID_ARGUMENT: its limits are not all
`lease: true`; NOT_FOUND: no such policy) makes the client decide that
policy by CheckLimit from then on; RESOURCE_EXHAUSTED or UNAVAILABLE wait
ERROR_BACKOFF before asking again (twice as long after each in a row, up
to ERROR_BACKOFF_LAST). A broken stream is reopened, with a
growing wait, while a pair is hot; the tranches held meanwhile stay good
until they expire.

`LeaseBook` holds that state and decides, with no I/O; `ThreadedLeases`
(for `Client`: a daemon thread) and `AsyncLeases` (for `AsyncClient`: a task
on its loop) run the stream. Every `LeaseBook` method is called with
`book.lock` held, and is given `now`, `time.monotonic()`.

A leased decision is the client's whole cost of a check, so its path is
kept short: a pair the book already knows is decided before `check()`
builds a request (its key and policy were checked when it came in), the
units held and their first expiry are kept as counts, and the Decision is
made from fields prepared with the grant.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from ._pb import lease_pb2, lease_pb2_grpc
from ._request import Decision, LimitStatus, frozen_instance

#: Calls per second of one policy and key at which the client leases.
DEFAULT_LEASE_THRESHOLD = 20.0
#: RATELIMITD_LEASES=off (or 0, false) turns leases off where the
#: `leases` argument is not given.
LEASES_ENV = "RATELIMITD_LEASES"
#: The sliding window hotness (and an ask's `demand`) is measured over, s.
HOT_WINDOW = 1.0
#: The shortest span an ask's `demand` is measured over, s.
SHORTEST_SPAN = 0.1
#: A leased policy and key not checked for this long gives back its units, s.
IDLE_RELEASE = 5.0
#: After a grant's RESOURCE_EXHAUSTED or UNAVAILABLE, wait this long before
#: asking again on that policy and key, s; doubled for each such grant in
#: a row, up to the last.
ERROR_BACKOFF = 1.0
ERROR_BACKOFF_LAST = 30.0
#: Waits before reopening a broken stream: doubled on each failure in a
#: row, from the first to the last, s.
STREAM_BACKOFF_FIRST = 0.2
STREAM_BACKOFF_LAST = 10.0
#: The longest close() waits for the server to take the releases, s.
CLOSE_WAIT = 1.0
#: The longest the stream's sender sleeps without looking at its timers, s.
LONGEST_TICK = 1.0
#: Asks per message: a key is up to 1 KiB, and the server takes messages of
#: up to its --max-request-bytes (1 MiB by default; more ends the stream).
ASKS_PER_MESSAGE = 256


def _messages(asks: list[Any]) -> Iterator[lease_pb2.LeaseRequest]:
    for start in range(0, len(asks), ASKS_PER_MESSAGE):
        yield lease_pb2.LeaseRequest(asks=asks[start : start + ASKS_PER_MESSAGE])


logger = logging.getLogger("ratelimitd_client.leases")

#: `_Lease.in_flight` of an ask due that the stream's sender has yet to send.
_PENDING = -1

_REFUSING = {grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.NOT_FOUND.value[0]}


def leases_enabled(leases: Any) -> bool:
    """`leases` if given (True or False), else RATELIMITD_LEASES: on (1,
    true; the default when unset) or off (0, false)."""
    if leases is not None:
        if not isinstance(leases, bool):
            raise ValueError(f"leases must be True, False or None (got {leases!r})")
        return leases
    flag = os.environ.get(LEASES_ENV, "").strip().lower()
    if flag in ("", "on", "1", "true"):
        return True
    if flag in ("off", "0", "false"):
        return False
    raise ValueError(f"{LEASES_ENV} must be on, off, 1, 0, true or false (got {os.environ[LEASES_ENV]!r})")


def check_threshold(threshold: Any) -> float:
    """A lease threshold in calls per second: finite and positive."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ValueError(f"lease_threshold must be a number of calls per second (got {threshold!r})")
    if not math.isfinite(threshold) or threshold <= 0:
        raise ValueError(f"lease_threshold must be finite and positive (got {threshold!r})")
    return float(threshold)


def _seconds(duration: Any) -> float:
    return duration.seconds + duration.nanos / 1e9


def _ceil_ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000 - 1e-6))


#: What `LeaseBook.decide(..., known=True)` answers for a pair it has not
#: seen: its arguments have not been checked yet.
UNKNOWN: Any = object()


@dataclass(slots=True)
class _Tranche:
    units: int
    expires_at: float
    #: The stream that granted it: only what is spent from the current
    #: stream's grants is reported as `admitted` on it.
    stream: int


@dataclass(frozen=True, slots=True)
class _Status:
    """One limit of a grant, as it stood after the lease's spend."""

    name: str
    limit: int
    remaining: int
    reset_at: float
    shadow: bool
    #: Its LimitStatus's fields in an allowed decision, but for `remaining`
    #: and `reset_after_ms`: a leased decision copies them rather than
    #: building each field again.
    allowed_fields: dict[str, Any] = field(compare=False)


def _status(name: str, limit: int, remaining: int, reset_at: float, shadow: bool) -> _Status:
    allowed_fields = {
        "name": name,
        "allowed": True,
        "limit": limit,
        "remaining": remaining,
        "reset_after_ms": 0,
        "retry_after_ms": 0,
        "cost_exceeds_limit": False,
        "shadow": shadow,
    }
    return _Status(name, limit, remaining, reset_at, shadow, allowed_fields)


def _most_restrictive(statuses: tuple[_Status, ...]) -> int:
    """The limit with the fewest units left (shadow limits only if all are)."""
    enforced = [i for i, s in enumerate(statuses) if not s.shadow] or list(range(len(statuses)))
    return min(enforced, key=lambda i: statuses[i].remaining)


@dataclass(slots=True)
class _Lease:
    """One policy and key: its hotness, and once hot, its lease."""

    hits: deque[float] = field(default_factory=deque)
    first_check: float = 0.0
    last_check: float = 0.0
    #: Hot: a lease is wanted (asked, held, or being renewed).
    leasing: bool = False
    #: Sorted by expiry.
    tranches: list[_Tranche] = field(default_factory=list)
    #: The units of `tranches`, and when the first of them expires (inf:
    #: none): a decision reads them without going over the tranches.
    units: int = 0
    lapse: float = math.inf
    statuses: tuple[_Status, ...] = ()
    #: Of the last grant's statuses: the most restrictive, and the fields of
    #: an allowed Decision but for `remaining`, `reset_after_ms` and `limits`.
    restrictive: int = 0
    allowed_fields: dict[str, Any] = field(default_factory=dict)
    #: The units held just after the last grant that had any (what it
    #: brought, and what it topped up): under a quarter of it, renew.
    last_units: int = 0
    renew_at: float = 0.0
    deny_until: float = -math.inf
    backoff_until: float = -math.inf
    #: The id of the ask awaiting its grant (_PENDING: about to be sent).
    in_flight: int | None = None
    #: The last grant held it to its share or to an empty limit: no units,
    #: and a retry_after.
    held_back: bool = False
    #: The stream the last ask went on (0: none yet), and when it was sent.
    stream: int = 0
    asked_at: float = -math.inf
    #: A call found too few units: renew.
    short: bool = False
    #: Grants with an error in a row.
    errors: int = 0
    # Since the last ask.
    admitted: int = 0
    denied: int = 0
    fallbacks: int = 0

    def held(self, now: float) -> int:
        """Drops the expired tranches; the units of the others."""
        if now >= self.lapse:
            tranches = self.tranches
            while tranches and tranches[0].expires_at <= now:
                tranches.pop(0)
            self.tally()
        return self.units

    def tally(self) -> None:
        """Counts `units` and `lapse` again, after `tranches` changed."""
        self.units = sum(t.units for t in self.tranches)
        self.lapse = self.tranches[0].expires_at if self.tranches else math.inf

    def count(self, now: float) -> int:
        """The checks of the last HOT_WINDOW (dropping the older ones)."""
        while self.hits and self.hits[0] <= now - HOT_WINDOW:
            self.hits.popleft()
        return len(self.hits)

    def demand(self, now: float) -> float:
        """Checks per second: over the last HOT_WINDOW, or since the first
        check if that is more recent (a pair that just turned hot is asked
        for at the rate it turned hot at, not at its count so far)."""
        span = min(HOT_WINDOW, max(now - self.first_check, SHORTEST_SPAN))
        return self.count(now) / span


@dataclass(frozen=True)
class _Sent:
    sent_at: float
    policy: str
    key: str
    release: bool
    stream: int


@dataclass
class LeaseStats:
    """What `Client.lease_stats()` returns (as a dict), counted since the
    client was made; `held` is a gauge."""

    #: Checks allowed from a lease, with no call.
    local_allowed: int = 0
    #: Checks denied in-process while a grant said the policy had nothing
    #: left (its retry_after), with no call.
    local_denied: int = 0
    #: Checks of a hot policy and key sent to CheckLimit because no lease
    #: could decide them (none yet, its units spent or expired, the stream down).
    fallbacks: int = 0
    #: Asks sent for units (first asks and renewals).
    asks: int = 0
    #: Grants received that carried units.
    grants: int = 0
    #: Grants received with an error (a policy refused, or the server busy).
    errors: int = 0
    #: Leases given back (idle, or on close()).
    releases: int = 0
    #: Lease streams opened (more than one: the stream broke and was reopened).
    streams: int = 0
    #: Units held now, unspent and unexpired, over every policy and key.
    held: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class LeaseBook:
    """Every policy and key a client checks by policy, their leases, and the
    asks awaiting grants. No I/O: the stream runners feed it grants and send
    the asks it makes. Call its methods with `lock` held."""

    def __init__(self, threshold: float) -> None:
        self.lock = threading.Lock()
        self.threshold = threshold
        self.stats = LeaseStats()
        #: The stream now open (a number never reused), 0 when none is.
        self.stream = 0
        #: close() was called: release everything, open nothing more.
        self.closing = False
        self._leases: dict[tuple[str, str], _Lease] = {}
        #: Policies the server refused to lease: decided by CheckLimit.
        self._refused: set[str] = set()
        self._sent: dict[int, _Sent] = {}
        self._ids = itertools.count(1)
        self._streams = itertools.count(1)
        self._swept = 0.0

    # -- deciding --

    def decide(
        self, policy: str, key: str, cost: int, now: float, known: bool = False
    ) -> tuple[Decision | None, bool, bool]:
        """The local decision of `check(key, policy=policy, cost=cost)`, or
        None for CheckLimit to decide; whether an ask may be due (for the
        stream runner to look, or to start); and whether a grant is awaited
        on this pair (for an asyncio caller to let the stream's task read
        it). `known`: decide only a pair already seen (its arguments were
        checked then), else answer UNKNOWN and count nothing."""
        if self.closing or policy in self._refused:
            return None, False, False
        lease = self._leases.get((policy, key))
        if lease is None:
            if known:
                return UNKNOWN, False, False
            lease = self._leases[(policy, key)] = _Lease(first_check=now)
        lease.last_check = now
        hits = lease.hits
        hits.append(now)
        oldest = now - HOT_WINDOW
        while hits[0] <= oldest:
            hits.popleft()
        if not lease.leasing:
            if len(hits) < self.threshold * HOT_WINDOW:
                self._sweep(now)
                return None, False, False
            lease.leasing = True
            return None, True, False
        held = lease.units if now < lease.lapse else lease.held(now)
        if held >= cost and held > 0 and lease.statuses:
            awaited = lease.in_flight is not None
            self._spend(lease, cost)
            self.stats.local_allowed += 1
            held -= cost
            return self._allowed(lease, held, now), not awaited and self._due(lease, held, now), awaited
        if held < cost and self.stream and self._due(lease, held, now):
            # A wait just ended, or the units ran out: the ask goes out
            # before this check is decided, so that a pair held back keeps
            # denying until its answer rather than going to CheckLimit.
            lease.in_flight = _PENDING
            asking = True
        else:
            asking = False
        awaited = lease.in_flight is not None
        # Held back (the last grant said wait): it denies until then, and
        # while the renewal sent when the wait ended is on its way.
        if lease.statuses and (now < lease.deny_until or (lease.held_back and awaited)):
            lease.denied += 1
            self.stats.local_denied += 1
            return self._denied(lease, held, now), asking, awaited
        # Renew for it, unless a grant is on its way (it answers) or the
        # cost is more than a lease holds (only CheckLimit can decide it).
        lease.short = not awaited and (cost <= lease.last_units or not lease.last_units)
        lease.fallbacks += 1
        self.stats.fallbacks += 1
        return None, asking or self._due(lease, held, now), awaited

    def _spend(self, lease: _Lease, cost: int) -> None:
        """Spends `cost` of the units held (at most what is held), the
        earliest-expiring first."""
        first = lease.tranches[0]
        if first.units > cost:
            first.units -= cost
            lease.units -= cost
            if first.stream == self.stream:
                lease.admitted += cost
            return
        left = cost
        for tranche in lease.tranches:
            taken = min(left, tranche.units)
            tranche.units -= taken
            if tranche.stream == self.stream:
                lease.admitted += taken
            left -= taken
            if not left:
                break
        lease.tranches = [t for t in lease.tranches if t.units]
        lease.tally()

    def _allowed(self, lease: _Lease, held: int, now: float) -> Decision:
        limits = []
        for s in lease.statuses:
            status = s.allowed_fields.copy()
            status["remaining"] = s.remaining + held
            status["reset_after_ms"] = _ceil_ms(s.reset_at - now)
            limits.append(frozen_instance(LimitStatus, status))
        top = limits[lease.restrictive]
        decision = lease.allowed_fields.copy()
        decision["remaining"] = top.remaining
        decision["reset_after_ms"] = top.reset_after_ms
        decision["limits"] = tuple(limits)
        return frozen_instance(Decision, decision)

    def _denied(self, lease: _Lease, held: int, now: float) -> Decision:
        statuses = lease.statuses
        retry_ms = max(1, _ceil_ms(lease.deny_until - now))
        i = lease.restrictive
        limits = tuple(
            frozen_instance(
                LimitStatus,
                {
                    "name": s.name,
                    "allowed": j != i,
                    "limit": s.limit,
                    "remaining": 0 if j == i else s.remaining + held,
                    "reset_after_ms": _ceil_ms(s.reset_at - now),
                    "retry_after_ms": retry_ms if j == i else 0,
                    "cost_exceeds_limit": False,
                    "shadow": s.shadow,
                },
            )
            for j, s in enumerate(statuses)
        )
        return frozen_instance(
            Decision,
            {
                "allowed": False,
                "limit": limits[i].limit,
                "remaining": 0,
                "reset_after_ms": limits[i].reset_after_ms,
                "retry_after_ms": retry_ms,
                "cost_exceeds_limit": False,
                "degraded": False,
                "limits": limits,
                "most_restrictive": i,
            },
        )

    def _sweep(self, now: float) -> None:
        """Forgets, once a second, the pairs that are neither hot nor leased."""
        if now - self._swept < HOT_WINDOW:
            return
        self._swept = now
        cold = [
            k
            for k, lease in self._leases.items()
            if not lease.leasing and lease.last_check <= now - HOT_WINDOW
        ]
        for k in cold:
            del self._leases[k]

    # -- asking --

    def _due(self, lease: _Lease, held: int, now: float) -> bool:
        """Whether an ask on `lease` should go now."""
        if not lease.leasing or lease.in_flight is not None:
            return False
        if now < lease.backoff_until or now < lease.deny_until:
            return False
        if lease.stream == 0 or lease.stream != self.stream:
            return True
        # Renewing a pair not checked since its last ask would only hold
        # units for nothing: it is released once idle.
        return lease.last_check > lease.asked_at and (
            now >= lease.renew_at or lease.short or held * 4 < lease.last_units
        )

    def stats_now(self, now: float) -> dict[str, int]:
        """The counters, and the units held now."""
        self.stats.held = sum(lease.held(now) for lease in self._leases.values())
        return self.stats.as_dict()

    def wants_stream(self) -> bool:
        """Whether a stream should be open: a pair is hot (or leased)."""
        return not self.closing and any(lease.leasing for lease in self._leases.values())

    def asks(self, now: float) -> list[lease_pb2.LeaseAsk]:
        """The asks to send now on the open stream (recorded as sent now):
        first asks and renewals, and releases of pairs idle for
        IDLE_RELEASE; on closing, the releases of everything (each once the
        grant it awaits, if any, is in, so that its units go back too)."""
        asks = []
        for (policy, key), lease in list(self._leases.items()):
            held = lease.held(now)
            if lease.in_flight == _PENDING:
                lease.in_flight = None
                if not self.closing:
                    asks.append(self._ask(policy, key, lease, held, now, release=False))
                    continue
            idle = self.closing or now - lease.last_check >= IDLE_RELEASE
            if idle and lease.in_flight is None:
                if lease.leasing and lease.stream == self.stream:
                    asks.append(self._ask(policy, key, lease, held, now, release=True))
                del self._leases[(policy, key)]
            elif idle:
                continue  # released once its grant is in
            elif not lease.leasing:
                if now - lease.last_check > HOT_WINDOW:
                    del self._leases[(policy, key)]
            elif self._due(lease, held, now):
                asks.append(self._ask(policy, key, lease, held, now, release=False))
        return asks

    def _ask(self, policy: str, key: str, lease: _Lease, held: int, now: float, release: bool) -> Any:
        ask_id = next(self._ids)
        ask = lease_pb2.LeaseAsk(
            id=ask_id,
            policy=policy,
            key=key,
            demand=lease.demand(now),
            held=held,
            admitted=lease.admitted,
            denied=lease.denied,
            fallbacks=lease.fallbacks,
            release=release,
        )
        lease.admitted = lease.denied = lease.fallbacks = 0
        lease.short = False
        lease.stream = self.stream
        lease.asked_at = now
        self._sent[ask_id] = _Sent(now, policy, key, release, self.stream)
        if release:
            self.stats.releases += 1
        else:
            lease.in_flight = ask_id
            self.stats.asks += 1
        return ask

    def next_look(self, now: float) -> float:
        """Seconds until a timer of a pair may make an ask due (at most
        LONGEST_TICK): renewal, the end of a denial or a backoff, an idle
        release, an expiry."""
        soonest = now + LONGEST_TICK
        for lease in self._leases.values():
            times = [lease.last_check + IDLE_RELEASE]
            if lease.leasing and lease.in_flight is None:
                times += [lease.renew_at, lease.deny_until, lease.backoff_until]
                times += [t.expires_at for t in lease.tranches[:1]]
            soonest = min([soonest, *(t for t in times if t > now)])
        return max(0.005, soonest - now)

    def forget_idle(self, now: float) -> None:
        """With no stream to release them on: forgets the pairs idle for
        IDLE_RELEASE (their units lapse with their time), and the cold ones."""
        for k, lease in list(self._leases.items()):
            idle = now - lease.last_check
            if idle >= IDLE_RELEASE or (not lease.leasing and idle > HOT_WINDOW):
                del self._leases[k]

    def holds_nothing(self) -> bool:
        """No pair is left to lease, nor an ask awaiting its grant: the
        stream may end."""
        return not self._sent and not any(lease.leasing for lease in self._leases.values())

    # -- grants --

    def grant(self, grant: lease_pb2.LeaseGrant, now: float) -> None:
        """Takes in a grant (and forgets one it does not expect)."""
        sent = self._sent.pop(grant.id, None)
        if sent is None or sent.release:
            return
        lease = self._leases.get((sent.policy, sent.key))
        if lease is None or lease.in_flight != grant.id:
            return
        lease.in_flight = None
        if grant.HasField("error") and grant.error.code != 0:
            self.stats.errors += 1
            if grant.error.code in _REFUSING:
                self._refused.add(sent.policy)
                for k in [k for k in self._leases if k[0] == sent.policy]:
                    del self._leases[k]
            else:
                lease.errors += 1
                lease.backoff_until = now + min(ERROR_BACKOFF * 2 ** (lease.errors - 1), ERROR_BACKOFF_LAST)
            return
        lease.errors = 0
        valid_for = _seconds(grant.valid_for)
        if grant.units > 0:
            tranche = _Tranche(grant.units, sent.sent_at + valid_for, sent.stream)
            bisect.insort(lease.tranches, tranche, key=lambda t: t.expires_at)
            lease.tally()
            lease.last_units = lease.held(now)
            self.stats.grants += 1
        if grant.limits:
            statuses = tuple(
                _status(s.name, s.limit, s.remaining, now + _seconds(s.reset_after), s.shadow)
                for s in grant.limits
            )
            i = _most_restrictive(statuses)
            lease.statuses, lease.restrictive = statuses, i
            lease.allowed_fields = {
                "allowed": True,
                "limit": statuses[i].limit,
                "remaining": 0,
                "reset_after_ms": 0,
                "retry_after_ms": 0,
                "cost_exceeds_limit": False,
                "degraded": False,
                "limits": (),
                "most_restrictive": i,
            }
        if grant.HasField("renew_after"):
            lease.renew_at = sent.sent_at + _seconds(grant.renew_after)
        else:
            lease.renew_at = sent.sent_at + (valid_for / 2 if grant.units else ERROR_BACKOFF)
        lease.held_back = grant.HasField("retry_after") and grant.units == 0
        if grant.HasField("retry_after"):
            lease.deny_until = sent.sent_at + _seconds(grant.retry_after)
        elif grant.units == 0:
            lease.backoff_until = now + ERROR_BACKOFF

    # -- the stream --

    def reopen(self) -> None:
        """After a close: nothing held, nothing asked, leasing again."""
        self.closing = False
        self.stream = 0
        self._leases.clear()
        self._sent.clear()

    def stream_opened(self) -> int:
        self.stream = next(self._streams)
        self.stats.streams += 1
        return self.stream

    def stream_closed(self, stream: int) -> None:
        """The stream `stream` ended: its asks will not be answered."""
        if self.stream != stream:
            return
        self.stream = 0
        self._sent.clear()
        for lease in self._leases.values():
            lease.in_flight = None
            # What was admitted from its grants is not the next stream's to
            # hear: that stream's server granted none of it.
            lease.admitted = 0


class ThreadedLeases:
    """Runs a `LeaseBook`'s stream for the blocking `Client`: a daemon
    thread reads the grants; the asks go through a request iterator fed by
    a queue (gRPC's own thread consumes it). Started by the first hot pair;
    it ends when no pair is left."""

    def __init__(self, book: LeaseBook, channel: grpc.Channel) -> None:
        self.book = book
        self._lease = lease_pb2_grpc.LeasesStub(channel).Lease
        self._thread: threading.Thread | None = None
        self._wakeup: queue.SimpleQueue[bool] | None = None
        # A wake-up is queued that the sender has not yet acted on: every
        # check until it runs would otherwise queue another.
        self._wake_pending = False
        self._stopping = threading.Event()

    def wake(self) -> None:
        """An ask may be due: starts the thread, or wakes the sender."""
        if self._wake_pending:
            return
        with self.book.lock:
            if self.book.closing:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ratelimitd-leases", daemon=True)
                self._thread.start()
            elif self._wakeup is not None:
                self._wake_pending = True
                self._wakeup.put(True)

    def close(self) -> None:
        """Releases everything and ends the stream and the thread."""
        with self.book.lock:
            self.book.closing = True
            thread, wakeup = self._thread, self._wakeup
        self._stopping.set()
        if wakeup is not None:
            wakeup.put(True)
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT)

    def _run(self) -> None:
        try:
            self._streams()
        except BaseException:
            with self.book.lock:
                self._thread = None
                self._wake_pending = False
            raise

    def _streams(self) -> None:
        book = self.book
        backoff = STREAM_BACKOFF_FIRST
        while True:
            with book.lock:
                book.forget_idle(time.monotonic())
                if not book.wants_stream():
                    self._thread = None  # under the lock: wake() starts another
                    self._wake_pending = False
                    return
                stream = book.stream_opened()
                wakeup: queue.SimpleQueue[bool] = queue.SimpleQueue()
                self._wakeup = wakeup
                self._wake_pending = False
            granted = False
            try:
                for response in self._lease(self._requests(stream, wakeup)):
                    with book.lock:
                        now = time.monotonic()
                        for grant in response.grants:
                            book.grant(grant, now)
                        closing = book.closing
                    granted = True
                    if closing:  # a grant the releases waited for
                        wakeup.put(True)
            except grpc.RpcError:
                pass  # the stream broke: reopened below while a pair is hot
            except Exception:  # a bug: checks go on by CheckLimit meanwhile
                logger.exception("the lease stream failed")
            finally:
                with book.lock:
                    book.stream_closed(stream)
                    self._wakeup = None
                    self._wake_pending = False
                wakeup.put(False)  # ends the request iterator if gRPC still reads it
            backoff = STREAM_BACKOFF_FIRST if granted else min(backoff * 2, STREAM_BACKOFF_LAST)
            self._stopping.wait(backoff)

    def _requests(self, stream: int, wakeup: queue.SimpleQueue[bool]) -> Iterator[lease_pb2.LeaseRequest]:
        book = self.book
        while True:
            with book.lock:
                if book.stream != stream:
                    return
                # What is due is read below: a check from now on wakes it
                # again.
                self._wake_pending = False
                now = time.monotonic()
                asks = book.asks(now)
                done = book.holds_nothing()  # closing: once the releases are answered
                wait = book.next_look(now)
            yield from _messages(asks)
            if done:
                return
            with contextlib.suppress(queue.Empty):
                if not wakeup.get(timeout=wait):
                    return


class AsyncLeases:
    """Runs a `LeaseBook`'s stream for `AsyncClient`: a task on the loop of
    its channel reads the grants; the asks go through an async request
    iterator woken by an asyncio.Event. Started by the first hot pair; it
    ends when no pair is left."""

    def __init__(self, book: LeaseBook) -> None:
        self.book = book
        self._task: asyncio.Task[None] | None = None
        self._event: asyncio.Event | None = None

    def wake(self, channel: grpc.aio.Channel) -> None:
        """An ask may be due: starts the task on the running loop, or wakes
        the sender. Called in the channel's loop."""
        if self.book.closing:
            return
        if self._task is None or self._task.done():
            lease = lease_pb2_grpc.LeasesStub(channel).Lease
            self._event = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(lease, self._event))
        elif self._event is not None:
            self._event.set()

    def forget_loop(self) -> None:
        """The client moved to another event loop: the task of the old one
        (over, or never to run again) is left behind, and its stream with it."""
        with self.book.lock:
            self.book.stream_closed(self.book.stream)
        self._task = self._event = None

    async def close(self) -> None:
        """Releases everything and ends the stream and the task; then the
        book starts afresh (AsyncClient may be used again after close())."""
        with self.book.lock:
            self.book.closing = True
        task, event = self._task, self._event
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            if event is not None:
                event.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), CLOSE_WAIT)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._event = None
        with self.book.lock:
            self.book.reopen()

    async def _run(self, lease: Callable[..., Any], event: asyncio.Event) -> None:
        book = self.book
        backoff = STREAM_BACKOFF_FIRST
        try:
            while True:
                with book.lock:
                    book.forget_idle(time.monotonic())
                    if not book.wants_stream():
                        return
                    stream = book.stream_opened()
                granted = False
                try:
                    async for response in lease(self._requests(stream, event)):
                        with book.lock:
                            now = time.monotonic()
                            for grant in response.grants:
                                book.grant(grant, now)
                        granted = True
                        if book.closing:  # a grant the releases waited for
                            event.set()
                except grpc.RpcError:
                    pass  # the stream broke: reopened below while a pair is hot
                except Exception:  # a bug: checks go on by CheckLimit meanwhile
                    logger.exception("the lease stream failed")
                finally:
                    with book.lock:
                        book.stream_closed(stream)
                backoff = STREAM_BACKOFF_FIRST if granted else min(backoff * 2, STREAM_BACKOFF_LAST)
                # Checks wake the task as they come: only closing cuts the
                # wait short, or a server that is gone would be asked again
                # for every check.
                loop = asyncio.get_running_loop()
                until = loop.time() + backoff
                while not book.closing and (left := until - loop.time()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), left)
                    event.clear()
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    async def _requests(self, stream: int, event: asyncio.Event) -> AsyncIterator[lease_pb2.LeaseRequest]:
        book = self.book
        while True:
            with book.lock:
                if book.stream != stream:
                    return
                # What is due is read below: a check from now on wakes it
                # again.
                self._wake_pending = False
                now = time.monotonic()
                asks = book.asks(now)
                done = book.holds_nothing()  # closing: once the releases are answered
                wait = book.next_look(now)
            for message in _messages(asks):
                yield message
            if done:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait)
            event.clear()
