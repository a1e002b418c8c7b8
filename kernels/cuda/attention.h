// Attention launchers (kernels in attention.cu).
//   Prefill: packed variable-length sequences, causal or not, GQA, head dim 64
//   or 128. bf16/fp16 run a flash-attention kernel on tensor cores (mma.sync
//   m16n8k16, K/V tiles streamed through shared memory with cp.async, online
//   softmax in registers; the score matrix never reaches memory). fp32 runs
//   the exact SIMT kernel of decode, one query per CTA (correct, not fast).
//   Decode: one query per sequence over its KV cache, split along the cache
//   length (flash-decoding) with a combine kernel when the batch is too small
//   to fill the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

struct AttentionParams {
  DType dtype = DType::kBF16;
  const void* q = nullptr;            // [T,Hq,D]
  const void* k = nullptr;            // [T,Hkv,D]
  const void* v = nullptr;            // [T,Hkv,D]
  void* o = nullptr;                  // [T,Hq,D]
  const int32_t* seq_lens = nullptr;  // [B] on the device, sums to T
  int B = 0, T = 0;
  int max_seqlen = 0;  // max over seq_lens (the host knows it)
  int Hq = 0, Hkv = 0, D = 0;
  bool causal = true;
  float scale = 0.0f;
  // A later chunk of each sequence (chunked prefill, prefix-cache hit):
  // sequence b's seq_lens[b] query rows are the LAST ones of its
  // k_starts[b] + seq_lens[b] keys, so query i (position k_starts[b] + i)
  // sees keys j <= k_starts[b] + i when causal, all of them when not. k and v
  // then hold Tk rows, packed per sequence by that key length (q and o stay
  // packed by seq_lens). Null: every sequence starts at 0, k/v packed like q.
  // The Hopper kernel only: any other kernel answers Unsupported.
  const int32_t* k_starts = nullptr;  // [B] on the device
  int Tk = 0;                         // rows of k and v with k_starts: T + sum(k_starts)
};

// Head dims the kernels are built for.
bool AttentionHeadDimSupported(int D);

// Prefill kernel shape (query rows per CTA, warps per CTA), 64-key tiles:
//   m128.w4: 32 rows per warp, each K/V fragment feeds two MMAs
//   m64.w4:  16 rows per warp, Q fragments kept in registers
//   m128.w8: 16 rows per warp, Q in registers
// or, on compute capability 9.0 for bf16/fp16, the Hopper wgmma + TMA kernel
// (attention_hopper.h): "h128.s<stages>.o<schedule>.e<staged O>", 128
// query rows and 128-key tiles, 2 or 3 K/V stages; schedule 0: softmax
// between the GEMMs, 1: overlapped with the next tile's GEMMs, 2: that plus
// ping-pong between the two consumer warpgroups; e1: O stored through shared
// memory; a trailing ".q2": two Q buffers (HopperAttentionBuilt says which
// are built).
// Format "m128.w4" (kernels/cuda/config.h). The fp32 path has one shape.
struct AttentionConfig {
  int block_m = 0;  // 0: not set (the dispatch uses the default)
  int warps = 4;
  int hopper_stages = 0;  // > 0: the Hopper kernel with this many K/V stages
  int hopper_sched = 2;
  bool hopper_stage_o = true;
  int hopper_q_bufs = 1;
};
std::string FormatAttentionConfig(const AttentionConfig& c);
// False (and *c untouched) unless `s` is one of the shapes above.
bool ParseAttentionConfig(const std::string& s, AttentionConfig* c);
// The untuned shape: the Hopper kernel where it runs (bf16/fp16 on
// compute capability 9.0), else 64-row CTAs (4 warps) while 128-row ones
// would give the SMs (two CTAs each) fewer than two waves.
AttentionConfig DefaultAttentionConfig(const AttentionParams& p, int sm_count);
// Candidates worth timing on the current device; the first is valid for
// every shape of the dtype.
std::vector<AttentionConfig> AttentionCandidates(DType dtype);
// Any config other than the shapes above is an error. A Hopper config on
// another GPU (or for fp32) runs the mma.sync m128.w4 shape (fp32: SIMT).
CudaStatus LaunchAttentionPrefill(const AttentionParams& p, const AttentionConfig& c, cudaStream_t stream);

struct DecodeParams {
  DType dtype = DType::kBF16;
  const void* q = nullptr;           // [B,Hq,D]
  const void* k_cache = nullptr;     // [B,L,Hkv,D]
  const void* v_cache = nullptr;     // [B,L,Hkv,D]
  void* o = nullptr;                 // [B,Hq,D]
  const int32_t* lengths = nullptr;  // [B] on the device, 0..L
  int B = 0, L = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;
};

// Decode launch shape: the number of splits along L. Format "s4"; "s0" means
// the default for the shape (DecodeDefaultSplits).
struct DecodeConfig {
  int splits = 0;  // 0: the default
};
std::string FormatDecodeConfig(const DecodeConfig& c);
bool ParseDecodeConfig(const std::string& s, DecodeConfig* c);
// Candidates worth timing for a cache length L; the first ("s0") fits every shape.
std::vector<DecodeConfig> DecodeCandidates(int64_t L);

// Splits along L for a decode problem: none when the batch alone gives
// every SM a CTA, else about two CTAs per SM, each split at least 64 keys.
int DecodeDefaultSplits(DType dtype, int B, int L, int Hq, int Hkv, int D, int sm_count);
// The splits a config asks for, resolved and clamped to 1..L.
int DecodeSplits(const DecodeParams& p, const DecodeConfig& c, int sm_count);
// Scratch bytes the decode kernel needs for `splits` (0 when splits == 1).
size_t DecodeWorkspaceBytes(int B, int Hq, int D, int splits);
// workspace: DecodeWorkspaceBytes of device memory (may be null if splits == 1).
CudaStatus LaunchAttentionDecode(const DecodeParams& p, int splits, void* workspace, cudaStream_t stream);

}  // namespace fusedserve::cuda
