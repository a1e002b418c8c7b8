// The CUDA table: every family's CudaOps, indexed by OpSpec::id.
#include "kernels/cuda/dispatch.h"

namespace fusedserve {

const CudaOp* FindCudaOp(const OpSpec& spec) {
  static const std::vector<CudaOp>* by_id = [] {
    auto* v = new std::vector<CudaOp>(AllOpSpecs().size());
    // The table: one line per family.
    for (auto family : {NormCudaOps, SoftmaxCudaOps, ActivationCudaOps, RopeCudaOps, LinearCudaOps, SwigluMlpCudaOps,
                        AttentionCudaOps}) {
      for (CudaOp& op : family()) {
        const OpSpec* s = FindOpSpec(op.op);
        if (s != nullptr) (*v)[s->id] = std::move(op);
      }
    }
    return v;
  }();
  if (spec.id < 0 || spec.id >= static_cast<int>(by_id->size())) return nullptr;
  const CudaOp& op = (*by_id)[spec.id];
  return op.run != nullptr ? &op : nullptr;
}

CudaStatus RunCudaOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out, DispatchContext& ctx,
                     bool* handled) {
  const CudaOp* op = host.spec != nullptr ? FindCudaOp(*host.spec) : nullptr;
  *handled = op != nullptr;
  if (op == nullptr) return CudaStatus::Ok();
  return op->run(host, in, out, ctx);
}

std::vector<std::string> CudaCandidates(const std::string& name, DType dtype, const std::vector<int64_t>& key) {
  const OpSpec* spec = FindOpSpec(name);
  if (spec == nullptr || key.size() != spec->key_dims.size()) return {};
  const CudaOp* op = FindCudaOp(*spec);
  if (op == nullptr || op->candidates == nullptr) return {};
  return op->candidates(dtype, key);
}

std::string ConfigOf(const DispatchContext& ctx, const OpRequest& host, DType dtype) {
  return ctx.config ? ctx.config(host.op, dtype, TuningKey(host)) : std::string();
}

const DeviceTensor* FindTensor(const DeviceTensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace fusedserve
