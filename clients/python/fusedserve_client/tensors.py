"""Conversion between numpy arrays and fusedserve.v1.Tensor.

Tensors travel as row-major little-endian bytes with a dtype tag. numpy
float32/float16/int32/int64 map one to one; float64 is narrowed to float32
(the server has no f64). bfloat16 has no native numpy dtype: an array of
ml_dtypes.bfloat16 is sent as BF16 as it is, and a float array can be sent as
BF16 with wire_dtype="bf16" (rounded to nearest even, as the server does).
BF16 results come back as float32 arrays, which hold every bf16 value exactly.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from ._stubs import pb

DTypeLike = Union[str, np.dtype, type, int, None]

_WIRE_NAMES = {
    "f32": "F32", "float32": "F32", "float": "F32",
    "f16": "F16", "float16": "F16", "half": "F16",
    "bf16": "BF16", "bfloat16": "BF16",
    "i32": "I32", "int32": "I32",
    "i64": "I64", "int64": "I64",
}

# numpy dtype -> (wire dtype name, little-endian numpy dtype of the payload)
_FROM_NUMPY = {
    np.dtype(np.float32): ("F32", "<f4"),
    np.dtype(np.float16): ("F16", "<f2"),
    np.dtype(np.int32): ("I32", "<i4"),
    np.dtype(np.int64): ("I64", "<i8"),
}

# wire dtype name -> (numpy dtype of the payload, numpy dtype returned)
_TO_NUMPY = {
    "F32": ("<f4", np.float32),
    "F16": ("<f2", np.float16),
    "BF16": ("<u2", np.float32),
    "I32": ("<i4", np.int32),
    "I64": ("<i8", np.int64),
}


def wire_dtype_name(dtype: DTypeLike) -> Optional[str]:
    """Normalizes "bf16", "float16", np.float32, pb.F16, "F32"... to "F32"/"F16"/"BF16"/"I32"/"I64"."""
    if dtype is None:
        return None
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return pb.DType.Name(dtype)
    if isinstance(dtype, str):
        key = dtype.strip()
        if key.upper() in _TO_NUMPY:
            return key.upper()
        if key.lower() in _WIRE_NAMES:
            return _WIRE_NAMES[key.lower()]
        raise ValueError(f"unknown dtype {dtype!r}: use one of f32, f16, bf16, i32, i64")
    np_dtype = np.dtype(dtype)
    if np_dtype.name == "bfloat16":
        return "BF16"
    if np_dtype in _FROM_NUMPY:
        return _FROM_NUMPY[np_dtype][0]
    raise ValueError(f"dtype {np_dtype} has no fusedserve wire type (f32, f16, bf16, i32, i64)")


def float_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of a float array, rounded to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(a, dtype="<f4")
    u = f.view("<u4")
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype("<u2")
    return rounded


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << np.uint32(16)).view("<f4").astype(np.float32)


def is_float_array(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def to_tensor(value: Any, wire_dtype: DTypeLike = None) -> "pb.Tensor":
    """numpy array (or nested list) -> Tensor.

    wire_dtype casts float arrays to that float dtype ("f32", "f16", "bf16");
    integer arrays are sent as they are (int32 or int64; other integer types
    are widened to int64).
    """
    a = np.asarray(value)
    target = wire_dtype_name(wire_dtype)
    if target is not None and target not in ("F32", "F16", "BF16"):
        raise ValueError(f"wire_dtype must be a float dtype (f32, f16, bf16), got {wire_dtype!r}")

    if a.dtype.name == "bfloat16":  # ml_dtypes.bfloat16
        if target in (None, "BF16"):
            return _tensor("BF16", a.shape, np.ascontiguousarray(a).view("<u2"))
        a = a.astype(np.float32)
    if a.dtype.kind == "f":
        if target is None:
            target = "F16" if a.dtype == np.float16 else "F32"
        if target == "BF16":
            return _tensor("BF16", a.shape, float_to_bf16_bits(a))
        return _tensor(target, a.shape, np.ascontiguousarray(a, dtype="<f2" if target == "F16" else "<f4"))
    if a.dtype.kind in "iu":
        if a.dtype == np.int32:
            return _tensor("I32", a.shape, np.ascontiguousarray(a, dtype="<i4"))
        if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise ValueError("unsigned values above int64 range cannot be sent")
        return _tensor("I64", a.shape, np.ascontiguousarray(a, dtype="<i8"))
    raise TypeError(f"cannot send an array of dtype {a.dtype} (use float32/float16/bf16/int32/int64)")


def _tensor(dtype_name: str, shape, payload: np.ndarray) -> "pb.Tensor":
    return pb.Tensor(dtype=pb.DType.Value(dtype_name), shape=[int(d) for d in shape], data=payload.tobytes())


def from_tensor(t: "pb.Tensor", name: str = "tensor") -> np.ndarray:
    """Tensor -> writable numpy array (BF16 -> float32)."""
    dtype_name = pb.DType.Name(t.dtype) if t.dtype in pb.DType.values() else str(t.dtype)
    if dtype_name not in _TO_NUMPY:
        raise ValueError(f"{name}: unsupported dtype {dtype_name}")
    payload_dtype, out_dtype = _TO_NUMPY[dtype_name]
    shape = tuple(int(d) for d in t.shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    expected = count * np.dtype(payload_dtype).itemsize
    if len(t.data) != expected:
        raise ValueError(f"{name}: {len(t.data)} bytes of data for shape {list(shape)} {dtype_name} (expected {expected})")
    raw = np.frombuffer(t.data, dtype=payload_dtype, count=count).reshape(shape)
    if dtype_name == "BF16":
        return bf16_bits_to_float(raw).reshape(shape)
    return raw.astype(out_dtype, copy=True)
