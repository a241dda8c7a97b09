#!/usr/bin/env python3
"""Generates the Python gRPC stubs of ratelimitd's API from this package's
copy of the protos (`proto/`, beside this file), into
`src/ratelimitd_client/_pb/`.

The copy is committed, so the package builds on its own: from the checkout,
from an sdist, or from a wheel built from that sdist, without the
repository's `proto/` two folders up. `tests/test_proto_copy.py` fails when
the copy differs from the repository's (refresh it with `python
generate_stubs.py --sync`, which copies them over, then regenerates).

The stubs are build output and never committed. `pip install` runs this
through the build hook in `setup.py`, so installing the package is enough;
run it by hand (`python generate_stubs.py`, with grpcio-tools installed, as
the `test` extra does) after changing the proto in an editable install.

Three things the plain `protoc` output needs:
- `google/protobuf/duration.proto` and `google/protobuf/any.proto`, which
  the protos import: grpcio-tools ships them in its `_proto` directory,
  added to the include path (protobuf ships their Python modules);
- `google/rpc/status.proto` (a CheckLimits item's error), vendored in
  proto/google/rpc/: generated too, as `_pb/status_pb2.py`;
- package-relative imports: protoc writes `from ratelimitd.v1 import
  ratelimit_pb2` (in `ratelimit_pb2_grpc.py`, and in `lease_pb2.py` and
  `.pyi`, whose messages use CheckLimit's `LimitStatus`), `from
  ratelimitd.v1 import lease_pb2` (in `lease_pb2_grpc.py`) and `from
  google.rpc import status_pb2` (in `ratelimit_pb2.py`, `lease_pb2.py` and
  their `.pyi`), top-level packages this distribution does not (and should
  not) own. Each is rewritten to import from `.`, and a rewrite fails loudly
  if a future grpcio-tools words its line differently. The protos' own file
  names stay as they are in the descriptor pool
  (`ratelimitd/v1/ratelimit.proto`, `ratelimitd/v1/lease.proto`), as in
  every other language, so ours cannot collide with another package's
  `ratelimit.proto`.

`google.rpc.Status` is the exception: its file name and message name are
googleapis', and googleapis-common-protos (which grpcio-status, the Google
Cloud libraries and OpenTelemetry's exporters bring) registers the same
names with other options, so the two copies cannot both be loaded (protobuf
refuses a second `google/rpc/status.proto`). `ratelimit_pb2.py` and
`lease_pb2.py` therefore import googleapis' `google.rpc.status_pb2` when it
is installed (the same message on the wire) and the packaged copy only when
it is not.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The protos, as paths under the include root (their names in the descriptor
# pool): CheckLimit's, and the Leases stream's (which imports the first).
PROTO = "ratelimitd/v1/ratelimit.proto"
LEASE_PROTO = "ratelimitd/v1/lease.proto"
PROTOS = (PROTO, LEASE_PROTO)
# What it imports from the same root (vendored, not in grpcio-tools' _proto).
STATUS_PROTO = "google/rpc/status.proto"
# The package's own copy of the protos it needs; RATELIMITD_PROTO_DIR points elsewhere.
DEFAULT_PROTO_ROOT = HERE / "proto"
# The repository's proto/ directory, the source of that copy (absent in an sdist).
REPOSITORY_PROTO_ROOT = HERE.parent.parent / "proto"
OUT_DIR = HERE / "src" / "ratelimitd_client" / "_pb"
GENERATED = (
    "ratelimit_pb2.py",
    "ratelimit_pb2.pyi",
    "ratelimit_pb2_grpc.py",
    "lease_pb2.py",
    "lease_pb2.pyi",
    "lease_pb2_grpc.py",
    "status_pb2.py",
    "status_pb2.pyi",
)

_ABSOLUTE_IMPORT = re.compile(r"^from ratelimitd\.v1 import (ratelimit_pb2|lease_pb2) ", re.MULTILINE)
_RELATIVE_IMPORT = "from . import \\1 "
_STATUS_IMPORT = re.compile(r"^from google\.rpc import status_pb2 as (\w+)\n", re.MULTILINE)
# googleapis' copy when installed, else ours (see the module's docstring).
_STATUS_IMPORT_WITH_FALLBACK = """\
try:  # googleapis-common-protos' copy, if installed: protobuf loads one google/rpc/status.proto
    from google.rpc import status_pb2 as \\1
except ModuleNotFoundError as err:
    if err.name not in ("google.rpc", "google.rpc.status_pb2"):
        raise
    from . import status_pb2 as \\1
"""


def proto_root() -> Path:
    return Path(os.environ.get("RATELIMITD_PROTO_DIR", DEFAULT_PROTO_ROOT)).resolve()


def stubs_present(out_dir: Path = OUT_DIR) -> bool:
    return all((out_dir / name).is_file() for name in GENERATED)


def generate(out_dir: Path = OUT_DIR, root: Path | None = None) -> None:
    """Runs protoc (from grpcio-tools) and writes the stub files (GENERATED)."""
    root = root or proto_root()
    if not all((root / proto).is_file() for proto in (*PROTOS, STATUS_PROTO)):
        raise SystemExit(
            f"generate_stubs: {', '.join(str(root / p) for p in PROTOS)} or {root / STATUS_PROTO} "
            "not found: the package's "
            "proto/ copy is missing (an sdist without it?), or RATELIMITD_PROTO_DIR points at a "
            "directory that does not hold ratelimitd/v1/ and google/rpc/."
        )
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as err:
        raise SystemExit(
            "generate_stubs: grpcio-tools is missing: pip install grpcio-tools "
            "(or install this package, whose build brings it)"
        ) from err
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"

    with tempfile.TemporaryDirectory() as tmp:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{well_known}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                *(str(root / proto) for proto in PROTOS),
                str(root / STATUS_PROTO),
            ]
        )
        if status != 0:
            raise SystemExit(f"generate_stubs: protoc failed (exit {status})")
        produced = Path(tmp) / Path(PROTO).parent
        for stub in ("ratelimit_pb2_grpc.py", "lease_pb2_grpc.py", "lease_pb2.py", "lease_pb2.pyi"):
            _rewrite(produced / stub, _ABSOLUTE_IMPORT, _RELATIVE_IMPORT)
        for stub in ("ratelimit_pb2", "lease_pb2"):
            _rewrite(produced / f"{stub}.py", _STATUS_IMPORT, _STATUS_IMPORT_WITH_FALLBACK)
            # Type checkers read the packaged copy: the same message either way.
            _rewrite(produced / f"{stub}.pyi", _STATUS_IMPORT, "from . import status_pb2 as \\1\n")
        for name in ("status_pb2.py", "status_pb2.pyi"):
            shutil.move(Path(tmp) / Path(STATUS_PROTO).parent / name, produced / name)

        out_dir.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            _replace_if_changed(produced / name, out_dir / name)


def _rewrite(file: Path, absolute: re.Pattern[str], relative: str) -> None:
    """Rewrites the one line `absolute` matches in `file`, loudly if there
    is not exactly one."""
    text, count = absolute.subn(relative, file.read_text())
    if count != 1:
        raise SystemExit(
            f"generate_stubs: expected one line matching {absolute.pattern!r} in {file.name}, "
            f"found {count}: grpcio-tools changed its output"
        )
    file.write_text(text)


def _replace_if_changed(source: Path, target: Path) -> None:
    # Unchanged files keep their mtime, so rebuilds and editors see no churn.
    if target.is_file() and target.read_bytes() == source.read_bytes():
        return
    shutil.copyfile(source, target)


def generate_for_build() -> None:
    """The build hook's entry: generate when the proto is there; when it is
    not (a build from an sdist that carries stubs) keep the stubs present."""
    if all((proto_root() / proto).is_file() for proto in PROTOS) or not stubs_present():
        generate()


def sync_from_repository() -> None:
    """Copies the repository's protos over the package's copy."""
    for proto in (*PROTOS, STATUS_PROTO):
        target = DEFAULT_PROTO_ROOT / proto
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_if_changed(REPOSITORY_PROTO_ROOT / proto, target)


if __name__ == "__main__":
    if "--sync" in sys.argv[1:]:
        sync_from_repository()
        print(f"copied {', '.join(PROTOS)} and {STATUS_PROTO} from {REPOSITORY_PROTO_ROOT}", file=sys.stderr)
    generate()
    print(f"generated {', '.join(GENERATED)} in {OUT_DIR}", file=sys.stderr)
