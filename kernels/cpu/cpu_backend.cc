// CPU backend: converts inputs to fp32, runs the op's reference entry
// (OpSpec::run_cpu, kernels/ops/), rounds outputs to the request dtype. Runs
// on the caller's thread, in pieces (OpCall::ForEachChunk).
#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/reference.h"

namespace fusedserve {
namespace cpu {

// Work per piece: ~10-50 ms of the plain reference loops on one core.
constexpr double kChunkFlops = 5e7;

absl::Status OpCall::ForEachChunk(int64_t rows, const std::function<void(int64_t, int64_t)>& body) const {
  const double per_row = rows > 0 ? flops / static_cast<double>(rows) : 0;
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(kChunkFlops / std::max(per_row, 1.0)));
  for (int64_t begin = 0; begin < rows; begin += step) {
    if (stop) {
      if (absl::Status s = stop(); !s.ok()) return s;
    }
    body(begin, std::min(rows, begin + step));
  }
  return absl::OkStatus();
}

absl::StatusOr<FloatOutputs> RunReference(const OpRequest& r, const StopCheck& stop) {
  if (r.spec == nullptr) return absl::InternalError("op '" + r.op + "': request not validated");
  FloatOutputs out;
  for (const auto& [name, shape] : OutputShapes(r)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out[name].assign(n, 0.0f);
  }
  const OpCall call{r, out, EstimateCost(r).flops, stop};
  if (absl::Status s = r.spec->run_cpu(call); !s.ok()) return s;
  return out;
}

}  // namespace cpu

namespace {

class CpuBackend : public Backend {
 public:
  using Backend::Run;
  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return "CPU reference (fp32 accumulation)"; }

  absl::StatusOr<TensorMap> Run(const OpRequest& r, const StopCheck& stop, const WhileRunning&) override {
    absl::StatusOr<cpu::FloatOutputs> out = cpu::RunReference(r, stop);
    if (!out.ok()) return out.status();
    const DType dt = RequestDType(r);
    TensorMap result;
    for (auto& [name, shape] : OutputShapes(r)) result[name] = HostTensor::FromFloat(dt, shape, (*out)[name]);
    return result;
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace fusedserve
