// The QKV projection's rope + paged KV-cache epilogue (gemv.h: GemvRopeKv)
// for one pair of output features, shared by the kernels that compute two
// neighbouring features in one thread (the GEMV, the Hopper skinny GEMM).
// wqkv's q and k head rows are interleaved (row 2i = head element i, row
// 2i + 1 = element i + D/2), so an even feature and the next one are a
// rotation pair; v heads keep their order (elements e, e + 1).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.h"

namespace fusedserve::cuda {

// (cos, sin) of feature f's rotation at position pos; (1, 0) for v heads.
__device__ __forceinline__ float2 RopeKvCosSin(const GemvRopeKv& rp, int64_t f, int pos) {
  const int D = rp.D, h = static_cast<int>(f / D);
  if (h >= rp.Hq + rp.Hkv) return make_float2(1.0f, 0.0f);
  const int i = static_cast<int>(f - static_cast<int64_t>(h) * D) / 2;
  return rp.cos_sin[static_cast<int64_t>(pos) * (D / 2) + i];
}

// Features f (even) and f + 1 of token row tok, with values v0 and v1: q
// rows rotated into q, k rows rotated into k (when dense) and the cache row
// `slot` (>= 0), v rows copied to v and the cache.
template <typename T>
__device__ __forceinline__ void RopeKvStorePair(const GemvRopeKv& rp, float v0, float v1, int64_t f, int64_t tok,
                                                float2 cs, int64_t slot) {
  const int D = rp.D, half = D / 2;
  const int h = static_cast<int>(f / D), e = static_cast<int>(f - static_cast<int64_t>(h) * D);
  if (h < rp.Hq + rp.Hkv) {
    const int i = e / 2;
    const T ta = FromFloat<T>(v0 * cs.x - v1 * cs.y), tb = FromFloat<T>(v1 * cs.x + v0 * cs.y);
    auto put = [&](void* base, int64_t row, int heads, int hh) {
      T* r = static_cast<T*>(base) + (row * heads + hh) * D;
      r[i] = ta;
      r[i + half] = tb;
    };
    if (h < rp.Hq) {
      put(rp.q, tok, rp.Hq, h);
    } else {
      if (rp.k != nullptr) put(rp.k, tok, rp.Hkv, h - rp.Hq);
      if (slot >= 0) put(rp.k_cache, slot, rp.Hkv, h - rp.Hq);
    }
  } else {
    const int vh = h - rp.Hq - rp.Hkv;
    const T ta = FromFloat<T>(v0), tb = FromFloat<T>(v1);
    auto put = [&](void* base, int64_t row) {
      T* r = static_cast<T*>(base) + (row * rp.Hkv + vh) * D + e;
      r[0] = ta;
      r[1] = tb;
    };
    if (rp.v != nullptr) put(rp.v, tok);
    if (slot >= 0) put(rp.v_cache, slot);
  }
}

}  // namespace fusedserve::cuda
