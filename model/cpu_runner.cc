// CPU ModelRunner: the LLaMA forward pass in fp32 on the CPU reference ops
// (RmsNorm, Linear, SiluAndMul), with rope (Llama-3.1 scaling included) and
// paged attention written here because they read per-sequence positions and
// block tables. Every token's computation is independent of what else is in
// the batch (same loops, same summation order), so batching never changes a
// token: the engine's reproducibility rests on that.
//
// With tensor_parallel = N it holds the model as N tensor-parallel shards
// (model/tensor_parallel.h) and runs them one after another, adding the
// row-parallel partial sums in rank order where the GPUs would all-reduce:
// the check, without GPUs, that the sharding computes the same model.
#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/sampler.h"
#include "kernels/cpu/reference.h"
#include "model/runner.h"
#include "model/tensor_parallel.h"

namespace fusedserve {

absl::Status ModelRunner::ForwardLogits(std::vector<SeqForward> batch, std::vector<float>* logits) {
  for (SeqForward& s : batch) s.want_logits = true;
  ForwardOutput out;
  if (absl::Status s = Forward(batch, &out); !s.ok()) return s;
  *logits = std::move(out.logits);
  return absl::OkStatus();
}

absl::Status ModelRunner::RunLayersChunked(int64_t, int64_t, const std::vector<SeqForward>&, const int64_t*, float*) {
  return absl::UnimplementedError(absl::StrCat("the ", device(), " runner runs TransformerBlock only whole"));
}

int64_t ModelRunner::KvBytesPerBlock(int64_t block_size) const {
  const ModelConfig& c = config();
  return 2 * c.layers * block_size * c.kv_dim() * static_cast<int64_t>(sizeof(float));
}

namespace {

// Splits [0, n) over up to `threads` threads when the work is big enough to
// pay for starting them (~20 us each).
template <typename Fn>
void ParallelFor(int64_t n, int threads, double work, Fn fn) {
  const int t = static_cast<int>(std::min<int64_t>(threads, n));
  if (t <= 1 || work < 4e6) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + t - 1) / t;
  for (int i = 1; i < t; ++i) {
    const int64_t b = i * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([=] { fn(b, e); });
  }
  fn(0, std::min(n, chunk));
  for (std::thread& th : pool) th.join();
}

class CpuModelRunner final : public ModelRunner {
 public:
  CpuModelRunner(std::unique_ptr<ModelWeights> w, int threads, std::vector<TensorShard> shards)
      : c_(w->config()), threads_(threads), shards_(std::move(shards)) {
    inv_freq_ = c_.RopeInvFreq();
    const int64_t D = c_.hidden;
    final_norm_ = w->Get("model.norm.weight").ToFloat();
    const WeightTensor& embed = w->Get("model.embed_tokens.weight");
    const WeightTensor& lm_head = c_.tied_embeddings ? embed : w->Get("lm_head.weight");
    for (const TensorShard& r : shards_) {
      vocab_.push_back({embed.ToFloatBlock(r.vocab_begin, r.vocab, 0, D), {}});
      if (!c_.tied_embeddings) vocab_.back().lm_head = lm_head.ToFloatBlock(r.vocab_begin, r.vocab, 0, D);
    }
    layers_.resize(c_.layers);
    for (int64_t i = 0; i < c_.layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      Layer& L = layers_[i];
      L.attn_norm = w->Get(p + "input_layernorm.weight").ToFloat();
      L.mlp_norm = w->Get(p + "post_attention_layernorm.weight").ToFloat();
      auto block = [&](const WeightBlock& b) { return w->Get(b.name).ToFloatBlock(b.row, b.rows, b.col, b.cols); };
      auto concat = [&](const std::vector<WeightBlock>& blocks) {
        std::vector<float> out;
        for (const WeightBlock& b : blocks) {
          const std::vector<float> part = block(b);
          out.insert(out.end(), part.begin(), part.end());
        }
        return out;
      };
      for (const TensorShard& r : shards_) {
        const LayerBlocks b = LayerShardBlocks(c_, r, i);
        RankLayer R;
        R.wqkv = concat(b.qkv);
        R.gate_up = concat(b.gate_up);
        R.wo = block(b.o);
        R.down = block(b.down);
        L.ranks.push_back(std::move(R));
      }
    }
  }

  const ModelConfig& config() const override { return c_; }
  std::string device() const override { return "cpu"; }

  absl::Status InitKvCache(int64_t num_blocks, int64_t block_size) override {
    if (num_blocks <= 0 || block_size <= 0) return absl::InvalidArgumentError("KV cache needs blocks > 0");
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    const int64_t n = c_.layers * num_blocks * block_size * c_.kv_dim();
    k_cache_.assign(n, 0.0f);
    v_cache_.assign(n, 0.0f);
    return absl::OkStatus();
  }

  // Tokens of a forward batch, after checking each sequence against its block table.
  absl::StatusOr<int64_t> BatchTokens(const std::vector<SeqForward>& batch) const {
    int64_t T = 0;
    for (const SeqForward& s : batch) {
      if (s.num_tokens <= 0) return absl::InternalError("empty sequence in a forward batch");
      if ((s.start + s.num_tokens + block_size_ - 1) / block_size_ > s.num_blocks) {
        return absl::InternalError("block table too short for the sequence");
      }
      T += s.num_tokens;
    }
    return T;
  }

  absl::Status Forward(const std::vector<SeqForward>& batch, ForwardOutput* out) override {
    if (k_cache_.empty()) return absl::FailedPreconditionError("KV cache not initialised");
    const int64_t D = c_.hidden;
    absl::StatusOr<int64_t> tokens = BatchTokens(batch);
    if (!tokens.ok()) return tokens.status();
    const int64_t T = *tokens;
    std::vector<float> x(T * D);
    std::vector<int64_t> positions(T);
    int64_t row = 0;
    for (const SeqForward& s : batch) {
      for (int64_t i = 0; i < s.num_tokens; ++i, ++row) {
        const int32_t tok = s.tokens[i];
        if (tok < 0 || tok >= c_.vocab) return absl::InternalError("token id out of range");
        // Vocab-parallel: the owning rank's row (the others add zeros).
        const int r = OwnerOf(tok);
        std::copy_n(vocab_[r].embed.data() + (tok - shards_[r].vocab_begin) * D, D, x.data() + row * D);
        positions[row] = s.start + i;
      }
    }
    for (int64_t l = 0; l < c_.layers; ++l) {
      RunLayer(l, T, positions.data(), x.data(),
               [&](const TensorShard& r, const float* q, const float* k, const float* v, float* o) {
                 PagedAttention(l, batch, r, q, k, v, o);
               });
    }
    // Logits of each sequence's last token.
    const int64_t B = static_cast<int64_t>(batch.size());
    std::vector<float> last(B * D), normed(B * D);
    row = 0;
    for (int64_t b = 0; b < B; ++b) {
      row += batch[b].num_tokens;
      std::copy_n(x.data() + (row - 1) * D, D, last.data() + b * D);
    }
    cpu::RmsNorm(last.data(), final_norm_.data(), B, D, static_cast<float>(c_.rms_eps), normed.data());
    // Vocab-parallel lm_head: each rank's columns of the logits (gathered).
    out->logits.resize(B * c_.vocab);
    std::vector<float> part;
    for (size_t r = 0; r < shards_.size(); ++r) {
      const TensorShard& sh = shards_[r];
      const float* w = c_.tied_embeddings ? vocab_[r].embed.data() : vocab_[r].lm_head.data();
      part.resize(B * sh.vocab);
      Gemm(normed.data(), w, B, D, sh.vocab, part.data());
      for (int64_t b = 0; b < B; ++b) {
        std::copy_n(part.data() + b * sh.vocab, sh.vocab, out->logits.data() + b * c_.vocab + sh.vocab_begin);
      }
    }
    out->greedy.resize(B);
    for (int64_t b = 0; b < B; ++b) out->greedy[b] = cpu::GreedyToken(out->logits.data() + b * c_.vocab, c_.vocab);
    return absl::OkStatus();
  }

  bool SupportsLayersChunked() const override { return true; }
  absl::Status RunLayersChunked(int64_t first, int64_t n, const std::vector<SeqForward>& batch,
                                const int64_t* positions, float* hidden) override {
    if (k_cache_.empty()) return absl::FailedPreconditionError("KV cache not initialised");
    if (first < 0 || n < 0 || first + n > c_.layers) return absl::InvalidArgumentError("layer range out of bounds");
    absl::StatusOr<int64_t> tokens = BatchTokens(batch);
    if (!tokens.ok()) return tokens.status();
    const int64_t T = *tokens;
    for (int64_t l = first; l < first + n; ++l) {
      RunLayer(l, T, positions, hidden,
               [&](const TensorShard& r, const float* q, const float* k, const float* v, float* o) {
                 PagedAttention(l, batch, r, q, k, v, o);
               });
    }
    return absl::OkStatus();
  }

  absl::Status RunLayers(int64_t first, int64_t n, int64_t B, int64_t S, const int64_t* positions,
                         float* hidden) override {
    if (first < 0 || n < 0 || first + n > c_.layers) return absl::InvalidArgumentError("layer range out of bounds");
    std::vector<int64_t> seq_lens(B, S);
    for (int64_t l = first; l < first + n; ++l) {
      RunLayer(l, B * S, positions, hidden,
               [&](const TensorShard& r, const float* q, const float* k, const float* v, float* o) {
                 cpu::Attention(q, k, v, seq_lens.data(), B, B * S, r.q_heads, r.kv_heads, c_.head_dim,
                                /*causal=*/true, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim))),
                                o);
               });
    }
    return absl::OkStatus();
  }

 private:
  // One rank's shard of a layer (h, g, i: its q heads, kv heads, intermediate columns).
  struct RankLayer {
    std::vector<float> wqkv;     // [(h + 2 g) Dh, D]
    std::vector<float> wo;       // [D, h Dh]
    std::vector<float> gate_up;  // [2i, D]
    std::vector<float> down;     // [D, i]
  };
  struct Layer {
    std::vector<float> attn_norm;  // [D] (every rank)
    std::vector<float> mlp_norm;   // [D]
    std::vector<RankLayer> ranks;
  };
  // One rank's vocabulary rows.
  struct RankVocab {
    std::vector<float> embed;    // [v, D]
    std::vector<float> lm_head;  // [v, D] (empty when tied to embed)
  };

  int OwnerOf(int32_t token) const {
    const int64_t per = shards_[0].vocab;  // every rank but the last holds this many
    return static_cast<int>(std::min<int64_t>(token / std::max<int64_t>(per, 1), shards_.size() - 1));
  }

  // y = x . w^T.   x [M,K]; w [N,K]; y [M,N]. Rows of w split over threads.
  void Gemm(const float* x, const float* w, int64_t M, int64_t K, int64_t N, float* y) const {
    if (threads_ <= 1 || static_cast<double>(M) * K * N < 4e6) {
      cpu::Linear(x, w, nullptr, M, K, N, Activation::kNone, y);
      return;
    }
    ParallelFor(N, threads_, static_cast<double>(M) * K * N, [&](int64_t b, int64_t e) {
      std::vector<float> part(M * (e - b));
      cpu::Linear(x, w + b * K, nullptr, M, K, e - b, Activation::kNone, part.data());
      for (int64_t m = 0; m < M; ++m) std::copy_n(part.data() + m * (e - b), e - b, y + m * N + b);
    });
  }

  // Rotate-half rope on every head of T tokens, in place.   x [T, H, Dh]
  void Rope(float* x, int64_t T, int64_t H, const int64_t* positions) const {
    const int64_t Dh = c_.head_dim, half = Dh / 2;
    std::vector<double> cs(half), sn(half);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(positions[t]) * inv_freq_[i];
        cs[i] = std::cos(a);
        sn[i] = std::sin(a);
      }
      for (int64_t h = 0; h < H; ++h) {
        float* v = x + (t * H + h) * Dh;
        for (int64_t i = 0; i < half; ++i) {
          const double a = v[i], b = v[i + half];
          v[i] = static_cast<float>(a * cs[i] - b * sn[i]);
          v[i + half] = static_cast<float>(b * cs[i] + a * sn[i]);
        }
      }
    }
  }

  // One decoder layer over T tokens, in place.   x [T,D]; positions [T]
  // attend(shard, q [T,h,Dh], k [T,g,Dh], v [T,g,Dh], o [T,h,Dh]) over the
  // shard's heads. Each rank's o_proj and down_proj partial sums are added
  // in rank order (the all-reduce).
  template <typename AttendFn>
  void RunLayer(int64_t l, int64_t T, const int64_t* positions, float* x, AttendFn attend) const {
    const Layer& L = layers_[l];
    const int64_t D = c_.hidden, Dh = c_.head_dim;
    const float eps = static_cast<float>(c_.rms_eps);
    std::vector<float> h(T * D), sum(T * D), part(T * D);
    auto all_reduce = [&](size_t r) {
      if (r == 0) {
        sum.swap(part);
      } else {
        for (int64_t i = 0; i < T * D; ++i) sum[i] += part[i];
      }
    };
    cpu::RmsNorm(x, L.attn_norm.data(), T, D, eps, h.data());
    for (size_t r = 0; r < shards_.size(); ++r) {
      const TensorShard& sh = shards_[r];
      const RankLayer& R = L.ranks[r];
      const int64_t qd = sh.q_heads * Dh, kvd = sh.kv_heads * Dh;
      std::vector<float> qkv(T * (qd + 2 * kvd));
      Gemm(h.data(), R.wqkv.data(), T, D, qd + 2 * kvd, qkv.data());
      std::vector<float> q(T * qd), k(T * kvd), v(T * kvd), o(T * qd);
      for (int64_t t = 0; t < T; ++t) {
        const float* row = qkv.data() + t * (qd + 2 * kvd);
        std::copy_n(row, qd, q.data() + t * qd);
        std::copy_n(row + qd, kvd, k.data() + t * kvd);
        std::copy_n(row + qd + kvd, kvd, v.data() + t * kvd);
      }
      Rope(q.data(), T, sh.q_heads, positions);
      Rope(k.data(), T, sh.kv_heads, positions);
      attend(sh, q.data(), k.data(), v.data(), o.data());
      if (part.size() != static_cast<size_t>(T * D)) part.resize(T * D);
      Gemm(o.data(), R.wo.data(), T, qd, D, part.data());
      all_reduce(r);
    }
    for (int64_t i = 0; i < T * D; ++i) x[i] += sum[i];
    cpu::RmsNorm(x, L.mlp_norm.data(), T, D, eps, h.data());
    for (size_t r = 0; r < shards_.size(); ++r) {
      const int64_t I = shards_[r].inter;
      const RankLayer& R = L.ranks[r];
      std::vector<float> gu(T * 2 * I), act(T * I);
      Gemm(h.data(), R.gate_up.data(), T, D, 2 * I, gu.data());
      cpu::SiluAndMul(gu.data(), T, I, act.data());
      if (part.size() != static_cast<size_t>(T * D)) part.resize(T * D);
      Gemm(act.data(), R.down.data(), T, I, D, part.data());
      all_reduce(r);
    }
    for (int64_t i = 0; i < T * D; ++i) x[i] += sum[i];
  }

  // Cache row of (layer, position) for a sequence.   [kv_dim]
  float* CacheRow(std::vector<float>& cache, int64_t l, const SeqForward& s, int64_t pos) {
    const int64_t block = s.block_table[pos / block_size_];
    const int64_t slot = (l * num_blocks_ + block) * block_size_ + pos % block_size_;
    return cache.data() + slot * c_.kv_dim();
  }

  // Writes the batch's new K/V into the cache, then attends each new token
  // over its sequence's cache rows [0, position]. q, o [T,Hq,Dh]; k, v [T,Hkv,Dh]
  // Over the shard's heads: its kv heads' slice of each cache row.
  void PagedAttention(int64_t l, const std::vector<SeqForward>& batch, const TensorShard& sh, const float* q,
                      const float* k, const float* v, float* o) {
    const int64_t Hq = sh.q_heads, Hkv = sh.kv_heads, Dh = c_.head_dim, kvd = Hkv * Dh;
    const int64_t group = Hq / Hkv, off = sh.kv_head_begin * Dh;
    const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
    int64_t row = 0;
    for (const SeqForward& s : batch) {
      for (int64_t i = 0; i < s.num_tokens; ++i) {
        std::copy_n(k + (row + i) * kvd, kvd, CacheRow(k_cache_, l, s, s.start + i) + off);
        std::copy_n(v + (row + i) * kvd, kvd, CacheRow(v_cache_, l, s, s.start + i) + off);
      }
      std::vector<double> scores;
      std::vector<double> acc(Dh);
      for (int64_t i = 0; i < s.num_tokens; ++i, ++row) {
        const int64_t len = s.start + i + 1;  // causal: keys [0, position]
        scores.resize(len);
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t kvh = h / group;
          const float* qh = q + (row * Hq + h) * Dh;
          double mx = -INFINITY;
          for (int64_t j = 0; j < len; ++j) {
            const float* kr = CacheRow(k_cache_, l, s, j) + off + kvh * Dh;
            double dot = 0.0;
            for (int64_t d = 0; d < Dh; ++d) dot += static_cast<double>(qh[d]) * kr[d];
            scores[j] = dot * scale;
            mx = std::max(mx, scores[j]);
          }
          double denom = 0.0;
          for (int64_t j = 0; j < len; ++j) denom += (scores[j] = std::exp(scores[j] - mx));
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = 0; j < len; ++j) {
            const float* vr = CacheRow(v_cache_, l, s, j) + off + kvh * Dh;
            for (int64_t d = 0; d < Dh; ++d) acc[d] += scores[j] * vr[d];
          }
          float* oh = o + (row * Hq + h) * Dh;
          for (int64_t d = 0; d < Dh; ++d) oh[d] = static_cast<float>(acc[d] / denom);
        }
      }
    }
  }

  const ModelConfig c_;
  const int threads_;
  const std::vector<TensorShard> shards_;  // one per tensor-parallel rank (one: unsharded)
  std::vector<double> inv_freq_;
  std::vector<float> final_norm_;
  std::vector<RankVocab> vocab_;  // per rank
  std::vector<Layer> layers_;
  int64_t num_blocks_ = 0, block_size_ = 0;
  std::vector<float> k_cache_, v_cache_;  // [layers, num_blocks, block_size, Hkv, Dh]
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCpuModelRunner(std::unique_ptr<ModelWeights> weights, int threads,
                                                                int tensor_parallel) {
  if (weights == nullptr) return absl::InvalidArgumentError("no weights");
  if (absl::Status s = weights->config().Validate(); !s.ok()) return s;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<TensorShard> shards;
  for (int r = 0; r < tensor_parallel || r == 0; ++r) {
    absl::StatusOr<TensorShard> shard = ShardOf(weights->config(), r, tensor_parallel);
    if (!shard.ok()) return shard.status();
    shards.push_back(*shard);
  }
  return std::unique_ptr<ModelRunner>(new CpuModelRunner(std::move(weights), threads, std::move(shards)));
}

}  // namespace fusedserve
