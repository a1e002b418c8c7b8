// CPU reference attention: causal/non-causal prefill over packed
// variable-length sequences, and single-token decode over a KV cache. Both
// use GQA (q head h reads kv head h / (Hq / Hkv)) and a plain two-pass
// softmax in double: scores, max, exp-sum, weighted sum of V.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {
namespace {

// One query row against n keys/values spaced kv_stride floats apart.
// q, o [D]; k, v: row j at k + j * kv_stride.   scores [>= n], acc: scratch
void AttendOne(const float* q, const float* k, const float* v, int64_t n, int64_t kv_stride, int64_t D, double scale,
               std::vector<double>& scores, std::vector<double>& acc, float* o) {
  if (n <= 0) {  // nothing to attend to: defined as zeros rather than 0/0
    std::fill(o, o + D, 0.0f);
    return;
  }
  double max_s = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = k + j * kv_stride;
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(q[d]) * kj[d];
    scores[j] = s * scale;
    max_s = std::max(max_s, scores[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - max_s);
    sum += scores[j];
  }
  // Rows of V in order (contiguous reads), accumulated in double.
  acc.assign(D, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * kv_stride;
    for (int64_t d = 0; d < D; ++d) acc[d] += scores[j] * vj[d];
  }
  for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / sum);
}

}  // namespace

void Attention(const float* q, const float* k, const float* v, const int64_t* seq_lens, int64_t B, int64_t T,
               int64_t Hq, int64_t Hkv, int64_t D, bool causal, float scale, float* o) {
  AttentionRows(q, k, v, seq_lens, B, T, Hq, Hkv, D, causal, scale, 0, T, o);
}

void AttentionRows(const float* q, const float* k, const float* v, const int64_t* seq_lens, int64_t B, int64_t T,
                   int64_t Hq, int64_t Hkv, int64_t D, bool causal, float scale, int64_t row_begin, int64_t row_end,
                   float* o) {
  const int64_t group = Hq / Hkv;
  std::vector<double> scores, acc;
  int64_t offset = 0;  // first row of sequence b
  for (int64_t b = 0; b < B && offset < row_end; offset += seq_lens[b], ++b) {
    const int64_t len = seq_lens[b];
    if (offset + len <= row_begin) continue;
    scores.resize(std::max<int64_t>(len, 1));
    for (int64_t i = std::max<int64_t>(row_begin - offset, 0); i < len && offset + i < row_end; ++i) {
      const int64_t row = offset + i;
      const int64_t n_keys = causal ? i + 1 : len;  // keys offset .. offset + n_keys - 1
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t kvh = h / group;
        AttendOne(q + (row * Hq + h) * D, k + (offset * Hkv + kvh) * D, v + (offset * Hkv + kvh) * D, n_keys, Hkv * D,
                  D, scale, scores, acc, o + (row * Hq + h) * D);
      }
    }
  }
}

void AttentionDecode(const float* q, const float* k_cache, const float* v_cache, const int64_t* lengths, int64_t B,
                     int64_t L, int64_t Hq, int64_t Hkv, int64_t D, float scale, float* o) {
  const int64_t group = Hq / Hkv;
  std::vector<double> scores(std::max<int64_t>(L, 1)), acc;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = std::min(lengths[b], L);
    const int64_t cache_base = b * L * Hkv * D;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / group;
      AttendOne(q + (b * Hq + h) * D, k_cache + cache_base + kvh * D, v_cache + cache_base + kvh * D, n, Hkv * D, D,
                scale, scores, acc, o + (b * Hq + h) * D);
    }
  }
}

}  // namespace fusedserve::cpu
