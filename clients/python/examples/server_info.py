#!/usr/bin/env python3
"""Prints what a fusedserve server runs: health, device, model, ops, tuning cache.

    python examples/server_info.py --target localhost:50051
"""
import argparse

from fusedserve_client import FusedServeClient, pb


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="localhost:50051")
    args = ap.parse_args()
    with FusedServeClient(args.target) as client:
        print("health:", client.health())
        info = client.server_info()
        print(f"fusedserve {info.version} on {info.device} ({info.device_name})")
        m = info.model
        if m.hidden_size:
            print(f"model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, heads {m.num_q_heads}/{m.num_kv_heads}, "
                  f"vocab {m.vocab_size}, {pb.DType.Name(m.dtype)}")
        for op in info.ops:
            dtypes = ", ".join(pb.DType.Name(d) for d in op.dtypes)
            print(f"  {op.name}({', '.join(op.inputs)}) -> {', '.join(op.outputs)}  [{dtypes}]")
        tc = info.tuning_cache
        print(f"tuning cache {tc.path}: {tc.state}, {tc.entries} entries, {tc.hits} hits, {tc.misses} misses")


if __name__ == "__main__":
    main()
