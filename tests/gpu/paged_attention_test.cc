// The paged attention kernel (kernels/cuda/paged_attention.h) against the CPU
// reference: each query row's keys gathered from the cache through its
// sequence's block table (blocks shuffled, tables wider than needed) and fed
// to cpu::AttentionDecode. Rows of several sequences with mixed context
// lengths (decode rows and prefill-chunk rows of one sequence), every dtype,
// every supported head dim, GQA up to 8, one split and several (the combine
// pass, workspace counters reused across launches), both kernels (CUDA
// cores; tensor cores for 16-bit types at head dims 64 and 128). Outputs are poisoned
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
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "tests/gpu/device_upload.h"
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
  cuda::PagedAttentionParams p;
  p.dtype = c.dt;
  p.q = UploadBytes(q.data, &allocs);
  p.k_cache = UploadBytes(kc.data, &allocs);
  p.v_cache = UploadBytes(vc.data, &allocs);
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
  // Both kernels: CUDA cores (0) and tensor cores (1; bf16/fp16 at D 64/128,
  // the CUDA-core kernel elsewhere).
  // Decode rows (one a sequence) also with the keys before ctx - 1 loaded
  // ahead of the programmatic-launch wait: the same results.
  const bool one_row_per_seq = std::set<int>(c.row_seq.begin(), c.row_seq.end()).size() == c.row_seq.size();
  // The tensor-core kernel merges 2-16 splits either through global memory
  // (merge 0) or as one thread-block cluster (merge 1).
  for (int kernel : {0, 1})
    for (int merge : {0, 1})
      for (bool early : {false, true})
        for (int splits : {1, tuned, 4, 5, 2, cuda::kPagedMaxClusterSplits, cuda::kPagedMaxSplits, 4}) {
          // (4 twice: the global merge's counters are left at zero)
          if (int64_t{R} * splits > cuda::kPagedMaxSplitRows || (early && !one_row_per_seq)) continue;
          if (merge == 1 && (kernel == 0 || splits == 1)) continue;
          SCOPED_TRACE("splits " + std::to_string(splits) + " kernel " + std::to_string(kernel) + " merge " +
                       std::to_string(merge) + (early ? " early keys" : ""));
          p.kernel = kernel;
          p.merge = merge;
          p.only_last_key_new = early;
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
          for (int r = 0; r < R; ++r)
            std::copy_n(gf.begin() + rows[r] * q_elems, q_elems, by_row.begin() + r * q_elems);
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
    // The 1B and 8B decode shapes (GQA 4), rows of lengths around the tensor-core
    // kernel's key tiles (8 keys), warp iterations (16-32 keys, x 4 warps) and
    // PagedOneCtaKeys (rows up to 128 keys take one split of the launch's).
    CheckPaged({dt, 32, 8, 64, {1, 8, 9, 31, 33, 128, 129, 2048}, {0, 1, 2, 3, 4, 5, 6, 7}}, ++seed);
    CheckPaged({dt, 32, 8, 128, {2, 15, 16, 17, 128, 129, 255, 257, 1000}, {0, 1, 2, 3, 4, 5, 6, 7, 8}}, ++seed);
    // A lone row at head dim 128 takes one CTA only up to 64 keys (PagedOneCtaKeys).
    for (int ctx : {64, 65, 128}) CheckPaged({dt, 32, 8, 128, {ctx}, {0}}, ++seed);
  }
}

// LaunchRopeKvWrite against a host rotation in double: q/k rotated by the
// position's (cos, sin), v copied, dense q/k/v and the cache rows at
// shuffled slots; both qkv layouts (plain halves and interleaved pairs).
// Head dims whose half is a whole number of 16-byte vectors take the vector
// kernel, D = 6 and a misaligned cache the scalar one. Outputs poisoned;
// cache slots no token names must stay poisoned.
struct RopeCase {
  DType dt;
  int Hq, Hkv, D;
  bool interleaved;
  bool dense_kv = true;     // also write dense k/v
  bool misaligned = false;  // cache pointers off 16-byte alignment
};

void CheckRopeKv(const RopeCase& c, uint64_t seed) {
  SCOPED_TRACE(std::string(DTypeName(c.dt)) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " D=" +
               std::to_string(c.D) + (c.interleaved ? " interleaved" : " plain") + (c.misaligned ? " misaligned" : ""));
  std::mt19937_64 rng(seed);
  const int T = 37, H3 = c.Hq + 2 * c.Hkv, half = c.D / 2, max_pos = 300;
  const int64_t slots = 2 * T + 5;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> qkv_f(static_cast<size_t>(T) * H3 * c.D);
  for (float& x : qkv_f) x = dist(rng);
  const HostTensor qkv = HostTensor::FromFloat(c.dt, {T, H3 * c.D}, qkv_f);
  const std::vector<float> x = qkv.ToFloat();  // the values as stored
  std::vector<float2> cos_sin(static_cast<size_t>(max_pos) * half);
  for (int pos = 0; pos < max_pos; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double a = pos * std::pow(10000.0, -2.0 * i / c.D);
      cos_sin[pos * half + i] = {static_cast<float>(std::cos(a)), static_cast<float>(std::sin(a))};
    }
  }
  std::vector<int32_t> positions(T), slot_of(T);
  for (int32_t& p : positions) p = static_cast<int32_t>(rng() % max_pos);
  std::vector<int32_t> all_slots(slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::copy_n(all_slots.begin(), T, slot_of.begin());

  // Reference outputs in float: q [T,Hq,D], k/v [T,Hkv,D], caches [slots,Hkv,D] (NaN = untouched).
  const float nan = std::nanf("");
  std::vector<float> rq(static_cast<size_t>(T) * c.Hq * c.D), rk(static_cast<size_t>(T) * c.Hkv * c.D), rv(rk.size()),
      rkc(static_cast<size_t>(slots) * c.Hkv * c.D, nan), rvc(rkc.size(), nan);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H3; ++h) {
      const float* src = x.data() + (static_cast<size_t>(t) * H3 + h) * c.D;
      const bool rotate = h < c.Hq + c.Hkv;
      for (int i = 0; i < half; ++i) {
        const bool pair = rotate && c.interleaved;
        double a = src[pair ? 2 * i : i], b = src[pair ? 2 * i + 1 : i + half];
        if (rotate) {
          const float2 cs = cos_sin[positions[t] * half + i];
          const double ra = a * cs.x - b * cs.y, rb = b * cs.x + a * cs.y;
          a = ra;
          b = rb;
        }
        auto put = [&](std::vector<float>& dst, int64_t row) {
          dst[row * c.D + i] = static_cast<float>(a);
          dst[row * c.D + i + half] = static_cast<float>(b);
        };
        if (h < c.Hq) {
          put(rq, int64_t{t} * c.Hq + h);
        } else {
          const bool is_k = h < c.Hq + c.Hkv;
          const int kh = is_k ? h - c.Hq : h - c.Hq - c.Hkv;
          put(is_k ? rk : rv, int64_t{t} * c.Hkv + kh);
          put(is_k ? rkc : rvc, int64_t{slot_of[t]} * c.Hkv + kh);
        }
      }
    }
  }

  std::vector<void*> allocs;
  auto poisoned = [&](size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + 16), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xFF, bytes + 16), cudaSuccess);
    allocs.push_back(p);
    return p;
  };
  const size_t elem = DTypeSize(c.dt);
  const size_t q_bytes = rq.size() * elem, kv_bytes = rk.size() * elem, cache_bytes = rkc.size() * elem;
  cuda::RopeKvParams p;
  p.dtype = c.dt;
  p.qkv = UploadBytes(qkv.data, &allocs);
  p.positions = Upload(positions, &allocs);
  p.cos_sin = Upload(cos_sin, &allocs);
  p.slots = Upload(slot_of, &allocs);
  p.q = poisoned(q_bytes);
  p.k = c.dense_kv ? poisoned(kv_bytes) : nullptr;
  p.v = c.dense_kv ? poisoned(kv_bytes) : nullptr;
  const size_t off = c.misaligned ? elem : 0;  // one element in: not 16-byte aligned
  p.k_cache = static_cast<char*>(poisoned(cache_bytes)) + off;
  p.v_cache = static_cast<char*>(poisoned(cache_bytes)) + off;
  p.T = T;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.D = c.D;
  p.interleaved = c.interleaved;
  const CudaStatus st = cuda::LaunchRopeKvWrite(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());

  const double tol = c.dt == DType::kF32 ? 1e-6 : (c.dt == DType::kF16 ? 1e-3 : 8e-3);
  auto fetch = [&](const void* d, size_t bytes, std::vector<int64_t> shape) {
    HostTensor h;
    h.dtype = c.dt;
    h.shape = std::move(shape);
    h.data.assign(bytes, '\0');
    EXPECT_EQ(cudaMemcpy(h.data.data(), d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h.ToFloat();
  };
  EXPECT_LE(RelErrorNorm(fetch(p.q, q_bytes, {T, c.Hq, c.D}), rq), tol) << "q";
  if (c.dense_kv) {
    EXPECT_LE(RelErrorNorm(fetch(p.k, kv_bytes, {T, c.Hkv, c.D}), rk), tol) << "k";
    EXPECT_LE(RelErrorNorm(fetch(p.v, kv_bytes, {T, c.Hkv, c.D}), rv), tol) << "v";
  }
  for (int which = 0; which < 2; ++which) {
    const std::vector<float> got = fetch(which == 0 ? p.k_cache : p.v_cache, cache_bytes, {slots, c.Hkv, c.D});
    const std::vector<float>& want = which == 0 ? rkc : rvc;
    std::vector<float> g, w;
    int64_t untouched_written = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      if (std::isnan(want[j])) {
        untouched_written += !std::isnan(got[j]);
      } else {
        g.push_back(got[j]);
        w.push_back(want[j]);
      }
    }
    EXPECT_LE(RelErrorNorm(g, w), tol) << (which == 0 ? "k cache" : "v cache");
    EXPECT_EQ(untouched_written, 0) << "a slot no token names was written";
  }
  for (void* a : allocs) cudaFree(a);
}

TEST(PagedAttentionTest, RopeKvWriteMatchesTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 900;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int D : {16, 64, 128}) {
      for (bool interleaved : {false, true}) CheckRopeKv({dt, 8, 2, D, interleaved}, ++seed);
    }
    CheckRopeKv({dt, 32, 8, 64, true, /*dense_kv=*/false}, ++seed);  // the 1B model's shape, cache only
    CheckRopeKv({dt, 4, 4, 6, false}, ++seed);                       // half = 3: the scalar kernel
    CheckRopeKv({dt, 8, 2, 64, true, true, /*misaligned=*/true}, ++seed);
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
