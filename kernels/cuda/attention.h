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

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve {

struct AttentionArgs {
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
};

// Head dims the kernels are built for.
bool AttentionHeadDimSupported(int D);

// Prefill kernel shapes (query rows per CTA, warps per CTA), 64-key tiles:
//   (128, 4): 32 rows per warp, each K/V fragment feeds two MMAs
//   (64, 4):  16 rows per warp, Q fragments kept in registers
//   (128, 8): 16 rows per warp, Q in registers
// Any other pair is an error.
// The untuned choice of block_m (with 4 warps): 64-row CTAs while 128-row
// ones would give the SMs (two CTAs each) fewer than two waves.
int DefaultPrefillBlockM(const AttentionArgs& args, int sm_count);
CudaStatus LaunchAttentionPrefill(const AttentionArgs& args, int block_m, int warps, cudaStream_t stream);

struct DecodeArgs {
  DType dtype = DType::kBF16;
  const void* q = nullptr;           // [B,Hq,D]
  const void* k_cache = nullptr;     // [B,L,Hkv,D]
  const void* v_cache = nullptr;     // [B,L,Hkv,D]
  void* o = nullptr;                 // [B,Hq,D]
  const int32_t* lengths = nullptr;  // [B] on the device, 0..L
  int B = 0, L = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;
};

// Splits along L for a decode problem: none when the batch alone gives
// every SM a CTA, else about two CTAs per SM, each split at least 64 keys.
int DecodeDefaultSplits(DType dtype, int B, int L, int Hq, int Hkv, int D, int sm_count);
// Scratch bytes the decode kernel needs for `splits` (0 when splits == 1).
size_t DecodeWorkspaceBytes(int B, int Hq, int D, int splits);
// workspace: DecodeWorkspaceBytes of device memory (may be null if splits == 1).
CudaStatus LaunchAttentionDecode(const DecodeArgs& args, int splits, void* workspace, cudaStream_t stream);

}  // namespace fusedserve
