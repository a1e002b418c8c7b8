// The CUDA entries of the norm family (rms_norm, add_rms_norm,
// add_rms_norm_silu, layer_norm): request -> NormParams and the tuned
// NormConfig ("" or unparsable: the default, which fits every shape).
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/norm.h"

namespace fusedserve {
namespace {

template <cuda::NormKind kKind>
CudaStatus RunNorm(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out, DispatchContext& ctx) {
  const DeviceTensor* x = FindTensor(in, "x");
  const DeviceTensor* y = FindTensor(out, "y");
  const DeviceTensor* w = FindTensor(in, "weight");
  const DeviceTensor* r = FindTensor(in, "residual");
  const DeviceTensor* ro = FindTensor(out, "residual_out");
  const DeviceTensor* b = FindTensor(in, "bias");
  const bool add = kKind == cuda::NormKind::kAddRms || kKind == cuda::NormKind::kAddRmsSilu;
  if (!x || !y || !w || (add && !r) || (kKind == cuda::NormKind::kAddRms && !ro) ||
      (kKind == cuda::NormKind::kLayer && !b)) {
    return CudaStatus::Error(host.op + ": missing tensor");
  }
  cuda::NormParams p;
  p.kind = kKind;
  p.dtype = x->dtype;
  p.x = x->data;
  p.y = y->data;
  p.weight = w->data;
  p.residual = add ? r->data : nullptr;
  p.residual_out = ro != nullptr ? ro->data : nullptr;
  p.bias = b != nullptr ? b->data : nullptr;
  const int64_t last = x->shape.empty() ? 1 : x->shape.back();
  p.rows = last == 0 ? 0 : x->numel() / last;
  p.hidden = last;
  p.eps = static_cast<float>(host.f("eps"));
  cuda::NormConfig c;
  cuda::ParseNormConfig(ConfigOf(ctx, host, p.dtype), &c);
  return cuda::LaunchNorm(p, c, ctx.stream);
}

std::vector<std::string> NormCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::NormCandidates(dtype, key[0], key[1]), cuda::FormatNormConfig);
}

}  // namespace

std::vector<CudaOp> NormCudaOps() {
  return {{"rms_norm", RunNorm<cuda::NormKind::kRms>, NormCandidates},
          {"add_rms_norm", RunNorm<cuda::NormKind::kAddRms>, NormCandidates},
          {"add_rms_norm_silu", RunNorm<cuda::NormKind::kAddRmsSilu>, NormCandidates},
          {"layer_norm", RunNorm<cuda::NormKind::kLayer>, NormCandidates}};
}

}  // namespace fusedserve
