// Launchers for the MLP helpers around the cuBLASLt GEMMs (kernels in
// gemv.cu): the elementwise epilogues cuBLASLt lacks (SiLU, erf-GELU), the
// SwiGLU activation between the two GEMMs of swiglu_mlp, and a
// bandwidth-bound GEMV for few rows (M <= kGemvMaxM) that fuses bias,
// activation or the whole SwiGLU gate into the weight stream.
// All tensors dense row-major, dtype-typed (fp32 accumulation).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"
#include "kernels/op.h"

namespace fusedserve::cuda {

struct GemmParams;

// y = act(y) in place.   y [n]   (act: kSilu, kGeluErf, kGeluTanh; kNone is a no-op)
CudaStatus LaunchActivationInPlace(DType dtype, int64_t n, Activation act, void* y, cudaStream_t stream);

// y[m,n] = act(bias[n]) (or act(0) without bias): the K = 0 GEMM.   y [M,N]
CudaStatus LaunchBiasActivation(DType dtype, int64_t M, int64_t N, const void* bias, Activation act, void* y,
                                cudaStream_t stream);

// y = silu(x[:, :I]) * x[:, I:].   x [M,2I]; y [M,I]
CudaStatus LaunchMlpSiluAndMul(DType dtype, int64_t M, int64_t I, const void* x, void* y, cudaStream_t stream);

// The GEMV path: one warp streams two weight rows with 16-byte loads and
// keeps all M (<= kGemvMaxM) rows of x in L1. Beats cuBLASLt only while the
// problem is weight-bandwidth bound (small M).
constexpr int64_t kGemvMaxM = 8;
constexpr int kGemvWarps = 4;  // a GEMV block's warps (128 threads: small blocks keep the last wave short)

// How a GEMV launch spreads `units` (weight row pairs, or SwiGLU gate/up row
// pairs) over `resident_warps` warp slots, as one wave of equal work: every
// warp group gets the same number of consecutive units, so no block of a
// second wave starts late and all warps drain together (with one unit per
// warp, the SwiGLU gate_up GEMV ran as 1.7 waves of 16 KB-per-warp blocks).
// Units fewer than the resident warps are split over 2 or 4 warps, each
// streaming every split-th chunk of K.
struct GemvGrid {
  int split = 1;
  int64_t units_per_warp = 1, groups = 1, blocks = 1;
  int64_t Warps() const { return groups * split; }
};
GemvGrid PlanGemvGrid(int64_t units, int64_t resident_warps);
// Whether a launch takes the wave planned under the blocks-per-SM cap
// (gemv.cu, kGemvSmBlocksCap) instead of the natural one: when it keeps at
// least 2/3 of the warps. A wave that halves (one-row QKV: split 2 -> 1, or
// one unit a warp -> two) lost more than the cap gained (H200, 1B QKV 5.1 ->
// 5.3 us, 8B 13.4 -> 16.3); gate_up's (2/3-3/4 of the warps, more units
// each) did not (8B 59.2 -> 56.7, 1B 18.8 -> 18.1).
bool GemvTakesCappedGrid(const GemvGrid& natural, const GemvGrid& capped);
// True when the GEMV path can run: M <= kGemvMaxM, K a multiple of the
// 16-byte vector and at most 2^26, x and w 16-byte aligned.
bool GemvSupported(DType dtype, int64_t M, int64_t K, const void* x, const void* w);
// GemvSupported's shape rules alone (pointers aside): where GEMV is a tuning candidate.
bool GemvShape(DType dtype, int64_t M, int64_t K);
// y = act(x . w^T + bias) for GemvSupported problems. Launched as the
// programmatic dependent of the previous kernel: its first weight loads
// overlap that kernel's tail (it still waits for all of its writes).
CudaStatus LaunchGemv(const GemmParams& args, cudaStream_t stream);
// h = silu(x . gate^T) * (x . up^T) with gate_up = [gate; up], in one pass
// over gate_up.   x [M,D]; gate_up [2I,D]; h [M,I]
CudaStatus LaunchGemvSwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            cudaStream_t stream);

// ---- Decode fusions (the CUDA model runner's GEMV path) ----------------------
// The QKV projection's epilogue: rope and the paged KV-cache write, so the
// projection's output never exists. The weight rows of every q and k head
// must be interleaved (stored row 2i = head row i, 2i + 1 = head row i + D/2)
// so that one warp's pair of rows is a rotation pair; v heads keep their order.
struct GemvRopeKv {
  const int32_t* positions = nullptr;  // [M], each < table rows
  const float2* cos_sin = nullptr;     // [max_pos, D / 2]: (cos, sin) of pos * inv_freq[i]
  const int32_t* slots = nullptr;      // [M] cache slot of each row; nullptr: no cache write
  void* q = nullptr;                   // [M, Hq, D]
  void* k = nullptr;                   // [M, Hkv, D] or nullptr
  void* v = nullptr;                   // [M, Hkv, D] or nullptr
  void* k_cache = nullptr;             // [slots, Hkv, D]
  void* v_cache = nullptr;             // [slots, Hkv, D]
  int Hq = 0, Hkv = 0, D = 0;

  // N = (Hq + 2 Hkv) D outputs, D a positive multiple of d_multiple (what a
  // kernel's pairs of features need: 2 for one pair a thread, 16 for an mma
  // tile of them).
  bool ShapeFits(int64_t N, int d_multiple) const {
    return D > 0 && D % d_multiple == 0 && Hq > 0 && Hkv > 0 && N == static_cast<int64_t>(Hq + 2 * Hkv) * D;
  }
  // positions, cos_sin and q; with slots, both caches.
  bool TensorsPresent() const {
    return positions != nullptr && cos_sin != nullptr && q != nullptr &&
           (slots == nullptr || (k_cache != nullptr && v_cache != nullptr));
  }
};
// The norm sums pass between producer and consumer as 64-bit fixed point
// (2^-24): integer adds in any order give the same bits, so the atomics stay
// deterministic, and one load per row is all a consumer reads. Range: sums
// of y^2 up to 2^40 (an RMS of 16,000 at 4096 columns). The skinny GEMM
// (skinny_gemm.h) takes the same fusions except a folded norm.
constexpr float kNormSumScale = 16777216.0f;
// What LaunchGemvFused does around y = x . w^T (all optional):
//   norm_weight  x is RMS-normalised first: y = rstd * ((x * norm_weight) . w^T),
//                rstd = rsqrt(mean(x^2) + eps) per row, its sum of squares
//                taken from the x loads the GEMV makes anyway;
//   residual     y = x . w^T + residual   ([M,N]; not with rope);
//   rope         the GemvRopeKv epilogue (y unused; N = (Hq + 2 Hkv) D).
//   norm_next    (with residual) the next RMS norm's share of the epilogue:
//                norm_out = y * norm_next as y is stored, each row's sum of
//                y^2 added into sq_out[row] (zero before: fixed point, so
//                the sum is the same whatever the blocks' order), and
//                sq_clear[row] zeroed (the other producer's sums, whose
//                reader has finished);
//   sq_in        a producer's sq_out: x is its norm_out, and the dot
//                products are scaled by rstd = rsqrt(sum / K + eps). Two
//                GEMVs so replace the (add_)rms_norm kernel between them.
struct GemvFusion {
  const void* norm_weight = nullptr;  // [K]
  float eps = 1e-5f;
  const void* residual = nullptr;
  bool rope_kv = false;
  GemvRopeKv rope;
  const void* norm_next = nullptr;  // [N]
  void* norm_out = nullptr;         // [M,N]
  unsigned long long* sq_out = nullptr;
  unsigned long long* sq_clear = nullptr;
  const unsigned long long* sq_in = nullptr;

  // The next norm's epilogue is all of norm_next, norm_out, sq_out and
  // sq_clear, or none of them.
  bool NormNextConsistent() const {
    const bool out = norm_out != nullptr;
    return out == (norm_next != nullptr) && out == (sq_out != nullptr) && out == (sq_clear != nullptr);
  }
  // The epilogues combine as the fused projections implement them: the next
  // norm's epilogue follows a residual add (it normalises the sum), and rope
  // (the QKV projection's) comes without one.
  bool EpiloguesCombine() const {
    return (norm_out == nullptr || residual != nullptr) && !(rope_kv && residual != nullptr);
  }
  // No epilogue but a consumer's sq_in (no residual, rope, next norm's output
  // or folded norm): what the skinny SwiGLU gates take.
  bool OnlyConsumerSums() const {
    return residual == nullptr && !rope_kv && norm_out == nullptr && norm_weight == nullptr;
  }
};
// bf16/fp16 only; GemvSupported shapes; Unsupported otherwise.
CudaStatus LaunchGemvFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                           const GemvFusion& f, cudaStream_t stream);
// LaunchGemvSwiglu with a folded norm (norm_weight, eps) or a producer's sums
// (sq_in, eps); GemvFusion's other fields must be unset.
CudaStatus LaunchGemvSwigluFused(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                 void* h, const GemvFusion& f, cudaStream_t stream);

}  // namespace fusedserve::cuda
