#!/usr/bin/env python3
"""Per-kernel time of one llama-3-8b prefill layer from a cupti_trace CSV of
`FS_BENCH=8b gpu_model_bench` (bench/tools/cupti_trace.cc). The bench runs
1-layer and 2-layer Forwards alternately; a Forward ends at its argmax
kernel, and a prefill Forward is one with flash-attention kernels (1 or 2 of
them: the layer count). A layer is the 2-layer Forward less the 1-layer one
beside it: per kernel name (with its grid size), the median of those
differences, and the GPU span of the difference, over the first and the last
N pairs (boost clock, then the power-limited clock of sustained load).
Usage: layer_kernels.py trace.csv [N=8]"""
import collections
import re
import statistics
import sys

path = sys.argv[1]
n_pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 8


def short(name):
    if name.startswith("nvjet") or name.startswith("sm90"):
        return name[:48]
    m = re.search(r"\d+([A-Z][A-Za-z0-9]+Kernel)", name)
    return m.group(1) if m else name[:48]


rows = []
with open(path) as f:
    for line in f:
        p = line.rstrip("\n").split(",", 4)
        if len(p) == 5 and p[0].isdigit():
            rows.append((int(p[0]), int(p[1]), int(p[2]), p[4]))
rows.sort()
forwards, cur = [], []
for r in rows:
    cur.append(r)
    if "Argmax" in r[3]:
        forwards.append(cur)
        cur = []
prefill = [f for f in forwards if 1 <= sum("Flash" in r[3] for r in f) <= 2]
pairs = []
for a, b in zip(prefill, prefill[1:]):
    la, lb = (sum("Flash" in r[3] for r in x) for x in (a, b))
    if la == 1 and lb == 2:
        pairs.append((a, b))
print(f"{len(forwards)} Forwards, {len(prefill)} prefill ones, {len(pairs)} (1-layer, 2-layer) pairs")


def per_kernel(fw):
    c = collections.Counter()
    for s, e, grid, name in fw:
        c[f"{short(name)} [{grid}]"] += (e - s) / 1e3
    return c


for label, sel in (("first", pairs[1:1 + n_pairs]), ("last", pairs[-n_pairs:])):
    if not sel:
        continue
    diff = collections.defaultdict(list)
    spans = []
    for one, two in sel:
        c1, c2 = per_kernel(one), per_kernel(two)
        for k in set(c1) | set(c2):
            diff[k].append(c2[k] - c1[k])
        spans.append(((two[-1][1] - two[0][0]) - (one[-1][1] - one[0][0])) / 1e3)
    print(f"{label} {len(sel)} pairs: layer span {statistics.median(spans):.1f} us (GPU time, median)")
    total = 0.0
    for k, v in sorted(diff.items(), key=lambda kv: -statistics.median(kv[1])):
        m = statistics.median(v)
        if abs(m) >= 0.5:
            total += m
            print(f"  {m:8.1f} us  {k}")
    print(f"  {total:8.1f} us  sum of kernel times")
