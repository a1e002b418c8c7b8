"""The generated protobuf/gRPC modules, with a clear error when they are missing.

They are generated from proto/ by clients/python/generate_stubs.sh into
fusedserve_client/_proto/ and are not committed.
"""

try:
    from ._proto.fusedserve.v1 import fusedserve_pb2 as pb
    from ._proto.fusedserve.v1 import fusedserve_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the checkout
    raise ImportError(
        "fusedserve_client: the gRPC stubs are missing or stale; generate them with "
        "clients/python/generate_stubs.sh (needs grpcio-tools) and reinstall the package. "
        f"Cause: {e}"
    ) from e

__all__ = ["pb", "pb_grpc"]
