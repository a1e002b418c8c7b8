// Token sampling (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/reference.h"

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
  if (p.temperature <= 0.0f) return cpu::GreedyToken(logits, vocab);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double mx = logits[cpu::GreedyToken(logits, vocab)];
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p > 0.0f && p.top_p < 1.0f;
  if (!top_k && !top_p) {
    // Plain temperature: every token is a candidate, walked in index order
    // (no sort of a 128K vocabulary per token).
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += std::exp((logits[i] - mx) * inv_t);
    const double u = rng.Uniform() * total;
    double cum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      cum += std::exp((logits[i] - mx) * inv_t);
      if (u < cum) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(vocab - 1);
  }
  // Candidates ordered by logit (descending), ties by index: a total order,
  // so the result does not depend on the sort algorithm, and the first n of
  // a partial sort are the first n of the full one.
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto before = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  // top-p's mass is relative to the top-k candidates, or to the whole vocabulary.
  int64_t keep = top_k ? p.top_k : vocab;
  double total = 0.0;
  if (!top_k) {
    for (int64_t i = 0; i < vocab; ++i) total += std::exp((logits[i] - mx) * inv_t);
  }
  // Sort only as far as needed: the top-k, or a prefix grown until it holds
  // the top-p mass (usually a few hundred tokens).
  int64_t sorted = top_k ? keep : std::min<int64_t>(keep, 256);
  std::vector<double> prob;
  while (true) {
    std::partial_sort(idx.begin(), idx.begin() + sorted, idx.end(), before);
    prob.resize(sorted);
    double mass = 0.0;
    for (int64_t i = 0; i < sorted; ++i) mass += (prob[i] = std::exp((logits[idx[i]] - mx) * inv_t));
    if (top_k) total = mass;
    if (!top_p) break;
    // Smallest prefix whose probability reaches top_p (at least one token).
    double cum = 0.0;
    int64_t n = 0;
    while (n < sorted && cum < p.top_p) cum += prob[n++] / total;
    if (cum >= p.top_p || sorted == keep) {
      sorted = n;
      break;
    }
    sorted = std::min<int64_t>(keep, sorted * 8);
  }
  keep = sorted;
  total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += prob[i];
  const double u = rng.Uniform() * total;
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

void ComputeLogprobs(const float* logits, int64_t vocab, int32_t chosen, int top_n, TokenLogprobs* out) {
  const double mx = logits[cpu::GreedyToken(logits, vocab)];
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(total);
  out->logprob = static_cast<float>(static_cast<double>(logits[chosen]) - log_z);
  out->top.clear();
  if (top_n <= 0) return;
  // One pass keeping the best top_n (a small sorted window: top_n <= 20).
  auto before = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const int64_t n = std::min<int64_t>(top_n, vocab);
  std::vector<int32_t> best;
  best.reserve(n + 1);
  for (int64_t i = 0; i < vocab; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (static_cast<int64_t>(best.size()) == n && !before(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, before), id);
    if (static_cast<int64_t>(best.size()) > n) best.pop_back();
  }
  out->top.reserve(best.size());
  for (int32_t id : best) out->top.emplace_back(id, static_cast<float>(static_cast<double>(logits[id]) - log_z));
}

}  // namespace fusedserve
