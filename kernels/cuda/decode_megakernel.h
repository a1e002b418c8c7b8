// The layers of a one-sequence decode step in one persistent kernel (the
// "megakernel" approach): one CTA per SM runs every layer's five stages
// (RMS norm + QKV + rope + cache write; attention; o_proj + residual; RMS
// norm + gate_up + SwiGLU; down + residual) with a grid-wide barrier between
// stages instead of ~8 kernel boundaries a layer. The CUDA model runner uses
// it for one-row decode steps when asked (CudaModelRunnerOptions::
// decode_fusion's kDecodeMegakernel bit); its kernels stay the reference and
// the default: measured on the H100 the megakernel is correct but 8-10%
// slower (its GEMV stages stream at the copy bandwidth, but each stage also
// pays an input-row load, a grid barrier and HBM time around the stage,
// more than a kernel boundary costs under PDL; bench/notes/decode_fusion.md).
// Plain C++ header; the kernel is in decode_megakernel.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

// One layer's weights and KV cache as the kernel reads them (device pointers).
struct MegaLayer {
  const void* attn_norm = nullptr;  // [D]
  const void* wqkv = nullptr;       // [(Hq + 2 Hkv) Dh, D]; q/k head rows interleaved as GemvRopeKv wants (gemv.h)
  const void* wo = nullptr;         // [D, Hq Dh]
  const void* mlp_norm = nullptr;   // [D]
  const void* gate_up = nullptr;    // [2I, D]: gate rows, then up rows
  const void* down = nullptr;       // [D, I]
  void* k_cache = nullptr;          // [slots, Hkv, Dh]
  void* v_cache = nullptr;          // [slots, Hkv, Dh]
};

struct DecodeMegaParams {
  DType dtype = DType::kBF16;
  const MegaLayer* layers = nullptr;  // device array [num_layers]
  int num_layers = 0;
  int D = 0, I = 0, Hq = 0, Hkv = 0, Dh = 0;
  float eps = 1e-5f;
  float scale = 0.0f;                    // attention scale (1 / sqrt(Dh))
  void* x = nullptr;                     // [D] the residual row (dtype), updated in place
  const int32_t* position = nullptr;     // [1] the token's position
  const int32_t* slot = nullptr;         // [1] its cache slot
  const int32_t* ctx = nullptr;          // [1] keys attended, position + 1
  const int32_t* block_table = nullptr;  // the sequence's block ids
  int block_size = 0;
  const float2* cos_sin = nullptr;  // [max_pos, Dh / 2]: (cos, sin) of pos * inv_freq[i]
  void* workspace = nullptr;        // DecodeMegakernelWorkspaceBytes, zeroed once when allocated
  int probe = 0;                    // set from FUSEDSERVE_MEGA_PROBE at launch (timing runs only)
};

// bf16/fp16, head dim 64 or 128, 1, 2 or 4 query heads per kv head, D, I and
// Hq Dh multiples of 8 up to 16384, and a device that holds one CTA of the
// kernel per SM.
bool DecodeMegakernelSupported(DType dtype, int D, int I, int Hq, int Hkv, int Dh);
// The counters (the grid barrier's, which only grows and stays a multiple
// of the grid size between launches; the attention splits', which every
// launch leaves at zero) and the fp32 rows that pass between stages (q, the
// attention output, the SwiGLU activation, the attention splits' partials).
// Zeroed once, when allocated; never shared by launches that may overlap.
size_t DecodeMegakernelWorkspaceBytes(int I, int Hq, int Hkv, int Dh);
CudaStatus LaunchDecodeMegakernel(const DecodeMegaParams& p, cudaStream_t stream);

}  // namespace fusedserve::cuda
