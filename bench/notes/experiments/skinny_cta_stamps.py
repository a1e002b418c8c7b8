#!/usr/bin/env python3
"""Per-CTA globaltimer stamps of the Hopper skinny kernel (scratch build) -> a per-launch timeline.
Stamps: 0 entry, 1 producer past the PDL wait, 2 first stage full (consumer), 3 mainloop end,
4 after the cluster sync, 5 epilogue end; 6 = smid. Times in us relative to the launch's first wait release."""
import sys, statistics as st
slots, cur = [], None
for line in open(sys.argv[1]):
    if line.startswith('slot'):
        kv = dict(x.split('=') for x in line.split()[2:])
        cur = {'info': kv, 'ctas': []}; slots.append(cur)
    else:
        a = [int(x) for x in line.split()]
        cur['ctas'].append(a[1:])
want_m = sys.argv[2] if len(sys.argv) > 2 else '16'
sel = [s for s in slots if s['info']['M'] == want_m and all(c[0] > 0 for c in s['ctas'])]
# the last graph's launches: take the last 70
sel = sel[-int(sys.argv[3] if len(sys.argv) > 3 else 12):]
prev_end = None
print("kind N K ranks ctas | entry min/max | wait min/max | first-full med/max | loop-end med/max | sync max | epi-end med/max | gap prev-end->wait")
for s in sel:
    c = s['ctas']; w0 = min(x[1] for x in c)
    r = lambda i: [(x[i] - w0) / 1e3 for x in c]
    e, w, f, l, y, p = r(0), r(1), r(2), r(3), r(4), r(5)
    i = s['info']
    gap = (w0 - prev_end) / 1e3 if prev_end else float('nan')
    print(f"{'swi' if i['swiglu']=='1' else 'pln'} {i['N']:>5} {i['K']:>5} {i['ranks']} {len(c):3d} | "
          f"{min(e):6.2f} {max(e):6.2f} | {min(w):5.2f} {max(w):5.2f} | {st.median(f):5.2f} {max(f):5.2f} | "
          f"{st.median(l):5.2f} {max(l):5.2f} | {max(y):5.2f} | {st.median(p):5.2f} {max(p):5.2f} | {gap:6.2f}")
    prev_end = max(x[5] for x in c)
