"""The generated stubs as installed: they are those of the package's copy of
the protos (CheckLimit's and the Leases stream's), and google.rpc.Status (a
CheckLimits item's error, a lease grant's) is packaged, and gives way to
googleapis-common-protos' copy (which grpcio-status and the Google Cloud
libraries bring) when that is installed, in whichever order the two are
imported: protobuf refuses to load two `google/rpc/status.proto`."""

import subprocess
import sys
from pathlib import Path

import grpc_tools
import pytest
from grpc_tools import protoc

# googleapis' google/rpc/status.proto, as far as protobuf tells copies apart:
# the same names, other options.
GOOGLEAPIS_STATUS = """\
syntax = "proto3";
package google.rpc;
import "google/protobuf/any.proto";
option go_package = "google.golang.org/genproto/googleapis/rpc/status;status";
option java_multiple_files = true;
option java_outer_classname = "StatusProto";
option java_package = "com.google.rpc";
option objc_class_prefix = "RPC";
message Status {
  int32 code = 1;
  string message = 2;
  repeated google.protobuf.Any details = 3;
}
"""

# Prints the module ratelimit_pb2 and lease_pb2 took google.rpc.Status from,
# after using it.
USE_THE_STUBS = """
from ratelimitd_client._pb import lease_pb2, ratelimit_pb2
result = ratelimit_pb2.CheckLimitResult(error={"code": 5, "message": "policy: 'x' ..."})
assert ratelimit_pb2.CheckLimitResult.FromString(result.SerializeToString()).error.code == 5
grant = lease_pb2.LeaseGrant(id=1, error={"code": 3, "message": "policy: 'x' ..."}, limits=[{"limit": 5}])
assert lease_pb2.LeaseGrant.FromString(grant.SerializeToString()).error.code == 3
modules = {m.google_dot_rpc_dot_status__pb2.__name__ for m in (ratelimit_pb2, lease_pb2)}
assert len(modules) == 1, modules
print(modules.pop())
"""


def run(script: str, pythonpath: Path | None = None) -> str:
    env = {"PYTHONPATH": str(pythonpath)} if pythonpath else {}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def googleapis(tmp_path_factory) -> Path:
    """A directory holding a googleapis-like google/rpc/status_pb2.py."""
    root = tmp_path_factory.mktemp("googleapis")
    (root / "google" / "rpc").mkdir(parents=True)
    (root / "google" / "rpc" / "status.proto").write_text(GOOGLEAPIS_STATUS)
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={root}",
            "google/rpc/status.proto",
        ]
    )
    assert status == 0
    return root


def test_the_packaged_status_when_googleapis_is_absent():
    # As if googleapis-common-protos were not installed, whether it is or not.
    hide = "import sys; sys.modules['google.rpc'] = None\n"
    assert run(hide + USE_THE_STUBS) == "ratelimitd_client._pb.status_pb2"


@pytest.mark.parametrize("first", ["googleapis", "ratelimitd_client"])
def test_googleapis_status_is_shared_in_either_order(googleapis, first):
    imports = ["import google.rpc.status_pb2", "import ratelimitd_client"]
    if first == "ratelimitd_client":
        imports.reverse()
    # Loading the two copies would fail on import with "duplicate file name".
    assert run("\n".join(imports) + USE_THE_STUBS, googleapis) == "google.rpc.status_pb2"


@pytest.mark.parametrize(
    ("module", "proto"),
    [("ratelimit_pb2", "ratelimitd/v1/ratelimit.proto"), ("lease_pb2", "ratelimitd/v1/lease.proto")],
)
def test_the_stubs_are_those_of_the_packaged_protos(tmp_path, module, proto):
    from google.protobuf import descriptor_pb2

    import ratelimitd_client._pb as stubs

    package = Path(__file__).resolve().parents[1]
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    out = tmp_path / "descriptors.pb"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{package / 'proto'}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            proto,
        ]
    )
    assert status == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    installed = descriptor_pb2.FileDescriptorProto.FromString(getattr(stubs, module).DESCRIPTOR.serialized_pb)
    # protoc's descriptor sets spell out each field's JSON name, which the
    # generated code leaves to be derived.
    messages = list(compiled.message_type)
    while messages:
        message = messages.pop()
        messages.extend(message.nested_type)
        for one in message.field:
            one.ClearField("json_name")
    assert installed == compiled, (
        f"the installed {module} is not generated from the package's proto/{proto}: reinstall the "
        "package (or run `python generate_stubs.py`)"
    )
