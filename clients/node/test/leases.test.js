'use strict';

// Leases: a hot policy decided in the client, from units ratelimitd spent
// for it (Leases/Lease), against real ratelimitd processes with a policies
// file whose limits say `lease: true`, on the embedded store and on a real
// redis-server of the test's own.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { once } = require('node:events');
const { RateLimitClient, RateLimitError, rateLimiter } = require('..');
const { startRatelimitd, waitFor } = require('../test-support/ratelimitd');
const { startRedis } = require('../test-support/redis');
const { startApp } = require('../test-support/app');

const POLICIES = `
policies:
  hot:
    - {per: 1m, limit: 500, algorithm: fixed_window, lease: true}
  hot-pair:
    - {name: per-second, per: 1s, limit: 1000, algorithm: token_bucket, lease: true}
    - {name: per-minute, per: 1m, limit: 300, algorithm: fixed_window, lease: true}
  bucket:
    - {per: 1h, limit: 100000, algorithm: token_bucket, lease: true}
  slow-bucket:
    - {per: 1h, limit: 1000, algorithm: token_bucket, lease: true}
  refill:
    - {per: 1h, limit: 180000, algorithm: token_bucket, lease: true}
  web:
    - {per: 1m, limit: 100, algorithm: fixed_window, lease: true}
  plain:
    - {per: 1m, limit: 50, algorithm: fixed_window}
  half:
    - {per: 1m, limit: 50, algorithm: fixed_window, lease: true}
    - {per: 1h, limit: 100, algorithm: fixed_window}
`;

let server;
let redis;
let onRedis;
// Look (cost 0) at a policy's counters as ratelimitd has them, without
// leases: on the embedded store, and on Redis.
let looker;
let redisLooker;
const clients = [];
let n = 0;
const uniqueKey = (name) => `leases-test:${name}:${process.pid}:${++n}`;

before(async () => {
  server = await startRatelimitd({ config: { 'policies.yaml': POLICIES } });
  redis = await startRedis();
  onRedis = await startRatelimitd({ config: { 'policies.yaml': POLICIES }, args: ['--redis-url', redis.url] });
  looker = new RateLimitClient({ address: server.address, deadlineMs: 2000, leases: false });
  redisLooker = new RateLimitClient({ address: onRedis.address, deadlineMs: 2000, leases: false });
});

after(async () => {
  for (const c of clients) c.close();
  looker?.close();
  redisLooker?.close();
  await server?.stop();
  await onRedis?.stop();
  await redis?.stop();
});

/** A client on `address` (default the embedded-store server's), closed after the tests. */
function client(options = {}) {
  const c = new RateLimitClient({ address: server.address, deadlineMs: 2000, ...options });
  clients.push(c);
  return c;
}

/** Which way one check went: by the counters of leaseStats() around it. */
async function checkAndSee(c, key, options) {
  const before = c.leaseStats();
  const decision = await c.check(key, options);
  const after = c.leaseStats();
  const how = after.localAllowed > before.localAllowed ? 'local' : after.localDenied > before.localDenied ? 'local-denied' : 'call';
  return { decision, how };
}

/** The fields of one decision and of its limits, to compare shapes. */
const shape = (d) => ({ top: Object.keys(d).sort(), limits: d.limits.map((l) => Object.keys(l).sort()) });

async function hotPolicyRun(c, key) {
  let allowed = 0;
  let lastLocalRemaining = Infinity;
  const local = [];
  const denied = [];
  for (let i = 0; i < 2000; i++) {
    const { decision: d, how } = await checkAndSee(c, key, { policy: 'hot' });
    assert.equal(d.degraded, false);
    assert.equal(d.limit, 500, JSON.stringify(d));
    assert.ok(d.remaining >= 0 && d.remaining <= 500, JSON.stringify(d));
    if (d.allowed) allowed++;
    else denied.push(d);
    if (how === 'local') {
      local.push(d);
      assert.ok(
        d.remaining <= lastLocalRemaining,
        `check ${i}: remaining went up from ${lastLocalRemaining} to ${d.remaining} while leased units were spent`,
      );
      lastLocalRemaining = d.remaining;
      assert.equal(d.retryAfterMs, 0);
      assert.ok(d.resetAfterMs > 0 && d.resetAfterMs <= 60000, `resetAfterMs ${d.resetAfterMs}`);
    }
  }
  return { allowed, local, denied };
}

for (const store of ['embedded store', 'Redis']) {
  test(`${store}: 2000 checks of a hot policy and key: most decided in the client, never more than the limit`, async () => {
    const c = client({ address: store === 'Redis' ? onRedis.address : server.address });
    const key = uniqueKey('hot');
    const { allowed, local, denied } = await hotPolicyRun(c, key);
    const stats = c.leaseStats();
    assert.ok(allowed <= 500, `${allowed} allowed by a limit of 500 per minute`);
    assert.ok(allowed >= 450, `only ${allowed} of 500 allowed: leased units were lost (${JSON.stringify(stats)})`);
    assert.ok(stats.localAllowed >= 400, `only ${stats.localAllowed} of ${allowed} allowed in the client: ${JSON.stringify(stats)}`);
    assert.equal(local.length, stats.localAllowed);
    assert.ok(stats.localAllowed + stats.localDenied >= 1500, `decided in the client: ${JSON.stringify(stats)}`);
    assert.ok(stats.asks >= 1 && stats.grants >= 1, JSON.stringify(stats));
    assert.ok(stats.asks < 500, `an ask per ${Math.round(2000 / stats.asks)} checks: ${JSON.stringify(stats)}`);
    // The 1500 over the limit are denied, each with a time to wait.
    assert.equal(denied.length, 2000 - allowed);
    for (const d of denied) {
      assert.equal(d.remaining, 0);
      assert.ok(d.retryAfterMs > 0 && d.retryAfterMs <= 60000, `retryAfterMs ${d.retryAfterMs}`);
      assert.equal(d.costExceedsLimit, false);
    }
    c.close();
  });
}

test('two leasing clients and one without leases on one key, at once: never more than the limit together', async () => {
  const key = uniqueKey('shared');
  const a = client({ address: onRedis.address });
  const b = client({ address: onRedis.address });
  const plain = client({ address: onRedis.address, leases: false });
  const run = async (c, checks) => {
    let allowed = 0;
    for (let i = 0; i < checks; i++) if ((await c.check(key, { policy: 'hot' })).allowed) allowed++;
    return allowed;
  };
  const allowed = await Promise.all([run(a, 1500), run(b, 1500), run(plain, 300)]);
  const total = allowed.reduce((x, y) => x + y, 0);
  assert.ok(total <= 500, `${total} allowed (${allowed.join(' + ')}) by a limit of 500 per minute`);
  assert.ok(a.leaseStats().localAllowed > 0 && b.leaseStats().localAllowed > 0, 'both clients decided some checks themselves');
  assert.equal((await redisLooker.check(key, { policy: 'hot', cost: 0 })).remaining, 0, 'the limit is spent');
});

test('a decision made in the client has exactly the fields of a CheckLimit decision', async () => {
  const c = client();
  const key = uniqueKey('shape');
  const viaCall = await looker.check(uniqueKey('shape-call'), { policy: 'hot-pair' });
  let d;
  let how;
  await waitFor(
    async () => {
      ({ decision: d, how } = await checkAndSee(c, key, { policy: 'hot-pair' }));
      return how === 'local';
    },
    { intervalMs: 1, what: 'a check of a hot policy decided in the client' },
  );
  assert.deepEqual(shape(d), shape(viaCall));
  assert.equal(d.allowed, true);
  assert.equal(d.degraded, false);
  assert.equal(d.costExceedsLimit, false);
  assert.deepEqual(d.limits.map((l) => l.name), ['per-second', 'per-minute']);
  assert.deepEqual(d.limits.map((l) => l.limit), [1000, 300]);
  // The top level is the limit with the fewest units left: the per-minute one.
  assert.equal(d.mostRestrictive, 1);
  assert.equal(d.limit, 300);
  assert.equal(d.remaining, d.limits[1].remaining);
  assert.equal(d.resetAfterMs, d.limits[1].resetAfterMs);
  // What ratelimitd has left plus what the client holds: at least what
  // ratelimitd has left, at most the limit less the checks made.
  const look = await looker.check(key, { policy: 'hot-pair', cost: 0 });
  assert.ok(d.remaining >= look.limits[1].remaining, `${d.remaining} < ratelimitd's ${look.limits[1].remaining}`);
  assert.ok(d.remaining <= 300 - 20, `${d.remaining} after at least 20 checks`);
});

test('cost: a check spends several leased units', async () => {
  const c = client();
  const key = uniqueKey('cost');
  let previous;
  let how;
  await waitFor(
    async () => {
      ({ decision: previous, how } = await checkAndSee(c, key, { policy: 'bucket', cost: 1 }));
      return how === 'local';
    },
    { intervalMs: 1, what: 'a check of a hot policy decided in the client' },
  );
  const { decision: d, how: next } = await checkAndSee(c, key, { policy: 'bucket', cost: 3 });
  if (next === 'local') assert.equal(d.remaining, previous.remaining - 3);
  assert.equal(d.allowed, true);
});

test('leases: false: every check is a CheckLimit', async () => {
  const c = client({ leases: false });
  assert.equal(c.leases, false);
  const key = uniqueKey('off');
  for (let i = 1; i <= 100; i++) {
    const d = await c.check(key, { policy: 'hot' });
    // No unit is held anywhere: each answer is ratelimitd's count, exactly.
    assert.equal(d.remaining, 500 - i);
  }
  assert.deepEqual(c.leaseStats(), { localAllowed: 0, localDenied: 0, fallbacks: 0, asks: 0, grants: 0 });
  assert.equal((await looker.check(key, { policy: 'hot', cost: 0 })).remaining, 400, 'nothing leased');
});

test('RATELIMITD_LEASES=off turns leases off; leases: true in code wins', async () => {
  process.env.RATELIMITD_LEASES = 'off';
  try {
    const off = client();
    assert.equal(off.leases, false);
    const key = uniqueKey('env-off');
    for (let i = 1; i <= 50; i++) assert.equal((await off.check(key, { policy: 'hot' })).remaining, 500 - i);
    assert.equal(off.leaseStats().asks, 0);
    assert.equal(client({ leases: true }).leases, true);
    process.env.RATELIMITD_LEASES = 'maybe';
    assert.throws(() => new RateLimitClient(), /RATELIMITD_LEASES must be on, off, 1, 0, true or false, got "maybe"/);
    process.env.RATELIMITD_LEASES = 'on';
    assert.equal(client().leases, true);
  } finally {
    delete process.env.RATELIMITD_LEASES;
  }
  assert.equal(client().leases, true, 'on by default');
  assert.throws(() => new RateLimitClient({ leases: 'no' }), /`leases` must be true or false, got "no"/);
  assert.throws(() => new RateLimitClient({ leaseThreshold: 0 }), /`leaseThreshold` must be a number of checks per second above 0/);
});

test('leaseThreshold: below it, no lease is asked for', async () => {
  const c = client({ leaseThreshold: 100000 });
  const key = uniqueKey('threshold');
  for (let i = 1; i <= 100; i++) assert.equal((await c.check(key, { policy: 'hot' })).remaining, 500 - i);
  assert.equal(c.leaseStats().asks, 0);
});

test('a policy whose limits are not all leasable, or not leasable at all, keeps working per request', async () => {
  const c = client();
  for (const policy of ['plain', 'half']) {
    const key = uniqueKey(policy);
    const before = c.leaseStats();
    for (let i = 1; i <= 80; i++) {
      const d = await c.check(key, { policy });
      assert.equal(d.allowed, i <= 50, `${policy} check ${i}`);
      assert.equal(d.remaining, Math.max(0, 50 - i), `${policy} check ${i}: every answer is ratelimitd's count`);
    }
    const after = c.leaseStats();
    assert.equal(after.localAllowed, before.localAllowed, policy);
    assert.equal(after.localDenied, before.localDenied, policy);
    // ratelimitd refused the first ask: the policy is never asked for again.
    assert.equal(after.asks - before.asks, 1, `${policy}: ${JSON.stringify(after)}`);
    await waitFor(() => c.leaseStats().grants - before.grants === 1, { what: `the refusal of ${policy}` });
    for (let i = 0; i < 40; i++) await c.check(uniqueKey(`${policy}-again`), { policy });
    assert.equal(c.leaseStats().asks - before.asks, 1, `${policy} asked for again`);
  }
});

test("a policy ratelimitd does not know: NOT_FOUND, per request, as without leases", async () => {
  const c = client();
  const key = uniqueKey('unknown');
  for (let i = 0; i < 40; i++) {
    await assert.rejects(c.check(key, { policy: 'no-such-policy' }), (err) => {
      assert.ok(err instanceof RateLimitError);
      assert.equal(err.code, 'NOT_FOUND');
      return true;
    });
  }
  assert.equal(c.leaseStats().localAllowed, 0);
  assert.ok(c.leaseStats().asks <= 1);
});

test('a key ratelimitd refuses is refused per request, and the policy is still leased for other keys', async () => {
  const c = client();
  for (let i = 0; i < 40; i++) {
    await assert.rejects(c.check('k'.repeat(1025), { policy: 'hot' }), { code: 'INVALID_ARGUMENT' });
  }
  assert.equal(c.leaseStats().asks, 0);
  await leaseSome(c, uniqueKey('good-key'), 'hot');
});

test('RESOURCE_EXHAUSTED (too many leases on the stream): per request, asked again a second later', async () => {
  const own = await startRatelimitd({ config: { 'policies.yaml': POLICIES }, args: ['--lease-max-per-stream', '1'] });
  const c = new RateLimitClient({ address: own.address, deadlineMs: 500 });
  try {
    await leaseSome(c, uniqueKey('first'), 'bucket');
    await settled(c);
    const second = uniqueKey('second');
    const asks = c.leaseStats().asks;
    const local = c.leaseStats().localAllowed;
    const started = Date.now();
    let checks = 0;
    while (Date.now() - started < 1500) {
      assert.equal((await c.check(second, { policy: 'bucket' })).allowed, true);
      checks++;
    }
    assert.equal(c.leaseStats().localAllowed, local, 'the second key was never decided in the client');
    const asked = c.leaseStats().asks - asks;
    assert.ok(asked >= 2 && asked <= 3, `${asked} asks in 1.5 s of ${checks} checks: one, then one a second later`);
  } finally {
    c.close();
    await own.stop();
  }
});

/**
 * Resolves once the asks the last checks made are sent (on the next turn of
 * the event loop) and answered.
 */
async function settled(c) {
  await new Promise((resolve) => setImmediate(resolve));
  await waitFor(() => c.leaseStats().grants === c.leaseStats().asks, { what: 'every ask answered' });
}

/** Hot checks on `key` until one is decided in the client; returns the last local decision. */
async function leaseSome(c, key, policy) {
  let local;
  await waitFor(
    async () => {
      const { decision, how } = await checkAndSee(c, key, { policy });
      if (how === 'local') local = decision;
      return how === 'local';
    },
    { intervalMs: 1, what: `a check of ${policy} decided in the client` },
  );
  // A few more, which may spend the units held down to a renewal.
  for (let i = 0; i < 10; i++) {
    const { decision, how } = await checkAndSee(c, key, { policy });
    if (how === 'local') local = decision;
  }
  return local;
}

test('close() gives back the units held: on Redis, a token bucket has them again at once', async () => {
  // 50 tokens a second: a lease holds a few seconds of them.
  const c = client({ address: onRedis.address });
  const key = uniqueKey('close');
  const look = async () => (await redisLooker.check(key, { policy: 'refill', cost: 0 })).remaining;
  // Checks until the client holds at least 150 units (3 s of refill, more
  // than the wait below): the remaining it answers is ratelimitd's plus
  // what it holds.
  let last = await leaseSome(c, key, 'refill');
  await waitFor(
    async () => {
      const { decision, how } = await checkAndSee(c, key, { policy: 'refill' });
      if (how === 'local') last = decision;
      return how === 'local' && last.remaining - (await look()) >= 150;
    },
    { intervalMs: 1, what: 'the client to hold 150 units' },
  );
  c.close();
  const started = Date.now();
  await waitFor(async () => (await look()) >= last.remaining, {
    timeoutMs: 2500,
    what: `ratelimitd's count of ${key} to come back to the client's last remaining, ${last.remaining}, sooner than the refill would`,
  });
  assert.ok(Date.now() - started < 2500);
});

test('a policy and key without checks for 5 s is released', async () => {
  const c = client();
  const key = uniqueKey('idle');
  await leaseSome(c, key, 'slow-bucket');
  const started = Date.now();
  await settled(c);
  const asks = c.leaseStats().asks;
  await waitFor(() => c.leaseStats().asks > asks, { timeoutMs: 10000, intervalMs: 50, what: `the release of ${key}` });
  const elapsed = Date.now() - started;
  assert.ok(elapsed >= 4000, `an ask ${elapsed} ms after the last check, before 5 s without checks`);
  await waitFor(() => c.leaseStats().grants === c.leaseStats().asks, { what: 'the answer to the release' });
  assert.equal(c.leaseStats().asks, asks + 1, 'one ask: the release');
  // Released: the next checks start afresh, per request until hot again.
  const { how } = await checkAndSee(c, key, { policy: 'slow-bucket' });
  assert.equal(how, 'call');
});

test('the stream breaks: units held still decide, then CheckLimit per request; back, the client leases again', async () => {
  const own = await startRatelimitd({ config: { 'policies.yaml': POLICIES } });
  let again;
  const c = new RateLimitClient({ address: own.address, deadlineMs: 500 });
  try {
    const key = uniqueKey('break');
    await leaseSome(c, key, 'bucket');
    await own.kill();
    // Never unlimited: once the units held are spent or void, checks fail.
    const before = c.leaseStats();
    let succeeded = 0;
    let failure;
    for (let i = 0; i < 100000 && !failure; i++) {
      try {
        await c.check(key, { policy: 'bucket' });
        succeeded++;
      } catch (err) {
        failure = err;
      }
    }
    assert.ok(failure instanceof RateLimitError, `no check failed with ratelimitd gone: ${succeeded} allowed`);
    assert.ok(['UNAVAILABLE', 'DEADLINE_EXCEEDED'].includes(failure.code), failure.code);
    assert.equal(c.leaseStats().localAllowed - before.localAllowed, succeeded, 'every check allowed without ratelimitd was a leased unit');

    again = await startRatelimitd({ port: own.port, config: { 'policies.yaml': POLICIES } });
    const asks = c.leaseStats().asks;
    const allowed = c.leaseStats().localAllowed;
    await waitFor(
      async () => {
        await c.check(key, { policy: 'bucket' }).catch(() => null);
        const stats = c.leaseStats();
        return stats.asks > asks && stats.localAllowed > allowed;
      },
      { timeoutMs: 15000, intervalMs: 5, what: 'the client to lease again from the restarted ratelimitd' },
    );
  } finally {
    c.close();
    await own.stop();
    await again?.stop();
  }
});

test('ratelimitd back while units of the old stream are still held: the client spends them and leases again', async () => {
  const own = await startRatelimitd({ config: { 'policies.yaml': POLICIES } });
  let again;
  const c = new RateLimitClient({ address: own.address, deadlineMs: 500 });
  const ownLooker = new RateLimitClient({ address: own.address, deadlineMs: 500, leases: false });
  try {
    const key = uniqueKey('back');
    // Until the client holds at least 20 units.
    let last = await leaseSome(c, key, 'bucket');
    let held = 0;
    await waitFor(
      async () => {
        const { decision, how } = await checkAndSee(c, key, { policy: 'bucket' });
        if (how === 'local') last = decision;
        held = last.remaining - (await ownLooker.check(key, { policy: 'bucket', cost: 0 })).remaining;
        return how === 'local' && held >= 20;
      },
      { intervalMs: 1, what: 'the client to hold 20 units' },
    );
    await own.kill();
    // Some of them spent while ratelimitd is away: they are the old stream's.
    for (let i = 0; i < 5; i++) assert.equal((await checkAndSee(c, key, { policy: 'bucket' })).how, 'local');
    again = await startRatelimitd({ port: own.port, config: { 'policies.yaml': POLICIES } });
    // More allowed in the client than it held: the new stream granted units.
    const allowed = c.leaseStats().localAllowed;
    await waitFor(
      async () => {
        await c.check(key, { policy: 'bucket' }).catch(() => null);
        return c.leaseStats().localAllowed - allowed > held;
      },
      { timeoutMs: 15000, intervalMs: 5, what: `more than the ${held} units held to be allowed in the client after the restart` },
    );
  } finally {
    c.close();
    ownLooker.close();
    await own.stop();
    await again?.stop();
  }
});

test('the middleware decides a hot policy from leases: headers, 429s, and never over the limit', async () => {
  const c = client();
  const key = uniqueKey('web');
  const app = await startApp(rateLimiter({ client: c, policy: 'web', keyGenerator: () => key }));
  try {
    const statuses = [];
    let lastRemaining = Infinity;
    for (let i = 0; i < 150; i++) {
      const before = c.leaseStats().localAllowed;
      const res = await app.get();
      statuses.push(res.status);
      const state = res.headers.get('ratelimit');
      assert.match(state ?? '', /^"1m";r=\d+;t=\d+$/, `RateLimit: ${state}`);
      assert.equal(res.headers.get('ratelimit-policy'), '"1m";q=100');
      if (res.status === 429) {
        assert.match(res.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/);
        assert.match(state, /;r=0;/);
      } else if (c.leaseStats().localAllowed > before) {
        const remaining = Number(/;r=(\d+);/.exec(state)[1]);
        assert.ok(remaining <= lastRemaining, `RateLimit remaining went up from ${lastRemaining} to ${remaining}`);
        lastRemaining = remaining;
      }
    }
    const ok = statuses.filter((s) => s === 200).length;
    assert.ok(ok <= 100 && ok >= 90, `${ok} of 150 requests passed a limit of 100`);
    assert.deepEqual(new Set(statuses), new Set([200, 429]));
    assert.ok(c.leaseStats().localAllowed >= 50, JSON.stringify(c.leaseStats()));
  } finally {
    await app.close();
  }
});

/** Runs a script with the package, against `address`; resolves with how long it ran and its output. */
async function runScript(source, address) {
  const started = Date.now();
  const child = spawn(process.execPath, ['-e', source], {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, RATELIMITD_ADDRESS: address },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const timer = setTimeout(() => child.kill('SIGKILL'), 20000);
  const [code, signal] = await once(child, 'exit');
  clearTimeout(timer);
  return { ms: Date.now() - started, code, signal, output };
}

const HOT_SCRIPT = (close, checks = 200) => `
  const { RateLimitClient } = require('.');
  (async () => {
    const c = new RateLimitClient();
    for (let i = 0; i < ${checks}; i++) await c.check('script-${close}-${checks}-${process.pid}', { policy: 'bucket' });
    const stats = c.leaseStats();
    if ((stats.localAllowed === 0) === (${checks} >= 20)) throw new Error('leased or not: ' + JSON.stringify(stats));
    console.log(JSON.stringify(stats));
    ${close ? 'c.close();' : ''}
  })().catch((err) => { console.error(err); process.exit(1); });
`;

test('a process that closes its client exits at once; one that does not, once its leases are released', async () => {
  // Checks too few to lease: nothing but the client's (unreferenced) timers.
  const cold = await runScript(HOT_SCRIPT(false, 5), server.address);
  assert.equal(cold.code, 0, cold.output);
  assert.ok(cold.ms < 4000, `the process took ${cold.ms} ms to exit after checks too few to lease`);
  const closed = await runScript(HOT_SCRIPT(true), server.address);
  assert.equal(closed.code, 0, closed.output);
  assert.ok(closed.ms < 4000, `the process took ${closed.ms} ms to exit after close()`);
  const open = await runScript(HOT_SCRIPT(false), server.address);
  assert.equal(open.code, 0, open.output);
  assert.ok(open.ms < 12000, `the process took ${open.ms} ms to exit without close()`);
});
