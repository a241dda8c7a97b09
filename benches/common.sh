# Sourced by the benches/*.sh scripts: a scratch folder $WORK removed at
# exit with every process listed in $PIDS, free loopback ports, a private
# redis-server (never the machine's on 6379), and a process's CPU time.
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Exits, saying how to install it, unless command $1 is on the PATH ($2: the
# install command).
need() {
    command -v "$1" >/dev/null 2>&1 ||
        { echo "$(basename "$0") needs $1: $2" >&2; exit 1; }
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until something listens on loopback port $1.
wait_port() {
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null; do
        sleep 0.1
    done
}

# Starts a redis-server of our own: sets REDIS_PORT, REDIS_PID, REDIS_URL.
start_redis() {
    REDIS_PORT=$(free_port)
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$WORK" --logfile "$WORK/redis.log" &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
}

# Script calls (EVALSHA and EVAL) the Redis servers on ports "$@" (default:
# $REDIS_PORT) have served so far, together.
script_calls() {
    local port total=0 calls
    for port in "${@:-$REDIS_PORT}"; do
        calls=$(redis-cli -p "$port" info commandstats | tr -d '\r' |
            awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ { n += $3 } END { print n + 0 }')
        total=$((total + calls))
    done
    echo "$total"
}

# The line each bench's output starts with: the machine and the day.
print_machine() {
    echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)"
}

# CPU seconds (user + system) process $1 has used so far.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"
}

# Starts a Redis Cluster of our own: 3 primaries, no replicas, on free
# ports; sets CLUSTER_PORTS, CLUSTER_PIDS and CLUSTER_URLS (comma-separated).
start_redis_cluster() {
    CLUSTER_PORTS=()
    CLUSTER_PIDS=()
    local port addresses=()
    for node in 1 2 3; do
        # A node's bus listens 10 000 ports higher: the port must be 55535 at most.
        port=$(free_port)
        while [ "$port" -gt 55535 ]; do port=$(free_port); done
        mkdir -p "$WORK/cluster-$node"
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --cluster-enabled yes --cluster-config-file nodes.conf \
            --dir "$WORK/cluster-$node" --logfile "$WORK/cluster-$node/redis.log" &
        CLUSTER_PIDS+=($!)
        PIDS+=($!)
        CLUSTER_PORTS+=("$port")
        addresses+=("127.0.0.1:$port")
        until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
    done
    redis-cli --cluster create "${addresses[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
    for port in "${CLUSTER_PORTS[@]}"; do
        until redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok'; do sleep 0.1; done
    done
    CLUSTER_URLS=$(printf 'redis://%s,' "${addresses[@]}")
    CLUSTER_URLS=${CLUSTER_URLS%,}
}

# The limit of the rules benches/side_by_side.sh serves: high enough that
# nothing is denied, so every request is counted.
SIDE_BY_SIDE_LIMIT=1000000000

# Writes those rules into folder $2 with the ratelimitd-bench binary $1:
# domain "bench", a fixed window of one minute per value of the
# descriptor "key".
write_side_by_side_rules() {
    mkdir -p "$2"
    "$1" --print-envoy-config --domain bench --limit "$SIDE_BY_SIDE_LIMIT" --window 1m \
        > "$2/bench.yaml"
}

# The same limit for Limitador, into file $1: namespace "bench", a counter
# per value of the descriptor "key", a minute.
write_side_by_side_limitador_limits() {
    cat > "$1" <<EOF
- namespace: bench
  max_value: $SIDE_BY_SIDE_LIMIT
  seconds: 60
  conditions: []
  variables:
    - descriptors[0]['key']
EOF
}

# One ShouldRateLimit request for those rules, gRPC-framed, into file $1
# (for h2load): domain "bench", one descriptor ("key", "hot"), hits_addend 1.
write_should_rate_limit_body() {
    python3 - "$1" <<'EOF'
import struct, sys
def field(number, payload):
    return bytes([number << 3 | 2, len(payload)]) + payload
entry = field(1, b"key") + field(2, b"hot")
request = field(1, b"bench") + field(2, field(1, entry)) + bytes([3 << 3, 1])
with open(sys.argv[1], "wb") as out:
    out.write(b"\x00" + struct.pack(">I", len(request)) + request)
EOF
}

# h2load sending body file $2 as ShouldRateLimit to loopback port $1 over
# H2_CONNECTIONS connections of H2_STREAMS streams; h2load's own flags
# (-n or -D, ...) follow.
h2load_should_rate_limit() {
    local port=$1 body=$2
    shift 2
    h2load -c "$H2_CONNECTIONS" -m "$H2_STREAMS" -d "$body" \
        -H 'content-type: application/grpc' -H 'te: trailers' "$@" \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
}
