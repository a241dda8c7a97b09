#!/usr/bin/env bash
# Leases from the application's side: one Node and one Python client (its
# Client, then its AsyncClient) deciding one hot policy, with leases (the
# default) and without (every decision a CheckLimit call), against
# ratelimitd on a private redis-server. For each: decisions per second and
# the client's CPU time per decision, closed loop; then, paced at 1000
# decisions a second for PACED_SECONDS, the calls ratelimitd served (the
# lease stream's asks and the CheckLimit calls) and the script calls Redis
# served, each per 1000 admitted.
#
#   benches/leases.sh
#   RATELIMITD_BIN=target/debug/ratelimitd DECISIONS=20000 benches/leases.sh
#
# Needs node (the Node client's dependencies installed: `npm ci` in
# clients/node) and a Python with the client installed (PYTHON, default
# clients/python/.venv/bin/python, which clients/python/ci.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."

DECISIONS=${DECISIONS:-100000}
CALL_DECISIONS=${CALL_DECISIONS:-5000}
PACED_SECONDS=${PACED_SECONDS:-10}
BIN=${RATELIMITD_BIN:-target/release/ratelimitd}
PYTHON=${PYTHON:-clients/python/.venv/bin/python}

# shellcheck source=benches/common.sh
source benches/common.sh
need redis-server "apt-get install redis-server"
need node "install Node.js 20 or newer"
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release --bin ratelimitd, or set RATELIMITD_BIN" >&2; exit 1; }
[ -d clients/node/node_modules ] || { echo "run npm ci in clients/node first" >&2; exit 1; }
"$PYTHON" -c 'import ratelimitd_client' 2>/dev/null ||
    { echo "$PYTHON has no ratelimitd_client: run clients/python/ci.sh, or set PYTHON" >&2; exit 1; }

start_redis
mkdir -p "$WORK/config"
# `open` never denies (what a decision costs); `hot` is a tenant's 2000 a
# second, leased by a client that wants 1000 of them.
cat > "$WORK/config/policies.yaml" <<'YAML'
policies:
  open:
    - {per: 1s, limit: 100000000, algorithm: token_bucket, lease: true}
  hot:
    - {per: 1s, limit: 2000, algorithm: token_bucket, lease: true}
YAML
PORT=$(free_port)
"$BIN" --listen "127.0.0.1:$PORT" --http-listen "127.0.0.1:$(free_port)" --config "$WORK/config" \
    --redis-url "$REDIS_URL" > "$WORK/ratelimitd.log" 2>&1 &
PIDS+=($!)
wait_port "$PORT"

print_machine
echo "ratelimitd: $BIN; decisions: $DECISIONS with leases, $CALL_DECISIONS without"
echo
echo "| client | decided by | decisions/s | client CPU per decision | ratelimitd calls per 1000 admitted (1000/s) | Redis script calls per 1000 admitted (1000/s) |"
echo "|---|---|---:|---:|---:|---:|"
run() { # client (node|python|python-async), leases (true|false), decisions, rate, policy
    local settings
    settings=$(printf '{"address": "127.0.0.1:%s", "policy": "%s", "decisions": %s, "rate": %s, "leases": %s, "asyncio": %s}' \
        "$PORT" "$5" "$3" "$4" "$2" "$([ "$1" = python-async ] && echo true || echo false)")
    case $1 in
        node) node benches/lease_client.js "$settings" ;;
        python | python-async) "$PYTHON" benches/lease_client.py "$settings" ;;
    esac
}
field() { python3 -c "import json, sys; print(round(json.load(sys.stdin)[\"$1\"], 1))"; }
per_1000() { python3 -c "print(round($1 * 1000 / max($allowed, 1), 1))"; } # of the paced run's admitted
for client in node python python-async; do
    for leases in true false; do
        decisions=$DECISIONS
        [ "$leases" = true ] || decisions=$CALL_DECISIONS
        closed=$(run "$client" "$leases" "$decisions" 0 open)
        before=$(script_calls)
        paced=$(run "$client" "$leases" $((PACED_SECONDS * 1000)) 1000 hot)
        calls=$(($(script_calls) - before))
        allowed=$(echo "$paced" | field allowed)
        served=$(echo "$paced" | field server_calls)
        label=$([ "$leases" = true ] && echo "a lease" || echo "CheckLimit")
        printf '| %s | %s | %s | %s µs | %s | %s |\n' "$client" "$label" \
            "$(echo "$closed" | field per_second)" "$(echo "$closed" | field cpu_us_per_decision)" \
            "$(per_1000 "$served")" "$(per_1000 "$calls")"
    done
done
