// The CUDA backend end to end (host tensors in, host tensors out, through the
// arena, staging buffers and family dispatchers) against the CPU backend, for
// every op and float dtype. Skips where there is no GPU.
#include "kernels/cuda/cuda_backend.h"

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

double Tolerance(DType dt) { return dt == DType::kF32 ? 1e-4 : dt == DType::kF16 ? 4e-3 : 2e-2; }

struct Case {
  std::string op;
  std::vector<int64_t> key;
};

std::vector<Case> Cases() {
  return {{"rms_norm", {17, 769}},       {"rms_norm", {4, 4096}},
          {"add_rms_norm", {3, 4096}},   {"add_rms_norm_silu", {5, 1000}},
          {"layer_norm", {7, 4096}},     {"softmax", {3, 32000}},
          {"silu_and_mul", {9, 1376}},   {"gelu", {5, 1001}},
          {"rope", {7, 8, 2, 128}},      {"linear", {17, 256, 512}},
          {"swiglu_mlp", {5, 256, 512}}, {"attention", {65, 8, 2, 128}},
          {"attention", {33, 4, 4, 64}}, {"attention_decode", {3, 100, 8, 2, 128}}};
}

// Every output of the CPU backend's answer is in the GPU's, same dtype and
// shape, within the dtype's tolerance.
void ExpectSameOutputs(const TensorMap& got, const TensorMap& want, DType dt) {
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const HostTensor& g = got.at(name);
    EXPECT_EQ(g.dtype, t.dtype) << name;
    EXPECT_EQ(g.shape, t.shape) << name;
    EXPECT_LE(RelErrorNorm(g.ToFloat(), t.ToFloat()), Tolerance(dt)) << name;
  }
}

TEST(CudaBackend, EveryOpMatchesCpuBackend) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  uint64_t seed = 100;
  for (const Case& c : Cases()) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      SCOPED_TRACE(c.op + " " + DTypeName(dt));
      OpRequest r = MakeRandomRequest(c.op, dt, c.key, seed++);
      absl::StatusOr<TensorMap> want = cpu->Run(r);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<TensorMap> got = (*gpu)->Run(r);
      if (!got.ok() && got.status().code() == absl::StatusCode::kInvalidArgument) {
        // A documented backend limit (e.g. a dtype the CUDA path does not take).
        std::printf("[ unsupported ] %s %s: %s\n", c.op.c_str(), DTypeName(dt),
                    std::string(got.status().message()).c_str());
        continue;
      }
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSameOutputs(*got, *want, dt);
    }
  }
}

// Buffers are reused across requests of different sizes: a large request
// then a small one must not see stale data.
TEST(CudaBackend, ReusesBuffersAcrossSizes) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  for (int64_t m : {512, 1, 2048, 3}) {
    OpRequest r = MakeRandomRequest("rms_norm", DType::kBF16, {m, 4096}, static_cast<uint64_t>(m));
    absl::StatusOr<TensorMap> got = (*gpu)->Run(r);
    absl::StatusOr<TensorMap> want = cpu->Run(r);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_LE(RelErrorNorm(got->at("y").ToFloat(), want->at("y").ToFloat()), 2e-2);
  }
}

// Row-wise ops with up to 1 MiB of inputs and outputs run zero-copy (the
// kernel reads and writes mapped pinned memory), larger ones through device
// copies: both sides of that limit, alternating, match the CPU backend.
TEST(CudaBackend, ZeroCopyLimitBothSides) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  uint64_t seed = 500;
  // bf16 [m, 4096] rms_norm: 60 rows are 0.95 MiB in and out, 64 rows 1.01 MiB.
  for (const Case& c : {Case{"rms_norm", {60, 4096}}, Case{"rms_norm", {64, 4096}}, Case{"softmax", {8, 32000}},
                        Case{"softmax", {9, 32000}}, Case{"add_rms_norm", {40, 4096}}, Case{"layer_norm", {64, 4096}},
                        Case{"silu_and_mul", {20, 8192}}, Case{"gelu", {60, 4096}}, Case{"rope", {60, 8, 2, 128}},
                        Case{"rms_norm", {1, 4096}}}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(c.op + " " + DTypeName(dt));
      OpRequest r = MakeRandomRequest(c.op, dt, c.key, seed++);
      absl::StatusOr<TensorMap> want = cpu->Run(r);
      absl::StatusOr<TensorMap> got = (*gpu)->Run(r);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSameOutputs(*got, *want, dt);
    }
  }
}

// The completion wait: a lane's stream writes a new sequence number into the
// lane's completion word after each launch, and the caller reads the outputs
// once the word holds it. Back-to-back small calls on one lane, each with
// fresh inputs, alternating zero-copy and copy-path launches: every answer is
// that call's own (a wait that returned on an earlier call's number would
// hand back the previous outputs, or half-written ones).
TEST(CudaBackend, BackToBackCallsEachWaitForTheirOwnLaunch) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  for (uint64_t i = 0; i < 200; ++i) {
    const Case c = i % 10 == 9   ? Case{"rms_norm", {96, 4096}}
                   : i % 10 == 4 ? Case{"linear", {3, 256, 128}}
                                 : Case{"rms_norm", {1, 4096}};
    SCOPED_TRACE(c.op + " call " + std::to_string(i));
    OpRequest r = MakeRandomRequest(c.op, DType::kBF16, c.key, 9000 + i);
    absl::StatusOr<TensorMap> got = (*gpu)->Run(r);
    absl::StatusOr<TensorMap> want = cpu->Run(r);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectSameOutputs(*got, *want, DType::kBF16);
  }
}

// With several lanes, threads that call at once each get their own answer:
// small memory-bound ops on any lane (zero-copy), GEMMs, attention and a
// row-wise op above 1 MiB (through copies) on lane 0 beside them; every
// answer matches the CPU backend's for the same request.
TEST(CudaBackend, LanesServeConcurrentCallers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(MakeCudaBackend(0, {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCudaBackend(0, {}, kMaxCudaSmallOpLanes + 1).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {}, 4);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const std::vector<Case> cases = {
      {"rms_norm", {1, 4096}},     {"rms_norm", {3, 769}},      {"softmax", {2, 32000}},
      {"add_rms_norm", {2, 4096}}, {"silu_and_mul", {4, 1376}}, {"rope", {5, 8, 2, 128}},
      {"rms_norm", {80, 4096}},    {"linear", {9, 256, 512}},   {"attention", {33, 4, 4, 64}}};
  constexpr int kThreads = 8, kPerThread = 36;
  struct Job {
    OpRequest request;
    TensorMap want;
    DType dt;
  };
  std::vector<std::vector<Job>> jobs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const Case& c = cases[static_cast<size_t>(t * 5 + i) % cases.size()];
      const DType dt = (t + i) % 3 == 0 ? DType::kF32 : DType::kBF16;
      OpRequest r = MakeRandomRequest(c.op, dt, c.key, static_cast<uint64_t>(10000 + 100 * t + i));
      absl::StatusOr<TensorMap> want = cpu->Run(r);
      ASSERT_TRUE(want.ok()) << want.status();
      jobs[t].push_back({std::move(r), *std::move(want), dt});
    }
  }
  // (gtest's assertions are thread-safe where pthreads are.)
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (const Job& j : jobs[t]) {
        SCOPED_TRACE(j.request.op + " " + DTypeName(j.dt));
        absl::StatusOr<TensorMap> got = (*gpu)->Run(j.request);
        ASSERT_TRUE(got.ok()) << got.status();
        ExpectSameOutputs(*got, j.want, j.dt);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// `r`'s tensors moved into a staging block of `gpu`'s as the wire decoder
// lays them out (aligned, in order), the rest of the block poisoned (0xff:
// NaN in every float dtype). Null when the backend gives none.
std::shared_ptr<StagingBlock> Stage(Backend& gpu, OpRequest* r) {
  size_t bytes = 0;
  for (const auto& [name, t] : r->inputs) bytes += t.nbytes();
  std::shared_ptr<StagingBlock> b = gpu.TakeStaging(2 * bytes + 4096);
  if (b == nullptr) return nullptr;
  std::memset(b->host, 0xff, b->size);
  for (auto& [name, t] : r->inputs) {
    const size_t at = StagingBlock::AlignUp(b->used);
    std::memcpy(b->host + at, t.data.data(), t.data.size());
    t.SetView(b, b->host + at, t.data.size());
    std::string().swap(t.data);
    b->used = at + t.view_size;
  }
  return b;
}

// Requests decoded into a staging block: the small memory-bound ones read it
// in place and leave their outputs in it, the others copy from it as from
// their own bytes; every answer is the reference's, and the in-place ones
// call the caller's WhileRunning with their outputs before they wait. A second launch of the
// same request (its block's output room taken) answers from the lane's own
// buffers, and blocks nothing holds any more are handed out again.
TEST(CudaBackend, StagedRequestsRunInPlace) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  EXPECT_EQ(cpu->TakeStaging(4096), nullptr);
  std::set<const char*> blocks;
  int staged = 0;
  uint64_t seed = 500;
  for (const Case& c : Cases()) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(c.op + " " + DTypeName(dt));
      OpRequest r = MakeRandomRequest(c.op, dt, c.key, seed++);
      absl::StatusOr<TensorMap> want = cpu->Run(r);
      ASSERT_TRUE(want.ok()) << want.status();
      size_t bytes = 0;
      for (const auto& [name, t] : r.inputs) bytes += t.nbytes();
      std::shared_ptr<StagingBlock> block = Stage(**gpu, &r);
      if (block == nullptr) {  // past what the backend stages (twice the zero-copy limit)
        EXPECT_GT(bytes, size_t{1} << 20);
        continue;
      }
      ++staged;
      for (int launch = 0; launch < 2; ++launch) {
        // The host work for while the device runs: called once the outputs'
        // places are known (in place only), with the outputs Run returns.
        int calls = 0;
        std::vector<std::tuple<std::string, std::vector<int64_t>, const char*, size_t>> pending;
        const WhileRunning while_running = [&](const TensorMap& outputs) {
          ++calls;
          for (const auto& [name, t] : outputs) pending.emplace_back(name, t.shape, t.view, t.view_size);
        };
        absl::StatusOr<TensorMap> got = (*gpu)->Run(r, StopCheck(), while_running);
        ASSERT_TRUE(got.ok()) << got.status();
        ExpectSameOutputs(*got, *want, dt);
        const bool in_place = launch == 0 && r.spec->memory_bound;
        EXPECT_EQ(calls, in_place ? 1 : 0) << "launch " << launch;
        size_t i = 0;
        for (const auto& [name, t] : *got) {
          EXPECT_EQ(t.view != nullptr, in_place) << name << " launch " << launch;
          if (in_place) {
            EXPECT_EQ(t.block, block) << name;
            ASSERT_LT(i, pending.size());
            EXPECT_EQ(pending[i], std::make_tuple(name, t.shape, t.view, t.view_size)) << name;
            ++i;
          }
        }
        EXPECT_EQ(i, pending.size());
      }
      blocks.insert(block->host);
    }
  }
  // The requests, one after another, on at most the pool's 8 blocks.
  EXPECT_GE(staged, 24);
  EXPECT_LE(blocks.size(), 8u);
}

// Each thread stages into blocks of its own while the lanes run side by side.
TEST(CudaBackend, StagedRequestsFromConcurrentCallers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {}, 4);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const std::vector<Case> cases = {{"rms_norm", {1, 4096}},  {"add_rms_norm", {2, 4096}}, {"softmax", {2, 32000}},
                                   {"rope", {5, 8, 2, 128}}, {"silu_and_mul", {4, 1376}}, {"linear", {9, 256, 512}}};
  constexpr int kThreads = 8, kPerThread = 30;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<OpRequest, TensorMap>> held;  // up to three calls' blocks in use at once
      for (int i = 0; i < kPerThread; ++i) {
        const Case& c = cases[static_cast<size_t>(t + i) % cases.size()];
        OpRequest r = MakeRandomRequest(c.op, DType::kBF16, c.key, static_cast<uint64_t>(20000 + 100 * t + i));
        absl::StatusOr<TensorMap> want = cpu->Run(r);
        ASSERT_TRUE(want.ok()) << want.status();
        ASSERT_NE(Stage(**gpu, &r), nullptr);
        absl::StatusOr<TensorMap> got = (*gpu)->Run(r);
        ASSERT_TRUE(got.ok()) << got.status();
        ExpectSameOutputs(*got, *want, DType::kBF16);
        held.emplace_back(std::move(r), *std::move(got));
        if (held.size() > 3) held.erase(held.begin());
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// A valid request the kernels do not take (head dim 16) is answered by the
// CPU reference fallback, not refused.
TEST(CudaBackend, UnsupportedShapesFallBackToTheReference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  for (const Case& c : {Case{"attention", {9, 4, 2, 16}}, Case{"attention_decode", {2, 7, 4, 2, 16}}}) {
    OpRequest r = MakeRandomRequest(c.op, DType::kBF16, c.key, 7);
    absl::StatusOr<TensorMap> got = (*gpu)->Run(r);
    ASSERT_TRUE(got.ok()) << c.op << ": " << got.status();
    absl::StatusOr<TensorMap> want = cpu->Run(r);
    EXPECT_EQ(got->at("o").data, want->at("o").data) << c.op;
  }
}

}  // namespace
}  // namespace fusedserve
