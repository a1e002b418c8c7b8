// The CUDA entry of rope: request -> RopeParams and the tuned RopeConfig
// ("" or unparsable: the default).
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/rope.h"

namespace fusedserve {
namespace {

CudaStatus RunRope(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out, DispatchContext& ctx) {
  const DeviceTensor* q = FindTensor(in, "q");
  const DeviceTensor* k = FindTensor(in, "k");
  const DeviceTensor* pos = FindTensor(in, "positions");
  const DeviceTensor* q_out = FindTensor(out, "q_out");
  const DeviceTensor* k_out = FindTensor(out, "k_out");
  if (!q || !k || !pos || !q_out || !k_out)
    return CudaStatus::Error("rope: missing tensor 'q/k/positions/q_out/k_out'");
  if (q->shape.size() != 3 || k->shape.size() != 3 || pos->dtype != DType::kI32)
    return CudaStatus::Error("rope: expected q [T,Hq,D], k [T,Hkv,D], I32 positions [T]");
  cuda::RopeParams p;
  p.dtype = q->dtype;
  p.q = q->data;
  p.k = k->data;
  p.positions = static_cast<const int32_t*>(pos->data);
  p.q_out = q_out->data;
  p.k_out = k_out->data;
  p.tokens = q->shape[0];
  p.heads_q = q->shape[1];
  p.heads_kv = k->shape[1];
  p.head_dim = q->shape[2];
  p.theta = host.f("theta");
  cuda::RopeConfig c;
  cuda::ParseRopeConfig(ConfigOf(ctx, host, p.dtype), &c);
  return cuda::LaunchRope(p, c, ctx.stream);
}

std::vector<std::string> RopeCandidates(DType dtype, const std::vector<int64_t>& key) {
  return FormatAll(cuda::RopeCandidates(dtype, key[0], key[1], key[2], key[3]), cuda::FormatRopeConfig);
}

}  // namespace

std::vector<CudaOp> RopeCudaOps() { return {{"rope", RunRope, RopeCandidates}}; }

}  // namespace fusedserve
