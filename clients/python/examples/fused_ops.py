#!/usr/bin/env python3
"""Calls a few fused ops on a fusedserve server and checks them against numpy.

    python examples/fused_ops.py --target localhost:50051
"""
import argparse

import numpy as np

from fusedserve_client import FusedServeClient, FusedServeError


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="localhost:50051")
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    with FusedServeClient(args.target) as client:
        client.wait_until_serving(timeout=600)

        # RMSNorm over 4 tokens of hidden size 4096, in bf16 on the wire.
        x = rng.standard_normal((4, 4096), dtype=np.float32)
        w = rng.standard_normal(4096, dtype=np.float32)
        y = client.fused_op("rms_norm", x=x, weight=w, eps=1e-5, dtype="bf16")["y"]
        ref = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5) * w
        print(f"rms_norm bf16: max abs error vs numpy {np.abs(y - ref).max():.3e}")

        # Residual add + RMSNorm: two outputs.
        r = rng.standard_normal((4, 4096), dtype=np.float32)
        out = client.fused_op("add_rms_norm", x=x, residual=r, weight=w)
        print("add_rms_norm outputs:", {k: v.shape for k, v in out.items()})

        # Linear with bias and a SiLU epilogue, fp16.
        wl = (rng.standard_normal((1024, 4096)) / 64).astype(np.float16)
        b = np.zeros(1024, np.float16)
        y = client.fused_op("linear", x=x.astype(np.float16), weight=wl, bias=b, activation="silu")["y"]
        print("linear fp16:", y.shape, y.dtype)

        # Errors carry the gRPC code and a message naming the field.
        try:
            client.fused_op("rms_norm", x=x, weight=w[:10])
        except FusedServeError as e:
            print("expected error:", e.code.name, "-", e.details)


if __name__ == "__main__":
    main()
