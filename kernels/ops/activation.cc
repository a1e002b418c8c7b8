// The elementwise activations: silu_and_mul (SwiGLU, x [..., 2I] -> [..., I])
// and gelu (erf or tanh form, any shape).
#include "absl/strings/str_cat.h"
#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status CheckSiluAndMulShapes(const OpRequest& r) {
  if (auto s = CheckRankAtLeast(r, "x", 1); !s.ok()) return s;
  if (r.in("x").dim(-1) % 2 != 0) {
    return Invalid(
        absl::StrCat(r.op, ": input 'x' last dimension is ", r.in("x").dim(-1), ", expected an even number (2*I)"));
  }
  return absl::OkStatus();
}

absl::Status RunSiluAndMul(const cpu::OpCall& c) {
  const std::vector<int64_t> ml = RowsAndLast(c.r.in("x"));
  const int64_t I = ml[1] / 2;
  const auto x = c.In("x");
  float* y = c.Out("y");
  return c.ForEachChunk(ml[0],
                        [&](int64_t b, int64_t e) { cpu::SiluAndMul(x.data() + b * 2 * I, e - b, I, y + b * I); });
}

absl::Status RunGelu(const cpu::OpCall& c) {
  const auto x = c.In("x");
  const bool tanh = c.r.s("approximate") == "tanh";
  float* y = c.Out("y");
  return c.ForEachChunk(c.r.in("x").numel(),
                        [&](int64_t b, int64_t e) { cpu::Gelu(x.data() + b, e - b, tanh, y + b); });
}

OpSpec ActivationOp(std::string name) {
  OpSpec s;
  s.name = std::move(name);
  s.inputs = {"x"};
  s.outputs = {"y"};
  s.layout = FlatRows({"x"});
  s.memory_bound = true;
  s.check_attrs = NoAttrRules;
  s.small_key = SmallRowKey;
  s.add_cost = ElementwiseCost;
  return s;
}

}  // namespace

std::vector<OpSpec> ActivationOps() {
  OpSpec silu = ActivationOp("silu_and_mul");
  silu.key_dims = {"M", "I"};
  silu.check_shapes = CheckSiluAndMulShapes;
  silu.output_shapes = [](const OpRequest& r) {
    std::vector<int64_t> s = r.in("x").shape;
    s.back() /= 2;
    return OutputShapeList{{"y", s}};
  };
  silu.tuning_key = [](const OpRequest& r) {
    std::vector<int64_t> k = RowsAndLast(r.in("x"));
    k[1] /= 2;
    return k;
  };
  silu.inputs_for_key = [](const std::vector<int64_t>& k) {
    return std::vector<InputDesc>{{"x", {k[0], 2 * k[1]}, true}};
  };
  silu.run_cpu = RunSiluAndMul;

  OpSpec gelu = ActivationOp("gelu");
  gelu.attrs = {{"approximate", std::string("none"), {"none", "tanh"}}};
  gelu.key_dims = {"M", "N"};
  gelu.check_shapes = [](const OpRequest& r) { return CheckRankAtLeast(r, "x", 1); };
  gelu.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y"}); };
  gelu.tuning_key = [](const OpRequest& r) { return RowsAndLast(r.in("x")); };
  gelu.inputs_for_key = [](const std::vector<int64_t>& k) { return std::vector<InputDesc>{{"x", {k[0], k[1]}, true}}; };
  gelu.run_cpu = RunGelu;
  return {silu, gelu};
}

}  // namespace fusedserve::ops
