#!/usr/bin/env bash
# What Redis spends inside ratelimitd's decision script, beside the least a
# script doing the same work can spend. redis-benchmark calls EVALSHA on a
# private redis-server with batches of 9 CheckLimit calls (fixed window,
# anchored, limit 1000 per second, keys drawn from 10 000), as ratelimitd's
# batches are at 50 in flight; no ratelimitd runs. In alternating rounds:
#
#   ratelimitd   its batch script (ratelimitd-bench --print-batch-script)
#   same-work    a script of a few lines with the same commands (TIME once;
#                PTTL, then GET and INCRBY, or SET ... PX, per call) and a
#                reply of the same shape (one flat list, three integers per
#                call)
#   list-of-five same-work replying as ratelimitd's script used to: a list
#                per call, five integers in each
#   one-integer  same-work replying one integer per call
#   empty        a loop over the keys that calls nothing: EVALSHA's own cost
#   baseline     with BASELINE=<file>, that batch script (another build's
#                `ratelimitd-bench --print-batch-script`), laid out the same
#
# For each: µs per EVALSHA inside Redis (INFO commandstats) and per
# decision, and Redis's whole CPU per decision (from /proc/<pid>/stat,
# parsing and replies included), with the commands' own µs per call.
#
#   benches/script_floor.sh
#   ROUNDS=5 REQUESTS=300000 BASELINE=/tmp/before.lua benches/script_floor.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-100000}
CLIENTS=${CLIENTS:-20}
CALLS=9

cargo build --release --features bench --bin ratelimitd-bench --quiet
# shellcheck source=benches/common.sh
source benches/common.sh
need redis-benchmark "apt-get install redis-tools"

target/release/ratelimitd-bench --print-batch-script > "$WORK/ratelimitd.lua"
SCRIPTS=(ratelimitd same-work list-of-five one-integer empty)
DECIDING=(ratelimitd same-work list-of-five one-integer)
if [ -n "${BASELINE:-}" ]; then
    cp "$BASELINE" "$WORK/baseline.lua"
    SCRIPTS=(baseline "${SCRIPTS[@]}")
    DECIDING=(baseline "${DECIDING[@]}")
fi

# The same commands as ratelimitd's script for this batch; $1 writes call
# j's reply into `replies`.
same_work() {
    cat <<EOF
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit, window, cost = tonumber(ARGV[15]), ARGV[16], ARGV[18]
local replies = {}
for j = 1, #KEYS do
  local key = KEYS[j]
  local ttl = redis.call('PTTL', key)
  local used, reset_after = 0, tonumber(window) * 1000
  if ttl >= 0 then
    used, reset_after = tonumber(redis.call('GET', key)) or 0, ttl * 1000
    redis.call('INCRBY', key, cost)
  else
    redis.call('SET', key, cost, 'PX', window)
  end
  $1
end
return replies
EOF
}
same_work "local at = 3 * (j - 1)
  replies[at + 1], replies[at + 2], replies[at + 3] = limit - used - 1, reset_after, 0" \
    > "$WORK/same-work.lua"
same_work "replies[j] = limit - used - 1" > "$WORK/one-integer.lua"
same_work "replies[j] = { 1, limit - used - 1, reset_after, 0, 0 }" > "$WORK/list-of-five.lua"
cat > "$WORK/empty.lua" <<'EOF'
local n = 0
for j = 1, #KEYS do
  n = n + 1
end
return n
EOF

start_redis
# The batch layout (batch.lua's header): 9 calls, one form of one key whose
# values are a fixed window (limit 1000, 1000 ms, anchored), cost 1, not in
# shadow mode, decided all or nothing.
keys=()
for _ in $(seq "$CALLS"); do keys+=("k__rand_int__"); done
args=("$CALLS" 1)
for _ in $(seq "$CALLS"); do args+=(1); done
args+=(1 7 fw 1000 1000 0 1 0 decide)

declare -A SHA
for script in "${SCRIPTS[@]}"; do
    SHA[$script]=$(redis-cli -p "$REDIS_PORT" -x script load < "$WORK/$script.lua")
done
# Every script answers the batch with integers only (a call that failed
# would answer its error's text), at least one per call.
for script in "${DECIDING[@]}"; do
    reply=$(redis-cli -p "$REDIS_PORT" evalsha "${SHA[$script]}" "$CALLS" "${keys[@]}" "${args[@]}")
    if [ "$(grep -c . <<< "$reply")" -lt "$CALLS" ] || grep -qv '^-\?[0-9]\+$' <<< "$reply"; then
        echo "$script did not answer $CALLS calls: $reply" >&2
        exit 1
    fi
done

print_machine
echo "redis: $(redis-server --version | awk '{ print $3 }'), $CALLS calls per EVALSHA," \
    "$REQUESTS EVALSHA per run, $CLIENTS clients"
echo
echo "| round | script | µs per EVALSHA | µs per decision | Redis CPU µs per decision | µs per call: PTTL / GET / INCRBY / SET |"
echo "|---|---|---:|---:|---:|---|"
for round in $(seq "$ROUNDS"); do
    for script in "${SCRIPTS[@]}"; do
        redis-cli -p "$REDIS_PORT" flushdb > /dev/null
        redis-cli -p "$REDIS_PORT" config resetstat > /dev/null
        before=$(cpu_seconds "$REDIS_PID")
        redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -n "$REQUESTS" -r 10000 -q \
            evalsha "${SHA[$script]}" "$CALLS" "${keys[@]}" "${args[@]}" > /dev/null 2>&1
        after=$(cpu_seconds "$REDIS_PID")
        redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
            awk -F'[:=,]' -v round="$round" -v script="$script" -v calls="$CALLS" \
                -v requests="$REQUESTS" -v cpu="$(echo "$after $before" | awk '{ print $1 - $2 }')" '
                /^cmdstat_evalsha:/ { per_call = $7 }
                /^cmdstat_(pttl|get|incrby|set):/ { us[$1] = $7 }
                END {
                    split("cmdstat_pttl cmdstat_get cmdstat_incrby cmdstat_set", names, " ")
                    parts = ""
                    for (i = 1; i <= 4; i++)
                        parts = parts (i > 1 ? " / " : "") (names[i] in us ? us[names[i]] : "-")
                    printf "| %s | %s | %.1f | %.2f | %.2f | %s |\n", round, script, per_call,
                        per_call / calls, cpu * 1e6 / (requests * calls), parts
                }'
    done
done
