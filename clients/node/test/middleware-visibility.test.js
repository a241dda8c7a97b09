'use strict';

// The defaults (300 ms deadline, fail open) and every fail-open
// made visible: the RateLimit-Degraded header, the onDegraded hook, the
// limiter's stats, and the throttled warning.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { once } = require('node:events');
const { rateLimiter, RateLimitClient } = require('..');
const { startRatelimitd, freePort } = require('../test-support/ratelimitd');
const { withApp, recorder } = require('../test-support/app');

let server;
let client;
let n = 0;
const prefix = (name) => `visibility-test:${name}:${process.pid}:${++n}:`;

before(async () => {
  server = await startRatelimitd();
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

const fixed = { type: 'fixed_window', limit: 2, windowMs: 10000 };

test('defaults: a 300 ms deadline and onServiceError allow', async () => {
  const limiter = rateLimiter({ address: '127.0.0.1:1', ...fixed });
  assert.equal(limiter.client.deadlineMs, 300);
  limiter.client.close();
});

test('stats count what ratelimitd decided and what it denied', async () => {
  await withApp({ client, ...fixed, prefix: prefix('stats') }, async (app, limiter) => {
    assert.deepEqual(limiter.stats, { decided: 0, denied: 0, failOpen: 0, failClosed: 0 });
    for (const status of [200, 200, 429]) {
      const res = await app.get();
      assert.equal(res.status, status);
      assert.equal(res.headers.get('ratelimit-degraded'), null);
    }
    assert.deepEqual(limiter.stats, { decided: 3, denied: 1, failOpen: 0, failClosed: 0 });
  });
});

test('unreachable: allowed with RateLimit-Degraded: unavailable, onDegraded(req, info), stats.failOpen, one warning', async () => {
  const { warnings, logger } = recorder();
  const seen = [];
  const address = `127.0.0.1:${await freePort()}`;
  const onDegraded = (req, info) => seen.push({ path: req.path, reason: info.reason, code: info.error?.code });
  await withApp({ address, ...fixed, logger, onDegraded }, async (app, limiter) => {
    for (let i = 0; i < 3; i++) {
      const res = await app.get();
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-degraded'), 'unavailable');
      assert.equal(res.headers.get('ratelimit'), null, 'no rate limit headers without a decision');
    }
    assert.deepEqual(limiter.stats, { decided: 0, denied: 0, failOpen: 3, failClosed: 0 });
  });
  assert.deepEqual(seen, Array(3).fill({ path: '/', reason: 'unavailable', code: 'UNAVAILABLE' }));
  assert.equal(warnings.length, 1, 'the log stays throttled: one line, not one per request');
});

test("unreachable, onServiceError 'deny': 503, no RateLimit-Degraded, stats.failClosed", async () => {
  const address = `127.0.0.1:${await freePort()}`;
  const seen = [];
  const { logger } = recorder();
  await withApp({ address, ...fixed, logger, onServiceError: 'deny', onDegraded: () => seen.push(1) }, async (app, limiter) => {
    const res = await app.get();
    assert.equal(res.status, 503);
    assert.deepEqual(await res.json(), { error: 'Rate limiter unavailable' });
    assert.equal(res.headers.get('ratelimit-degraded'), null);
    assert.deepEqual(limiter.stats, { decided: 0, denied: 0, failOpen: 0, failClosed: 1 });
  });
  assert.deepEqual(seen, [], 'nothing was let through');
});

test('too slow: RateLimit-Degraded: timeout after the deadline', async () => {
  const sockets = new Set();
  const silent = net.createServer((s) => sockets.add(s));
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  const { logger } = recorder();
  const seen = [];
  try {
    await withApp(
      { address: `127.0.0.1:${silent.address().port}`, deadlineMs: 200, ...fixed, logger, onDegraded: (req, info) => seen.push(info.reason) },
      async (app, limiter) => {
        const res = await app.get();
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit-degraded'), 'timeout');
        assert.equal(limiter.stats.failOpen, 1);
      },
    );
  } finally {
    for (const s of sockets) s.destroy();
    silent.close();
  }
  assert.deepEqual(seen, ['timeout']);
});

test('any other gRPC error (an unknown policy): RateLimit-Degraded: error', async () => {
  const { warnings, logger } = recorder();
  const seen = [];
  await withApp(
    { client, policy: 'no-such-policy', logger, onDegraded: (req, info) => seen.push([info.reason, info.error.code]) },
    async (app, limiter) => {
      const res = await app.get();
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-degraded'), 'error');
      assert.equal(limiter.stats.failOpen, 1);
    },
  );
  assert.deepEqual(seen, [['error', 'NOT_FOUND']]);
  assert.match(warnings[0], /NOT_FOUND/);
});

test("ratelimitd's own store failing under its fail-open policy: RateLimit-Degraded: store", async () => {
  // A Redis that is not there: ratelimitd answers by its failure policy, marked degraded.
  const redisPort = await freePort();
  const degradedServer = await startRatelimitd({
    args: ['--redis-url', `redis://127.0.0.1:${redisPort}/0`, '--failure-policy', 'fail-open'],
  });
  const seen = [];
  try {
    await withApp(
      { address: degradedServer.address, deadlineMs: 1000, ...fixed, onDegraded: (req, info) => seen.push([info.reason, info.decision.degraded]) },
      async (app, limiter) => {
        const res = await app.get();
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit-degraded'), 'store');
        assert.equal(limiter.stats.decided, 1, 'ratelimitd decided it');
        assert.equal(limiter.stats.failOpen, 0, 'not a client-side fail-open');
      },
    );
  } finally {
    await degradedServer.stop();
  }
  assert.deepEqual(seen, [['store', true]]);
});

test('a throwing onDegraded does not break the request; it is logged', async () => {
  const { warnings, logger } = recorder();
  const address = `127.0.0.1:${await freePort()}`;
  const onDegraded = () => {
    throw new Error('metrics down');
  };
  await withApp({ address, ...fixed, logger, onDegraded }, async (app) => {
    assert.equal((await app.get()).status, 200);
  });
  assert.ok(warnings.some((w) => /onDegraded threw: metrics down/.test(w)), warnings.join('\n'));
});
