'use strict';

// One vocabulary with the server and the Python client (algorithm
// and failure-policy names), each limiter's own namespace, and the address
// and TLS from the environment.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { rateLimiter, RateLimitClient, TYPES } = require('..');
const { namespaceOf } = require('../lib/middleware');
const { startRatelimitd } = require('../test-support/ratelimitd');
const { withApp, startApp } = require('../test-support/app');

let server;
let client;
let n = 0;
const uniqueKey = (name) => `vocab-test:${name}:${process.pid}:${++n}`;
const prefix = (name) => `${uniqueKey(name)}:`;

before(async () => {
  server = await startRatelimitd();
  client = new RateLimitClient({ address: server.address, deadlineMs: 1000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** Runs fn with process.env changed as `vars` says (undefined unsets), then restores it. */
async function withEnv(vars, fn) {
  const saved = {};
  for (const [name, value] of Object.entries(vars)) {
    saved[name] = process.env[name];
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
  try {
    return await fn();
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  }
}

test("the algorithms are the server's names; the short names fixed, sliding and token are aliases", async () => {
  assert.deepEqual(TYPES, ['fixed_window', 'sliding_window', 'token_bucket', 'gcra', 'sliding_window_counter']);
  const params = {
    fixed_window: { limit: 2, windowMs: 10000 },
    sliding_window: { limit: 2, windowMs: 10000 },
    token_bucket: { capacity: 2, refillRate: 0.01 },
    gcra: { limit: 2, windowMs: 10000 },
    sliding_window_counter: { limit: 2, windowMs: 10000 },
  };
  for (const type of TYPES) {
    const key = uniqueKey(type);
    const decisions = [];
    for (let i = 0; i < 3; i++) decisions.push((await client.check(key, { type, ...params[type] })).allowed);
    assert.deepEqual(decisions, [true, true, false], type);
  }
  // An alias is the same algorithm: the same counter on the same key.
  for (const [alias, type] of [['fixed', 'fixed_window'], ['sliding', 'sliding_window'], ['token', 'token_bucket']]) {
    const key = uniqueKey(alias);
    assert.equal((await client.check(key, { type: alias, ...params[type] })).remaining, 1, alias);
    assert.equal((await client.check(key, { type, ...params[type] })).remaining, 0, alias);
  }
});

test('removed spellings are errors that name the right value', async () => {
  await assert.rejects(client.check('k', { type: 'slidingCounter', limit: 1, windowSize: 1000 }), {
    name: 'TypeError',
    message: /`type` "slidingCounter" is now spelled 'sliding_window_counter'/,
  });
  await assert.rejects(
    client.check('k', { limits: [{ type: 'slidingCounter', limit: 1, windowSize: 1000 }] }),
    /limits\[0\]: `type` "slidingCounter" is now spelled 'sliding_window_counter'/,
  );
  await assert.rejects(
    client.check('k', { type: 'fixed_window', limit: 1, windowSize: 1000, failurePolicy: 'fail_open' }),
    /`failurePolicy` must be one of 'fail-closed', 'fail-open', 'local', got "fail_open"/,
  );
  assert.throws(
    () => rateLimiter({ client, type: 'slidingCounter', limit: 1, windowMs: 1000 }),
    /rateLimiter: `type` "slidingCounter" is now spelled 'sliding_window_counter'/,
  );
});

test("windowMs (express-rate-limit's name) is windowSize, in the client and in limits", async () => {
  const key = uniqueKey('windowMs');
  const d = await client.check(key, { type: 'fixed_window', limit: 3, windowMs: 10000 });
  assert.equal(d.remaining, 2);
  assert.ok(d.resetAfterMs > 9000 && d.resetAfterMs <= 10000);
  const multi = await client.check(uniqueKey('windowMs'), { limits: [{ type: 'sliding_window', limit: 2, windowMs: 1000 }] });
  assert.equal(multi.limits[0].remaining, 1);
  await assert.rejects(
    client.check(key, { type: 'fixed_window', limit: 3, windowMs: 10000, windowSize: 10000 }),
    /pass one of `windowMs` and `windowSize`/,
  );
});

test('namespaces: the test vectors shared with the Python client', () => {
  assert.equal(namespaceOf('limit:fixed_window:5:10000'), 'rl-b45cbbb3:');
  assert.equal(namespaceOf('policy:free-tier'), 'rl-db734f2a:');
  const ns = (options) => {
    const limiter = rateLimiter({ client, ...options });
    return limiter.namespace;
  };
  // Aliases and option names do not change what is limited.
  assert.equal(ns({ type: 'fixed_window', limit: 5, windowMs: 10000 }), 'rl-b45cbbb3:');
  assert.equal(ns({ type: 'fixed', limit: 5, windowSize: 10000 }), 'rl-b45cbbb3:');
  assert.equal(ns({ type: 'fixed', max: 5, windowSize: 10000, prefix: 'extra:' }), 'rl-b45cbbb3:');
  assert.equal(ns({ policy: 'free-tier', key: (req) => req.ip }), 'rl-db734f2a:');
  assert.equal(ns({ name: 'checkout', type: 'fixed_window', limit: 5, windowMs: 10000 }), 'checkout:');
  // The canonical texts: parameters in the proto's field order, durations in ms, shortest decimals.
  assert.equal(ns({ type: 'token_bucket', capacity: 10, refillRate: 2.5 }), namespaceOf('limit:token_bucket:10:2.5'));
  assert.equal(ns({ type: 'gcra', limit: 5, windowMs: 1000 }), namespaceOf('limit:gcra:5:1000:5'));
  assert.equal(ns({ type: 'gcra', limit: 5, windowMs: 1000, burst: 2 }), namespaceOf('limit:gcra:5:1000:2'));
  assert.equal(ns({ type: 'sliding_window_counter', limit: 7, windowMs: 60000 }), namespaceOf('limit:sliding_window_counter:7:60000'));
  assert.equal(
    ns({
      limits: [
        { name: 'user', type: 'fixed', limit: 10, windowMs: 60000 },
        { type: 'token_bucket', capacity: 5, refillRate: 0.1, key: 'global' },
        { name: 'org', type: 'sliding_window', limit: 100, windowMs: 60000, key: (req) => req.ip },
      ],
    }),
    namespaceOf('limits:user=fixed_window:10:60000,=token_bucket:5:0.1@global,org=sliding_window:100:60000'),
  );
  // A limit that depends on the request: its namespace does not.
  assert.equal(ns({ type: 'fixed_window', limit: () => 5, windowMs: 10000 }), namespaceOf('limit:fixed_window:*:10000'));
});

test('namespaces: two limiters with different limits on the same key count apart; the same `name` shares', async () => {
  const p = prefix('ns');
  const small = rateLimiter({ client, prefix: p, type: 'fixed_window', limit: 1, windowMs: 10000 });
  const large = rateLimiter({ client, prefix: p, type: 'fixed_window', limit: 2, windowMs: 10000 });
  const appSmall = await startApp(small);
  const appLarge = await startApp(large);
  try {
    assert.equal((await appSmall.get()).status, 200);
    assert.equal((await appSmall.get()).status, 429);
    // A single-node Redis middleware (and ratelimitd by key and algorithm) would have shared one counter here.
    assert.equal((await appLarge.get()).status, 200);
    assert.equal((await appLarge.get()).status, 200);
    assert.equal((await appLarge.get()).status, 429);
  } finally {
    await appSmall.close();
    await appLarge.close();
  }

  const q = prefix('shared');
  const login = rateLimiter({ client, prefix: q, name: 'login', type: 'fixed_window', limit: 2, windowMs: 10000 });
  const loginApi = rateLimiter({ client, prefix: q, name: 'login', type: 'fixed_window', limit: 2, windowMs: 10000 });
  const other = rateLimiter({ client, prefix: q, name: 'other', type: 'fixed_window', limit: 2, windowMs: 10000 });
  const a = await startApp(login);
  const b = await startApp(loginApi);
  const c = await startApp(other);
  try {
    assert.equal((await a.get()).status, 200);
    assert.equal((await b.get()).status, 200);
    assert.equal((await a.get()).status, 429, 'the same name: one counter');
    assert.equal((await b.get()).status, 429);
    assert.equal((await c.get()).status, 200, 'another name: its own counter');
  } finally {
    await a.close();
    await b.close();
    await c.close();
  }
});

test("the address comes from RATELIMITD_ADDRESS when none is given (default ratelimitd's 127.0.0.1:50051)", async () => {
  await withEnv({ RATELIMITD_ADDRESS: undefined }, () => {
    const c = new RateLimitClient();
    assert.equal(c.address, '127.0.0.1:50051');
    c.close();
  });
  await withEnv({ RATELIMITD_ADDRESS: server.address }, async () => {
    const c = new RateLimitClient();
    assert.equal(c.address, server.address);
    c.close();
    // The middleware without `address` or `client`.
    await withApp({ type: 'fixed_window', limit: 1, windowMs: 10000, prefix: prefix('env') }, async (app, limiter) => {
      assert.equal(limiter.client.address, server.address);
      assert.equal((await app.get()).status, 200);
      assert.equal((await app.get()).status, 429);
    });
    // An explicit address wins.
    const d = new RateLimitClient({ address: '127.0.0.1:1' });
    assert.equal(d.address, '127.0.0.1:1');
    d.close();
  });
});

test('TLS settings from the environment are checked', async () => {
  await withEnv({ RATELIMITD_TLS: 'yes' }, () => {
    assert.throws(() => new RateLimitClient(), /RATELIMITD_TLS must be 1, true, 0 or false, got "yes"/);
  });
  await withEnv({ RATELIMITD_TLS_CERT: '/nonexistent/cert.pem' }, () => {
    assert.throws(() => new RateLimitClient(), /set both RATELIMITD_TLS_CERT and RATELIMITD_TLS_KEY/);
  });
  await withEnv({ RATELIMITD_TLS_CA: '/nonexistent/ca.pem' }, () => {
    assert.throws(() => new RateLimitClient(), /cannot read RATELIMITD_TLS_CA "\/nonexistent\/ca.pem"/);
  });
});

test('TLS from the environment: RATELIMITD_TLS_CA against a ratelimitd with --tls-cert', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ratelimitd-node-tls-'));
  const cert = path.join(dir, 'cert.pem');
  const key = path.join(dir, 'key.pem');
  try {
    try {
      execFileSync('openssl', [
        'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
        '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=localhost',
        '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
      ], { stdio: 'ignore' });
    } catch {
      t.skip('openssl is not available to make a certificate');
      return;
    }
    const tlsServer = await startRatelimitd({ args: ['--tls-cert', cert, '--tls-key', key], tlsCa: cert });
    try {
      await withEnv({ RATELIMITD_ADDRESS: `localhost:${tlsServer.port}`, RATELIMITD_TLS_CA: cert }, async () => {
        const c = new RateLimitClient({ deadlineMs: 2000 });
        try {
          const d = await c.check(uniqueKey('tls'), { type: 'fixed_window', limit: 1, windowMs: 1000 });
          assert.equal(d.allowed, true);
        } finally {
          c.close();
        }
      });
      // Plaintext to a TLS port fails: the environment did switch TLS on above.
      await withEnv({ RATELIMITD_ADDRESS: `localhost:${tlsServer.port}` }, async () => {
        const c = new RateLimitClient({ deadlineMs: 500 });
        try {
          await assert.rejects(c.check('k', { type: 'fixed_window', limit: 1, windowMs: 1000 }), { name: 'RateLimitError' });
        } finally {
          c.close();
        }
      });
    } finally {
      await tlsServer.stop();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
