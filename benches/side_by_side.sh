#!/usr/bin/env bash
# ratelimitd and Limitador under identical load, in one run: both serve
# Envoy's ShouldRateLimit for the same limit (a fixed window of one minute
# per descriptor value, high enough that nothing is denied, so both count
# every request), on one private redis-server (or each on its own memory),
# driven in alternating rounds A B A B ... by the same clients:
#
#   - h2load (Debian nghttp2-client) replaying one ShouldRateLimit body:
#     one descriptor value, the hot-key case, CONNECTIONS x STREAMS; then
#     for half as long logging each request, for the p99;
#   - ratelimitd-bench --target should-rate-limit, closed loop, 50 in
#     flight over 2 connections, 10 000 uniform keys; then open loop at
#     50% and 90% of the closed loop's throughput, for p50/p99/p99.9.
#
# Prints one Markdown row per run and the ratio of medians with its
# spread (the lowest and highest ratio of a round's pair).
#
#   LIMITADOR_BIN=/path/to/limitador-server benches/side_by_side.sh
#   LIMITADOR_SRC=/path/to/limitador benches/side_by_side.sh  # builds it once
#   STORE=memory ROUNDS=5 DURATION=10s benches/side_by_side.sh
#   OURS_FLAGS="--worker-threads 1" benches/side_by_side.sh  # more ratelimitd flags
#
# LIMITADOR_SRC is a Kuadrant/limitador source tree; it is built with
# `cargo build --release -p limitador-server` into LIMITADOR_TARGET (default
# ~/.cache/ratelimitd-bench/limitador-target, outside this checkout) and
# reused by later runs. Its build needs protoc, clang and libclang
# (Debian: protobuf-compiler clang libclang-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
STORE=${STORE:-redis}
H2_CONNECTIONS=${H2_CONNECTIONS:-4}
H2_STREAMS=${H2_STREAMS:-16}
LIMITADOR_TARGET=${LIMITADOR_TARGET:-$HOME/.cache/ratelimitd-bench/limitador-target}

# shellcheck source=benches/common.sh
source benches/common.sh
need h2load "apt-get install nghttp2-client"
need redis-server "apt-get install redis-server"
need python3 "apt-get install python3"

if [ -z "${LIMITADOR_BIN:-}" ]; then
    if [ -z "${LIMITADOR_SRC:-}" ]; then
        echo "set LIMITADOR_BIN (a limitador-server binary) or LIMITADOR_SRC (its source tree)" >&2
        exit 1
    fi
    LIMITADOR_BIN=$LIMITADOR_TARGET/release/limitador-server
    if [ ! -x "$LIMITADOR_BIN" ]; then
        need protoc "apt-get install protobuf-compiler"
        need clang "apt-get install clang libclang-dev"
        echo "building limitador-server from $LIMITADOR_SRC into $LIMITADOR_TARGET (once)" >&2
        (cd "$LIMITADOR_SRC" && cargo build --release -p limitador-server \
            --target-dir "$LIMITADOR_TARGET")
    fi
fi

cargo build --release --features bench --bins --quiet
BIN=target/release

ours_args=()
theirs_store=(memory)
if [ "$STORE" = redis ]; then
    start_redis
    ours_args=(--redis-url "$REDIS_URL")
    theirs_store=(redis "redis://127.0.0.1:$REDIS_PORT")
fi

# The same limit twice: a descriptor ("key", <value>), a counter per value.
write_side_by_side_rules "$BIN/ratelimitd-bench" "$WORK/rules"
write_side_by_side_limitador_limits "$WORK/limitador.yaml"

OURS_PORT=$(free_port)
read -r -a ours_flags <<< "${OURS_FLAGS:-}"
"$BIN/ratelimitd" --listen "127.0.0.1:$OURS_PORT" --http-listen "" --config "$WORK/rules" \
    "${ours_args[@]}" "${ours_flags[@]}" > "$WORK/ratelimitd.log" 2>&1 &
PIDS+=($!)
THEIRS_PORT=$(free_port)
"$LIMITADOR_BIN" --rls-ip 127.0.0.1 --rls-port "$THEIRS_PORT" --http-ip 127.0.0.1 \
    --http-port "$(free_port)" "$WORK/limitador.yaml" "${theirs_store[@]}" \
    > "$WORK/limitador.log" 2>&1 &
PIDS+=($!)
wait_port "$OURS_PORT"
wait_port "$THEIRS_PORT"

write_should_rate_limit_body "$WORK/body.bin"

# ratelimitd-bench's JSON report -> "decisions/s p50 p99 p99.9"; a run
# with errors does not count.
cat > "$WORK/summary.py" <<'EOF'
import json, sys
r = json.load(sys.stdin)
if r["errors"]:
    sys.exit(f"{r['errors']} errors: {r['error_kinds']}")
l = r["latency_us"]
print(round(r["decisions_per_second"]), l["p50"], l["p99"], l["p99_9"])
EOF

seconds=${DURATION%s}
h2load_run() { # port, seconds, h2load flags... -> h2load's report
    local port=$1 duration=$2
    shift 2
    h2load_should_rate_limit "$port" "$WORK/body.bin" -D "$duration" "$@"
}
h2() { # port -> "requests/s p99" (µs)
    local rate
    rate=$(h2load_run "$1" "$seconds" | sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p')
    # The p99 from a second, shorter run that logs every request (start,
    # HTTP status, µs to the end of the response): writing that log costs
    # h2load CPU per request, on cores the server shares, so the rate is
    # taken without it.
    h2load_run "$1" "$(( (seconds + 1) / 2 ))" --log-file "$WORK/h2load.log" > /dev/null
    python3 -c '
import sys
times = sorted(int(line.split()[2]) for line in open(sys.argv[1]) if line.strip())
print(sys.argv[2], times[len(times) * 99 // 100])' "$WORK/h2load.log" "$rate"
}
bench() { # port [extra] -> "decisions/s p50 p99 p99.9" (µs)
    local port=$1
    shift
    "$BIN/ratelimitd-bench" --target should-rate-limit --address "http://127.0.0.1:$port" \
        --duration "$DURATION" --warm-up 2s --key-prefix "r$RANDOM:" "$@" --json |
        python3 "$WORK/summary.py"
}

print_machine
echo "ratelimitd flags: ${OURS_FLAGS:-(none)}"
echo
echo "| round | server | h2load req/s | h2load p99 µs | closed loop decisions/s | p50 / p99 / p99.9 µs | open 50% p99 µs | open 90% p99 µs |"
echo "|---|---|---:|---:|---:|---|---:|---:|"
declare -A H2 CLOSED
for round in $(seq 1 "$ROUNDS"); do
    for side in ratelimitd limitador; do
        port=$OURS_PORT
        [ "$side" = limitador ] && port=$THEIRS_PORT
        read -r h2_rate h2_p99 <<< "$(h2 "$port")"
        read -r closed p50 p99 p999 <<< "$(bench "$port")"
        read -r _ _ half_p99 _ <<< "$(bench "$port" --rate "$((closed / 2))")"
        read -r _ _ most_p99 _ <<< "$(bench "$port" --rate "$((closed * 9 / 10))")"
        H2[$side$round]=$h2_rate
        CLOSED[$side$round]=$closed
        echo "| $round | $side | $h2_rate | $h2_p99 | $closed | $p50 / $p99 / $p999 | $half_p99 | $most_p99 |"
    done
done

ratios() { # name of the array
    local -n values=$1
    for round in $(seq 1 "$ROUNDS"); do
        python3 -c "print(${values[ratelimitd$round]} / ${values[limitador$round]})"
    done | sort -n | python3 -c 'import sys; r=[float(x) for x in sys.stdin]; print(f"{sorted(r)[len(r)//2]:.2f}x (from {min(r):.2f}x to {max(r):.2f}x)")'
}
echo
echo "ratelimitd / Limitador, STORE=$STORE: h2load $(ratios H2), closed loop $(ratios CLOSED)"
