'use strict';

// Starts a real ratelimitd process for the tests: the binary from
// $RATELIMITD_BIN, else the repository's target/debug/ratelimitd, on the
// embedded store, on a free loopback port.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { once } = require('node:events');
const { RateLimitClient } = require('..');

const DEFAULT_BIN = path.resolve(__dirname, '..', '..', '..', 'target', 'debug', 'ratelimitd');

function binary() {
  const bin = process.env.RATELIMITD_BIN || DEFAULT_BIN;
  if (!fs.existsSync(bin)) {
    throw new Error(
      `ratelimitd binary not found at ${bin}: run \`cargo build --bin ratelimitd\` in the repository root ` +
        '(or set RATELIMITD_BIN to the binary) before `npm test`',
    );
  }
  return bin;
}

/** A loopback port nothing listens on right now. */
async function freePort() {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

/** Resolves when `condition()` resolves truthy; polls every `intervalMs`. */
async function waitFor(condition, { timeoutMs = 5000, intervalMs = 20, what = 'condition' } = {}) {
  const end = Date.now() + timeoutMs;
  let lastError;
  for (;;) {
    try {
      const value = await condition();
      if (value) return value;
    } catch (err) {
      if (err.fatal) throw err;
      lastError = err;
    }
    if (Date.now() > end) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${lastError.message}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/**
 * Starts ratelimitd and waits until it answers CheckLimit.
 * Returns { address, port, process, logs(), stop(), kill() }.
 */
async function startRatelimitd({ port } = {}) {
  const bin = binary();
  port ??= await freePort();
  const address = `127.0.0.1:${port}`;
  // The server reads RATELIMITD_* settings from its environment: drop any
  // (a RATELIMITD_REDIS_URL would take it off the embedded store).
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('RATELIMITD_')));
  const child = spawn(bin, ['--listen', address, '--log-format', 'json'], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  let exited = null;
  child.on('exit', (code, signal) => (exited = { code, signal }));

  const probe = new RateLimitClient({ address, deadlineMs: 200 });
  try {
    await waitFor(
      async () => {
        if (exited) {
          throw Object.assign(new Error(`ratelimitd exited (${JSON.stringify(exited)}) before serving:\n${output}`), {
            fatal: true,
          });
        }
        // Cost 0 looks without spending and creates no state.
        await probe.check('__ratelimitd_test_probe__', { type: 'fixed', limit: 1, windowSize: 1, cost: 0 });
        return true;
      },
      { timeoutMs: 15000, intervalMs: 25, what: `ratelimitd to serve on ${address}` },
    );
  } catch (err) {
    child.kill('SIGKILL');
    throw new Error(`${err.message}\nratelimitd output:\n${output}`);
  } finally {
    probe.close();
  }

  async function stopWith(signal) {
    if (exited) return;
    const done = once(child, 'exit');
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
    await done;
    clearTimeout(timer);
  }

  return {
    address,
    port,
    process: child,
    logs: () => output,
    /** SIGTERM (SIGKILL after 3 s), resolves when it has exited. */
    stop: () => stopWith('SIGTERM'),
    /** SIGKILL: the service disappears at once. */
    kill: () => stopWith('SIGKILL'),
  };
}

module.exports = { startRatelimitd, freePort, waitFor, binary };
