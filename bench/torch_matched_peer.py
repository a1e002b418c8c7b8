"""Matched-conditions comparison of the large GEMM cases: torch (cuBLASLt
through torch, torch.compile for the SwiGLU MLP) and ours
(gpu_gemm_matched_bench) timed by one method, in interleaved rounds:
  inputs: 3 rotating sets (L2 holds none across launches), uniform [-1, 1)
  drawn in fp32 and rounded to bf16 (the same distribution on both sides);
  warm-up 3 launches; "burst": 1 s idle first (boost clock), "sustained":
  2 s of back-to-back launches first (power-limited clock); timed: 30
  launches back to back between two events (b2b), then 30 each between its
  own pair of events (median).
Each round runs torch's cases in this process, then ours in a subprocess
(alternating which goes first), logging nvidia-smi clocks, power and
temperature around each. Prints per-round results and a median table.
Usage: python3 torch_matched_peer.py OURS_BINARY [ROUNDS]
"""
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ITERS = 30
SETS = 3
M, K, N = 4096, 4096, 14336
D, I = 4096, 14336


def smi():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
        return out
    except Exception as e:  # noqa: BLE001 - the log line says why
        return f"nvidia-smi failed: {e}"


def rand(*shape):
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


def time_case(fn, sustained):
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    it = 0
    if sustained:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            for _ in range(10):
                fn(it)
                it += 1
            torch.cuda.synchronize()
    else:
        time.sleep(1.0)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(ITERS):
        fn(it)
        it += 1
    b.record()
    torch.cuda.synchronize()
    b2b = a.elapsed_time(b) * 1e3 / ITERS
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(ITERS)]
    for e0, e1 in ev:
        e0.record()
        fn(it)
        it += 1
        e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in ev), b2b


def torch_cases():
    x = [rand(M, K) for _ in range(SETS)]
    w = [rand(N, K) for _ in range(SETS)]
    b = [rand(N) for _ in range(SETS)]
    xs = [rand(M, D) for _ in range(SETS)]
    gu = [rand(2 * I, D) for _ in range(SETS)]
    dn = [rand(D, I) for _ in range(SETS)]
    c8 = [(rand(8192, 8192), rand(8192, 8192)) for _ in range(SETS)]

    def swiglu(x_, gu_, dn_):
        g = F.linear(x_, gu_)
        a, u = g.chunk(2, dim=-1)
        return F.linear(F.silu(a) * u, dn_)

    compiled = torch.compile(swiglu)

    def gate(x_, gu_):
        g = F.linear(x_, gu_)
        a, u = g.chunk(2, dim=-1)
        return F.silu(a) * u

    compiled_gate = torch.compile(gate)
    lin = 2.0 * M * N * K
    sw = 2.0 * M * D * 2 * I + 2.0 * M * I * D
    return {
        "linear_gelu": (lambda i: torch._addmm_activation(b[i % SETS], x[i % SETS], w[i % SETS].t(), use_gelu=True),
                        lin),
        "swiglu_compile": (lambda i: compiled(xs[i % SETS], gu[i % SETS], dn[i % SETS]), sw),
        "gate_compile": (lambda i: compiled_gate(xs[i % SETS], gu[i % SETS]), 2.0 * M * D * 2 * I),
        "gate_gemm": (lambda i: F.linear(xs[i % SETS], gu[i % SETS]), 2.0 * M * D * 2 * I),
        "ceiling": (lambda i: torch.mm(c8[i % SETS][0], c8[i % SETS][1].t()), 2.0 * 8192 ** 3),
    }


OURS = ["linear_gelu", "swiglu_p0", "swiglu_p3", "gate_p0", "gate_p3", "gate_gemm", "ceiling"]


def main():
    ours_bin = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), flush=True)
    cases = torch_cases()
    for name, (fn, _) in cases.items():  # compile and warm up outside the rounds
        fn(0)
    torch.cuda.synchronize()
    results = {}  # (impl, case, protocol) -> [(median, b2b)]
    for r in range(rounds):
        for protocol in ("burst", "sustained"):
            order = ["torch", "ours"] if r % 2 == 0 else ["ours", "torch"]
            for who in order:
                print(f"[round {r} {protocol} {who}] smi before: {smi()}", flush=True)
                if who == "torch":
                    for name, (fn, flops) in cases.items():
                        med, b2b = time_case(fn, protocol == "sustained")
                        results.setdefault(("torch", name, protocol), []).append((med, b2b, flops))
                        print(f"RESULT impl=torch case={name} protocol={protocol} median_us={med:.2f} b2b_us={b2b:.2f} "
                              f"tflops={flops / med / 1e6:.1f}", flush=True)
                else:
                    out = subprocess.run([ours_bin, protocol] + OURS, capture_output=True, text=True)
                    sys.stdout.write(out.stdout)
                    sys.stderr.write(out.stderr)
                    for line in out.stdout.splitlines():
                        if not line.startswith("RESULT"):
                            continue
                        kv = dict(p.split("=", 1) for p in line.split()[1:])
                        med, b2b, tf = float(kv["median_us"]), float(kv["b2b_us"]), float(kv["tflops"])
                        results.setdefault(("ours", kv["case"], protocol), []).append((med, b2b, tf * med * 1e6))
                print(f"[round {r} {protocol} {who}] smi after: {smi()}", flush=True)
    print("\n| impl | case | protocol | median us (per round) | b2b us (per round) | TFLOP/s (median of medians) |")
    print("|---|---|---|---|---|---|")
    for (impl, case, protocol), v in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        meds = [m for m, _, _ in v]
        b2bs = [b for _, b, _ in v]
        mm = statistics.median(meds)
        print(f"| {impl} | {case} | {protocol} | {mm:.1f} ({', '.join(f'{m:.1f}' for m in meds)}) | "
              f"{statistics.median(b2bs):.1f} ({', '.join(f'{b:.1f}' for b in b2bs)}) | {v[0][2] / mm / 1e6:.0f} |")


if __name__ == "__main__":
    main()
