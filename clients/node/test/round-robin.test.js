'use strict';

// The README's Kubernetes setting ("In Kubernetes: every pod, not one"):
// with the round_robin service config in `channelOptions`, a client spreads
// its calls over every address its target names, and without it sends them
// all to one. Two instances on one port, at 127.0.0.1 and 127.0.0.2, stand
// for two pods behind a headless Service; each decides on its own embedded
// store, so a limit of 3 admits 3 at each instance a client reaches. The
// target lists both addresses (`ipv4:`) where a Kubernetes client names the
// Service (`dns:///`): both resolve to a list of addresses for the same
// policy.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { RateLimitClient, rateLimiter } = require('..');
const { startRatelimitd } = require('../test-support/ratelimitd');
const { startApp } = require('../test-support/app');

const ROUND_ROBIN = {
  'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ round_robin: {} }] }),
};

let pods = [];
let target;
let authority;
let n = 0;
const uniqueKey = (name) => `round-robin-test:${name}:${process.pid}:${++n}`;

before(async () => {
  const first = await startRatelimitd();
  const second = await startRatelimitd({ port: first.port, host: '127.0.0.2' });
  pods = [first, second];
  target = `ipv4:127.0.0.1:${first.port},127.0.0.2:${first.port}`;
  // A Service's name, as the authority would be with dns:///.
  authority = { 'grpc.default_authority': `ratelimitd-headless.tests.svc:${first.port}` };
});

after(async () => {
  await Promise.all(pods.map((pod) => pod.stop()));
});

// Round robin spreads calls over the addresses whose connections are
// ready: the second may still be connecting when the first calls go out.
// So calls go on until `wanted` are admitted (or a deadline passes), and
// then some more, which must all be denied.
const DEADLINE_MS = 5_000;
const MORE_CALLS = 10;

async function callsUntil(wanted, call) {
  let allowed = 0;
  const deadline = Date.now() + DEADLINE_MS;
  while (allowed < wanted && Date.now() < deadline) if (await call()) allowed++;
  for (let i = 0; i < MORE_CALLS; i++) if (await call()) allowed++;
  return allowed;
}

async function admitted(client, key, wanted) {
  return callsUntil(wanted, async () =>
    (await client.check(key, { type: 'fixed_window', limit: 3, windowMs: 3_600_000 })).allowed);
}

test('round robin reaches every pod', async () => {
  const client = new RateLimitClient({ address: target, channelOptions: { ...ROUND_ROBIN, ...authority } });
  try {
    assert.equal(await admitted(client, uniqueKey('rr'), 6), 6);
  } finally {
    client.close();
  }
});

test('without it, one pod takes every call', async () => {
  const client = new RateLimitClient({ address: target, channelOptions: authority });
  try {
    // Once 3 are admitted, the calls after them all reach the same pod.
    assert.equal(await admitted(client, uniqueKey('pick-first'), 3), 3);
  } finally {
    client.close();
  }
});

test('the middleware given such a client spreads its checks too', async () => {
  const client = new RateLimitClient({ address: target, channelOptions: { ...ROUND_ROBIN, ...authority } });
  const key = uniqueKey('middleware');
  const app = await startApp(rateLimiter({ client, type: 'fixed_window', limit: 3, windowMs: 3_600_000, keyGenerator: () => key }));
  try {
    assert.equal(await callsUntil(6, async () => (await app.get()).status === 200), 6);
  } finally {
    await app.close();
    client.close();
  }
});
