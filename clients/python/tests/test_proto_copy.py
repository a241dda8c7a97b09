"""The package's copy of the protos (clients/python/proto/: CheckLimit's,
the Leases stream's and google.rpc.Status, what the build generates the
stubs from) is the repository's: run inside the checkout, this
fails as soon as proto/ changes without the copy (`python generate_stubs.py
--sync` refreshes it). Outside a checkout (an unpacked sdist) there is
nothing to compare with. The algorithm table is the proto's too: its
`type=`s are exactly the fields of the `oneof algorithm` (which the
server's own tests check against its algorithm registry)."""

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]
REPOSITORY_PROTO = PACKAGE.parents[1] / "proto"
COPIED = ("ratelimitd/v1/ratelimit.proto", "ratelimitd/v1/lease.proto", "google/rpc/status.proto")


@pytest.mark.parametrize("proto", COPIED)
def test_the_packaged_proto_is_the_repositorys(proto):
    if not (REPOSITORY_PROTO / "ratelimitd" / "v1").is_dir():
        pytest.skip("not inside the ratelimitd checkout: no proto/ to compare with")
    copy = PACKAGE / "proto" / proto
    assert copy.is_file(), f"{copy} is missing: run `python generate_stubs.py --sync`"
    assert copy.read_bytes() == (REPOSITORY_PROTO / proto).read_bytes(), (
        f"{copy} differs from {REPOSITORY_PROTO / proto}: run `python generate_stubs.py --sync`"
    )


def test_the_copy_holds_only_what_the_stubs_need():
    found = sorted(str(p.relative_to(PACKAGE / "proto")) for p in (PACKAGE / "proto").rglob("*.proto"))
    assert found == sorted(COPIED)


@pytest.mark.parametrize("message", ("CheckLimitRequest", "Limit"))
def test_the_algorithm_table_names_exactly_the_protos_algorithms(message):
    from ratelimitd_client._pb import ratelimit_pb2 as pb
    from ratelimitd_client._request import ALGORITHMS

    oneof = getattr(pb, message).DESCRIPTOR.oneofs_by_name["algorithm"]
    assert list(ALGORITHMS) == [field.name for field in oneof.fields]
    for name, algorithm in ALGORITHMS.items():
        assert algorithm.field == name
