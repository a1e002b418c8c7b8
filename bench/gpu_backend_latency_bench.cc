// Round-trip latency of one small op through the CUDA backend (host tensors
// in, host tensors out: staging copy, H2D, kernel, D2H, sync), without gRPC:
// the floor under a FusedOp request's server-side time.
//   gpu_backend_latency_bench [iterations]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/cuda/cuda_backend.h"

using namespace fusedserve;

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 3000;
  if (CudaDeviceCount() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  if (!gpu.ok()) {
    std::printf("%s\n", std::string(gpu.status().message()).c_str());
    return 1;
  }
  std::printf("%-28s %10s %10s %10s\n", "op [shape] bf16", "p50_us", "p99_us", "min_us");
  struct Case {
    const char* op;
    std::vector<int64_t> key;
  };
  for (const Case& c : {Case{"rms_norm", {1, 4096}}, Case{"rms_norm", {4, 4096}}, Case{"rms_norm", {8, 4096}},
                        Case{"rms_norm", {16, 4096}}, Case{"rms_norm", {32, 4096}}, Case{"rms_norm", {64, 4096}},
                        Case{"add_rms_norm", {8, 4096}}, Case{"softmax", {1, 32000}}, Case{"softmax", {8, 32000}},
                        Case{"linear", {1, 4096, 4096}}}) {
    OpRequest r = MakeRandomRequest(c.op, DType::kBF16, c.key, 1);
    const bench::HostLatencyUs t = bench::TimeHostUs(iters, 100, [&](int) {
      absl::StatusOr<TensorMap> out = (*gpu)->Run(r);
      if (!out.ok()) {
        std::printf("%s: %s\n", c.op, std::string(out.status().message()).c_str());
        std::exit(1);
      }
    });
    std::string name = std::string(c.op) + " [";
    for (size_t i = 0; i < c.key.size(); ++i) name += (i ? "," : "") + std::to_string(c.key[i]);
    name += "]";
    std::printf("%-28s %10.1f %10.1f %10.1f\n", name.c_str(), t.p50, t.p99, t.min);
  }
  return 0;
}
