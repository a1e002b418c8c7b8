// Dispatch of the memory-bound ops (norms, softmax, activations, rope) to
// their CUDA launchers: reads shapes from the device tensors and attributes
// from the request, looks up the tuned config string for (op, dtype, key)
// and parses it with the family's parser ("" or unparsable: the family's
// default, which fits every shape). MemoryBoundCandidates lists the strings
// the autotuner may time; every one of them runs correctly for its key.
#include <algorithm>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/softmax.h"

namespace fusedserve {
namespace {

enum class Family { kNone, kNorm, kSoftmax, kActivation, kRope };

Family FamilyOf(const std::string& op) {
  if (op == "rms_norm" || op == "add_rms_norm" || op == "add_rms_norm_silu" || op == "layer_norm") return Family::kNorm;
  if (op == "softmax") return Family::kSoftmax;
  if (op == "silu_and_mul" || op == "gelu") return Family::kActivation;
  if (op == "rope") return Family::kRope;
  return Family::kNone;
}

cuda::NormKind NormKindOf(const std::string& op) {
  if (op == "add_rms_norm") return cuda::NormKind::kAddRms;
  if (op == "add_rms_norm_silu") return cuda::NormKind::kAddRmsSilu;
  if (op == "layer_norm") return cuda::NormKind::kLayer;
  return cuda::NormKind::kRms;
}

// gelu's form from the request ("tanh" or "none"); erf when absent.
cuda::ActKind ActKindOf(const OpRequest& r) {
  if (r.op == "silu_and_mul") return cuda::ActKind::kSiluAndMul;
  auto it = r.attrs.find("approximate");
  if (it != r.attrs.end() && std::holds_alternative<std::string>(it->second) &&
      std::get<std::string>(it->second) == "tanh")
    return cuda::ActKind::kGeluTanh;
  return cuda::ActKind::kGeluErf;
}

double AttrOr(const OpRequest& r, const std::string& name, double fallback) {
  auto it = r.attrs.find(name);
  if (it == r.attrs.end()) return fallback;
  if (std::holds_alternative<double>(it->second)) return std::get<double>(it->second);
  if (std::holds_alternative<int64_t>(it->second)) return static_cast<double>(std::get<int64_t>(it->second));
  return fallback;
}

// {rows, last} of a tensor: rows = numel / last dim.
std::vector<int64_t> RowsAndLast(const DeviceTensor& t) {
  const int64_t last = t.shape.empty() ? 1 : t.shape.back();
  return {last == 0 ? 0 : t.numel() / last, last};
}

const DeviceTensor* Find(const DeviceTensorMap& m, const char* name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

CudaStatus RunMemoryBoundOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                            DispatchContext& ctx, bool* handled) {
  const Family family = FamilyOf(host.op);
  *handled = family != Family::kNone;
  if (!*handled) return CudaStatus::Ok();
  const std::string& op = host.op;
  auto missing = [&](const char* name) { return CudaStatus::Error(op + ": missing tensor '" + name + "'"); };
  auto lookup = [&](DType dt, const std::vector<int64_t>& key) {
    return ctx.config ? ctx.config(op, dt, key) : std::string();
  };

  if (family == Family::kRope) {
    const DeviceTensor* q = Find(in, "q");
    const DeviceTensor* k = Find(in, "k");
    const DeviceTensor* pos = Find(in, "positions");
    const DeviceTensor* q_out = Find(out, "q_out");
    const DeviceTensor* k_out = Find(out, "k_out");
    if (!q || !k || !pos || !q_out || !k_out) return missing("q/k/positions/q_out/k_out");
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
    p.theta = AttrOr(host, "theta", 500000.0);
    cuda::RopeConfig c;
    cuda::ParseRopeConfig(lookup(p.dtype, {p.tokens, p.heads_q, p.heads_kv, p.head_dim}), &c);
    return cuda::LaunchRope(p, c, ctx.stream);
  }

  const DeviceTensor* x = Find(in, "x");
  const DeviceTensor* y = Find(out, "y");
  if (!x || !y) return missing("x/y");
  const std::vector<int64_t> rl = RowsAndLast(*x);
  const DType dt = x->dtype;

  if (family == Family::kNorm) {
    cuda::NormParams p;
    p.kind = NormKindOf(op);
    p.dtype = dt;
    p.x = x->data;
    p.y = y->data;
    p.rows = rl[0];
    p.hidden = rl[1];
    p.eps = static_cast<float>(AttrOr(host, "eps", 1e-5));
    const DeviceTensor* w = Find(in, "weight");
    if (!w) return missing("weight");
    p.weight = w->data;
    if (p.kind == cuda::NormKind::kAddRms || p.kind == cuda::NormKind::kAddRmsSilu) {
      const DeviceTensor* r = Find(in, "residual");
      if (!r) return missing("residual");
      p.residual = r->data;
    }
    if (p.kind == cuda::NormKind::kAddRms) {
      const DeviceTensor* ro = Find(out, "residual_out");
      if (!ro) return missing("residual_out");
      p.residual_out = ro->data;
    }
    if (p.kind == cuda::NormKind::kLayer) {
      const DeviceTensor* b = Find(in, "bias");
      if (!b) return missing("bias");
      p.bias = b->data;
    }
    cuda::NormConfig c;
    cuda::ParseNormConfig(lookup(dt, rl), &c);
    return cuda::LaunchNorm(p, c, ctx.stream);
  }

  if (family == Family::kSoftmax) {
    cuda::SoftmaxParams p;
    p.dtype = dt;
    p.x = x->data;
    p.y = y->data;
    p.rows = rl[0];
    p.n = rl[1];
    cuda::SoftmaxConfig c;
    cuda::ParseSoftmaxConfig(lookup(dt, rl), &c);
    return cuda::LaunchSoftmax(p, c, ctx.stream);
  }

  // Activations.
  cuda::ActParams p;
  p.kind = ActKindOf(host);
  p.dtype = dt;
  p.x = x->data;
  p.y = y->data;
  p.rows = rl[0];
  p.cols = p.kind == cuda::ActKind::kSiluAndMul ? rl[1] / 2 : rl[1];
  const std::vector<int64_t> key = {p.rows, p.cols};
  cuda::ActConfig c;
  cuda::ParseActConfig(lookup(dt, key), &c);
  return cuda::LaunchActivation(p, c, ctx.stream);
}

std::vector<std::string> MemoryBoundCandidates(const std::string& op, DType dtype, const std::vector<int64_t>& key) {
  std::vector<std::string> out;
  switch (FamilyOf(op)) {
    case Family::kNone:
      break;
    case Family::kNorm:
      if (key.size() < 2) break;
      for (const auto& c : cuda::NormCandidates(dtype, key[0], key[1])) out.push_back(cuda::FormatNormConfig(c));
      break;
    case Family::kSoftmax:
      if (key.size() < 2) break;
      for (const auto& c : cuda::SoftmaxCandidates(dtype, key[0], key[1])) out.push_back(cuda::FormatSoftmaxConfig(c));
      break;
    case Family::kActivation: {
      if (key.size() < 2) break;
      // The gelu form does not change the launch shape: one list for both.
      const cuda::ActKind kind = op == "silu_and_mul" ? cuda::ActKind::kSiluAndMul : cuda::ActKind::kGeluErf;
      for (const auto& c : cuda::ActCandidates(kind, dtype, key[0], key[1])) out.push_back(cuda::FormatActConfig(c));
      break;
    }
    case Family::kRope:
      if (key.size() < 4) break;
      for (const auto& c : cuda::RopeCandidates(dtype, key[0], key[1], key[2], key[3]))
        out.push_back(cuda::FormatRopeConfig(c));
      break;
  }
  return out;
}

}  // namespace fusedserve
