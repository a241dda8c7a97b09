#!/usr/bin/env python3
"""Generates the Python gRPC stubs of ratelimitd's API from the repository's
`proto/` directory, into `src/ratelimitd_client/_pb/`.

The stubs are build output and never committed. `pip install` runs this
through the build hook in `setup.py`, so installing the package is enough;
run it by hand (`python generate_stubs.py`, with grpcio-tools installed, as
the `test` extra does) after changing the proto in an editable install.

Two things the plain `protoc` output needs:
- `google/protobuf/duration.proto`, which the proto imports: grpcio-tools
  ships it in its `_proto` directory, added to the include path;
- package-relative imports: `ratelimit_pb2_grpc.py` imports its messages as
  `from ratelimitd.v1 import ratelimit_pb2`, a top-level package this
  distribution does not (and should not) own. That one line is rewritten to
  `from . import ratelimit_pb2`, and the rewrite fails loudly if a future
  grpcio-tools words it differently. The proto's own file name stays
  `ratelimitd/v1/ratelimit.proto` in the descriptor pool, as in every other
  language, so it cannot collide with another package's `ratelimit.proto`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The proto, as a path under the include root (its name in the descriptor pool).
PROTO = "ratelimitd/v1/ratelimit.proto"
# The repository's proto/ directory; RATELIMITD_PROTO_DIR points elsewhere.
DEFAULT_PROTO_ROOT = HERE.parent.parent / "proto"
OUT_DIR = HERE / "src" / "ratelimitd_client" / "_pb"
GENERATED = ("ratelimit_pb2.py", "ratelimit_pb2.pyi", "ratelimit_pb2_grpc.py")

_ABSOLUTE_IMPORT = re.compile(r"^from ratelimitd\.v1 import ratelimit_pb2 ", re.MULTILINE)


def proto_root() -> Path:
    return Path(os.environ.get("RATELIMITD_PROTO_DIR", DEFAULT_PROTO_ROOT)).resolve()


def stubs_present(out_dir: Path = OUT_DIR) -> bool:
    return all((out_dir / name).is_file() for name in GENERATED)


def generate(out_dir: Path = OUT_DIR, root: Path | None = None) -> None:
    """Runs protoc (from grpcio-tools) and writes the three stub files."""
    root = root or proto_root()
    if not (root / PROTO).is_file():
        raise SystemExit(
            f"generate_stubs: {root / PROTO} not found. Run from the ratelimitd "
            "repository (clients/python sits two levels under proto/'s parent), "
            "or set RATELIMITD_PROTO_DIR to the directory that holds ratelimitd/v1/."
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
                str(root / PROTO),
            ]
        )
        if status != 0:
            raise SystemExit(f"generate_stubs: protoc failed (exit {status})")
        produced = Path(tmp) / Path(PROTO).parent
        grpc_file = produced / "ratelimit_pb2_grpc.py"
        text, count = _ABSOLUTE_IMPORT.subn("from . import ratelimit_pb2 ", grpc_file.read_text())
        if count != 1:
            raise SystemExit(
                f"generate_stubs: expected one 'from ratelimitd.v1 import ratelimit_pb2' "
                f"in {grpc_file.name}, found {count}: grpcio-tools changed its output"
            )
        grpc_file.write_text(text)

        out_dir.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            _replace_if_changed(produced / name, out_dir / name)


def _replace_if_changed(source: Path, target: Path) -> None:
    # Unchanged files keep their mtime, so rebuilds and editors see no churn.
    if target.is_file() and target.read_bytes() == source.read_bytes():
        return
    shutil.copyfile(source, target)


def generate_for_build() -> None:
    """The build hook's entry: generate when the proto is there; when it is
    not (a build from an sdist that carries stubs) keep the stubs present."""
    if (proto_root() / PROTO).is_file() or not stubs_present():
        generate()


if __name__ == "__main__":
    generate()
    print(f"generated {', '.join(GENERATED)} in {OUT_DIR}", file=sys.stderr)
