'use strict';

// The package stands alone: it loads its own copy of the .proto files, which
// must be the repository's, and `npm pack` ships only what runs.
// (ci-install.sh installs the packed tarball into a fresh app.)

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const PACKAGE = path.join(__dirname, '..');
const REPOSITORY_PROTO = path.join(PACKAGE, '..', '..', 'proto');
const COPIES = ['ratelimitd/v1/ratelimit.proto', 'ratelimitd/v1/lease.proto', 'google/rpc/status.proto'];

test("the package's proto/ is a copy of the repository's proto/ (inside the checkout)", (t) => {
  if (!fs.existsSync(path.join(REPOSITORY_PROTO, COPIES[0]))) {
    t.skip('not inside a ratelimitd checkout');
    return;
  }
  for (const file of COPIES) {
    const copy = fs.readFileSync(path.join(PACKAGE, 'proto', file), 'utf8');
    const original = fs.readFileSync(path.join(REPOSITORY_PROTO, file), 'utf8');
    assert.ok(
      copy === original,
      `clients/node/proto/${file} differs from proto/${file}: copy it again ` +
        `(cp proto/${file} clients/node/proto/${file}) and review the client for the change`,
    );
  }
});

test('the client loads the .proto from inside the package, not from ../../proto', () => {
  const source = fs.readFileSync(path.join(PACKAGE, 'lib', 'client.js'), 'utf8');
  assert.match(source, /const PROTO_ROOT = path\.join\(__dirname, '\.\.', 'proto'\);/);
});

test('npm pack ships lib, index.js, index.d.ts, proto, README and package.json only', () => {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: PACKAGE, encoding: 'utf8' });
  const files = JSON.parse(out)[0].files.map((f) => f.path).sort();
  assert.deepEqual(files, [
    'README.md',
    'index.d.ts',
    'index.js',
    'lib/algorithms.js',
    'lib/client.js',
    'lib/ip-key.js',
    'lib/leases.js',
    'lib/middleware.js',
    'package.json',
    'proto/google/rpc/status.proto',
    'proto/ratelimitd/v1/lease.proto',
    'proto/ratelimitd/v1/ratelimit.proto',
  ]);
});

// The algorithm table is the server's: its `type`s are exactly the fields of
// the proto's `oneof algorithm` (which the server's own tests check against
// its algorithm registry), in the same order, and each sets its own field.
test("the algorithm table names exactly the proto's algorithms", () => {
  const { ALGORITHMS, TYPES } = require('../lib/algorithms');
  const proto = fs.readFileSync(path.join(PACKAGE, 'proto', 'ratelimitd', 'v1', 'ratelimit.proto'), 'utf8');
  for (const message of ['CheckLimitRequest', 'Limit']) {
    const start = proto.indexOf(`message ${message} {`);
    assert.ok(start >= 0, `the proto has no message ${message}`);
    const oneof = proto.indexOf('oneof algorithm {', start);
    assert.ok(oneof >= 0, `${message} has no oneof algorithm`);
    const body = proto.slice(oneof, proto.indexOf('}', oneof));
    const fields = [...body.matchAll(/^\s+\w+ (\w+) = \d+;/gm)].map((m) => m[1]);
    assert.deepEqual(TYPES, fields, `${message}'s oneof algorithm`);
  }
  for (const type of TYPES) assert.equal(ALGORITHMS[type].field, type);
});
