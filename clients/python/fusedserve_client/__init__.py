"""Python client for fusedserve: fused transformer ops on numpy arrays, token
generation and server introspection over gRPC. See clients/python/README.md."""

from .client import (DEFAULT_TIMEOUT_S, FusedServeClient, FusedServeError, GenerateStream,
                     GenerationStats)
from .tensors import bf16_bits_to_float, float_to_bf16_bits, from_tensor, to_tensor
from ._stubs import pb, pb_grpc

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT_S", "FusedServeClient", "FusedServeError", "GenerateStream", "GenerationStats",
    "bf16_bits_to_float", "float_to_bf16_bits", "from_tensor", "to_tensor", "pb", "pb_grpc",
]
