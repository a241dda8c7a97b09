#!/usr/bin/env bash
# Installs ratelimitd-client as a new user would, following the README:
# `npm pack` here, then `npm install <tarball> express` in a fresh app outside
# the checkout, an app written as the README shows, against a real ratelimitd
# ($RATELIMITD_BIN, embedded store, a policies file, a free loopback port).
# Checks the basic scenario (5 requests per 10 s: five 200s, then 429 with
# Retry-After and the RateLimit headers) for every algorithm and a policy,
# then, with ratelimitd stopped, onServiceError 'allow' (200,
# RateLimit-Degraded, stats.failOpen) and 'deny' (503).
#
#   RATELIMITD_BIN=/path/to/ratelimitd bash clients/node/ci-install.sh
#
# Needs node >= 20 and npm (the npm registry for express and the package's
# dependencies). Exits non-zero with a message on the first failure; removes
# its processes and temporary directories either way.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

say() { echo "ci-install: $*"; }
fail() {
  echo "ci-install: FAILED: $*" >&2
  exit 1
}

[[ -n "${RATELIMITD_BIN:-}" ]] || fail "set RATELIMITD_BIN to the ratelimitd binary (e.g. target/debug/ratelimitd)"
[[ -x "$RATELIMITD_BIN" ]] || fail "RATELIMITD_BIN=$RATELIMITD_BIN is not an executable file"
command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"

work="$(mktemp -d "${TMPDIR:-/tmp}/ratelimitd-node-install.XXXXXX")"
server_pid=""
app_pid=""
# The logs worth showing if this phase fails.
logs=("$work/npm.log")

stop_pid() {
  local pid="$1"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
cleanup() {
  local status=$?
  stop_pid "$app_pid"
  stop_pid "$server_pid"
  if [[ $status -ne 0 ]]; then
    for log in "${logs[@]}"; do
      if [[ -s "$log" ]]; then
        echo "---- ${log##*/} (last 40 lines) ----" >&2
        tail -n 40 "$log" >&2
      fi
    done
  fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. pack, and install into a fresh app as the README says ----
say "npm pack in $here"
mkdir "$work/pack"
(cd "$here" && npm pack --silent --pack-destination "$work/pack" >"$work/npm.log" 2>&1) || fail "npm pack failed"
tarball="$(ls "$work/pack"/ratelimitd-client-*.tgz 2>/dev/null | head -n 1)"
[[ -n "$tarball" ]] || fail "npm pack made no ratelimitd-client-*.tgz"
say "packed ${tarball##*/}"
listing="$(tar -tzf "$tarball")"
for f in package/index.js package/index.d.ts package/README.md package/lib/client.js package/lib/middleware.js \
  package/lib/leases.js package/proto/ratelimitd/v1/ratelimit.proto package/proto/ratelimitd/v1/lease.proto \
  package/proto/google/rpc/status.proto; do
  grep -qx "$f" <<<"$listing" || fail "the tarball lacks $f"
done
if grep -E '^package/(test|test-support|node_modules)/|ci-install\.sh' <<<"$listing"; then
  fail "the tarball ships files that do not run (above)"
fi
say "the tarball holds lib/, index.js, index.d.ts, proto/, README.md and nothing of the tests"

app="$work/app"
mkdir "$app"
cd "$app"
say "npm init -y && npm install ${tarball##*/} express, in $app"
npm init -y >"$work/npm.log" 2>&1 || fail "npm init failed"
npm install --no-audit --no-fund "$tarball" express >>"$work/npm.log" 2>&1 || fail "npm install of the tarball and express failed"
node -e "require('ratelimitd-client')" || fail "require('ratelimitd-client') failed in the fresh app"
say "require('ratelimitd-client') works in the fresh app"

# ---- 2. the app, as the README's quick start writes it ----
cat >app.js <<'EOF'
const express = require('express');
const { rateLimiter } = require('ratelimitd-client');

const app = express();
const ok = (req, res) => res.json({ ok: true });

// The basic scenario on every algorithm: 5 requests per 10 s per client.
// ratelimitd's address comes from RATELIMITD_ADDRESS.
app.get('/api/fixed_window', rateLimiter({ type: 'fixed_window', limit: 5, windowMs: 10_000 }), ok);
app.get('/api/sliding_window', rateLimiter({ type: 'sliding_window', limit: 5, windowMs: 10_000 }), ok);
app.get('/api/sliding_window_counter', rateLimiter({ type: 'sliding_window_counter', limit: 5, windowMs: 10_000 }), ok);
app.get('/api/gcra', rateLimiter({ type: 'gcra', limit: 5, windowMs: 10_000 }), ok);
app.get('/api/token_bucket', rateLimiter({ type: 'token_bucket', capacity: 5, refillRate: 0.5 }), ok);
// The short name and option of a single-node Redis middleware, kept as aliases. The same limit as
// /api/fixed_window: without its own `name` it would share that counter.
app.get('/api/fixed', rateLimiter({ name: 'short', type: 'fixed', limit: 5, windowSize: 10_000 }), ok);
// The operator's policy (policies.yaml in ratelimitd's --config directory).
app.get('/api/policy', rateLimiter({ policy: 'five-per-10s', key: (req) => req.ip }), ok);

// When ratelimitd is down: let requests through, visibly, or refuse them.
const allowing = rateLimiter({ name: 'allowing', type: 'fixed_window', limit: 5, windowMs: 10_000, onServiceError: 'allow' });
const denying = rateLimiter({ name: 'denying', type: 'fixed_window', limit: 5, windowMs: 10_000, onServiceError: 'deny' });
app.get('/allow', allowing, ok);
app.get('/deny', denying, ok);
app.get('/stats', (req, res) => res.json({ allowing: allowing.stats, denying: denying.stats }));

const server = app.listen(Number(process.env.PORT ?? 3000), '127.0.0.1', (err) => {
  if (err) throw err;
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
EOF

cat >check.js <<'EOF'
// node check.js <base url> <scenario|outage>: the HTTP checks, printed as made.
const [base, what] = process.argv.slice(2);
const say = (m) => console.log(`ci-install:   ${m}`);
function fail(m) {
  console.error(`ci-install: FAILED: ${m}`);
  process.exit(1);
}
const get = (path) => fetch(base + path);

async function scenario(path) {
  for (let i = 1; i <= 5; i++) {
    const res = await get(path);
    if (res.status !== 200) fail(`GET ${path} #${i}: expected 200, got ${res.status} ${await res.text()}`);
    if (!res.headers.get('ratelimit')) fail(`GET ${path} #${i}: no RateLimit header`);
  }
  const res = await get(path);
  const body = await res.text();
  if (res.status !== 429) fail(`GET ${path} #6: expected 429, got ${res.status} ${body}`);
  if (body !== '{"error":"Rate limit exceeded"}') fail(`GET ${path} #6: body ${body}`);
  const retryAfter = res.headers.get('retry-after');
  if (!/^[1-9][0-9]*$/.test(retryAfter ?? '') || Number(retryAfter) > 10) {
    fail(`GET ${path} #6: Retry-After should be 1 to 10 seconds, got ${retryAfter}`);
  }
  const policy = res.headers.get('ratelimit-policy');
  const state = res.headers.get('ratelimit');
  if (!/^"[^"]+";q=5(;w=10)?$/.test(policy ?? '')) fail(`GET ${path} #6: RateLimit-Policy ${policy}`);
  if (!/^"[^"]+";r=0;t=[0-9]+$/.test(state ?? '')) fail(`GET ${path} #6: RateLimit ${state}`);
  say(`GET ${path}: 5 x 200, then 429 with Retry-After: ${retryAfter}, RateLimit-Policy: ${policy}, RateLimit: ${state}`);
}

async function outage() {
  const before = await (await get('/stats')).json();
  let res = await get('/allow');
  if (res.status !== 200) fail(`GET /allow with ratelimitd stopped: expected 200, got ${res.status} ${await res.text()}`);
  const degraded = res.headers.get('ratelimit-degraded');
  if (degraded !== 'unavailable') fail(`GET /allow with ratelimitd stopped: RateLimit-Degraded should be "unavailable", got ${degraded}`);
  const after = await (await get('/stats')).json();
  if (after.allowing.failOpen !== before.allowing.failOpen + 1) {
    fail(`stats.failOpen should go from ${before.allowing.failOpen} to ${before.allowing.failOpen + 1}: ${JSON.stringify(after.allowing)}`);
  }
  say(`onServiceError 'allow': GET /allow 200 with RateLimit-Degraded: ${degraded}; stats ${JSON.stringify(after.allowing)}`);
  res = await get('/deny');
  const body = await res.text();
  if (res.status !== 503) fail(`GET /deny with ratelimitd stopped: expected 503, got ${res.status} ${body}`);
  const stats = (await (await get('/stats')).json()).denying;
  if (stats.failClosed !== 1) fail(`stats.failClosed should be 1: ${JSON.stringify(stats)}`);
  say(`onServiceError 'deny': GET /deny 503 ${body}; stats ${JSON.stringify(stats)}`);
}

(async () => {
  if (what === 'outage') await outage();
  else {
    for (const path of ['/api/fixed_window', '/api/sliding_window', '/api/sliding_window_counter', '/api/gcra', '/api/token_bucket', '/api/fixed', '/api/policy']) {
      await scenario(path);
    }
  }
})().catch((err) => fail(err.stack || String(err)));
EOF

# ---- 3. ratelimitd: embedded store, a policies file, a free loopback port ----
logs=("$work/ratelimitd.log" "$work/app.log")
mkdir "$work/config"
cat >"$work/config/policies.yaml" <<'EOF'
policies:
  five-per-10s:
    - {per: 10s, limit: 5}
EOF
# Without the caller's RATELIMITD_* settings (a RATELIMITD_REDIS_URL would
# take it off the embedded store).
unset_env=()
while IFS= read -r name; do unset_env+=(-u "$name"); done < <(compgen -e | grep '^RATELIMITD_' || true)
say "starting $RATELIMITD_BIN on 127.0.0.1:0 (embedded store, --config with policies.yaml)"
env ${unset_env[@]+"${unset_env[@]}"} "$RATELIMITD_BIN" --listen 127.0.0.1:0 --http-listen= --address-file "$work/address" \
  --config "$work/config" >"$work/ratelimitd.log" 2>&1 &
server_pid=$!
for _ in $(seq 150); do
  [[ -s "$work/address" ]] && break
  kill -0 "$server_pid" 2>/dev/null || fail "ratelimitd exited before serving"
  sleep 0.1
done
[[ -s "$work/address" ]] || fail "ratelimitd did not write its address within 15 s"
address="$(cat "$work/address")"
say "ratelimitd serves on $address"

env ${unset_env[@]+"${unset_env[@]}"} RATELIMITD_ADDRESS="$address" PORT=0 node app.js >"$work/app.log" 2>&1 &
app_pid=$!
port=""
for _ in $(seq 100); do
  port="$(sed -n 's|^listening on http://127\.0\.0\.1:\([0-9]*\)$|\1|p' "$work/app.log")"
  [[ -n "$port" ]] && break
  kill -0 "$app_pid" 2>/dev/null || fail "the app exited before listening"
  sleep 0.1
done
[[ -n "$port" ]] || fail "the app did not listen within 10 s"
say "the app serves on 127.0.0.1:$port (RATELIMITD_ADDRESS=$address)"

# ---- 4. the basic scenario, every algorithm and a policy ----
say "the basic scenario, 5 requests per 10 s, on every algorithm:"
node check.js "http://127.0.0.1:$port" scenario

# ---- 5. ratelimitd stopped: onServiceError ----
say "stopping ratelimitd"
stop_pid "$server_pid"
server_pid=""
say "with ratelimitd stopped:"
node check.js "http://127.0.0.1:$port" outage

say "OK"
