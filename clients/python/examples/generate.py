#!/usr/bin/env python3
"""Streams generated token ids from a fusedserve server.

    python examples/generate.py --target localhost:50051 --prompt 128000 791 6864 --max-new-tokens 32
"""
import argparse
import sys

from fusedserve_client import FusedServeClient, FusedServeError


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="localhost:50051")
    ap.add_argument("--prompt", type=int, nargs="+", default=[1, 2, 3], help="prompt token ids")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    with FusedServeClient(args.target) as client:
        client.wait_until_serving(timeout=600)
        stream = client.generate(args.prompt, max_new_tokens=args.max_new_tokens,
                                 temperature=args.temperature, top_k=args.top_k,
                                 top_p=args.top_p, seed=args.seed)
        try:
            for token in stream:  # tokens arrive as they are generated
                print(token, end=" ", flush=True)
        except FusedServeError as e:
            print(f"\n{e}", file=sys.stderr)
            return 1
        print()
        s = stream.stats
        print(f"{s.generated_tokens} tokens ({s.finish_reason}); TTFT {s.time_to_first_token_seconds * 1e3:.1f} ms; "
              f"{s.time_per_output_token_seconds * 1e3:.2f} ms/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
