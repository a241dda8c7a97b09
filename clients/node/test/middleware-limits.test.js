'use strict';

// The middleware with a policy of ratelimitd's policies file, or several
// limits, in place of one `type`.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { rateLimiter, RateLimitClient } = require('..');
const { startRatelimitd } = require('../test-support/ratelimitd');
const { startApp, withApp, recorder } = require('../test-support/app');

const POLICIES = `
policies:
  free-tier:
    - {per: 1s, limit: 10}
    - {per: 1h, limit: 1000}
`;

let server;
let client;
let n = 0;
// Every limiter gets its own prefix, so tests never share a counter.
const prefix = (name) => `mw-limits-test:${name}:${process.pid}:${++n}:`;

before(async () => {
  server = await startRatelimitd({ config: { 'policies.yaml': POLICIES } });
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});


test('a policy: the 11th request in a second on a 10/s policy is 429, with Retry-After and RateLimit headers', async () => {
  const p = prefix('policy');
  await withApp(
    { address: server.address, policy: 'free-tier', prefix: p, key: (req) => req.get('x-user-id') },
    async (app) => {
      const started = Date.now();
      for (let i = 1; i <= 10; i++) {
        const res = await app.get('/', { 'x-user-id': 'alice' });
        assert.equal(res.status, 200, `request ${i}`);
        // The most restrictive limit, under its name; a policy's windows
        // are ratelimitd's, so no `w`.
        assert.equal(res.headers.get('ratelimit-policy'), '"1s";q=10');
        assert.equal(res.headers.get('ratelimit'), `"1s";r=${10 - i};t=1`);
      }
      const res = await app.get('/', { 'x-user-id': 'alice' });
      const elapsed = Date.now() - started;
      assert.ok(elapsed < 1000, `the 11 requests took ${elapsed} ms: more than the window`);
      assert.equal(res.status, 429);
      assert.deepEqual(await res.json(), { error: 'Rate limit exceeded' });
      assert.equal(res.headers.get('retry-after'), '1');
      assert.equal(res.headers.get('ratelimit-policy'), '"1s";q=10');
      assert.equal(res.headers.get('ratelimit'), '"1s";r=0;t=1');

      // Each key its own counters.
      assert.equal((await app.get('/', { 'x-user-id': 'bob' })).status, 200);
    },
  );
  // All or nothing: the denied request spent nothing on the hour.
  const look = await client.check(`${p}rl-db734f2a:alice`, { policy: 'free-tier', cost: 0 });
  assert.deepEqual(
    look.limits.map((l) => [l.name, l.remaining]),
    [
      ['1s', 0],
      ['1h', 990],
    ],
  );
});

test('several limits: per user and per organisation, all or nothing; headers name the most restrictive', async () => {
  await withApp(
    {
      client,
      limits: [
        { name: 'user', type: 'fixed', limit: 2, windowSize: 10000 },
        { name: 'org', key: (req) => req.get('x-org'), type: 'sliding', limit: 3, windowSize: 20000 },
      ],
      keyGenerator: (req) => req.get('x-user-id'),
      prefix: prefix('limits'),
    },
    async (app) => {
      const alice = { 'x-user-id': 'alice', 'x-org': 'acme' };
      const bob = { 'x-user-id': 'bob', 'x-org': 'acme' };
      let res = await app.get('/', alice);
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-policy'), '"user";q=2;w=10');
      assert.equal(res.headers.get('ratelimit'), '"user";r=1;t=10');
      assert.equal((await app.get('/', alice)).status, 200);
      res = await app.get('/', alice);
      assert.equal(res.status, 429, "alice's own limit");
      assert.match(res.headers.get('ratelimit'), /^"user";r=0;t=(9|10)$/);
      assert.ok(Number(res.headers.get('retry-after')) >= 9);

      // Alice's denied request spent nothing on acme: bob gets its last unit.
      res = await app.get('/', bob);
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-policy'), '"org";q=3;w=20');
      assert.equal(res.headers.get('ratelimit'), '"org";r=0;t=20');
      res = await app.get('/', bob);
      assert.equal(res.status, 429, "acme's limit");
      assert.equal(res.headers.get('ratelimit-policy'), '"org";q=3;w=20');
      assert.ok(Number(res.headers.get('retry-after')) >= 19);

      // Another organisation is not limited by acme's.
      assert.equal((await app.get('/', { 'x-user-id': 'carol', 'x-org': 'globex' })).status, 200);

      // No organisation: the error goes to Express's error handler.
      res = await app.get('/', { 'x-user-id': 'dave' });
      assert.equal(res.status, 500);
      assert.match((await res.json()).error, /limits\[1\]\.key\(req\) must return a non-empty string, got undefined/);
    },
  );
});

test('an unknown policy is handled as an outage: onServiceError allow (200, a warning) or deny (503)', async () => {
  for (const [onServiceError, status] of [
    ['allow', 200],
    ['deny', 503],
  ]) {
    const { warnings, logger } = recorder();
    await withApp({ client, policy: 'no-such-policy', onServiceError, logger, prefix: prefix('unknown') }, async (app) => {
      for (let i = 0; i < 3; i++) {
        const res = await app.get();
        assert.equal(res.status, status);
        assert.equal(res.headers.get('ratelimit'), null, 'no headers without a decision');
        if (status === 503) assert.deepEqual(await res.json(), { error: 'Rate limiter unavailable' });
      }
    });
    assert.equal(warnings.length, 1, 'one warning, not one per request');
    assert.match(
      warnings[0],
      new RegExp(
        `^\\[ratelimitd\\] ratelimitd could not decide \\(NOT_FOUND: policy: 'no-such-policy' is not defined in the server's policies\\); onServiceError is '${onServiceError}'`,
      ),
    );
  }
});

test('policy and limits options are checked when the middleware is created', () => {
  const fixed = { type: 'fixed', limit: 1, windowSize: 1000 };
  const cases = [
    [{ client, policy: 'free-tier', ...fixed }, /pass one of `type` \(one limit\), `limits` \(several\) and `policy` .* not `type` and `policy`/],
    [{ client, policy: 'free-tier', limits: [fixed] }, /not `limits` and `policy`/],
    [{ client, policy: 'free-tier', windowSize: 1000 }, /`windowSize` is not an option with `policy`/],
    [{ client, policy: 'free tier' }, /`policy` must be 1 to 64 letters, digits, '_', '-' or '\.', got "free tier"/],
    [{ client, limits: [] }, /`limits` must be a non-empty array of limits/],
    [{ client, limits: [fixed], limit: 5 }, /`limit` is not an option with `limits`: each limit takes its own/],
    [{ client, limits: [{ type: 'fixed', limit: 1 }] }, /limits\[0\]: `windowSize` must be .* got undefined/],
    [{ client, limits: [{ ...fixed, key: 5 }] }, /limits\[0\]: `key` must be a non-empty string or a function \(req\) => string, got 5/],
    [{ client, limits: [{ ...fixed, name: 'a' }, { ...fixed, name: 'a' }] }, /limits\[1\]: `name` "a" is taken/],
    [{ client, limits: [{ ...fixed, prefix: 'x' }] }, /limits\[0\]: unknown option `prefix`/],
    [{ client, policy: 'free-tier', key: (req) => req.ip, keyGenerator: (req) => req.ip }, /pass one of `key` and `keyGenerator` \(the same option\), not both/],
    [{ client, policy: 'free-tier', key: 'ip' }, /`keyGenerator` \(or `key`\) must be a function/],
    [{ policy: 'free-tier', client, address: '127.0.0.1:1' }, /pass one of `address`.*and `client`.*not both/],
    [{ policy: 'free-tier', max: 5 }, /`max` is not an option with `policy`/],
  ];
  for (const [options, message] of cases) {
    assert.throws(() => rateLimiter(options), (err) => {
      assert.ok(err instanceof TypeError || err instanceof RangeError, String(err));
      assert.match(err.message, /^rateLimiter: /);
      assert.match(err.message, message);
      return true;
    });
  }
});
