// The CUDA entries of the activations (silu_and_mul, gelu): request ->
// ActParams and the tuned ActConfig ("" or unparsable: the default).
#include "kernels/cuda/activation.h"
#include "kernels/cuda/dispatch.h"

namespace fusedserve {
namespace {

CudaStatus RunActivation(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                         DispatchContext& ctx, cuda::ActKind kind) {
  const DeviceTensor* x = FindTensor(in, "x");
  const DeviceTensor* y = FindTensor(out, "y");
  if (!x || !y) return CudaStatus::Error(host.op + ": missing tensor 'x/y'");
  cuda::ActParams p;
  p.kind = kind;
  p.dtype = x->dtype;
  p.x = x->data;
  p.y = y->data;
  const int64_t last = x->shape.empty() ? 1 : x->shape.back();
  p.rows = last == 0 ? 0 : x->numel() / last;
  p.cols = kind == cuda::ActKind::kSiluAndMul ? last / 2 : last;
  cuda::ActConfig c;
  cuda::ParseActConfig(ConfigOf(ctx, host, p.dtype), &c);
  return cuda::LaunchActivation(p, c, ctx.stream);
}

CudaStatus RunSiluAndMul(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                         DispatchContext& ctx) {
  return RunActivation(host, in, out, ctx, cuda::ActKind::kSiluAndMul);
}

CudaStatus RunGelu(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out, DispatchContext& ctx) {
  const bool tanh = host.s("approximate") == "tanh";
  return RunActivation(host, in, out, ctx, tanh ? cuda::ActKind::kGeluTanh : cuda::ActKind::kGeluErf);
}

template <cuda::ActKind kKind>
std::vector<std::string> ActCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::ActCandidates(kKind, dtype, key[0], key[1]), cuda::FormatActConfig);
}

}  // namespace

std::vector<CudaOp> ActivationCudaOps() {
  // The gelu form does not change the launch shape: one list for both.
  return {{"silu_and_mul", RunSiluAndMul, ActCandidates<cuda::ActKind::kSiluAndMul>},
          {"gelu", RunGelu, ActCandidates<cuda::ActKind::kGeluErf>}};
}

}  // namespace fusedserve
