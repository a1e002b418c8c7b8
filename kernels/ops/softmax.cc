// softmax: row softmax over the last dim of x [..., N], viewed as [M, N].
#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status RunSoftmax(const cpu::OpCall& c) {
  const std::vector<int64_t> mn = RowsAndLast(c.r.in("x"));
  const int64_t N = mn[1];
  const auto x = c.In("x");
  float* y = c.Out("y");
  return c.ForEachChunk(mn[0], [&](int64_t b, int64_t e) { cpu::Softmax(x.data() + b * N, e - b, N, y + b * N); });
}

}  // namespace

std::vector<OpSpec> SoftmaxOps() {
  OpSpec s;
  s.name = "softmax";
  s.inputs = {"x"};
  s.outputs = {"y"};
  s.key_dims = {"M", "N"};
  s.layout = FlatRows({"x"});
  s.memory_bound = true;
  s.check_shapes = [](const OpRequest& r) { return CheckRankAtLeast(r, "x", 1); };
  s.check_attrs = NoAttrRules;
  s.output_shapes = [](const OpRequest& r) { return LikeX(r, {"y"}); };
  s.tuning_key = [](const OpRequest& r) { return RowsAndLast(r.in("x")); };
  s.small_key = SmallRowKey;
  s.inputs_for_key = [](const std::vector<int64_t>& k) { return std::vector<InputDesc>{{"x", {k[0], k[1]}, true}}; };
  s.add_cost = ElementwiseCost;
  s.run_cpu = RunSoftmax;
  return {s};
}

}  // namespace fusedserve::ops
