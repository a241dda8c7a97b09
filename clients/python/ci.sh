#!/usr/bin/env bash
# The Python client's CI: a virtualenv, the package with its test extras
# (whose build generates the gRPC stubs from ../../proto), then pytest
# against a real ratelimitd (target/debug/ratelimitd, or $RATELIMITD_BIN:
# build it first with `cargo build --bin ratelimitd`).
#
#   clients/python/ci.sh [pytest arguments...]
#
# The virtualenv is clients/python/.venv, or $RATELIMITD_CLIENT_VENV; it is
# reused between runs and remade if broken. Python: $PYTHON, else python3
# (3.11 or newer).
set -euo pipefail

# Paths given relative to where ci.sh was called from.
if [ -n "${RATELIMITD_BIN:-}" ]; then
  RATELIMITD_BIN=$(realpath -m "$RATELIMITD_BIN")
  export RATELIMITD_BIN
fi
venv=$(realpath -m "${RATELIMITD_CLIENT_VENV:-$(dirname "$0")/.venv}")
python=${PYTHON:-python3}
cd "$(dirname "$0")"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "ci.sh: $python is $("$python" --version 2>&1); the client needs Python 3.11 or newer (set PYTHON)" >&2
  exit 1
fi
if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
  echo "ci.sh: creating the virtualenv $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
# A local folder is always rebuilt and reinstalled, so the stubs and the
# installed package are those of this checkout: the tests import the package
# as a user would get it, not the source tree.
echo "ci.sh: installing ratelimitd-client[test] (the build generates the stubs)"
"${pip[@]}" install --constraint constraints.txt ".[test]"
# The stubs are there, google.rpc.Status's packaged copy included (found,
# not imported: googleapis-common-protos' copy, if installed, is loaded instead).
"$venv/bin/python" -c 'import importlib.util, ratelimitd_client._pb.ratelimit_pb2_grpc, ratelimitd_client._pb.lease_pb2_grpc
assert importlib.util.find_spec("ratelimitd_client._pb.status_pb2"), "status_pb2 is not packaged"'

echo "ci.sh: running pytest"
exec "$venv/bin/python" -m pytest "$@"
