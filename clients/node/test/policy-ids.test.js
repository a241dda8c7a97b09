'use strict';

// The id of the RateLimit-Policy and RateLimit items, by the rule both
// clients follow: the table of clients/test-vectors/policy-ids.json, which
// the Python client's suite reads too, run through the middleware against a
// real ratelimitd serving the table's policies.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { RateLimitClient } = require('..');
const { startRatelimitd } = require('../test-support/ratelimitd');
const { readVectors, assertReadmeStates } = require('../test-support/vectors');
const { withApp } = require('../test-support/app');

const vectors = readVectors('policy-ids.json');

// The table spells options as the Python client does.
const NODE_NAMES = { window_ms: 'windowMs', refill_rate: 'refillRate' };
function nodeOptions(options) {
  const renamed = Object.fromEntries(
    Object.entries(options).map(([name, value]) => [NODE_NAMES[name] ?? name, value]),
  );
  if (renamed.limits) renamed.limits = renamed.limits.map(nodeOptions);
  return renamed;
}

let server;
let client;

before(async () => {
  server = await startRatelimitd({ config: { 'policies.yaml': vectors.policies } });
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

test('the README states the rule of the shared table, word for word', () => {
  assertReadmeStates(vectors.rule);
});

for (const { case: name, limiter, id, q } of vectors.cases) {
  test(`RateLimit-Policy id: ${name}`, async () => {
    await withApp({ client, ...nodeOptions(limiter), prefix: `policy-ids:${process.pid}:` }, async (app) => {
      const res = await app.get('/');
      assert.equal(res.status, 200);
      const item = `"${id}";`;
      const policy = res.headers.get('ratelimit-policy');
      const current = res.headers.get('ratelimit');
      assert.ok(policy?.startsWith(`${item}q=${q}`), `RateLimit-Policy: ${policy}`);
      assert.ok(current?.startsWith(`${item}r=`), `RateLimit: ${current}`);
    });
  });
}
