// The CUDA entry of linear (kernels/cuda/linear.h): request -> cuda::GemmParams and
// the tuned LinearConfig -> cuBLASLt, GEMV or the skinny GEMM. An unset or
// unparsable config, or one that cannot apply to the shape (GEMV for large
// M), takes the built-in rule.
#include <cstdlib>

#include "kernels/cuda/config.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_hopper.h"

namespace fusedserve {
namespace cuda {

std::string FormatLinearConfig(const LinearConfig& c) {
  return FormatConfigInts("pa", {static_cast<int>(c.path), c.algo});
}

bool ParseLinearConfig(const std::string& s, LinearConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "pa", &v) || v[0] > static_cast<int>(LinearPath::kSkinny)) return false;
  *c = LinearConfig{static_cast<LinearPath>(v[0]), v[1]};
  return true;
}

bool GemvByDefault(int64_t M) {
  static const int max_m = EnvKnob("FUSEDSERVE_GEMV_MAX_M", 0, 8, static_cast<int>(kGemvAutoMaxM));
  return M <= max_m;
}

std::vector<LinearConfig> LinearCandidates(DType dtype, int64_t M, int64_t N, int64_t K) {
  std::vector<LinearConfig> c;
  const int n = std::max(1, cuda::GemmAlgoCount(dtype, M, N, K));
  for (int i = 0; i < n; ++i) c.push_back({LinearPath::kGemm, i});
  if (GemvShape(dtype, M, K)) c.push_back({LinearPath::kGemv, 0});
  if (SkinnyGemmShape(dtype, M, N, K)) {
    c.push_back({LinearPath::kSkinny, 0});
    // algo 1: the Hopper skinny kernel below the row count where it is the default.
    if (M > 1 && M <= kSkinnyNarrowMaxM && SkinnyHopperAvailable()) c.push_back({LinearPath::kSkinny, 1});
  }
  return c;
}

namespace {

// The path LaunchLinear takes for g under c.
LinearPath ChosenLinearPath(const cuda::GemmParams& g, const LinearConfig& c) {
  if (g.residual != nullptr) return LinearPath::kGemm;  // only cuBLASLt adds one
  const bool gemv_ok = cuda::GemvSupported(g.dtype, g.M, g.K, g.x, g.w);
  // The skinny GEMM has no epilogue.
  const bool skinny_ok =
      g.bias == nullptr && g.act == Activation::kNone && cuda::SkinnyGemmSupported(g.dtype, g.M, g.N, g.K, g.x, g.w);
  if (c.path == LinearPath::kGemv && gemv_ok) return LinearPath::kGemv;
  if (c.path == LinearPath::kSkinny && skinny_ok) return LinearPath::kSkinny;
  if (c.path != LinearPath::kGemm) {  // the built-in rule
    if (gemv_ok && GemvByDefault(g.M)) return LinearPath::kGemv;
    if (skinny_ok && cuda::SkinnyGemmByDefault(g.M, g.N, g.K, false)) return LinearPath::kSkinny;
  }
  return LinearPath::kGemm;
}

}  // namespace

bool LinearRunsGemm(const cuda::GemmParams& g, const LinearConfig& c) {
  cuda::GemmParams plain = g;
  plain.residual = nullptr;
  return ChosenLinearPath(plain, c) == LinearPath::kGemm;
}

CudaStatus LaunchLinear(const cuda::GemmParams& g, const LinearConfig& c, cudaStream_t stream) {
  switch (ChosenLinearPath(g, c)) {
    case LinearPath::kGemv:
      return cuda::LaunchGemv(g, stream);
    case LinearPath::kSkinny:
      return cuda::LaunchSkinnyGemm(g.dtype, g.M, g.N, g.K, g.x, g.w, g.y, stream,
                                    c.path == LinearPath::kSkinny && c.algo == 1);
    default:
      return cuda::GemmForward(g, c.path == LinearPath::kGemm ? c.algo : 0, stream);
  }
}

}  // namespace cuda

namespace {

CudaStatus RunLinear(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                     DispatchContext& ctx) {
  const DeviceTensor& x = in.at("x");
  const DeviceTensor& w = in.at("weight");
  const DeviceTensor* bias = FindTensor(in, "bias");
  cuda::GemmParams g;
  g.dtype = x.dtype;
  g.M = x.shape[0];
  g.K = x.shape[1];
  g.N = w.shape[0];
  g.x = x.data;
  g.w = w.data;
  g.bias = bias ? bias->data : nullptr;
  g.y = out.at("y").data;
  g.act = ParseActivation(host.s("activation"));
  cuda::LinearConfig c;
  cuda::ParseLinearConfig(ConfigOf(ctx, host, g.dtype), &c);
  return cuda::LaunchLinear(g, c, ctx.stream);
}

std::vector<std::string> LinearCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::LinearCandidates(dtype, key[0], key[1], key[2]), cuda::FormatLinearConfig);
}

}  // namespace

std::vector<CudaOp> LinearCudaOps() { return {{"linear", RunLinear, LinearCandidates}}; }

}  // namespace fusedserve
