// The CUDA ModelRunner (cuda_runner.cc): weights on the device in the
// model dtype, a paged KV cache in device memory, the forward step on the
// project's kernels (norm.h, gemm.h, gemv.h, attention.h, paged_attention.h),
// pure-decode steps replayed from CUDA graphs captured per batch bucket; the
// norms, GEMMs, MLP gate and prefill attention launched through the same
// entry points and tuned configs as the ops (tuned_configs.h).
// Only built with CUDA (FUSEDSERVE_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/op.h"
#include "model/runner.h"

namespace fusedserve {

struct CudaModelRunnerOptions {
  int device = 0;  // CUDA device ordinal
  // Token rows the step buffers hold from the start (prefill tokens plus
  // decodes of one step); a larger step grows them once and drops the graphs.
  int64_t max_tokens = 8192;
  // Sequences per step the buffers hold from the start (grown likewise).
  int64_t max_seqs = 256;
  // Capture the pure-decode step of each batch bucket (1, 2, 4, ... up to
  // max_graph_batch) in a CUDA graph when the KV cache is created.
  bool cuda_graphs = true;
  int64_t max_graph_batch = 64;
  // For a decode bucket with tuned configs, also capture the built-in
  // configs' graph, time both in context and keep the faster (the tuner
  // times kernels alone). Off: the tuned graph, as a test forcing configs wants.
  bool compare_decode_graphs = true;
  // Fusions of pure-decode steps whose projections run the GEMV (the
  // built-in rule: one row), a bit mask (kernels/cuda/gemv.h, skinny_gemm.h):
  //   kDecodeFuseRope  rope + paged KV-cache write in the QKV GEMV's epilogue;
  //   kDecodeFuseNorm  the RMS norms folded into the GEMVs that consume them
  //                    (QKV, gate_up, LM head: each recomputes the sum of
  //                    squares and loads the norm weight in its weight
  //                    stream), the residual adds into the o_proj/down
  //                    epilogues: no norm kernels;
  //   kDecodeMegakernel  one-row steps run every layer in one persistent
  //                    kernel (kernels/cuda/decode_megakernel.h) where the
  //                    model fits it (one GPU, bf16/fp16, head dim 64/128,
  //                    GQA group 1/2/4); the mask's other bits then apply to
  //                    the LM head and to steps of more rows;
  //   kDecodeNormEpilogue  (not with kDecodeFuseNorm; one GPU) the add + RMS
  //                    norm kernels after o_proj and down move into the GEMVs
  //                    around them instead: the producer adds the residual,
  //                    writes y * norm weight and adds each row's sum of y^2
  //                    into a fixed-point counter; the consumer (gate_up, the
  //                    next QKV, the LM head) scales its sums by the rstd in
  //                    its epilogue, its weight stream unchanged
  //                    (GemvFusion::norm_next, sq_in). Only the first layer's
  //                    norm kernel is left;
  //   kDecodeSkinny    steps of 2-32 rows whose projections run the narrow
  //                    skinny GEMM (skinny_gemm.h: the built-in rule there)
  //                    take the fused layers too, with the rope and norm
  //                    epilogues on that kernel.
  //   kDecodeSkinnyWide  (with kDecodeSkinny; Hopper; not in the default)
  //                    steps of 33-64 rows run the layers' four projections
  //                    on the Hopper skinny kernel with the same epilogues
  //                    (the built-in rule there puts QKV and o_proj on
  //                    cuBLASLt, with the norm and rope kernels around them);
  //                    the LM head keeps its own path. On the H200 at B=64:
  //                    1% faster at ctx 128, 1-3% slower at ctx 2048 (the
  //                    attention runs slower behind the fused QKV).
  // 0, or FUSEDSERVE_DECODE_FUSION=<mask> in the environment (which wins):
  // the unfused kernels, the reference. Default: rope + norm epilogues, also
  // on the skinny GEMM.
  // Measured on the H100, 1B model at B=1, context 128
  // (bench/notes/decode_fusion.md): rope 1.152-1.165 ms, rope + norm
  // epilogues 1.121-1.137 in the same call; earlier, none 1.245, norm folded
  // 1.239, rope + norm folded 1.293 (the folded SwiGLU GEMV ran ~3 us slower
  // a layer). Every mask is tested.
  static constexpr int kDecodeFuseRope = 1, kDecodeFuseNorm = 2, kDecodeMegakernel = 4, kDecodeNormEpilogue = 8,
                       kDecodeSkinny = 16, kDecodeSkinnyWide = 32;
  int decode_fusion = kDecodeFuseRope | kDecodeNormEpilogue | kDecodeSkinny;
  // Kernel configs by (op, dtype, TuningKey) (the server's tuning cache,
  // TuningService::counted_lookup). Each kernel of model/kernel_shapes.h is
  // looked up once per token bucket: when the KV cache is created for the
  // buckets up to max_tokens (the LM head up to max_seqs), so before the
  // graphs are captured; larger steps look theirs up when they come.
  // Empty: every kernel's built-in rule.
  ConfigLookup tuned;
  // Tensor parallelism: the model split Megatron-style (model/
  // tensor_parallel.h) over this many GPUs, devices device .. device + N - 1,
  // each rank with its own thread and stream, one NCCL all-reduce after
  // o_proj and one after down_proj per layer (captured in the decode graphs
  // too). Embeddings and the LM head are replicated; rank 0 alone runs the
  // LM head. Needs NCCL at run time (kernels/cuda/nccl_group.h).
  int tensor_parallel = 1;
  // Take that path (NCCL group, rank thread, all-reduces) with one GPU too:
  // how a single-GPU host checks it.
  bool force_tensor_parallel_path = false;
};

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaModelRunner(std::unique_ptr<ModelWeights> weights,
                                                                 const CudaModelRunnerOptions& options);

// After InitKvCache: for each decode graph bucket whose kernels have tuned
// configs, which of the tuned and the built-in graph the runner kept (both
// are timed in context at capture) and their step times; "" when none.
std::string CudaDecodeGraphReport(const ModelRunner& runner);

// KV cache blocks of block_size positions that fit in `fraction` of the
// device's free memory, less `reserve_bytes` (call after MakeCudaModelRunner:
// weights and step buffers are already taken).
absl::StatusOr<int64_t> CudaKvCacheBlocks(const ModelRunner& runner, int device, int64_t block_size, double fraction,
                                          int64_t reserve_bytes);

}  // namespace fusedserve
