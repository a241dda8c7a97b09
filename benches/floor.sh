#!/usr/bin/env bash
# What ratelimitd costs above the floor: the same CheckLimit load (closed
# loop, 50 in flight, 2 connections, 10 000 uniform keys, fixed window)
# against three servers, in alternating rounds, with the CPU each process
# spent per decision (from /proc/<pid>/stat):
#
#   echo        examples/echo_server.rs: tonic answering "allowed" at once
#   embedded    ratelimitd on its embedded store
#   echo-redis  the echo server after one Redis PING per request (redis-rs,
#               one multiplexed connection)
#   redis       ratelimitd on a private redis-server
#
# The echo server is the floor for any tonic service under this client;
# embedded minus echo is ratelimitd's own work (validation, the limiter,
# metrics). echo-redis is the floor for one Redis round trip per request,
# and redis minus echo-redis what ratelimitd's Redis path adds to it.
#
#   benches/floor.sh                      # 3 rounds of 10 s
#   ROUNDS=5 DURATION=5s benches/floor.sh
#   OURS_FLAGS="--worker-threads 1" benches/floor.sh  # more ratelimitd flags
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARM_UP=${WARM_UP:-2s}
CONCURRENCY=${CONCURRENCY:-50}
CONNECTIONS=${CONNECTIONS:-2}

cargo build --release --features bench --bins --example echo_server --quiet
BIN=target/release
# shellcheck source=benches/common.sh
source benches/common.sh
start_redis

read -r -a ours_flags <<< "${OURS_FLAGS:-}"
declare -A PORT PID
PORT[echo]=$(free_port)
"$BIN/examples/echo_server" "127.0.0.1:${PORT[echo]}" 2> "$WORK/echo.log" &
PID[echo]=$!
PORT[echo-redis]=$(free_port)
"$BIN/examples/echo_server" "127.0.0.1:${PORT[echo-redis]}" "$REDIS_URL" \
    2> "$WORK/echo-redis.log" &
PID[echo-redis]=$!
PORT[embedded]=$(free_port)
"$BIN/ratelimitd" --listen "127.0.0.1:${PORT[embedded]}" --http-listen "" \
    "${ours_flags[@]}" > "$WORK/embedded.log" 2>&1 &
PID[embedded]=$!
PORT[redis]=$(free_port)
"$BIN/ratelimitd" --listen "127.0.0.1:${PORT[redis]}" --http-listen "" \
    --redis-url "$REDIS_URL" "${ours_flags[@]}" > "$WORK/redis-ratelimitd.log" 2>&1 &
PID[redis]=$!
SERVERS=(echo embedded echo-redis redis)
for server in "${SERVERS[@]}"; do PIDS+=("${PID[$server]}"); wait_port "${PORT[$server]}"; done

print_machine
echo "ratelimitd flags: ${OURS_FLAGS:-(none)}"
echo
echo "| round | server | decisions/s | p50 µs | p99 µs | CPU µs per decision: bench / server / redis |"
echo "|---|---|---:|---:|---:|---|"
for round in $(seq 1 "$ROUNDS"); do
    for server in "${SERVERS[@]}"; do
        s0=$(cpu_seconds "${PID[$server]}"); r0=$(cpu_seconds "$REDIS_PID")
        TIMEFORMAT='%U %S'
        bench_cpu=$( { time "$BIN/ratelimitd-bench" --address "http://127.0.0.1:${PORT[$server]}" \
            --duration "$DURATION" --warm-up "$WARM_UP" --concurrency "$CONCURRENCY" \
            --connections "$CONNECTIONS" --key-prefix "r$round:" --json > "$WORK/report.json"; } 2>&1 )
        s1=$(cpu_seconds "${PID[$server]}"); r1=$(cpu_seconds "$REDIS_PID")
        python3 - "$round" "$server" "$bench_cpu" "$s0" "$s1" "$r0" "$r1" "$WORK/report.json" <<'EOF'
import json, sys
round_, server, bench_cpu, s0, s1, r0, r1, path = sys.argv[1:]
r = json.load(open(path))
# CPU over the whole run, warm-up included: per decision sent in it.
sent = r["decisions"] + r["decisions_per_second"] * r["warm_up_seconds"]
bench = sum(float(x) for x in bench_cpu.split()) * 1e6 / sent
own = (float(s1) - float(s0)) * 1e6 / sent
redis = (float(r1) - float(r0)) * 1e6 / sent
redis_text = f"{redis:.1f}" if server in ("redis", "echo-redis") else "-"
l = r["latency_us"]
print(f"| {round_} | {server} | {r['decisions_per_second']:,.0f} | {l['p50']} | {l['p99']} "
      f"| {bench:.1f} / {own:.1f} / {redis_text} |")
if r["errors"]:
    sys.exit(f"{r['errors']} errors: {r['error_kinds']}")
EOF
    done
done
