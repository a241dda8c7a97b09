#!/usr/bin/env bash
# What a server does in the kernel per request, counted: system calls by
# kind, context switches, and user and system CPU per request, for the
# server and for its Redis, under h2load's ShouldRateLimit load (one hot
# descriptor, CONNECTIONS x STREAMS), a fixed number of requests. The
# counts come from the kernel's tracepoints (`perf stat -e
# raw_syscalls:sys_enter,...`, no hardware counters needed), so they do not
# drift with the machine's speed as CPU time does; they move only with how
# a server batches its work (how many responses one write carries).
#
#   benches/syscalls.sh                          # ratelimitd on Redis
#   STORE=memory benches/syscalls.sh             # on the embedded store
#   OURS_FLAGS="--worker-threads 2" benches/syscalls.sh
#   LIMITADOR_BIN=/path/to/limitador-server benches/syscalls.sh  # and Limitador
#   OURS_BIN=/tmp/before/ratelimitd benches/syscalls.sh  # another build
#   REQUESTS=300000 H2_CONNECTIONS=4 H2_STREAMS=16 benches/syscalls.sh
#
# perf (Debian: linux-perf) reads tracepoints only where it may read the
# kernel's tracefs: as root, as the measurements in docs/benchmarks.md were
# taken, or with CAP_PERFMON and tracefs opened to the user.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${REQUESTS:-300000}
STORE=${STORE:-redis}
H2_CONNECTIONS=${H2_CONNECTIONS:-4}
H2_STREAMS=${H2_STREAMS:-16}

# shellcheck source=benches/common.sh
source benches/common.sh
need h2load "apt-get install nghttp2-client"
need perf "apt-get install linux-perf"
need redis-server "apt-get install redis-server"
need python3 "apt-get install python3"

cargo build --release --features bench --bins --quiet
BIN=target/release
OURS_BIN=${OURS_BIN:-$BIN/ratelimitd}

if [ "$STORE" = redis ]; then
    start_redis
fi
write_should_rate_limit_body "$WORK/body.bin"

# Starts server $1 on a free port: sets PORT and SERVER_PID.
start_server() {
    PORT=$(free_port)
    if [ "$1" = ratelimitd ]; then
        local store=() flags
        [ "$STORE" = redis ] && store=(--redis-url "$REDIS_URL")
        read -r -a flags <<< "${OURS_FLAGS:-}"
        write_side_by_side_rules "$BIN/ratelimitd-bench" "$WORK/rules"
        "$OURS_BIN" --listen "127.0.0.1:$PORT" --http-listen "" --config "$WORK/rules" \
            "${store[@]}" "${flags[@]}" > "$WORK/ratelimitd.log" 2>&1 &
    else
        local store=(memory)
        [ "$STORE" = redis ] && store=(redis "redis://127.0.0.1:$REDIS_PORT")
        write_side_by_side_limitador_limits "$WORK/limitador.yaml"
        "$LIMITADOR_BIN" --rls-ip 127.0.0.1 --rls-port "$PORT" --http-ip 127.0.0.1 \
            --http-port "$(free_port)" "$WORK/limitador.yaml" "${store[@]}" \
            > "$WORK/limitador.log" 2>&1 &
    fi
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_port "$PORT"
}

h2() { # requests -> h2load's "finished" line
    h2load_should_rate_limit "$PORT" "$WORK/body.bin" -n "$1" | grep '^finished'
}

# User and system CPU ticks of process $1.
ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }

EVENTS=raw_syscalls:sys_enter,sched:sched_switch
for call in writev write sendto recvfrom read epoll_wait futex; do
    EVENTS+=",syscalls:sys_enter_$call"
done

print_machine
echo "store: $STORE, $REQUESTS requests, h2load $H2_CONNECTIONS connections x $H2_STREAMS streams, ratelimitd flags: ${OURS_FLAGS:-(none)}"
servers=(ratelimitd)
[ -n "${LIMITADOR_BIN:-}" ] && servers+=(limitador)
for server in "${servers[@]}"; do
    start_server "$server"
    h2 20000 > /dev/null # warm-up
    watched=("$server:$SERVER_PID")
    [ "$STORE" = redis ] && watched+=("redis:$REDIS_PID")
    perf_pids=()
    before=()
    for entry in "${watched[@]}"; do
        perf stat -x, -e "$EVENTS" -p "${entry#*:}" -o "$WORK/perf.${entry%%:*}" &
        perf_pids+=($!)
    done
    sleep 0.5 # perf attached
    for entry in "${watched[@]}"; do before+=("$(ticks "${entry#*:}")"); done
    echo
    echo "$server: $(h2 "$REQUESTS")"
    i=0
    for entry in "${watched[@]}"; do
        read -r user system <<< "${before[$i]}"
        read -r user_after system_after <<< "$(ticks "${entry#*:}")"
        i=$((i + 1))
        echo "  ${entry%%:*}: CPU µs per request: user $(python3 -c "print(round(($user_after - $user) * 1e6 / $(getconf CLK_TCK) / $REQUESTS, 1))"), system $(python3 -c "print(round(($system_after - $system) * 1e6 / $(getconf CLK_TCK) / $REQUESTS, 1))")"
    done
    kill -INT "${perf_pids[@]}"
    wait "${perf_pids[@]}" 2>/dev/null || true
    for entry in "${watched[@]}"; do
        echo "  ${entry%%:*} per request:"
        grep -v '^#' "$WORK/perf.${entry%%:*}" | grep . |
            awk -F, -v n="$REQUESTS" '$1 != "<not counted>" && $1 > 0 { printf "    %-32s %.3f\n", $3, $1 / n }'
    done
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
done
