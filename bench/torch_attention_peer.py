"""Peer times for gpu_compute_bench's attention prefill rows, measured the same
way (median of per-launch CUDA events after warm-up, and the mean of
back-to-back launches, which hides torch's host overhead on short kernels:
the lower is reported, inputs uniform in
[-1, 1) drawn in fp32 and rounded to bf16, rotated over >= 256 MB so L2 does
not flatter): torch SDPA with the cuDNN backend, causal, enable_gqa,
Hq=32 Hkv=8 D=128, B=1 and 4 at S=512/2048/8192. Also a bf16 8192^3 matmul
(torch.mm) as the ceiling measured in the same process.
FLOPs: causal attention 2*B*Hq*S^2*D (as gpu_compute_bench).
Usage: python3 torch_attention_peer.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128
ROTATE = 256 << 20


def rand(*shape):
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


def time_us(fn, iters):
    for i in range(5):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def time_b2b_us(fn, n):
    """Back-to-back launches (no host gap between them): mean per launch."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(n):
        fn(i)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / n


def main():
    x, y = rand(8192, 8192), rand(8192, 8192)
    mm_us = time_us(lambda i: torch.mm(x, y), 20)
    ceil = 2 * 8192**3 / (mm_us * 1e-6) / 1e12
    del x, y
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    print(f"bf16 matmul 8192^3: {mm_us:.1f} us, {ceil:.1f} TFLOP/s (ceiling)")
    print("| shape | impl | us | TFLOP/s | % of ceiling | timings |\n|---|---|---|---|---|---|")
    for B in (1, 4):
        for S in (512, 2048, 8192):
            set_bytes = (2 * B * S * HQ * D + 2 * B * S * HKV * D) * 2
            copies = max(1, -(-ROTATE // set_bytes))
            qs = [rand(B, HQ, S, D) for _ in range(copies)]
            ks = [rand(B, HKV, S, D) for _ in range(copies)]
            vs = [rand(B, HKV, S, D) for _ in range(copies)]
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):

                def run(i):
                    c = i % copies
                    F.scaled_dot_product_attention(qs[c], ks[c], vs[c], is_causal=True, enable_gqa=True)

                per_launch = time_us(run, 10 if S >= 8192 else 30)
                b2b = time_b2b_us(run, 10 if S >= 8192 else 100)
            us = min(per_launch, b2b)
            tf = 2.0 * B * HQ * S * S * D / (us * 1e-6) / 1e12
            print(f"| B={B} S={S} Hq=32 Hkv=8 D=128 | sdpa cudnn (enable_gqa) | {us:.2f} | {tf:.1f} | {100 * tf / ceil:.1f} "
                  f"| per-launch median {per_launch:.2f}, back-to-back mean {b2b:.2f} |")
            del qs, ks, vs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
