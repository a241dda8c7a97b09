#!/usr/bin/env bash
# Memory at many live keys, per algorithm: ratelimitd's resident set (RSS)
# and Redis's `used_memory` with KEYS keys live on Redis, and ratelimitd's
# RSS with as many on its embedded store. Each run starts a fresh
# ratelimitd (and a fresh private redis-server), reads both before, fills
# the store with `ratelimitd-bench --keys sequence` (each key once, through
# CheckLimits calls of 100 requests, with a window of a day: long enough
# that no key expires during the run, a token bucket's or GCRA's included,
# whose key lives until the spent unit is refilled, a day / 1000 later),
# reads both again, and prints a Markdown table.
#
#   benches/memory.sh                       # 1 M keys, every algorithm
#   KEYS=100000 ALGORITHMS=gcra STORES=memory benches/memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-1000000}
WINDOW=${WINDOW:-24h}
ALGORITHMS=${ALGORITHMS:-fixed-window sliding-window token-bucket gcra sliding-window-counter}
STORES=${STORES:-redis memory}

cargo build --release --features bench --bins --quiet
BIN=target/release
# shellcheck source=benches/common.sh
source benches/common.sh

# Resident set of process $1, in bytes.
rss_bytes() {
    awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$1/status"
}

# Redis's used_memory, in bytes.
used_memory() {
    redis-cli -p "$REDIS_PORT" info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p' | tr -d '\r'
}

mib() {
    awk -v bytes="$1" 'BEGIN { printf "%.1f", bytes / 1048576 }'
}

per_key() {
    awk -v bytes="$1" -v keys="$KEYS" 'BEGIN { printf "%.0f", bytes / keys }'
}

echo "| algorithm | store | live keys | ratelimitd RSS before → after (MiB) | per key (B) | Redis used_memory before → after (MiB) | per key (B) |"
echo "|---|---|---:|---|---:|---|---:|"
for algorithm in $ALGORITHMS; do
    for store in $STORES; do
        port=$(free_port)
        flags=(--listen "127.0.0.1:$port" --log-format json --memory-max-bytes 8GiB
            --redis-command-timeout 10s
            --max-batch-size 1000)
        if [ "$store" = redis ]; then
            start_redis
            flags+=(--redis-url "$REDIS_URL")
        fi
        "$BIN/ratelimitd" "${flags[@]}" > "$WORK/ratelimitd.log" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        wait_port "$port"
        rss0=$(rss_bytes "$pid")
        redis0=0
        if [ "$store" = redis ]; then redis0=$(used_memory); fi
        "$BIN/ratelimitd-bench" --target check-limit --address "http://127.0.0.1:$port" \
            --algorithm "$algorithm" --limit 1000 --window "$WINDOW" --keys sequence \
            --key-count "$KEYS" --batch 100 --requests $((KEYS / 100)) --warm-up 0s \
            --concurrency 8 --json > "$WORK/fill.json"
        rss1=$(rss_bytes "$pid")
        read -r allowed errors < <(python3 -c 'import json, sys
report = json.load(open(sys.argv[1]))
print(report["allowed"], report["errors"])' "$WORK/fill.json")
        if [ "$errors" != 0 ] || [ "$allowed" != "$KEYS" ]; then
            echo "$algorithm on $store: $allowed of $KEYS requests allowed, $errors errors" >&2
            exit 1
        fi
        redis_cells="-"
        redis_per_key="-"
        if [ "$store" = redis ]; then
            redis1=$(used_memory)
            live=$(redis-cli -p "$REDIS_PORT" dbsize | tr -d '\r')
            redis_cells="$(mib "$redis0") → $(mib "$redis1")"
            redis_per_key=$(per_key $((redis1 - redis0)))
        else
            live=$allowed
        fi
        echo "| $algorithm | $store | $live | $(mib "$rss0") → $(mib "$rss1") | $(per_key $((rss1 - rss0))) | $redis_cells | $redis_per_key |"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        if [ "$store" = redis ]; then
            kill "$REDIS_PID"
            wait "$REDIS_PID" 2>/dev/null || true
        fi
    done
done
