'use strict';

// Starts a real ratelimitd process for the tests: the binary from
// $RATELIMITD_BIN, else the repository's target/debug/ratelimitd, on the
// embedded store, on a free loopback port; optionally with a --config
// directory of files (a policies file), polled every 50 ms.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { once } = require('node:events');
const grpc = require('@grpc/grpc-js');
const { RateLimitClient } = require('..');

const DEFAULT_BIN = path.resolve(__dirname, '..', '..', '..', 'target', 'debug', 'ratelimitd');

// The clients read ratelimitd's address, TLS and leases from the environment
// when not given them: the caller's must not reach the tests (those that
// test the environment set it themselves).
for (const name of ['RATELIMITD_ADDRESS', 'RATELIMITD_TLS', 'RATELIMITD_TLS_CA', 'RATELIMITD_TLS_CERT', 'RATELIMITD_TLS_KEY', 'RATELIMITD_LEASES']) {
  delete process.env[name];
}

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
 * `config`: files for a --config directory, name → text (e.g.
 * `{ 'policies.yaml': 'policies: ...' }`), made in a temporary directory
 * (removed when the server stops) that ratelimitd polls every 50 ms;
 * `writeConfig(name, text)` changes one of them (hot reload). `args`: more
 * flags. `tlsCa`: a PEM file, for a server started with --tls-cert: the
 * readiness probe then speaks TLS to localhost:port. `host`: the loopback
 * address to listen on (127.0.0.1).
 * Returns { address, port, process, configDir, writeConfig(), logs(), stop(), kill() }.
 */
async function startRatelimitd({ port, host = '127.0.0.1', config, args = [], tlsCa } = {}) {
  const bin = binary();
  port ??= await freePort();
  const address = `${host}:${port}`;
  // The server reads RATELIMITD_* settings from its environment: drop any
  // (a RATELIMITD_REDIS_URL would take it off the embedded store).
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('RATELIMITD_')));
  let configDir = null;
  const flags = ['--listen', address, '--http-listen=', '--log-format', 'json'];
  if (config !== undefined) {
    configDir = fs.mkdtempSync(path.join(os.tmpdir(), 'ratelimitd-node-test-'));
    for (const [name, text] of Object.entries(config)) writeFile(configDir, name, text);
    flags.push('--config', configDir, '--config-poll-interval', '50ms');
  }
  const child = spawn(bin, [...flags, ...args], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  let exited = null;
  child.on('exit', (code, signal) => (exited = { code, signal }));

  const probe = new RateLimitClient(
    tlsCa === undefined
      ? { address, deadlineMs: 200 }
      : { address: `localhost:${port}`, deadlineMs: 200, credentials: grpc.credentials.createSsl(fs.readFileSync(tlsCa)) },
  );
  try {
    await waitFor(
      async () => {
        if (exited) {
          throw Object.assign(new Error(`ratelimitd exited (${JSON.stringify(exited)}) before serving:\n${output}`), {
            fatal: true,
          });
        }
        // Cost 0 looks without spending and creates no state.
        await probe.check('__ratelimitd_test_probe__', { type: 'fixed_window', limit: 1, windowMs: 1, cost: 0 });
        return true;
      },
      { timeoutMs: 15000, intervalMs: 25, what: `ratelimitd to serve on ${address}` },
    );
  } catch (err) {
    child.kill('SIGKILL');
    removeConfig();
    throw new Error(`${err.message}\nratelimitd output:\n${output}`);
  } finally {
    probe.close();
  }

  function removeConfig() {
    if (configDir) fs.rmSync(configDir, { recursive: true, force: true });
  }

  async function stopWith(signal) {
    if (!exited) {
      const done = once(child, 'exit');
      child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
      await done;
      clearTimeout(timer);
    }
    removeConfig();
  }

  return {
    address,
    port,
    process: child,
    configDir,
    /** Replaces (or adds) one file of the --config directory. */
    writeConfig: (name, text) => {
      if (!configDir) throw new Error('ratelimitd was started without `config`');
      writeFile(configDir, name, text);
    },
    logs: () => output,
    /** SIGTERM (SIGKILL after 3 s), resolves when it has exited. */
    stop: () => stopWith('SIGTERM'),
    /** SIGKILL: the service disappears at once. */
    kill: () => stopWith('SIGKILL'),
  };
}

// Whole or not at all: written beside, then renamed, so that ratelimitd's
// poll never reads half a file.
function writeFile(dir, name, text) {
  const temporary = path.join(dir, `.${name}.tmp`);
  fs.writeFileSync(temporary, text);
  fs.renameSync(temporary, path.join(dir, name));
}

module.exports = { startRatelimitd, freePort, waitFor, binary };
