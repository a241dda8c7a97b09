'use strict';

// express-rate-limit's options, against a real ratelimitd.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { rateLimiter, RateLimitClient } = require('..');
const { startRatelimitd, waitFor } = require('../test-support/ratelimitd');
const { withApp } = require('../test-support/app');

let server;
let client;
let n = 0;
const prefix = (name) => `erl-test:${name}:${process.pid}:${++n}:`;

before(async () => {
  server = await startRatelimitd();
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

const fixed = { type: 'fixed_window', limit: 2, windowMs: 10000 };

/** Spends the limit of `app` (status 200 each), then returns the next response (a denial). */
async function exhaust(app, times = 2, headers = {}) {
  for (let i = 0; i < times; i++) assert.equal((await app.get('/', headers)).status, 200, `request ${i + 1}`);
  return app.get('/', headers);
}

test('message and statusCode: a string, an object, a function of the request', async () => {
  await withApp({ client, ...fixed, prefix: prefix('msg'), message: 'Too many requests, please try again later.' }, async (app) => {
    const res = await exhaust(app);
    assert.equal(res.status, 429);
    assert.match(res.headers.get('content-type'), /^text\/html/, "Express's res.send, as express-rate-limit");
    assert.equal(await res.text(), 'Too many requests, please try again later.');
    assert.equal(res.headers.get('retry-after'), '10');
  });
  await withApp({ client, ...fixed, prefix: prefix('msg'), statusCode: 503, message: { code: 'SLOW_DOWN' } }, async (app) => {
    const res = await exhaust(app);
    assert.equal(res.status, 503);
    assert.deepEqual(await res.json(), { code: 'SLOW_DOWN' });
  });
  await withApp(
    { client, ...fixed, prefix: prefix('msg'), message: async (req) => ({ error: `slow down, ${req.get('x-user')}` }) },
    async (app) => {
      const res = await exhaust(app, 2, { 'x-user': 'ann' });
      assert.equal(res.status, 429);
      assert.deepEqual(await res.json(), { error: 'slow down, ann' });
    },
  );
});

test('handler(req, res, next, options) answers a denial', async () => {
  let seen;
  const handler = (req, res, next, options) => {
    seen = { statusCode: options.statusCode, limit: req.rateLimit.limit, remaining: req.rateLimit.remaining };
    res.status(options.statusCode).json({ custom: true });
  };
  await withApp({ client, ...fixed, prefix: prefix('handler'), handler, statusCode: 420 }, async (app) => {
    const res = await exhaust(app);
    assert.equal(res.status, 420);
    assert.deepEqual(await res.json(), { custom: true });
    assert.equal(res.headers.get('retry-after'), '10', 'set before the handler runs');
  });
  assert.deepEqual(seen, { statusCode: 420, limit: 2, remaining: 0 });
});

test('skip(req): skipped requests are neither checked nor counted', async () => {
  await withApp(
    { client, ...fixed, prefix: prefix('skip'), skip: async (req) => req.get('x-internal') === '1' },
    async (app, limiter) => {
      for (let i = 0; i < 5; i++) {
        const res = await app.get('/', { 'x-internal': '1' });
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit'), null);
      }
      assert.equal(limiter.stats.decided, 0);
      assert.equal((await exhaust(app)).status, 429);
    },
  );
});

test('req.rateLimit: { limit, used, remaining, resetTime, key }', async () => {
  const p = prefix('req');
  await withApp({ client, ...fixed, prefix: p, keyGenerator: () => 'ann' }, async (app, limiter) => {
    const before = Date.now();
    const res = await app.get('/', { 'x-echo': '1' });
    const { rateLimit } = await res.json();
    assert.equal(rateLimit.limit, 2);
    assert.equal(rateLimit.used, 1);
    assert.equal(rateLimit.remaining, 1);
    assert.equal(rateLimit.key, `${p}${limiter.namespace}ann`);
    const reset = Date.parse(rateLimit.resetTime);
    assert.ok(reset >= before + 9000 && reset <= Date.now() + 10000, rateLimit.resetTime);
  });
});

test('limit: a (sync or async) function of the request, for per-user tiers; max is its other name', async () => {
  const tiers = { free: 1, pro: 3 };
  const options = {
    client,
    type: 'fixed_window',
    windowMs: 10000,
    prefix: prefix('tiers'),
    keyGenerator: (req) => req.get('x-user'),
    limit: async (req) => tiers[req.get('x-tier')] ?? 0,
  };
  await withApp(options, async (app) => {
    const free = { 'x-user': 'f', 'x-tier': 'free' };
    const pro = { 'x-user': 'p', 'x-tier': 'pro' };
    assert.equal((await exhaust(app, 1, free)).status, 429);
    const res = await exhaust(app, 3, pro);
    assert.equal(res.status, 429);
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=3;w=10');
    // An invalid limit is a bug: next(err).
    const bad = await app.get('/', { 'x-user': 'x', 'x-tier': 'none' });
    assert.equal(bad.status, 500);
    assert.match((await bad.json()).error, /limit\(req\).*`limit` must be a whole number from 1/);
  });
  await withApp({ client, type: 'sliding_window', max: () => 1, windowMs: 10000, prefix: prefix('max') }, async (app) => {
    assert.equal((await exhaust(app, 1)).status, 429);
  });
});

test("express-rate-limit's usage without a type: a fixed window, windowMs 60 s and limit 5 by default", async () => {
  await withApp({ client, prefix: prefix('erl') }, async (app) => {
    const res = await app.get();
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=5;w=60');
  });
  await withApp({ client, windowMs: 15 * 60 * 1000, limit: 100, prefix: prefix('erl') }, async (app) => {
    const res = await app.get();
    assert.equal(res.headers.get('ratelimit-policy'), '"default";q=100;w=900');
    assert.equal(res.headers.get('ratelimit'), '"default";r=99;t=900');
  });
});

test("standardHeaders: 'draft-8' (the default), 'draft-7', 'draft-6' / true, false; legacyHeaders", async () => {
  const base = { client, ...fixed };
  const get = async (options) => withApp({ ...base, prefix: prefix('headers'), ...options }, async (app) => (await app.get()).headers);

  let h = await get({});
  assert.equal(h.get('ratelimit-policy'), '"default";q=2;w=10');
  assert.equal(h.get('ratelimit'), '"default";r=1;t=10');
  assert.equal(h.get('x-ratelimit-limit'), null, 'legacyHeaders is false by default');

  h = await get({ standardHeaders: 'draft-7' });
  assert.equal(h.get('ratelimit-policy'), '2;w=10');
  assert.equal(h.get('ratelimit'), 'limit=2, remaining=1, reset=10');
  assert.equal(h.get('ratelimit-limit'), null);

  for (const standardHeaders of ['draft-6', true]) {
    h = await get({ standardHeaders });
    assert.equal(h.get('ratelimit-policy'), '2;w=10');
    assert.equal(h.get('ratelimit-limit'), '2');
    assert.equal(h.get('ratelimit-remaining'), '1');
    assert.equal(h.get('ratelimit-reset'), '10');
    assert.equal(h.get('ratelimit'), null);
  }

  h = await get({ standardHeaders: false });
  for (const name of ['ratelimit-policy', 'ratelimit', 'ratelimit-limit', 'x-ratelimit-limit']) assert.equal(h.get(name), null, name);

  const before = Math.floor(Date.now() / 1000);
  h = await get({ standardHeaders: false, legacyHeaders: true });
  assert.equal(h.get('x-ratelimit-limit'), '2');
  assert.equal(h.get('x-ratelimit-remaining'), '1');
  const reset = Number(h.get('x-ratelimit-reset'));
  assert.ok(reset >= before + 9 && reset <= Math.ceil(Date.now() / 1000) + 10, `X-RateLimit-Reset ${reset} is a Unix time`);

  // Retry-After goes with every 429, whatever the header options.
  await withApp({ ...base, prefix: prefix('headers'), standardHeaders: false }, async (app) => {
    assert.equal((await exhaust(app)).headers.get('retry-after'), '10');
  });
});

/** Waits until `key` (namespaced) has spent `used` units of a 2-unit fixed window. */
async function spent(key, used) {
  await waitFor(async () => (await client.check(key, { ...fixed, cost: 0 })).remaining === 2 - used, {
    what: `${used} units spent on ${key}`,
    timeoutMs: 2000,
  });
}

test('skipFailedRequests: only responses below 400 count, spent once the response is sent', async () => {
  const p = prefix('skip-failed');
  await withApp({ client, ...fixed, prefix: p, keyGenerator: () => 'u', skipFailedRequests: true }, async (app, limiter) => {
    const key = `${p}${limiter.namespace}u`;
    for (let i = 0; i < 4; i++) assert.equal((await app.get('/', { 'x-status': '500' })).status, 500);
    await new Promise((r) => setTimeout(r, 100));
    await spent(key, 0);
    const res = await app.get();
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit'), '"default";r=2;t=0', 'the quota without this request, which may not count');
    await spent(key, 1);
    assert.equal((await app.get('/', { 'x-status': '404' })).status, 404);
    assert.equal((await app.get()).status, 200);
    await spent(key, 2);
    const denied = await app.get();
    assert.equal(denied.status, 429);
    assert.equal(denied.headers.get('retry-after'), '10');
  });
});

test('skipSuccessfulRequests with requestWasSuccessful: only failures count (e.g. failed logins)', async () => {
  const p = prefix('skip-ok');
  await withApp(
    {
      client,
      ...fixed,
      prefix: p,
      keyGenerator: () => 'u',
      skipSuccessfulRequests: true,
      requestWasSuccessful: (req, res) => res.statusCode !== 401,
    },
    async (app, limiter) => {
      const key = `${p}${limiter.namespace}u`;
      for (let i = 0; i < 3; i++) assert.equal((await app.get('/', { 'x-status': '500' })).status, 500, 'successful: 500 is not 401');
      await spent(key, 0);
      assert.equal((await app.get('/', { 'x-status': '401' })).status, 401);
      await spent(key, 1);
      assert.equal((await app.get('/', { 'x-status': '401' })).status, 401);
      await spent(key, 2);
      assert.equal((await app.get()).status, 429, 'two failed logins: locked out');
    },
  );
});
