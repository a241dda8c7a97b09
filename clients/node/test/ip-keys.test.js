'use strict';

// The default key, by the rule both clients follow: the table of
// clients/test-vectors/ip-keys.json (which the Python client's suite reads
// too) through ipKey, then the middleware's default key end to end against
// a real ratelimitd: an IPv4 client is one key whether the socket reports
// it as `127.0.0.1` or `::ffff:127.0.0.1`, and an IPv6 client is keyed by
// its /56.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { once } = require('node:events');
const { RateLimitClient, rateLimiter, ipKey } = require('..');
const { startRatelimitd } = require('../test-support/ratelimitd');
const { readVectors, assertReadmeStates } = require('../test-support/vectors');

const vectors = readVectors('ip-keys.json');

let server;
let client;

before(async () => {
  server = await startRatelimitd();
  client = new RateLimitClient({ address: server.address, deadlineMs: 2000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

test('the README states the rule of the shared table, word for word', () => {
  assertReadmeStates(vectors.rule);
});

for (const { case: name, address, ipv6_subnet: ipv6Subnet, key } of vectors.cases) {
  test(`ipKey: ${name}`, () => {
    const options = ipv6Subnet === undefined ? undefined : { ipv6Subnet };
    assert.equal(ipKey(address, options), key);
  });
}

test('ipKey: an invalid ipv6Subnet is an error naming the option', () => {
  for (const ipv6Subnet of vectors.invalid_ipv6_subnet) {
    assert.throws(() => ipKey('2001:db8::1', { ipv6Subnet }), /`ipv6Subnet` must be/, `ipv6Subnet: ${JSON.stringify(ipv6Subnet)}`);
    assert.throws(() => rateLimiter({ client, ipv6Subnet }), /rateLimiter: `ipv6Subnet` must be/);
  }
  // Node's spelling of "off" is false, as express-rate-limit's.
  assert.throws(() => ipKey('::1', { ipv6Subnet: null }), /`ipv6Subnet` must be/);
  assert.throws(() => rateLimiter({ client, ipv6Subnet: null }), /rateLimiter: `ipv6Subnet` must be/);
  assert.throws(() => ipKey('::1', { ipv6_subnet: 64 }), /unknown option `ipv6_subnet`/);
});

test('ipKey: what is not an IP address is left as it is', () => {
  assert.equal(ipKey(undefined), undefined);
  assert.equal(ipKey(null), null);
  assert.equal(ipKey(42), 42);
});

test('ipv6Subnet is the default key\'s option: not with keyGenerator or key', () => {
  for (const own of ['keyGenerator', 'key']) {
    assert.throws(
      () => rateLimiter({ client, ipv6Subnet: 64, [own]: (req) => req.ip }),
      /`ipv6Subnet` applies to the default key only/,
    );
  }
});

/**
 * An app behind `limiter` on `host`, answering `GET /` with the key the
 * limiter counted on; X-Forwarded-For is trusted from loopback, as behind a
 * local proxy. Returns { get(headers), close() } for the URL `url(port)`.
 */
async function serve(limiter, host, url) {
  const app = express();
  app.set('trust proxy', 'loopback');
  app.get('/', limiter, (req, res) => res.json({ key: req.rateLimit.key }));
  const listener = app.listen(0, host);
  await once(listener, 'listening');
  const base = url(listener.address().port);
  return {
    get: async (headers = {}) => {
      const res = await fetch(`${base}/`, { headers });
      return { status: res.status, key: res.status === 200 ? (await res.json()).key : null };
    },
    close: async () => {
      listener.closeAllConnections();
      listener.close();
      await once(listener, 'close');
    },
  };
}

/** Listens on `::` (IPv4 clients appear as `::ffff:a.b.c.d`), or null where the machine has no IPv6. */
async function dualStack(limiter) {
  try {
    return await serve(limiter, '::', (port) => `http://127.0.0.1:${port}`);
  } catch (err) {
    if (['EAFNOSUPPORT', 'EADDRNOTAVAIL'].includes(err.code)) return null;
    throw err;
  }
}

const limit = (prefix) => ({ client, type: 'fixed_window', limit: 2, windowMs: 60_000, prefix });

test('the default key: one IPv4 client is one counter, as 127.0.0.1 on an IPv4 socket and as ::ffff:127.0.0.1 on a dual-stack one', async (t) => {
  // Two apps with identical limiters (the same namespace), as two servers of one app.
  const prefix = `ip-keys:${process.pid}:dual-stack:`;
  const onIpv4 = await serve(rateLimiter(limit(prefix)), '127.0.0.1', (port) => `http://127.0.0.1:${port}`);
  const onBoth = await dualStack(rateLimiter(limit(prefix)));
  try {
    if (!onBoth) {
      t.skip('no IPv6 on this machine: no dual-stack socket to listen on');
      return;
    }
    const first = await onBoth.get();
    const second = await onIpv4.get();
    assert.equal(first.status, 200);
    assert.equal(second.status, 200);
    assert.equal(first.key, second.key);
    assert.ok(first.key.endsWith(':127.0.0.1'), first.key);
    // The two requests spent the one counter's limit of 2.
    assert.equal((await onBoth.get()).status, 429);
    assert.equal((await onIpv4.get()).status, 429);
  } finally {
    await onIpv4.close();
    await onBoth?.close();
  }
});

test('the default key: an IPv4-mapped address forwarded by a proxy is the IPv4 client', async () => {
  const app = await serve(rateLimiter(limit(`ip-keys:${process.pid}:mapped:`)), '127.0.0.1', (port) => `http://127.0.0.1:${port}`);
  try {
    const mapped = await app.get({ 'x-forwarded-for': '::FFFF:192.0.2.7' });
    const plain = await app.get({ 'x-forwarded-for': '192.0.2.7' });
    assert.equal(mapped.status, 200);
    assert.equal(plain.status, 200);
    assert.equal(mapped.key, plain.key);
    assert.equal((await app.get({ 'x-forwarded-for': '::ffff:c000:207' })).status, 429);
    // Another IPv4 client has its own counter: unmapped before any masking.
    assert.equal((await app.get({ 'x-forwarded-for': '::ffff:192.0.2.8' })).status, 200);
  } finally {
    await app.close();
  }
});

test('the default key: two IPv6 clients of one /56 share one counter; another /56 has its own', async () => {
  const app = await serve(rateLimiter(limit(`ip-keys:${process.pid}:ipv6:`)), '127.0.0.1', (port) => `http://127.0.0.1:${port}`);
  try {
    const one = await app.get({ 'x-forwarded-for': '2001:db8:abcd:1234::1' });
    const two = await app.get({ 'x-forwarded-for': '2001:DB8:ABCD:12FF:FFFF:FFFF:FFFF:FFFF' });
    assert.deepEqual([one.status, two.status], [200, 200]);
    assert.equal(one.key, two.key);
    assert.ok(one.key.endsWith(':2001:db8:abcd:1200::/56'), one.key);
    assert.equal((await app.get({ 'x-forwarded-for': '2001:db8:abcd:1200::9' })).status, 429);
    assert.equal((await app.get({ 'x-forwarded-for': '2001:db8:abcd:1300::1' })).status, 200);
  } finally {
    await app.close();
  }
});

test('the default key with ipv6Subnet: 64, and with false (each address its own, IPv4-mapped still unmapped)', async () => {
  const prefix = `ip-keys:${process.pid}:options:`;
  const by64 = await serve(rateLimiter({ ...limit(prefix), ipv6Subnet: 64 }), '127.0.0.1', (port) => `http://127.0.0.1:${port}`);
  const whole = await serve(rateLimiter({ ...limit(prefix), ipv6Subnet: false }), '127.0.0.1', (port) => `http://127.0.0.1:${port}`);
  try {
    assert.ok((await by64.get({ 'x-forwarded-for': '2001:db8:abcd:1234:5678::1' })).key.endsWith(':2001:db8:abcd:1234::/64'));
    assert.ok((await whole.get({ 'x-forwarded-for': '2001:DB8:0:0:0:0:0:1' })).key.endsWith(':2001:db8::1'));
    assert.ok((await whole.get({ 'x-forwarded-for': '::ffff:127.0.0.1' })).key.endsWith(':127.0.0.1'));
  } finally {
    await by64.close();
    await whole.close();
  }
});
