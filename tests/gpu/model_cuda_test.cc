// The CUDA model runner against the CPU model runner (the fp32 oracle) on the
// same random weights: prefill logits (mixed prompt lengths in one step, and
// a prompt split over two steps), greedy decode of a batch whose sequences
// join at different steps (decode steps replay CUDA graphs, padding rows
// included), and TransformerBlock layer ranges. Both runners are fed the same
// tokens (the CPU's greedy choice), so one near-tie never cascades; a token
// where the two argmaxes differ must be a near-tie of the CPU logits.
// Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/dtype.h"
#include "model/cuda_runner.h"
#include "model/runner.h"
#include "model/weights.h"
#include "tests/gpu/model_configs.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

ModelConfig Mid128Config() {  // head dim 128, GQA 4, untied, llama3 rope scaling
  ModelConfig c = MidConfig();
  c.name = "mid128";
  c.hidden = 512;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 128;
  c.rope_scaling = {true, 8.0, 1.0, 4.0, 512};
  return c;
}

// Relative L2 bound on logits: bf16 activations vs the fp32 CPU runner.
double Tolerance(const ModelConfig& c) { return c.dtype == DType::kF32 ? 1e-3 : 3e-2; }

struct Pair {
  std::unique_ptr<ModelRunner> cpu, gpu;
};

// tensor_parallel > 0: the tensor-parallel path over that many GPUs (one
// included: the path is forced).
Pair MakePair(const ModelConfig& c, int64_t blocks, int64_t block_size, bool graphs = true,
              ConfigLookup tuned = nullptr, bool compare_decode_graphs = false,
              int decode_fusion = CudaModelRunnerOptions{}.decode_fusion, int tensor_parallel = 0) {
  Pair p;
  auto cpu = MakeCpuModelRunner(ModelWeights::Random(c, 7), 0);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  CudaModelRunnerOptions o;
  o.max_tokens = 1024;
  o.max_seqs = 16;
  o.cuda_graphs = graphs;
  o.max_graph_batch = 8;
  o.tuned = std::move(tuned);
  o.compare_decode_graphs = compare_decode_graphs;
  o.decode_fusion = decode_fusion;
  o.tensor_parallel = std::max(1, tensor_parallel);
  o.force_tensor_parallel_path = tensor_parallel > 0;
  auto gpu = MakeCudaModelRunner(ModelWeights::Random(c, 7), o);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (!cpu.ok() || !gpu.ok()) return p;
  p.cpu = *std::move(cpu);
  p.gpu = *std::move(gpu);
  EXPECT_TRUE(p.cpu->InitKvCache(blocks, block_size).ok());
  absl::Status s = p.gpu->InitKvCache(blocks, block_size);
  EXPECT_TRUE(s.ok()) << s;
  return p;
}

// A sequence of the test: its tokens so far, how many are cached, its blocks.
struct Seq {
  std::vector<int32_t> tokens;
  int64_t cached = 0;
  std::vector<int32_t> blocks;
  // Its next step: every token not yet in the cache.
  SeqForward Next() const {
    SeqForward f;
    f.start = cached;
    f.tokens = tokens.data() + cached;
    f.num_tokens = static_cast<int64_t>(tokens.size()) - cached;
    f.block_table = blocks.data();
    f.num_blocks = static_cast<int64_t>(blocks.size());
    return f;
  }
};

int Argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// `n` sequences: a prefill, then three decode steps (from the graphs), each
// sequence's logits within tolerance of the CPU runner's, fed the CPU's greedy token.
void ExpectDecodeMatchesCpu(const ModelConfig& c, Pair& p, int n) {
  std::mt19937 rng(6);
  std::vector<Seq> seqs(n);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int t = 0; t < 5 + 7 * static_cast<int>(i); ++t) {
      seqs[i].tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
    }
    for (int b = 0; b < 4; ++b) seqs[i].blocks.push_back(static_cast<int32_t>(4 * i + b));
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<SeqForward> batch;
    for (const Seq& s : seqs) batch.push_back(s.Next());
    std::vector<float> lc, lg;
    ASSERT_TRUE(p.cpu->ForwardLogits(batch, &lc).ok());
    absl::Status st = p.gpu->ForwardLogits(batch, &lg);
    ASSERT_TRUE(st.ok()) << st;
    for (size_t b = 0; b < seqs.size(); ++b) {
      EXPECT_LT(RelErrorNorm(lg.data() + b * c.vocab, lc.data() + b * c.vocab, c.vocab), Tolerance(c))
          << "step " << step;
      Seq& s = seqs[b];
      s.cached = static_cast<int64_t>(s.tokens.size());
      s.tokens.push_back(Argmax(lc.data() + b * c.vocab, c.vocab));
    }
  }
}

// TransformerBlock: two layers over 2 sequences of S rows, against the CPU runner.
void ExpectLayersMatchCpu(const ModelConfig& c, Pair& p, int64_t S = 33) {
  const int64_t B = 2, D = c.hidden;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(B * S * D);
  for (float& v : x) v = nd(rng);
  std::vector<int64_t> pos(B * S);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) pos[b * S + s] = 10 * b + s;
  }
  const int64_t first = c.layers > 2 ? 1 : 0, n = std::min<int64_t>(2, c.layers);
  std::vector<float> xc = x, xg = x;
  ASSERT_TRUE(p.cpu->RunLayers(first, n, B, S, pos.data(), xc.data()).ok());
  absl::Status st = p.gpu->RunLayers(first, n, B, S, pos.data(), xg.data());
  ASSERT_TRUE(st.ok()) << st;
  const double e = RelErrorNorm(xg.data(), xc.data(), B * S * D);
  std::printf("[%s] TransformerBlock layers [%ld,%ld): rel err %.3e\n", c.name.c_str(), static_cast<long>(first),
              static_cast<long>(first + n), e);
  EXPECT_LT(e, Tolerance(c));
}

class ModelCudaTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  ModelConfig Config() const {
    switch (GetParam()) {
      case 0:
        return *PresetConfig("tiny");
      case 1:
        return MidConfig();
      default:
        return Mid128Config();
    }
  }
};

// Prefill of prompts of several lengths in one step, then the same logits
// when a prompt is split over two or three steps (later chunks attend to the
// cached tokens: flash over K/V gathered from the cache on Hopper, paged
// attention with several query rows per sequence else), and a step mixing a
// long later chunk, a one-token chunk and a fresh prompt.
TEST_P(ModelCudaTest, PrefillLogits) {
  const ModelConfig c = Config();
  const int64_t bs = 16;
  Pair p = MakePair(c, 256, bs);
  ASSERT_TRUE(p.gpu != nullptr);
  std::mt19937 rng(1);
  const std::vector<int64_t> lens = {1, 7, 37, 300};
  std::vector<Seq> seqs(lens.size());
  // Blocks handed out in a shuffled order so block tables are not contiguous.
  std::vector<int32_t> free_blocks(256);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  size_t next = 0;
  std::vector<SeqForward> batch;
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int64_t t = 0; t < lens[i]; ++t) seqs[i].tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
    for (int64_t b = 0; b < (lens[i] + bs - 1) / bs; ++b) seqs[i].blocks.push_back(free_blocks[next++]);
    batch.push_back(seqs[i].Next());
  }
  std::vector<float> lc, lg;
  ASSERT_TRUE(p.cpu->ForwardLogits(batch, &lc).ok());
  absl::Status s = p.gpu->ForwardLogits(batch, &lg);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(lc.size(), lg.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    const double e = RelErrorNorm(lg.data() + i * c.vocab, lc.data() + i * c.vocab, c.vocab);
    std::printf("[%s] prefill len %ld: logits rel err %.3e\n", c.name.c_str(), static_cast<long>(lens[i]), e);
    EXPECT_LT(e, Tolerance(c)) << "prompt length " << lens[i];
  }

  // The 300-token prompt again in chunks (each split on fresh blocks): the
  // later chunks attend to the earlier tokens through the cache, on the
  // flash kernel over gathered K/V where it runs (Hopper, >= 16 rows; a
  // prefix-cache hit looks like the 40 + 260 split) and paged attention else.
  Seq& long_seq = seqs.back();
  const std::vector<std::vector<int64_t>> splits = {{200, 100}, {40, 260}, {17, 283}, {100, 150, 50}, {128, 7, 165}};
  for (const std::vector<int64_t>& split : splits) {
    std::vector<int32_t> blocks2;
    for (size_t b = 0; b < long_seq.blocks.size(); ++b) blocks2.push_back(free_blocks[next++]);
    std::vector<float> l1c, l1g;
    std::string name;
    int64_t start = 0;
    for (int64_t n : split) {
      SeqForward f;
      f.start = start;
      f.num_tokens = n;
      f.tokens = long_seq.tokens.data() + f.start;
      f.block_table = blocks2.data();
      f.num_blocks = static_cast<int64_t>(blocks2.size());
      ASSERT_TRUE(p.cpu->ForwardLogits({f}, &l1c).ok());
      s = p.gpu->ForwardLogits({f}, &l1g);
      ASSERT_TRUE(s.ok()) << s;
      const double e = RelErrorNorm(l1g.data(), l1c.data(), c.vocab);
      name += (name.empty() ? "" : "+") + std::to_string(n);
      EXPECT_LT(e, Tolerance(c)) << "chunks " << name;
      start += n;
    }
    const double e = RelErrorNorm(l1g.data(), l1c.data(), c.vocab);
    std::printf("[%s] chunked prefill %s: logits rel err %.3e\n", c.name.c_str(), name.c_str(), e);
  }

  // A step mixing a long later chunk (64 -> 300), a decode-like one-token
  // chunk and a fresh 50-token prompt, after a step with the first two's
  // first chunks: every sequence's logits against the CPU runner's.
  std::vector<std::vector<int32_t>> mix_blocks(3);
  for (auto& mb : mix_blocks) {
    for (int b = 0; b < 19; ++b) mb.push_back(free_blocks[next++]);
  }
  const std::vector<int32_t>& mix_tokens = long_seq.tokens;
  const int64_t firsts[3] = {64, 20, 0}, totals[3] = {300, 21, 50};
  for (int step = 0; step < 2; ++step) {
    std::vector<SeqForward> batch2;
    for (int i = 0; i < 3; ++i) {
      if (step == 0 && firsts[i] == 0) continue;
      SeqForward f;
      f.start = step == 0 ? 0 : firsts[i];
      f.num_tokens = step == 0 ? firsts[i] : totals[i] - firsts[i];
      f.tokens = mix_tokens.data() + i * 3 + f.start;
      f.block_table = mix_blocks[i].data();
      f.num_blocks = static_cast<int64_t>(mix_blocks[i].size());
      batch2.push_back(f);
    }
    std::vector<float> l2c, l2g;
    ASSERT_TRUE(p.cpu->ForwardLogits(batch2, &l2c).ok());
    s = p.gpu->ForwardLogits(batch2, &l2g);
    ASSERT_TRUE(s.ok()) << s;
    for (size_t b = 0; b < batch2.size(); ++b) {
      const double e = RelErrorNorm(l2g.data() + b * c.vocab, l2c.data() + b * c.vocab, c.vocab);
      std::printf("[%s] mixed chunk step %d seq %zu (start %ld, %ld tokens): logits rel err %.3e\n", c.name.c_str(),
                  step, b, static_cast<long>(batch2[b].start), static_cast<long>(batch2[b].num_tokens), e);
      EXPECT_LT(e, Tolerance(c)) << "mixed step " << step << " sequence " << b;
    }
  }
}

// Greedy decode of 4 sequences joining at steps 0, 0, 3, 6 (prefill and
// decode mixed in a step; decode-only steps of 1..4 sequences from graphs).
TEST_P(ModelCudaTest, GreedyDecodeMixedBatch) {
  const ModelConfig c = Config();
  const int64_t bs = 16;
  Pair p = MakePair(c, 256, bs);
  ASSERT_TRUE(p.gpu != nullptr);
  std::mt19937 rng(2);
  const std::vector<int64_t> prompt = {5, 40, 17, 130};
  const std::vector<int> join = {0, 0, 3, 6};
  const int steps = 24;
  std::vector<Seq> seqs(prompt.size());
  int32_t next_block = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    for (int64_t t = 0; t < prompt[i]; ++t) seqs[i].tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  }
  int exact = 0, near_ties = 0, total = 0;
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<size_t> active;
    std::vector<SeqForward> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (step < join[i]) continue;
      Seq& s = seqs[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      while (static_cast<int64_t>(s.blocks.size()) * bs < len) s.blocks.push_back(next_block++);
      batch.push_back(s.Next());
      active.push_back(i);
    }
    std::vector<float> lc;
    ASSERT_TRUE(p.cpu->ForwardLogits(batch, &lc).ok());
    ForwardOutput with, without;
    absl::Status st = p.gpu->Forward(batch, &with);
    ASSERT_TRUE(st.ok()) << st;
    // The same step again (it rewrites the same cache rows) without logits:
    // the device argmax alone.
    for (SeqForward& f : batch) f.want_logits = false;
    st = p.gpu->Forward(batch, &without);
    ASSERT_TRUE(st.ok()) << st;
    const std::vector<float>& lg = with.logits;
    ASSERT_EQ(lg.size(), lc.size());
    for (size_t b = 0; b < active.size(); ++b) {
      // Device argmax == host argmax of the same logits, with or without the copy.
      EXPECT_EQ(with.greedy[b], cpu::GreedyToken(lg.data() + b * c.vocab, c.vocab)) << "step " << step;
      EXPECT_EQ(without.greedy[b], with.greedy[b]) << "step " << step;
    }
    for (size_t b = 0; b < active.size(); ++b) {
      const float* rc = lc.data() + b * c.vocab;
      const float* rg = lg.data() + b * c.vocab;
      const double e = RelErrorNorm(rg, rc, c.vocab);
      worst = std::max(worst, e);
      EXPECT_LT(e, Tolerance(c)) << "step " << step << " seq " << active[b];
      const int tc = Argmax(rc, c.vocab), tg = Argmax(rg, c.vocab);
      ++total;
      if (tc == tg) {
        ++exact;
      } else {
        // Near-tie: the GPU's pick is within a few times the logits' own
        // error of the CPU's maximum.
        double rms = 0;
        for (int64_t v = 0; v < c.vocab; ++v) rms += (double(rg[v]) - rc[v]) * (double(rg[v]) - rc[v]);
        rms = std::sqrt(rms / c.vocab);
        const double gap = double(rc[tc]) - rc[tg];
        EXPECT_LE(gap, 6 * rms + 1e-4) << "step " << step << " seq " << active[b] << ": not a near-tie";
        ++near_ties;
      }
      Seq& s = seqs[active[b]];
      s.cached = static_cast<int64_t>(s.tokens.size());
      s.tokens.push_back(tc);  // both runners continue with the CPU's token
    }
  }
  std::printf("[%s] greedy: %d/%d tokens identical, %d near-ties, worst logits rel err %.3e\n", c.name.c_str(), exact,
              total, near_ties, worst);
  EXPECT_GE(exact, total * 9 / 10);
}

// The fused decode layers (CudaModelRunnerOptions::decode_fusion: rope +
// cache write in the QKV GEMV, norms folded into the GEMVs with the residual
// adds in their epilogues, and both; with the megakernel bit, one-row steps
// run every layer in the decode megakernel) against the unfused kernels and
// the CPU runner: decode steps of 1, 2 and 4 sequences on the GEMV (forced
// by a tuned config above one row; the unfused reference on the built-in
// rule), of 2, 4 and 16 on the narrow skinny GEMM (the built-in rule,
// kDecodeSkinny), and of 40 and 64 on the Hopper skinny kernel where there is
// one (kDecodeSkinnyWide; elsewhere those steps run unfused), from graphs and
// eagerly, logits of every step. (The environment's FUSEDSERVE_DECODE_FUSION,
// when set, overrides every runner's mask.)
TEST_P(ModelCudaTest, FusedDecodeMatchesUnfused) {
  const ModelConfig c = Config();
  const int64_t bs = 16;
  constexpr int kMega = CudaModelRunnerOptions::kDecodeMegakernel;
  constexpr int kNormEpi = CudaModelRunnerOptions::kDecodeNormEpilogue;
  constexpr int kSkinny = CudaModelRunnerOptions::kDecodeSkinny | CudaModelRunnerOptions::kDecodeSkinnyWide;
  // The fusions need every layer projection on the GEMV or a skinny GEMM: the
  // built-in rule gives the GEMV one row and the skinny GEMMs 2-64; a tuned
  // config (forced here: "GEMV") gives the GEMV more.
  ConfigLookup gemv = [](const std::string& op, DType, const std::vector<int64_t>&) -> std::string {
    return op == "linear" ? "p1.a0" : op == "swiglu_mlp" ? "p1" : "";
  };
  for (int mask : {1, 2, 3, kMega | 1, kMega | 2, kNormEpi, kNormEpi | 1, kMega | kNormEpi | 1})
    for (bool graphs : {true, false})
      for (bool forced : {true, false})
        for (int64_t B : {1, 2, 4, 16, 40, 64}) {
          if ((!graphs && B == 2) || (forced && B >= 16) || (!forced && (B == 1 || (mask & (kMega | 2)) != 0)))
            continue;
          Pair fused = MakePair(c, 4 * B, bs, graphs, forced ? gemv : nullptr, false, forced ? mask : mask | kSkinny);
          Pair plain = MakePair(c, 4 * B, bs, graphs, nullptr, false, /*decode_fusion=*/0);
          ASSERT_TRUE(fused.gpu != nullptr && plain.gpu != nullptr);
          std::mt19937 rng(static_cast<unsigned>(100 + B));
          std::vector<Seq> seqs(B);
          for (int64_t b = 0; b < B; ++b) {
            for (int t = 0; t < 5 + 7 * (b % 4); ++t) seqs[b].tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
            seqs[b].blocks = {static_cast<int32_t>(2 * b), static_cast<int32_t>(2 * b + 1)};
          }
          double worst_cpu = 0, worst_plain = 0;
          for (int step = 0; step < 5; ++step) {  // step 0 prefills the prompts, then decodes
            std::vector<SeqForward> batch;
            for (const Seq& s : seqs) batch.push_back(s.Next());
            std::vector<float> lc, lf, lp;
            ASSERT_TRUE(fused.cpu->ForwardLogits(batch, &lc).ok());
            absl::Status st = fused.gpu->ForwardLogits(batch, &lf);
            ASSERT_TRUE(st.ok()) << st;
            st = plain.gpu->ForwardLogits(batch, &lp);
            ASSERT_TRUE(st.ok()) << st;
            for (int64_t b = 0; b < B; ++b) {
              const double ec = RelErrorNorm(lf.data() + b * c.vocab, lc.data() + b * c.vocab, c.vocab);
              const double ep = RelErrorNorm(lf.data() + b * c.vocab, lp.data() + b * c.vocab, c.vocab);
              worst_cpu = std::max(worst_cpu, ec);
              worst_plain = std::max(worst_plain, ep);
              EXPECT_LT(ec, Tolerance(c)) << "mask " << mask << " B=" << B << " step " << step << " seq " << b;
              EXPECT_LT(ep, Tolerance(c)) << "mask " << mask << " B=" << B << " step " << step << " seq " << b;
              Seq& s = seqs[b];
              s.cached = static_cast<int64_t>(s.tokens.size());
              s.tokens.push_back(Argmax(lc.data() + b * c.vocab, c.vocab));
            }
          }
          std::printf("[%s] fused decode mask %d B=%ld%s%s: worst logits rel err %.3e vs CPU, %.3e vs unfused\n",
                      c.name.c_str(), mask, static_cast<long>(B), graphs ? " (graphs)" : "",
                      forced ? " (GEMV forced)" : " (built-in rule)", worst_cpu, worst_plain);
        }
}

// Decode steps of 12, 24 and 48 sequences: more rows than the GEMV takes, so
// (bf16 configs) the projections run on the tensor-core skinny GEMM (48: its
// configs forced, since cuBLASLt is the default there: the Hopper kernel of
// skinny_hopper.h on a compute capability 9.0 device, cuBLASLt elsewhere).
// Logits of every decode step against the CPU runner.
TEST_P(ModelCudaTest, DecodeBatchesOnTheSkinnyPath) {
  const ModelConfig c = Config();
  const int64_t bs = 16;
  for (int64_t B : {12, 24, 48}) {
    ConfigLookup skinny = [](const std::string& op, DType, const std::vector<int64_t>&) -> std::string {
      return op == "linear" ? "p2.a0" : op == "swiglu_mlp" ? "p2" : "";
    };
    Pair p = MakePair(c, 4 * B, bs, /*graphs=*/true, B > 32 ? skinny : nullptr);
    ASSERT_TRUE(p.gpu != nullptr);
    std::mt19937 rng(static_cast<unsigned>(B));
    std::vector<Seq> seqs(B);
    for (int64_t b = 0; b < B; ++b) {
      for (int t = 0; t < 3 + b % 5; ++t) seqs[b].tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
      seqs[b].blocks = {static_cast<int32_t>(2 * b), static_cast<int32_t>(2 * b + 1)};
    }
    double worst = 0;
    for (int step = 0; step < 4; ++step) {  // step 0 prefills the prompts, then decodes
      std::vector<SeqForward> batch;
      for (const Seq& s : seqs) batch.push_back(s.Next());
      std::vector<float> lc, lg;
      ASSERT_TRUE(p.cpu->ForwardLogits(batch, &lc).ok());
      absl::Status st = p.gpu->ForwardLogits(batch, &lg);
      ASSERT_TRUE(st.ok()) << st;
      for (int64_t b = 0; b < B; ++b) {
        const double e = RelErrorNorm(lg.data() + b * c.vocab, lc.data() + b * c.vocab, c.vocab);
        worst = std::max(worst, e);
        EXPECT_LT(e, Tolerance(c)) << "B=" << B << " step " << step << " seq " << b;
        Seq& s = seqs[b];
        s.cached = static_cast<int64_t>(s.tokens.size());
        s.tokens.push_back(Argmax(lc.data() + b * c.vocab, c.vocab));  // both continue with the CPU's token
      }
    }
    std::printf("[%s] decode batch of %ld: worst logits rel err %.3e\n", c.name.c_str(), static_cast<long>(B), worst);
  }
}

// Whatever config the tuner picks for the model's kernels runs correctly in
// the runner: prefill and decode logits match the CPU runner with each
// linear, swiglu_mlp, attention and norm candidate forced on every shape (a
// candidate that cannot apply to a shape falls back to the built-in rule).
TEST_P(ModelCudaTest, ForcedKernelConfigsMatchCpu) {
  const ModelConfig c = Config();
  struct Forced {
    std::string linear, swiglu, attention, norm;
  };
  const std::vector<Forced> all = {
      {"p1.a0", "p1", "m64.w4", "t32.r2"}, {"p2.a0", "p2", "m128.w8", ""}, {"p0.a1", "p0", "m128.w4", "t1.r1"}};
  for (const Forced& f : all) {
    ConfigLookup lookup = [f](const std::string& op, DType, const std::vector<int64_t>&) -> std::string {
      if (op == "linear") return f.linear;
      if (op == "swiglu_mlp") return f.swiglu;
      if (op == "attention") return f.attention;
      return f.norm;
    };
    const int64_t bs = 16;
    Pair p = MakePair(c, 64, bs, /*graphs=*/true, lookup);
    ASSERT_TRUE(p.gpu != nullptr);
    std::mt19937 rng(4);
    std::vector<Seq> seqs(3);
    const std::vector<int64_t> lens = {1, 9, 40};
    for (size_t i = 0; i < seqs.size(); ++i) {
      for (int64_t t = 0; t < lens[i]; ++t) seqs[i].tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
      for (int b = 0; b < 4; ++b) seqs[i].blocks.push_back(static_cast<int32_t>(4 * i + b));
    }
    double worst = 0;
    for (int step = 0; step < 3; ++step) {  // a prefill step, then decode steps from graphs
      std::vector<SeqForward> batch;
      for (const Seq& s : seqs) batch.push_back(s.Next());
      std::vector<float> lc, lg;
      ASSERT_TRUE(p.cpu->ForwardLogits(batch, &lc).ok());
      absl::Status st = p.gpu->ForwardLogits(batch, &lg);
      ASSERT_TRUE(st.ok()) << st << " (" << f.linear << ")";
      for (size_t b = 0; b < seqs.size(); ++b) {
        const double e = RelErrorNorm(lg.data() + b * c.vocab, lc.data() + b * c.vocab, c.vocab);
        worst = std::max(worst, e);
        EXPECT_LT(e, Tolerance(c)) << f.linear << " " << f.swiglu << " " << f.attention << " step " << step;
        Seq& s = seqs[b];
        s.cached = static_cast<int64_t>(s.tokens.size());
        s.tokens.push_back(Argmax(lc.data() + b * c.vocab, c.vocab));
      }
    }
    std::printf("[%s] forced %s / %s / %s / %s: worst logits rel err %.3e\n", c.name.c_str(), f.linear.c_str(),
                f.swiglu.c_str(), f.attention.c_str(), f.norm.c_str(), worst);
  }
}

// With tuned configs the runner captures each decode bucket's graph both
// with them and with the built-in rule, times both and keeps the faster:
// whichever it keeps, decode logits match the CPU runner, and the report
// names every bucket.
TEST_P(ModelCudaTest, DecodeGraphsComparedInContext) {
  const ModelConfig c = Config();
  ConfigLookup lookup = [](const std::string& op, DType, const std::vector<int64_t>&) -> std::string {
    return op == "linear" ? "p2.a0" : op == "swiglu_mlp" ? "p2" : "";
  };
  Pair p = MakePair(c, 64, 16, /*graphs=*/true, lookup, /*compare_decode_graphs=*/true);
  ASSERT_TRUE(p.gpu != nullptr);
  const std::string report = CudaDecodeGraphReport(*p.gpu);
  std::printf("[%s] decode graphs kept: %s\n", c.name.c_str(), report.c_str());
  for (const char* b : {"B=1 ", "B=2 ", "B=4 ", "B=8 "}) EXPECT_NE(report.find(b), std::string::npos) << report;
  ExpectDecodeMatchesCpu(c, p, 2);
}

TEST_P(ModelCudaTest, TransformerBlockLayers) {
  const ModelConfig c = Config();
  Pair p = MakePair(c, 8, 16, /*graphs=*/false);
  ASSERT_TRUE(p.gpu != nullptr);
  ExpectLayersMatchCpu(c, p);
}

// The tensor-parallel path (NCCL group, rank threads, the all-reduces inside
// the decode graphs) over the most visible GPUs the model splits over (one
// on a single-GPU host): prefill, decode and TransformerBlock layers against
// the CPU runner.
TEST_P(ModelCudaTest, TensorParallelMatchesCpu) {
  std::string why;
  if (!cuda::NcclAvailable(&why)) GTEST_SKIP() << why;
  const ModelConfig c = Config();
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  int n = 1;
  for (int k = gpus; k > 1; --k) {
    if (c.kv_heads % k == 0 && c.intermediate % k == 0) {
      n = k;
      break;
    }
  }
  std::printf("[%s] tensor parallel over %d GPU(s)\n", c.name.c_str(), n);
  Pair p = MakePair(c, 64, 16, /*graphs=*/true, nullptr, false, CudaModelRunnerOptions{}.decode_fusion, n);
  ASSERT_TRUE(p.gpu != nullptr);
  ExpectDecodeMatchesCpu(c, p, 3);
  ExpectLayersMatchCpu(c, p);
}
// Four kv heads, so a 4-GPU host splits it four ways, and a vocabulary that
// does not divide (the last rank's LM head rows are fewer): the
// vocabulary-parallel head's gather and the symmetric-window all-reduces
// over every rank the host has (up to 4), decode from the graphs included.
TEST(ModelCudaTensorParallel, FourKvHeadsUnevenVocabularyMatchesCpu) {
  std::string why;
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (!cuda::NcclAvailable(&why)) GTEST_SKIP() << why;
  ModelConfig c = MidConfig();
  c.name = "mid_kv4";
  c.hidden = 1024;
  c.q_heads = 16;
  c.kv_heads = 4;
  c.vocab = 2050;
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  const int n = gpus >= 4 ? 4 : gpus >= 2 ? 2 : 1;
  std::printf("[%s] tensor parallel over %d GPU(s)\n", c.name.c_str(), n);
  Pair p = MakePair(c, 64, 16, /*graphs=*/true, nullptr, false, CudaModelRunnerOptions{}.decode_fusion, n);
  ASSERT_TRUE(p.gpu != nullptr);
  ExpectDecodeMatchesCpu(c, p, 3);
  ExpectLayersMatchCpu(c, p);
  // 1202 rows: more than the runner's buffers were made for (they grow), and
  // all-reduces of 2.4 MB.
  ExpectLayersMatchCpu(c, p, 601);
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelCudaTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(i.param == 0 ? "tiny" : i.param == 1 ? "mid_d64" : "mid_d128");
                         });

}  // namespace
}  // namespace fusedserve
