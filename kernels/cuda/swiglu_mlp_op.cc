// The CUDA entry of swiglu_mlp (config in kernels/cuda/linear.h): the two
// cuBLASLt GEMMs around the SwiGLU kernel, or for few rows the fused SwiGLU
// GEMV then a GEMV for the down projection. Intermediates in scratch memory.
#include <algorithm>

#include "kernels/cuda/config.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/linear.h"

namespace fusedserve {
namespace cuda {

std::string FormatSwigluMlpConfig(const SwigluMlpConfig& c) {
  return FormatConfigInts("p", {static_cast<int>(c.path)});
}

bool ParseSwigluMlpConfig(const std::string& s, SwigluMlpConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "p", &v) || v[0] > static_cast<int>(LinearPath::kGemv)) return false;
  *c = SwigluMlpConfig{static_cast<LinearPath>(v[0])};
  return true;
}

std::vector<SwigluMlpConfig> SwigluMlpCandidates(DType dtype, int64_t M, int64_t D, int64_t I) {
  const int64_t vec = IsFloat(dtype) ? static_cast<int64_t>(16 / DTypeSize(dtype)) : 1;
  std::vector<SwigluMlpConfig> c = {{LinearPath::kGemm}};
  if (M >= 1 && M <= kGemvMaxM && D % vec == 0) c.push_back({LinearPath::kGemv});
  return c;
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
  const bool gemv_ok = GemvSupported(dt, M, D, x.data, gate_up.data);
  const bool use_gemv = gemv_ok && (c.path == cuda::LinearPath::kGemv ||
                                    (c.path == cuda::LinearPath::kDefault && M <= cuda::kGemvAutoMaxM));
  const size_t es = DTypeSize(dt);
  const size_t h_bytes = AlignUp(static_cast<size_t>(M) * I * es);
  const size_t gu_bytes = use_gemv ? 0 : AlignUp(static_cast<size_t>(M) * 2 * I * es);
  void* scratch = nullptr;
  if (CudaStatus s = ctx.scratch->Get(std::max<size_t>(h_bytes + gu_bytes, 256), &scratch); !s.ok()) return s;
  void* h = scratch;  // [M,I]
  if (use_gemv) {
    if (CudaStatus s = LaunchGemvSwiglu(dt, M, D, I, x.data, gate_up.data, h, ctx.stream); !s.ok()) return s;
  } else {
    void* gu = static_cast<char*>(scratch) + h_bytes;  // [M,2I]
    GemmArgs g1;
    g1.dtype = dt;
    g1.M = M;
    g1.N = 2 * I;
    g1.K = D;
    g1.x = x.data;
    g1.w = gate_up.data;
    g1.y = gu;
    if (CudaStatus s = GemmForward(g1, 0, ctx.stream); !s.ok()) return s;
    if (CudaStatus s = LaunchMlpSiluAndMul(dt, M, I, gu, h, ctx.stream); !s.ok()) return s;
  }
  GemmArgs g2;
  g2.dtype = dt;
  g2.M = M;
  g2.N = D;
  g2.K = I;
  g2.x = h;
  g2.w = down.data;
  g2.y = y;
  if (use_gemv && GemvSupported(dt, M, I, h, down.data)) {
    return LaunchGemv(g2, ctx.stream);
  }
  return GemmForward(g2, 0, ctx.stream);
}

std::vector<std::string> SwigluMlpCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::SwigluMlpCandidates(dtype, key[0], key[1], key[2]), cuda::FormatSwigluMlpConfig);
}

}  // namespace

std::vector<CudaOp> SwigluMlpCudaOps() { return {{"swiglu_mlp", RunSwigluMlp, SwigluMlpCandidates}}; }

}  // namespace fusedserve
