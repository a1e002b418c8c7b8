#!/usr/bin/env python3
"""Per-kernel time and gaps of decode steps from a cupti_trace CSV.
usage: steps.py CSV LABEL [LABEL...]  (labels of the bench's step groups in order, 55 steps each)
Steps = runs of kernels separated by > 15 us idle; only steps with >= 60 kernels.
The last len(labels)*55 such steps are the bench's; the first 5 of each group are warm-up."""
import re, sys, statistics as st

def short(m):
    if not m.startswith('_Z'):
        return m[:40]
    i = m.find('N', 2)
    if i < 0:
        return m[:40]
    i += 1; parts = []
    while i < len(m) and m[i].isdigit():
        j = i
        while m[j].isdigit(): j += 1
        n = int(m[i:j]); parts.append(m[j:j+n]); i = j + n
    tail = m[i:i+40]
    # template args: first few ints (Li1E -> 1) and bools (Lb1E)
    args = re.findall(r'L[bi](\d+)E', tail)
    t = 'bf16' if '__nv_bfloat16' in m else ('f16' if '6__half' in m else ('f32' if 'IfL' in tail else ''))
    return (parts[-1] if parts else m[:30]) + ('<' + ','.join([t] + args[:3]) + '>' if (t or args) else '')

db, labels = sys.argv[1], sys.argv[2:]
rows = []
for line in open(db):
    a = line.rstrip('\n').split(',', 4)
    rows.append((int(a[0]), int(a[1]), short(a[4]), int(a[2])))
rows.sort()
steps, cur, last_end = [], [], None
for r in rows:
    if last_end is not None and r[0] - last_end > 15000:
        steps.append(cur); cur = []; last_end = None
    cur.append(r); last_end = r[1] if last_end is None else max(last_end, r[1])
if cur: steps.append(cur)
steps = [s for s in steps if len(s) >= 40]
n = len(labels) * 55
steps = steps[-n:]
print(f"{len(steps)} bench steps found")
for gi, lab in enumerate(labels):
    g = steps[gi*55+5:(gi+1)*55]
    if not g: continue
    nk = st.mode([len(s) for s in g])
    same = [s for s in g if len(s) == nk]
    span = st.median([(max(k[1] for k in s) - s[0][0]) / 1e3 for s in same])
    print(f"\n== {lab}: {nk} kernels/step, GPU span median {span:.1f} us ({len(same)} steps)")
    agg = {}
    for s in same:
        per = {}
        front = s[0][0]
        for i, k in enumerate(s):
            inc = max(0, k[1] - front) / 1e3  # how far this kernel moves the step's end
            front = max(front, k[1])
            d = per.setdefault(k[2], [0, 0.0, 0.0])
            d[0] += 1; d[1] += (k[1]-k[0])/1e3; d[2] += inc
        for nm, d in per.items():
            agg.setdefault(nm, []).append(d)
    tot_d = tot_g = 0
    first_grid = {}
    for k in same[0]: first_grid.setdefault(k[2], k[3])
    print(f"{'kernel (incr = critical-path us)':44s} {'n':>4s} {'dur_us':>8s} {'incr_us':>8s} {'incr/ea':>8s} {'grid':>6s}")
    for nm, ds in sorted(agg.items(), key=lambda kv: -st.median([d[2] for d in kv[1]])):
        cnt = ds[0][0]; dur = st.median([d[1] for d in ds]); gap = st.median([d[2] for d in ds])
        tot_d += dur; tot_g += gap
        print(f"{nm[:44]:44s} {cnt:4d} {dur:8.1f} {gap:8.1f} {gap/cnt:8.2f} {first_grid.get(nm,0):6d}")
    print(f"{'sum (dur includes PDL waits)':44s} {'':4s} {tot_d:8.1f} {tot_g:8.1f}")
    s = same[len(same)//2]
    per_layer = (nk - 6) // 16
    print(f"one mid layer of the median step (dur / start-to-prev-end / end-to-prev-end, us), ~{per_layer} kernels:")
    start = 2 + per_layer * 7
    for i in range(start, min(start + per_layer + 1, nk)):
        k = s[i]
        print(f"   {k[2][:44]:44s} {(k[1]-k[0])/1e3:7.2f} {(k[0]-s[i-1][1])/1e3:7.2f} {(k[1]-s[i-1][1])/1e3:7.2f} grid {k[3]}")
    print("   last kernels:")
    for i in range(nk - 4, nk):
        k = s[i]
        print(f"   {k[2][:44]:44s} {(k[1]-k[0])/1e3:7.2f} {(k[0]-s[i-1][1])/1e3:7.2f} {(k[1]-s[i-1][1])/1e3:7.2f} grid {k[3]}")
