// swiglu_mlp: y = down(silu(x . gate^T) * (x . up^T)), gate_up = [gate; up].
// x [M, D]; gate_up [2I, D]; down [D, I]; y [M, D]
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status CheckSwigluShapes(const OpRequest& r) {
  if (auto s = CheckShape(r, "x", {-1, -1}); !s.ok()) return s;
  const int64_t D = r.in("x").dim(1);
  if (auto s = CheckShape(r, "gate_up", {-1, D}); !s.ok()) return s;
  if (r.in("gate_up").dim(0) % 2 != 0) {
    return Invalid(absl::StrCat(r.op, ": input 'gate_up' has ", r.in("gate_up").dim(0),
                                " rows, expected an even number (2*I: gate rows then up rows)"));
  }
  return CheckShape(r, "down", {D, r.in("gate_up").dim(0) / 2});
}

void SwigluCost(const OpRequest& r, OpCost* c) {
  const double M = r.in("x").dim(0), D = r.in("x").dim(1), I = r.in("down").dim(1);
  c->flops = 6 * M * D * I + 4 * M * I;
  c->scratch_bytes += 4 * 3 * M * I;  // gate|up [M, 2I] and the activation [M, I], fp32
}

std::vector<InputDesc> SwigluInputs(const std::vector<int64_t>& k) {
  const int64_t M = k[0], D = k[1], I = k[2];
  const float sd = 1.0f / std::sqrt(static_cast<float>(D)), si = 1.0f / std::sqrt(static_cast<float>(I));
  return {{"x", {M, D}, true}, {"gate_up", {2 * I, D}, false, -sd, sd}, {"down", {D, I}, false, -si, si}};
}

absl::Status RunSwiglu(const cpu::OpCall& c) {
  const HostTensor& x = c.r.in("x");
  const int64_t D = x.dim(1), I = c.r.in("down").dim(1);
  const auto xv = c.In("x"), gate_up = c.In("gate_up"), down = c.In("down");
  float* y = c.Out("y");
  return c.ForEachChunk(x.dim(0), [&](int64_t b, int64_t e) {
    cpu::SwigluMlp(xv.data() + b * D, gate_up.data(), down.data(), e - b, D, I, y + b * D);
  });
}

}  // namespace

std::vector<OpSpec> SwigluMlpOps() {
  OpSpec s;
  s.name = "swiglu_mlp";
  s.inputs = {"x", "gate_up", "down"};
  s.outputs = {"y"};
  s.key_dims = {"M", "D", "I"};
  s.layout = RowLayout{false, {"x"}, "x"};
  s.check_shapes = CheckSwigluShapes;
  s.check_attrs = NoAttrRules;
  s.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y"}); };
  s.tuning_key = [](const OpRequest& r) {
    return std::vector<int64_t>{r.in("x").dim(0), r.in("x").dim(1), r.in("down").dim(1)};
  };
  s.small_key = SmallGemmKey;
  s.inputs_for_key = SwigluInputs;
  s.add_cost = SwigluCost;
  s.run_cpu = RunSwiglu;
  return {s};
}

}  // namespace fusedserve::ops
