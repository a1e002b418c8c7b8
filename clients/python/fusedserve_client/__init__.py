"""Python client for fusedserve: fused transformer ops on numpy arrays, text and
token generation, chat, tokenization and server introspection over gRPC. See clients/python/README.md."""

from .client import (DEFAULT_TIMEOUT_S, FusedServeClient, FusedServeError, GenerateStream,
                     GenerationStats, Tokenized)
from .tensors import bf16_bits_to_float, float_to_bf16_bits, from_tensor, to_tensor
from ._stubs import pb, pb_grpc

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT_S", "FusedServeClient", "FusedServeError", "GenerateStream", "GenerationStats", "Tokenized",
    "bf16_bits_to_float", "float_to_bf16_bits", "from_tensor", "to_tensor", "pb", "pb_grpc",
]
