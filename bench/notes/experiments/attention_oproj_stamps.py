#!/usr/bin/env python3
"""Per-CTA stamps of the attention + o_proj scratch kernel: 0 entry, 1 wait released,
2 attention done (all warps), 3 thread 0's tile copies done, 4 tile + outputs ready (all),
5 partials stored (all), 6 counter back, 7 epilogue end (last CTA of a row block); 8 smid.
us relative to the launch's first wait release; the last N slots (graph nodes)."""
import sys, statistics as st
slots, cur = [], None
for line in open(sys.argv[1]):
    if line.startswith('slot'):
        cur = []; slots.append(cur)
    else:
        cur.append([int(x) for x in line.split()[1:]])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
sel = [s for s in slots if all(c[0] > 0 and c[1] > 0 for c in s)][-n:]
names = ['entry', 'wait', 'attn', 'tile0', 'ready', 'stored', 'counted']
rows = []
for s in sel:
    w0 = min(c[1] for c in s)
    row = []
    for i in range(7):
        v = [(c[i] - w0) / 1e3 for c in s]
        row += [st.median(v), max(v)]
    ep = [(c[7] - w0) / 1e3 for c in s if c[7] > 0]
    row += [st.median(ep) if ep else float('nan'), max(ep) if ep else float('nan'), len(ep)]
    rows.append(row)
print(f"{len(sel)} launches; per stamp median / max over CTAs, then the median over launches (us)")
hdr = ' '.join(f"{nm:>13s}" for nm in names) + '   epilogue-end med/max (n)'
print(hdr)
for r in rows:
    print(' '.join(f"{r[2*i]:6.2f}/{r[2*i+1]:6.2f}" for i in range(7)) + f"   {r[14]:6.2f}/{r[15]:6.2f} ({r[16]})")
med = [st.median([r[k] for r in rows]) for k in range(16)]
print('median: ' + ' '.join(f"{med[2*i]:6.2f}/{med[2*i+1]:6.2f}" for i in range(7)) + f"   {med[14]:6.2f}/{med[15]:6.2f}")
