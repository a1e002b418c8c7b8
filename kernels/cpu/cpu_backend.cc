// CPU backend: converts inputs to fp32, runs the reference implementation,
// rounds outputs to the request dtype. Runs on the caller's thread, in pieces
// of rows (tokens, or sequences for decode) of about kChunkFlops of work each,
// polling the StopCheck between pieces: a cancelled or expired request stops
// within tens of milliseconds instead of pinning a worker for minutes.
#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/reference.h"

namespace fusedserve {
namespace {

// Work per piece: ~10-50 ms of the plain reference loops on one core.
constexpr double kChunkFlops = 5e7;

// Calls body(begin, end) over [0, rows) in pieces of about kChunkFlops,
// returning early with stop()'s status.
template <typename Body>
absl::Status ForEachChunk(int64_t rows, double flops, const StopCheck& stop, Body body) {
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

class CpuBackend : public Backend {
 public:
  using Backend::Run;
  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return "CPU reference (fp32 accumulation)"; }

  absl::StatusOr<TensorMap> Run(const OpRequest& r, const StopCheck& stop) override {
    const DType dt = RequestDType(r);
    std::map<std::string, std::vector<float>> out;
    auto shapes = OutputShapes(r);
    for (const auto& [name, shape] : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      out[name].assign(n, 0.0f);
    }
    auto F = [&](const std::string& name) { return r.in(name).ToFloat(); };
    const double flops = EstimateCost(r).flops;
    const std::string& op = r.op;
    absl::Status status;
    if (op == "rms_norm" || op == "add_rms_norm" || op == "add_rms_norm_silu" || op == "layer_norm") {
      const HostTensor& x = r.in("x");
      const int64_t H = x.dim(-1), M = x.numel() / std::max<int64_t>(H, 1);
      const float eps = static_cast<float>(r.f("eps"));
      const auto xv = F("x"), w = F("weight");
      const auto res = r.has("residual") ? F("residual") : std::vector<float>();
      const auto bias = r.has("bias") ? F("bias") : std::vector<float>();
      float* y = out["y"].data();
      float* res_out = op == "add_rms_norm" ? out["residual_out"].data() : nullptr;
      status = ForEachChunk(M, flops, stop, [&](int64_t b, int64_t e) {
        const int64_t o = b * H;
        if (op == "rms_norm") {
          cpu::RmsNorm(xv.data() + o, w.data(), e - b, H, eps, y + o);
        } else if (op == "add_rms_norm") {
          cpu::AddRmsNorm(xv.data() + o, res.data() + o, w.data(), e - b, H, eps, y + o, res_out + o);
        } else if (op == "add_rms_norm_silu") {
          cpu::AddRmsNormSilu(xv.data() + o, res.data() + o, w.data(), e - b, H, eps, y + o);
        } else {
          cpu::LayerNorm(xv.data() + o, w.data(), bias.data(), e - b, H, eps, y + o);
        }
      });
    } else if (op == "softmax") {
      const HostTensor& x = r.in("x");
      const int64_t N = x.dim(-1), M = x.numel() / std::max<int64_t>(N, 1);
      const auto xv = F("x");
      status = ForEachChunk(M, flops, stop, [&](int64_t b, int64_t e) {
        cpu::Softmax(xv.data() + b * N, e - b, N, out["y"].data() + b * N);
      });
    } else if (op == "silu_and_mul") {
      const HostTensor& x = r.in("x");
      const int64_t I = x.dim(-1) / 2, M = x.numel() / std::max<int64_t>(x.dim(-1), 1);
      const auto xv = F("x");
      status = ForEachChunk(M, flops, stop, [&](int64_t b, int64_t e) {
        cpu::SiluAndMul(xv.data() + b * 2 * I, e - b, I, out["y"].data() + b * I);
      });
    } else if (op == "gelu") {
      const auto xv = F("x");
      const bool tanh = r.s("approximate") == "tanh";
      status = ForEachChunk(r.in("x").numel(), flops, stop,
                            [&](int64_t b, int64_t e) { cpu::Gelu(xv.data() + b, e - b, tanh, out["y"].data() + b); });
    } else if (op == "rope") {
      const HostTensor& q = r.in("q");
      const int64_t Hq = q.dim(1), Hkv = r.in("k").dim(1), D = q.dim(2);
      const auto qv = F("q"), kv = F("k");
      const std::vector<int64_t> pos = r.in("positions").ToInt64();
      status = ForEachChunk(q.dim(0), flops, stop, [&](int64_t b, int64_t e) {
        cpu::Rope(qv.data() + b * Hq * D, kv.data() + b * Hkv * D, pos.data() + b, e - b, Hq, Hkv, D, r.f("theta"),
                  out["q_out"].data() + b * Hq * D, out["k_out"].data() + b * Hkv * D);
      });
    } else if (op == "linear") {
      const HostTensor& x = r.in("x");
      const int64_t K = x.dim(1), N = r.in("weight").dim(0);
      const auto xv = F("x"), w = F("weight");
      const auto bias = r.has("bias") ? F("bias") : std::vector<float>();
      const Activation act = ParseActivation(r.s("activation"));
      status = ForEachChunk(x.dim(0), flops, stop, [&](int64_t b, int64_t e) {
        cpu::Linear(xv.data() + b * K, w.data(), bias.empty() ? nullptr : bias.data(), e - b, K, N, act,
                    out["y"].data() + b * N);
      });
    } else if (op == "swiglu_mlp") {
      const HostTensor& x = r.in("x");
      const int64_t D = x.dim(1), I = r.in("down").dim(1);
      const auto xv = F("x"), gate_up = F("gate_up"), down = F("down");
      status = ForEachChunk(x.dim(0), flops, stop, [&](int64_t b, int64_t e) {
        cpu::SwigluMlp(xv.data() + b * D, gate_up.data(), down.data(), e - b, D, I, out["y"].data() + b * D);
      });
    } else if (op == "attention") {
      const HostTensor& q = r.in("q");
      const HostTensor& k = r.in("k");
      const HostTensor& sl = r.in("seq_lens");
      const auto qv = F("q"), kv = F("k"), vv = F("v");
      const std::vector<int64_t> seq_lens = sl.ToInt64();
      const float scale = static_cast<float>(AttentionScale(r));
      status = ForEachChunk(q.dim(0), flops, stop, [&](int64_t b, int64_t e) {
        cpu::AttentionRows(qv.data(), kv.data(), vv.data(), seq_lens.data(), sl.dim(0), q.dim(0), q.dim(1), k.dim(1),
                           q.dim(2), r.b("causal"), scale, b, e, out["o"].data());
      });
    } else if (op == "attention_decode") {
      const HostTensor& q = r.in("q");
      const HostTensor& kc = r.in("k_cache");
      const int64_t L = kc.dim(1), Hq = q.dim(1), Hkv = kc.dim(2), D = q.dim(2);
      const auto qv = F("q"), kcv = F("k_cache"), vcv = F("v_cache");
      const std::vector<int64_t> lengths = r.in("lengths").ToInt64();
      const float scale = static_cast<float>(AttentionScale(r));
      status = ForEachChunk(q.dim(0), flops, stop, [&](int64_t b, int64_t e) {
        cpu::AttentionDecode(qv.data() + b * Hq * D, kcv.data() + b * L * Hkv * D, vcv.data() + b * L * Hkv * D,
                             lengths.data() + b, e - b, L, Hq, Hkv, D, scale, out["o"].data() + b * Hq * D);
      });
    } else {
      return absl::UnimplementedError("op '" + op + "' has no CPU implementation");
    }
    if (!status.ok()) return status;
    TensorMap result;
    for (auto& [name, shape] : shapes) result[name] = HostTensor::FromFloat(dt, shape, out[name]);
    return result;
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace fusedserve
