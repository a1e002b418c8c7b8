// The row normalisations: rms_norm, add_rms_norm (also returns the new
// residual x + residual), add_rms_norm_silu, layer_norm. x [..., H] viewed
// as [M, H]; weight (and layer_norm's bias) [H].
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status CheckNormShapes(const OpRequest& r) {
  if (auto s = CheckRankAtLeast(r, "x", 1); !s.ok()) return s;
  const int64_t H = r.in("x").dim(-1);
  if (auto s = CheckShape(r, "weight", {H}); !s.ok()) return s;
  if (r.has("residual") && r.in("residual").shape != r.in("x").shape) {
    return Invalid(absl::StrCat(r.op, ": input 'residual' has shape ", ShapeStr(r.in("residual").shape),
                                ", expected the shape of 'x' ", ShapeStr(r.in("x").shape)));
  }
  if (r.has("bias")) return CheckShape(r, "bias", {H});
  return absl::OkStatus();
}

absl::Status CheckEps(const OpRequest& r) {
  const double eps = r.f("eps");
  if (!(eps > 0) || !std::isfinite(eps) || eps > 1) {
    return Invalid(absl::StrCat(r.op, ": attribute 'eps' is ", eps, ", expected 0 < eps <= 1"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> NormKey(const OpRequest& r) { return RowsAndLast(r.in("x")); }

// x and residual [M, H] (token rows), weight near 1, bias [H].
std::vector<InputDesc> NormInputs(const std::vector<int64_t>& k, bool residual, bool bias) {
  std::vector<InputDesc> in = {{"x", {k[0], k[1]}, true}, {"weight", {k[1]}, false, 0.5f, 1.5f}};
  if (residual) in.push_back({"residual", {k[0], k[1]}, true});
  if (bias) in.push_back({"bias", {k[1]}});
  return in;
}

// The four ops share one CPU entry: the row loop, each its reference.
template <int kKind>
absl::Status RunNorm(const cpu::OpCall& c) {
  const OpRequest& r = c.r;
  const std::vector<int64_t> ml = RowsAndLast(r.in("x"));
  const int64_t H = ml[1];
  const float eps = static_cast<float>(r.f("eps"));
  const auto x = c.In("x"), w = c.In("weight");
  const auto res = r.has("residual") ? c.In("residual") : std::vector<float>();
  const auto bias = r.has("bias") ? c.In("bias") : std::vector<float>();
  float* y = c.Out("y");
  float* res_out = kKind == 1 ? c.Out("residual_out") : nullptr;
  return c.ForEachChunk(ml[0], [&](int64_t b, int64_t e) {
    const int64_t o = b * H;
    if (kKind == 0) cpu::RmsNorm(x.data() + o, w.data(), e - b, H, eps, y + o);
    if (kKind == 1) cpu::AddRmsNorm(x.data() + o, res.data() + o, w.data(), e - b, H, eps, y + o, res_out + o);
    if (kKind == 2) cpu::AddRmsNormSilu(x.data() + o, res.data() + o, w.data(), e - b, H, eps, y + o);
    if (kKind == 3) cpu::LayerNorm(x.data() + o, w.data(), bias.data(), e - b, H, eps, y + o);
  });
}

// The fields the four share; `residual`: the add_* ops (x and residual rows).
OpSpec NormOp(std::string name, bool residual, std::vector<std::string> outputs) {
  OpSpec s;
  s.name = std::move(name);
  s.inputs = residual ? std::vector<std::string>{"x", "residual", "weight"} : std::vector<std::string>{"x", "weight"};
  s.attrs = {{"eps", 1e-5, {}}};
  s.outputs = std::move(outputs);
  s.key_dims = {"M", "H"};
  s.layout = FlatRows(residual ? std::vector<std::string>{"x", "residual"} : std::vector<std::string>{"x"});
  s.memory_bound = true;
  s.check_shapes = CheckNormShapes;
  s.check_attrs = CheckEps;
  s.tuning_key = NormKey;
  s.small_key = SmallRowKey;
  s.add_cost = ElementwiseCost;
  return s;
}

}  // namespace

std::vector<OpSpec> NormOps() {
  OpSpec rms = NormOp("rms_norm", false, {"y"});
  rms.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y"}); };
  rms.inputs_for_key = [](const std::vector<int64_t>& k) { return NormInputs(k, false, false); };
  rms.run_cpu = RunNorm<0>;

  OpSpec add = NormOp("add_rms_norm", true, {"y", "residual_out"});
  add.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y", "residual_out"}); };
  add.inputs_for_key = [](const std::vector<int64_t>& k) { return NormInputs(k, true, false); };
  add.run_cpu = RunNorm<1>;

  OpSpec silu = NormOp("add_rms_norm_silu", true, {"y"});
  silu.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y"}); };
  silu.inputs_for_key = [](const std::vector<int64_t>& k) { return NormInputs(k, true, false); };
  silu.run_cpu = RunNorm<2>;

  OpSpec layer = NormOp("layer_norm", false, {"y"});
  layer.inputs.push_back("bias");
  layer.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y"}); };
  layer.inputs_for_key = [](const std::vector<int64_t>& k) { return NormInputs(k, false, true); };
  layer.run_cpu = RunNorm<3>;
  return {rms, add, silu, layer};
}

}  // namespace fusedserve::ops
