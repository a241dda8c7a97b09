'use strict';

// Starts a real redis-server of the test's own, on a free loopback port,
// with nothing saved to disk: for the tests that need ratelimitd on Redis
// rather than its embedded store. Never the machine's own Redis.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { once } = require('node:events');
const { freePort } = require('./ratelimitd');

/**
 * Starts redis-server and waits until it accepts connections.
 * Returns { url, port, stop() }. Fails, saying what to install, when
 * redis-server is not on the PATH.
 */
async function startRedis() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ratelimitd-node-redis-'));
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const child = spawn(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    const ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`redis-server did not start within 10 s:\n${output}`)), 10000);
      const look = (chunk) => {
        output += chunk;
        if (output.includes('Ready to accept connections')) {
          clearTimeout(timer);
          resolve();
        }
      };
      child.stdout.on('data', look);
      child.stderr.on('data', look);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new Error(`cannot run redis-server (${err.message}): install Redis (e.g. apt-get install redis-server)`));
      });
      child.on('exit', (code, signal) => {
        clearTimeout(timer);
        reject(Object.assign(new Error(`redis-server exited (${code ?? signal}) before serving:\n${output}`), { exited: true }));
      });
    });
    try {
      await ready;
    } catch (err) {
      child.kill('SIGKILL');
      // The port may have been taken between freePort() and the bind.
      if (err.exited && /Address already in use/.test(output) && attempt < 5) continue;
      fs.rmSync(dir, { recursive: true, force: true });
      throw err;
    }
    return {
      url: `redis://127.0.0.1:${port}/0`,
      port,
      stop: async () => {
        if (child.exitCode === null && child.signalCode === null) {
          const done = once(child, 'exit');
          child.kill('SIGKILL');
          await done;
        }
        fs.rmSync(dir, { recursive: true, force: true });
      },
    };
  }
}

module.exports = { startRedis };
