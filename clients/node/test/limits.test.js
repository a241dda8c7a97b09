'use strict';

// Several limits in one check, the server's named policies, and batches
// (CheckLimits), against a ratelimitd with a policies file.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { RateLimitClient, RateLimitError } = require('..');
const { startRatelimitd, freePort, waitFor } = require('../test-support/ratelimitd');

const POLICIES = `
policies:
  plan:
    - {name: per-minute, per: 1m, limit: 3}
    - {per: 1h, limit: 5}
    - {name: trial, per: 1h, limit: 1, shadow_mode: true}
`;
const MAX_BATCH_SIZE = 10;

let server;
let client;
let n = 0;
const uniqueKey = (name) => `limits-test:${name}:${process.pid}:${++n}`;

before(async () => {
  server = await startRatelimitd({
    config: { 'policies.yaml': POLICIES },
    args: ['--max-batch-size', String(MAX_BATCH_SIZE)],
  });
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

const byField = (decision, field) => decision.limits.map((status) => status[field]);

test('several limits: allowed only if all allow; a denial by one spends nothing on the others', async () => {
  const key = uniqueKey('several');
  const opts = {
    limits: [
      { name: 'short', type: 'fixed', limit: 2, windowSize: 10000 },
      { name: 'long', type: 'sliding', limit: 5, windowSize: 60000 },
    ],
  };
  let d = await client.check(key, opts);
  assert.equal(d.allowed, true);
  assert.deepEqual(byField(d, 'name'), ['short', 'long']);
  assert.deepEqual(byField(d, 'remaining'), [1, 4]);
  assert.deepEqual(byField(d, 'limit'), [2, 5]);
  // The top level is the most restrictive limit's: the one with fewest left.
  assert.equal(d.mostRestrictive, 0);
  assert.equal(d.limit, 2);
  assert.equal(d.remaining, 1);
  assert.equal(d.retryAfterMs, 0);
  assert.deepEqual(byField(d, 'shadow'), [false, false]);

  d = await client.check(key, opts);
  assert.equal(d.allowed, true);
  assert.deepEqual(byField(d, 'remaining'), [0, 3]);

  const denied = await client.check(key, opts);
  assert.equal(denied.allowed, false);
  assert.deepEqual(byField(denied, 'allowed'), [false, true]);
  assert.deepEqual(byField(denied, 'remaining'), [0, 3], 'the long limit spent nothing');
  assert.equal(denied.mostRestrictive, 0, 'the denying limit');
  assert.equal(denied.limit, 2);
  assert.equal(denied.remaining, 0);
  assert.ok(denied.retryAfterMs > 9000 && denied.retryAfterMs <= 10000, `retryAfterMs ${denied.retryAfterMs}`);
  assert.equal(denied.limits[0].retryAfterMs, denied.retryAfterMs);
  assert.equal(denied.limits[1].retryAfterMs, 0);
  assert.equal(denied.costExceedsLimit, false);
  assert.equal(denied.degraded, false);

  // Still nothing spent on `long`: a look (cost 0) sees 3 left.
  const look = await client.check(key, { ...opts, cost: 0 });
  assert.deepEqual(byField(look, 'remaining'), [0, 3]);

  // A one-limit decision keeps its shape: no `limits`, no `mostRestrictive`.
  const single = await client.check(key, { type: 'fixed', limit: 1, windowSize: 1000 });
  assert.deepEqual(Object.keys(single).sort(), [
    'allowed',
    'costExceedsLimit',
    'degraded',
    'limit',
    'remaining',
    'resetAfterMs',
    'retryAfterMs',
  ]);
});

test("several limits: each limit's own key and cost", async () => {
  const org = uniqueKey('org');
  // Each user's own bucket, and one window shared by the organisation, on
  // which every request counts 1 whatever it costs the user.
  const limitsOf = () => [
    { name: 'user', type: 'token', capacity: 10, refillRate: 0.001 },
    { name: 'org', key: org, type: 'fixed', limit: 3, windowSize: 10000, cost: 1 },
  ];
  const alice = uniqueKey('alice');
  const bob = uniqueKey('bob');
  let d = await client.check(alice, { limits: limitsOf(), cost: 4 });
  assert.deepEqual(byField(d, 'remaining'), [6, 2]);
  d = await client.check(bob, { limits: limitsOf(), cost: 4 });
  assert.deepEqual(byField(d, 'remaining'), [6, 1]);
  assert.equal(d.mostRestrictive, 1);
  d = await client.check(bob, { limits: limitsOf(), cost: 4 });
  assert.equal(d.allowed, true);
  assert.deepEqual(byField(d, 'remaining'), [2, 0]);
  // The organisation's window is full: alice is denied, and her bucket keeps its 6.
  d = await client.check(alice, { limits: limitsOf(), cost: 4 });
  assert.equal(d.allowed, false);
  assert.deepEqual(byField(d, 'allowed'), [true, false]);
  assert.deepEqual(byField(d, 'remaining'), [6, 0]);

  // A cost above one limit: denied for good, so no retry time.
  d = await client.check(uniqueKey('exceeds'), {
    limits: [
      { name: 'small', type: 'fixed', limit: 2, windowSize: 10000 },
      { name: 'big', type: 'fixed', limit: 100, windowSize: 10000 },
    ],
    cost: 3,
  });
  assert.equal(d.allowed, false);
  assert.equal(d.costExceedsLimit, true);
  assert.equal(d.retryAfterMs, null);
  assert.deepEqual(byField(d, 'costExceedsLimit'), [true, false]);
  assert.equal(d.limits[0].retryAfterMs, null);
  assert.deepEqual(byField(d, 'remaining'), [2, 100], 'nothing spent');

  // Two unnamed limits on one key and algorithm would be one counter:
  // ratelimitd refuses the request, naming the rule.
  await assert.rejects(
    client.check(uniqueKey('same-counter'), {
      limits: [
        { type: 'fixed', limit: 1, windowSize: 1000 },
        { type: 'fixed', limit: 5, windowSize: 1000 },
      ],
    }),
    (err) => {
      assert.ok(err instanceof RateLimitError);
      assert.equal(err.code, 'INVALID_ARGUMENT');
      assert.match(err.details, /^limits\[1\]\.key: counts on the same counter as limits\[0\]/);
      return true;
    },
  );
});

test("a policy: the policies file's limits, in its order, all or nothing; shadow limits never deny", async () => {
  const key = uniqueKey('policy');
  let d = await client.check(key, { policy: 'plan' });
  assert.equal(d.allowed, true);
  assert.deepEqual(byField(d, 'name'), ['per-minute', '1h', 'trial']);
  assert.deepEqual(byField(d, 'limit'), [3, 5, 1]);
  assert.deepEqual(byField(d, 'remaining'), [2, 4, 0]);
  assert.deepEqual(byField(d, 'shadow'), [false, false, true]);

  d = await client.check(key, { policy: 'plan' });
  assert.equal(d.allowed, true, 'the shadow limit would deny, but does not');
  assert.deepEqual(byField(d, 'allowed'), [true, true, false]);
  assert.deepEqual(byField(d, 'remaining'), [1, 3, 0]);

  d = await client.check(key, { policy: 'plan' });
  assert.deepEqual(byField(d, 'remaining'), [0, 2, 0]);

  const denied = await client.check(key, { policy: 'plan' });
  assert.equal(denied.allowed, false);
  assert.deepEqual(byField(denied, 'allowed'), [false, true, false]);
  assert.deepEqual(byField(denied, 'remaining'), [0, 2, 0], 'the hour spent nothing');
  assert.equal(denied.limits[denied.mostRestrictive].name, 'per-minute');
  assert.equal(denied.limit, 3);
  assert.equal(denied.remaining, 0);
  assert.ok(denied.retryAfterMs > 50000 && denied.retryAfterMs <= 60000, `retryAfterMs ${denied.retryAfterMs}`);

  // With a cost, and another key: its own counters.
  d = await client.check(uniqueKey('policy'), { policy: 'plan', cost: 2, failurePolicy: 'fail-closed' });
  assert.deepEqual(byField(d, 'remaining'), [1, 3, 1]);
});

test('an unknown policy is NOT_FOUND, naming it; decided once the policies file defines it', async () => {
  const key = uniqueKey('unknown');
  await assert.rejects(client.check(key, { policy: 'gold' }), (err) => {
    assert.ok(err instanceof RateLimitError);
    assert.equal(err.code, 'NOT_FOUND');
    assert.equal(err.grpcCode, 5);
    assert.match(err.details, /policy: 'gold' is not defined/);
    assert.match(err.message, /^ratelimitd CheckLimit failed: NOT_FOUND: policy: 'gold'/);
    return true;
  });
  // The policies file is reloaded when it changes.
  server.writeConfig('policies.yaml', `${POLICIES}  gold:\n    - {per: 1s, limit: 100, algorithm: gcra, burst: 10}\n`);
  const d = await waitFor(
    () => client.check(key, { policy: 'gold' }).catch((err) => (err.code === 'NOT_FOUND' ? null : Promise.reject(err))),
    { what: 'the policies file to reload' },
  );
  assert.equal(d.allowed, true);
  assert.deepEqual(byField(d, 'name'), ['1s']);
  assert.equal(d.limit, 10);
});

test('checkMany: each item decided, or failed, on its own, in order', async () => {
  const fixed = { type: 'fixed', limit: 1, windowSize: 10000 };
  const spent = uniqueKey('batch');
  const results = await client.checkMany([
    { key: spent, ...fixed },
    { key: 'k'.repeat(1025), ...fixed },
    { key: uniqueKey('batch'), policy: 'no-such-policy' },
    { key: uniqueKey('batch'), policy: 'plan', cost: 2 },
    { key: uniqueKey('batch'), type: 'fixed', limit: 0, windowSize: 1000 },
    { key: uniqueKey('batch'), limits: [{ name: 'a', ...fixed }, { name: 'b', ...fixed, cost: 0 }] },
  ]);
  assert.equal(results.length, 6);

  assert.equal(results[0].error, null);
  assert.equal(results[0].decision.allowed, true);
  assert.equal(results[0].decision.remaining, 0);
  assert.equal('limits' in results[0].decision, false, 'a one-limit item keeps its shape');

  // Refused by ratelimitd: a RateLimitError with the code CheckLimit would have had.
  const tooLong = results[1].error;
  assert.equal(results[1].decision, null);
  assert.ok(tooLong instanceof RateLimitError);
  assert.equal(tooLong.code, 'INVALID_ARGUMENT');
  assert.equal(tooLong.grpcCode, 3);
  assert.equal(tooLong.index, 1);
  assert.match(tooLong.message, /^ratelimitd CheckLimits: requests\[1\] failed: INVALID_ARGUMENT: key: must be at most 1024 bytes/);

  const unknown = results[2].error;
  assert.ok(unknown instanceof RateLimitError);
  assert.equal(unknown.code, 'NOT_FOUND');
  assert.equal(unknown.index, 2);
  assert.match(unknown.details, /policy: 'no-such-policy' is not defined/);

  assert.equal(results[3].error, null);
  assert.deepEqual(byField(results[3].decision, 'remaining'), [1, 3, 1]);

  // Refused here, before sending: the same RangeError check() would reject with.
  assert.equal(results[4].decision, null);
  assert.ok(results[4].error instanceof RangeError);
  assert.match(results[4].error.message, /^RateLimitClient\.checkMany: requests\[4\]: `limit` must be a whole number from 1/);

  assert.equal(results[5].error, null);
  assert.deepEqual(byField(results[5].decision, 'remaining'), [0, 1]);

  // The first item was spent, as CheckLimit would have.
  assert.equal((await client.check(spent, fixed)).allowed, false);
});

test('checkMany: only a malformed batch, or a failed call, rejects as a whole', async () => {
  const item = (i) => ({ key: uniqueKey(`whole-${i}`), type: 'fixed', limit: 1, windowSize: 1000 });
  await assert.rejects(client.checkMany([]), (err) => {
    assert.ok(err instanceof TypeError);
    assert.match(err.message, /^RateLimitClient\.checkMany: `requests` must be a non-empty array .* got an empty array$/);
    return true;
  });
  await assert.rejects(client.checkMany(item(0)), /`requests` must be a non-empty array .* got \[object Object\]/);
  await assert.rejects(client.checkMany([item(0)], { deadline: 5 }), /unknown option `deadline` \(known: deadlineMs\)/);
  await assert.rejects(client.checkMany([item(0)], { deadlineMs: 0 }), /`deadlineMs` must be a number of milliseconds above 0/);

  // Per item: a `deadlineMs` (the call's), a missing key, not an object.
  const results = await client.checkMany([{ ...item(1), deadlineMs: 5 }, { ...item(2), key: undefined }, 'k']);
  assert.match(results[0].error.message, /requests\[0\]: `deadlineMs` is the whole call's: pass it as checkMany\(requests, \{ deadlineMs \}\)/);
  assert.match(results[1].error.message, /requests\[1\]: `key` must be a non-empty string, got undefined/);
  assert.match(results[2].error.message, /requests\[2\]: must be an object \{ key, \.\.\.check options \}, got "k"/);
  assert.ok(results.every((r) => r.decision === null && r.error instanceof TypeError), 'nothing was sent');

  // More than ratelimitd's --max-batch-size: the call is refused.
  const tooMany = Array.from({ length: MAX_BATCH_SIZE + 1 }, (_, i) => item(i));
  await assert.rejects(client.checkMany(tooMany), (err) => {
    assert.ok(err instanceof RateLimitError);
    assert.equal(err.code, 'INVALID_ARGUMENT');
    assert.equal(err.index, undefined);
    assert.match(err.message, /^ratelimitd CheckLimits failed: INVALID_ARGUMENT: /);
    return true;
  });
  assert.equal((await client.checkMany(tooMany.slice(1))).filter((r) => r.decision?.allowed).length, MAX_BATCH_SIZE);

  // Nothing listening: UNAVAILABLE.
  const c = new RateLimitClient({ address: `127.0.0.1:${await freePort()}` });
  try {
    await assert.rejects(c.checkMany([item(0)]), { name: 'RateLimitError', code: 'UNAVAILABLE' });
  } finally {
    c.close();
  }
});

test('invalid limits and policies are refused before anything is sent', async () => {
  const fixed = { type: 'fixed', limit: 1, windowSize: 1000 };
  const cases = [
    [{ ...fixed, policy: 'plan' }, TypeError, /pass one of `type` \(one limit\), `limits` \(several\) and `policy` .* not `type` and `policy`/],
    [{ limits: [fixed], policy: 'plan' }, TypeError, /not `limits` and `policy`/],
    [{ limits: [] }, TypeError, /`limits` must be a non-empty array of limits, got an empty array$/],
    [{ limits: fixed }, TypeError, /`limits` must be a non-empty array/],
    [{ limits: [fixed, null] }, TypeError, /limits\[1\]: must be an object with a `type`, got null/],
    [{ limits: [{ type: 'leaky' }] }, TypeError, /limits\[0\]: `type` must be one of 'fixed_window'/],
    [{ limits: [{ type: 'fixed', limit: 1 }] }, TypeError, /limits\[0\]: `windowSize` must be .* got undefined/],
    [{ limits: [{ ...fixed, capacity: 2 }] }, TypeError, /limits\[0\]: `capacity` is not an option of type 'fixed_window'/],
    [{ limits: [{ ...fixed, name: 'a' }, { ...fixed, name: 'a' }] }, TypeError, /limits\[1\]: `name` "a" is taken by an earlier limit/],
    [{ limits: [{ ...fixed, name: 'per second' }] }, TypeError, /limits\[0\]: `name` must be 1 to 64 letters, digits, '_', '-' or '\.', got "per second"/],
    [{ limits: [{ ...fixed, name: 'n'.repeat(65) }] }, TypeError, /`name` must be 1 to 64/],
    [{ limits: [{ ...fixed, key: '' }] }, TypeError, /limits\[0\]: `key` must be a non-empty string, got ""/],
    [{ limits: [{ ...fixed, key: () => 'k' }] }, TypeError, /limits\[0\]: `key` must be a non-empty string, got a function/],
    [{ limits: [{ ...fixed, cost: -1 }] }, RangeError, /limits\[0\]: `cost` must be a whole number from 0/],
    [{ limits: [{ ...fixed, failurePolicy: 'local' }] }, TypeError, /limits\[0\]: unknown option `failurePolicy`/],
    [{ limits: [fixed], limit: 5 }, TypeError, /`limit` is not an option with `limits`: each limit takes its own/],
    [{ limits: [fixed], cost: 1.5 }, RangeError, /`cost` must be a whole number/],
    [{ policy: 'free tier' }, TypeError, /`policy` must be 1 to 64 letters, digits, '_', '-' or '\.', got "free tier"/],
    [{ policy: '' }, TypeError, /`policy` must be 1 to 64/],
    [{ policy: 5 }, TypeError, /`policy` must be 1 to 64 .* got 5/],
    [{ policy: 'plan', windowSize: 1000 }, TypeError, /`windowSize` is not an option with `policy`: the policy's limits are in ratelimitd's policies file/],
    [{ policy: 'plan', failurePolicy: 'open' }, TypeError, /`failurePolicy` must be one of/],
  ];
  for (const [options, type, message] of cases) {
    await assert.rejects(client.check('k', options), (err) => {
      assert.ok(err instanceof type, `${JSON.stringify(options)}: ${err}`);
      assert.match(err.message, message);
      assert.match(err.message, /^RateLimitClient\.check: /);
      return true;
    });
  }
  await assert.rejects(client.check('k', null), /options must be an object with a `type`, `limits` or `policy`, got null/);
  await assert.rejects(client.check('k', {}), /`type` must be one of .* got undefined/);
});
