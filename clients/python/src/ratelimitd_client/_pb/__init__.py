"""Generated gRPC stubs of proto/ratelimitd/v1/ratelimit.proto (CheckLimit)
and proto/ratelimitd/v1/lease.proto (the Leases stream).

Not committed: `pip install` (through setup.py) or `python generate_stubs.py`
writes ratelimit_pb2.py, ratelimit_pb2.pyi and ratelimit_pb2_grpc.py here,
lease_pb2.py, lease_pb2.pyi and lease_pb2_grpc.py, and status_pb2.py / .pyi
(google.rpc.Status, a CheckLimits item's error and a lease grant's; used
only when googleapis-common-protos does not provide it: see
generate_stubs.py).
"""

try:
    from . import lease_pb2, lease_pb2_grpc, ratelimit_pb2, ratelimit_pb2_grpc
except ImportError as err:
    if err.name != __name__:  # a stub is there but failed, e.g. on versions
        raise
    raise ImportError(
        "ratelimitd_client's gRPC stubs are missing: install the package with pip "
        "(its build generates them), or run `python generate_stubs.py` in clients/python"
    ) from err

__all__ = ["lease_pb2", "lease_pb2_grpc", "ratelimit_pb2", "ratelimit_pb2_grpc"]
