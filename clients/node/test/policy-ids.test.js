'use strict';

// The id of the RateLimit-Policy and RateLimit items, by the rule both
// clients follow: the table of clients/test-vectors/policy-ids.json, which
// the Python client's suite reads too, run through the middleware against a
// real ratelimitd serving the table's policies.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { RateLimitClient } = require('..');
const { startRatelimitd } = require('../test-support/ratelimitd');
const { withApp } = require('../test-support/app');

const VECTORS = path.join(__dirname, '..', '..', 'test-vectors', 'policy-ids.json');
const README = path.join(__dirname, '..', 'README.md');

function readVectors() {
  try {
    return JSON.parse(fs.readFileSync(VECTORS, 'utf8'));
  } catch (err) {
    throw new Error(`cannot read the shared test vectors (in a ratelimitd checkout): ${err.message}`);
  }
}
const vectors = readVectors();

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
  const words = (text) => text.replace(/\s+/g, ' ');
  assert.ok(
    words(fs.readFileSync(README, 'utf8')).includes(words(vectors.rule)),
    `README.md must state, as the Python client's README does:\n${vectors.rule}`,
  );
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
