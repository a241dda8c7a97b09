#!/usr/bin/env bash
# Instructions per decision, by component: a count that, unlike CPU time,
# does not move with the host or with what else runs on it. Each server
# runs under `valgrind --tool=callgrind`; the load generator (natively)
# sends a warm-up batch, callgrind's counts are zeroed, a measured batch of
# a fixed number of CheckLimit calls follows (closed loop, 50 in flight,
# 2 connections, 10 000 uniform keys, fixed window), and the counts are
# dumped. benches/callgrind_table.py sorts each function's own (self)
# instructions into components (the gRPC transport, prost, ratelimitd's
# decision path, its store and batch queue, deadpool, redis-rs, tokio, the
# allocator, libc, ...) and divides by the decisions. Servers:
#
#   echo        examples/echo_server.rs: tonic answering "allowed" at once
#   embedded    ratelimitd on its embedded store
#   echo-redis  the echo server after one Redis PING per request (redis-rs,
#               one multiplexed connection): the floor for one Redis round
#               trip per request
#   redis       ratelimitd on a private redis-server
#
# It also prints the allocator calls per decision (callgrind's exact call
# counts of malloc, calloc, realloc and free in the same window) and the
# functions of the redis server with the most own instructions per
# decision.
#
#   benches/callgrind.sh                            # 50 000 decisions each
#   DECISIONS=50000 SERVERS="embedded redis" benches/callgrind.sh
#   TARGET=should-rate-limit SERVERS="embedded redis" benches/callgrind.sh
#   THREADS=1 SERVERS="embedded redis" benches/callgrind.sh
#
# THREADS sets ratelimitd's worker threads (default 2, as the echo servers'
# runtimes have here); with 1 it runs tokio's current-thread scheduler.
#
# TARGET=should-rate-limit measures Envoy's ShouldRateLimit instead (one
# descriptor ("key", <key>) per request, the same keys, rules written by
# `ratelimitd-bench --print-envoy-config`, a fixed window of an hour
# aligned as upstream's): only ratelimitd's servers, since the echo
# server speaks CheckLimit alone.
#
# The warm-up sends each key once (`--keys sequence`), so every measured
# decision updates a key that exists; the window is an hour, so none
# starts a new window whatever valgrind's pace. ratelimitd's timers that
# would run more often the longer the run takes (the health probe, the
# embedded store's sweep, the quota instances' beat on Redis, HTTP/2
# keepalive) are set an hour apart, and every deadline is raised for
# valgrind's slowdown (about 50 times). One cost still follows the clock:
# h2's search of the HPACK table, which gains one `date` header a second;
# the table shows it on a row of its own and a total without it.
set -euo pipefail
cd "$(dirname "$0")/.."

DECISIONS=${DECISIONS:-50000}
KEYS=${KEYS:-10000}
CONCURRENCY=${CONCURRENCY:-50}
CONNECTIONS=${CONNECTIONS:-2}
TARGET=${TARGET:-check-limit}
case $TARGET in
    check-limit) SERVERS=${SERVERS:-echo embedded echo-redis redis} ;;
    should-rate-limit) SERVERS=${SERVERS:-embedded redis} ;;
    *) echo "TARGET is check-limit or should-rate-limit, not $TARGET" >&2; exit 2 ;;
esac
TOP=${TOP:-15}
THREADS=${THREADS:-2}
# Where the callgrind files are kept (default: a scratch folder removed at
# exit).
KEEP=${KEEP:-}

# shellcheck source=benches/common.sh
source benches/common.sh
need valgrind "apt-get install -y valgrind"
need callgrind_annotate "apt-get install -y valgrind"
need redis-server "apt-get install -y redis-server"

# Release code with line tables (Cargo.toml's profile bench-symbols): the
# crate of each function comes from its name and its file.
cargo build --profile bench-symbols --features bench --bins --example echo_server --quiet
BIN=target/bench-symbols
OUT=${KEEP:-$WORK/callgrind}
mkdir -p "$OUT"
start_redis

# Envoy's domain for ShouldRateLimit: a limit no run reaches, per hour.
RULES=()
if [ "$TARGET" = should-rate-limit ]; then
    mkdir -p "$OUT/rules"
    "$BIN/ratelimitd-bench" --print-envoy-config --domain bench --limit 1000000000 --window 1h \
        > "$OUT/rules/bench.yaml"
    RULES=(--config "$OUT/rules")
fi

# Two worker threads on both stores unless THREADS says otherwise, as the
# echo servers' runtimes have here: by default ratelimitd leaves a core to a
# Redis on the same host.
SLOW=("${RULES[@]}" --worker-threads "$THREADS"
    --redis-connect-timeout 30s --redis-command-timeout 30s --request-timeout 120s
    --health-interval 1h --memory-sweep-interval 1h --http2-keepalive-interval 0s
    --quota-instance-timeout 1h --quota-rebalance-interval 1h)

# Runs server $1 under callgrind, warms it up, measures DECISIONS calls and
# leaves its counts in $OUT/$1.out and its script calls in $OUT/$1.scripts.
measure() {
    local server=$1 port pid command
    port=$(free_port)
    case $server in
        echo) command=("$BIN/examples/echo_server" "127.0.0.1:$port") ;;
        echo-redis) command=("$BIN/examples/echo_server" "127.0.0.1:$port" "$REDIS_URL") ;;
        embedded) command=("$BIN/ratelimitd" --listen "127.0.0.1:$port" --http-listen "" "${SLOW[@]}") ;;
        redis) command=("$BIN/ratelimitd" --listen "127.0.0.1:$port" --http-listen "" "${SLOW[@]}"
            --redis-url "$REDIS_URL") ;;
        *) echo "unknown server $server" >&2; exit 1 ;;
    esac
    if [ "$TARGET" != check-limit ] && [[ $server == echo* ]]; then
        echo "the $server server speaks CheckLimit alone: SERVERS=\"embedded redis\" for $TARGET" >&2
        exit 2
    fi
    valgrind --tool=callgrind --callgrind-out-file="$OUT/$server.%p" \
        "${command[@]}" > "$OUT/$server.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port"
    local load=(--target "$TARGET" --address "http://127.0.0.1:$port" --warm-up 0s --concurrency "$CONCURRENCY"
        --connections "$CONNECTIONS" --key-count "$KEYS" --window 1h --timeout 120s
        --key-prefix "$server:" --json)
    "$BIN/ratelimitd-bench" "${load[@]}" --keys sequence --requests "$KEYS" > "$OUT/$server.warm-up.json"
    callgrind_control --zero "$pid" > /dev/null 2>&1
    local calls0 calls1
    calls0=$(script_calls "$REDIS_PORT")
    "$BIN/ratelimitd-bench" "${load[@]}" --keys uniform --requests "$DECISIONS" > "$OUT/$server.json"
    calls1=$(script_calls "$REDIS_PORT")
    callgrind_control --dump=measured "$pid" > /dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    # The dump of the measured batch is the first of the process's files.
    mv "$OUT/$server.$pid.1" "$OUT/$server.out"
    rm -f "$OUT/$server.$pid"
    python3 - "$OUT/$server.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if r["errors"]:
    sys.exit(f"{sys.argv[1]}: {r['errors']} errors: {r['error_kinds']}")
EOF
    echo $((calls1 - calls0)) > "$OUT/$server.scripts"
}

read -r -a servers <<< "$SERVERS"
for server in "${servers[@]}"; do
    measure "$server"
done

print_machine
echo "build: $(git rev-parse --short HEAD), profile bench-symbols; $DECISIONS $TARGET decisions per server"
echo
args=()
for server in "${servers[@]}"; do
    args+=("$server=$OUT/$server.out:$(cat "$OUT/$server.scripts")")
done
python3 benches/callgrind_table.py --decisions "$DECISIONS" --top "$TOP" "${args[@]}"
