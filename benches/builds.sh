#!/usr/bin/env bash
# One or more builds of ratelimitd under the same CheckLimit (or, with
# TARGET=should-rate-limit, ShouldRateLimit) load, in alternating rounds
# A B A B ..., each on a private redis-server and on its
# embedded store: decisions/s, latency, and the CPU each process spent per
# decision (from /proc/<pid>/stat), with Redis's script calls per decision.
# Closed loop, 50 in flight, 2 connections, 10 000 uniform keys, fixed
# window, as benches/floor.sh.
#
# Each argument is a folder holding a `ratelimitd` binary (a copy of
# target/release/ratelimitd from the build to compare), optionally followed
# by `:` and extra ratelimitd flags; the load comes from this checkout's
# ratelimitd-bench.
#
#   cp target/release/ratelimitd /tmp/before/   # on the old commit
#   cargo build --release --bin ratelimitd && cp target/release/ratelimitd /tmp/after/
#   benches/builds.sh /tmp/before /tmp/after
#   ROUNDS=3 STORES=redis benches/builds.sh "/tmp/before:--redis-batch-calls 1" /tmp/after
#   COMMANDSTATS=1 ...   # also Redis's INFO commandstats after each run
#   TARGET=should-rate-limit ...  # Envoy's ShouldRateLimit instead, on the
#                                 # rules side_by_side.sh serves
#   BENCH_FLAGS="--window 60s" ...  # more ratelimitd-bench flags for the load
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10s}
WARM_UP=${WARM_UP:-2s}
STORES=${STORES:-redis embedded}
TARGET=${TARGET:-check-limit}
[ $# -ge 1 ] || { echo "usage: benches/builds.sh BUILD_DIR[:FLAGS]..." >&2; exit 2; }

cargo build --release --features bench --bin ratelimitd-bench --quiet
BENCH=target/release/ratelimitd-bench
# shellcheck source=benches/common.sh
source benches/common.sh

print_machine
echo "target: $TARGET"
target_flags=(--target "$TARGET")
read -r -a bench_flags <<< "${BENCH_FLAGS:-}"
target_flags+=("${bench_flags[@]}")
rules_flags=()
if [ "$TARGET" = should-rate-limit ]; then
    write_side_by_side_rules "$BENCH" "$WORK/rules"
    rules_flags=(--config "$WORK/rules")
fi
echo
echo "| round | build | store | decisions/s | p50 µs | p99 µs | script calls per decision | CPU µs per decision: bench / ratelimitd / redis |"
echo "|---|---|---|---:|---:|---:|---:|---|"
for round in $(seq 1 "$ROUNDS"); do
    for build in "$@"; do
        dir=${build%%:*}
        flags=()
        [ "$build" != "$dir" ] && read -r -a flags <<< "${build#*:}"
        for store in $STORES; do
            start_redis
            port=$(free_port)
            store_flags=()
            [ "$store" = redis ] && store_flags=(--redis-url "$REDIS_URL")
            "$dir/ratelimitd" --listen "127.0.0.1:$port" --http-listen "" \
                "${store_flags[@]}" "${rules_flags[@]}" "${flags[@]}" \
                > "$WORK/ratelimitd.log" 2>&1 &
            server=$!
            PIDS+=("$server")
            wait_port "$port"
            "$BENCH" "${target_flags[@]}" --address "http://127.0.0.1:$port" \
                --duration "$WARM_UP" --warm-up 0s \
                --key-prefix "w$round:" > /dev/null
            calls0=$(script_calls); s0=$(cpu_seconds "$server"); r0=$(cpu_seconds "$REDIS_PID")
            TIMEFORMAT='%U %S'
            bench_cpu=$( { time "$BENCH" "${target_flags[@]}" --address "http://127.0.0.1:$port" \
                --duration "$DURATION" --warm-up 0s --key-prefix "m$round:" \
                --json > "$WORK/report.json"; } 2>&1 )
            calls1=$(script_calls); s1=$(cpu_seconds "$server"); r1=$(cpu_seconds "$REDIS_PID")
            python3 - "$round" "$build" "$store" "$bench_cpu" "$s0" "$s1" "$r0" "$r1" \
                "$calls0" "$calls1" "$WORK/report.json" <<'EOF'
import json, sys
round_, build, store, bench_cpu, s0, s1, r0, r1, c0, c1, path = sys.argv[1:]
r = json.load(open(path))
n = r["decisions"]
bench = sum(float(x) for x in bench_cpu.split()) * 1e6 / n
own = (float(s1) - float(s0)) * 1e6 / n
redis = (float(r1) - float(r0)) * 1e6 / n
on_redis = store == "redis"
calls = f"{(int(c1) - int(c0)) / n:.3f}" if on_redis else "-"
redis_text = f"{redis:.1f}" if on_redis else "-"
l = r["latency_us"]
print(f"| {round_} | `{build}` | {store} | {r['decisions_per_second']:,.0f} | {l['p50']} | {l['p99']} "
      f"| {calls} | {bench:.1f} / {own:.1f} / {redis_text} |")
if r["errors"]:
    sys.exit(f"{r['errors']} errors: {r['error_kinds']}")
EOF
            if [ -n "${COMMANDSTATS:-}" ] && [ "$store" = redis ]; then
                redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | grep '^cmdstat_'
            fi
            kill "$server" "$REDIS_PID"
            wait "$server" "$REDIS_PID" 2>/dev/null || true
        done
    done
done
