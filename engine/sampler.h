// Token sampling: greedy (temperature 0), or temperature + top-k + top-p
// from a per-sequence random stream seeded by the request's seed. The draw
// depends only on the logits, the parameters and the stream's state, so the
// same request and seed give the same tokens whatever else runs beside it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace fusedserve {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0: all tokens
  float top_p = 1.0f;        // <= 0 or >= 1: disabled
  uint64_t seed = 0;
};

// xoshiro256**: small, fast, fully specified (unlike std:: distributions,
// whose output may differ between standard libraries).
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

// Picks a token from logits [vocab]. Greedy (temperature <= 0) is cpu::GreedyToken.
int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& params, SamplerRng& rng);

// Log-probabilities of one generated position: log-softmax of the raw
// logits (temperature, top-k and top-p do not change them).
struct TokenLogprobs {
  float logprob = 0.0f;  // the chosen token's
  // The top_n most likely (id, logprob), most likely first, ties by lower id.
  std::vector<std::pair<int32_t, float>> top;
};

// Fills `out` for token `chosen` from logits [vocab]; top_n in [0, vocab].
void ComputeLogprobs(const float* logits, int64_t vocab, int32_t chosen, int top_n, TokenLogprobs* out);

}  // namespace fusedserve
