'use strict';

// The tables both clients' suites read (clients/test-vectors/), and the
// check that this client's README states a table's rule word for word, as
// the Python client's does.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const VECTORS = path.join(__dirname, '..', '..', 'test-vectors');
const README = path.join(__dirname, '..', 'README.md');

/** The table `name` (e.g. `ip-keys.json`). */
function readVectors(name) {
  try {
    return JSON.parse(fs.readFileSync(path.join(VECTORS, name), 'utf8'));
  } catch (err) {
    throw new Error(`cannot read the shared test vectors (in a ratelimitd checkout): ${err.message}`);
  }
}

/** Fails unless the README holds `rule`, whitespace aside. */
function assertReadmeStates(rule) {
  const words = (text) => text.replace(/\s+/g, ' ');
  assert.ok(
    words(fs.readFileSync(README, 'utf8')).includes(words(rule)),
    `README.md must state, as the Python client's README does:\n${rule}`,
  );
}

module.exports = { readVectors, assertReadmeStates };
