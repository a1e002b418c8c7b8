// The GPU's floor under a small FusedOp: how long one tiny op takes from the
// host thread that has its inputs to the host thread seeing its outputs,
// without gRPC or the backend's bookkeeping. Host clock, p50/p99/min of
// `iterations` round trips each:
//   setdevice         cudaSetDevice alone (host only); getdevice likewise
//   launch+query      empty kernel, cudaStreamQuery spin (the launch floor)
//   launch+sync       empty kernel, cudaStreamSynchronize (the driver's wait)
//   zc+query          rms_norm of one bf16 row read from and written to
//                     mapped pinned memory (zero-copy, the backend's path)
//   zc+flag           the same, but the host spins on a flag the kernel sets
//                     in mapped memory after its stores (no driver call)
//   zc1+query         zero-copy, the row held in registers: every load of x
//                     and w issued at once (one PCIe round trip, as the
//                     backend's NormKernel); zc+query reads x twice
//   zc1+memop         zc1, then the stream writes a flag into mapped memory
//                     (cuStreamWriteValue32) that the host spins on
//   param+query       x and w travel in the launch's parameters (16 KiB,
//                     CUDA 12.1+), y written to mapped memory: no PCIe read
//   param-copy+q      a kernel copies the parameters to device memory, then
//                     the zc1 kernel reads them there (a generic H2D for any op)
//   norm+query        the backend's own rms_norm kernel (cuda::LaunchNorm,
//                     default config, PDL attribute as the backend launches
//                     it unless FUSEDSERVE_PDL=0), zero-copy
//   norm+memop        the same, completion through the stream's flag write
//   copy+query        H2D copy, the kernel on device memory, D2H copy
//   resident          a kernel resident on one SM polls a doorbell in mapped
//                     memory, runs the row and raises a done counter: no
//                     launch at all (the floor of any launch-free design)
//   gpu_roundtrip_bench [iterations] [cols]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/cuda/norm.h"

namespace {

constexpr int kThreads = 256;

__device__ float BlockSum(float v) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0;
  for (int w = 0; w < kThreads / 32; ++w) s += part[w];
  __syncthreads();
  return s;
}

// One row of rms_norm: 16-byte loads, one pass over x and w.
__device__ void RmsRow(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int cols) {
  float ss = 0;
  for (int c = threadIdx.x * 8; c < cols; c += kThreads * 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + c);
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
    for (int k = 0; k < 8; ++k) ss += __bfloat162float(h[k]) * __bfloat162float(h[k]);
  }
  const float inv = rsqrtf(BlockSum(ss) / cols + 1e-5f);
  for (int c = threadIdx.x * 8; c < cols; c += kThreads * 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + c);
    const uint4 g = *reinterpret_cast<const uint4*>(w + c);
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
    const __nv_bfloat16* gh = reinterpret_cast<const __nv_bfloat16*>(&g);
    uint4 o;
    __nv_bfloat16* oh = reinterpret_cast<__nv_bfloat16*>(&o);
    for (int k = 0; k < 8; ++k) oh[k] = __float2bfloat16(__bfloat162float(h[k]) * inv * __bfloat162float(gh[k]));
    *reinterpret_cast<uint4*>(y + c) = o;
  }
}

__global__ void Empty() {}

// One row of kCols in registers: all loads first (one round trip), then the
// statistics and the output.
constexpr int kCols = 4096;
constexpr int kVecs = kCols / 8 / kThreads;  // 16-byte vectors of x (and of w) a thread
__device__ void RmsRowRegs(const uint4* x, const uint4* w, uint4* y) {
  uint4 v[kVecs], g[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    v[i] = x[threadIdx.x + i * kThreads];
    g[i] = w[threadIdx.x + i * kThreads];
  }
  float ss = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v[i]);
    for (int k = 0; k < 8; ++k) ss += __bfloat162float(h[k]) * __bfloat162float(h[k]);
  }
  const float inv = rsqrtf(BlockSum(ss) / kCols + 1e-5f);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v[i]);
    const __nv_bfloat16* gh = reinterpret_cast<const __nv_bfloat16*>(&g[i]);
    uint4 o;
    __nv_bfloat16* oh = reinterpret_cast<__nv_bfloat16*>(&o);
    for (int k = 0; k < 8; ++k) oh[k] = __float2bfloat16(__bfloat162float(h[k]) * inv * __bfloat162float(gh[k]));
    y[threadIdx.x + i * kThreads] = o;
  }
}

__global__ void RmsRegsKernel(const uint4* x, const uint4* w, uint4* y) { RmsRowRegs(x, w, y); }

// x then w, as the launch's parameters.
struct RowParams {
  uint4 xw[2 * kCols / 8];
};
static_assert(sizeof(RowParams) <= 32764, "CUDA 12.1's parameter limit");
__global__ void RmsParamKernel(const __grid_constant__ RowParams p, uint4* y) { RmsRowRegs(p.xw, p.xw + kCols / 8, y); }
__global__ void CopyParamKernel(const __grid_constant__ RowParams p, uint4* dst) {
  for (int i = threadIdx.x; i < 2 * kCols / 8; i += kThreads) dst[i] = p.xw[i];
}

__global__ void RmsKernel(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int cols,
                          volatile unsigned* flag, unsigned seq) {
  RmsRow(x, w, y, cols);
  if (flag != nullptr) {
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *flag = seq;
  }
}

// Resident: waits for doorbell == seq, runs the row, sets done = seq; stops on seq 0.
__global__ void ResidentKernel(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int cols,
                               volatile unsigned* doorbell, volatile unsigned* done) {
  __shared__ unsigned seq;
  for (unsigned expect = 1;; ++expect) {
    if (threadIdx.x == 0) {
      unsigned s;
      while ((s = *doorbell) != expect && s != 0u) {
      }
      seq = s;
    }
    __syncthreads();
    if (seq == 0u) return;
    __threadfence_system();  // the doorbell's inputs are visible after it
    RmsRow(x, w, y, cols);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *done = seq;
  }
}

void SpinQuery(cudaStream_t st) {
  cudaError_t e;
  while ((e = cudaStreamQuery(st)) == cudaErrorNotReady) {
  }
  BENCH_CHECK(e);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int cols = argc > 2 ? std::atoi(argv[2]) : 4096;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  BENCH_CHECK(cudaSetDevice(0));
  cudaStream_t st;
  BENCH_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t row = cols * sizeof(__nv_bfloat16);
  // Host side: x, w, y and two flags in one mapped pinned block, as the backend's staging.
  char* host = nullptr;
  BENCH_CHECK(cudaHostAlloc(&host, 3 * row + 256, cudaHostAllocMapped));
  char* host_dev = nullptr;
  BENCH_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0));
  auto* hx = reinterpret_cast<__nv_bfloat16*>(host);
  auto* hw = reinterpret_cast<__nv_bfloat16*>(host + row);
  auto* hy = reinterpret_cast<__nv_bfloat16*>(host + 2 * row);
  auto* flags = reinterpret_cast<volatile unsigned*>(host + 3 * row);
  auto* dx = reinterpret_cast<__nv_bfloat16*>(host_dev);
  auto* dw = reinterpret_cast<__nv_bfloat16*>(host_dev + row);
  auto* dy = reinterpret_cast<__nv_bfloat16*>(host_dev + 2 * row);
  auto* dflags = reinterpret_cast<volatile unsigned*>(host_dev + 3 * row);
  for (int c = 0; c < cols; ++c) {
    hx[c] = __float2bfloat16(std::sin(0.1f * c) + 0.5f);
    hw[c] = __float2bfloat16(1.0f + 0.001f * (c % 7));
  }
  char* dev = nullptr;
  BENCH_CHECK(cudaMalloc(&dev, 3 * row));
  std::vector<char> input(2 * row), output(row);
  std::memcpy(input.data(), host, 2 * row);

  // The answer every variant must give (host reference, bf16 out).
  std::vector<float> ref(cols);
  double ss = 0;
  for (int c = 0; c < cols; ++c) ss += double(__bfloat162float(hx[c])) * __bfloat162float(hx[c]);
  const float inv = 1.0f / std::sqrt(float(ss / cols) + 1e-5f);
  for (int c = 0; c < cols; ++c) ref[c] = __bfloat162float(hx[c]) * inv * __bfloat162float(hw[c]);
  auto check = [&](const char* what, const __nv_bfloat16* y) {
    double err = 0, norm = 0;
    for (int c = 0; c < cols; ++c) {
      const double d = __bfloat162float(y[c]) - ref[c];
      err += d * d;
      norm += double(ref[c]) * ref[c];
    }
    const double rel = std::sqrt(err / norm);
    if (!(rel < 1e-2)) {
      std::printf("%s: wrong result (rel. error %.3g)\n", what, rel);
      std::exit(1);
    }
  };
  auto poison = [&] { std::memset(host + 2 * row, 0xff, row); };

  std::printf("# one bf16 row of %d columns (x, w in; y out: %zu bytes), %d round trips each\n", cols, 3 * row, iters);
  std::printf("%-14s %8s %8s %8s\n", "variant", "p50_us", "p99_us", "min_us");
  auto report = [](const char* name, fusedserve::bench::HostLatencyUs s) {
    std::printf("%-14s %8.1f %8.1f %8.1f\n", name, s.p50, s.p99, s.min);
  };
  // One variant whose output lands in hy: poisoned first, `issue(i)` packs
  // the inputs and enqueues the work, `wait(i)` waits for it, hy is copied
  // out; then the answer is checked.
  auto trip = [&](const char* name, auto&& issue, auto&& wait) {
    poison();
    report(name, fusedserve::bench::TimeHostUs(iters, 200, [&](int i) {
             issue(i);
             wait(i);
             std::memcpy(output.data(), hy, row);
           }));
    BENCH_CHECK(cudaStreamSynchronize(st));
    check(name, hy);
  };
  auto query = [&](int) { SpinQuery(st); };
  // Waits for flags[0] to hold i + 1 (written by the kernel or the stream).
  auto flag_seen = [&](int i) {
    const unsigned seq = static_cast<unsigned>(i) + 1;
    while (flags[0] != seq) {
    }
    std::atomic_thread_fence(std::memory_order_acquire);
  };

  // Host-side driver calls a launch path makes (no GPU work).
  report("setdevice", fusedserve::bench::TimeHostUs(iters, 200, [&](int) { BENCH_CHECK(cudaSetDevice(0)); }));
  report("getdevice", fusedserve::bench::TimeHostUs(iters, 200, [&](int) {
           int d = -1;
           BENCH_CHECK(cudaGetDevice(&d));
         }));
  report("launch+query", fusedserve::bench::TimeHostUs(iters, 200, [&](int) {
           Empty<<<1, 32, 0, st>>>();
           SpinQuery(st);
         }));
  report("launch+sync", fusedserve::bench::TimeHostUs(iters, 200, [&](int) {
           Empty<<<1, 32, 0, st>>>();
           BENCH_CHECK(cudaStreamSynchronize(st));
         }));
  // Zero-copy, as the backend: inputs packed into the staging block first.
  trip(
      "zc+query",
      [&](int) {
        std::memcpy(host, input.data(), 2 * row);
        RmsKernel<<<1, kThreads, 0, st>>>(dx, dw, dy, cols, nullptr, 0);
      },
      query);
  trip(
      "zc+flag",
      [&](int i) {
        std::memcpy(host, input.data(), 2 * row);
        RmsKernel<<<1, kThreads, 0, st>>>(dx, dw, dy, cols, dflags, static_cast<unsigned>(i) + 1);
      },
      flag_seen);
  flags[0] = 0;
  trip(
      "copy+query",
      [&](int) {
        std::memcpy(host, input.data(), 2 * row);
        BENCH_CHECK(cudaMemcpyAsync(dev, host, 2 * row, cudaMemcpyHostToDevice, st));
        RmsKernel<<<1, kThreads, 0, st>>>(reinterpret_cast<__nv_bfloat16*>(dev),
                                          reinterpret_cast<__nv_bfloat16*>(dev + row),
                                          reinterpret_cast<__nv_bfloat16*>(dev + 2 * row), cols, nullptr, 0);
        BENCH_CHECK(cudaMemcpyAsync(host + 2 * row, dev + 2 * row, row, cudaMemcpyDeviceToHost, st));
      },
      query);

  if (cols == kCols) {
    const uint4* ux = reinterpret_cast<const uint4*>(dx);
    const uint4* uw = reinterpret_cast<const uint4*>(dw);
    uint4* uy = reinterpret_cast<uint4*>(dy);
    auto regs = [&](int) {
      std::memcpy(host, input.data(), 2 * row);
      RmsRegsKernel<<<1, kThreads, 0, st>>>(ux, uw, uy);
    };
    fusedserve::cuda::NormParams np;
    np.kind = fusedserve::cuda::NormKind::kRms;
    np.dtype = fusedserve::DType::kBF16;
    np.x = dx;
    np.weight = dw;
    np.y = dy;
    np.rows = 1;
    np.hidden = cols;
    const fusedserve::cuda::NormConfig nc = fusedserve::cuda::DefaultNormConfig(np.dtype, 1, cols);
    auto norm = [&](int) {
      std::memcpy(host, input.data(), 2 * row);
      if (!fusedserve::cuda::LaunchNorm(np, nc, st).ok()) std::exit(1);
    };
    trip("zc1+query", regs, query);
    trip("norm+query", norm, query);

    // The driver's stream memory op, through the runtime's entry point lookup (no -lcuda).
    using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess && fn != nullptr) {
      const auto write_value = reinterpret_cast<WriteValue32>(fn);
      const CUdeviceptr dflag = reinterpret_cast<CUdeviceptr>(dflags);
      // The stream writes i + 1 into flags[0] after the work; the host spins on it.
      auto memop = [&](int i) {
        if (write_value(st, dflag, static_cast<unsigned>(i) + 1, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
          std::printf("cuStreamWriteValue32 failed\n");
          std::exit(1);
        }
        flag_seen(i);
      };
      flags[0] = 0;
      trip("zc1+memop", regs, memop);
      flags[0] = 0;
      trip("norm+memop", norm, memop);
      flags[0] = 0;
    } else {
      cudaGetLastError();
      std::printf("zc1+memop, norm+memop: cuStreamWriteValue32 not found\n");
    }

    static RowParams params;  // 16 KiB: not on the stack
    trip(
        "param+query",
        [&](int) {
          std::memcpy(&params, input.data(), 2 * row);
          RmsParamKernel<<<1, kThreads, 0, st>>>(params, uy);
        },
        query);
    const uint4* dev_x = reinterpret_cast<const uint4*>(dev);
    trip(
        "param-copy+q",
        [&](int) {
          std::memcpy(&params, input.data(), 2 * row);
          CopyParamKernel<<<1, kThreads, 0, st>>>(params, reinterpret_cast<uint4*>(dev));
          RmsRegsKernel<<<1, kThreads, 0, st>>>(dev_x, dev_x + kCols / 8, uy);
        },
        query);
  }

  // Resident kernel: doorbell flags[0], done flags[1].
  poison();
  flags[0] = 0xffffffffu;  // nothing yet (not 0: 0 stops it)
  flags[1] = 0;
  ResidentKernel<<<1, kThreads, 0, st>>>(dx, dw, dy, cols, dflags, dflags + 1);
  BENCH_CHECK(cudaGetLastError());
  unsigned seq = 0;
  report("resident", fusedserve::bench::TimeHostUs(iters, 200, [&](int) {
           ++seq;
           std::memcpy(host, input.data(), 2 * row);
           std::atomic_thread_fence(std::memory_order_release);
           flags[0] = seq;
           while (flags[1] != seq) {
           }
           std::atomic_thread_fence(std::memory_order_acquire);
           std::memcpy(output.data(), hy, row);
         }));
  check("resident", hy);
  flags[0] = 0;
  BENCH_CHECK(cudaStreamSynchronize(st));
  cudaFreeHost(host);
  cudaFree(dev);
  return 0;
}
