// The CUDA entry of softmax: request -> SoftmaxParams and the tuned
// SoftmaxConfig ("" or unparsable: the default).
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/softmax.h"

namespace fusedserve {
namespace {

CudaStatus RunSoftmax(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                      DispatchContext& ctx) {
  const DeviceTensor* x = FindTensor(in, "x");
  const DeviceTensor* y = FindTensor(out, "y");
  if (!x || !y) return CudaStatus::Error(host.op + ": missing tensor 'x/y'");
  cuda::SoftmaxParams p;
  p.dtype = x->dtype;
  p.x = x->data;
  p.y = y->data;
  p.n = x->shape.empty() ? 1 : x->shape.back();
  p.rows = p.n == 0 ? 0 : x->numel() / p.n;
  cuda::SoftmaxConfig c;
  cuda::ParseSoftmaxConfig(ConfigOf(ctx, host, p.dtype), &c);
  return cuda::LaunchSoftmax(p, c, ctx.stream);
}

std::vector<std::string> SoftmaxCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::SoftmaxCandidates(dtype, key[0], key[1]), cuda::FormatSoftmaxConfig);
}

}  // namespace

std::vector<CudaOp> SoftmaxCudaOps() { return {{"softmax", RunSoftmax, SoftmaxCandidates}}; }

}  // namespace fusedserve
