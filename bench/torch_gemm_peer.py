"""Peer times for the large GEMM cases of gpu_compute_bench, measured the same
way (median of per-launch CUDA events, inputs random in [-1, 1), bf16), so
the two can run side by side in one lease:
  linear+GELU  M=4096 K=4096 N=14336  torch._addmm_activation (cuBLASLt GELU_BIAS epilogue)
  linear       the same without bias and GELU (torch.mm)
  swiglu_mlp   M=4096 D=4096 I=14336  eager (gate_up GEMM, silu * up, down GEMM) and torch.compile
Also prints the cuBLAS kernels torch launches for them (torch.profiler) and
the cuBLAS library torch loaded.
Inputs: --data full (default): uniform [-1, 1) drawn in fp32 and rounded to
bf16, as gpu_compute_bench's; --data torch: torch.rand(dtype=bfloat16) * 2 - 1,
multiples of 2^-7, on which tensor cores draw less power and GEMMs run faster.
Clock state: a 0.5 GFLOP GEMM run for a few milliseconds after an idle spell
runs at boost clock, ~12-15% faster than once the GPU sits at its power limit
(gpu_compute_bench times each case over ~0.3 s of sustained launches).
--preheat S runs the op back to back for S seconds before timing, so the
peer is measured in the same sustained state (default 0: a short burst).
Usage: python3 torch_gemm_peer.py [--no-compile] [--data full|torch] [--preheat S]
"""
import glob
import os
import sys

import torch
import torch.nn.functional as F

ITERS = 30


COARSE = "--data" in sys.argv and sys.argv[sys.argv.index("--data") + 1] == "torch"


def rand(*shape):
    if COARSE:
        return torch.rand(*shape, device="cuda", dtype=torch.bfloat16) * 2 - 1
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


PREHEAT = float(sys.argv[sys.argv.index("--preheat") + 1]) if "--preheat" in sys.argv else 0.0


def time_us(fn, iters=ITERS):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if PREHEAT > 0:
        import time

        end = time.monotonic() + PREHEAT
        while time.monotonic() < end:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) * 1e3 for a, b in ev)
    # Back to back: iters launches between two events.
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return t[len(t) // 2], a.elapsed_time(b) * 1e3 / iters


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.name not in names:
            names.append(e.name)
    return names


def main():
    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(),
          "data", "torch.rand(bf16)*2-1" if COARSE else "uniform [-1, 1) in fp32 -> bf16", "preheat", PREHEAT, "s")
    libs = sorted(set(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**", "libcublasLt.so*"),
                                recursive=True)))
    print("torch cublasLt libraries:", [os.path.realpath(p) for p in libs])
    M, K, N = 4096, 4096, 14336
    x, w, b = rand(M, K), rand(N, K), rand(N)
    flops = 2.0 * M * N * K
    for name, fn in [
        ("linear+gelu_tanh addmm_activation", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
        ("linear plain mm", lambda: torch.mm(x, w.t())),
        ("linear F.linear+bias", lambda: F.linear(x, w, b)),
    ]:
        med, b2b = time_us(fn)
        print(f"{name:40s} M={M} K={K} N={N}: {med:8.2f} us ({flops / med / 1e6:.0f} TFLOP/s), back to back {b2b:8.2f} us")
        print("   kernels:", kernels(fn))

    D, I = 4096, 14336
    xs, gu, down = rand(M, D), rand(2 * I, D), rand(D, I)

    def swiglu():
        g = F.linear(xs, gu)
        a, u = g.chunk(2, dim=-1)
        return F.linear(F.silu(a) * u, down)

    sflops = 2.0 * M * D * 2 * I + 2.0 * M * I * D
    med, b2b = time_us(swiglu)
    print(f"{'swiglu_mlp eager':40s} M={M} D={D} I={I}: {med:8.2f} us ({sflops / med / 1e6:.0f} TFLOP/s), b2b {b2b:8.2f} us")
    if "--no-compile" not in sys.argv:
        try:
            c = torch.compile(swiglu)
            med, b2b = time_us(c)
            print(f"{'swiglu_mlp torch.compile':40s} M={M} D={D} I={I}: {med:8.2f} us "
                  f"({sflops / med / 1e6:.0f} TFLOP/s), b2b {b2b:8.2f} us")
            print("   kernels:", kernels(c))
        except Exception as e:  # noqa: BLE001 - a peer that fails to compile is reported, not fatal
            print("torch.compile failed:", e)


if __name__ == "__main__":
    main()
