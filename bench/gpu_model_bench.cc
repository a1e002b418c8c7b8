// Decode-step benchmark of the CUDA model runner: the llama-3.2-1b preset
// (random bf16 weights), B = 1, 8, 64 sequences at context 2048, one token
// each per step, through ModelRunner::Forward (index upload, the decode step
// replayed from its CUDA graph, logits copied to the host and widened to
// fp32: what the engine pays per step, sampling excluded).
// Floor: bytes one step must read (every weight once, tied embedding read by
// the LM head, plus the K/V of B x 2048 positions over all layers) at the
// device-to-device copy bandwidth measured in the same run (bytes read +
// written). Median of 50 steps after 5 warm-up steps.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "server/model_cuda_runner.h"
#include "server/model_weights.h"

namespace fusedserve {
namespace {

double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  const int iters = 20;
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * iters / (ms * 1e-3);  // read + write
}

int Main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device; skipped\n");
    return 0;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double bw = CopyBandwidth();
  std::printf("device %s, copy bandwidth %.0f GB/s (read + write)\n", prop.name, bw / 1e9);

  const ModelConfig c = *PresetConfig("llama-3.2-1b");
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<ModelWeights> w = ModelWeights::Random(c, 1);
  CudaModelRunnerOptions o;
  o.max_tokens = 2048;
  o.max_seqs = 64;
  o.max_graph_batch = 64;
  absl::StatusOr<std::unique_ptr<ModelRunner>> made = MakeCudaModelRunner(std::move(w), o);
  if (!made.ok()) {
    std::printf("runner: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  ModelRunner& r = **made;
  const int64_t bs = 16, ctx = 2048, per_seq = ctx / bs + 1, maxB = 64;
  if (absl::Status s = r.InitKvCache(maxB * per_seq + 16, bs); !s.ok()) {
    std::printf("kv cache: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("model %s: %.2f GB of bf16 weights; set-up (random weights, upload, graph capture) %.1f s\n",
              c.name.c_str(), c.NumParameters() * 2 / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const double weight_bytes = static_cast<double>(c.NumParameters()) * 2;
  std::printf("%4s %6s %12s %12s %10s %12s\n", "B", "ctx", "step_ms", "floor_ms", "%floor", "tokens/s");
  for (int64_t B : {1, 8, 64}) {
    std::vector<std::vector<int32_t>> tables(B), toks(B);
    std::vector<SeqForward> batch(B);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < per_seq; ++i) tables[b].push_back(static_cast<int32_t>(b * per_seq + i));
      toks[b] = {static_cast<int32_t>((b * 7919) % c.vocab)};
      batch[b].tokens = toks[b].data();
      batch[b].num_tokens = 1;
      batch[b].start = ctx - 1;  // attends over 2048 keys
      batch[b].block_table = tables[b].data();
      batch[b].num_blocks = per_seq;
    }
    std::vector<float> logits;
    std::vector<double> ms;
    for (int it = 0; it < 55; ++it) {
      auto a = std::chrono::steady_clock::now();
      if (absl::Status s = r.Forward(batch, &logits); !s.ok()) {
        std::printf("forward: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      auto e = std::chrono::steady_clock::now();
      if (it >= 5) ms.push_back(std::chrono::duration<double, std::milli>(e - a).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    // Bytes read per step: weights + K/V of B sequences x ctx x layers.
    const double kv_bytes = static_cast<double>(B) * ctx * c.layers * c.kv_dim() * 2 * 2;
    // As in PEERS.md: the bytes a step must read, at the measured copy bandwidth (read + written bytes per s).
    const double floor_ms = (weight_bytes + kv_bytes) / bw * 1e3;
    std::printf("%4ld %6ld %12.3f %12.3f %9.1f%% %12.0f\n", static_cast<long>(B), static_cast<long>(ctx), med,
                floor_ms, 100.0 * floor_ms / med, B / (med * 1e-3));
  }
  return 0;
}

}  // namespace
}  // namespace fusedserve

int main() { return fusedserve::Main(); }
