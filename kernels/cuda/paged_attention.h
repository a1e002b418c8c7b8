// Kernels of the paged KV cache the CUDA model runner needs around the
// project's dense ops (kernels in paged_attention.cu):
//   - row gather (embedding lookup, last-token rows before the LM head);
//   - rope + K/V cache write in one pass over the QKV projection: q, k rotated
//     with an fp32 cos/sin table built on the host in fp64 (so Llama-3.1
//     rope scaling is exact; rope.h derives frequencies from theta alone),
//     q/k/v split out densely for the prefill kernel and k/v stored into the
//     cache slots (block * block_size + offset) of each token;
//   - paged attention: each query row attends over keys [0, ctx) of its
//     sequence, read through the sequence's block table (decode, and prefill
//     chunks of sequences that already hold cache), split along the context
//     (flash-decoding) with a combine pass when rows x kv heads are too few
//     to fill the GPU.
// Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

// dst[i, :] = src[idx[i], :] for i < n, rows of row_bytes bytes.
// src [rows, row_bytes]; idx [n] (device); dst [n, row_bytes]
CudaStatus LaunchGatherRows(const void* src, const int32_t* idx, int64_t n, int64_t row_bytes, void* dst,
                            cudaStream_t stream);

struct RopeKvParams {
  DType dtype = DType::kBF16;
  const void* qkv = nullptr;           // [T, (Hq + 2 Hkv) * D]: q heads, k heads, v heads
  const int32_t* positions = nullptr;  // [T], each < table rows
  const float2* cos_sin = nullptr;     // [max_pos, D / 2]: (cos, sin) of pos * inv_freq[i]
  const int32_t* slots = nullptr;      // [T] cache slot of each token; nullptr: no cache write
  void* q = nullptr;                   // [T, Hq, D]
  void* k = nullptr;                   // [T, Hkv, D]
  void* v = nullptr;                   // [T, Hkv, D]
  void* k_cache = nullptr;             // [slots, Hkv, D] (one layer)
  void* v_cache = nullptr;             // [slots, Hkv, D]
  int64_t T = 0;
  int Hq = 0, Hkv = 0, D = 0;
  // The q and k heads of qkv hold their elements interleaved (2i = element i,
  // 2i + 1 = element i + D/2: the weight layout of the fused rope GEMV, gemv.h);
  // v heads and every output are in the plain order.
  bool interleaved = false;
};
CudaStatus LaunchRopeKvWrite(const RopeKvParams& p, cudaStream_t stream);

struct PagedAttentionParams {
  DType dtype = DType::kBF16;
  const void* q = nullptr;                // [T, Hq, D]
  void* o = nullptr;                      // [T, Hq, D]; only the rows named in `rows` are written
  const void* k_cache = nullptr;          // [slots, Hkv, D] (one layer)
  const void* v_cache = nullptr;          // [slots, Hkv, D]
  const int32_t* rows = nullptr;          // [R] token index (into q/o) of each query row
  const int32_t* row_seq = nullptr;       // [R] sequence (block table row) of each query row
  const int32_t* ctx_lens = nullptr;      // [R] keys [0, ctx) are attended (causal: position + 1)
  const int32_t* block_tables = nullptr;  // [seqs, bt_stride] block ids
  int bt_stride = 0;
  // When set, the stride is read on the device instead (a CUDA graph replays
  // the launch for steps whose tables have different widths).
  const int32_t* bt_stride_ptr = nullptr;
  int block_size = 0;
  int R = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;
  // Decode: each row is its sequence's only row and its one new token, so of
  // its keys only ctx - 1 was written by the kernels just before this one
  // (the QKV projection's cache write); keys [0, ctx - 1) come from earlier
  // steps. The tensor-core kernel then loads its first keys of those before
  // the programmatic-launch wait, under the QKV projection's tail. (The row
  // metadata and block tables, uploaded before the step, are always read
  // before the wait.) FUSEDSERVE_PAGED_EARLY_KV=0 turns it off.
  bool only_last_key_new = false;
  // Where both can run (bf16/fp16, head dim 64 or 128): -1 the default
  // (FUSEDSERVE_PAGED_MMA=0/1, else tensor cores), 0 the CUDA-core kernel,
  // 1 the tensor-core kernel. Other shapes always take the CUDA-core kernel.
  int kernel = -1;
  // How the tensor-core kernel merges 2-16 context splits: -1 the default
  // (the cluster for launches of up to kPagedClusterMaxRows rows;
  // FUSEDSERVE_PAGED_CLUSTER=n: up to n rows), 0 partials through global memory
  // and the last CTA to finish, 1 the splits as one thread-block cluster
  // merging through distributed shared memory. More splits, and the CUDA-core
  // kernel, always merge through global memory.
  int merge = -1;
};

// Head dims 16, 32, 64, 128; at most 8 query heads per kv head.
bool PagedAttentionSupported(int Hq, int Hkv, int D);
// Context splits for R rows: as many CTAs as fit on the GPU in one wave
// (four per SM), at most kPagedMaxSplits (kPagedMaxClusterSplits where the
// cluster merge is the default), and R * splits <= kPagedMaxSplitRows.
constexpr int kPagedMaxSplits = 32;
constexpr int kPagedMaxClusterSplits = 16;  // with the cluster merge
constexpr int kPagedClusterMaxRows = 4;     // the cluster merge's default reach
constexpr int kPagedMaxSplitRows = 1024;
// A row of at most this many keys runs on one CTA and skips the split merge:
// the split count is fixed for the longest context a graph serves, and at
// short contexts merging the splits cost more than the keys (H200,
// llama-3.2-1b decode at context 128: 3-4% of the step at B = 8, 1-3% at
// B = 1 and 16, within noise at B = 2 and 4).
constexpr int kPagedOneCtaKeys = 128;
// Except a lone row at head dim 128: the tensor-core kernel's CTA takes 64
// keys a pass there, and two passes on one CTA lost to 16 split CTAs and
// their merge (llama-3-8b, B=1 ctx 128: 5.1-5.6 us against 4.5-4.7); more
// rows fill the GPU without splits.
__host__ __device__ inline int PagedOneCtaKeys(const PagedAttentionParams& p) {
  return p.R == 1 && p.D == 128 ? 64 : kPagedOneCtaKeys;
}
int PagedAttentionSplits(int R, int Hkv, int max_ctx, int sm_count);
// Workspace bytes for any launch of these head counts (context splits keep
// R * splits <= kPagedMaxSplitRows). Zero it once when allocated: it holds
// counters that every launch leaves at zero.
size_t PagedAttentionWorkspaceBytes(int Hq, int D);
// Each row's context is cut in `splits` equal parts (the split count, not the
// part length, is fixed so a CUDA graph can replay the launch for any ctx);
// a row of at most PagedOneCtaKeys(p) keys is one part.
CudaStatus LaunchPagedAttention(const PagedAttentionParams& p, int splits, void* workspace, cudaStream_t stream);

}  // namespace fusedserve::cuda
