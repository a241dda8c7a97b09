#!/usr/bin/env bash
# Batches of script calls, on and off, with one build: the same CheckLimit
# load (closed loop, 50 in flight, 2 connections, 10 000 uniform keys, fixed
# window) against ratelimitd with --redis-batch-calls 1 (every decision a
# script call of its own) and 64 (the default), in alternating rounds, on a
# standalone Redis and on a 3-primary Redis Cluster. Prints throughput,
# latency, script calls per decision (cmdstat_evalsha) and the CPU per
# decision of ratelimitd and of Redis (every node's, summed).
#
#   benches/batching.sh                        # 2 rounds of 10 s each
#   ROUNDS=3 TOPOLOGIES=cluster benches/batching.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10s}
WARM_UP=${WARM_UP:-2s}
CONCURRENCY=${CONCURRENCY:-50}
CONNECTIONS=${CONNECTIONS:-2}
TOPOLOGIES=${TOPOLOGIES:-standalone cluster}

cargo build --release --features bench --bins --quiet
BIN=target/release
# shellcheck source=benches/common.sh
source benches/common.sh

# CPU seconds of every Redis server in REDIS_PIDS_NOW, together.
redis_cpu() {
    local pid
    for pid in "${REDIS_PIDS_NOW[@]}"; do cpu_seconds "$pid"; echo; done |
        awk '{ total += $1 } END { printf "%.3f", total }'
}

print_machine
echo
echo "| topology | round | --redis-batch-calls | decisions/s | p50 µs | p99 µs | evalsha per decision | CPU µs per decision: ratelimitd / Redis |"
echo "|---|---|---:|---:|---:|---:|---:|---|"
for topology in $TOPOLOGIES; do
    if [ "$topology" = cluster ]; then
        start_redis_cluster
        REDIS_PORTS_NOW=("${CLUSTER_PORTS[@]}")
        REDIS_PIDS_NOW=("${CLUSTER_PIDS[@]}")
        store=(--redis-mode cluster --redis-url "$CLUSTER_URLS")
    else
        start_redis
        REDIS_PORTS_NOW=("$REDIS_PORT")
        REDIS_PIDS_NOW=("$REDIS_PID")
        store=(--redis-url "$REDIS_URL")
    fi
    for round in $(seq 1 "$ROUNDS"); do
        for calls in 1 64; do
            port=$(free_port)
            "$BIN/ratelimitd" --listen "127.0.0.1:$port" "${store[@]}" \
                --redis-batch-calls "$calls" > "$WORK/ratelimitd.log" 2>&1 &
            pid=$!
            PIDS+=("$pid")
            wait_port "$port"
            s0=$(cpu_seconds "$pid"); r0=$(redis_cpu); c0=$(script_calls "${REDIS_PORTS_NOW[@]}")
            "$BIN/ratelimitd-bench" --address "http://127.0.0.1:$port" \
                --duration "$DURATION" --warm-up "$WARM_UP" --concurrency "$CONCURRENCY" \
                --connections "$CONNECTIONS" --key-prefix "$topology$round-$calls:" \
                --json > "$WORK/report.json"
            s1=$(cpu_seconds "$pid"); r1=$(redis_cpu); c1=$(script_calls "${REDIS_PORTS_NOW[@]}")
            kill "$pid"; wait "$pid" 2>/dev/null || true
            python3 - "$topology" "$round" "$calls" "$s0" "$s1" "$r0" "$r1" "$c0" "$c1" \
                "$WORK/report.json" <<'PY'
import json, sys
topology, round_, calls, s0, s1, r0, r1, c0, c1, path = sys.argv[1:]
r = json.load(open(path))
# Counted over the whole run, warm-up included: per decision sent in it.
sent = r["decisions"] + r["decisions_per_second"] * r["warm_up_seconds"]
own = (float(s1) - float(s0)) * 1e6 / sent
redis = (float(r1) - float(r0)) * 1e6 / sent
evalsha = (int(c1) - int(c0)) / sent
l = r["latency_us"]
print(f"| {topology} | {round_} | {calls} | {r['decisions_per_second']:,.0f} | {l['p50']} "
      f"| {l['p99']} | {evalsha:.3f} | {own:.1f} / {redis:.1f} |")
if r["errors"]:
    sys.exit(f"{r['errors']} errors: {r['error_kinds']}")
PY
        done
    done
done
