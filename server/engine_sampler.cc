// Token sampling (see engine_sampler.h).
#include "server/engine_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace fusedserve {
namespace {

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

SamplerRng::SamplerRng(uint64_t seed) {
  // Expand the seed with splitmix64, as the xoshiro authors recommend.
  uint64_t z = seed;
  for (uint64_t& s : s_) {
    z += 0x9e3779b97f4a7c15ull;
    uint64_t t = z;
    t = (t ^ (t >> 30)) * 0xbf58476d1ce4e5b9ull;
    t = (t ^ (t >> 27)) * 0x94d049bb133111ebull;
    s = t ^ (t >> 31);
  }
}

uint64_t SamplerRng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& p, SamplerRng& rng) {
  if (p.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  // Candidates ordered by logit (descending), ties by index: a total order,
  // so the result does not depend on the sort algorithm.
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto before = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int64_t keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), before);
  } else {
    std::sort(idx.begin(), idx.end(), before);
  }
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double mx = logits[idx[0]];
  std::vector<double> prob(keep);
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += (prob[i] = std::exp((logits[idx[i]] - mx) * inv_t));
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    // Smallest prefix whose probability reaches top_p (at least one token).
    double cum = 0.0;
    int64_t n = 0;
    while (n < keep) {
      cum += prob[n++] / total;
      if (cum >= p.top_p) break;
    }
    keep = n;
    total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += prob[i];
  }
  const double u = rng.Uniform() * total;
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace fusedserve
