'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { once } = require('node:events');
const { rateLimiter, RateLimitClient } = require('..');
const { startRatelimitd, freePort, waitFor } = require('../test-support/ratelimitd');
const { startApp, withApp, recorder } = require('../test-support/app');

let server;
let client;
let n = 0;
// Every limiter gets its own prefix, so tests never share a counter.
const prefix = (name) => `mw-test:${name}:${process.pid}:${++n}:`;

before(async () => {
  server = await startRatelimitd();
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});


test("the basic scenario: 5 requests per 10 s, five 200s then 429", async () => {
  // As with a single-node Redis middleware, with `redis` replaced by `address`.
  await withApp(
    { address: server.address, type: 'fixed', limit: 5, windowSize: 10000, prefix: prefix('basic') },
    async (app) => {
      for (let i = 1; i <= 5; i++) {
        const res = await app.get();
        assert.equal(res.status, 200, `request ${i}`);
        assert.deepEqual(await res.json(), { ok: true });
      }
      const res = await app.get();
      assert.equal(res.status, 429);
      assert.match(res.headers.get('content-type'), /^application\/json/);
      assert.deepEqual(await res.json(), { error: 'Rate limit exceeded' });
      const retryAfter = Number(res.headers.get('retry-after'));
      assert.ok(Number.isInteger(retryAfter) && retryAfter >= 8 && retryAfter <= 10, `Retry-After ${retryAfter}`);
    },
  );
});

test('IETF RateLimit-Policy and RateLimit headers, on allowed and denied responses', async () => {
  await withApp({ client, type: 'fixed', limit: 2, windowSize: 10000, prefix: prefix('headers') }, async (app) => {
    let res = await app.get();
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=2;w=10');
    assert.equal(res.headers.get('ratelimit'), '"default";r=1;t=10');
    assert.equal(res.headers.get('retry-after'), null);
    res = await app.get();
    assert.equal(res.headers.get('ratelimit'), '"default";r=0;t=10');
    res = await app.get();
    assert.equal(res.status, 429);
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=2;w=10');
    assert.match(res.headers.get('ratelimit'), /^"default";r=0;t=(9|10)$/);
  });
  // Windows in seconds are rounded up; a token bucket's window is the time
  // an empty bucket takes to fill.
  await withApp({ client, type: 'sliding', limit: 3, windowSize: 1500, prefix: prefix('headers') }, async (app) => {
    const res = await app.get();
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=3;w=2');
    assert.equal(res.headers.get('ratelimit'), '"default";r=2;t=2');
  });
  await withApp({ client, type: 'token', capacity: 10, refillRate: 4, prefix: prefix('headers') }, async (app) => {
    const res = await app.get();
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=10;w=3');
    assert.equal(res.headers.get('ratelimit'), '"default";r=9;t=1');
  });
  await withApp(
    { client, type: 'fixed', limit: 1, windowSize: 10000, standardHeaders: false, prefix: prefix('headers') },
    async (app) => {
      let res = await app.get();
      assert.equal(res.headers.get('ratelimit-policy'), null);
      assert.equal(res.headers.get('ratelimit'), null);
      res = await app.get();
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), '10', 'Retry-After is always sent on a 429');
    },
  );
});

test('sliding window: 429 while the window is full, 200 again once it has slid', async () => {
  await withApp({ client, type: 'sliding', limit: 2, windowSize: 500, prefix: prefix('sliding') }, async (app) => {
    // At once, so that no unit leaves the window in between.
    const burst = await Promise.all([1, 2, 3].map(() => app.get()));
    assert.deepEqual(burst.map((r) => r.status).sort(), [200, 200, 429]);
    const denied = burst.find((r) => r.status === 429);
    assert.equal(denied.headers.get('retry-after'), '1', 'under a second, rounded up');
    await waitFor(async () => (await app.get()).status === 200, { what: 'the window to slide' });
  });
});

test('token bucket: a burst of capacity, 429, then 200 once a token has refilled', async () => {
  // One token every 250 ms: the burst, sent at once, is over long before.
  await withApp({ client, type: 'token', capacity: 3, refillRate: 4, prefix: prefix('token') }, async (app) => {
    const burst = await Promise.all([1, 2, 3, 4, 5].map(() => app.get()));
    assert.deepEqual(burst.map((r) => r.status).sort(), [200, 200, 200, 429, 429]);
    const denied = burst.find((r) => r.status === 429);
    assert.equal(denied.headers.get('retry-after'), '1');
    assert.equal(denied.headers.get('ratelimit-policy'), '"default";q=3;w=1');
    await waitFor(async () => (await app.get()).status === 200, { what: 'a token to refill' });
  });
});

test('keyGenerator: each key has its own limit', async () => {
  await withApp(
    {
      client,
      type: 'fixed',
      limit: 1,
      windowSize: 10000,
      prefix: prefix('keygen'),
      keyGenerator: (req) => req.get('x-user-id'),
    },
    async (app) => {
      assert.equal((await app.get('/', { 'x-user-id': 'alice' })).status, 200);
      assert.equal((await app.get('/', { 'x-user-id': 'alice' })).status, 429);
      assert.equal((await app.get('/', { 'x-user-id': 'bob' })).status, 200);
      // No key: the error goes to Express's error handler.
      const res = await app.get();
      assert.equal(res.status, 500);
      assert.match((await res.json()).error, /keyGenerator\(req\) must return a non-empty string, got undefined/);
    },
  );
});

test('keyGenerator may be async; keys over 1024 bytes are hashed, not refused', async () => {
  await withApp(
    {
      client,
      type: 'fixed',
      limit: 1,
      windowSize: 10000,
      prefix: prefix('longkey'),
      keyGenerator: async (req) => req.get('x-api-key').repeat(300),
    },
    async (app) => {
      assert.equal((await app.get('/', { 'x-api-key': 'abcd' })).status, 200);
      assert.equal((await app.get('/', { 'x-api-key': 'abcd' })).status, 429);
      assert.equal((await app.get('/', { 'x-api-key': 'abce' })).status, 200);
    },
  );
});

test("the default key is the client's address, req.ip", async () => {
  const seen = [];
  const spy = {
    check: (key, options) => {
      seen.push(key);
      return client.check(key, options);
    },
  };
  const p = prefix('ip');
  await withApp({ client: spy, type: 'fixed', limit: 1, windowSize: 10000, prefix: p }, async (app) => {
    assert.equal((await app.get()).status, 200);
    assert.equal((await app.get()).status, 429);
  });
  // prefix, then the limiter's namespace, then the key (an IPv4 client as
  // itself, however the socket reports it: ip-keys.test.js).
  assert.match(seen[0], new RegExp(`^${p}rl-[0-9a-f]{8}:127\\.0\\.0\\.1$`));
});

test('cost(req): requests spend what cost says; a cost above the limit is 429 without Retry-After', async () => {
  await withApp(
    {
      client,
      type: 'fixed',
      limit: 5,
      windowSize: 10000,
      prefix: prefix('cost'),
      cost: (req) => Number(req.get('x-cost') ?? 1),
    },
    async (app) => {
      let res = await app.get('/', { 'x-cost': '4' });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit'), '"default";r=1;t=10');
      res = await app.get('/', { 'x-cost': '6' });
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), null, 'waiting would not help');
      res = await app.get('/', { 'x-cost': '2' });
      assert.equal(res.status, 429);
      assert.ok(Number(res.headers.get('retry-after')) >= 9);
      res = await app.get('/', { 'x-cost': '1' });
      assert.equal(res.status, 200);
      res = await app.get('/', { 'x-cost': '1.5' });
      assert.equal(res.status, 500);
      assert.match((await res.json()).error, /cost\(req\).*`cost` must be a whole number from 0/);
    },
  );
});

test('options are checked when the middleware is created, with clear errors', () => {
  const base = { address: '127.0.0.1:1', type: 'fixed', limit: 5, windowSize: 10000 };
  const cases = [
    [{ ...base, address: undefined, redis: {} }, /`redis` is not used: counters live in ratelimitd; pass `address`/],
    [{ ...base, client }, /pass one of `address`.*and `client`.*not both/],
    [{ ...base, client: {}, address: undefined }, /`client` must be a RateLimitClient/],
    [{ ...base, type: 'leaky' }, /`type` must be one of 'fixed_window', 'sliding_window', 'token_bucket', 'gcra', 'sliding_window_counter' \(or the short names 'fixed', 'sliding', 'token'\), got "leaky"/],
    [{ ...base, type: 'slidingCounter' }, /`type` "slidingCounter" is now spelled 'sliding_window_counter'/],
    [{ ...base, limit: -1 }, /`limit` must be a whole number from 1 to 1000000000000000, got -1/],
    [{ ...base, limit: '5' }, /`limit` must be a whole number .* got "5"/],
    [{ ...base, windowSize: 0 }, /`windowSize` must be a whole number of milliseconds/],
    [{ ...base, type: 'token' }, /`limit` is not an option of type 'token_bucket', which takes `capacity` and `refillRate`/],
    [{ address: '127.0.0.1:1', type: 'token', capacity: 5 }, /`refillRate` \(tokens per second\) must be a finite number above 0, got undefined/],
    [{ address: '127.0.0.1:1', type: 'token', capacity: 0.5, refillRate: 1 }, /`capacity` must be a whole number/],
    [{ ...base, keyGenerator: 'ip' }, /`keyGenerator` \(or `key`\) must be a function/],
    [{ ...base, cost: -2 }, /`cost` must be a whole number from 0/],
    [{ ...base, onServiceError: 'open' }, /`onServiceError` must be 'allow' or 'deny', got "open"/],
    [{ ...base, failurePolicy: 'closed' }, /`failurePolicy` must be one of 'fail-closed', 'fail-open', 'local'/],
    [{ ...base, deadlineMs: -5 }, /`deadlineMs` must be a number of milliseconds above 0/],
    [{ ...base, headers: false }, /`headers` is not used: it is now `standardHeaders`/],
    [{ ...base, standardHeaders: 'draft-9' }, /`standardHeaders` must be 'draft-6', 'draft-7', 'draft-8', true \('draft-6'\) or false, got "draft-9"/],
    [{ ...base, legacyHeaders: 'yes' }, /`legacyHeaders` must be true or false/],
    [{ ...base, store: {} }, /`store` is not used: counters live in ratelimitd/],
    [{ ...base, limit: 5, max: 5 }, /pass one of `limit` and `max`/],
    [{ ...base, windowMs: 1000 }, /pass one of `windowMs` and `windowSize`/],
    [{ ...base, statusCode: 'x' }, /`statusCode` must be an HTTP status code/],
    [{ ...base, skip: true }, /`skip` must be a function/],
    [{ ...base, name: 'a b' }, /`name` must be 1 to 64 letters/],
    [{ ...base, logger: {} }, /`logger` must have a warn\(message\) method/],
    [{ ...base, windowsize: 10000 }, /unknown option `windowsize`/],
  ];
  for (const [options, message] of cases) {
    assert.throws(() => rateLimiter(options), (err) => {
      assert.ok(err instanceof TypeError || err instanceof RangeError, String(err));
      assert.match(err.message, /^rateLimiter: /);
      assert.match(err.message, message);
      return true;
    });
  }
  assert.throws(() => rateLimiter(), /options must be an object/);
});

test('service unreachable, onServiceError allow (the default): 200 and a warning', async () => {
  const { warnings, logger } = recorder();
  const address = `127.0.0.1:${await freePort()}`;
  await withApp({ address, type: 'fixed', limit: 1, windowSize: 10000, logger }, async (app) => {
    for (let i = 0; i < 3; i++) {
      const res = await app.get();
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit'), null, 'no headers without a decision');
    }
  });
  assert.equal(warnings.length, 1, 'one warning, not one per request');
  assert.match(warnings[0], /^\[ratelimitd\] ratelimitd could not decide \(UNAVAILABLE: .*\); onServiceError is 'allow': allowing$/);
});

test('service unreachable, onServiceError deny: 503', async () => {
  const { warnings, logger } = recorder();
  const address = `127.0.0.1:${await freePort()}`;
  await withApp({ address, type: 'fixed', limit: 1, windowSize: 10000, logger, onServiceError: 'deny' }, async (app) => {
    const res = await app.get();
    assert.equal(res.status, 503);
    assert.deepEqual(await res.json(), { error: 'Rate limiter unavailable' });
  });
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /UNAVAILABLE.*refusing with 503/);
});

test('service too slow: the deadline bounds the wait, then onServiceError applies', async () => {
  const sockets = new Set();
  const silent = net.createServer((s) => sockets.add(s));
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  const address = `127.0.0.1:${silent.address().port}`;
  try {
    for (const [onServiceError, status] of [
      ['allow', 200],
      ['deny', 503],
    ]) {
      const { warnings, logger } = recorder();
      const options = { address, deadlineMs: 200, type: 'sliding', limit: 1, windowSize: 1000, logger, onServiceError };
      await withApp(options, async (app) => {
        const started = Date.now();
        const res = await app.get();
        const elapsed = Date.now() - started;
        assert.equal(res.status, status);
        assert.ok(elapsed >= 190 && elapsed < 2000, `took ${elapsed} ms`);
      });
      assert.equal(warnings.length, 1);
      assert.match(warnings[0], /DEADLINE_EXCEEDED/);
    }
  } finally {
    for (const s of sockets) s.destroy();
    silent.close();
  }
});

test('service killed while in use: allow or deny as configured, limiting again once it is back', async () => {
  const own = await startRatelimitd();
  const { warnings, logger } = recorder();
  const opts = { type: 'fixed', limit: 100, windowSize: 10000, logger, prefix: prefix('killed') };
  const allowing = rateLimiter({ ...opts, address: own.address });
  const denying = rateLimiter({ ...opts, address: own.address, onServiceError: 'deny' });
  const allowApp = await startApp(allowing);
  const denyApp = await startApp(denying);
  let restarted;
  try {
    let res = await allowApp.get();
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit'), '"default";r=99;t=10');
    assert.equal((await denyApp.get()).status, 200);

    await own.kill();
    res = await allowApp.get();
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit'), null);
    assert.equal((await denyApp.get()).status, 503);
    assert.equal(warnings.length, 2);
    assert.match(warnings[0], /UNAVAILABLE/);

    // Back on the same port (a fresh embedded store): decisions resume
    // without restarting the app.
    restarted = await startRatelimitd({ port: own.port });
    await waitFor(async () => (await allowApp.get()).headers.get('ratelimit') !== null, {
      what: 'the client to reconnect',
    });
    assert.equal((await denyApp.get()).status, 200);
  } finally {
    await allowApp.close();
    await denyApp.close();
    allowing.client.close();
    denying.client.close();
    await own.kill();
    await restarted?.stop();
  }
});

test('an error from the client other than an outage goes to next(err)', async () => {
  const broken = { check: () => Promise.reject(new Error('boom')) };
  await withApp({ client: broken, type: 'fixed', limit: 1, windowSize: 1000 }, async (app) => {
    const res = await app.get();
    assert.equal(res.status, 500);
    assert.deepEqual(await res.json(), { error: 'boom' });
  });
});
