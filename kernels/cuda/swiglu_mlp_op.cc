// The CUDA entry of swiglu_mlp (config in kernels/cuda/linear.h): the gate
// h = silu(x . gate^T) * (x . up^T) by its path (a linear GEMM then the
// SwiGLU kernel, or fused in the SwiGLU GEMV or skinny GEMM), then the down
// projection as a linear. Both GEMMs run linear's tuned configs for their own
// shapes. Intermediates in scratch memory.
#include <algorithm>

#include "kernels/cuda/config.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/swiglu_hopper.h"

namespace fusedserve {
namespace cuda {

std::string FormatSwigluMlpConfig(const SwigluMlpConfig& c) {
  return FormatConfigInts("p", {static_cast<int>(c.path)});
}

bool ParseSwigluMlpConfig(const std::string& s, SwigluMlpConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "p", &v) || v[0] > static_cast<int>(LinearPath::kHopper)) return false;
  *c = SwigluMlpConfig{static_cast<LinearPath>(v[0])};
  return true;
}

std::vector<SwigluMlpConfig> SwigluMlpCandidates(DType dtype, int64_t M, int64_t D, int64_t I) {
  std::vector<SwigluMlpConfig> c = {{LinearPath::kGemm}};
  if (GemvShape(dtype, M, D)) c.push_back({LinearPath::kGemv});
  if (SkinnyGemmShape(dtype, M, I, D)) c.push_back({LinearPath::kSkinny});
  if (M > kSkinnyNarrowMaxM && HopperSwigluSupported(dtype, M, D, I, nullptr, nullptr, nullptr)) {
    c.push_back({LinearPath::kHopper});
  }
  return c;
}

namespace {

// Rows from which the built-in rule takes the fused Hopper gate
// (FUSEDSERVE_SWIGLU_FUSED_MIN_M: A/B; a large value keeps cuBLASLt + pass).
int64_t HopperSwigluMinM() {
  static const int64_t m = cuda::EnvKnob("FUSEDSERVE_SWIGLU_FUSED_MIN_M", 1, 1 << 30, 256);
  return m;
}

LinearPath ChooseSwigluPath(DType dt, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            const SwigluMlpConfig& c) {
  const bool gemv_ok = cuda::GemvSupported(dt, M, D, x, gate_up);
  const bool skinny_ok = cuda::SkinnyGemmSupported(dt, M, I, D, x, gate_up);
  if (c.path == LinearPath::kGemv && gemv_ok) return LinearPath::kGemv;
  if (c.path == LinearPath::kSkinny && skinny_ok) return LinearPath::kSkinny;
  if (c.path == LinearPath::kHopper && cuda::HopperSwigluSupported(dt, M, D, I, x, gate_up, h)) {
    return LinearPath::kHopper;
  }
  if (c.path == LinearPath::kGemm || c.path == LinearPath::kHopper) return LinearPath::kGemm;
  if (gemv_ok && GemvByDefault(M)) return LinearPath::kGemv;
  if (skinny_ok && cuda::SkinnyGemmByDefault(M, I, D, true)) return LinearPath::kSkinny;
  // From a few hundred rows the fused gate beats cuBLASLt plus the SwiGLU
  // pass (the [M,2I] intermediate never reaches device memory).
  if (M >= HopperSwigluMinM() && cuda::HopperSwigluSupported(dt, M, D, I, x, gate_up, h)) return LinearPath::kHopper;
  return LinearPath::kGemm;
}

}  // namespace

bool SwigluGateNeedsScratch(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                            const SwigluMlpConfig& c) {
  return ChooseSwigluPath(dtype, M, D, I, x, gate_up, nullptr, c) == LinearPath::kGemm;
}

CudaStatus LaunchSwigluGate(DType dt, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            void* gu, const SwigluMlpConfig& c, const LinearConfig& gate_up_config,
                            cudaStream_t stream) {
  switch (ChooseSwigluPath(dt, M, D, I, x, gate_up, h, c)) {
    case LinearPath::kGemv:
      return cuda::LaunchGemvSwiglu(dt, M, D, I, x, gate_up, h, stream);
    case LinearPath::kSkinny:
      return cuda::LaunchSkinnySwiglu(dt, M, D, I, x, gate_up, h, stream);
    case LinearPath::kHopper:
      return cuda::LaunchHopperSwiglu(dt, M, D, I, x, gate_up, h, stream);
    default:
      break;
  }
  if (gu == nullptr) return CudaStatus::Error("swiglu: the GEMM path needs gate_up scratch");
  cuda::GemmParams g;
  g.dtype = dt;
  g.M = M;
  g.N = 2 * I;
  g.K = D;
  g.x = x;
  g.w = gate_up;
  g.y = gu;
  if (CudaStatus s = LaunchLinear(g, gate_up_config, stream); !s.ok()) return s;
  return cuda::LaunchMlpSiluAndMul(dt, M, I, gu, h, stream);
}

}  // namespace cuda

namespace {

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

CudaStatus RunSwigluMlp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                        DispatchContext& ctx) {
  const DeviceTensor& x = in.at("x");
  const DeviceTensor& gate_up = in.at("gate_up");
  const DeviceTensor& down = in.at("down");
  const DType dt = x.dtype;
  const int64_t M = x.shape[0], D = x.shape[1], I = down.shape[1];
  void* y = out.at("y").data;
  if (M == 0 || D == 0) return CudaStatus::Ok();
  if (ctx.scratch == nullptr) return CudaStatus::Error("swiglu_mlp: no scratch memory");
  cuda::SwigluMlpConfig c;
  cuda::ParseSwigluMlpConfig(ConfigOf(ctx, host, dt), &c);
  // The GEMMs run linear's tuned configs for their own keys, as in the model.
  auto linear_config = [&](const std::vector<int64_t>& key) {
    cuda::LinearConfig lc;
    if (ctx.config) cuda::ParseLinearConfig(ctx.config("linear", dt, key), &lc);
    return lc;
  };
  const bool need_gu = cuda::SwigluGateNeedsScratch(dt, M, D, I, x.data, gate_up.data, c);
  const size_t es = DTypeSize(dt);
  const size_t h_bytes = AlignUp(static_cast<size_t>(M) * I * es);
  const size_t gu_bytes = need_gu ? AlignUp(static_cast<size_t>(M) * 2 * I * es) : 0;
  void* scratch = nullptr;
  if (CudaStatus s = ctx.scratch->Get(std::max<size_t>(h_bytes + gu_bytes, 256), &scratch); !s.ok()) return s;
  void* h = scratch;                                                     // [M,I]
  void* gu = need_gu ? static_cast<char*>(scratch) + h_bytes : nullptr;  // [M,2I]
  if (CudaStatus s =
          cuda::LaunchSwigluGate(dt, M, D, I, x.data, gate_up.data, h, gu, c, linear_config({M, 2 * I, D}), ctx.stream);
      !s.ok()) {
    return s;
  }
  cuda::GemmParams g2;
  g2.dtype = dt;
  g2.M = M;
  g2.N = D;
  g2.K = I;
  g2.x = h;
  g2.w = down.data;
  g2.y = y;
  return cuda::LaunchLinear(g2, linear_config({M, D, I}), ctx.stream);
}

std::vector<std::string> SwigluMlpCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::SwigluMlpCandidates(dtype, key[0], key[1], key[2]), cuda::FormatSwigluMlpConfig);
}

}  // namespace

std::vector<CudaOp> SwigluMlpCudaOps() { return {{"swiglu_mlp", RunSwigluMlp, SwigluMlpCandidates}}; }

}  // namespace fusedserve
