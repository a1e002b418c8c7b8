// rope: rotary position embedding (LLaMA rotate-half) of q [T, Hq, D] and
// k [T, Hkv, D] at positions [T].
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status CheckRopeShapes(const OpRequest& r) {
  if (auto s = CheckRankAtLeast(r, "q", 3); !s.ok()) return s;
  const HostTensor& q = r.in("q");
  if (auto s = CheckShape(r, "q", {-1, -1, -1}); !s.ok()) return s;
  const int64_t T = q.dim(0), D = q.dim(2);
  if (D % 2 != 0) return Invalid(absl::StrCat(r.op, ": head dim of 'q' is ", D, ", expected an even number"));
  if (auto s = CheckShape(r, "k", {T, -1, D}); !s.ok()) return s;
  if (auto s = CheckShape(r, "positions", {T}); !s.ok()) return s;
  return CheckIndexValues(r, "positions", 0, std::numeric_limits<int32_t>::max());
}

absl::Status CheckTheta(const OpRequest& r) {
  const double theta = r.f("theta");
  if (!(theta > 0) || !std::isfinite(theta)) {
    return Invalid(absl::StrCat(r.op, ": attribute 'theta' is ", theta, ", expected a finite value > 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckRopeKey(const std::vector<int64_t>& k) {
  if (auto s = CheckGqaKey("rope", k[1], k[2]); !s.ok()) return s;
  if (k[3] % 2 != 0) return Invalid("rope key: D must be even");
  return absl::OkStatus();
}

std::vector<InputDesc> RopeInputs(const std::vector<int64_t>& k) {
  const int64_t T = k[0], Hq = k[1], Hkv = k[2], D = k[3];
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = t;
  InputDesc positions{"positions", {T}, true};
  positions.values = std::move(pos);
  return {{"q", {T, Hq, D}, true}, {"k", {T, Hkv, D}, true}, positions};
}

std::vector<int64_t> SmallRopeKey(const std::vector<int64_t>& k) {
  std::vector<int64_t> small = {1};
  for (int64_t d : SmallHeads(k[1], k[2], k[3])) small.push_back(d);
  return small;
}

absl::Status RunRope(const cpu::OpCall& c) {
  const HostTensor& q = c.r.in("q");
  const int64_t Hq = q.dim(1), Hkv = c.r.in("k").dim(1), D = q.dim(2);
  const auto qv = c.In("q"), kv = c.In("k");
  const std::vector<int64_t> pos = c.r.in("positions").ToInt64();
  const double theta = c.r.f("theta");
  float* q_out = c.Out("q_out");
  float* k_out = c.Out("k_out");
  return c.ForEachChunk(q.dim(0), [&](int64_t b, int64_t e) {
    cpu::Rope(qv.data() + b * Hq * D, kv.data() + b * Hkv * D, pos.data() + b, e - b, Hq, Hkv, D, theta,
              q_out + b * Hq * D, k_out + b * Hkv * D);
  });
}

}  // namespace

std::vector<OpSpec> RopeOps() {
  OpSpec s;
  s.name = "rope";
  s.inputs = {"q", "k", "positions"};
  s.index_inputs = {"positions"};
  s.attrs = {{"theta", 500000.0, {}}};
  s.outputs = {"q_out", "k_out"};
  s.key_dims = {"T", "Hq", "Hkv", "D"};
  s.layout = RowLayout{false, {"q", "k", "positions"}, "q"};
  s.memory_bound = true;
  s.check_shapes = CheckRopeShapes;
  s.check_attrs = CheckTheta;
  s.output_shapes = [](const OpRequest& r) {
    return OutputShapeList{{"q_out", r.in("q").shape}, {"k_out", r.in("k").shape}};
  };
  s.tuning_key = [](const OpRequest& r) {
    const HostTensor& q = r.in("q");
    return std::vector<int64_t>{q.dim(0), q.dim(1), r.in("k").dim(1), q.dim(2)};
  };
  s.check_key = CheckRopeKey;
  s.small_key = SmallRopeKey;
  s.inputs_for_key = RopeInputs;
  s.add_cost = ElementwiseCost;
  s.run_cpu = RunRope;
  return {s};
}

}  // namespace fusedserve::ops
