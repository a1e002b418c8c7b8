// The paged attention kernel (kernels/cuda/paged_attention.h) against the CPU
// reference: each query row's keys gathered from the cache through its
// sequence's block table (blocks shuffled, tables wider than needed) and fed
// to cpu::AttentionDecode. Rows of several sequences with mixed context
// lengths (decode rows and prefill-chunk rows of one sequence), every dtype,
// every supported head dim, GQA up to 8, one split and several (the combine
// pass, workspace counters reused across launches). Outputs are poisoned
// with 0xFF (NaN); the one token no row names must stay poisoned. Relative
// error norm per row set. Skips without a GPU.
#include "kernels/cuda/paged_attention.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct PagedCase {
  DType dt;
  int Hq, Hkv, D;
  std::vector<int> ctx_lens;  // per query row
  std::vector<int> row_seq;   // per query row: its sequence
  int block_size = 16;
};

// Device copy of a host vector, freed by the test's cleanup list.
template <typename T>
T* Upload(const std::vector<T>& v, std::vector<void*>* allocs) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size() * sizeof(T), 16)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  allocs->push_back(p);
  return static_cast<T*>(p);
}

void CheckPaged(const PagedCase& c, uint64_t seed) {
  SCOPED_TRACE(std::string(DTypeName(c.dt)) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
               " D=" + std::to_string(c.D) + " rows=" + std::to_string(c.ctx_lens.size()));
  std::mt19937_64 rng(seed);
  const int R = static_cast<int>(c.ctx_lens.size());
  const int T = R + 1;  // token R is named by no row
  const int seqs = *std::max_element(c.row_seq.begin(), c.row_seq.end()) + 1;
  // Each sequence holds as many keys as its longest row attends to.
  std::vector<int> seq_len(seqs, 0);
  for (int r = 0; r < R; ++r) seq_len[c.row_seq[r]] = std::max(seq_len[c.row_seq[r]], c.ctx_lens[r]);
  const int bs = c.block_size;
  int bt_stride = 0;
  for (int len : seq_len) bt_stride = std::max(bt_stride, (len + bs - 1) / bs);
  bt_stride += 1;  // wider than needed: the kernel must read only what it uses
  std::vector<int32_t> blocks(static_cast<size_t>(seqs) * bt_stride);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const int64_t slots = static_cast<int64_t>(blocks.size()) * bs;

  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const HostTensor q = HostTensor::FromFloat(c.dt, {T, c.Hq, c.D}, random(int64_t{T} * c.Hq * c.D));
  const HostTensor kc = HostTensor::FromFloat(c.dt, {slots, c.Hkv, c.D}, random(slots * c.Hkv * c.D));
  const HostTensor vc = HostTensor::FromFloat(c.dt, {slots, c.Hkv, c.D}, random(slots * c.Hkv * c.D));
  std::vector<int32_t> rows(R);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);  // rows name tokens in any order
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));

  // Reference: gather each row's keys densely, then the decode reference.
  const std::vector<float> qf = q.ToFloat(), kf = kc.ToFloat(), vf = vc.ToFloat();
  const int64_t head_elems = int64_t{c.Hkv} * c.D, q_elems = int64_t{c.Hq} * c.D;
  std::vector<float> ref(static_cast<size_t>(R) * q_elems);
  for (int r = 0; r < R; ++r) {
    const int ctx = c.ctx_lens[r], s = c.row_seq[r];
    std::vector<float> k(ctx * head_elems), v(ctx * head_elems);
    for (int j = 0; j < ctx; ++j) {
      const int64_t slot = static_cast<int64_t>(blocks[s * bt_stride + j / bs]) * bs + j % bs;
      std::copy_n(kf.begin() + slot * head_elems, head_elems, k.begin() + j * head_elems);
      std::copy_n(vf.begin() + slot * head_elems, head_elems, v.begin() + j * head_elems);
    }
    const int64_t len = ctx;
    cpu::AttentionDecode(qf.data() + rows[r] * q_elems, k.data(), v.data(), &len, 1, ctx, c.Hq, c.Hkv, c.D, scale,
                         ref.data() + r * q_elems);
  }

  std::vector<void*> allocs;
  auto upload_bytes = [&](const std::string& bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    allocs.push_back(p);
    return p;
  };
  cuda::PagedAttentionParams p;
  p.dtype = c.dt;
  p.q = upload_bytes(q.data);
  p.k_cache = upload_bytes(kc.data);
  p.v_cache = upload_bytes(vc.data);
  p.rows = Upload(rows, &allocs);
  p.row_seq = Upload(std::vector<int32_t>(c.row_seq.begin(), c.row_seq.end()), &allocs);
  p.ctx_lens = Upload(std::vector<int32_t>(c.ctx_lens.begin(), c.ctx_lens.end()), &allocs);
  p.block_tables = Upload(blocks, &allocs);
  p.bt_stride = bt_stride;
  p.block_size = bs;
  p.R = R;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.D = c.D;
  p.scale = scale;
  const size_t o_bytes = q.data.size();
  void* o = nullptr;
  ASSERT_EQ(cudaMalloc(&o, o_bytes), cudaSuccess);
  allocs.push_back(o);
  p.o = o;
  const size_t ws_bytes = cuda::PagedAttentionWorkspaceBytes(c.Hq, c.D);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  allocs.push_back(ws);
  ASSERT_EQ(cudaMemset(ws, 0, ws_bytes), cudaSuccess);  // counters: zeroed once

  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const int max_ctx = *std::max_element(c.ctx_lens.begin(), c.ctx_lens.end());
  const int tuned = cuda::PagedAttentionSplits(R, c.Hkv, max_ctx, prop.multiProcessorCount);
  const size_t elem = DTypeSize(c.dt);
  for (int splits : {1, tuned, 4, cuda::kPagedMaxSplits, 4}) {  // 4 twice: counters left at zero
    if (int64_t{R} * splits > cuda::kPagedMaxSplitRows) continue;
    SCOPED_TRACE("splits " + std::to_string(splits));
    ASSERT_EQ(cudaMemset(o, 0xFF, o_bytes), cudaSuccess);
    const CudaStatus s = cuda::LaunchPagedAttention(p, splits, splits > 1 ? ws : nullptr, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    std::string got_bytes(o_bytes, '\0');
    ASSERT_EQ(cudaMemcpy(got_bytes.data(), o, o_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    HostTensor got;
    got.dtype = c.dt;
    got.shape = {T, c.Hq, c.D};
    got.data = got_bytes;
    const std::vector<float> gf = got.ToFloat();
    std::vector<float> by_row(ref.size());
    for (int r = 0; r < R; ++r) std::copy_n(gf.begin() + rows[r] * q_elems, q_elems, by_row.begin() + r * q_elems);
    const double tol = c.dt == DType::kF32 ? 1e-5 : (c.dt == DType::kF16 ? 2e-3 : 1e-2);
    EXPECT_LE(RelErrorNorm(by_row, ref), tol);  // NaN (an unwritten row) fails too
    const std::string untouched = got_bytes.substr(static_cast<size_t>(R) * q_elems * elem);
    EXPECT_EQ(untouched, std::string(untouched.size(), '\xFF')) << "the row no query names was written";
  }
  for (void* a : allocs) cudaFree(a);
}

TEST(PagedAttentionTest, MatchesTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int D : {16, 32, 64, 128}) {
      // Decode rows of four sequences, one per sequence, mixed lengths.
      CheckPaged({dt, 8, 2, D, {1, 17, 300, 1000}, {0, 1, 2, 3}}, ++seed);
      // A prefill chunk: rows of one sequence at consecutive positions, plus a decode row.
      CheckPaged({dt, 4, 4, D, {33, 34, 35, 36, 37, 5}, {0, 0, 0, 0, 0, 1}, 32}, ++seed);
    }
    CheckPaged({dt, 32, 4, 128, {4096, 77}, {0, 1}}, ++seed);  // GQA 8, a long context
  }
}

TEST(PagedAttentionTest, RejectsWhatItCannotRun) {
  EXPECT_FALSE(cuda::PagedAttentionSupported(8, 2, 96));   // head dim
  EXPECT_FALSE(cuda::PagedAttentionSupported(32, 2, 64));  // group of 16
  EXPECT_FALSE(cuda::PagedAttentionSupported(8, 3, 64));   // not a multiple
  if (!HaveGpu()) return;
  cuda::PagedAttentionParams p;
  p.R = 1;
  p.Hq = 8;
  p.Hkv = 2;
  p.D = 96;
  EXPECT_TRUE(cuda::LaunchPagedAttention(p, 1, nullptr, nullptr).unsupported);
  p.D = 64;
  EXPECT_FALSE(cuda::LaunchPagedAttention(p, 2, nullptr, nullptr).ok());  // splits without a workspace
  EXPECT_FALSE(cuda::LaunchPagedAttention(p, cuda::kPagedMaxSplits + 1, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace fusedserve
