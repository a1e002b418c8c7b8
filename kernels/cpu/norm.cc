// CPU reference norms: RMSNorm, fused residual-add + RMSNorm (optionally
// followed by SiLU) and LayerNorm. One row at a time; sums in double so the
// reference's own rounding error stays far below any kernel tolerance.
#include <cmath>
#include <vector>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {
namespace {

// 1 / sqrt(mean(row^2) + eps).   row [H]
// Four partial sums (every fourth element each), added pairwise at the end:
// one chain of dependent double adds ran at one element per add latency (a
// 4096-wide row took ~5 us, most of a small rms_norm request on the CPU
// backend); four run in parallel. Same precision class (double sums of
// exact squares), the order differs only.
double RmsScale(const float* row, int64_t H, float eps) {
  double sum[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t h = 0;
  for (; h + 4 <= H; h += 4) {
    for (int k = 0; k < 4; ++k) sum[k] += static_cast<double>(row[h + k]) * row[h + k];
  }
  for (; h < H; ++h) sum[h % 4] += static_cast<double>(row[h]) * row[h];
  const double sum_sq = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  return 1.0 / std::sqrt(sum_sq / static_cast<double>(H) + eps);
}

double Silu(double v) { return v / (1.0 + std::exp(-v)); }

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t M, int64_t H, float eps, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * H;
    float* yr = y + m * H;
    const double scale = RmsScale(xr, H, eps);
    for (int64_t h = 0; h < H; ++h) yr[h] = static_cast<float>(xr[h] * scale * weight[h]);
  }
}

void AddRmsNorm(const float* x, const float* residual, const float* weight, int64_t M, int64_t H, float eps, float* y,
                float* residual_out) {
  // The new residual is what the next layer adds to, so it is rounded to fp32
  // first and the norm is taken of exactly that stored value (as a kernel
  // that writes residual_out and normalises it would).
  for (int64_t i = 0; i < M * H; ++i) residual_out[i] = x[i] + residual[i];
  RmsNorm(residual_out, weight, M, H, eps, y);
}

void AddRmsNormSilu(const float* x, const float* residual, const float* weight, int64_t M, int64_t H, float eps,
                    float* y) {
  std::vector<float> sum(H);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t h = 0; h < H; ++h) sum[h] = x[m * H + h] + residual[m * H + h];
    const double scale = RmsScale(sum.data(), H, eps);
    for (int64_t h = 0; h < H; ++h) y[m * H + h] = static_cast<float>(Silu(sum[h] * scale * weight[h]));
  }
}

void LayerNorm(const float* x, const float* weight, const float* bias, int64_t M, int64_t H, float eps, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * H;
    float* yr = y + m * H;
    // Two passes (mean, then centred squares): no cancellation for rows with
    // a large mean.
    double sum = 0.0;
    for (int64_t h = 0; h < H; ++h) sum += xr[h];
    const double mean = sum / static_cast<double>(H);
    double sum_sq = 0.0;
    for (int64_t h = 0; h < H; ++h) sum_sq += (xr[h] - mean) * (xr[h] - mean);
    const double inv_std = 1.0 / std::sqrt(sum_sq / static_cast<double>(H) + eps);
    for (int64_t h = 0; h < H; ++h) yr[h] = static_cast<float>((xr[h] - mean) * inv_std * weight[h] + bias[h]);
  }
}

}  // namespace fusedserve::cpu
