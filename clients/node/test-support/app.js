'use strict';

// A real Express app on a loopback port, for the middleware tests.

const express = require('express');
const { once } = require('node:events');
const { rateLimiter } = require('..');

/**
 * Serves `GET /` behind `middleware` on 127.0.0.1, on a port of the system's
 * choosing: `{ ok: true }`, with the status of an `x-status` header if any,
 * and `req.rateLimit` as `rateLimit` if an `x-echo` header is sent.
 * Returns { url, get(path, headers), close() }.
 */
async function startApp(...middleware) {
  const app = express();
  app.get('/', ...middleware, (req, res) => {
    res.status(Number(req.get('x-status') ?? 200));
    res.json(req.get('x-echo') ? { ok: true, rateLimit: req.rateLimit } : { ok: true });
  });
  // Errors passed to next(err) come back as 500 with their message.
  app.use((err, req, res, _next) => res.status(500).json({ error: err.message }));
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    url,
    get: (path = '/', headers = {}) => fetch(url + path, { headers }),
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}

/** Starts an app behind one limiter made of `options`, runs fn(app, limiter), closes both. */
async function withApp(options, fn) {
  const limiter = rateLimiter(options);
  const app = await startApp(limiter);
  try {
    return await fn(app, limiter);
  } finally {
    await app.close();
    if (!options.client) limiter.client.close();
  }
}

/** A logger that keeps its warnings, for tests to read. */
function recorder() {
  const warnings = [];
  return { warnings, logger: { warn: (message) => warnings.push(message) } };
}

module.exports = { startApp, withApp, recorder };
