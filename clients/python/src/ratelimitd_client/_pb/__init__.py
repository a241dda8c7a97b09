"""Generated gRPC stubs of proto/ratelimitd/v1/ratelimit.proto.

Not committed: `pip install` (through setup.py) or `python generate_stubs.py`
writes ratelimit_pb2.py, ratelimit_pb2.pyi and ratelimit_pb2_grpc.py here, and
status_pb2.py / .pyi (google.rpc.Status, a CheckLimits item's error; used only
when googleapis-common-protos does not provide it: see generate_stubs.py).
"""

try:
    from . import ratelimit_pb2, ratelimit_pb2_grpc
except ImportError as err:
    if err.name != __name__:  # a stub is there but failed, e.g. on versions
        raise
    raise ImportError(
        "ratelimitd_client's gRPC stubs are missing: install the package with pip "
        "(its build generates them), or run `python generate_stubs.py` in clients/python"
    ) from err

__all__ = ["ratelimit_pb2", "ratelimit_pb2_grpc"]
