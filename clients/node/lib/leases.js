'use strict';

// Leases: a hot policy decided in-process, from units ratelimitd has already
// spent for this client (proto/ratelimitd/v1/lease.proto, the contract).
//
// Every `check(key, { policy })` is counted per policy and key over the last
// second. Once a pair reaches the threshold, the client asks ratelimitd, on
// one `Leases/Lease` stream per client, for units of that policy on that
// key. A grant's units are valid until `valid_for` has passed since the ask
// was sent (by this process's monotonic clock); while they last, a check is
// answered here, without a call. Without units, a check goes to CheckLimit as
// before, unless the last grant said the policy has nothing left (then it is
// denied here until its retry_after). Asks to renew go out in the
// background; a pair without checks for 5 s gives its units back.

const { performance } = require('node:perf_hooks');
const grpc = require('@grpc/grpc-js');

/** Checks per second on one policy and key from which the client leases. */
const DEFAULT_LEASE_THRESHOLD = 20;
// The hotness window: 1 s, counted in 10 slots of 100 ms.
const SLOT_MS = 100;
const SLOTS = 10;
const WINDOW_MS = SLOT_MS * SLOTS;
// A leased pair without a check for this long gives its units back.
const IDLE_MS = 5000;
// After RESOURCE_EXHAUSTED, UNAVAILABLE (or any error but a refusal): wait
// this long before asking again.
const ERROR_BACKOFF_MS = 1000;
// A grant without renew_after (or without units): ask again after this.
const DEFAULT_RENEW_MS = 1000;
// Reconnecting a broken stream: from 100 ms, doubling, up to 5 s.
const RECONNECT_MIN_MS = 100;
const RECONNECT_MAX_MS = 5000;
// How often pairs are looked at without a check: idle ones released, cold
// ones forgotten.
const SWEEP_MS = 250;
// One LeaseRequest carries asks up to about this many bytes: far under
// ratelimitd's --max-request-bytes (1 MiB by default).
const MAX_REQUEST_BYTES = 64 * 1024;
// ratelimitd's longest key.
const MAX_KEY_BYTES = 1024;
// After close(), how long the stream may take to end before it is cancelled.
const CLOSE_GRACE_MS = 1000;
// An ask not answered for this long: the stream is taken for broken, and
// made again.
const ASK_TIMEOUT_MS = 10000;

/** Requests counted over the last second, in slots of 100 ms. */
class Rate {
  constructor(now) {
    this.slots = new Array(SLOTS).fill(0);
    this.slot = Math.floor(now / SLOT_MS);
    this.total = 0;
    this.since = now;
  }

  /** Moves the window to `now`, emptying the slots it leaves behind. */
  advance(now) {
    const slot = Math.floor(now / SLOT_MS);
    if (slot <= this.slot) return;
    if (slot - this.slot >= SLOTS) {
      this.slots.fill(0);
      this.total = 0;
    } else {
      for (let s = this.slot + 1; s <= slot; s++) {
        this.total -= this.slots[s % SLOTS];
        this.slots[s % SLOTS] = 0;
      }
    }
    this.slot = slot;
  }

  add(now) {
    this.advance(now);
    this.slots[this.slot % SLOTS] += 1;
    this.total += 1;
  }

  /** Requests in the last second. */
  count(now) {
    this.advance(now);
    return this.total;
  }

  /** Requests per second: the last second's, over the time counted when that is shorter (at least 100 ms). */
  perSecond(now) {
    const span = Math.min(WINDOW_MS, Math.max(SLOT_MS, now - this.since));
    return (this.count(now) * 1000) / span;
  }
}

/** What the client knows of one policy and key. */
class Entry {
  constructor(policy, key, now) {
    this.policy = policy;
    this.key = key;
    this.rate = new Rate(now);
    this.lastCheck = now;
    // Hot: the pair is decided from leases (asks, renewals, fallbacks).
    this.leased = false;
    // Units granted, { units, expiresAt, call }, the earliest-expiring
    // first; `call` is the stream that granted them.
    this.tranches = [];
    // What ratelimitd has left on each limit, beside the units held here
    // (the last grant's statuses, or a later CheckLimit's), and when it said so.
    this.statuses = null;
    this.statusesAt = 0;
    // The statuses of CheckLimit answers that arrived while an ask was
    // awaited: they may be newer than its grant's.
    this.observed = null;
    this.renewAt = 0;
    this.denyUntil = 0;
    // The last grant held it to its share: no units, and a retry_after.
    this.heldBack = false;
    this.backoffUntil = 0;
    // The id of the ask awaiting its grant, or null.
    this.inFlight = null;
    this.lastGrantUnits = 0;
    // A decision found too few units since the last ask.
    this.starved = false;
    // Since the last ask: requests admitted and denied here, and sent to CheckLimit.
    this.admitted = 0;
    this.denied = 0;
    this.fallbacks = 0;
  }

  /** Drops the tranches whose time has run out; returns the units left. */
  held(now) {
    let expired = 0;
    while (expired < this.tranches.length && this.tranches[expired].expiresAt <= now) expired++;
    if (expired > 0) this.tranches.splice(0, expired);
    let units = 0;
    for (const tranche of this.tranches) units += tranche.units;
    return units;
  }

  addTranche(units, expiresAt, call) {
    let i = this.tranches.length;
    while (i > 0 && this.tranches[i - 1].expiresAt > expiresAt) i--;
    this.tranches.splice(i, 0, { units, expiresAt, call });
  }

  /**
   * Spends `cost` units, from the tranches that expire first. Returns
   * whether any came from a grant of `call`.
   */
  take(cost, call) {
    let left = cost;
    let fromCall = false;
    while (left > 0) {
      const first = this.tranches[0];
      const spent = Math.min(first.units, left);
      first.units -= spent;
      left -= spent;
      if (first.call === call) fromCall = true;
      if (first.units === 0) this.tranches.shift();
    }
    while (this.tranches.length && this.tranches[0].units === 0) this.tranches.shift();
    return fromCall;
  }

  /** Whether `cost` is above a limit of the policy: only CheckLimit answers that (costExceedsLimit). */
  exceeds(cost) {
    return this.statuses !== null && this.statuses.some((s) => !s.shadow && cost > s.limit);
  }

  /**
   * The limit statuses as CheckLimit would report them now: each limit's
   * `remaining` is what ratelimitd has left plus the units held here, its
   * `resetAfterMs` counted down since the grant. `allowed(status)` says each
   * limit's own `allowed`.
   */
  limits(now, held, allowed, retryAfterMs) {
    const elapsed = now - this.statusesAt;
    return this.statuses.map((s) => {
      const remaining = Math.min(s.limit, s.remaining + held);
      const ok = allowed(remaining, s);
      return {
        name: s.name,
        allowed: ok,
        limit: s.limit,
        remaining,
        resetAfterMs: Math.max(0, Math.ceil(s.resetAfterMs - elapsed)),
        retryAfterMs: ok ? 0 : retryAfterMs,
        costExceedsLimit: false,
        shadow: s.shadow,
      };
    });
  }
}

/**
 * The most restrictive of `limits`, as ratelimitd picks it: the first
 * denying limit (here all denying ones wait as long), else the one with the
 * fewest units left; shadow limits only when every limit is one.
 */
function mostRestrictive(limits) {
  const candidates = limits.some((l) => !l.shadow) ? limits.filter((l) => !l.shadow) : limits;
  const denying = candidates.find((l) => !l.allowed);
  if (denying) return limits.indexOf(denying);
  let best = candidates[0];
  for (const l of candidates) if (l.remaining < best.remaining) best = l;
  return limits.indexOf(best);
}

/**
 * `next`, with each limit's `remaining` no higher than in `known` (the same
 * limits, else ignored): `next` itself when it is nowhere higher.
 */
function lower(known, next) {
  if (!known || known.length !== next.length) return next;
  if (next.every((s, i) => s.remaining <= known[i].remaining)) return next;
  return next.map((s, i) => (known[i].remaining < s.remaining ? { ...s, remaining: known[i].remaining } : s));
}

/** A google.protobuf.Duration in (fractional) milliseconds; 0 when unset. */
function durationMs(duration) {
  if (!duration) return 0;
  return Number(duration.seconds) * 1000 + duration.nanos / 1e6;
}

/**
 * The leases of one RateLimitClient: its one `Leases/Lease` stream, the
 * state of each hot policy and key, and the counters of `leaseStats()`.
 */
class Leases {
  /**
   * @param {object} options
   * @param {() => object} options.makeStub makes the Leases service's stub, on the client's target (called once, on first need)
   * @param {number} options.threshold checks per second on a policy and key from which it is leased
   */
  constructor({ makeStub, threshold = DEFAULT_LEASE_THRESHOLD }) {
    this._makeStub = makeStub;
    this._stub = null;
    this._threshold = threshold;
    // `${policy}:${key}` (a policy name has no ':') → Entry.
    this._entries = new Map();
    this._leased = 0;
    // Policies ratelimitd refused to lease (INVALID_ARGUMENT, NOT_FOUND): decided per request from then on.
    this._refused = new Set();
    // The server has no Leases service (UNIMPLEMENTED): no leases in this client.
    this._unavailable = false;
    this._closed = false;
    this._call = null;
    // Ask id → { sentAt, entry (null for a release), call }.
    this._pending = new Map();
    // Asks to send at the next flush: { entry, release }.
    this._outbox = [];
    this._flushing = null;
    this._nextId = 1;
    this._reconnectTimer = null;
    this._reconnectDelay = RECONNECT_MIN_MS;
    this._sweepTimer = null;
    this.stats = { localAllowed: 0, localDenied: 0, fallbacks: 0, asks: 0, grants: 0 };
  }

  /**
   * Counts a check of `policy` on `key` and decides it from the leases held
   * when it can: resolves to the decision CheckLimit would give, or returns
   * null when the check must go to CheckLimit.
   */
  decide(policy, key, cost) {
    const now = performance.now();
    const id = `${policy}:${key}`;
    let entry = this._entries.get(id);
    if (!entry) {
      if (this._closed || this._unavailable || this._refused.has(policy)) return null;
      // A key ratelimitd refuses (CheckLimit says why): never asked for,
      // which would have the whole policy refused.
      if (key.length > MAX_KEY_BYTES / 3 && Buffer.byteLength(key) > MAX_KEY_BYTES) return null;
      entry = new Entry(policy, key, now);
      this._entries.set(id, entry);
      this._startSweep();
    }
    entry.rate.add(now);
    entry.lastCheck = now;
    if (!entry.leased) {
      if (this._closed || this._unavailable || this._refused.has(policy)) return null;
      if (entry.rate.count(now) < this._threshold) return null;
      entry.leased = true;
      this._leased += 1;
    }
    // An ask due now (a wait just ended) goes out before deciding, so
    // that this check waits for its answer rather than going to CheckLimit.
    this._maybeAsk(entry, now);
    const answer = this._decideLeased(entry, cost, now);
    this._maybeAsk(entry, now);
    return answer;
  }

  _decideLeased(entry, cost, now) {
    const held = entry.held(now);
    if (held > 0 && held >= cost && !entry.exceeds(cost)) {
      // Reported in the next ask: a request admitted from units of this
      // stream's grants (ratelimitd counts them per stream; units of a
      // stream that broke are nobody's to report), not a look (cost 0).
      if (entry.take(cost, this._call) && this._call !== null) entry.admitted += 1;
      this.stats.localAllowed += 1;
      return this._allowed(entry, held - cost, now);
    }
    if (held < cost) entry.starved = true;
    // Held to its share (the last grant said wait): it keeps denying while
    // the renewal it sent when the wait ended is on its way, rather than
    // sending every check in that moment to CheckLimit.
    const waiting = now < entry.denyUntil || (entry.heldBack && entry.inFlight !== null);
    if (waiting && entry.statuses !== null && !entry.exceeds(cost)) {
      entry.denied += 1;
      this.stats.localDenied += 1;
      return this._denied(entry, held, cost, now);
    }
    if (held === 0 && !this._leasable(entry) && now >= entry.denyUntil) {
      // Refused since (or the service is gone): per request, as any policy.
      this._drop(entry);
      return null;
    }
    entry.fallbacks += 1;
    this.stats.fallbacks += 1;
    return null;
  }

  /** The answer of an allowed check: CheckLimit's fields, for the limits as ratelimitd and this client hold them. */
  _allowed(entry, held, now) {
    if (!entry.statuses || entry.statuses.length === 0) {
      return { allowed: true, limit: held, remaining: held, resetAfterMs: 0, retryAfterMs: 0, costExceedsLimit: false, degraded: false, limits: [], mostRestrictive: 0 };
    }
    const limits = entry.limits(now, held, () => true, 0);
    const most = mostRestrictive(limits);
    return {
      allowed: true,
      limit: limits[most].limit,
      remaining: limits[most].remaining,
      resetAfterMs: limits[most].resetAfterMs,
      retryAfterMs: 0,
      costExceedsLimit: false,
      degraded: false,
      limits,
      mostRestrictive: most,
    };
  }

  /** The answer of a check denied until the last grant's retry_after has passed. */
  _denied(entry, held, cost, now) {
    const retryAfterMs = Math.max(1, Math.ceil(entry.denyUntil - now));
    const limits = entry.limits(now, held, (remaining, s) => s.shadow || remaining >= cost, retryAfterMs);
    let most = mostRestrictive(limits);
    if (limits[most].allowed) {
      // The grant's statuses still show room: the limit with the fewest left is the one that has none.
      limits[most] = { ...limits[most], allowed: false, retryAfterMs };
      most = mostRestrictive(limits);
    }
    return {
      allowed: false,
      limit: limits[most].limit,
      remaining: 0,
      resetAfterMs: limits[most].resetAfterMs,
      retryAfterMs,
      costExceedsLimit: false,
      degraded: false,
      limits,
      mostRestrictive: most,
    };
  }

  /**
   * A CheckLimit decision on a leased policy and key: ratelimitd may have
   * less left than the last grant said. A call and a grant cross on the
   * way, so the lower count is the newer: counts only go down between
   * grants (a grant says when a limit has refilled or a window has passed).
   */
  observe(policy, key, decision) {
    const entry = this._entries.get(`${policy}:${key}`);
    if (!entry || !entry.leased || !decision.limits || decision.limits.length === 0 || decision.degraded) return;
    const statuses = decision.limits.map((l) => ({
      name: l.name,
      limit: l.limit,
      remaining: l.remaining,
      resetAfterMs: l.resetAfterMs,
      shadow: l.shadow,
    }));
    entry.statuses = lower(entry.statuses, statuses);
    if (entry.statuses === statuses) entry.statusesAt = performance.now();
    if (entry.inFlight !== null) entry.observed = lower(entry.observed, statuses);
  }

  _leasable(entry) {
    return !this._closed && !this._unavailable && !this._refused.has(entry.policy);
  }

  /** Asks for units (a first lease or a renewal) if one is due and none is awaited. */
  _maybeAsk(entry, now) {
    if (!entry.leased || entry.inFlight !== null || !this._leasable(entry)) return;
    if (now < entry.backoffUntil || now < entry.denyUntil) return;
    const held = entry.held(now);
    const due =
      now >= entry.renewAt || entry.starved || (entry.lastGrantUnits > 0 && held < entry.lastGrantUnits / 4);
    if (!due || !this._stream()) return;
    entry.inFlight = 0; // the ask's id once sent
    this._queue(entry, false);
  }

  _queue(entry, release) {
    this._outbox.push({ entry, release });
    // Asks made in the same turn of the event loop go in one message.
    this._flushing ??= setImmediate(() => this._flush());
  }

  /** Sends the queued asks; each one's units count from now. */
  _flush() {
    if (this._flushing) clearImmediate(this._flushing);
    this._flushing = null;
    const outbox = this._outbox;
    this._outbox = [];
    const call = this._call;
    if (!call) {
      // The stream broke: asked again when it is back.
      for (const { entry, release } of outbox) if (!release) entry.inFlight = null;
      return;
    }
    const now = performance.now();
    let asks = [];
    let bytes = 0;
    const send = () => {
      if (asks.length === 0) return;
      const sentAt = performance.now();
      for (const { ask, entry } of asks) this._pending.set(ask.id, { sentAt, entry, call });
      call.write({ asks: asks.map((a) => a.ask) });
      this.stats.asks += asks.length;
      asks = [];
      bytes = 0;
    };
    for (const { entry, release } of outbox) {
      const ask = {
        id: this._nextId++,
        policy: entry.policy,
        key: entry.key,
        demand: entry.rate.perSecond(now),
        held: entry.held(now),
        admitted: entry.admitted,
        denied: entry.denied,
        fallbacks: entry.fallbacks,
        release,
      };
      entry.admitted = 0;
      entry.denied = 0;
      entry.fallbacks = 0;
      entry.starved = false;
      if (!release) entry.inFlight = ask.id;
      const size = Buffer.byteLength(entry.key) + entry.policy.length + 64;
      if (bytes + size > MAX_REQUEST_BYTES) send();
      asks.push({ ask, entry: release ? null : entry });
      bytes += size;
    }
    send();
  }

  /** The stream, opened if it is not and may be: false while it waits to reconnect. */
  _stream() {
    if (this._call) return true;
    if (this._reconnectTimer || this._closed || this._unavailable) return false;
    this._stub ??= this._makeStub();
    const call = this._stub.Lease();
    this._call = call;
    call.on('data', (response) => this._onResponse(call, response));
    // Every end of the stream comes with its status; an error also comes as 'error'.
    call.on('error', () => {});
    call.on('status', (status) => this._onEnd(call, status));
    return true;
  }

  _onResponse(call, response) {
    const now = performance.now();
    for (const grant of response.grants) {
      this.stats.grants += 1;
      const asked = this._pending.get(grant.id);
      if (!asked || asked.call !== call) continue;
      this._pending.delete(grant.id);
      const { sentAt, entry } = asked;
      if (entry === null) continue; // a release's
      if (entry.inFlight === grant.id) entry.inFlight = null;
      if (this._entries.get(`${entry.policy}:${entry.key}`) !== entry) continue; // released since
      this._reconnectDelay = RECONNECT_MIN_MS;
      this._grant(entry, grant, sentAt, now);
    }
    this._maybeEnd();
  }

  _grant(entry, grant, sentAt, now) {
    const code = grant.error ? grant.error.code : grpc.status.OK;
    if (code !== grpc.status.OK) {
      if (code === grpc.status.INVALID_ARGUMENT || code === grpc.status.NOT_FOUND) {
        // Not leasable: per request from now on. Units held stay valid until their time.
        this._refused.add(entry.policy);
      } else {
        entry.backoffUntil = now + ERROR_BACKOFF_MS;
      }
      return;
    }
    const validFor = durationMs(grant.valid_for);
    const units = Number(grant.units);
    if (units > 0 && validFor > 0) entry.addTranche(units, sentAt + validFor, this._call);
    // A grant of nothing (enough held, or a wait) leaves the last lease's
    // size as what a renewal is measured against.
    if (units > 0) entry.lastGrantUnits = units;
    if (grant.limits && grant.limits.length > 0) {
      const statuses = grant.limits.map((s) => ({
        name: s.name,
        limit: Number(s.limit),
        remaining: Number(s.remaining),
        resetAfterMs: durationMs(s.reset_after),
        shadow: s.shadow,
      }));
      // A CheckLimit answered while the ask was on its way may have been
      // decided after the grant: the lower count is the newer.
      entry.statuses = lower(entry.observed, statuses);
      entry.statusesAt = now;
    }
    entry.observed = null;
    entry.renewAt = sentAt + (grant.renew_after ? durationMs(grant.renew_after) : units > 0 ? validFor / 2 : DEFAULT_RENEW_MS);
    entry.denyUntil = grant.retry_after ? sentAt + durationMs(grant.retry_after) : 0;
    entry.heldBack = Boolean(grant.retry_after) && units === 0;
  }

  /** The stream ended: units held stay valid until their time; asks awaiting grants are asked again on a new stream. */
  _onEnd(call, status) {
    if (call !== this._call) return;
    this._call = null;
    for (const [id, asked] of this._pending) {
      if (asked.call !== call) continue;
      this._pending.delete(id);
      if (asked.entry && asked.entry.inFlight === id) asked.entry.inFlight = null;
    }
    // What was admitted from its grants is that stream's to report, and it
    // is gone: ratelimitd counts a new stream's grants afresh.
    for (const entry of this._entries.values()) entry.admitted = 0;
    if (status.code === grpc.status.UNIMPLEMENTED) {
      // A ratelimitd without leases: every check goes to CheckLimit, as before.
      this._unavailable = true;
      return;
    }
    if (this._leased > 0) this._reconnect();
  }

  _reconnect() {
    if (this._reconnectTimer || this._closed) return;
    const delay = this._reconnectDelay;
    this._reconnectDelay = Math.min(RECONNECT_MAX_MS, delay * 2);
    this._reconnectTimer = setTimeout(() => {
      this._reconnectTimer = null;
      if (this._leased === 0 || this._call) return;
      const now = performance.now();
      // Ask again for every leased pair at once, on the new stream.
      for (const entry of this._entries.values()) {
        if (!entry.leased) continue;
        if (entry.inFlight === 0) continue; // queued already
        entry.inFlight = null;
        entry.renewAt = 0;
        this._maybeAsk(entry, now);
      }
    }, delay);
    this._reconnectTimer.unref();
  }

  /** Ends the stream when nothing is leased and no grant is awaited: an open stream keeps the process running. */
  _maybeEnd() {
    if (this._call && this._leased === 0 && this._pending.size === 0 && this._outbox.length === 0) {
      const call = this._call;
      this._call = null;
      call.end();
    }
  }

  _drop(entry) {
    this._entries.delete(`${entry.policy}:${entry.key}`);
    if (entry.leased) this._leased -= 1;
  }

  _startSweep() {
    if (this._sweepTimer) return;
    this._sweepTimer = setInterval(() => this._sweep(), SWEEP_MS);
    this._sweepTimer.unref();
  }

  /** Forgets cold pairs, releases idle ones and drops those no longer leasable. Renewals come with checks. */
  _sweep() {
    const now = performance.now();
    for (const entry of this._entries.values()) {
      if (!entry.leased) {
        if (now - entry.lastCheck > WINDOW_MS) this._entries.delete(`${entry.policy}:${entry.key}`);
        continue;
      }
      const held = entry.held(now);
      if (!this._leasable(entry)) {
        if (held === 0 && now >= entry.denyUntil) this._drop(entry);
        continue;
      }
      if (now - entry.lastCheck >= IDLE_MS && entry.inFlight === null) {
        this._drop(entry);
        if (this._call) this._queue(entry, true);
      }
    }
    // Grants come in the order of the asks: the oldest ask awaited is first.
    const oldest = this._pending.values().next().value;
    if (oldest && this._call === oldest.call && now - oldest.sentAt > ASK_TIMEOUT_MS) this._call.cancel();
    if (this._entries.size === 0 && this._pending.size === 0) {
      clearInterval(this._sweepTimer);
      this._sweepTimer = null;
    }
    if (this._outbox.length > 0) this._flush();
    this._maybeEnd();
  }

  /** Releases every lease and ends the stream; the stub's channel closes once the stream has ended. */
  close() {
    if (this._closed) return;
    this._closed = true;
    clearInterval(this._sweepTimer);
    clearTimeout(this._reconnectTimer);
    this._sweepTimer = null;
    this._reconnectTimer = null;
    const call = this._call;
    if (call) {
      for (const entry of this._entries.values()) if (entry.leased) this._queue(entry, true);
      this._flush();
    }
    this._entries.clear();
    this._leased = 0;
    this._call = null;
    const stub = this._stub;
    if (!stub) return;
    if (!call) {
      stub.close();
      return;
    }
    // The releases go out before the end of the stream; ratelimitd answers
    // them and ends it.
    const timer = setTimeout(() => call.cancel(), CLOSE_GRACE_MS);
    timer.unref();
    call.on('status', () => {
      clearTimeout(timer);
      stub.close();
    });
    call.end();
  }
}

module.exports = { Leases, DEFAULT_LEASE_THRESHOLD };
