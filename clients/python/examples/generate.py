#!/usr/bin/env python3
"""Streams generated text (or token ids) from a fusedserve server.

    python examples/generate.py --target localhost:50051 --prompt "Once upon a time" --max-new-tokens 32
    python examples/generate.py --chat "Name three colours."
    python examples/generate.py --ids 128000 791 6864
"""
import argparse
import sys

from fusedserve_client import FusedServeClient, FusedServeError


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="localhost:50051")
    ap.add_argument("--prompt", default="Once upon a time", help="prompt text")
    ap.add_argument("--chat", help="a user message, sent as chat turns instead of --prompt")
    ap.add_argument("--ids", type=int, nargs="+", help="prompt token ids instead of text")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    args = ap.parse_args()

    with FusedServeClient(args.target) as client:
        client.wait_until_serving(timeout=600)
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, stop=args.stop)
        if args.chat:
            stream = client.chat([{"role": "user", "content": args.chat}], **kw)
        else:
            stream = client.generate(args.ids if args.ids else args.prompt, **kw)
        try:
            for item in stream:  # text pieces (or ids) as they are generated
                print(item, end="" if isinstance(item, str) else " ", flush=True)
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
