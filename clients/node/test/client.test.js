'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { once } = require('node:events');
const { RateLimitClient, RateLimitError } = require('..');
const { startRatelimitd, freePort, waitFor } = require('../test-support/ratelimitd');

let server;
let client;
let n = 0;
const uniqueKey = (name) => `client-test:${name}:${process.pid}:${++n}`;

before(async () => {
  server = await startRatelimitd();
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

test('fixed window: allowed up to the limit, then denied with a retry time', async () => {
  const key = uniqueKey('fixed');
  const opts = { type: 'fixed', limit: 3, windowSize: 10000 };
  for (const remaining of [2, 1, 0]) {
    const d = await client.check(key, opts);
    assert.equal(d.allowed, true);
    assert.equal(d.limit, 3);
    assert.equal(d.remaining, remaining);
    assert.equal(d.retryAfterMs, 0);
    assert.ok(d.resetAfterMs > 9000 && d.resetAfterMs <= 10000, `resetAfterMs ${d.resetAfterMs}`);
    assert.equal(d.costExceedsLimit, false);
    assert.equal(d.degraded, false);
  }
  const denied = await client.check(key, opts);
  assert.equal(denied.allowed, false);
  assert.equal(denied.remaining, 0);
  assert.ok(denied.retryAfterMs > 9000 && denied.retryAfterMs <= 10000, `retryAfterMs ${denied.retryAfterMs}`);
  assert.ok(Number.isInteger(denied.retryAfterMs), 'durations are whole milliseconds (rounded up)');
});

test('sliding window: denied while the window is full, allowed once units leave it', async () => {
  const key = uniqueKey('sliding');
  const opts = { type: 'sliding', limit: 2, windowSize: 500 };
  // At once, so that no unit leaves the window in between.
  const burst = await Promise.all([1, 2, 3].map(() => client.check(key, opts)));
  assert.deepEqual(burst.map((d) => d.allowed).sort(), [false, true, true]);
  const denied = burst.find((d) => !d.allowed);
  assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 500, `retryAfterMs ${denied.retryAfterMs}`);
  await waitFor(async () => (await client.check(key, opts)).allowed, { what: 'the window to slide' });
});

test('token bucket: a burst of capacity, then refilled at refillRate', async () => {
  const key = uniqueKey('token');
  // One token every 250 ms: the burst, sent at once, is over long before.
  const opts = { type: 'token', capacity: 3, refillRate: 4 };
  const burst = await Promise.all([1, 2, 3, 4, 5].map(() => client.check(key, opts)));
  assert.equal(burst.filter((d) => d.allowed).length, 3);
  const denied = burst.find((d) => !d.allowed);
  assert.equal(denied.limit, 3);
  assert.equal(denied.remaining, 0);
  assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 250, `retryAfterMs ${denied.retryAfterMs}`);
  const started = Date.now();
  await waitFor(async () => (await client.check(key, opts)).allowed, { what: 'a token to refill' });
  assert.ok(Date.now() - started < 2000);
});

test('gcra: a burst, then one request per interval', async () => {
  const key = uniqueKey('gcra');
  // 4 a second (one per 250 ms), bursts of 2, sent at once.
  const opts = { type: 'gcra', limit: 4, windowSize: 1000, burst: 2 };
  const burst = await Promise.all([1, 2, 3].map(() => client.check(key, opts)));
  assert.deepEqual(burst.map((d) => d.allowed).sort(), [false, true, true]);
  const denied = burst.find((d) => !d.allowed);
  assert.equal(denied.limit, 2);
  assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 250, `retryAfterMs ${denied.retryAfterMs}`);
  await waitFor(async () => (await client.check(key, opts)).allowed, { what: 'the next interval' });
});

test('sliding_window_counter: the limit within a window, then denied', async () => {
  const key = uniqueKey('sliding_window_counter');
  // An hour-long window: the checks never straddle two, so the estimate is exact.
  const opts = { type: 'sliding_window_counter', limit: 3, windowSize: 3600000 };
  const checks = await Promise.all([1, 2, 3, 4].map(() => client.check(key, opts)));
  assert.deepEqual(checks.map((d) => d.allowed).sort(), [false, true, true, true]);
  assert.ok(checks.find((d) => !d.allowed).retryAfterMs > 0);
});

test('concurrent checks: exactly the limit is allowed', async () => {
  const key = uniqueKey('concurrent');
  const opts = { type: 'sliding', limit: 10, windowSize: 10000 };
  const decisions = await Promise.all(Array.from({ length: 50 }, () => client.check(key, opts)));
  assert.equal(decisions.filter((d) => d.allowed).length, 10);
});

test('cost spends several units; cost 0 only looks', async () => {
  const key = uniqueKey('cost');
  const opts = { type: 'fixed', limit: 5, windowSize: 10000 };
  assert.equal((await client.check(key, { ...opts, cost: 3 })).remaining, 2);
  const look = await client.check(key, { ...opts, cost: 0 });
  assert.equal(look.allowed, true);
  assert.equal(look.remaining, 2);
  const tooMuch = await client.check(key, { ...opts, cost: 3 });
  assert.equal(tooMuch.allowed, false);
  assert.equal(tooMuch.costExceedsLimit, false, 'it fits once the window resets');
  assert.ok(tooMuch.retryAfterMs > 0);
});

test('a cost above the limit is denied for good: costExceedsLimit, retryAfterMs null', async () => {
  const d = await client.check(uniqueKey('exceeds'), { type: 'token', capacity: 2, refillRate: 1, cost: 3 });
  assert.equal(d.allowed, false);
  assert.equal(d.costExceedsLimit, true);
  assert.equal(d.retryAfterMs, null);
  assert.equal(d.remaining, 2, 'nothing spent');
});

test('the same key under two algorithms is two limits', async () => {
  const key = uniqueKey('shared');
  assert.equal((await client.check(key, { type: 'fixed', limit: 1, windowSize: 10000 })).allowed, true);
  assert.equal((await client.check(key, { type: 'fixed', limit: 1, windowSize: 10000 })).allowed, false);
  assert.equal((await client.check(key, { type: 'sliding', limit: 1, windowSize: 10000 })).allowed, true);
});

test('failurePolicy is sent with the call', async () => {
  for (const failurePolicy of ['fail-closed', 'fail-open', 'local']) {
    const d = await client.check(uniqueKey('policy'), { type: 'fixed', limit: 1, windowSize: 1000, failurePolicy });
    assert.equal(d.allowed, true);
    assert.equal(d.degraded, false, 'the embedded store always decides');
  }
});

test('a request ratelimitd rejects becomes a RateLimitError with code INVALID_ARGUMENT', async () => {
  const err = await client.check('k'.repeat(1025), { type: 'fixed', limit: 1, windowSize: 1000 }).then(
    () => assert.fail('expected a rejection'),
    (e) => e,
  );
  assert.ok(err instanceof RateLimitError);
  assert.ok(err instanceof Error);
  assert.equal(err.code, 'INVALID_ARGUMENT');
  assert.equal(err.grpcCode, 3);
  assert.match(err.message, /key: must be at most 1024 bytes/);
});

test('invalid options are refused before anything is sent', async () => {
  const cases = [
    [{ type: 'leaky', limit: 1, windowSize: 1 }, TypeError, /`type` must be one of 'fixed_window', 'sliding_window', 'token_bucket', 'gcra', 'sliding_window_counter' \(or the short names 'fixed', 'sliding', 'token'\), got "leaky"/],
    [{ type: 'fixed', limit: 0, windowSize: 1000 }, RangeError, /`limit` must be a whole number from 1/],
    [{ type: 'fixed', limit: 1, windowSize: 1.5 }, RangeError, /`windowSize` must be a whole number of milliseconds/],
    [{ type: 'fixed', limit: 1 }, TypeError, /`windowSize` must be .* got undefined/],
    [{ type: 'sliding', limit: 100001, windowSize: 1000 }, RangeError, /`limit` must be a whole number from 1 to 100000/],
    [{ type: 'token', capacity: 1, refillRate: 0 }, TypeError, /`refillRate` .* above 0/],
    [{ type: 'token', capacity: 1e9, refillRate: 1e-3 }, RangeError, /at most 366 days/],
    [{ type: 'fixed', limit: 1, windowSize: 1000, capacity: 5 }, TypeError, /`capacity` is not an option of type 'fixed_window'/],
    [{ type: 'fixed', limit: 1, windowSize: 1000, cost: -1 }, RangeError, /`cost` must be a whole number from 0/],
    [{ type: 'fixed', limit: 1, windowSize: 1000, failurePolicy: 'open' }, TypeError, /`failurePolicy` must be one of/],
    [{ type: 'fixed', limit: 1, windowSize: 1000, windowsize: 5 }, TypeError, /unknown option `windowsize`/],
  ];
  for (const [options, type, message] of cases) {
    await assert.rejects(client.check('k', options), (err) => {
      assert.ok(err instanceof type, `${JSON.stringify(options)}: ${err}`);
      assert.match(err.message, message);
      assert.match(err.message, /^RateLimitClient\.check: /);
      return true;
    });
  }
  await assert.rejects(client.check('', { type: 'fixed', limit: 1, windowSize: 1 }), /`key` must be a non-empty string/);
  assert.throws(() => new RateLimitClient({ adress: 'x' }), /unknown option `adress`/);
  assert.throws(() => new RateLimitClient({ deadlineMs: 0 }), /`deadlineMs` must be a number of milliseconds above 0/);
});

test('defaults: 127.0.0.1:50051 and a 300 ms deadline', () => {
  const c = new RateLimitClient();
  try {
    assert.equal(c.address, '127.0.0.1:50051');
    assert.equal(c.deadlineMs, 300);
  } finally {
    c.close();
  }
});

test('nothing listening: UNAVAILABLE', async () => {
  const c = new RateLimitClient({ address: `127.0.0.1:${await freePort()}` });
  try {
    await assert.rejects(c.check('k', { type: 'fixed', limit: 1, windowSize: 1000 }), (err) => {
      assert.ok(err instanceof RateLimitError);
      assert.equal(err.code, 'UNAVAILABLE');
      assert.equal(err.grpcCode, 14);
      return true;
    });
  } finally {
    c.close();
  }
});

test('a service that never answers: DEADLINE_EXCEEDED after the deadline', async () => {
  // Accepts TCP connections and never says a word.
  const sockets = new Set();
  const silent = net.createServer((s) => sockets.add(s));
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  const c = new RateLimitClient({ address: `127.0.0.1:${silent.address().port}`, deadlineMs: 300 });
  try {
    const started = Date.now();
    await assert.rejects(c.check('k', { type: 'fixed', limit: 1, windowSize: 1000 }), { code: 'DEADLINE_EXCEEDED' });
    const elapsed = Date.now() - started;
    assert.ok(elapsed >= 290 && elapsed < 2000, `took ${elapsed} ms`);
    // A deadline per call overrides the client's.
    const again = Date.now();
    await assert.rejects(
      c.check('k', { type: 'fixed', limit: 1, windowSize: 1000, deadlineMs: 20 }),
      { code: 'DEADLINE_EXCEEDED' },
    );
    assert.ok(Date.now() - again < 250, 'the call deadline was used');
  } finally {
    c.close();
    for (const s of sockets) s.destroy();
    silent.close();
  }
});
