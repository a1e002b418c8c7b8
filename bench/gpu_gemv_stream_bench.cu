// How fast the decode step's GEMV streams its weights, against a bare
// stream of the same bytes. (The 1B decode step's one-row down projection,
// [2048, 8192], streamed at 59% of copy bandwidth on the H200 while a bare
// stream of it reaches 87%: bench/notes/decode_fusion.md, fifteenth session.)
//
// The probe kernel is the product GEMV's streaming core (gemv.cu) and
// nothing else: a warp owns two rows, `split` warps share them (each every
// split-th 2 KB chunk of a row), four 16-byte evict-first loads a row in
// flight per lane, x read through L1, the PDL wait after the first loads.
// (Walking the rows from rotated starting chunks, or the same bytes as
// [8192, 2048] or [1024, 16384], made no difference to it.) Beside it, the
// product on the 1B decode shapes: the fused GEMV (LaunchGemvFused) plain,
// with the residual, with the residual and the next norm's epilogue (down's
// and o_proj's form), at one row, and at two and four rows the GEMV and the
// register skinny GEMM (LaunchSkinnyGemmFused) with that epilogue, launched
// as the model launches them (programmatic dependent launch).
// Each probe split is also run capped at 4 blocks an SM (dynamic shared
// memory), and one launch of each counts its blocks per SM (%smid): the cap
// made the same grid faster though the blocks spread alike (gemv.cu's
// kGemvSmBlocksCap).
// Each launch reads a cold copy of the weights (copies rotate, 8x the largest
// matrix in all); one pass over the copies is one CUDA graph, replayed, as
// the model's decode step is, so host launch costs do not count.
//
//   gpu_gemv_stream_bench    us, GB/s of the weight bytes and % of the device-to-device
//                            copy bandwidth measured first (FS_QUICK=1: down only, for ncu;
//                            FS_SHAPES=8b: llama-3-8b's shapes instead of the 1B model's)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/skinny_gemm.h"

constexpr int kWarps = 4, kUnroll = 4;

__device__ __forceinline__ float Dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    s = fmaf(fa.x, fb.x, fmaf(fa.y, fb.y, s));
  }
  return s;
}

__global__ void __launch_bounds__(kWarps * 32, 7)
    StreamKernel(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int N,
                 int K, int split, unsigned* sm_blocks) {
  if (sm_blocks != nullptr && threadIdx.x == 0) {  // where the blocks ran (one untimed launch)
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    atomicAdd(sm_blocks + smid, 1u);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slice = warp % split;
  const int unit = blockIdx.x * (kWarps / split) + warp / split;
  if (2 * unit >= N) return;
  const int nvec = K / 8;
  const int chunk = 32 * kUnroll;            // vectors a warp loads a row per step
  const int steps = nvec / (chunk * split);  // K a multiple of 1024 * split here
  const uint4* w0 = reinterpret_cast<const uint4*>(w + static_cast<size_t>(2 * unit) * K);
  const uint4* w1 = reinterpret_cast<const uint4*>(w + static_cast<size_t>(2 * unit + 1) * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float a0 = 0.0f, a1 = 0.0f;
  for (int s = 0; s < steps; ++s) {
    const int base = (s * split + slice) * chunk + lane;
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      a[u] = __ldcs(w0 + base + 32 * u);
      b[u] = __ldcs(w1 + base + 32 * u);
    }
    if (s == 0) {
      // No-ops unless launched as a programmatic dependent; then, as in the
      // product, the first loads go out during the previous launch's tail.
      asm volatile("griddepcontrol.wait;\n" ::: "memory");
      asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4 xx = __ldg(xv + base + 32 * u);
      a0 += Dot8(a[u], xx);
      a1 += Dot8(b[u], xx);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    a0 += __shfl_xor_sync(0xffffffffu, a0, o);
    a1 += __shfl_xor_sync(0xffffffffu, a1, o);
  }
  if (lane == 0) {  // the split's slices add atomically: the probe times the stream, not the merge
    atomicAdd(y + 2 * unit, a0);
    atomicAdd(y + 2 * unit + 1, a1);
  }
}

// smem: dynamic shared memory that caps the blocks an SM holds (0: none).
void LaunchProbe(cudaStream_t stream, int blocks, bool pdl, const __nv_bfloat16* w, const __nv_bfloat16* x, float* y,
                 int N, int K, int split, size_t smem = 0, unsigned* sm_blocks = nullptr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.dynamicSmemBytes = smem;
  cfg.blockDim = dim3(kWarps * 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  BENCH_CHECK(cudaLaunchKernelEx(&cfg, StreamKernel, w, x, y, N, K, split, sm_blocks));
}

// Elements of each activation buffer: 4 rows of the widest matrix.
constexpr size_t kAct = 4 * 32768;
constexpr int kMaxSms = 256;

struct Shape {
  int N, K;
};

int main() {
  namespace fc = fusedserve::cuda;
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // FS_QUICK=1: the down shape only, one timed replay (for ncu).
  const bool quick = std::getenv("FS_QUICK") != nullptr;
  // down, o_proj, QKV and gate_up (as one plain matrix) of the 1B model, or
  // with FS_SHAPES=8b of llama-3-8b.
  const char* shapes_env = std::getenv("FS_SHAPES");
  const bool llama8b = shapes_env != nullptr && std::string(shapes_env) == "8b";
  const std::vector<Shape> shapes = llama8b
                                        ? std::vector<Shape>{{4096, 14336}, {4096, 4096}, {6144, 4096}, {28672, 4096}}
                                        : std::vector<Shape>{{2048, 8192}, {2048, 2048}, {3072, 2048}, {16384, 2048}};
  const int quick_k = shapes[0].K;
  size_t bytes = 0;  // the largest matrix (gate_up)
  for (Shape sh : shapes) bytes = std::max(bytes, static_cast<size_t>(sh.N) * sh.K * 2);
  const int copies = 8;               // every launch reads a cold copy (537 MB for the 1B shapes, 1.9 GB for 8B)
  const int passes = quick ? 1 : 20;  // graph replays timed (median)
  __nv_bfloat16 *w = nullptr, *x = nullptr, *res = nullptr, *gnext = nullptr, *nout = nullptr, *yb = nullptr;
  float* y = nullptr;
  unsigned long long* sq = nullptr;
  BENCH_CHECK(cudaMalloc(&w, bytes * copies));
  BENCH_CHECK(cudaMalloc(&x, kAct * 2));
  BENCH_CHECK(cudaMalloc(&y, kAct * 4));
  BENCH_CHECK(cudaMalloc(&yb, kAct * 2));
  BENCH_CHECK(cudaMalloc(&res, kAct * 2));
  BENCH_CHECK(cudaMalloc(&gnext, kAct * 2));
  BENCH_CHECK(cudaMalloc(&nout, kAct * 2));
  BENCH_CHECK(cudaMalloc(&sq, 16 * 8));
  unsigned* sm_blocks = nullptr;
  BENCH_CHECK(cudaMalloc(&sm_blocks, kMaxSms * sizeof(unsigned)));
  BENCH_CHECK(cudaMemset(w, 0x3c, bytes * copies));
  for (void* p : {static_cast<void*>(x), static_cast<void*>(res), static_cast<void*>(gnext)})
    BENCH_CHECK(cudaMemset(p, 0x3c, kAct * 2));
  BENCH_CHECK(cudaMemset(sq, 0, 16 * 8));
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t cap4 = 0;  // dynamic shared memory beside which a fifth block does not fit
  if (fusedserve::CudaStatus s = fc::SharedMemoryForBlockCap(4, &cap4); !s.ok() || cap4 == 0) {
    std::fprintf(stderr, "no shared-memory block cap: %s\n", s.message.c_str());
    return 1;
  }
  // Microseconds a launch: one graph of `copies` launches (launch(stream, i)
  // reads copy i), replayed (bench_common.h's GraphReplayUs).
  auto time_us = [&](auto&& launch) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < copies; ++i) launch(stream, i);
    BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double us = fusedserve::bench::GraphReplayUs(stream, exec, copies, passes);
    BENCH_CHECK(cudaGraphExecDestroy(exec));
    BENCH_CHECK(cudaGraphDestroy(graph));
    return us;
  };

  // The ceiling: device-to-device copy bandwidth (read + write counted).
  const double copy_gbs = fusedserve::bench::CopyBandwidthGBs(stream);
  std::printf("copy: %.0f GB/s (read + write)\n", copy_gbs);
  std::printf("%-6s %-6s %-32s %9s %8s %6s\n", "N", "K", "kernel", "us", "GB/s", "%copy");
  for (Shape sh : shapes) {
    if (quick && sh.K != quick_k) continue;
    const size_t mbytes = static_cast<size_t>(sh.N) * sh.K * 2;
    const size_t stride = bytes / 2;  // elements between copies
    auto row = [&](const char* name, double us) {
      const double gbs = mbytes / (us * 1e-6) / 1e9;
      std::printf("%-6d %-6d %-32s %9.2f %8.0f %5.1f%%\n", sh.N, sh.K, name, us, gbs, 100.0 * gbs / copy_gbs);
    };
    for (int split : {1, 2, 4}) {
      if (sh.K / 8 % (128 * split) != 0) continue;  // the probe streams whole chunks only
      const int blocks = (sh.N / 2 * split + kWarps - 1) / kWarps;
      for (bool pdl : {false, true}) {
        char name[64];
        std::snprintf(name, sizeof(name), "probe split %d%s", split, pdl ? " pdl" : "");
        row(name, time_us([&](cudaStream_t st, int i) {
              LaunchProbe(st, blocks, pdl, w + i * stride, x, y, sh.N, sh.K, split);
            }));
      }
      // The same grid with at most 4 blocks an SM (the GEMV's cap), and how
      // the blocks spread over the SMs without and with it (alike, 3-4 an SM
      // for a grid below the resident capacity: the cap's gain is not where
      // the blocks go).
      row("probe 4 blocks/SM cap", time_us([&](cudaStream_t st, int i) {
            LaunchProbe(st, blocks, false, w + i * stride, x, y, sh.N, sh.K, split, cap4);
          }));
      for (size_t smem : {size_t{0}, cap4}) {
        BENCH_CHECK(cudaMemsetAsync(sm_blocks, 0, kMaxSms * sizeof(unsigned), stream));
        LaunchProbe(stream, blocks, false, w, x, y, sh.N, sh.K, split, smem, sm_blocks);
        unsigned h[kMaxSms];
        BENCH_CHECK(cudaMemcpyAsync(h, sm_blocks, sizeof(h), cudaMemcpyDeviceToHost, stream));
        BENCH_CHECK(cudaStreamSynchronize(stream));  // a non-blocking stream: not ordered with the legacy one
        unsigned lo = ~0u, hi = 0, used = 0;
        for (int i = 0; i < sms && i < kMaxSms; ++i) {
          lo = std::min(lo, h[i]);
          hi = std::max(hi, h[i]);
          used += h[i] != 0;
        }
        std::printf("       probe split %d%s: %d blocks, %u-%u an SM, %u of %d SMs\n", split, smem ? " capped" : "",
                    blocks, lo, hi, used, sms);
      }
    }
    // The product at M rows: the GEMV, or the register skinny GEMM (the
    // default for 2-8 row decode steps).
    auto product = [&](const char* name, int M, bool skinny, const fc::GemvFusion& f) {
      char label[64];
      std::snprintf(label, sizeof(label), "%s M=%d", name, M);
      row(label, time_us([&](cudaStream_t st, int i) {
            const fusedserve::DType dt = fusedserve::DType::kBF16;
            fusedserve::CudaStatus s = skinny
                                           ? fc::LaunchSkinnyGemmFused(dt, M, sh.N, sh.K, x, w + i * stride, yb, f, st)
                                           : fc::LaunchGemvFused(dt, M, sh.N, sh.K, x, w + i * stride, yb, f, st);
            if (!s.ok()) {
              std::fprintf(stderr, "%s\n", s.message.c_str());
              std::exit(1);
            }
          }));
    };
    fc::GemvFusion fr;
    fr.residual = res;
    fc::GemvFusion fn = fr;
    fn.norm_next = gnext;
    fn.norm_out = nout;
    fn.sq_out = sq;
    fn.sq_clear = sq + 8;
    product("product plain", 1, false, fc::GemvFusion{});
    product("product residual", 1, false, fr);
    product("product residual+next norm", 1, false, fn);
    if (quick) continue;
    for (int M : {2, 4}) {
      product("GEMV residual+next norm", M, false, fn);
      product("skinny residual+next norm", M, true, fn);
    }
  }
  std::printf("SMs %d\n", sms);
  return 0;
}
