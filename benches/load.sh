#!/usr/bin/env bash
# The published load numbers (docs/benchmarks.md), reproducibly: builds the
# release binaries, starts a throwaway redis-server and ratelimitd on free
# loopback ports, and drives each algorithm three ways at equal concurrency
# with ratelimitd-bench: the decision script straight on Redis (the
# baseline), CheckLimit, and ShouldRateLimit. Then the local over-limit
# cache: a flood on one denied key with the cache on and off, with Redis's
# script-call counts. Prints Markdown tables.
#
#   benches/load.sh                  # 10 s per run, 50 in flight
#   DURATION=5s CONCURRENCY=100 ALGORITHMS=gcra benches/load.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
WARM_UP=${WARM_UP:-2s}
CONCURRENCY=${CONCURRENCY:-50}
CONNECTIONS=${CONNECTIONS:-2}
KEYS=${KEYS:-10000}
ALGORITHMS=${ALGORITHMS:-fixed-window sliding-window token-bucket gcra sliding-window-counter}

cargo build --release --features bench --bins --quiet
BIN=target/release
# shellcheck source=benches/common.sh
source benches/common.sh

start_redis

# ratelimitd on Redis with one Envoy domain per algorithm; $1: extra flags.
start_ratelimitd() {
    local port rules="$WORK/rules"
    mkdir -p "$rules"
    for algorithm in $ALGORITHMS; do
        "$BIN/ratelimitd-bench" --print-envoy-config --algorithm "$algorithm" \
            --domain "bench-$algorithm" > "$rules/$algorithm.yaml"
    done
    "$BIN/ratelimitd-bench" --print-envoy-config --domain flood --limit 10 --window 1h \
        > "$rules/flood.yaml"
    port=$(free_port)
    # shellcheck disable=SC2086
    "$BIN/ratelimitd" --listen "127.0.0.1:$port" --redis-url "$REDIS_URL" \
        --config "$rules" --log-format json $1 > "$WORK/ratelimitd.log" 2>&1 &
    RATELIMITD_PID=$!
    PIDS+=("$RATELIMITD_PID")
    ADDRESS="http://127.0.0.1:$port"
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 &&
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do sleep 0.1; done
}

stop_ratelimitd() {
    kill "$RATELIMITD_PID"
    wait "$RATELIMITD_PID" 2>/dev/null || true
}


# One run, with the CPU each process spent on it; prints
# "bench_cpu ratelimitd_cpu redis_cpu<TAB>json report".
measured_run() {
    local rl0 rd0 rl1 rd1 report bench_cpu TIMEFORMAT='%U %S'
    rl0=$(cpu_seconds "$RATELIMITD_PID"); rd0=$(cpu_seconds "$REDIS_PID")
    { bench_cpu=$( { time run "$@" > "$WORK/report.json"; } 2>&1 ); }
    rl1=$(cpu_seconds "$RATELIMITD_PID"); rd1=$(cpu_seconds "$REDIS_PID")
    report=$(cat "$WORK/report.json")
    printf '%s %s %s\t%s\n' \
        "$(echo "$bench_cpu" | awk '{ print $1 + $2 }')" \
        "$(echo "$rl1 $rl0" | awk '{ print $1 - $2 }')" \
        "$(echo "$rd1 $rd0" | awk '{ print $1 - $2 }')" "$report"
}

# One run; prints its JSON report.
run() {
    "$BIN/ratelimitd-bench" --redis-url "$REDIS_URL" --address "$ADDRESS" \
        --duration "$DURATION" --warm-up "${RUN_WARM_UP:-$WARM_UP}" --concurrency "$CONCURRENCY" \
        --connections "$CONNECTIONS" --json "$@"
}

# Reads "algorithm<TAB>target<TAB>cpu<TAB>json" lines; prints table rows.
# CPU is per decision over the whole run, warm-up included, so it is
# divided by the requests of warm-up and measurement together (estimated
# from the measured rate).
rows() {
    python3 -c '
import json, sys
baseline = {}
for line in sys.stdin:
    algorithm, target, cpu, report = line.rstrip("\n").split("\t", 3)
    r = json.loads(report)
    rate = r["throughput_per_second"]
    if target == "redis-direct":
        baseline[algorithm] = rate
    ratio = rate / baseline[algorithm] if baseline.get(algorithm) else 0
    l = r["latency_us"]
    p50, p99, p999, errors = l["p50"], l["p99"], l["p99_9"], r["errors"]
    sent = rate * (r["measured_seconds"] + r["warm_up_seconds"])
    bench, server, redis = (float(x) * 1e6 / max(sent, 1) for x in cpu.split())
    server = "-" if target == "redis-direct" else f"{server:.0f}"
    print(f"| {algorithm} | {target} | {rate:,.0f} | {ratio:.0%} | {p50} | {p99} | {p999} | {errors} | {bench:.0f} / {server} / {redis:.0f} |")
'
}

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(redis-server --version | cut -d' ' -f3)"
echo "load: closed loop, $CONCURRENCY in flight, $CONNECTIONS connections, uniform over $KEYS keys, limit 1000/s, ${DURATION} after ${WARM_UP} warm-up"
echo
echo "| algorithm | target | decisions/s | of redis-direct | p50 µs | p99 µs | p99.9 µs | errors | CPU µs per decision: bench / ratelimitd / redis |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
start_ratelimitd ""
for algorithm in $ALGORITHMS; do
    for target in redis-direct check-limit should-rate-limit; do
        result=$(measured_run --target "$target" --algorithm "$algorithm" \
            --domain "bench-$algorithm" --keys uniform --key-count "$KEYS" \
            --key-prefix "$algorithm-$target:")
        printf '%s\t%s\t%s\n' "$algorithm" "$target" "$result"
    done
done | rows
stop_ratelimitd

echo
echo "Flood on one key over its limit (fixed window, 10 an hour), CheckLimit and ShouldRateLimit:"
echo
echo "| target | local cache | decisions/s | p99 µs | Redis script calls | calls per decision | CPU µs per decision: bench / ratelimitd / redis |"
echo "|---|---|---:|---:|---:|---:|---|"
for cache in on off; do
    flags=""
    [ "$cache" = off ] && flags="--local-cache-size 0"
    start_ratelimitd "$flags"
    for target in check-limit should-rate-limit; do
        # No warm-up: every request sent is measured, so the script calls
        # divide by the decisions they served.
        before=$(script_calls)
        result=$(RUN_WARM_UP=0s measured_run --target "$target" --algorithm fixed-window \
            --domain flood --limit 10 --window 1h --keys hot --key-prefix "flood-$cache-$target:")
        after=$(script_calls)
        printf '%s\t%s\t%s\t%s\n' "$target" "$cache" "$((after - before))" "$result"
    done | python3 -c '
import json, sys
for line in sys.stdin:
    target, cache, calls, cpu, report = line.rstrip("\n").split("\t", 4)
    r = json.loads(report)
    total, rate, p99 = r["requests"], r["throughput_per_second"], r["latency_us"]["p99"]
    bench, server, redis = (float(x) * 1e6 / max(total, 1) for x in cpu.split())
    print(f"| {target} | {cache} | {rate:,.0f} | {p99} | {int(calls):,} | {int(calls) / max(total, 1):.4f} | {bench:.0f} / {server:.0f} / {redis:.1f} |")
'
    stop_ratelimitd
done
