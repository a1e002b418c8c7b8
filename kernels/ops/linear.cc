// linear: y = act(x . weight^T + bias).   x [M, K]; weight [N, K]; bias [N]
#include <algorithm>
#include <cmath>

#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status CheckLinearShapes(const OpRequest& r) {
  if (auto s = CheckShape(r, "x", {-1, -1}); !s.ok()) return s;
  const int64_t K = r.in("x").dim(1);
  if (auto s = CheckShape(r, "weight", {-1, K}); !s.ok()) return s;
  if (r.has("bias")) return CheckShape(r, "bias", {r.in("weight").dim(0)});
  return absl::OkStatus();
}

void LinearCost(const OpRequest& r, OpCost* c) {
  const double M = r.in("x").dim(0), K = r.in("x").dim(1), N = r.in("weight").dim(0);
  c->flops = 2 * M * N * K + 2 * M * N;
}

// Weights uniform in +-1/sqrt(K): outputs of order 1.
std::vector<InputDesc> LinearInputs(const std::vector<int64_t>& k) {
  const int64_t M = k[0], N = k[1], K = k[2];
  const float s = 1.0f / std::sqrt(static_cast<float>(K));
  return {{"x", {M, K}, true}, {"weight", {N, K}, false, -s, s}};
}

absl::Status RunLinear(const cpu::OpCall& c) {
  const HostTensor& x = c.r.in("x");
  const int64_t K = x.dim(1), N = c.r.in("weight").dim(0);
  const auto xv = c.In("x"), w = c.In("weight");
  const auto bias = c.r.has("bias") ? c.In("bias") : std::vector<float>();
  const Activation act = ParseActivation(c.r.s("activation"));
  float* y = c.Out("y");
  return c.ForEachChunk(x.dim(0), [&](int64_t b, int64_t e) {
    cpu::Linear(xv.data() + b * K, w.data(), bias.empty() ? nullptr : bias.data(), e - b, K, N, act, y + b * N);
  });
}

}  // namespace

std::vector<OpSpec> LinearOps() {
  OpSpec s;
  s.name = "linear";
  s.inputs = {"x", "weight"};
  s.optional_inputs = {"bias"};
  s.attrs = {{"activation", std::string("none"), {"none", "gelu", "gelu_tanh", "silu"}}};
  s.outputs = {"y"};
  s.key_dims = {"M", "N", "K"};
  s.layout = RowLayout{false, {"x"}, "x"};
  s.check_shapes = CheckLinearShapes;
  s.check_attrs = NoAttrRules;
  s.output_shapes = [](const OpRequest& r) {
    return OutputShapeList{{"y", {r.in("x").dim(0), r.in("weight").dim(0)}}};
  };
  s.tuning_key = [](const OpRequest& r) {
    return std::vector<int64_t>{r.in("x").dim(0), r.in("weight").dim(0), r.in("x").dim(1)};
  };
  s.small_key = SmallGemmKey;
  s.inputs_for_key = LinearInputs;
  s.add_cost = LinearCost;
  s.run_cpu = RunLinear;
  return {s};
}

}  // namespace fusedserve::ops
