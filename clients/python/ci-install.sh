#!/usr/bin/env bash
# The Python client as a user gets it: built on its own, installed from its
# wheel into a fresh virtualenv, running the README's app against a real
# ratelimitd.
#
#   RATELIMITD_BIN=target/debug/ratelimitd bash clients/python/ci-install.sh
#
# 1. copies clients/python (sources only) to a temporary directory outside
#    the checkout, so the build cannot reach the repository's proto/;
# 2. builds an sdist there, then a wheel from that sdist, and checks what
#    each holds (the protos in the sdist; no tests in either; the stubs in
#    the wheel);
# 3. makes a fresh virtualenv (mktemp -d) and installs the wheel with its
#    `asgi` extra as the README says, plus httpx for Starlette's TestClient;
# 4. writes the README's app (the ```python block after the README's
#    `ci-install: app.py` marker, as it is), starts ratelimitd
#    ($RATELIMITD_BIN, embedded store, a free loopback port) and, for every
#    algorithm, sends 6 requests to a route limited to 5 per 10 s: 5 pass,
#    the 6th gets 429 with Retry-After and the RateLimit headers;
# 5. stops ratelimitd: on_service_error="allow" lets requests through with
#    RateLimit-Degraded and stats.fail_open counted, "deny" answers 503.
#
# Needs Python 3.11+ ($PYTHON, else python3) and PyPI (or a pip mirror).
# Cleans up its processes and directories however it ends.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
bin=${RATELIMITD_BIN:-$here/../../target/debug/ratelimitd}

say() { echo "ci-install: $*"; }
fail() { echo "ci-install: FAILED: $*" >&2; exit 1; }

[ -x "$bin" ] || fail "no ratelimitd binary at $bin: build it (cargo build --bin ratelimitd) or set RATELIMITD_BIN"
bin=$(realpath "$bin")
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail "$python is $("$python" --version 2>&1); the client needs Python 3.11 or newer (set PYTHON)"

work=$(mktemp -d "${TMPDIR:-/tmp}/ratelimitd-ci-install.XXXXXX")
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. the sources, alone ----------------------------------------------------
say "copying clients/python to $work/src (outside the checkout: no ../../proto)"
mkdir -p "$work/src" "$work/dist"
tar -C "$here" \
  --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache \
  --exclude='./src/ratelimitd_client/_pb/*_pb2*' \
  -cf - . | tar -C "$work/src" -xf -

# --- 2. sdist, then a wheel from it -------------------------------------------
say "making the virtualenv $work/venv"
"$python" -m venv "$work/venv"
py="$work/venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check --quiet)
"${pip[@]}" install build

say "building the sdist"
"$py" -m build --sdist --outdir "$work/sdist" "$work/src" >"$work/build-sdist.log" 2>&1 \
  || { cat "$work/build-sdist.log" >&2; fail "the sdist did not build"; }
sdist=$(ls "$work"/sdist/ratelimitd_client-*.tar.gz)
say "building the wheel from $(basename "$sdist") alone"
"$py" -m pip wheel --disable-pip-version-check --quiet --no-deps "$sdist" -w "$work/dist" \
  >"$work/build-wheel.log" 2>&1 || { cat "$work/build-wheel.log" >&2; fail "the wheel did not build from the sdist"; }
wheel=$(ls "$work"/dist/ratelimitd_client-*.whl)

say "checking what the sdist and the wheel hold"
"$py" - "$sdist" "$wheel" <<'EOF'
import sys, tarfile, zipfile
sdist = [n.split("/", 1)[1] for n in tarfile.open(sys.argv[1]).getnames() if "/" in n]
wheel = zipfile.ZipFile(sys.argv[2]).namelist()
problems = []
for needed in ("proto/ratelimitd/v1/ratelimit.proto", "proto/ratelimitd/v1/lease.proto",
               "proto/google/rpc/status.proto", "generate_stubs.py"):
    if needed not in sdist:
        problems.append(f"the sdist lacks {needed}")
for needed in ("ratelimitd_client/asgi.py", "ratelimitd_client/_pb/ratelimit_pb2.py",
               "ratelimitd_client/_pb/ratelimit_pb2_grpc.py", "ratelimitd_client/_pb/lease_pb2.py",
               "ratelimitd_client/_pb/lease_pb2_grpc.py", "ratelimitd_client/_pb/status_pb2.py",
               "ratelimitd_client/py.typed"):
    if needed not in wheel:
        problems.append(f"the wheel lacks {needed}")
for name in sdist + wheel:
    if name.startswith(("tests/", "examples/")) or "/tests/" in name or name.endswith(".proto") and name in wheel:
        problems.append(f"{name} should not be packaged")
top = {n.split("/")[0] for n in wheel}
if top - {"ratelimitd_client"} - {n for n in top if n.endswith(".dist-info")}:
    problems.append(f"the wheel installs more than ratelimitd_client: {sorted(top)}")
if problems:
    sys.exit("ci-install: FAILED:\n  " + "\n  ".join(problems))
print(f"ci-install:   sdist: {len(sdist)} files, protos included, no tests; wheel: {len(wheel)} files, stubs, no tests")
EOF

# --- 3. install as the README says --------------------------------------------
say "installing $(basename "$wheel")[asgi], and httpx and fastapi for the test apps, into the fresh virtualenv"
"${pip[@]}" install "$wheel[asgi]" httpx fastapi
"${pip[@]}" uninstall -y build >/dev/null

# --- 4. the README's app against ratelimitd ------------------------------------
mkdir "$work/app"
"$py" - "$here/README.md" "$work/app" <<'EOF'
import re, sys
readme = open(sys.argv[1]).read()
for name in ("app.py", "fastapi_app.py"):
    found = re.search(rf"<!-- ci-install: {re.escape(name)} -->\s*```python\n(.*?)```", readme, re.S)
    if not found:
        sys.exit(f"ci-install: FAILED: no ```python block after <!-- ci-install: {name} --> in the README")
    open(f"{sys.argv[2]}/{name}", "w").write(found[1])
EOF
say "wrote the README's apps to $work/app/app.py and fastapi_app.py"

cat >"$work/app/drive.py" <<'EOF'
"""Drives the README's app (app.py, unchanged) with Starlette's TestClient."""
import sys
import warnings

# Newer Starlette suggests another HTTP client for its TestClient; httpx works.
warnings.filterwarnings("ignore", message=".*starlette.testclient.*")

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import app as readme  # the README's app, as written

ALGORITHMS = ["fixed_window", "sliding_window", "token_bucket", "gcra", "sliding_window_counter"]
failures = []


def check(ok, what):
    print(f"ci-install:   {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def endpoint():
    """A new endpoint function (each route its own, as in an app)."""

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    return hello


# "/" is the README's route (fixed_window); the others as the README's
# `type=` option says, one route per algorithm.
for algorithm in ALGORITHMS[1:]:
    limited = readme.limiter.limit("5/10 seconds", type=algorithm)(endpoint())
    readme.app.router.routes.append(Route(f"/{algorithm}", limited))

phase = sys.argv[1]
if phase == "up":
    # The apps as written, but a deadline that a loaded CI machine (cargo
    # test running beside this) cannot miss: a miss would fail open.
    readme.limiter.client.deadline = 2.0
    with TestClient(readme.app) as client:
        for algorithm in ALGORITHMS:
            path = "/" if algorithm == "fixed_window" else f"/{algorithm}"
            responses = [client.get(path) for _ in range(6)]
            codes = [r.status_code for r in responses]
            check(codes == [200] * 5 + [429], f"{algorithm}: 5 per 10 s: 5 allowed, the 6th 429 ({codes})")
            denied = responses[-1]
            check("retry-after" in denied.headers and int(denied.headers["retry-after"]) >= 1,
                  f"{algorithm}: the 429 has Retry-After ({denied.headers.get('retry-after')})")
            check(denied.headers.get("ratelimit-policy") == '"default";q=5;w=10'
                  and denied.headers.get("ratelimit", "").startswith('"default";r=0;t='),
                  f"{algorithm}: RateLimit-Policy and RateLimit headers "
                  f"({denied.headers.get('ratelimit-policy')} / {denied.headers.get('ratelimit')})")
            check(all(r.headers.get("ratelimit", "").startswith(f'"default";r={4 - i};')
                      for i, r in enumerate(responses[:5])), f"{algorithm}: remaining 4, 3, 2, 1, 0")
        probes = [client.get("/healthz").status_code for _ in range(8)]
        check(probes == [200] * 8, "the exempt health probe is never limited")
    check(readme.limiter.stats.as_dict() == {"decided": 30, "denied": 5, "fail_open": 0, "fail_closed": 0},
          f"stats: {readme.limiter.stats.as_dict()}")

    import fastapi_app  # the README's FastAPI app, as written

    # Another client IP: "/" here has the same limit, so the same derived
    # namespace (and counters) as the Starlette app's "/", as documented.
    fastapi_app.limiter.client.deadline = 2.0
    with TestClient(fastapi_app.app, client=("192.0.2.80", 50000)) as client:
        for path, body in (("/", {"hello": "world"}), ("/items/7", {"item_id": 7})):
            responses = [client.get(path) for _ in range(6)]
            codes = [r.status_code for r in responses]
            check(codes == [200] * 5 + [429] and responses[0].json() == body,
                  f"FastAPI {path}: 5 allowed, the 6th 429 ({codes})")
            check("retry-after" in responses[5].headers
                  and responses[5].headers.get("ratelimit-policy") == '"default";q=5;w=10',
                  f"FastAPI {path}: Retry-After and the RateLimit headers")
        probes = [client.get("/healthz").status_code for _ in range(8)]
        check(probes == [200] * 8, "FastAPI: the exempt health probe is never limited")
else:  # ratelimitd stopped
    seen = []
    readme.limiter.on_degraded = lambda request, info: seen.append(info.reason)
    with TestClient(readme.app) as client:
        response = client.get("/")
    check(response.status_code == 200, f'on_service_error="allow" (the default): passes ({response.status_code})')
    check(response.headers.get("ratelimit-degraded") == "unavailable",
          f"RateLimit-Degraded: {response.headers.get('ratelimit-degraded')}")
    check(readme.limiter.stats.fail_open == 1, f"stats.fail_open == 1 ({readme.limiter.stats.as_dict()})")
    check(seen == ["unavailable"], f"on_degraded called ({seen})")

    from starlette.applications import Starlette
    from ratelimitd_client.asgi import Limiter, RateLimitMiddleware

    limiter = Limiter(on_service_error="deny")
    denying = Starlette(routes=[Route("/", limiter.limit("5/10 seconds")(endpoint()))])
    denying.add_middleware(RateLimitMiddleware, limiter=limiter)
    with TestClient(denying) as client:
        response = client.get("/")
    check(response.status_code == 503 and response.json() == {"error": "Rate limiter unavailable"},
          f'on_service_error="deny": 503 ({response.status_code} {response.text})')
    check(limiter.stats.fail_closed == 1, f"stats.fail_closed == 1 ({limiter.stats.as_dict()})")

if failures:
    sys.exit(f"ci-install: FAILED ({phase}): " + "; ".join(failures))
EOF

say "starting ratelimitd ($bin) on a free loopback port, embedded store"
# RATELIMITD_* variables of the caller (a Redis URL...) must not reach it.
unset_env=()
while IFS= read -r name; do unset_env+=(-u "$name"); done < <(env | sed -n 's/^\(RATELIMITD_[A-Z0-9_]*\)=.*/\1/p')
env "${unset_env[@]}" "$bin" --listen 127.0.0.1:0 --http-listen= --address-file "$work/address" >"$work/ratelimitd.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 200); do
  [ -s "$work/address" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/ratelimitd.log" >&2; fail "ratelimitd exited at start"; }
  sleep 0.05
done
[ -s "$work/address" ] || { cat "$work/ratelimitd.log" >&2; fail "ratelimitd did not write its address within 10 s"; }
export RATELIMITD_ADDRESS=$(cat "$work/address")
unset RATELIMITD_TLS RATELIMITD_TLS_CA RATELIMITD_TLS_CERT RATELIMITD_TLS_KEY
say "ratelimitd serves on $RATELIMITD_ADDRESS; the app finds it through RATELIMITD_ADDRESS"

say "every algorithm, 5 requests per 10 s"
(cd "$work/app" && "$py" drive.py up) || { tail -20 "$work/ratelimitd.log" >&2; fail "the app with ratelimitd up"; }

say "stopping ratelimitd"
kill "$server_pid"
wait "$server_pid" || fail "ratelimitd exited $? on SIGTERM"
server_pid=

say "ratelimitd stopped: each failure option"
(cd "$work/app" && "$py" drive.py down) || fail "the app with ratelimitd down"

say "passed"
