#!/usr/bin/env bash
# The JSON API against gRPC on one ratelimitd: the same question (a fixed
# window of one minute on one key, high enough that nothing is denied, so
# every request is decided and spends), asked by h2load (Debian
# nghttp2-client) at the same concurrency, CONNECTIONS connections with one
# request in flight each:
#
#   - POST /v1/check, JSON over HTTP/1.1 (h2load --h1);
#   - ratelimitd.v1.RateLimiter/CheckLimit, protobuf over HTTP/2.
#
# Alternating rounds A B A B ..., each a warm-up (not counted) and then
# DURATION measured. p50/p99 come from h2load's per-request log. Prints one
# Markdown row per run and the ratio of the medians; a run with a failed
# request does not count.
#
#   benches/http_api.sh
#   STORE=memory ROUNDS=5 DURATION=10s CONNECTIONS=32 benches/http_api.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
STORE=${STORE:-redis}
CONNECTIONS=${CONNECTIONS:-32}

# shellcheck source=benches/common.sh
source benches/common.sh
need h2load "apt-get install nghttp2-client"
need redis-server "apt-get install redis-server"
need python3 "apt-get install python3"

cargo build --release --bin ratelimitd --quiet
BIN=target/release

store_args=()
if [ "$STORE" = redis ]; then
    start_redis
    store_args=(--redis-url "$REDIS_URL")
fi
GRPC_PORT=$(free_port)
HTTP_PORT=$(free_port)
"$BIN/ratelimitd" --listen "127.0.0.1:$GRPC_PORT" --http-listen "127.0.0.1:$HTTP_PORT" \
    "${store_args[@]}" > "$WORK/ratelimitd.log" 2>&1 &
SERVER_PID=$!
PIDS+=("$SERVER_PID")
wait_port "$GRPC_PORT"
wait_port "$HTTP_PORT"

LIMIT=1000000000
# The same CheckLimitRequest twice: as JSON, and gRPC-framed protobuf (key
# "hot", fixed_window {limit, window 60 s}).
printf '{"key": "hot", "fixedWindow": {"limit": "%s", "window": "60s"}}' "$LIMIT" \
    > "$WORK/body.json"
python3 - "$WORK/body.bin" "$LIMIT" <<'EOF'
import struct, sys
def varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])
def field(number, payload):
    return bytes([number << 3 | 2]) + varint(len(payload)) + payload
window = bytes([1 << 3]) + varint(60)
fixed = bytes([1 << 3]) + varint(int(sys.argv[2])) + field(2, window)
request = field(1, b"hot") + field(2, fixed)
with open(sys.argv[1], "wb") as out:
    out.write(b"\x00" + struct.pack(">I", len(request)) + request)
EOF

# Both answer, allowed, before anything is measured.
curl_answer=$(python3 - "$HTTP_PORT" "$WORK/body.json" <<'EOF'
import http.client, sys
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
connection.request("POST", "/v1/check", open(sys.argv[2], "rb").read(),
                   {"content-type": "application/json"})
response = connection.getresponse()
print(response.status, response.read().decode())
EOF
)
case "$curl_answer" in
    "200 "*'"allowed":true'*) ;;
    *) echo "/v1/check did not allow: $curl_answer" >&2; exit 1 ;;
esac

# h2load's per-request log (start µs, status, duration µs) and its summary
# -> "req/s p50 p99" (µs); exits non-zero if a request failed.
cat > "$WORK/summary.py" <<'EOF'
import re, sys
summary = open(sys.argv[1]).read()
counts = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", summary)
if not counts or int(counts.group(4)) or int(counts.group(5)) or counts.group(3) != counts.group(2):
    sys.exit("failed requests: " + (counts.group(0) if counts else summary))
rate = re.search(r"finished in .*?, ([0-9.]+) req/s", summary).group(1)
durations = sorted(int(line.split("\t")[2]) for line in open(sys.argv[2]) if line.strip())
statuses = {line.split("\t")[1] for line in open(sys.argv[2]) if line.strip()}
if statuses != {"200"}:
    sys.exit(f"statuses other than 200: {statuses}")
pick = lambda q: durations[min(len(durations) - 1, int(q * len(durations)))]
print(round(float(rate)), pick(0.50), pick(0.99))
EOF

seconds=${DURATION%s}
run() { # http|grpc -> "req/s p50 p99"
    local log="$WORK/requests.log"
    local target
    local flags=()
    if [ "$1" = http ]; then
        flags=(--h1 -d "$WORK/body.json" -H 'content-type: application/json')
        target="http://127.0.0.1:$HTTP_PORT/v1/check"
    else
        flags=(-d "$WORK/body.bin" -H 'content-type: application/grpc' -H 'te: trailers')
        target="http://127.0.0.1:$GRPC_PORT/ratelimitd.v1.RateLimiter/CheckLimit"
    fi
    rm -f "$log"
    h2load --warm-up-time=2 -D "$seconds" -c "$CONNECTIONS" -m 1 "${flags[@]}" \
        --log-file="$log" "$target" > "$WORK/summary.txt"
    python3 "$WORK/summary.py" "$WORK/summary.txt" "$log"
}

echo "| round | API | decisions/s | p50 µs | p99 µs | server CPU s |"
echo "|---|---|---|---|---|---|"
HTTP_RATES=()
GRPC_RATES=()
for round in $(seq 1 "$ROUNDS"); do
    for api in http grpc; do
        before=$(cpu_seconds "$SERVER_PID")
        read -r rate p50 p99 < <(run "$api")
        after=$(cpu_seconds "$SERVER_PID")
        cpu=$(python3 -c "print(f'{$after - $before:.1f}')")
        if [ "$api" = http ]; then
            name="POST /v1/check (JSON, HTTP/1.1)"
            HTTP_RATES+=("$rate")
        else
            name="CheckLimit (gRPC, HTTP/2)"
            GRPC_RATES+=("$rate")
        fi
        echo "| $round | $name | $rate | $p50 | $p99 | $cpu |"
    done
done
python3 - "$STORE" "${HTTP_RATES[*]}" "${GRPC_RATES[*]}" <<'EOF'
import statistics, sys
store = sys.argv[1]
http = [float(x) for x in sys.argv[2].split()]
grpc = [float(x) for x in sys.argv[3].split()]
print(f"STORE={store}, median decisions/s: /v1/check {statistics.median(http):.0f}, "
      f"CheckLimit {statistics.median(grpc):.0f}, "
      f"ratio {statistics.median(http) / statistics.median(grpc):.2f}")
EOF
